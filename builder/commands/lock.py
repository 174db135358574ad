"""``build-image lock``: resolve the overlay on top of the base, gate it, write the lock."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from builder.commands import platform_option, stderr_console
from builder.errors import AbiRejected, BadInput, BuildImageError, StaleLock, Unsatisfiable
from builder.report import emit_json
from builder.spec import load_spec
from builder.util import canonical_name
from builder.validate import exclude_newer as valid_exclude_newer

# What a command runs (its stage, the engine adapter, downloads, reports) is imported inside the command
# function, not here: `build-image --help` imports every command module to list it, and a stage
# (with its dependencies) loads only when its command runs.


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
    """A rich console and its spinner on a terminal; (None, None) otherwise (a log or a pipe gets plain
    lines, and rich is not even imported: `lock --check` in CI stays fast)."""
    if quiet or not sys.stderr.isatty():
        return None, None
    console = stderr_console(highlight=True)
    if not console.is_terminal:
        return None, None
    return console, console.status("locking")


_OPTIONS = [
    click.option("--vllm", "vllm", metavar="VERSION", help="vLLM version of the base (default: spec, else 0.26.0)."),
    click.option(
        "--with",
        "with_",
        multiple=True,
        metavar="REQ",
        help="Overlay requirement (repeatable), added to ray[serve]. Naming a base distribution releases its pin.",
    ),
    click.option(
        "--base",
        "base",
        metavar="REF_OR_MANIFEST",
        help="Base manifest (.json) or a LOCAL image ref to snapshot "
        "(default: lockfiles/base/vllm-openai-v<vllm>.json).",
    ),
    click.option(
        "--spec",
        "spec_path",
        metavar="FILE",
        type=click.Path(path_type=Path),
        help="Spec file (default: ./build-image.toml when present). Flags win.",
    ),
    click.option(
        "-o", "--output", "output", metavar="FILE", help="Lock file (default: lockfiles/vllm-<vllm>/requirements.lock)."
    ),
    click.option("--check", is_flag=True, help="Exit 5 when the lock is stale against its inputs; write nothing."),
    click.option("--upgrade", is_flag=True, help="Resolve again even when the lock is up to date with its inputs."),
    click.option(
        "--allow-abi-change",
        "allow_names",
        multiple=True,
        metavar="NAME",
        help="Accept a gate violation for NAME (repeatable; needs --reason, recorded in the lock header).",
    ),
    click.option("--reason", "reasons", multiple=True, metavar="TEXT", help="Why the ABI change is acceptable."),
    click.option(
        "--find-links", "find_links", multiple=True, metavar="DIR", help="Extra wheel folder (uv --find-links)."
    ),
    click.option("--no-index", is_flag=True, help="Do not use PyPI: only --find-links folders."),
    click.option(
        "--exclude-newer",
        "exclude_newer",
        metavar="DATE",
        help="Ignore files uploaded after DATE (uv --exclude-newer).",
    ),
    click.option("--no-default-overlay", is_flag=True, help="Do not add ray[serve] to the overlay."),
    click.option(
        "--force",
        is_flag=True,
        help="Replace a lock whose header names another base, or an -o file that is not a build-image lock.",
    ),
    click.option("--json", "as_json", is_flag=True, help="Machine-readable result on stdout."),
    platform_option(
        help_extra=" Each platform is locked on its own base manifest into its own lock "
        "(lockfiles/vllm-<vllm>/linux-arm64/requirements.lock), with uv's target platform for that "
        "machine at the base's glibc."
    ),
]


def _with_options(f):
    """lock's options, in the order --help lists them."""
    for opt in reversed(_OPTIONS):
        f = opt(f)
    return f


