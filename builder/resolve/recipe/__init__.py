"""A release's base recipe, derived from its own build files (the sdist's docker/Dockerfile,
release pipeline and requirements): what the published ``vllm/vllm-openai:vX`` image is built
from, and every install step it runs, each value with the file and line it came from.

Pure: :func:`derive` takes the files' text (a :class:`BuildFiles`) and returns a :class:`Recipe`;
nothing here reads the network or the disk (``builder.resolve.sdist`` brings the files).

How the files are read:

* ``docker/Dockerfile`` is split into instructions by ``dockerfile-parse`` (containerbuildsystem;
  instruction, value, start and end line, comment lines inside a continued RUN dropped the way
  BuildKit drops them).  Its own ARG/ENV substitution is not used: build args from the pipeline
  override ARG defaults, which it does not model.
* The release pipeline (``.buildkite/release-pipeline.yaml``) and the ``.buildkite/`` scripts its
  steps call: their publish commands (tags, retags, multi-arch joins) decide which build step's
  image is published as ``vllm/vllm-openai:vX`` for each platform, or as ``vX-<variant>``
  (:mod:`builder.resolve.recipe.publish`); that step's ``docker build`` command gives the target
  and the ``--build-arg`` overrides, with the pipeline's ``env`` expanded.
* The final stage for the target and the stages it is built ``FROM`` are walked in order; ARG
  values are resolved as BuildKit does (global ARG defaults, build args win, a stage's bare
  ``ARG X`` brings the global value in).
* RUN lines that install, uninstall or freeze Python packages, or write the file an ``ENV
  UV_OVERRIDE`` names, are interpreted by a small shell reader (:func:`run_script`): ``;``,
  ``&&``, ``||`` (the left side; the right side is recorded as the fallback), ``( )``,
  ``if/elif/else/fi`` on ``[ ]`` tests, variable assignments, ``echo/touch > file``, ``uv pip
  freeze > f`` + ``grep -E '^(a|b)==' f > g`` (constraints from what is installed), and the
  ``$(...)`` forms in :data:`SUBSTITUTIONS`.  Anything else inside such a RUN that would decide an
  install is refused (:class:`builder.errors.BadInput` naming the file and line), never guessed.
"""

from builder.resolve.recipe.derive import (
    UBUNTU_GLIBC,
    UBUNTU_GLIBC_SOURCE,
    derive,
    requirement_file_options,
    requirement_lines,
)
from builder.resolve.recipe.dockerfile import parse_dockerfile, release_step, stage_chain
from builder.resolve.recipe.model import (
    ARCH,
    DOCKERFILE,
    PIPELINE,
    RELEASE_STEP,
    TARGET,
    TARGETPLATFORM,
    BuildFiles,
    Derived,
    Recipe,
    SdistRef,
    Step,
    Where,
)
from builder.resolve.recipe.shell import (
    INSTALLED,
    INSTALLED_RE,
    AndOr,
    Cmd,
    Group,
    If,
    Opaque,
    Pipe,
    Seq,
    Unknown,
    Var,
    expand,
    parse_script,
    substitute,
    tokenize,
)
from builder.resolve.recipe.table import (
    RECIPES_HEADER,
    RECIPES_MARKS,
    RECIPES_SCHEMA,
    check_recipes_output,
    parse_recipes,
    read_recipes_file,
    recipe_table,
    refuse_other_platform_tables,
    render_recipes,
    write_recipe_table,
)

__all__ = [
    "UBUNTU_GLIBC",
    "UBUNTU_GLIBC_SOURCE",
    "derive",
    "requirement_file_options",
    "requirement_lines",
    "parse_dockerfile",
    "release_step",
    "stage_chain",
    "ARCH",
    "DOCKERFILE",
    "PIPELINE",
    "RELEASE_STEP",
    "TARGET",
    "TARGETPLATFORM",
    "BuildFiles",
    "Derived",
    "Recipe",
    "SdistRef",
    "Step",
    "Where",
    "INSTALLED_RE",
    "INSTALLED",
    "AndOr",
    "Cmd",
    "Group",
    "If",
    "Opaque",
    "Pipe",
    "Seq",
    "Unknown",
    "Var",
    "expand",
    "parse_script",
    "substitute",
    "tokenize",
    "RECIPES_HEADER",
    "RECIPES_SCHEMA",
    "parse_recipes",
    "recipe_table",
    "render_recipes",
    "RECIPES_MARKS",
    "check_recipes_output",
    "read_recipes_file",
    "refuse_other_platform_tables",
    "write_recipe_table",
]
