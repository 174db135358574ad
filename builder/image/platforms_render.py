"""Render a build context for several platforms: one complete single-platform context per platform, each on its own
base and lock, and ``platforms.json`` saying which folder builds which platform.

Layout::

    platforms.json          {"schema": "build-image/platforms/v1", "vllm": …, "index_tags": […],
                             "platforms": [{"platform": "linux/amd64", "context": "linux-amd64", "base_ref": …,
                                            "base_digest": …, "lock_sha256": …, "lock_hash": …, "tags": […]}, …]}
    linux-amd64/            the linux/amd64 context (Dockerfile FROM its base, its lock, its wheels, checks, …)
    linux-arm64/            the linux/arm64 context

A context for the default platform alone keeps the single-platform layout (no ``platforms.json``).  The
index (the one image both platforms pull) is tagged from the platforms' lock hashes together
(:func:`builder.image.multiplatform.index_lock_hash`), so it moves when either platform's lock moves;
``builder.image.multiplatform`` reads, builds and pushes what this module writes.

The whole folder is written as one: every platform's context is rendered into a temp folder beside the
target, ``platforms.json`` last, then the temp folder is renamed into place — a platform that fails leaves
the previous context (or nothing), never half of a multi-platform one.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from builder.errors import BadInput
from builder.events import SILENT, Reporter
from builder.image.multiplatform import PLATFORMS_FILE, PLATFORMS_SCHEMA, index_lock_hash, read_platforms_file
from builder.image.naming import default_repo, image_tags
from builder.image.render import (
    check_replaceable,
    from_ref,
    render_context,
    render_inputs,
    swap_into_place,
    sweep_leftovers,
)
from builder.platforms import KNOWN, Platform
from builder.report import render_json
from builder.util import file_digest, output_lock, temp_path, through_link


@dataclass(frozen=True)
class RenderedPlatform:
    """One platform's context as render wrote it inside a multi-platform context."""

    platform: Platform
    context: str  # the folder, relative to the multi-platform context (its slug)
    base_ref: str  # what its Dockerfile builds FROM
    base_digest: str | None  # the base image's digest where the manifest knows it
    lock_sha256: str  # sha256 of its requirements.lock
    lock_hash: str  # the lock's hash (its content-addressed tag)
    tags: tuple[str, ...]  # the platform image's own tag (content-addressed by its lock; the floating tag
    #                              vllmX is the index's alone)

    def to_dict(self) -> dict:
        return {
            "platform": self.platform.name,
            "context": self.context,
            "base_ref": self.base_ref,
            "base_digest": self.base_digest,
            "lock_sha256": self.lock_sha256,
            "lock_hash": self.lock_hash,
            "tags": list(self.tags),
        }


@dataclass(frozen=True)
class RenderedPlatforms:
    """A multi-platform context as render wrote it: its folder, the release, the index's tags, each platform."""

    out_dir: Path
    vllm: str
    index_tags: tuple[str, ...]
    platforms: tuple[RenderedPlatform, ...]

    def to_dict(self) -> dict:
        return {
            "schema": PLATFORMS_SCHEMA,
            "vllm": self.vllm,
            "index_tags": list(self.index_tags),
            "platforms": [p.to_dict() for p in self.platforms],
        }


def platforms_plan(vllm: str, repo: str, contexts: Sequence[RenderedPlatform]) -> dict:
    """The document ``platforms.json`` holds (pure); the index's tags as ``build``/``push`` compute them."""
    tags = image_tags(repo, vllm, index_lock_hash([(c.platform, c.lock_hash) for c in contexts]))
    return {
        "schema": PLATFORMS_SCHEMA,
        "vllm": vllm,
        "index_tags": list(tags),
        "platforms": [c.to_dict() for c in contexts],
    }


