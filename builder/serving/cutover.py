"""Cutover: move a deploy tag to an image only on a matching PASS verdict, keep the way back, and take it.

:func:`promote` moves ``REPO:TAG`` to ``IMAGE@DIGEST`` when a smoke attestation attached to that digest
passed at the target's ``[serving]`` settings (:mod:`builder.serving.attestation`).  Before the tag moves,
it records the rollback target -- the digest the tag pointed at, that image's container configuration and
the KubeRay manifests of both -- as an OCI artifact referring to the new digest and in the tag's local
history (:mod:`builder.serving.history`).  :func:`rollback` puts the tag back on the recorded previous
digest (verified against the registry) and writes its manifests to re-apply; :func:`show_history` lists it.

Every step runs under the output lock of the tag's history file: two promotes of one tag serialize, and the
second sees the first's digest as the one to keep.  The registry is only ever asked to move the tag to a
manifest it holds, by its exact bytes; if it stops answering mid-move, the history says ``unconfirmed``
until the next command reads the tag back and records where it is.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.credentials import redact_text
from builder.errors import BadInput, RegistryError, TagConflict, VerdictFailure
from builder.events import SILENT, Reporter
from builder.image import referrers, retag
from builder.image.registry import RegistryClient
from builder.resolve.lockfile import refuse_other_platform
from builder.serving import attestation, history, kuberay
from builder.util import GENERATED_MARK, atomic_write_text, output_lock, refuse_foreign, write_target
from builder.values import parse_ref

RECORD_TYPE = "application/vnd.build-image.rollback-record.v1+json"
RECORD_KIND = "rollback-record"
RECORD_TITLE = "rollback-record.json"
_USERINFO = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*://)?(?:[^/@]*@)?")


@dataclass(frozen=True)
class Ref:
    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def clean_ref(ref: str, what: str, reporter: Reporter) -> Ref:
    """``ref`` without a scheme or ``user:password@`` (credentials come only from ``docker login``'s store and
    are never written); with a registry host.  Credentials it drops are a step on ``reporter``."""
    bare = _USERINFO.sub("", ref.strip(), count=1)
    head = ref.strip()[: len(ref.strip()) - len(bare)]
    if "@" in head:
        reporter.step(
            f"{what}: the credentials in the reference are ignored (and never recorded): build-image "
            "reads only the engine's credential store (docker login)"
        )
    r = parse_ref(bare)
    if r.registry == "docker.io" and not bare.split("/")[0].count("."):
        raise BadInput(f"{what} {redact_text(ref)} has no registry host (HOST[:PORT]/REPO…).")
    return Ref(r.registry, r.repository, r.tag, r.digest)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _history_path(target: Ref, given: Path | None) -> Path:
    return Path(given) if given else history.default_path(target.registry, target.repository, target.tag or "latest")


@contextlib.contextmanager
def _tag_lock(target: Ref, path: Path) -> Iterator[None]:
    """The output lock of the tag itself (whatever history file a run names) and of its history file: every
    promote, rollback and history of one tag on this machine runs one after the other."""
    with output_lock(f"/build-image-tag/{target}"), output_lock(path):
        yield


def _settle(client: RegistryClient, target: Ref, path: Path, entries: list[dict]) -> str | None:
    """Where the tag points now; unsettled history entries settled from it (and saved)."""
    current = retag.tag_digest(client, target.repository, target.tag)
    if history.reconcile(entries, current):
        history.save(path, str(target), entries)
    return current


MANIFEST_FILES = (kuberay.RAYSERVICE_FILE, kuberay.RAYCLUSTER_FILE)


def check_out_dir(out_dir: Path | None, force: bool = False) -> None:
    """Before anything moves: ``-o`` can take the manifests (a directory, writable, holding no file of those
    names that build-image did not write, nor anything but a regular file there)."""
    if out_dir is None:
        return
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BadInput(f"-o {out} exists and is not a directory; nothing was moved.")
    probe = out if out.exists() else next((p for p in out.parents if p.exists()), Path("/"))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise BadInput(f"-o {out}: {probe} is not writable; nothing was moved.")
    for name in MANIFEST_FILES:
        write_target(out / name)
        refuse_foreign(out / name, "KubeRay manifest", force=force, marks=(GENERATED_MARK,))


def write_manifests(out_dir: Path, texts: dict[str, str], force: bool = False) -> list[str]:
    """The KubeRay manifests into ``out_dir`` (atomically each; checked by :func:`check_out_dir` first)."""
    for name in texts:
        refuse_foreign(out_dir / name, "KubeRay manifest", force=force, marks=(GENERATED_MARK,))
    for name, text in texts.items():
        atomic_write_text(out_dir / name, text)
    return [str(out_dir / n) for n in texts]


# --------------------------------------------------------------------------- promote


def _choose_verdict(
    verdicts: list[attestation.Verdict], target: attestation.Target
) -> tuple[attestation.Verdict | None, list[str]]:
    """The newest PASS that clears ``target``, else None and why each attached verdict does not."""
    why = []
    for v in reversed(verdicts):
        miss = attestation.mismatches(v, target)
        if not miss:
            return v, []
        why.append(f"{v.artifact.rsplit('@', 1)[-1][:19]}…: " + "; ".join(miss))
    return None, why


def _previous_manifests(
    entries: list[dict], current: str | None, render: Callable[[str], dict[str, str]], image: str
) -> tuple[dict[str, str] | None, str]:
    """The manifests the tag's current image was applied with: those recorded when build-image promoted it,
    else rendered now from this lock and spec (said so)."""
    if current is None:
        return None, "none: the tag did not exist"
    for e in reversed(entries):
        if e["status"] == "done" and e["to"] == current and e.get("manifests", {}).get("new"):
            return e["manifests"]["new"], f"recorded by history entry {e['id']} ({e['action']})"
    return render(image), "rendered now from this lock and spec (no build-image promotion put it there)"


def promote(
    source: str,
    to: str,
    *,
    spec,
    lock,
    force: bool = False,
    reason: str | None = None,
    history_file: Path | None = None,
    out_dir: Path | None = None,
    reporter: Reporter = SILENT,
) -> dict[str, Any]:
    """Move ``to`` (``HOST/REPO:TAG``) to ``source`` (``HOST/REPO@sha256:…``); see the module docstring.

    Raises VerdictFailure (exit 1) when no attached PASS matches the target (without ``force``), BadInput
    (exit 2) for bad input -- nothing moved -- and RegistryError (exit 10) when the registry fails."""
    src = clean_ref(source, "promote", reporter)
    dst = clean_ref(to, "promote --to", reporter)
    if not src.digest:
        raise BadInput(f"promote: {src} names no digest; promote IMAGE@sha256:… (the digest the smoke attested).")
    if dst.digest or not dst.tag:
        raise BadInput(f"promote --to {dst}: give REPO:TAG (the deploy tag to move), not a digest.")
    if src.registry != dst.registry:
        raise BadInput(
            f"promote: {src.name} and {dst.name} are in different registries; a tag moves within one "
            "registry (copy the image first, then smoke and attest it there)."
        )
    if force and not (reason or "").strip():
        raise BadInput("promote --force needs --reason TEXT: a forced cutover is recorded with why.")
    check_out_dir(out_dir)
    target = attestation.Target.from_spec(spec)
    path = _history_path(dst, history_file)
    with _tag_lock(dst, path):
        entries = history.load(path, str(dst))
        history.check_writable(path)
        client = RegistryClient(dst.registry)
        client.ping()
        new = retag.manifest_by_digest(client, src.repository, src.digest)
        if new is None:
            raise BadInput(f"promote: the registry {src.registry} does not hold {src}; nothing was moved.")
        _check_image_platform(client, src, new, spec=spec, lock=lock)  # one image, of the pods' platform
        current = _settle(client, dst, path, entries)
        if current == new.digest:
            reporter.step(f"{dst} already points at {new.digest}; nothing to do")
            return {
                "target": str(dst),
                "digest": new.digest,
                "previous": current,
                "status": "unchanged",
                "history": str(path),
            }
        unstated = target.unstated()
        if unstated and not force:
            what = (
                f"the spec {spec.source} does not set"
                if spec.source
                else "there is no spec (./build-image.toml or --spec) to set"
            )
            raise BadInput(
                f"promote: {what} {', '.join(unstated)}, so no verdict can be checked against the "
                "target; nothing was moved.",
                hint="set them in build-image.toml's [serving] (docs/cutover.md).",
            )
        verdicts = attestation.read_verdicts(client, src.repository, src.digest)
        chosen, why = _choose_verdict(verdicts, target)
        if chosen is None and not force:
            what = (
                "no smoke attestation is attached to it"
                if not verdicts
                else "no attached verdict matches the target: " + " | ".join(why)
            )
            raise VerdictFailure(
                f"promote refused: {src} -> {dst}: {what}. Nothing was moved; {dst} still points "
                f"at {current or 'nothing'}.",
                hint=f"smoke it at the target's settings: build-image smoke {src} --attest "
                f"--model DIR --concurrency {target.concurrency or 'N'} --tp {target.tp}"
                + (f" --max-model-len {target.max_model_len}" if target.max_model_len else "")
                + f" on {target.gpu_model or 'the target GPU'}; or --force --reason TEXT.",
            )
        record, att = _record(
            client, src, dst, new, current, entries, spec=spec, lock=lock, chosen=chosen, reason=reason
        )
        forced = record["forced"]
        entry = {
            "id": history.next_id(entries),
            "action": "promote",
            "time": _now(),
            "from": current,
            "to": new.digest,
            "source": str(src),
            "status": "moving",
            "record": att.digest,
            "verdict": record["verdict"],
            "forced": forced,
            "reason": record["reason"],
            "previous": record["previous"],
            "new_config": record["new"]["config"],
            "manifests": record["manifests"],
            "upgrade": record["upgrade"],
        }
        entries.append(entry)
        history.save(path, str(dst), entries)
        _move(client, dst, new, path, entries, entry)
        written = write_manifests(out_dir, record["manifests"]["new"]) if out_dir else []
    return {
        "target": str(dst),
        "digest": new.digest,
        "previous": current,
        "status": entry["status"],
        "verdict": record["verdict"],
        "forced": forced,
        "reason": record["reason"],
        "record": att.digest,
        "history": str(path),
        "manifests": written,
        "upgrade": record["upgrade"],
    }


def _check_image_platform(client: RegistryClient, src: Ref, new: retag.Manifest, *, spec, lock) -> None:
    """Before anything moves: ``new`` is one image (an index is BadInput, :func:`retag.container_config`) whose
    platform, read from its config (:func:`retag.config_platform`), is the lock's (the manifests are rendered
    from it: :func:`builder.resolve.lockfile.refuse_other_platform`) and the one the pods run on
    (:func:`kuberay.serving_platform`: ``[serving] platform`` must be the image's) — the manifests never put
    one platform's image on the other's nodes."""
    retag.container_config(client, src.repository, new)
    have = retag.config_platform(client, src.repository, new)
    refuse_other_platform(lock, have, "the lock (--lock or the spec's)", doing=f"promoting {src} ({have.name})")
    kuberay.serving_platform(spec, (have,))


def _record(
    client: RegistryClient,
    src: Ref,
    dst: Ref,
    new: retag.Manifest,
    current: str | None,
    entries: list[dict],
    *,
    spec,
    lock,
    chosen: attestation.Verdict | None,
    reason: str | None,
) -> tuple[dict, referrers.Attached]:
    """The rollback record -- both digests, their container configs, both images' KubeRay manifests, the verdict
    or the forced reason -- attached in the target repository as an artifact referring to the new digest."""
    image = f"{dst.name}@{new.digest}"
    new_config = retag.container_config(client, src.repository, new)

    def render(img: str) -> dict[str, str]:
        return kuberay.render_manifests(lock=lock, spec=spec, image=img)

    new_manifests = render(image)
    plan = kuberay.upgrade_plan(spec)
    prev_config = None
    if current is not None:
        prev = retag.manifest_by_digest(client, dst.repository, current)
        if prev is None:  # the tag names it, so the registry holds it: anything else is the registry's fault
            raise RegistryError(f"registry {dst.registry}: {dst} points at {current}, which it does not serve.")
        prev_config = retag.container_config(client, dst.repository, prev)
    prev_manifests, prev_source = _previous_manifests(entries, current, render, f"{dst.name}@{current}")
    retag.mount_blobs(client, dst.repository, src.repository, new)
    if src.repository != dst.repository:
        retag.put_tag(client, dst.repository, new.digest, new)  # the manifest by digest: no tag moves
    forced = chosen is None
    record = {
        "schema": "build-image/rollback-record/v1",
        "tag": str(dst),
        "created": _now(),
        "new": {"digest": new.digest, "config": new_config},
        "previous": None if current is None else {"digest": current, "config": prev_config},
        "manifests": {"new": new_manifests, "previous": prev_manifests, "previous_source": prev_source},
        "verdict": None if chosen is None else {"artifact": chosen.artifact, "summary": chosen.summary()},
        "forced": forced,
        "reason": redact_text(reason.strip()) if forced and reason else None,
        "upgrade": plan.to_dict(),
    }
    subject = referrers.subject_descriptor(client, dst.repository, new.digest)
    ann = {
        referrers.KIND: f"{RECORD_KIND}:{dst.tag}",
        "org.build-image.tag": dst.tag,
        "org.build-image.previous": current or "none",
        "org.build-image.forced": str(forced).lower(),
    }
    if forced:
        ann["org.build-image.reason"] = redact_text(reason.strip())[:500]
    att = referrers.attach(
        client, dst.repository, subject, attestation.statement_bytes(record), RECORD_TYPE, RECORD_TITLE, ann
    )
    return record, att


def _move(
    client: RegistryClient, dst: Ref, manifest: retag.Manifest, path: Path, entries: list[dict], entry: dict
) -> None:
    """Move the tag and read it back; the history entry says where it is (or ``unconfirmed``) either way."""
    try:
        retag.put_tag(client, dst.repository, dst.tag, manifest)
    except RegistryError:
        try:
            at = retag.tag_digest(client, dst.repository, dst.tag)
        except RegistryError:
            entry["status"] = "unconfirmed"  # the next promote / rollback / history reads the tag and settles it
        else:
            history.reconcile(entries, at)
        history.save(path, str(dst), entries)
        raise
    at = retag.tag_digest(client, dst.repository, dst.tag)
    history.reconcile(entries, at)
    history.save(path, str(dst), entries)
    if entry["status"] != "done":
        raise RegistryError(
            f"registry {dst.registry}: after moving {dst} to {manifest.digest} it points at "
            f"{at or 'nothing'}; the history records that."
        )


# --------------------------------------------------------------------------- rollback and history


def rollback(
    to: str,
    *,
    history_file: Path | None = None,
    out_dir: Path | None = None,
    force: bool = False,
    reporter: Reporter = SILENT,
) -> dict[str, Any]:
    """Put ``to`` back on the digest its latest promotion replaced and write that image's manifests."""
    dst = clean_ref(to, "rollback", reporter)
    if dst.digest or not dst.tag:
        raise BadInput(f"rollback {dst}: give REPO:TAG (the deploy tag to move back).")
    check_out_dir(out_dir, force)
    path = _history_path(dst, history_file)
    with _tag_lock(dst, path):
        entries = history.load(path, str(dst))
        if not entries:
            raise BadInput(
                f"rollback: there is no cutover history of {dst} ({path} does not exist); nothing was moved.",
                hint="rollback undoes a `build-image promote`; give --history FILE if it was recorded elsewhere.",
            )
        history.check_writable(path)
        client = RegistryClient(dst.registry)
        client.ping()
        current = _settle(client, dst, path, entries)
        if current is None:
            raise BadInput(f"rollback: the tag {dst} does not exist in the registry; nothing was moved.")
        e = history.rollback_target(entries, current)
        if e is None:
            live = [
                x
                for x in entries
                if x["action"] == "promote" and x["status"] == "done" and x["id"] not in history.undone_ids(entries)
            ]
            if live:
                raise TagConflict(
                    f"rollback: {dst} points at {current}, but its last promotion (history entry "
                    f"{live[-1]['id']}) put it on {live[-1]['to']}: it was moved outside build-image; "
                    "nothing was moved.",
                    hint=f"see `build-image history {dst}`.",
                )
            raise BadInput(f"rollback: no promotion recorded in {path} is left to undo; nothing was moved.")
        if not e.get("from"):
            raise BadInput(
                f"rollback: history entry {e['id']} created {dst} (there was no image before it); nothing was moved."
            )
        prev = retag.manifest_by_digest(client, dst.repository, e["from"])
        if prev is None:
            raise BadInput(
                f"rollback: the registry {dst.registry} no longer holds {dst.name}@{e['from']} (the "
                f"rollback target of history entry {e['id']}); nothing was moved."
            )
        cfg = retag.container_config(client, dst.repository, prev)
        want = (e.get("previous") or {}).get("config") or {}
        if cfg != want:
            raise BadInput(
                f"rollback: {dst.name}@{e['from']} in the registry has another container configuration "
                f"than history entry {e['id']} recorded ({cfg.get('digest')} vs {want.get('digest')}); "
                "nothing was moved."
            )
        manifests = (e.get("manifests") or {}).get("previous") or {}
        entry = {
            "id": history.next_id(entries),
            "action": "rollback",
            "time": _now(),
            "from": current,
            "to": e["from"],
            "undoes": e["id"],
            "status": "moving",
            "previous": {"digest": current},
            "manifests": {"new": manifests},
        }
        entries.append(entry)
        history.save(path, str(dst), entries)
        _move(client, dst, prev, path, entries, entry)
        written = write_manifests(out_dir, manifests, force=force) if out_dir and manifests else []
    return {
        "target": str(dst),
        "digest": e["from"],
        "previous": current,
        "undoes": e["id"],
        "status": entry["status"],
        "config": cfg,
        "manifests": written,
        "history": str(path),
    }


def show_history(to: str, *, history_file: Path | None = None, reporter: Reporter = SILENT) -> dict[str, Any]:
    """The tag's history, its unsettled entries settled from the registry when it answers."""
    dst = clean_ref(to, "history", reporter)
    if dst.digest or not dst.tag:
        raise BadInput(f"history {dst}: give REPO:TAG.")
    path = _history_path(dst, history_file)
    with _tag_lock(dst, path):
        entries = history.load(path, str(dst))
        if not entries:
            raise BadInput(
                f"history: there is no cutover history of {dst} ({path} does not exist).",
                hint="give --history FILE if it was recorded elsewhere.",
            )
        current, note = None, None
        try:
            client = RegistryClient(dst.registry)
            current = _settle(client, dst, path, entries)
        except RegistryError as exc:
            note = f"the registry did not answer ({exc.message}); unsettled entries stay as recorded"
    return {"target": str(dst), "history": str(path), "tag_at": current, "note": note, "entries": entries}
