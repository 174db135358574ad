"""``build-image lock``: resolve the overlay on top of the base, gate it, write the lock."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from ..errors import AbiRejected, BadInput, BuildImageError, StaleLock, Unsatisfiable
from ..pylock import is_pylock_path, twin_path, twin_problem, write_pylock
from ..util import canonical_name


def _load_base(ref: str):
    """(manifest, bytes-for-the-inputs-hash, label) from a manifest file or a local image ref."""
    from ..manifest import load_manifest, parse_manifest

    p = Path(ref)
    if ref.endswith(".json") or p.exists():
        manifest = load_manifest(p)
        return manifest, p.read_bytes(), str(p)
    from ..base import snapshot_image

    manifest = snapshot_image(ref)
    text = manifest.to_json()
    parse_manifest(text, ref)  # round-trip check
    return manifest, text.encode(), ref


def _allow(names: tuple[str, ...], reasons: tuple[str, ...]) -> dict[str, str] | None:
    if not names and not reasons:
        return None
    if names and not reasons:
        raise BadInput("--allow-abi-change needs --reason TEXT: the reason is recorded in the lock header.")
    if reasons and not names:
        raise BadInput("--reason is only meaningful with --allow-abi-change NAME.")
    if any(not r.strip() for r in reasons):
        raise BadInput("--reason must not be empty.")
    if len(reasons) == 1:
        return {canonical_name(n): reasons[0].strip() for n in names}
    if len(reasons) != len(names):
        raise BadInput(
            f"--allow-abi-change given {len(names)} times but --reason {len(reasons)} times; "
            "give one --reason for all, or one per --allow-abi-change (in the same order)."
        )
    return {canonical_name(n): r.strip() for n, r in zip(names, reasons)}


def _say_factory(quiet: bool):
    from rich.console import Console

    console = Console(stderr=True)
    if quiet or not console.is_terminal:
        return console, None

    status = console.status("locking")
    return console, status


@click.command("lock")
@click.option("--vllm", "vllm", metavar="VERSION", help="vLLM version of the base (default: spec, else 0.26.0).")
@click.option("--with", "with_", multiple=True, metavar="REQ",
              help="Overlay requirement (repeatable), added to ray[serve]. Naming a base distribution releases its pin.")
@click.option("--base", "base", metavar="REF_OR_MANIFEST",
              help="Base manifest (.json) or a LOCAL image ref to snapshot (default: lockfiles/base/vllm-openai-v<vllm>.json).")
@click.option("--spec", "spec_path", metavar="FILE", type=click.Path(path_type=Path),
              help="Spec file (default: ./build-image.toml when present). Flags win.")
@click.option("-o", "--output", "output", metavar="FILE", help="Lock file (default: lockfiles/vllm-<vllm>/requirements.lock).")
@click.option("--check", is_flag=True, help="Exit 5 when the lock is stale against its inputs; write nothing.")
@click.option("--upgrade", is_flag=True, help="Resolve again even when the lock is up to date with its inputs.")
@click.option("--allow-abi-change", "allow_names", multiple=True, metavar="NAME",
              help="Accept a gate violation for NAME (repeatable; needs --reason, recorded in the lock header).")
@click.option("--reason", "reasons", multiple=True, metavar="TEXT", help="Why the ABI change is acceptable.")
@click.option("--find-links", "find_links", multiple=True, metavar="DIR", help="Extra wheel folder (uv --find-links).")
@click.option("--no-index", is_flag=True, help="Do not use PyPI: only --find-links folders.")
@click.option("--exclude-newer", "exclude_newer", metavar="DATE", help="Ignore files uploaded after DATE (uv --exclude-newer).")
@click.option("--no-default-overlay", is_flag=True, help="Do not add ray[serve] to the overlay.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result on stdout.")
def command(vllm, with_, base, spec_path, output, check, upgrade, allow_names, reasons, find_links, no_index,
            exclude_newer, no_default_overlay, as_json):
    """Resolve ray[serve] + --with on top of the base image, run the ABI gate, write a hash-pinned lock.

    Exit codes: 0 written / up to date, 2 bad input, 3 ABI gate rejection,
    4 unsatisfiable on top of the base, 5 stale lock (--check), 7 wheel download / sha256
    failure, 12 uv failed.  With --json every outcome is a JSON document on stdout.
    """
    try:
        _lock(vllm, with_, base, spec_path, output, check, upgrade, allow_names, reasons, find_links, no_index,
              exclude_newer, no_default_overlay, as_json)
    except BuildImageError as exc:
        # --json: every outcome is a JSON document on stdout (the message stays on stderr)
        if as_json and not getattr(exc, "json_emitted", False):
            _emit(True, {"status": _ERROR_STATUS.get(type(exc), "error"), "written": False,
                         "exit_code": exc.exit_code, "error": exc.title, "message": exc.message,
                         "hint": exc.hint, "details": exc.details}, "")
        raise


_ERROR_STATUS = {BadInput: "bad-input", StaleLock: "stale", Unsatisfiable: "unsatisfiable", AbiRejected: "abi-rejected"}


def _lock(vllm, with_, base, spec_path, output, check, upgrade, allow_names, reasons, find_links, no_index,
          exclude_newer, no_default_overlay, as_json):
    from .. import lock as L
    from ..abi import format_notices, format_rejection
    from ..manifest import BaseManifest
    from ..spec import check_vllm_version, load_spec

    t_start = time.monotonic()
    spec = load_spec(spec_path).with_flags(
        vllm=vllm, with_=list(with_) or None, base=base, lock=output, allow_abi_change=_allow(allow_names, reasons),
        find_links=list(find_links) or None, no_index=no_index or None, exclude_newer=exclude_newer,
    )
    if not spec.base:
        check_vllm_version(spec.vllm)
        base_ref = str(spec.base_manifest_path)
    else:
        base_ref = spec.base
    manifest, base_bytes, base_label = _load_base(base_ref)
    assert isinstance(manifest, BaseManifest)
    base_vllm = manifest.get("vllm")
    if base_vllm is not None and base_vllm.version != spec.vllm:
        raise BadInput(
            f"--vllm {spec.vllm} does not match the base {base_label}, which ships vllm {base_vllm.version}."
        )
    overlay = (list(spec.with_) if no_default_overlay else spec.overlay)
    if not overlay:
        raise BadInput("the overlay is empty: --no-default-overlay needs at least one --with REQ.")
    reqs = L.parse_overlay(overlay, where="--with" if not spec.source else f"--with / {spec.source} 'with'")
    L.check_overlay_against_vllm(reqs, spec.vllm)
    req = L.LockRequest(
        vllm=spec.vllm, base=manifest, base_bytes=base_bytes, overlay=overlay,
        allow=dict(spec.allow_abi_change),
        find_links=[f if "://" in f else str(Path(f).resolve()) for f in spec.find_links], no_index=spec.no_index,
        exclude_newer=spec.exclude_newer,
    )
    lock_path = spec.lock_path
    if lock_path.is_dir():
        raise BadInput(f"lock path {lock_path} is a directory; -o/--output (or the spec's 'lock') names the lock file.")
    if not check and is_pylock_path(lock_path):
        raise BadInput(f"-o {lock_path}: name the requirements.lock; `lock` writes its PEP 751 twin "
                       f"({twin_path(lock_path).name}) beside it. `lock --check` accepts either file.")
    uv = L.Uv()

    if check or (not upgrade and lock_path.exists()):
        try:
            fresh, why = L.is_up_to_date(lock_path, req, uv)
        except BadInput as exc:  # a damaged lock on disk is stale; a new lock replaces it
            if check:
                raise StaleLock(f"{lock_path} is not a readable lock: {exc.message}") from None
            fresh, why = False, exc.message
        if fresh:
            twin = _sync_twin(lock_path, check)
            _emit(as_json, {"status": "up-to-date", "lock": str(lock_path), "written": False,
                            "pylock": twin, "seconds": round(time.monotonic() - t_start, 3)},
                  f"{lock_path} is up to date with its inputs (base {base_label}, overlay {', '.join(overlay)}).")
            return
        if check:
            raise StaleLock(f"{lock_path} is stale: {why}.", hint="run `build-image lock` (without --check) to regenerate it.")

    console, status = _say_factory(False)
    if status is not None:
        status.start()

    def say(msg: str) -> None:
        if status is not None:
            status.update(msg)
        else:
            console.print(f"lock: {msg}", highlight=False, markup=False, soft_wrap=True)

    prefer = None
    if not upgrade and lock_path.exists():  # re-lock after an input change: move as little as possible
        from ..lockfile import load_lock

        try:
            prefer = {e.name: e.version for e in load_lock(lock_path).entries}
        except BadInput:
            prefer = None
    try:
        result = L.lock(req, uv, progress=say, prefer=prefer)
    finally:
        if status is not None:
            status.stop()
    gate = result.gate
    if not gate.ok:
        n = len(gate.violations)
        if as_json:
            _emit(True, {"status": "abi-rejected", "lock": str(lock_path), "written": False,
                         "gate": gate.to_dict(), "seconds": round(time.monotonic() - t_start, 3)}, "")
        exc = AbiRejected(
            f"{n} violation{'s' if n != 1 else ''} on top of base {base_label} "
            f"(vllm {spec.vllm}); nothing was written to {lock_path}.",
            details=format_rejection(gate),
        )
        exc.json_emitted = as_json
        raise exc
    try:
        result.lock.save(lock_path)
        write_pylock(twin_path(lock_path), result.lock)
    except OSError as exc:  # the lock on disk (if any) is untouched: the write is atomic
        raise BadInput(f"cannot write the lock {lock_path}: {exc.strerror or exc}.") from None
    notices = format_notices(gate)
    if notices and not as_json:
        click.echo("notices:\n" + notices, err=True)
    used = {canonical_name(f.name) for f in gate.allowed}
    unused = sorted(k for k in result.lock.allow_abi_change if k not in used)
    if unused:  # recorded anyway (it is an input); say so: a stale escape hatch would cover a future change
        click.echo(f"warning: --allow-abi-change {', '.join(unused)}: no gate violation to allow in this lock; "
                   "it is still recorded in the header and covers a later violation — drop it if it is stale.",
                   err=True)
    summary = {
        "status": "written",
        "lock": str(lock_path),
        "pylock": str(twin_path(lock_path)),
        "written": True,
        "entries": len(result.lock.entries),
        "resolved": result.resolved,
        "moved_base": sorted(e.key for e in result.lock.entries if e.base_version),
        "inputs_sha256": result.lock.header["inputs-sha256"],
        "lock_hash": result.lock.lock_hash,
        "gate": gate.to_dict(),
        "unused_allow_abi_change": unused,
        "timings": {k: round(v, 3) for k, v in result.timings.items()},
        "seconds": round(time.monotonic() - t_start, 3),
    }
    moved = summary["moved_base"]
    _emit(as_json, summary,
          f"wrote {lock_path}: {len(result.lock.entries)} packages on top of base {base_label} "
          f"({result.resolved} resolved; base distributions moved: {', '.join(moved) or 'none'}; "
          f"{len(gate.notices)} notice(s), {len(gate.allowed)} allowed ABI change(s)).")


def _sync_twin(lock_path: Path, check: bool) -> str | None:
    """The pylock.toml beside an up-to-date requirements.lock: --check fails (exit 5) when it is
    missing or pins anything else; otherwise it is rewritten from the lock (no resolution)."""
    from ..lockfile import load_lock

    if is_pylock_path(lock_path):
        return str(lock_path)
    lock = load_lock(lock_path)
    problem = twin_problem(lock_path, lock)
    if problem and check:
        raise StaleLock(f"{lock_path} is up to date but {problem}.",
                        hint="run `build-image lock` (without --check): it rewrites pylock.toml from requirements.lock.")
    if problem:
        write_pylock(twin_path(lock_path), lock)
        click.echo(f"rewrote {twin_path(lock_path)} from {lock_path} ({problem}).", err=True)
    return str(twin_path(lock_path))


def _emit(as_json: bool, doc: dict, text: str) -> None:
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    else:
        click.echo(text)