def write_platforms_context(
    out: Path,
    vllm: str,
    repo: str,
    targets: Sequence[Platform],
    render_one: Callable[[Platform, Path], RenderedPlatform],
    check_replaceable: Callable[[Path], None],
) -> RenderedPlatforms:
    """Render each platform's context with ``render_one(platform, folder)`` into a temp folder beside ``out``,
    write ``platforms.json``, and rename the whole into place (see the module doc).  ``check_replaceable(out)``
    refuses an ``out`` that is not a context build-image rendered (nothing is changed then)."""
    out = through_link(out)  # a symlinked -o: written through (the folder it names replaced), the link kept
    with output_lock(out):
        if out.is_dir() and (out / PLATFORMS_FILE).exists():
            check_multi_replaceable(out, check_replaceable)
        else:
            check_replaceable(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        sweep_leftovers(out)  # what a killed render of ``out`` left beside it (we hold its lock)
        tmp = temp_path(out)  # made inside the try: an interrupt just after the mkdir still removes it
        try:
            tmp.mkdir(mode=0o755)
            contexts = [render_one(p, tmp / p.slug) for p in targets]
            doc = platforms_plan(vllm, repo, contexts)
            (tmp / PLATFORMS_FILE).write_text(render_json(doc), encoding="utf-8")
            swap_into_place(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return RenderedPlatforms(out_dir=out, vllm=vllm, index_tags=tuple(doc["index_tags"]), platforms=tuple(contexts))


def check_multi_replaceable(out: Path, check_replaceable: Callable[[Path], None]) -> None:
    """The rule for re-rendering over an earlier multi-platform context: it is replaced as a whole only when all
    it holds is what render wrote — ``platforms.json`` (read by
    :func:`builder.image.multiplatform.read_platforms_file`, so a tampered one is the exit 2 ``build`` gives)
    and the platforms' folders (``linux-amd64/``, ``linux-arm64/``), each a context render wrote
    (``check_replaceable``).  Anything else — a user's ``keep-amd64/`` copy, a note, a symlink — is
    :class:`BadInput` naming it, and nothing is changed."""
    read_platforms_file(out)
    ours = {PLATFORMS_FILE} | {p.slug for p in KNOWN}
    foreign = sorted(e.name for e in out.iterdir() if e.name not in ours or e.is_symlink())
    if foreign:
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        raise BadInput(
            f"-o {out}: the multi-platform context holds {', '.join(foreign[:5])}{more}, which render did not write; "
            "render replaces a context as a whole, so it refuses rather than delete them. Nothing was changed.",
            hint="move them out of the context (keep copies beside it), or render into a new directory.",
        )
    for p in KNOWN:
        check_replaceable(out / p.slug)


def render_platforms(
    spec,
    targets: Sequence[Platform],
    out: Path,
    *,
    series=None,
    series_dir: Path | None = None,
    vllm_wheel: Path | None = None,
    no_patches: bool = False,
    reporter: Reporter = SILENT,
    allow_base_drift: bool = False,
    locked: dict | None = None,
) -> RenderedPlatforms:
    """Render one context per platform into ``out`` (see the module doc): each on its platform's base manifest
    and lock (``locked``: the pipeline's :class:`builder.resolve.lockstage.Locked` per platform; else the
    spec's, read once each), all patched by the one series (pure-Python files: the same on every platform;
    the image build checks each file's original sha256 in that platform's base before patching it)."""

    def one(platform: Platform, folder: Path) -> RenderedPlatform:
        sp = replace(spec, platform=platform)
        inputs = render_inputs(sp, locked=(locked or {}).get(platform))
        res = render_context(
            vllm=sp.vllm,
            base=inputs.manifest,
            lock=inputs.lock,
            lock_text=inputs.lock_text,
            out_dir=folder,
            series=series,
            series_dir=series_dir,
            vllm_wheel=vllm_wheel,
            repo=sp.repo,
            no_patches=no_patches,
            reporter=reporter.scoped(f"{platform.name}: "),
            base_data=inputs.base_data,
            allow_base_drift=allow_base_drift,
        )
        return RenderedPlatform(
            platform=platform,
            context=platform.slug,
            base_ref=from_ref(inputs.manifest),
            base_digest=inputs.manifest.image_digest,
            lock_sha256=file_digest(folder / "requirements.lock"),
            lock_hash=inputs.lock.lock_hash,
            tags=tuple(res.tags[:1]),
        )

    return write_platforms_context(out, spec.vllm, spec.repo or default_repo(), targets, one, check_replaceable)


def build_plan(ctx: RenderedPlatforms) -> list[str]:
    """What building and pushing the context does, one copy-pasteable line per step (pure)."""
    import shlex

    q = shlex.quote
    lines = [
        f"DOCKER_BUILDKIT=1 docker build --platform {c.platform.name} --network=none "
        f"-t {q(c.tags[0] if c.tags else c.platform.slug)} {q(str(ctx.out_dir / c.context))}"
        for c in ctx.platforms
    ]
    lines.append(
        "push each platform's image, then the OCI image index "
        f"{ctx.index_tags[0] if ctx.index_tags else '-'} listing "
        + ", ".join(c.platform.name for c in ctx.platforms)
        + f" (build-image build {q(str(ctx.out_dir))} && build-image push {q(str(ctx.out_dir))})"
    )
    return lines
