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

from builder import signing
from builder.credentials import redact_text
from builder.errors import BadInput, RegistryError, TagConflict, VerdictFailure
from builder.events import SILENT, Reporter
from builder.image import referrers, retag
from builder.image.registry import RegistryClient
from builder.resolve.lockfile import refuse_other_platform
from builder.serving import admission, attestation, history, kuberay
from builder.util import GENERATED_MARK, atomic_write_text, output_lock, refuse_foreign, write_target
from builder.validate import load_typed_json
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


MANIFEST_FILES = history.MANIFEST_NAMES
#: every name -o receives: the KubeRay manifests and (promote) the admission policies
OUTPUT_FILES = (*MANIFEST_FILES, *admission.POLICY_FILES)


def manifest_path(out_dir: Path, name: str) -> Path:
    """The one place a manifest's output path is made: ``out_dir`` joined with one of the names build-image
    composes itself (:data:`OUTPUT_FILES`, never a name read from a history or a record), and not a
    symlink leading out of ``out_dir``.  Anything else is BadInput; nothing is written."""
    if name not in OUTPUT_FILES:
        raise BadInput(f"-o {out_dir}: {name!r:.80} is not a manifest build-image writes; nothing was written.")
    path = Path(out_dir) / name
    if path.is_symlink():
        root = os.path.realpath(out_dir)
        if os.path.commonpath([root, os.path.realpath(path)]) != root:
            raise BadInput(
                f"-o {out_dir}: {name} is a symlink to {os.path.realpath(path)}, outside {out_dir}; "
                "build-image writes the manifests only inside -o; nothing was moved.",
                hint="remove the link or choose another -o.",
            )
    return path


def check_out_dir(out_dir: Path | None, force: bool = False) -> None:
    """Before anything moves: ``-o`` can take the manifests (a directory, writable, holding no file of those
    names that build-image did not write, nor anything but a regular file there, nor a link out of it)."""
    if out_dir is None:
        return
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BadInput(f"-o {out} exists and is not a directory; nothing was moved.")
    probe = out if out.exists() else next((p for p in out.parents if p.exists()), Path("/"))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise BadInput(f"-o {out}: {probe} is not writable; nothing was moved.")
    for name in OUTPUT_FILES:
        path = manifest_path(out, name)
        write_target(path)
        refuse_foreign(path, "KubeRay manifest", force=force, marks=(GENERATED_MARK,))


def write_manifests(out_dir: Path, texts: dict[str, str], force: bool = False) -> list[str]:
    """The KubeRay manifests into ``out_dir`` (atomically each; checked by :func:`check_out_dir` first), each
    under the path :func:`manifest_path` makes."""
    paths = {manifest_path(out_dir, name): text for name, text in texts.items()}
    for path in paths:
        refuse_foreign(path, "KubeRay manifest", force=force, marks=(GENERATED_MARK,))
    for path, text in paths.items():
        atomic_write_text(path, text)
    return [str(p) for p in paths]


# --------------------------------------------------------------------------- the registry's rollback records

#: The rollback record as :func:`_record` writes it, every field typed (read back by :func:`read_record`).
RECORD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "schema": {"const": "build-image/rollback-record/v1"},
        "tag": {"type": "string", "maxLength": 1024},
        "created": {"type": "string", "maxLength": 64},
        "new": {
            "type": "object",
            "properties": {"digest": history.DIGEST_SCHEMA, "config": history.CONFIG_SCHEMA},
            "required": ["digest", "config"],
        },
        "previous": {
            "anyOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "properties": {"digest": history.DIGEST_SCHEMA, "config": history.CONFIG_SCHEMA},
                    "required": ["digest", "config"],
                },
            ]
        },
        "manifests": {
            "type": "object",
            "properties": {
                "new": history.MANIFESTS_SCHEMA,
                "previous": {"anyOf": [{"type": "null"}, history.MANIFESTS_SCHEMA]},
                "previous_source": {"type": "string", "maxLength": 4096},
            },
            "required": ["new", "previous"],
            "additionalProperties": False,
        },
        "verdict": {"type": ["object", "null"]},
        "forced": {"type": "boolean"},
        "reason": {"type": ["string", "null"], "maxLength": 1 << 16},
        "upgrade": {"type": "object"},
    },
    "required": ["schema", "tag", "new", "previous", "manifests", "forced"],
    "additionalProperties": False,
}