@click.command("lock")
@_with_options
def command(as_json, **opts):
    """Resolve ray[serve] + --with on top of the base image, run the ABI gate, write a hash-pinned lock.

    The default overlay's ray is the newest whose ray[llm] extra pins the base's vllm (else the newest
    that fits; the Serve app then uses `vllm serve`); the lock header says which and why.  On a base
    without vllm, --vllm X adds vllm==X to the overlay.

    Exit codes: 0 written / up to date, 2 bad input (an unknown platform, a base of another platform, an -o
    lock or pylock twin of another platform: never replaced, --force included),
    3 ABI gate rejection, 4 unsatisfiable on top of the base, 5 stale lock (--check), 7 wheel
    download / sha256 failure, 12 uv failed.  With --json every outcome is a JSON document on stdout.
    """
    try:
        _lock(as_json=as_json, **opts)
    except AbiRejected as exc:
        if as_json and getattr(exc, "gate", None) is not None:
            _emit(
                True,
                {
                    "status": "abi-rejected",
                    "written": False,
                    "exit_code": exc.exit_code,
                    "error": exc.title,
                    "message": exc.message,
                    "gate": exc.gate.to_dict(),
                },
                "",
            )
            exc.json_emitted = True
        raise
    except BuildImageError as exc:
        # --json: every outcome is a JSON document on stdout (the message stays on stderr)
        if as_json and not getattr(exc, "json_emitted", False):
            doc = {
                "status": _ERROR_STATUS.get(type(exc), "error"),
                "written": False,
                "exit_code": exc.exit_code,
                "error": exc.title,
                "message": exc.message,
                "hint": exc.hint,
                "details": exc.details,
            }
            moves = getattr(exc, "pin_moves", None)
            if moves is not None:  # every base pin that must move, for CI to read
                doc["pin_moves"] = {
                    "resolves": moves.resolves,
                    "with": moves.with_line,
                    "blocked": moves.blocked,
                    "moves": [{"name": n, "base": o, "to": v} for n, o, v in moves.moves],
                }
            _emit(True, doc, "")
        raise


_ERROR_STATUS = {BadInput: "bad-input", StaleLock: "stale", Unsatisfiable: "unsatisfiable", AbiRejected: "abi-rejected"}


def _lock(
    *,
    vllm,
    with_,
    base,
    spec_path,
    output,
    check,
    upgrade,
    allow_names,
    reasons,
    find_links,
    no_index,
    exclude_newer,
    no_default_overlay,
    as_json,
    force,
    platform,
):
    """The lock stage for lock's flags (by their click names): one lock, or one per --platform."""
    from builder import platforms

    targets = platforms.parse_list(platform)
    exclude_newer = valid_exclude_newer(exclude_newer)
    spec = load_spec(spec_path).with_flags(
        vllm=vllm,
        with_=list(with_) or None,
        base=base,
        lock=output,
        allow_abi_change=_allow(allow_names, reasons),
        find_links=list(find_links) or None,
        no_index=no_index or None,
        exclude_newer=exclude_newer,
    )
    specs = spec.for_platforms(targets)
    if len(specs) == 1:
        locked = _lock_one(specs[0], check, upgrade, force, no_default_overlay, as_json)
        _emit(as_json, locked.to_dict(), locked.summary_line())
        return
    docs, lines = [], []
    for one in specs:  # each platform on its own base and lock; the first that fails stops the run
        locked = _lock_one(one, check, upgrade, force, no_default_overlay, as_json)
        docs.append({"platform": one.platform.name, **locked.to_dict()})
        lines.append(f"{one.platform.name}: {locked.summary_line()}")
    _emit(as_json, {"platforms": docs}, "\n".join(lines))


def _lock_one(spec, check, upgrade, force, no_default_overlay, as_json):
    """One platform's lock stage, its progress on stderr."""
    from builder.events import PlainReporter, RichReporter
    from builder.resolve.lockstage import run_lock

    console, status = _say_factory(False)
    if status is not None:
        status.start()
    # steps on the spinner (or "lock: " lines in a log); --json keeps the notices in the document only
    reporter = (
        RichReporter(console, status=status, notices=not as_json)
        if status is not None
        else PlainReporter(notices=not as_json).scoped("lock: ")
    )
    try:
        return run_lock(
            spec, check=check, upgrade=upgrade, force=force, default_overlay=not no_default_overlay, reporter=reporter
        )
    finally:
        if status is not None:
            status.stop()


def _emit(as_json: bool, doc: dict, text: str) -> None:
    if as_json:
        emit_json(doc, sort_keys=True)
    else:
        click.echo(text)
