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
@click.option("--force", is_flag=True, help="Replace a lock whose header names another base.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result on stdout.")
def command(vllm, with_, base, spec_path, output, check, upgrade, allow_names, reasons, find_links, no_index,
            exclude_newer, no_default_overlay, as_json, force=False):
    """Resolve ray[serve] + --with on top of the base image, run the ABI gate, write a hash-pinned lock.

    The default overlay's ray is the newest whose ray[llm] extra pins the base's vllm (else the newest
    that fits; the Serve app then uses `vllm serve`); the lock header says which and why.  On a base
    without vllm, --vllm X adds vllm==X to the overlay.

    Exit codes: 0 written / up to date, 2 bad input, 3 ABI gate rejection,
    4 unsatisfiable on top of the base, 5 stale lock (--check), 7 wheel download / sha256
    failure, 12 uv failed.  With --json every outcome is a JSON document on stdout.
    """
    try:
        with _output_guard(spec_path, vllm, output, check):  # a second writer waits, then sees the first's lock
            _lock(vllm, with_, base, spec_path, output, check, upgrade, allow_names, reasons, find_links, no_index,
                  exclude_newer, no_default_overlay, as_json, force)
    except AbiRejected as exc:
        if as_json and getattr(exc, "gate", None) is not None:
            _emit(True, {"status": "abi-rejected", "written": False, "exit_code": exc.exit_code,
                         "error": exc.title, "message": exc.message, "gate": exc.gate.to_dict()}, "")
            exc.json_emitted = True
        raise
    except BuildImageError as exc:
        # --json: every outcome is a JSON document on stdout (the message stays on stderr)
        if as_json and not getattr(exc, "json_emitted", False):
            doc = {"status": _ERROR_STATUS.get(type(exc), "error"), "written": False,
                   "exit_code": exc.exit_code, "error": exc.title, "message": exc.message,
                   "hint": exc.hint, "details": exc.details}
            moves = getattr(exc, "pin_moves", None)
            if moves is not None:  # every base pin that must move, for CI to read
                doc["pin_moves"] = {"resolves": moves.resolves, "with": moves.with_line, "blocked": moves.blocked,
                                    "moves": [{"name": n, "base": o, "to": v} for n, o, v in moves.moves]}
            _emit(True, doc, "")
        raise


def _output_guard(spec_path, vllm, output, check):
    """The output lock of the lock file this run writes (none for --check: it writes nothing)."""
    import contextlib

    from ..spec import load_spec
    from ..util import output_lock

    if check:
        return contextlib.nullcontext()
    return output_lock(load_spec(spec_path).with_flags(vllm=vllm, lock=output).lock_path)


_ERROR_STATUS = {BadInput: "bad-input", StaleLock: "stale", Unsatisfiable: "unsatisfiable", AbiRejected: "abi-rejected"}


def _lock(vllm, with_, base, spec_path, output, check, upgrade, allow_names, reasons, find_links, no_index,
          exclude_newer, no_default_overlay, as_json, force):
    from .. import lock as L
    from ..abi import format_notices
    from ..baseref import resolve_base
    from ..spec import load_spec

    t_start = time.monotonic()
    spec = load_spec(spec_path).with_flags(
        vllm=vllm, with_=list(with_) or None, base=base, lock=output, allow_abi_change=_allow(allow_names, reasons),
        find_links=list(find_links) or None, no_index=no_index or None, exclude_newer=exclude_newer,
    )
    resolved = resolve_base(spec.base, spec.vllm)
    if not spec.vllm_given and resolved.vllm:  # no --vllm: the base's vllm (and its default lock path)
        spec = spec.with_flags(vllm=resolved.vllm)
    req = L.request_for(
        vllm=spec.vllm, base=resolved, with_=spec.with_, default_overlay=not no_default_overlay,
        vllm_given=spec.vllm_given, allow=spec.allow_abi_change, find_links=spec.find_links, no_index=spec.no_index,
        exclude_newer=spec.exclude_newer, where="--with" if not spec.source else f"--with / {spec.source} 'with'",
    )
    if not check and is_pylock_path(spec.lock_path):
        raise BadInput(f"-o {spec.lock_path}: name the requirements.lock; `lock` writes its PEP 751 twin "
                       f"({twin_path(spec.lock_path).name}) beside it. `lock --check` accepts either file.")
    console, status = _say_factory(False)
    if status is not None:
        status.start()

    def say(msg: str) -> None:
        if status is not None:
            status.update(msg)
        else:
            console.print(f"lock: {msg}", highlight=False, markup=False, soft_wrap=True)

    try:
        out = L.run(req, spec.lock_path, check=check, upgrade=upgrade, force=force, progress=say)
    finally:
        if status is not None:
            status.stop()
    lock_path = out.path
    if out.status == "up-to-date":
        twin = _sync_twin(lock_path, check)
        _emit(as_json, {"status": "up-to-date", "lock": str(lock_path), "written": False,
                        "pylock": twin, "seconds": round(time.monotonic() - t_start, 3)},
              f"{lock_path} is up to date with its inputs (base {resolved.label}, overlay {', '.join(req.overlay)}).")
        return
    result = out.result
    gate = result.gate
    notices = format_notices(gate)
    if notices and not as_json:
        click.echo("notices:\n" + notices, err=True)
    if out.unused_allow:  # recorded anyway (it is an input); say so: a stale escape hatch would cover a future change
        click.echo(f"warning: --allow-abi-change {', '.join(out.unused_allow)}: no gate violation to allow in this lock; "
                   "it is still recorded in the header and covers a later violation — drop it if it is stale.",
                   err=True)
    header = result.lock.header
    summary = {
        "status": "written",
        "lock": str(lock_path),
        "pylock": str(twin_path(lock_path)),
        "written": True,
        "entries": len(result.lock.entries),
        "resolved": result.resolved,
        "moved_base": sorted(e.key for e in result.lock.entries if e.base_version),
        "inputs_sha256": header["inputs-sha256"],
        "lock_hash": result.lock.lock_hash,
        "vllm": header.get("vllm"),
        "ray": header.get("ray"),
        "serve_backend": header.get("serve-backend"),
        "gate": gate.to_dict(),
        "unused_allow_abi_change": out.unused_allow,
        "timings": {k: round(v, 3) for k, v in result.timings.items()},
        "seconds": round(time.monotonic() - t_start, 3),
    }
    moved = summary["moved_base"]
    ray_line = f"; ray {header['ray']}" if header.get("ray") else ""
    _emit(as_json, summary,
          f"wrote {lock_path}: {len(result.lock.entries)} packages on top of base {resolved.label} "
          f"({result.resolved} resolved; base distributions moved: {', '.join(moved) or 'none'}; "
          f"{len(gate.notices)} notice(s), {len(gate.allowed)} allowed ABI change(s)){ray_line}.")


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