def read_record(
    client: RegistryClient, dst: Ref, digest: str, want: str | None, trust: Trust | None = None
) -> tuple[str, dict] | None:
    """(artifact digest, record) of the rollback record for the tag ``dst`` attached in the registry to
    ``digest``: the one named ``want`` (a history entry's ``record``), else the last one listed; None when
    there is none.  The record is fetched by digest, verified, read by :data:`RECORD_SCHEMA` and must be
    about ``dst`` moving to ``digest``.  A ``want`` the registry does not list for that digest is BadInput:
    the history disagrees with the registry, and the registry is the truth.  A record signed by promote's
    ``--sign-key`` is a DSSE envelope; with ``trust`` holding keys, only one a trusted key signed is read."""
    kind = f"{RECORD_KIND}:{dst.tag}"
    listed = [
        d["digest"]
        for d in attestation.referrer_descriptors(client, dst.repository, digest)
        if (d.get("annotations") or {}).get(referrers.KIND) == kind
    ]
    if want is not None and want not in listed:
        raise BadInput(
            f"the cutover history names the rollback record {want} for {dst.name}@{digest}, but the registry "
            f"lists {', '.join(listed) or 'none'} for {dst}: the history file is not the one build-image "
            "wrote, or the record was replaced; nothing was moved.",
            hint=f"see `build-image history {dst}`; move the history file aside if the registry is right.",
        )
    if not listed:
        return None
    chosen = want or listed[-1]
    where = f"rollback record {dst.registry}/{dst.repository}@{chosen}"
    doc, blob = attestation.fetch_artifact(client, dst.repository, chosen, digest, where)
    keys = trust.keys if trust else {}
    if doc["layers"][0]["mediaType"] == signing.ENVELOPE_TYPE:
        opened = signing.open_envelope(blob, where, keys, RECORD_TYPE)
        blob = opened.payload
        if keys and not opened.signers:
            raise BadInput(
                f"{where} is signed by none of the trusted keys ({trust.wanted()}); nothing was moved.",
                hint="pass the promoting key's public key with --trusted-key.",
            )
    elif keys:
        raise BadInput(f"{where} is not signed, and trusted keys were given ({trust.wanted()}); nothing was moved.")
    try:
        record = load_typed_json(blob, where, RECORD_SCHEMA)
    except BadInput as exc:
        raise BadInput(f"{exc.message.rstrip('.')}; nothing was moved.") from None
    if record["tag"] != str(dst) or record["new"]["digest"] != digest:
        raise BadInput(
            f"{where} is about {record['tag']!r:.200} moving to {record['new']['digest']}, not {dst} moving "
            f"to {digest}; nothing was moved."
        )
    return chosen, record


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


@dataclass(frozen=True)
class Trust:
    """The keys a cutover trusts (fingerprint -> public key) and the key it signs its record with."""

    keys: dict[str, Any]
    signer: signing.Signer | None = None

    def wanted(self) -> str:
        return ", ".join(self.keys) or "none configured"


def trust_from(spec, trusted_keys: tuple = (), sign_key: str | os.PathLike | None = None) -> Trust:
    """The spec's ``[serving] trusted_keys`` (relative to the spec's folder) and ``--trusted-key`` files, read
    and checked (:func:`builder.signing.load_public_key`), and the ``--sign-key`` signer (or None)."""
    folder = Path(spec.source).parent if getattr(spec, "source", None) else Path(".")
    keys = signing.trusted_keys([folder / k for k in spec.serving.trusted_keys], "[serving] trusted_keys:")
    keys.update(signing.trusted_keys(list(trusted_keys), "--trusted-key"))
    return Trust(keys, signing.load_signer(sign_key) if sign_key else None)


