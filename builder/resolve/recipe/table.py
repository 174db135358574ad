"""``lockfiles/base/recipes.toml``: one generated table per release (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from builder.errors import BadInput
from builder.platforms import DEFAULT, Platform, parse_python_platform
from builder.resolve.recipe.model import RELEASE_STEP, Recipe, release_step_label
from builder.util import atomic_write_text, output_lock, refuse_foreign, write_target
from builder.validate import load_toml, read_bounded_text
from builder.values import Version as VersionText

# --------------------------------------------------------------------------- recipes.toml
RECIPES_SCHEMA = "build-image/base-recipes/v2"
RECIPES_HEADER = """\
# GENERATED FILE: do not edit.  Written by `build-image base recipe --vllm X --write` (one release's
# table; builder/resolve/recipe.py) from the release's sdist on the index (vllm-X.tar.gz, sha256 below):
# its docker/Dockerfile (final stage of target vllm-openai and the stages it is built FROM), the release
# pipeline's step "Build release image - x86_64 - CUDA 13.0" (.buildkite/release-pipeline.yaml; its
# --build-arg values override the Dockerfile's ARG defaults) and requirements/*.txt.
# Each value's provenance is under `from` (file:line inside the sdist) and, where the value is derived
# rather than read verbatim, `rules`.  `steps` are the image's install steps in Dockerfile order, which
# `build-image base reconstruct --vllm X` replays.  A slow test re-derives every release from its sdist
# and requires equality with this file.
"""


def recipe_table(r: Recipe) -> dict:
    """The recipes.toml table of one release (pure; TOML-serialisable: no None)."""
    values = {
        "final_base_image": r.final_base_image,
        "os": r.os,
        "glibc": r.glibc,
        "cuda": r.cuda,
        "python": r.python,
        "site_packages": r.site_packages,
        "pipeline_step": r.pipeline_step,
    }
    lacks = {k: v for k, v in r.lacks().items() if v}
    return {
        "sdist": r.sdist.filename,
        "sdist_sha256": r.sdist.sha256,
        "image": r.image,
        "target": r.target,
        "platform": r.platform,
        **{k: d.value for k, d in values.items()},
        "from": {k: [str(w) for w in d.where] for k, d in values.items()},
        "rules": {k: d.rule for k, d in values.items() if d.rule},
        "stages": [s.value for s in r.stages],
        "build_args": {k: d.value for k, d in r.build_args},
        "build_args_from": {k: str(d.where[0]) for k, d in r.build_args},
        "steps": [s.to_json() for s in r.steps],
        "unversioned": r.unversioned_names(),
        "image_overrides": [d.value for d in r.image_overrides],
        "image_overrides_from": sorted({str(w) for d in r.image_overrides for w in d.where}),
        "lacks": lacks,
    }


def recipes_header(platform: Platform = DEFAULT) -> str:
    """The recipes file's header: :data:`RECIPES_HEADER` for linux/amd64, the same naming the platform's own
    pipeline step and ``--platform`` for another platform (pure)."""
    if platform.is_default:
        return RECIPES_HEADER
    return (
        RECIPES_HEADER.replace(RELEASE_STEP, release_step_label(platform))
        .replace("--vllm X --write", f"--vllm X --platform {platform.name} --write")
        .replace(
            "`build-image base reconstruct --vllm X`",
            f"`build-image base reconstruct --vllm X --platform {platform.name}`",
        )
    )


def render_recipes(tables: Mapping[str, dict], platform: Platform = DEFAULT) -> str:
    """The whole recipes file's text (pure): header, schema, one table per release in version order."""
    import tomli_w
    from packaging.version import Version

    doc = {"schema": RECIPES_SCHEMA, "release": {v: tables[v] for v in sorted(tables, key=Version)}}
    return recipes_header(platform) + tomli_w.dumps(doc, multiline_strings=False)


def parse_recipes(text: str, path: str = "recipes.toml") -> dict[str, dict]:
    """The release tables of a recipes.toml (pure); a file of another schema is :class:`BadInput`."""
    doc = load_toml(text, f"recipes {path}")
    if doc.get("schema") != RECIPES_SCHEMA:
        raise BadInput(
            f"recipes {path}: 'schema' must be {RECIPES_SCHEMA!r}, got {doc.get('schema')!r}.",
            hint="the file is generated: `build-image base recipe --vllm X --write` for each release.",
        )
    rel = doc.get("release") or {}
    if not isinstance(rel, dict) or not all(isinstance(v, dict) for v in rel.values()):
        raise BadInput(f"recipes {path}: 'release' must be a table of release tables.")
    for vllm, table in rel.items():
        _check_table(vllm, table, path)
    return rel


