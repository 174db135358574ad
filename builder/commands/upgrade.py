"""``build-image upgrade``: port, re-lock, gate and report one vLLM release upgrade (docs/upgrade.md)."""

from __future__ import annotations

import sys

import click

from builder.commands import mark_direction, platform_option
from builder.errors import BadInput
from builder.events import SILENT, PlainReporter
from builder.report import emit_text
from builder.util import check_writable_dir
from builder.validate import release_direction, version_string

# What a command runs (its stage, the engine adapter, downloads, reports) is imported inside the command
# function, not here: `build-image --help` imports every command module to list it, and a stage
# (with its dependencies) loads only when its command runs.


_OPTIONS = [
    click.option("--to", "to_version", required=True, help="The vLLM release to upgrade to (B)."),
    click.option(
        "--from",
        "from_version",
        default=None,
        help="The release upgraded from (A; default: the newest shipped patch series older than B).",
    ),
    click.option(
        "--format",
        "fmt",
        type=click.Choice(["text", "markdown", "json"]),
        default="text",
        help="Report format (markdown: a pull-request body).",
    ),
    click.option(
        "-o",
        "--output",
        "out_dir",
        type=click.Path(file_okay=False),
        default=None,
        help="Write B's series, lock (and a reconstructed base manifest) under DIR in the repository layout, "
        "and the report as DIR/upgrade-<A>-<B>.<md|txt|json>. Without it nothing is written.",
    ),
    click.option(
        "--spec",
        "spec_path",
        type=click.Path(dir_okay=False, exists=True),
        default=None,
        help="Spec whose [serving] settings are planned on both releases.",
    ),
    click.option(
        "--lock",
        "lock_from",
        type=click.Path(dir_okay=False, exists=True),
        default=None,
        help="A's lock, whose overlay is re-locked (default lockfiles/vllm-<A>/requirements.lock).",
    ),
    click.option(
        "--with", "with_", multiple=True, metavar="REQ", help="Overlay requirement (replaces the lock's overlay)."
    ),
    click.option("--no-default-overlay", is_flag=True, help="Do not add ray[serve] to the overlay."),
    click.option(
        "--base-from", default=None, type=click.Path(dir_okay=False), help="A's base manifest (default: shipped)."
    ),
    click.option(
        "--base-to",
        default=None,
        type=click.Path(dir_okay=False),
        help="B's base manifest (default: shipped, else reconstructed from its recipe).",
    ),
    click.option(
        "--sdist",
        "sdist_path",
        type=click.Path(dir_okay=False),
        default=None,
        help="B's build files from this vLLM sdist (a release candidate, a nightly) instead of the index's: "
        "B's base is reconstructed from them; --to must be the version its PKG-INFO says.",
    ),
    click.option(
        "--source",
        "source",
        type=click.Path(file_okay=False),
        default=None,
        help="B's build files from the HEAD commit of this vLLM git checkout (main before the release): B's "
        "base is reconstructed from them; --to must agree with its tag (a release after the tag when the "
        "commit is past it; then the tag's published wheel stands in for B's and --to-wheel is needed).",
    ),
    click.option(
        "--series",
        "series_dir",
        type=click.Path(file_okay=False),
        default=None,
        help="A's patch series (default patches/vllm/<A>/).",
    ),
    click.option("--from-wheel", type=click.Path(exists=True), default=None, help="A's vllm wheel or package tree."),
    click.option("--to-wheel", type=click.Path(exists=True), default=None, help="B's vllm wheel or package tree."),
    click.option(
        "--find-links", multiple=True, metavar="DIR", help="Extra wheel folder for the lock (uv --find-links)."
    ),
    click.option("--no-index", is_flag=True, help="Lock from --find-links folders only."),
    click.option(
        "--probe-python",
        default=None,
        type=click.Path(dir_okay=False, exists=True),
        help="Interpreter for the patch probes (default: a venv from the series' probe-env.txt).",
    ),
    click.option("--allow-downgrade", is_flag=True, help="Go to an older release (refused, exit 2, without it)."),
    click.option(
        "--force",
        is_flag=True,
        help="Replace a file under -o DIR (report, B's lock or base manifest) that build-image did not write.",
    ),
    click.option(
        "--relax",
        "relax",
        multiple=True,
        metavar="NAME[EXTRA]",
        help="Reconstruct B's base without this requirement (NAME) or these extras of it (NAME[EXTRA,...]); "
        "recorded in the manifest's lacks and the report.",
    ),
    click.option(
        "--strict",
        is_flag=True,
        help="Do not relax on its own: a step of B's image that no reachable index satisfies is exit 4 "
        "naming the missing distribution and both ways through.",
    ),
    click.option(
        "--accept-undecided",
        "accept_undecided",
        multiple=True,
        metavar="FILE:LINE",
        help="Replay B's image without this RUN line the recipe reader cannot decide (recorded in lacks).",
    ),
    platform_option(
        help_extra=" Each other platform gets its own section: B's base of that platform (shipped, or "
        "reconstructed from the release's step for it), its moves against A's, and A's overlay locked on it "
        "(with -o: its manifest, recipes table and lock)."
    ),
]


def _with_options(f):
    """upgrade's options, in the order --help lists them."""
    for opt in reversed(_OPTIONS):
        f = opt(f)
    return f


