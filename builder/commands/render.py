"""``build-image render``: write a self-contained build context (Dockerfile, lock, wheels, patches)."""

from __future__ import annotations

from pathlib import Path

import click

from builder.commands import platform_option, stderr_console
from builder.errors import BadInput
from builder.report import emit_json
from builder.spec import load_spec

# What a command runs (its stage, the engine adapter, downloads, reports) is imported inside the command
# function, not here: `build-image --help` imports every command module to list it, and a stage
# (with its dependencies) loads only when its command runs.


_OPTIONS = [
    click.option("--vllm", "vllm", metavar="VERSION", help="vLLM version (default: spec, else 0.26.0)."),
    click.option(
        "--spec",
        "spec_file",
        metavar="FILE",
        type=click.Path(dir_okay=False),
        help="Spec file (default ./build-image.toml).",
    ),
    click.option(
        "--lock",
        "lock_file",
        metavar="FILE",
        help="Lock file (default: spec 'lock', else lockfiles/vllm-<v>/requirements.lock).",
    ),
    click.option(
        "--base", "base", metavar="MANIFEST", help="Base manifest (default: lockfiles/base/vllm-openai-v<v>.json)."
    ),
    click.option(
        "--series",
        "series",
        metavar="DIR",
        type=click.Path(file_okay=False, path_type=Path),
        help="Patch series directory (default: patches/vllm/<v>/).",
    ),
    click.option(
        "--no-patches",
        "no_patches",
        is_flag=True,
        help="Apply no patch series (the image carries vllm as the base has it).",
    ),
    click.option(
        "--wheel",
        "wheel",
        metavar="VLLM_WHEEL",
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        help="The vllm wheel the series is checked against (default: fetched from PyPI, cached).",
    ),
    click.option(
        "-o",
        "--output",
        "out",
        metavar="DIR",
        type=click.Path(file_okay=False, path_type=Path),
        help="Context directory (default: build/vllm-<v>); replaced atomically.",
    ),
    click.option(
        "--tag", "repo", metavar="REPO", help="Image repository the tags are made for (default: spec 'repo')."
    ),
    click.option("--kuberay", is_flag=True, help="Also write rayservice.yaml / raycluster.yaml into the context."),
    click.option(
        "--image",
        "kuberay_image",
        metavar="REF",
        help="Image the KubeRay manifests run (default: the content-addressed tag).",
    ),
    click.option(
        "--allow-tag", is_flag=True, help="KubeRay manifests may reference the image by tag instead of digest."
    ),
    click.option(
        "--model", "model", metavar="PATH", help="KubeRay: the model the Serve app loads (default: spec serving.model)."
    ),
    click.option(
        "--allow-base-drift",
        is_flag=True,
        help="The image build lists base drift (against the manifest) as a warning instead of failing.",
    ),
    click.option("--json", "as_json", is_flag=True, help="Machine-readable result on stdout."),
    platform_option(
        help_extra=" Several: one context per platform in DIR/<os>-<arch>/, each on its platform's "
        "base manifest and lock, and DIR/platforms.json (the build plan: `--json`)."
    ),
]


def _with_options(f):
    """render's options, in the order --help lists them."""
    for opt in reversed(_OPTIONS):
        f = opt(f)
    return f


@click.command("render")
@_with_options
def command(
    vllm,
    spec_file,
    lock_file,
    base,
    series,
    no_patches,
    wheel,
    out,
    repo,
    kuberay,
    kuberay_image,
    allow_tag,
    model,
    allow_base_drift,
    as_json,
    platform=None,
):
    """Write a self-contained build context: Dockerfile, requirements.lock, wheels/, patches/, app/.

    Exit codes: 0 written, 2 bad input (an unknown platform, a platform without a base manifest or
    lock here, a base of another platform than its lock, a --lock of another platform, a context holding
    what render did not write, a tampered platforms.json), 6 patch series does not apply, 7
    download/sha256 failure.  Nothing is written on failure (the context is built in a temp dir and
    renamed into place).
    """
    from builder import platforms

    if series and no_patches:
        raise BadInput("--series and --no-patches contradict each other.")
    check_kuberay_flags(kuberay, kuberay_image, allow_tag)
    targets = platforms.parse_list(platform)
    spec = load_spec(spec_file).with_flags(vllm=vllm, repo=repo, model=model)
    if len(targets) > 1:
        _render_platforms(
            spec, targets, lock_file, base, series, no_patches, wheel, out, kuberay, allow_base_drift, as_json
        )
        return
    _render_one(
        spec.for_platforms(targets)[0],
        lock_file,
        base,
        series,
        no_patches,
        wheel,
        out,
        kuberay,
        kuberay_image,
        allow_tag,
        allow_base_drift,
        as_json,
    )


