"""``lockfiles/base/recipes.toml``: one generated table per release (pure)."""

from __future__ import annotations

from collections.abc import Mapping

from builder.errors import BadInput
from builder.resolve.recipe.model import Recipe
from builder.validate import load_toml

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
    values = {"final_base_image": r.final_base_image, "os": r.os, "glibc": r.glibc, "cuda": r.cuda,
              "python": r.python, "site_packages": r.site_packages, "pipeline_step": r.pipeline_step}
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


def render_recipes(tables: Mapping[str, dict]) -> str:
    """The whole recipes.toml text (pure): header, schema, one table per release in version order."""
    import tomli_w
    from packaging.version import Version

    doc = {"schema": RECIPES_SCHEMA, "release": {v: tables[v] for v in sorted(tables, key=Version)}}
    return RECIPES_HEADER + tomli_w.dumps(doc, multiline_strings=False)


def parse_recipes(text: str, path: str = "recipes.toml") -> dict[str, dict]:
    """The release tables of a recipes.toml (pure); a file of another schema is :class:`BadInput`."""
    doc = load_toml(text, f"recipes {path}")
    if doc.get("schema") != RECIPES_SCHEMA:
        raise BadInput(f"recipes {path}: 'schema' must be {RECIPES_SCHEMA!r}, got {doc.get('schema')!r}.",
                       hint="the file is generated: `build-image base recipe --vllm X --write` for each release.")
    rel = doc.get("release") or {}
    if not isinstance(rel, dict) or not all(isinstance(v, dict) for v in rel.values()):
        raise BadInput(f"recipes {path}: 'release' must be a table of release tables.")
    return rel