def _check_table(vllm: str, table: dict, path: str) -> None:
    """What a release table is read for before it is compared with its derivation (any other field that is
    not the derivation's only differs, exit 2): its name a release (sorted as a version), ``sdist_sha256`` the
    sdist's digest (the download is checked against it), ``sdist`` and ``platform`` text."""
    where = f"recipes {path}: release {vllm[:60]!r}"
    VersionText(vllm, f"recipes {path}: the release name")
    sha = table.get("sdist_sha256")
    if sha is not None and not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
        raise BadInput(f"{where}: 'sdist_sha256' must be 64 lowercase hex digits, got {sha!r:.80}.")
    for key in ("sdist", "platform"):
        if key in table and not isinstance(table[key], str):
            raise BadInput(f"{where}: '{key}' must be a string, got {table[key]!r:.80}.")


#: the first line of the recipes file (:data:`RECIPES_HEADER`): how a recipes file build-image wrote is known
RECIPES_MARKS = ("# GENERATED FILE: do not edit.  Written by `build-image base recipe",)


def check_recipes_output(path: Path, *, force: bool) -> None:
    """The output rule for a recipes file: a device node, FIFO or directory is refused, a symlink written
    through, and an existing file build-image did not write is not replaced without ``force``."""
    write_target(path)
    refuse_foreign(path, "recipes file", force=force, marks=RECIPES_MARKS)


def read_recipes_file(path: Path, platform: Platform) -> dict[str, dict]:
    """The release tables of ``platform``'s recipes file at ``path`` ({} when there is none, or it holds another
    schema), read through the bounded reader (a FIFO, a device or a file over the bound is exit 2 naming it);
    a table of another platform is refused (:func:`refuse_other_platform_tables`)."""
    if not (path.exists() or path.is_symlink()):
        return {}
    text = read_bounded_text(path, "recipes file")
    tables = parse_recipes(text, str(path)) if f'schema = "{RECIPES_SCHEMA}"' in text else {}
    refuse_other_platform_tables(tables, platform, path)
    return tables


def refuse_other_platform_tables(tables: Mapping[str, dict], platform: Platform, path: str | Path) -> None:
    """The rule for a recipes file: each platform has its own (``recipes.toml``, ``recipes-linux-arm64.toml``)
    and every table in it is of that platform — its ``platform`` (uv's ``aarch64-manylinux_2_39``) read by
    :func:`builder.platforms.parse_python_platform`.  A table of the other platform, or of none, is
    :class:`BadInput` (exit 2) naming both platforms: an arm64 table never lands in the amd64 file, nor is read
    as amd64's recipe."""
    for vllm, table in tables.items():
        have = parse_python_platform(table.get("platform"), where=f"recipes {path}: release {vllm!r} 'platform'")
        if have != platform:
            raise BadInput(
                f"recipes {path}: the table of vllm {vllm} is a {have.name} recipe ({table.get('platform')}), "
                f"but this is {platform.name}'s recipes file or run; one platform's recipes never stand in for "
                "or join the other's. Nothing was written.",
                hint=f"{platform.name}'s recipes live in lockfiles/base/recipes{platform.file_suffix()}.toml "
                "(or name another --recipes FILE).",
            )


def write_recipe_table(
    path: Path,
    vllm: str,
    table: dict,
    *,
    force: bool = False,
    seed: dict[str, dict] | None = None,
    platform: Platform = DEFAULT,
) -> Path:
    """Put ``vllm``'s table into the recipes file: read, merged and written under the file's output lock, so
    two runs for different releases both land (neither's table is lost); atomically, through a symlink.  A
    file not there yet starts from ``seed`` (the shipped tables, for a pull request's folder)."""
    with output_lock(path):
        check_recipes_output(path, force=force)
        exists = path.exists() or path.is_symlink()
        tables = {**(read_recipes_file(path, platform) if exists else (seed or {})), vllm: table}
        refuse_other_platform_tables(tables, platform, path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, render_recipes(tables, platform))
    return path