def _check_target(target: attestation.Target, spec, trust: Trust) -> None:
    """Without --force: the target states what a verdict must match, and some key is trusted to sign one."""
    unstated = target.unstated()
    if unstated:
        what = (
            f"the spec {spec.source} does not set"
            if spec.source
            else "there is no spec (./build-image.toml or --spec) to set"
        )
        raise BadInput(
            f"promote: {what} {', '.join(unstated)}, so no verdict can be checked against the target; "
            "nothing was moved.",
            hint="set them in build-image.toml's [serving] (docs/cutover.md).",
        )
    if not trust.keys:
        raise BadInput(
            "promote counts only smoke verdicts signed by a trusted key, and none is configured; nothing was moved.",
            hint="add the signer's public key to [serving] trusted_keys in build-image.toml, or pass "
            "--trusted-key FILE (docs/cutover.md, \"Signed verdicts\").",
        )


def _verdict_for(
    client: RegistryClient,
    src: Ref,
    dst: Ref,
    current: str | None,
    target: attestation.Target,
    trust: Trust,
    force: bool,
) -> attestation.Verdict | None:
    """The newest trusted PASS attached to ``src`` that clears the target; without one and without --force,
    VerdictFailure naming why each attached verdict does not count (the signers found and wanted)."""
    verdicts, untrusted = attestation.read_verdicts(client, src.repository, src.digest, trust.keys)
    chosen, why = _choose_verdict(verdicts, target)
    if chosen is not None or force:
        return chosen
    if not verdicts and not untrusted:
        what = "no smoke attestation is attached to it"
    else:
        what = "no attached verdict signed by a trusted key matches the target: " + " | ".join(why + untrusted)
    raise VerdictFailure(
        f"promote refused: {src} -> {dst}: {what}. Trusted keys: {trust.wanted()}. Nothing was moved; {dst} still "
        f"points at {current or 'nothing'}.",
        hint=f"smoke it at the target's settings and sign the verdict: build-image smoke {src} --attest "
        f"--sign-key KEY --model DIR --concurrency {target.concurrency or 'N'} --tp {target.tp}"
        + (f" --max-model-len {target.max_model_len}" if target.max_model_len else "")
        + f" on {target.gpu_model or 'the target GPU'}; or --force --reason TEXT.",
    )


def _previous_manifests(
    client: RegistryClient,
    dst: Ref,
    entries: list[dict],
    current: str | None,
    render: Callable[[str], dict[str, str]],
) -> tuple[dict[str, str] | None, str]:
    """The manifests the tag's current image was applied with: those of the registry's rollback record that
    promoted it (the one the history names, checked against the registry by :func:`read_record`), else
    rendered now from this lock and spec (said so).  Nothing is taken from the history file itself."""
    if current is None:
        return None, "none: the tag did not exist"
    want = next(
        (
            e.get("record")
            for e in reversed(entries)
            if e["action"] == "promote" and e["status"] == "done" and e["to"] == current and e.get("record")
        ),
        None,
    )
    found = read_record(client, dst, current, want)
    if found is not None:
        return found[1]["manifests"]["new"], f"recorded by the rollback record {found[0]}"
    return render(
        f"{dst.name}@{current}"
    ), "rendered now from this lock and spec (no build-image promotion put it there)"


@dataclass(frozen=True)
class PromoteRequest:
    """What ``promote`` was asked to do, built once by the command from its flags and spec: move ``to``
    (``HOST/REPO:TAG``) to ``source`` (``HOST/REPO@sha256:…``) for the spec's serving target and the lock's
    manifests."""

    source: str
    to: str
    spec: Any
    lock: Any
    force: bool = False
    reason: str | None = None  # why --force (recorded)
    history_file: Path | None = None
    out_dir: Path | None = None  # -o: the manifests and admission policies
    trusted_keys: tuple = ()
    sign_key: str | os.PathLike | None = None  # signs the rollback record


@dataclass(frozen=True)
class RollbackRequest:
    """What ``rollback`` was asked to do: put ``to`` (``HOST/REPO:TAG``) back where its latest promotion found
    it; with ``trusted_keys``, only on a rollback record one of them signed."""

    to: str
    history_file: Path | None = None
    out_dir: Path | None = None
    force: bool = False  # replace -o files build-image did not write
    trusted_keys: tuple = ()


