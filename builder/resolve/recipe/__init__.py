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
* Every RUN line of the chain is read (default-deny, :mod:`builder.resolve.recipe.harmless`): each
  command it runs is an install the interpreter understands (:func:`run_script` over the command tree of
  :mod:`builder.resolve.recipe.shell`: ``;``, ``&&``, ``||``, pipes, ``( )``, ``if``/``case`` on ``[ ]``
  tests, assignments, ``echo/cat > file``, ``uv pip freeze > f`` + ``grep``, the ``$(...)`` forms in
  ``shell.SOURCES``/``shell.FILTERS``), a command of the harmless table (``HARMLESS``, a rule and a reason per entry),
  or shell text read the same way (``sh -c``, the build context's scripts, heredocs); text the
  interpreter cannot parse is read lexically, where every command must be harmless.  Anything else is
  refused (:class:`builder.errors.BadInput` naming the file, line and construct), never guessed;
  ``--accept-undecided FILE:LINE`` replays such a line as nothing and records what it would have done.
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
