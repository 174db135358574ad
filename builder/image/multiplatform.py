"""A build context for several platforms: one complete single-platform context per platform, each on its own
base and lock, and ``platforms.json`` saying which folder builds which platform.

Layout::

    platforms.json          {"schema": "build-image/platforms/v1", "vllm": …, "index_tags": […],
                             "platforms": [{"platform": "linux/amd64", "context": "linux-amd64", "base_ref": …,
                                            "base_digest": …, "lock_sha256": …, "lock_hash": …, "tags": […]}, …]}
    linux-amd64/            the linux/amd64 context (Dockerfile FROM its base, its lock, its wheels, checks, …)
    linux-arm64/            the linux/arm64 context

A context for the default platform alone keeps the single-platform layout (no ``platforms.json``).  The
index (the one image both platforms pull) is tagged from the platforms' lock hashes together
(:func:`index_hash`), so it moves when either platform's lock moves.

The whole folder is written as one: every platform's context is rendered into a temp folder beside the
target, ``platforms.json`` last, then the temp folder is renamed into place — a platform that fails leaves
the previous context (or nothing), never half of a multi-platform one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from builder import platforms as P
from builder.errors import BadInput
from builder.events import SILENT, Reporter
from builder.image.naming import default_repo, image_tags
from builder.image.render import check_replaceable, from_ref, render_context, render_inputs
from builder.platforms import Platform
from builder.report import render_json
from builder.util import file_digest, output_lock
from builder.validate import load_json, read_bounded_text

PLATFORMS_FILE = "platforms.json"
SCHEMA = "build-image/platforms/v1"


@dataclass(frozen=True)
class PlatformContext:
    """One platform's context inside a multi-platform context."""

    platform: Platform
    context: str                 # the folder, relative to the multi-platform context (its slug)
    base_ref: str                # what its Dockerfile builds FROM
    base_digest: str | None      # the base image's digest where the manifest knows it
    lock_sha256: str             # sha256 of its requirements.lock
    lock_hash: str               # the lock's hash (its content-addressed tag)
    tags: tuple[str, ...]        # the platform image's own tag (content-addressed by its lock; the floating tag
    #                              vllmX is the index's alone)

    def to_dict(self) -> dict:
        return {"platform": self.platform.name, "context": self.context, "base_ref": self.base_ref,
                "base_digest": self.base_digest, "lock_sha256": self.lock_sha256, "lock_hash": self.lock_hash,
                "tags": list(self.tags)}


@dataclass(frozen=True)
class PlatformsContext:
    """A multi-platform context: its folder, the release, the index's tags and each platform's context."""

    out_dir: Path
    vllm: str
    index_tags: tuple[str, ...]
    platforms: tuple[PlatformContext, ...]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "vllm": self.vllm, "index_tags": list(self.index_tags),
                "platforms": [p.to_dict() for p in self.platforms]}

    def folder(self, platform: Platform) -> Path:
        return self.out_dir / next(p.context for p in self.platforms if p.platform == platform)

    def select(self, wanted: Sequence[Platform] | None) -> tuple[PlatformContext, ...]:
        """The platforms ``wanted`` (all when None); one the context does not hold is exit 2 naming what it holds."""
        if not wanted:
            return self.platforms
        have = {p.platform: p for p in self.platforms}
        missing = [w.name for w in wanted if w not in have]
        if missing:
            raise BadInput(f"{self.out_dir} holds no context for {', '.join(missing)}; it holds "
                           f"{', '.join(p.platform.name for p in self.platforms)}.",
                           hint=f"render it: build-image render --platform {P.joined(list(wanted))}.")
        return tuple(have[w] for w in wanted)


def index_hash(lock_hashes: Sequence[tuple[Platform, str]]) -> str:
    """The hash the index is tagged with: sha256 over each platform's name and lock hash, in platform order
    (pure; 64 hex digits, of which the tag takes a prefix as a single platform's lock hash does)."""
    text = "".join(f"{p.name} {h}\n" for p, h in sorted(lock_hashes))
    return hashlib.sha256(text.encode()).hexdigest()


def platforms_plan(vllm: str, repo: str, contexts: Sequence[PlatformContext]) -> dict:
    """The document ``platforms.json`` holds (pure)."""
    tags = image_tags(repo, vllm, index_hash([(c.platform, c.lock_hash) for c in contexts]))
    return {"schema": SCHEMA, "vllm": vllm, "index_tags": list(tags), "platforms": [c.to_dict() for c in contexts]}


