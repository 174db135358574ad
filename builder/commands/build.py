"""``build-image build``: build a rendered context with BuildKit (no network inside the build)."""

from __future__ import annotations

from pathlib import Path

import click

from builder.commands import stderr_console
from builder.report import emit_json
from builder.spec import load_spec

# What a command runs (its stage, the engine adapter, downloads, reports) is imported inside the command
# function, not here: `build-image --help` imports every command module to list it, and a stage
# (with its dependencies) loads only when its command runs.


@click.command("build")
@click.argument("context", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--vllm", "vllm", default=None, metavar="VERSION", help="Picks the default context build/vllm-<v>.")
@click.option(
    "--tag", "repo", metavar="REPO", help="Image repository (default: spec 'repo', else build-image/vllm-serving)."
)
@click.option("--spec", "spec_file", metavar="FILE", type=click.Path(dir_okay=False), help="Spec file.")
@click.option("--pull", is_flag=True, help="Let the engine pull a base image it does not have (default: refuse).")
@click.option(
    "--platform",
    "platform",
    metavar="OS/ARCH[,OS/ARCH]",
    help="Of a multi-platform context, build only these (default: every platform it was rendered for).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result on stdout.")
def command(context, vllm, repo, spec_file, pull, platform, as_json):
    """Build CONTEXT (default build/vllm-<v>) with BuildKit, --network=none, and tag it.

    Tags: REPO:vllm<v>-<first 12 of the lock hash> and REPO:vllm<v>.  A multi-platform context
    (platforms.json) builds each platform with --platform (another machine's steps under QEMU) and
    tags each platform's image with its own tags, suffixed -linux-amd64 / -linux-arm64 (the engine's
    classic image store keeps one image per tag; the unsuffixed tags name the index `push` makes).
    Exit codes: 0 built, 2 bad/missing context, missing wheel, a platform the context was not rendered
    for, or a base the engine holds for another platform than the lock's, 7 wheel/patched file sha256
    mismatch, 8 engine unreachable, 9 build failed (incl. the Dockerfile's early checks, and a
    base image missing from the engine without --pull).
    """
    from builder.events import reporter_for
    from builder.image.build import build_image
    from builder.image.multiplatform import is_multi, select
    from builder.image.naming import lock_platform
    from builder.image.render import default_out_dir, read_context

    spec = load_spec(spec_file).with_flags(vllm=vllm, repo=repo)
    out = context or default_out_dir(spec.vllm)
    console = stderr_console()
    if is_multi(out):
        build_multi(out, spec.repo, platform, pull=pull, as_json=as_json, console=console)
        return
    ctx = read_context(out, spec.repo)  # verifies every sha256 first
    locked_for = lock_platform(ctx.lock)
    select((locked_for,), platform, ctx.out_dir)
    note = source_date_epoch_note(ctx.out_dir)
    if note:
        console.print(note, markup=False, highlight=False)
    built = build_image(
        ctx.out_dir,
        ctx.tags,
        vllm=ctx.vllm,
        lock_hash=ctx.lock_hash,
        base_refs=ctx.base_refs,
        pull=pull,
        reporter=reporter_for(console, as_json=as_json).scoped("build: "),
        platform=locked_for,
    )
    print_warnings(console, built)
    if as_json:
        emit_json(built.to_dict())
    else:
        click.echo(f"built {built.image_id} ({(built.size_bytes or 0) / 1e6:.1f} MB) in {built.seconds}s")
        for t in built.tags:
            click.echo(f"  tagged {t}")


def print_warnings(console, built) -> None:
    for line in built.warnings:
        console.print("[yellow]warning:[/yellow] " + line.replace("[", r"\["), highlight=False, soft_wrap=True)


def build_multi(out: Path, repo: str | None, platform: str | None, *, pull: bool, as_json: bool, console) -> None:
    """Every selected platform of a multi-platform context, each reported with its own tags."""
    from builder.events import reporter_for
    from builder.image.multiplatform import build_platforms, read_multi_context

    mc = read_multi_context(out, repo, wanted=platform)
    note = source_date_epoch_note(mc.platforms[0].context.out_dir)
    if note:
        console.print(note, markup=False, highlight=False)
    built = build_platforms(mc, pull=pull, reporter=reporter_for(console, as_json=as_json).scoped("build: "))
    for b in built.builds:
        print_warnings(console, b)
    if as_json:
        emit_json(built.to_dict())
        return
    for b in built.builds:
        click.echo(f"built {b.platform} {b.image_id} ({(b.size_bytes or 0) / 1e6:.1f} MB) in {b.seconds}s")
        for t in b.tags:
            click.echo(f"  tagged {t}")
    click.echo(
        f"`build-image push` makes the index {', '.join(built.index_tags)} of "
        f"{', '.join(str(b.platform) for b in built.builds)}"
    )


def source_date_epoch_note(context: Path) -> str | None:
    """A note when ``SOURCE_DATE_EPOCH`` is set at build time to another moment than the one the
    context was rendered with: render reads it (the created label and file times are in the
    Dockerfile), build cannot change it; None when unset or the same."""
    import os
    import re

    from builder.image.render import default_source_date_epoch, epoch_iso

    if not os.environ.get("SOURCE_DATE_EPOCH"):
        return None
    want = epoch_iso(default_source_date_epoch())
    try:
        m = re.search(r'org\.opencontainers\.image\.created="?([0-9TZ:-]+)', (context / "Dockerfile").read_text())
    except OSError:
        return None
    have = m.group(1) if m else None
    if have == want:
        return None
    return (
        f"note: SOURCE_DATE_EPOCH={os.environ['SOURCE_DATE_EPOCH']} ({want}) is ignored by build: the context "
        f"{context} was rendered with created={have or 'unknown'}, and render fixes that time. Re-render with "
        "SOURCE_DATE_EPOCH set (build-image render) to build an image with it."
    )