@click.command("upgrade")
@_with_options
def command(
    to_version,
    from_version,
    fmt,
    out_dir,
    base_to,
    with_,
    no_default_overlay,
    relax,
    strict,
    accept_undecided,
    allow_downgrade,
    force,
    platform,
    **inputs,
):
    """Upgrade to vLLM B as one reviewable report.

    Reconstructs B's base manifest if none is shipped, ports A's patch series
    (applies / merged / conflict / upstream, each backed by its probe), re-locks A's
    overlay on B's base (the ABI gate runs there; ray is chosen per release), and
    reports the base-image moves, overlay changes, the ray chosen, each patch's status
    and what the plan says differently.

    A step of B's image that no index reachable from here satisfies (a distribution the
    release pins that the Python index does not serve) is replayed without it, named in
    the report for review (--relax NAME does so by hand; --strict refuses instead).
    With -o . the checkout gains everything `build-image --vllm B` needs: B's base
    manifest, its recipes table, the ported series, the lock and its pylock twin.

    Exit codes: 0 every patch applies or is retired upstream and the gate passes;
    1 something needs review (a merged or conflict patch, a gate rejection, an overlay
    that no longer resolves, a relaxed or approximated base); 2 bad input (flags, a file
    under -o build-image did not write, an undecidable Dockerfile line); 4 a step of B's
    image does not resolve and --strict (or no relaxation helps); 6 A's series cannot be
    read; 7 download/sha256 failure; 12 uv or another helper failed; 14 another run
    holds -o; 130/143 interrupted.
    """
    from builder import platforms
    from builder import upgrade as U
    from builder.resolve.stepindex import parse_relaxations

    targets = platforms.parse_list(platform)
    version_string(to_version, where="--to")
    parse_relaxations(relax)
    if from_version is None:
        from_version = _previous_series(to_version)
    if from_version == to_version:
        raise BadInput(f"--from and --to are both {to_version}: nothing to upgrade.")
    direction = release_direction(from_version, to_version, allow_downgrade=allow_downgrade)
    b_files = _before_work(out_dir, from_version, to_version, fmt, base_to, force, targets, inputs)
    reporter = PlainReporter().scoped("upgrade: ") if fmt == "text" or out_dir else SILENT
    req = U.UpgradeRequest(
        from_version=from_version,
        to_version=to_version,
        base_to=base_to,
        with_=tuple(with_),
        default_overlay=False if no_default_overlay else None,
        out_dir=out_dir,
        relax=tuple(relax),
        auto_relax=not strict,
        accept_undecided=tuple(accept_undecided),
        platforms=targets,
        b_files=b_files,
        **inputs,  # A's and B's inputs as given: series, wheels, base manifests, lock, spec, indexes, probe python
    )
    rep = U.upgrade(req, reporter)
    text = mark_direction(U.render(rep, fmt), fmt, direction, from_version, to_version)
    if out_dir:
        dest = U.report_path(out_dir, from_version, to_version, fmt)
        rep.written.append(str(dest))
        text = mark_direction(U.render(rep, fmt), fmt, direction, from_version, to_version)
        U.write_report(dest, text)
    emit_text(text)
    sys.exit(rep.exit_code)


def _before_work(out_dir, from_version, to_version, fmt, base_to, force, targets, inputs: dict):
    """What is checked before any work: B's build files (--sdist/--source, taken out of ``inputs``:
    :func:`_b_build_files`) and the output rule for -o DIR (nothing under DIR is replaced that build-image did
    not write; a read-only DIR is exit 2 naming it).  Returns B's build files or None."""
    from builder import upgrade as U

    b_files = _b_build_files(
        to_version, inputs.pop("sdist_path", None), inputs.pop("source", None), base_to, inputs.get("to_wheel")
    )
    if out_dir:
        check_writable_dir(out_dir)
        U.check_outputs(
            out_dir,
            from_version,
            to_version,
            fmt,
            base_to=base_to,
            force=force,
            platforms=targets,
            local=b_files is not None,
        )
    return b_files


def _b_build_files(to_version: str, sdist_path, source, base_to, to_wheel):
    """B's build files from --sdist PATH or --source DIR (None without them), read and checked against --to
    before any work (:func:`builder.resolve.sdist.load_local_sdist` / ``load_source``).  Bad input: both
    given, either with --base-to, and a B whose wheel is not published (a checkout past its tag) without
    --to-wheel (the patches are ported onto B's own code, which no published wheel holds)."""
    if not (sdist_path or source):
        return None
    from pathlib import Path

    from builder.resolve import sdist

    if sdist_path and source:
        raise BadInput("--sdist and --source name two sources of B's build files; give one.")
    if base_to:
        raise BadInput(
            "--base-to gives B's base manifest and --sdist/--source the files to reconstruct it from; give one."
        )
    files = (
        sdist.load_local_sdist(Path(sdist_path), to_version)
        if sdist_path
        else sdist.load_source(Path(source), to_version)
    )
    if files.wheel and not to_wheel:
        raise BadInput(
            f"vllm {to_version} ({files.sdist.filename}) is not a published release, so no wheel holds its code "
            "for A's patches to be ported onto; pass --to-wheel (B's vllm wheel, or the vllm/ package folder "
            "of the checkout).",
        )
    return files


def _previous_series(to_version: str) -> str:
    from packaging.version import Version

    from builder.patching import series as P

    root = P.patches_root() / "vllm"
    older = (
        sorted(
            (p.name for p in root.iterdir() if (p / P.SERIES_FILE).is_file() and Version(p.name) < Version(to_version)),
            key=Version,
        )
        if root.is_dir()
        else []
    )
    if not older:
        raise BadInput(f"no shipped patch series older than {to_version}: pass --from A.")
    return older[-1]