def _promote_refs(req: PromoteRequest, reporter: Reporter) -> tuple[Ref, Ref]:
    force, reason = req.force, req.reason
    src = clean_ref(req.source, "promote", reporter)
    dst = clean_ref(req.to, "promote --to", reporter)
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
    return src, dst


def promote(req: PromoteRequest, reporter: Reporter = SILENT) -> dict[str, Any]:
    """Move ``req.to`` (``HOST/REPO:TAG``) to ``req.source`` (``HOST/REPO@sha256:…``); see the module docstring.

    Raises VerdictFailure (exit 1) when no attached PASS signed by a trusted key matches the target (without
    ``force``), BadInput (exit 2) for bad input -- nothing moved -- and RegistryError (exit 10) when the
    registry fails."""
    src, dst = _promote_refs(req, reporter)
    spec, out_dir = req.spec, req.out_dir
    check_out_dir(out_dir)
    target = attestation.Target.from_spec(spec)
    trust = trust_from(spec, req.trusted_keys, req.sign_key)
    if not req.force:
        _check_target(target, spec, trust)
    path = _history_path(dst, req.history_file)
    with _tag_lock(dst, path):
        entries = history.load(path, str(dst))
        history.check_writable(path)
        client = RegistryClient(dst.registry)
        client.ping()
        new = retag.manifest_by_digest(client, src.repository, src.digest)
        if new is None:
            raise BadInput(f"promote: the registry {src.registry} does not hold {src}; nothing was moved.")
        _check_image_platform(client, src, new, spec=spec, lock=req.lock)  # one image, of the pods' platform
        current = _settle(client, dst, path, entries)
        res = {"target": str(dst), "digest": new.digest, "previous": current, "history": str(path)}
        if current == new.digest:
            reporter.step(f"{dst} already points at {new.digest}; nothing to do")
            return {**res, "status": "unchanged"}
        chosen = _verdict_for(client, src, dst, current, target, trust, req.force)
        record, att = _record(req, client, src, dst, new, current, entries, chosen=chosen, trust=trust)
        entry = _promote_entry(history.next_id(entries), src, new, current, record, att)
        entries.append(entry)
        history.save(path, str(dst), entries)
        _move(client, dst, new, path, entries, entry)
        written = (
            write_manifests(out_dir, {**record["manifests"]["new"], **_policies(dst, trust, target)}) if out_dir else []
        )
    keys = ("verdict", "forced", "reason", "upgrade", "record_signers")
    return {
        **res,
        "status": entry["status"],
        "record": att.digest,
        "manifests": written,
        **{k: record[k] for k in keys},
    }


def _policies(dst: Ref, trust: Trust, target: attestation.Target) -> dict[str, str]:
    """The admission policies for ``-o`` (none without a trusted key: a forced promote may have none)."""
    if not trust.keys:
        return {}
    return admission.render_policies(dst.registry, dst.repository, dst.tag, trust.keys, target)


def _promote_entry(
    i: int, src: Ref, new: retag.Manifest, current: str | None, record: dict, att: referrers.Attached
) -> dict:
    """The history entry of a promotion (status ``moving`` until the move is read back)."""
    return {
        "id": i,
        "action": "promote",
        "time": _now(),
        "from": current,
        "to": new.digest,
        "source": str(src),
        "status": "moving",
        "record": att.digest,
        "record_signers": record["record_signers"],
        "verdict": record["verdict"],
        "forced": record["forced"],
        "reason": record["reason"],
        "previous": record["previous"],
        "new_config": record["new"]["config"],
        "manifests": record["manifests"],
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
    req: PromoteRequest,
    client: RegistryClient,
    src: Ref,
    dst: Ref,
    new: retag.Manifest,
    current: str | None,
    entries: list[dict],
    *,
    chosen: attestation.Verdict | None,
    trust: Trust,
) -> tuple[dict, referrers.Attached]:
    """The rollback record -- both digests, their container configs, both images' KubeRay manifests, the verdict
    or the forced reason -- attached in the target repository as an artifact referring to the new digest."""
    spec, lock, reason = req.spec, req.lock, req.reason
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
    prev_manifests, prev_source = _previous_manifests(client, dst, entries, current, render)
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
        "verdict": None
        if chosen is None
        else {"artifact": chosen.artifact, "summary": chosen.summary(), "signers": list(chosen.signers)},
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
    blob, layer_type = attestation.statement_bytes(record), None
    if trust.signer is not None:  # the record as a DSSE envelope of its own payload type
        blob, layer_type = signing.sign_envelope(blob, trust.signer, RECORD_TYPE), signing.ENVELOPE_TYPE
        ann[attestation.SIGNER_ANNOTATION] = trust.signer.fingerprint
    att = referrers.attach(client, dst.repository, subject, blob, RECORD_TYPE, RECORD_TITLE, ann, layer_type=layer_type)
    record["record_signers"] = [trust.signer.fingerprint] if trust.signer else []
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