def write_platforms_context(out: Path, vllm: str, repo: str, targets: Sequence[Platform],
                            render_one: Callable[[Platform, Path], PlatformContext],
                            check_replaceable: Callable[[Path], None]) -> PlatformsContext:
    """Render each platform's context with ``render_one(platform, folder)`` into a temp folder beside ``out``,
    write ``platforms.json``, and rename the whole into place (see the module doc).  ``check_replaceable(out)``
    refuses an ``out`` that is not a context build-image rendered (nothing is changed then)."""
    out = Path(out)
    with output_lock(out):
        if out.is_dir() and (out / PLATFORMS_FILE).is_file():
            read_platforms(out)  # an earlier multi-platform context: replaceable when it is one we wrote
            for entry in out.iterdir():
                if entry.name != PLATFORMS_FILE and entry.is_dir():
                    check_replaceable(entry)
                elif entry.name != PLATFORMS_FILE:
                    raise BadInput(f"-o {out}: the context holds {entry.name}, which render did not write; render "
                                   "replaces a context as a whole, so it refuses rather than delete it.")
        else:
            check_replaceable(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        old = None
        try:
            contexts = [render_one(p, tmp / p.slug) for p in targets]
            doc = platforms_plan(vllm, repo, contexts)
            (tmp / PLATFORMS_FILE).write_text(render_json(doc), encoding="utf-8")
            os.chmod(tmp, 0o755)
            if out.exists():
                old = out.parent / f".{out.name}.old-{os.getpid()}"
                os.replace(out, old)
            os.replace(tmp, out)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if old is not None and old.exists() and not out.exists():
                os.replace(old, out)
            raise
    return PlatformsContext(out_dir=out, vllm=vllm, index_tags=tuple(doc["index_tags"]),
                            platforms=tuple(contexts))


def read_platforms(ctx: Path) -> PlatformsContext | None:
    """The multi-platform context at ``ctx`` (None for a single-platform one), each platform's lock checked
    against the sha256 ``platforms.json`` records; a malformed file is exit 2 naming it."""
    path = Path(ctx) / PLATFORMS_FILE
    if not path.is_file():
        return None
    doc = load_json(read_bounded_text(path, "platforms file"), str(path))
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("platforms"), list):
        raise BadInput(f"{path}: not a build-image platforms file (schema {SCHEMA!r} with a 'platforms' list).")
    out = []
    for i, e in enumerate(doc["platforms"]):
        where = f"{path}: platforms[{i}]"
        if not isinstance(e, dict):
            raise BadInput(f"{where} is not an object.")
        platform = P.parse(str(e.get("platform")), where=f"{where}.platform")
        folder = str(e.get("context") or "")
        if folder != platform.slug:
            raise BadInput(f"{where}.context must be {platform.slug!r}, got {folder!r:.60}.")
        lock = Path(ctx) / folder / "requirements.lock"
        if not lock.is_file() or file_digest(lock) != e.get("lock_sha256"):
            raise BadInput(f"{where}: {lock} is missing or not the lock platforms.json records (sha256 "
                           f"{e.get('lock_sha256')!r:.80}); render the context again.")
        out.append(PlatformContext(platform=platform, context=folder, base_ref=str(e.get("base_ref") or ""),
                                   base_digest=e.get("base_digest"), lock_sha256=str(e["lock_sha256"]),
                                   lock_hash=str(e.get("lock_hash") or ""),
                                   tags=tuple(str(t) for t in e.get("tags") or ())))
    if not out:
        raise BadInput(f"{path}: lists no platform.")
    return PlatformsContext(out_dir=Path(ctx), vllm=str(doc.get("vllm") or "-"),
                            index_tags=tuple(str(t) for t in doc.get("index_tags") or ()), platforms=tuple(out))


def render_platforms(spec, targets: Sequence[Platform], out: Path, *, series=None, series_dir: Path | None = None,
                     vllm_wheel: Path | None = None, no_patches: bool = False, reporter: Reporter = SILENT,
                     allow_base_drift: bool = False, locked: dict | None = None) -> PlatformsContext:
    """Render one context per platform into ``out`` (see the module doc): each on its platform's base manifest
    and lock (``locked``: the pipeline's :class:`builder.resolve.lockstage.Locked` per platform; else the
    spec's, read once each), all patched by the one series (pure-Python files: the same on every platform;
    the image build checks each file's original sha256 in that platform's base before patching it)."""

    def one(platform: Platform, folder: Path) -> PlatformContext:
        sp = replace(spec, platform=platform)
        inputs = render_inputs(sp, locked=(locked or {}).get(platform))
        res = render_context(vllm=sp.vllm, base=inputs.manifest, lock=inputs.lock, lock_text=inputs.lock_text,
                             out_dir=folder, series=series, series_dir=series_dir, vllm_wheel=vllm_wheel,
                             repo=sp.repo, no_patches=no_patches, reporter=reporter.scoped(f"{platform.name}: "),
                             base_data=inputs.base_data, allow_base_drift=allow_base_drift)
        return PlatformContext(platform=platform, context=platform.slug, base_ref=from_ref(inputs.manifest),
                               base_digest=inputs.manifest.image_digest,
                               lock_sha256=file_digest(folder / "requirements.lock"),
                               lock_hash=inputs.lock.lock_hash, tags=tuple(res.tags[:1]))

    return write_platforms_context(out, spec.vllm, spec.repo or default_repo(), targets, one, check_replaceable)


def build_plan(ctx: PlatformsContext) -> list[str]:
    """What building and pushing the context does, one copy-pasteable line per step (pure)."""
    import shlex

    q = shlex.quote
    lines = [f"DOCKER_BUILDKIT=1 docker build --platform {c.platform.name} --network=none "
             f"-t {q(c.tags[0] if c.tags else c.platform.slug)} {q(str(ctx.out_dir / c.context))}"
             for c in ctx.platforms]
    lines.append("push each platform's image, then the OCI image index "
                 f"{ctx.index_tags[0] if ctx.index_tags else '-'} listing "
                 + ", ".join(c.platform.name for c in ctx.platforms)
                 + f" (build-image build {q(str(ctx.out_dir))} && build-image push {q(str(ctx.out_dir))})")
    return lines
