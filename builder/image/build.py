"""The build stage: a rendered context -> an image in the engine's store, tagged.

:func:`build_image` takes what render returned (context directory, tags, the images
the Dockerfile builds FROM), checks the engine holds the base (it never pulls one
implicitly), builds with BuildKit and ``--network=none`` and returns a frozen
:class:`BuildResult`.  ``build-image build`` reads a context from disk first
(:func:`builder.image.render.read_context`, which verifies every file's sha256); the
pipeline hands over its :class:`builder.image.render.RenderResult` instead.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder import engine as engine_adapter
from builder.engine import ImageInfo
from builder.errors import BadInput, BuildFailed
from builder.events import SILENT, Reporter
from builder.image import provenance  # the statement's subject is now the image (its ID under each tag)
from builder.platforms import Platform


@dataclass(frozen=True)
class BuildResult:
    """The build stage's result: the image the engine built and the tags it carries."""

    image_id: str
    tags: tuple[str, ...]
    context: Path
    vllm: str
    lock_hash: str
    size_bytes: int | None
    seconds: float
    cached_steps: int
    warnings: tuple[str, ...] = ()  # the checks' warnings (allowed base drift), from the build's output
    platform: Platform | None = None  # what it was built for (--platform); None: the engine's own

    def to_dict(self) -> dict:
        doc = {"platform": self.platform.name} if self.platform is not None else {}
        return doc | {
            "image_id": self.image_id,
            "tags": list(self.tags),
            "vllm": self.vllm,
            "lock_hash": self.lock_hash,
            "size_bytes": self.size_bytes,
            "seconds": self.seconds,
            "cached_steps": self.cached_steps,
            "warnings": list(self.warnings),
            "context": str(self.context),
        }


def inspect_bases(base_refs: Iterable[str], engine) -> dict[str, ImageInfo | None]:
    """Each base image (of those a context builds FROM) as the engine holds it, None where it holds none:
    asked once, and handed to :func:`missing_bases` and :func:`base_platform_mismatch`."""
    return {ref: engine.inspect(ref) for ref in base_refs}


def missing_bases(
    base_refs: Iterable[str], engine, inspected: Mapping[str, ImageInfo | None] | None = None
) -> list[str]:
    """The base images (of those a context builds FROM) the engine does not hold locally."""
    held = inspected if inspected is not None else inspect_bases(base_refs, engine)
    return [ref for ref in base_refs if held.get(ref) is None]


def missing_base_error(missing: Sequence[str]) -> BuildFailed:
    return BuildFailed(
        f"the base image {', '.join(missing)} is not in the engine's image store; "
        "build-image does not pull it implicitly.",
        hint=f"pull it first (`docker pull {missing[0]}`) or pass --pull to let the engine fetch it.",
    )


def base_platform_mismatch(
    base_refs: Iterable[str],
    want: Platform,
    engine,
    what: str = "the lock was made",
    inspected: Mapping[str, ImageInfo | None] | None = None,
) -> BadInput | None:
    """The refusal when a base the engine holds is of another platform than the lock's: building on it
    would put ``want``'s wheels on another machine's floor (the engine uses whatever image the ref names
    locally: a single-arch base, or the variant of a manifest list the builder's platform pulled).
    None when every base the engine holds (and says a platform for) is ``want``'s.  ``inspected``: what
    the caller has just asked the engine of these refs (:func:`inspect_bases`), not asked again."""
    for ref in base_refs:
        info = inspected[ref] if inspected is not None and ref in inspected else engine.inspect(ref)
        if info is None or not info.architecture or info.platform == want:
            continue
        have = info.platform_name
        other = f" (--platform {have})" if info.platform is not None else ""
        return BadInput(
            f"the base image {ref} the engine holds is {have}, but {what} for {want.name}: "
            f"building it would put {want.name} wheels on a {have} floor.",
            hint=f"hold the {want.name} image under {ref}: pull it by its {want.name} manifest digest "
            f"(`docker pull --platform {want.name} {ref.split('@')[0]}`, or `docker pull REPO@sha256:<the "
            f"{want.name} manifest's digest>` and `docker tag` it as {ref.split('@')[0]}); or lock and render "
            f"for {have}{other}.",
        )
    return None


WARNING_MARK = "build-image warning: "


def build_warnings(log: str) -> tuple[str, ...]:
    """Pure: the lines the Dockerfile's checks printed as warnings (``build-image warning: ...``) in a
    BuildKit plain-progress log, in order, each once (a cached checks stage prints none)."""
    out: list[str] = []
    for line in log.splitlines():
        _, mark, rest = line.partition(WARNING_MARK)
        if mark and rest.rstrip() not in out:
            out.append(rest.rstrip())
    return tuple(out)


DRIFT_RECORD = "/usr/share/build-image/base-drift.json"  # in the image: the checks stage's drift report


def drift_warnings(engine, image_id: str) -> tuple[str, ...]:
    """The allowed base drift an image records (its checks stage ran earlier and is cached now,
    so the build's output does not repeat it): the report lines of :data:`DRIFT_RECORD`."""
    proc = engine.run(image_id, ["cat", DRIFT_RECORD], timeout=120)
    try:
        return tuple(json.loads(proc.stdout).get("report") or ()) if proc.returncode == 0 else ()
    except ValueError:
        return ()


def build_image(
    context: Path,
    tags: Sequence[str],
    *,
    vllm: str,
    lock_hash: str,
    base_refs: Sequence[str],
    engine=None,
    pull: bool = False,
    bases_checked: bool = False,
    reporter: Reporter = SILENT,
    platform: Platform | None = None,
    inspected: Mapping[str, ImageInfo | None] | None = None,
) -> BuildResult:
    """Build ``context`` and tag it ``tags``.

    Without ``pull`` a base image that is not in the engine's store is BuildFailed (exit 9)
    instead of an implicit multi-GB download from a registry; ``bases_checked``: the caller
    has just asked the engine (the pipeline, deciding whether to stop after render; ``inspected``: what it
    was told, :func:`inspect_bases`, so the bases are not inspected again).  Each BuildKit
    step's first line is a step event on ``reporter``.

    ``platform``: the lock's platform (:func:`builder.image.naming.lock_platform`): the build runs with
    ``--platform`` and a base the engine holds for another platform is refused before building (exit 2)."""
    engine = engine or engine_adapter.get_engine()
    if not bases_checked:
        engine.ping()
        if not pull:
            missing = missing_bases(base_refs, engine)
            if missing:
                raise missing_base_error(missing)
    if platform is not None:
        refused = base_platform_mismatch(base_refs, platform, engine, inspected=inspected)
        if refused is not None:
            raise refused
    t0 = time.monotonic()
    extra = {"platform": platform} if platform is not None else {}
    built = engine.build(Path(context), list(tags), network="none", reporter=reporter, **extra)

    provenance.record_subject(context, provenance.image_subject(list(tags), built.image_id), stage="build")
    info = engine.inspect(built.image_id)
    cached = sum(1 for ln in built.log.splitlines() if ln.rstrip().endswith("CACHED"))
    return BuildResult(
        image_id=built.image_id,
        tags=tuple(tags),
        context=Path(context),
        vllm=vllm,
        lock_hash=lock_hash,
        size_bytes=info.size if info else None,
        seconds=round(time.monotonic() - t0, 2),
        cached_steps=cached,
        platform=platform,
        warnings=build_warnings(built.log)
        or (
            drift_warnings(engine, built.image_id)
            if info and info.labels.get("org.build-image.allow-base-drift") == "true"
            else ()
        ),
    )