def _render_one(
    spec, lock_file, base, series, no_patches, wheel, out, kuberay, kuberay_image, allow_tag, allow_base_drift, as_json
) -> None:
    """``render`` for one platform: its context (with the KubeRay manifests under ``--kuberay``) in DIR."""
    from builder.events import RichReporter
    from builder.image.render import build_hint, default_out_dir, render_context, render_inputs
    from builder.serving.kuberay import write_manifests

    inputs = render_inputs(spec, lock_file=lock_file, base=base)
    manifest, lock = inputs.manifest, inputs.lock
    out = out or default_out_dir(spec.vllm)
    console = stderr_console()

    def kuberay_manifests(tmp: Path, tags: list[str]) -> list[Path]:  # into the context before its rename
        return write_manifests(
            tmp, lock=lock, spec=spec, image=kuberay_image or tags[0], allow_tag=allow_tag, base=manifest
        )

    with console.status("render") as status:
        result = render_context(
            vllm=spec.vllm,
            base=manifest,
            lock=lock,
            lock_text=inputs.lock_text,
            out_dir=out,
            series_dir=series,
            vllm_wheel=wheel,
            repo=spec.repo,
            no_patches=no_patches,
            reporter=RichReporter(console, status=status).scoped("render: "),
            extra=kuberay_manifests if kuberay else None,
            base_data=inputs.base_data,
            allow_base_drift=allow_base_drift,
        )
    doc = {
        "context": str(result.out_dir),
        "files": list(result.files),
        "tags": list(result.tags),
        "lock_hash": lock.lock_hash,
        "wheels": len(lock.entries),
        "patches": result.plan.patches,
        "patched_files": [p.relpath for p in result.plan.patched],
        "base": manifest.pinned_ref,
        "sbom": str(result.out_dir / "sbom.cdx.json"),
    }
    if as_json:
        emit_json(doc)
    else:
        click.echo(
            f"wrote {result.out_dir}: {len(lock.entries)} wheels, {len(result.plan.patched)} patched file(s) "
            f"from {len(result.plan.patches)} patch(es); FROM {manifest.pinned_ref}"
        )
        click.echo(f"build it: {build_hint(result.out_dir, spec.repo, result.tags, spec.platform)}")


def _render_platforms(
    spec, targets, lock_file, base, series, no_patches, wheel, out, kuberay, allow_base_drift, as_json
) -> None:
    """``render --platform A,B``: one context per platform and platforms.json (``--json``: the build plan)."""
    from builder.events import RichReporter
    from builder.image.platforms_render import build_plan, render_platforms
    from builder.image.render import default_out_dir

    given = [f for f, v in (("--lock", lock_file), ("--base", base), ("--kuberay", kuberay)) if v]
    if given:
        raise BadInput(
            f"{' and '.join(given)} name one platform's input or output, and {len(targets)} platforms "
            "were asked for: each platform renders from its own base manifest and lock.",
            hint="drop " + " and ".join(given) + ", or render one --platform at a time.",
        )
    out = out or default_out_dir(spec.vllm)
    console = stderr_console()
    with console.status("render") as status:
        ctx = render_platforms(
            spec,
            targets,
            out,
            series_dir=series,
            vllm_wheel=wheel,
            no_patches=no_patches,
            reporter=RichReporter(console, status=status).scoped("render: "),
            allow_base_drift=allow_base_drift,
        )
    doc = {"context": str(ctx.out_dir), **ctx.to_dict(), "build_plan": build_plan(ctx)}
    if as_json:
        emit_json(doc)
        return
    for c in ctx.platforms:
        click.echo(f"wrote {ctx.out_dir / c.context}: {c.platform.name} FROM {c.base_ref}, lock {c.lock_hash[:12]}")
    click.echo(f"index {ctx.index_tags[0]}: " + ", ".join(c.platform.name for c in ctx.platforms))
    click.echo("build it:\n  " + "\n  ".join(build_plan(ctx)))


def check_kuberay_flags(kuberay: bool, image: str | None, allow_tag: bool) -> None:
    """``--image`` and ``--allow-tag`` only shape the KubeRay manifests: without ``--kuberay`` they would be
    ignored silently, so they are bad input (exit 2) instead."""
    given = [f for f, v in (("--image", image), ("--allow-tag", allow_tag)) if v]
    if given and not kuberay:
        raise BadInput(
            f"{' and '.join(given)} only apply to the KubeRay manifests, and --kuberay was not given: "
            "nothing would use them.",
            hint="add --kuberay, or drop " + " and ".join(given) + ".",
        )
