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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder import engine as engine_adapter
from builder.errors import BuildFailed
from builder.events import SILENT, Reporter
from builder.image import provenance  # the statement's subject is now the image (its ID under each tag)


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
    warnings: tuple[str, ...] = ()   # the checks' warnings (allowed base drift), from the build's output

    def to_dict(self) -> dict:
        return {
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


def missing_bases(base_refs: Iterable[str], engine) -> list[str]:
    """The base images (of those a context builds FROM) the engine does not hold locally."""
    return [ref for ref in base_refs if engine.inspect(ref) is None]


def missing_base_error(missing: Sequence[str]) -> BuildFailed:
    return BuildFailed(
        f"the base image {', '.join(missing)} is not in the engine's image store; "
        "build-image does not pull it implicitly.",
        hint=f"pull it first (`docker pull {missing[0]}`) or pass --pull to let the engine fetch it.",
    )


def build_step(line: str, seen: list[str]) -> str | None:
    """Pure: the step header a BuildKit plain-progress line starts (``#7 [stage-1 2/5] RUN ...``),
    once per step; None for every other line."""
    if line.startswith("#") and "] " in line and "[internal]" not in line:
        head = line.split(" ", 1)[1] if " " in line else line
        if not seen or seen[-1] != head:
            seen.append(head)
            return head
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


def build_image(context: Path, tags: Sequence[str], *, vllm: str, lock_hash: str, base_refs: Sequence[str],
                engine=None, pull: bool = False, bases_checked: bool = False,
                reporter: Reporter = SILENT) -> BuildResult:
    """Build ``context`` and tag it ``tags``.

    Without ``pull`` a base image that is not in the engine's store is BuildFailed (exit 9)
    instead of an implicit multi-GB download from a registry; ``bases_checked``: the caller
    has just asked the engine (the pipeline, deciding whether to stop after render).  Each BuildKit
    step's first line is a step event on ``reporter``."""
    engine = engine or engine_adapter.get_engine()
    if not bases_checked:
        engine.ping()
        if not pull:
            missing = missing_bases(base_refs, engine)
            if missing:
                raise missing_base_error(missing)
    t0 = time.monotonic()
    seen: list[str] = []

    def on_line(line: str) -> None:
        head = build_step(line, seen)
        if head is not None:
            reporter.step(" ".join(head.split())[:110])

    built = engine.build(Path(context), list(tags), network="none", on_line=on_line)

    provenance.record_subject(context, provenance.image_subject(list(tags), built.image_id), stage="build")
    info = engine.inspect(built.image_id)
    cached = sum(1 for ln in built.log.splitlines() if ln.rstrip().endswith("CACHED"))
    return BuildResult(image_id=built.image_id, tags=tuple(tags), context=Path(context), vllm=vllm,
                       lock_hash=lock_hash, size_bytes=info.size if info else None,
                       seconds=round(time.monotonic() - t0, 2), cached_steps=cached,
                       warnings=build_warnings(built.log) or (
                           drift_warnings(engine, built.image_id)
                           if info and info.labels.get("org.build-image.allow-base-drift") == "true" else ()))
