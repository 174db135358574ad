"""`build-image --vllm X ...`: the whole pipeline (:mod:`builder.pipeline` composes the stages).

lock (reused when up to date) -> ABI gate (inside lock) -> patch check -> render -> build
-> push -> smoke.  Without a reachable engine it stops after render, prints how to build
the context elsewhere and exits 0 -- unless --push/--smoke were asked for, which cannot be
honoured: then it exits 8 (the context is still written).
"""

from __future__ import annotations

from pathlib import Path

import click

from builder.commands import platform_option, stderr_console
from builder.report import emit_json
from builder.spec import load_spec

# What a command runs (its stage, the engine adapter, downloads, reports) is imported inside the command
# function, not here: `build-image --help` imports every command module to list it, and a stage
# (with its dependencies) loads only when its command runs.


@click.command("pipeline")
@click.option("--vllm", "vllm", default=None, help="vLLM version (default: spec or 0.26.0).")
@click.option(
    "--spec",
    "spec_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Spec file (default ./build-image.toml if present).",
)
@click.option("--with", "with_", multiple=True, metavar="REQ", help="Extra overlay requirement (repeatable).")
@click.option(
    "--base", "base", default=None, metavar="MANIFEST|REF", help="Base manifest file, or a local image to snapshot."
)
@click.option(
    "--lock", "lock_file", default=None, metavar="FILE", help="Lock file (reused when up to date with its inputs)."
)
@click.option(
    "-o",
    "--output",
    "out",
    default=None,
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Build context directory (default build/vllm-<v>).",
)
@click.option("--tag", "repo", default=None, metavar="REPO", help="Image repository, e.g. 127.0.0.1:5000/serving/vllm.")
@click.option("--push", "push", is_flag=True, help="Push both tags and verify the registry's digest.")
@click.option("--force", "force", is_flag=True, help="Push: move tags that point at a different image.")
@click.option(
    "--series",
    "series",
    default=None,
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Patch series (default patches/vllm/<v>/).",
)
@click.option("--no-patches", "no_patches", is_flag=True, help="Apply no patch series.")
@click.option(
    "--wheel",
    "wheel",
    default=None,
    metavar="VLLM_WHEEL",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="vllm wheel for the patch check (default: fetched, cached).",
)
@click.option(
    "--find-links",
    "find_links",
    multiple=True,
    metavar="DIR",
    help="Extra wheel folder for the lock (uv --find-links).",
)
@click.option("--no-index", "no_index", is_flag=True, help="Lock from --find-links folders only.")
@click.option("--no-default-overlay", "no_default_overlay", is_flag=True, help="Do not add ray[serve] to the overlay.")
@click.option(
    "--kuberay", "kuberay", is_flag=True, help="Write KubeRay manifests (by digest after --push, else by tag)."
)
@click.option("--smoke", "smoke", is_flag=True, help="After build (and push), boot the image and run the smoke test.")
@click.option("--model", "model", default=None, metavar="PATH", help="Smoke: checkpoint directory.")
@click.option("--pull", "pull", is_flag=True, help="Build: let the engine pull a base image it does not hold.")
@click.option(
    "--allow-base-drift",
    "allow_base_drift",
    is_flag=True,
    help="The image build lists base drift (against the manifest) as a warning instead of failing.",
)
@click.option("--json", "as_json", is_flag=True, help="Final summary as JSON on stdout.")
@platform_option(
    help_extra=" Several: each platform locked, gated and rendered on its own base manifest and lock "
    "(DIR/<os>-<arch>/), built per platform and pushed as one OCI image index."
)
def run_pipeline(
    vllm,
    spec_file,
    with_=(),
    base=None,
    lock_file=None,
    out=None,
    repo=None,
    push=False,
    force=False,
    series=None,
    no_patches=False,
    wheel=None,
    find_links=(),
    no_index=False,
    no_default_overlay=False,
    kuberay=False,
    smoke=False,
    model=None,
    pull=False,
    allow_base_drift=False,
    as_json=False,
    platform=None,
):
    """lock -> ABI gate -> patch check -> render -> build -> push -> smoke."""
    from builder import platforms
    from builder.events import reporter_for
    from builder.image.render import default_out_dir
    from builder.pipeline import PipelineRequest, run

    reporter = reporter_for(stderr_console(), as_json=as_json)
    spec = load_spec(spec_file).with_flags(
        vllm=vllm,
        repo=repo,
        lock=lock_file,
        model=model,
        base=base,
        with_=list(with_) or None,
        find_links=list(find_links) or None,
        no_index=no_index or None,
    )
    spec = spec.with_flags(vllm=spec.vllm)  # the pipeline always names its vllm to the lock stage
    targets = platforms.parse_list(platform)
    spec = spec.for_platforms(targets)[0] if len(targets) == 1 else spec
    req = PipelineRequest(
        spec=spec,
        out=out or default_out_dir(spec.vllm),
        push=push,
        force=force,
        series=series,
        no_patches=no_patches,
        wheel=wheel,
        default_overlay=not no_default_overlay,
        kuberay=kuberay,
        smoke=smoke,
        model=model or spec.serving.model,
        pull=pull,
        allow_base_drift=allow_base_drift,
        platforms=targets,
    )
    result = run(req, reporter)
    if result.notice:
        reporter.warning(result.notice.removeprefix(result.notice_lead), lead=result.notice_lead)
    _emit(as_json, result.summary)
    if result.error is not None:
        raise result.error


def _emit(as_json: bool, summary: dict) -> None:
    if as_json:
        emit_json(summary)
        return
    if "platforms" in summary:
        _emit_platforms(summary)
        return
    lines = [
        f"vllm {summary['vllm']}  lock {summary.get('lock')} ({summary.get('lock_hash', '')[:12]})",
        f"context {summary['context']} ({summary.get('context_bytes', 0) / 1e6:.1f} MB)",
    ]
    if summary.get("image_id"):
        lines.append(f"image {summary['image_id']} ({(summary.get('image_bytes') or 0) / 1e6:.1f} MB)")
    check = summary.get("base_check")
    if check and check["status"] == "verified":
        lines.append(f"base manifest verified against {check['against']}")
    elif check:
        lines.append(
            f"base {check['image']} differs from its manifest ({len(check['differences'])} difference(s)): "
            f"locked against its snapshot, {check['manifest']}"
        )
    for t in summary.get("tags", []):
        lines.append(f"tag {t}")
    if summary.get("digest"):
        lines.append(f"pushed {summary['pinned']}")
    lines.append(_time_line(summary))
    click.echo("\n".join(lines))


def _emit_platforms(summary: dict) -> None:
    """The summary of a multi-platform run: a block per platform, then the index."""
    lines = [f"vllm {summary['vllm']}  context {summary['context']} ({', '.join(summary['platforms'])})"]
    for name, one in summary["per_platform"].items():
        lines.append(f"  {name}: lock {one.get('lock')} ({one.get('lock_hash', '')[:12]}), FROM {one.get('base')}")
        if one.get("image_id"):
            lines.append(f"    image {one['image_id']} ({(one.get('image_bytes') or 0) / 1e6:.1f} MB)")
    for t in summary.get("index_tags", []):
        lines.append(f"index tag {t}")
    if summary.get("digest"):
        lines.append(f"pushed index {summary['pinned']}")
    lines.append(_time_line(summary))
    click.echo("\n".join(lines))


def _time_line(summary: dict) -> str:
    """Each stage's seconds and the total, as the summary's last line."""
    return (
        "time " + ", ".join(f"{k} {v}s" for k, v in summary["stages_s"].items()) + f"; total {summary.get('total_s')}s"
    )
