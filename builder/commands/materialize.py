"""``build-image base materialize``: the replayed base of a release as a local OCI image (the work is in
:mod:`builder.image.materialize`)."""

from __future__ import annotations

from pathlib import Path

import click

from builder.commands import platform_option, stderr_console
from builder.report import emit_json


@click.command("materialize")
@click.option("--vllm", "vllm", required=True, metavar="VERSION", help="The release whose base is materialized.")
@platform_option(several=False, help_extra=" The replay of that platform's image (its manifest and recipe).")
@click.option(
    "--tag",
    "tag",
    metavar="REF",
    help="The image's tag (default build-image.local/vllm/vllm-openai:v<vllm>-replay[-linux-arm64]).",
)
@click.option(
    "--from",
    "floor",
    metavar="REF",
    help="The LOCAL image the replay is installed on, holding the recipe's Python (default: the recipe's final "
    "base image); never pulled.",
)
@click.option(
    "--manifest",
    "manifest_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The replay's manifest (default: the shipped lockfiles/base/vllm-openai-v<vllm>.json).",
)
@click.option(
    "--recipes",
    "recipes",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Recipes file (default: lockfiles/base/recipes.toml).",
)
@click.option("--find-links", "find_links", multiple=True, metavar="DIR", help="Extra wheel folder, asked first.")
@click.option("--no-index", is_flag=True, help="Only the --find-links folders (the sdist and the wheels).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary on stdout.")
def command(vllm, platform, tag, floor, manifest_path, recipes, find_links, no_index, as_json):
    """Build the replay of vllm/vllm-openai:v<vllm> as a local image, usable as `--base REF`: the manifest's
    exact distributions (the wheels the replay's indexes serve at those versions, hash-checked) installed
    offline with the recipe's Python on a local floor image, with the release Dockerfile's environment,
    working directory and entrypoint.  Its labels say it is a replay (org.build-image.base.replay=true), of
    which manifest (sha256) and what it lacks; the pipeline's drift check says when it compared against it.

    Exit codes: 0 built; 2 bad input (a manifest that is not its recipe's replay, naming the fields; a floor
    image the engine does not hold or of another platform; a platform the engine here cannot build; an
    engine that is neither docker nor podman); 4 a distribution no asked index serves at its version;
    7 index unreachable or a download failed its sha256; 8 engine unreachable; 9 the build failed (its
    checks: the floor's Python, the installer, where each distribution landed)."""
    from builder import engine as engine_adapter
    from builder import platforms
    from builder.events import reporter_for
    from builder.image import materialize as mat
    from builder.image.replay_config import image_config
    from builder.resolve import index as ix
    from builder.resolve.manifest import parse_manifest
    from builder.resolve.reconstruct import derived_recipe
    from builder.spec import default_base_manifest
    from builder.validate import read_bounded_text
    from builder.values import ImageRef

    target = platforms.parse(platform) if platform else platforms.DEFAULT
    engine = engine_adapter.get_engine()  # an engine that is neither docker nor podman: exit 2 first
    mat.check_platform(engine, target)
    tag = str(ImageRef(tag, "--tag")) if tag else mat.default_tag(vllm, target)
    path = manifest_path or default_base_manifest(vllm, target)
    text = read_bounded_text(path, "base manifest")
    data = text.encode("utf-8")
    manifest = parse_manifest(text, str(path))
    recipe, files = derived_recipe(
        vllm, recipes=recipes, index=ix.for_request(list(find_links), no_index), platform=target
    )
    mat.check_manifest(manifest, recipe, str(path))
    floor = str(ImageRef(floor or recipe.final_base_image.value, "--from (the floor image)"))
    config = image_config(files, recipe)
    reporter = reporter_for(stderr_console()).scoped("materialize: ")
    built = mat.build_replay(
        engine,
        manifest,
        data,
        recipe,
        config,
        mat.sources(manifest, find_links, no_index, None),
        floor=floor,
        tag=tag,
        platform=target,
        reporter=reporter,
    )
    if as_json:
        emit_json(built.to_dict(), sort_keys=True)
        return
    click.echo(mat.render_summary(built))
