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
@click.option("--tag", "repo", metavar="REPO",
              help="Image repository (default: spec 'repo', else build-image/vllm-serving).")
@click.option("--spec", "spec_file", metavar="FILE", type=click.Path(dir_okay=False), help="Spec file.")
@click.option("--pull", is_flag=True, help="Let the engine pull a base image it does not have (default: refuse).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result on stdout.")
def command(context, vllm, repo, spec_file, pull, as_json):
    """Build CONTEXT (default build/vllm-<v>) with BuildKit, --network=none, and tag it.

    Tags: REPO:vllm<v>-<first 12 of the lock hash> and REPO:vllm<v>.
    Exit codes: 0 built, 2 bad/missing context or missing wheel, 7 wheel/patched file sha256
    mismatch, 8 engine unreachable, 9 build failed (incl. the Dockerfile's early checks, and a
    base image missing from the engine without --pull).
    """
    from builder.events import reporter_for
    from builder.image.build import build_image
    from builder.image.render import default_out_dir, read_context

    spec = load_spec(spec_file).with_flags(vllm=vllm, repo=repo)
    ctx = read_context(context or default_out_dir(spec.vllm), spec.repo)  # verifies every sha256 first
    console = stderr_console()
    note = source_date_epoch_note(ctx.out_dir)
    if note:
        console.print(note, markup=False, highlight=False)
    built = build_image(ctx.out_dir, ctx.tags, vllm=ctx.vllm, lock_hash=ctx.lock_hash, base_refs=ctx.base_refs,
                        pull=pull, reporter=reporter_for(console, as_json=as_json).scoped("build: "))
    for line in built.warnings:
        console.print("[yellow]warning:[/yellow] " + line.replace("[", r"\["), highlight=False, soft_wrap=True)
    if as_json:
        emit_json(built.to_dict())
    else:
        click.echo(f"built {built.image_id} ({(built.size_bytes or 0) / 1e6:.1f} MB) in {built.seconds}s")
        for t in built.tags:
            click.echo(f"  tagged {t}")


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
    return (f"note: SOURCE_DATE_EPOCH={os.environ['SOURCE_DATE_EPOCH']} ({want}) is ignored by build: the context "
            f"{context} was rendered with created={have or 'unknown'}, and render fixes that time. Re-render with "
            "SOURCE_DATE_EPOCH set (build-image render) to build an image with it.")