def _undo_target(
    client: RegistryClient, dst: Ref, path: Path, entries: list[dict], current: str, trust: Trust
) -> tuple[dict, dict]:
    """(the history entry to undo, the registry's rollback record of it): the entry found in the history (the
    cache), the record that entry names read from the registry (the truth) and the two compared.  Anything
    that does not agree is a refusal; nothing has moved."""
    e = history.rollback_target(entries, current)
    if e is None:
        undone = history.undone_ids(entries)
        live = [x for x in entries if x["action"] == "promote" and x["status"] == "done" and x["id"] not in undone]
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
    found = read_record(client, dst, current, e.get("record"), trust) if e.get("record") else None
    if found is None:
        raise BadInput(
            f"rollback: history entry {e['id']} names no rollback record the registry holds for "
            f"{dst.name}@{current}; the history file alone is not trusted to move the tag; nothing was moved.",
            hint=f"see `build-image history {dst}`; move the tag with `build-image promote … --force --reason`.",
        )
    record = found[1]
    if (record["previous"] or {}).get("digest") != e["from"]:
        raise BadInput(
            f"rollback: history entry {e['id']} says {dst} came from {e['from']}, the registry's rollback record "
            f"{found[0]} says {(record['previous'] or {}).get('digest') or 'nothing'}: the history file is not "
            "the one build-image wrote; nothing was moved.",
            hint="the registry is the truth: move the history file aside, or restore the one build-image wrote.",
        )
    return e, record


def rollback(req: RollbackRequest, reporter: Reporter = SILENT) -> dict[str, Any]:
    """Put ``req.to`` back on the digest its latest promotion replaced (as the registry's rollback record of that
    promotion says; with ``req.trusted_keys``, a record one of them signed) and write that image's recorded
    manifests."""
    dst = clean_ref(req.to, "rollback", reporter)
    if dst.digest or not dst.tag:
        raise BadInput(f"rollback {dst}: give REPO:TAG (the deploy tag to move back).")
    check_out_dir(req.out_dir, req.force)
    trust = Trust(signing.trusted_keys(list(req.trusted_keys), "--trusted-key"))
    path = _history_path(dst, req.history_file)
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
        e, record = _undo_target(client, dst, path, entries, current, trust)
        target = record["previous"]["digest"]
        prev = retag.manifest_by_digest(client, dst.repository, target)
        if prev is None:
            raise BadInput(
                f"rollback: the registry {dst.registry} no longer holds {dst.name}@{target} (the "
                f"rollback target of history entry {e['id']}); nothing was moved."
            )
        cfg = retag.container_config(client, dst.repository, prev)
        want = record["previous"]["config"]
        if cfg != want:
            raise BadInput(
                f"rollback: {dst.name}@{target} in the registry has another container configuration "
                f"than its rollback record holds ({cfg.get('digest')} vs {want.get('digest')}); nothing was moved."
            )
        manifests = record["manifests"]["previous"] or {}
        entry = {
            "id": history.next_id(entries),
            "action": "rollback",
            "time": _now(),
            "from": current,
            "to": target,
            "undoes": e["id"],
            "status": "moving",
            "previous": {"digest": current},
            "manifests": {"new": manifests},
        }
        entries.append(entry)
        history.save(path, str(dst), entries)
        _move(client, dst, prev, path, entries, entry)
        written = write_manifests(req.out_dir, manifests, force=req.force) if req.out_dir and manifests else []
    return {
        "target": str(dst),
        "digest": target,
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
