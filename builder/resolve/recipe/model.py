"""The recipe's data: provenance (:class:`Where`, :class:`Derived`), a release's build files, its
install steps and the recipe itself (pure data; the reading lives in the sibling modules)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from builder.errors import BadInput
from builder.platforms import DEFAULT, Platform

TARGET = "vllm-openai"
DOCKERFILE = "docker/Dockerfile"
PIPELINE = ".buildkite/release-pipeline.yaml"


def release_step_label(platform: Platform = DEFAULT) -> str:
    """The release pipeline's step that builds the published image for ``platform`` (pure):
    ``Build release image - x86_64 - CUDA 13.0`` / ``Build release image - aarch64 - CUDA 13.0``."""
    return f"Build release image - {platform.machine} - CUDA 13.0"


RELEASE_STEP = release_step_label(DEFAULT)
ARCH = DEFAULT.machine
TARGETPLATFORM = DEFAULT.name


# --------------------------------------------------------------------------- provenance
@dataclass(frozen=True)
class Where:
    """A file inside the sdist and a 1-based line."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Derived:
    """One value of the recipe and where it came from (``rule``: how it was derived, when not read verbatim)."""

    value: str
    where: tuple[Where, ...]
    rule: str = ""

    def to_json(self) -> dict:
        d = {"value": self.value, "from": [str(w) for w in self.where]}
        if self.rule:
            d["rule"] = self.rule
        return d


@dataclass(frozen=True)
class SdistRef:
    filename: str
    sha256: str
    # where the files came from beyond the file itself (a checkout: its commit, whether the work tree matches,
    # how the version was decided), as (key, text) pairs
    detail: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict:
        return {"filename": self.filename, "sha256": self.sha256, **dict(self.detail)}


@dataclass(frozen=True)
class BuildFiles:
    """The build files of one release: text by path inside the sdist (top folder stripped).

    ``files`` holds what every recipe reads (the Dockerfile, the release pipeline, requirements); ``reader``
    brings any other file of the build context on demand (a script a RUN line calls), confined to the sdist
    or the checkout's commit by :mod:`builder.resolve.sdist` (None: the file is not there; BadInput: a path
    leaving the context, a link, a file over the bound).  ``wheel``: the published vllm release whose wheel
    stands in for the files' own (a checkout past its tag), ``""`` for ``vllm`` itself."""

    vllm: str
    sdist: SdistRef
    files: Mapping[str, str]
    wheel: str = ""
    reader: Callable[[str], str | None] | None = field(default=None, compare=False, repr=False)

    def text(self, path: str, what: str) -> str:
        if path in self.files:
            return self.files[path]
        found = self.reader(path) if self.reader is not None else None
        if found is None:
            raise BadInput(f"{self.sdist.filename} has no {path} ({what}).")
        return found


# --------------------------------------------------------------------------- recipe
@dataclass(frozen=True)
class Step:
    """One install (or uninstall) the image runs, in Dockerfile order.

    ``replay``: ``index`` (resolved from the Python index), ``off-index`` (a wheel from another
    index or a URL: name and version known where the files say them, files unavailable),
    ``source-build`` (a wheel built from source inside the image build), ``uninstall``,
    ``undecided`` (a RUN line the reader cannot decide, accepted by the user: replayed as nothing).
    """

    n: int
    stage: str
    where: Where
    replay: str
    installer: str = "uv"  # uv | pip
    requirements: tuple[str, ...] = ()
    requirement_files: tuple[str, ...] = ()
    constraint_files: tuple[str, ...] = ()
    constrain_installed: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    override_where: tuple[Where, ...] = ()
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    when_installed: str | None = None
    fallback: str | None = None
    fallback_steps: tuple[Step, ...] = ()  # what the fallback installs, where the reader could decide it
    names: tuple[str, ...] = ()  # off-index / source-build: the distributions it installs
    note: str = ""
    file_indexes: tuple[str, ...] = ()  # index options inside the requirement files: "URL (file:line)"
    index_strategy: str | None = None  # uv's --index-strategy of the step's line (or the image's ENV)
    # sed -i edits of a requirement file before the step reads it: (file in the source, script, -E, "file:line")
    requirement_edits: tuple[tuple[str, str, bool, str], ...] = ()

    def to_json(self) -> dict:
        d: dict = {
            "n": self.n,
            "stage": self.stage,
            "from": str(self.where),
            "replay": self.replay,
            "installer": self.installer,
        }
        for k in (
            "requirements",
            "requirement_files",
            "constraint_files",
            "constrain_installed",
            "overrides",
            "extra_index_urls",
            "file_indexes",
            "flags",
            "names",
        ):
            v = getattr(self, k)
            if v:
                d[k] = list(v)
        if self.override_where:
            d["overrides_from"] = [str(w) for w in self.override_where]
        if self.requirement_edits:
            d["requirement_edits"] = [
                {"file": f, "sed": s, "extended": e, "from": w} for f, s, e, w in self.requirement_edits
            ]
        for k in ("index_url", "index_strategy", "when_installed", "fallback", "note"):
            v = getattr(self, k)
            if v:
                d[k] = v
        if self.fallback_steps:
            d["fallback_steps"] = [
                {k: v for k, v in s.to_json().items() if k not in ("n", "stage", "from")} for s in self.fallback_steps
            ]
        return d


@dataclass(frozen=True)
class Recipe:
    vllm: str
    sdist: SdistRef
    target: str
    pipeline_step: Derived
    stages: tuple[Derived, ...]  # "name FROM base" from the root of the chain to the target
    build_args: tuple[tuple[str, Derived], ...]
    final_base_image: Derived
    os: Derived
    glibc: Derived
    cuda: Derived
    python: Derived
    site_packages: Derived
    steps: tuple[Step, ...]
    os_packages: tuple[Derived, ...] = ()
    off_index_fetches: tuple[Derived, ...] = ()
    # the UV_OVERRIDE pins the published image keeps in its environment: every later `uv pip install` in it
    # (an overlay too) resolves with them
    image_overrides: tuple[Derived, ...] = ()
    target_platform: Platform = DEFAULT  # the image platform the pipeline step builds (linux/amd64, linux/arm64)
    # how the release publishes the step's image (publish.Published: the tag, and the lines from it to the step)
    published: Any = None
    wheel: str = ""  # the published vllm release whose wheel stands in for the build's own ("": vllm's)

    @property
    def image(self) -> str:
        tag = self.published.tag if self.published is not None else f"vllm/vllm-openai:v{self.vllm}"
        return tag.replace("+", "-")  # a tag holds no '+' (a development version's local part)

    @property
    def wheel_version(self) -> str:
        """The vllm release whose wheel a replay installs (and whose upload time bounds it)."""
        return self.wheel or self.vllm

    @property
    def platform(self) -> str:
        """uv's ``--python-platform`` of the image: ``aarch64-manylinux_2_39``."""
        return self.target_platform.uv_platform(self.glibc.value)

    @property
    def arch(self) -> str:
        return self.target_platform.machine

    def lacks(self) -> dict[str, list[str]]:
        """What a replay from the Python index knowingly cannot hold (pure)."""
        off = [
            f"{', '.join(s.names) or '?'} ({s.note}; {self.sdist.filename} {s.where})"
            for s in self.steps
            if s.replay == "off-index"
        ]
        src = [f"{', '.join(s.names) or '?'} ({s.note}; {s.where})" for s in self.steps if s.replay == "source-build"]
        idx = sorted(
            {
                u
                for s in self.steps
                if s.replay == "index"
                for u in (
                    *s.extra_index_urls,
                    *([s.index_url] if s.index_url else []),
                    *(x.split(" (")[0] for x in s.file_indexes),
                )
            }
        )
        return {
            "off_index": off + [f"{d.value} ({', '.join(map(str, d.where))})" for d in self.off_index_fetches],
            "source_builds": src,
            "other_indexes": [
                f"{u}: named by the image's steps; a replay asks it where it answers, else the "
                "Python index stands in for it (a file only it serves is then absent, or replaced by "
                "the Python index's build of the same version)"
                for u in idx
            ],
            "os_packages": [d.value for d in self.os_packages],
        }

    def unversioned_names(self) -> dict[str, str]:
        """Distributions the image holds that a replay from the index cannot version: name → reason (pure)."""
        out: dict[str, str] = {}
        for s in self.steps:
            if s.replay in ("off-index", "source-build"):
                for n in s.names:
                    out[n] = f"{s.replay}: {s.note} ({self.sdist.filename} {s.where})"
        return out

    def to_json(self) -> dict:
        return {
            "vllm": self.vllm,
            "image": self.image,
            "sdist": self.sdist.to_json(),
            **({"vllm_wheel": self.wheel} if self.wheel and self.wheel != self.vllm else {}),
            "target": self.target,
            "pipeline_step": self.pipeline_step.to_json(),
            "stages": [s.to_json() for s in self.stages],
            "build_args": {k: v.to_json() for k, v in self.build_args},
            "final_base_image": self.final_base_image.to_json(),
            "os": self.os.to_json(),
            "glibc": self.glibc.to_json(),
            "cuda": self.cuda.to_json(),
            "python": self.python.to_json(),
            "site_packages": self.site_packages.to_json(),
            "platform": self.platform,
            "steps": [s.to_json() for s in self.steps],
            "os_packages": [d.to_json() for d in self.os_packages],
            "off_index_fetches": [d.to_json() for d in self.off_index_fetches],
            "image_overrides": [d.to_json() for d in self.image_overrides],
            "lacks": self.lacks(),
            **({} if self.target_platform.is_default else {"target_platform": self.target_platform.name}),
            **({"published": self.published.to_json()} if self.published is not None else {}),
        }
