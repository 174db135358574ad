"""A multi-platform context: read it, build each platform, push them as one OCI image index.

``render --platform linux/amd64,linux/arm64`` writes ``OUT/platforms.json`` and one complete
single-platform context per platform in ``OUT/<slug>/`` (``linux-amd64/``, ``linux-arm64/``): each
builds on its own base digest with its own lock.  ``platforms.json``::

    {"schema": "build-image/platforms/v1", "vllm": "0.33.0",
     "platforms": [{"platform": "linux/amd64", "context": "linux-amd64", "base_ref": "...",
                    "base_digest": null | "sha256:...", "lock_sha256": "<sha256 of its requirements.lock>"}]}

Build (:func:`build_platforms`): every platform's base is checked first (held by the engine, and of
the lock's platform: another is refused, exit 2, before anything is built), then each sub-context
is built with ``--platform`` (BuildKit runs the other machine's steps under QEMU), its checks stage
(drift, ``pip check``, constraints) with it.  Docker's classic image store keeps ONE image per tag,
so locally each platform's image carries its own tags, the sub-context's tags with ``-<slug>``
(``REPO:vllm0.33.0-<12 hex>-linux-arm64``); the tags without a suffix name the index, which exists
only in a registry.

Push (:func:`push_platforms`): each platform image is pushed under its tags (digest-verified, its
SBOM and provenance attached as referrers of THAT platform's manifest, by
:func:`builder.image.push.push_image`), then an OCI image index listing each platform manifest with
its ``platform`` is PUT under the index tags and read back: the index digest under every tag, each
child's digest and image config.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from builder import engine as engine_adapter
from builder.engine import ImageInfo
from builder.errors import BadInput, IntegrityError, RegistryError, TagConflict
from builder.events import SILENT, Reporter
from builder.image import referrers, registry
from builder.image.build import (
    BuildResult,
    base_platform_mismatch,
    build_image,
    inspect_bases,
    missing_base_error,
    missing_bases,
)
from builder.image.naming import image_tags, is_content_addressed, lock_platform
from builder.image.push import PushResult, push_image, registry_clients, tag_conflicts
from builder.image.render import ContextOnDisk, default_repo, read_context
from builder.platforms import Platform, joined, parse, parse_list
from builder.validate import load_json, read_bounded, read_bounded_text
from builder.values import DOCKER_HUB, split_ref

PLATFORMS_FILE = "platforms.json"
PLATFORMS_SCHEMA = "build-image/platforms/v1"


@dataclass(frozen=True)
class PlatformContext:
    """One platform of a multi-platform context: its verified sub-context and its local tags."""

    platform: Platform
    context: ContextOnDisk
    base_ref: str
    base_digest: str | None
    tags: tuple[str, ...]  # the sub-context's tags, each with -<slug> (one image per tag locally)


@dataclass(frozen=True)
class MultiContext:
    out_dir: Path
    vllm: str
    held: tuple[Platform, ...]  # every platform the context was rendered for
    platforms: tuple[PlatformContext, ...]  # the selected ones, in the context's order
    tags: tuple[str, ...]  # the index's tags (content-addressed over the selected locks, moving)


def is_multi(context: str | Path) -> bool:
    """Whether ``context`` is a multi-platform render (holds ``platforms.json``)."""
    return (Path(context) / PLATFORMS_FILE).is_file()


def index_lock_hash(parts: Sequence[tuple[Platform, str]]) -> str:
    """Pure: the index's content hash, over each platform's name and lock hash (the order of the context)."""
    return hashlib.sha256("".join(f"{p.name} {h}\n" for p, h in parts).encode()).hexdigest()


def platform_tags(tags: Sequence[str], platform: Platform) -> tuple[str, ...]:
    """Pure: the local tags of one platform's image: ``REPO:vllmX-<12 hex>`` -> ``REPO:vllmX-<12 hex>-linux-arm64``."""
    return tuple(f"{t}-{platform.slug}" for t in tags)


@dataclass(frozen=True)
class PlatformEntry:
    """One platform of ``platforms.json``, checked: a known platform, its folder (always its slug), its base
    and lock digests as render wrote them."""

    platform: Platform
    context: str
    base_ref: str
    base_digest: str | None
    lock_sha256: str


@dataclass(frozen=True)
class PlatformsFile:
    """``platforms.json`` as :func:`read_platforms_file` accepts it."""

    path: Path
    vllm: str
    entries: tuple[PlatformEntry, ...]

    @property
    def held(self) -> tuple[Platform, ...]:
        return tuple(e.platform for e in self.entries)


def held_platforms(context: str | Path) -> tuple[Platform, ...]:
    """The platforms a multi-platform context was rendered for (from ``platforms.json``)."""
    return read_platforms_file(context).held


def read_platforms_file(context: str | Path) -> PlatformsFile:
    """The one reader of a context's ``platforms.json`` (``build``, ``push`` and a re-``render`` all call it):
    bounded JSON with the schema, a ``vllm`` string and a non-empty ``platforms`` list whose every entry is an
    object with a known ``platform`` (each once), ``context`` equal to that platform's folder (a fixed name:
    nothing outside the context is read or replaced), a ``base_ref`` string, a ``base_digest`` null or
    ``sha256:<64 hex>`` and a ``lock_sha256`` of 64 hex.  Anything else is :class:`BadInput` (exit 2) naming the
    file and the field."""
    ctx = Path(context)
    where = str(ctx / PLATFORMS_FILE)
    doc = _read_doc(ctx)
    vllm = doc.get("vllm")
    if not isinstance(vllm, str) or not vllm.strip():
        raise BadInput(f"{where}: 'vllm' is missing or not a string.", hint=_RERENDER)
    raw = doc.get("platforms")
    if not isinstance(raw, list) or not raw or not all(isinstance(e, dict) for e in raw):
        raise BadInput(f"{where}: 'platforms' must be a non-empty list of objects.", hint=_RERENDER)
    entries: list[PlatformEntry] = []
    for i, e in enumerate(raw):
        entry = _platform_entry(e, f"{where}: platforms[{i}]")
        if any(x.platform == entry.platform for x in entries):
            raise BadInput(f"{where}: {entry.platform.name} is listed twice.", hint=_RERENDER)
        entries.append(entry)
    return PlatformsFile(path=ctx / PLATFORMS_FILE, vllm=vllm, entries=tuple(entries))


_RERENDER = "re-run `build-image render --platform ...`."


def _platform_entry(e: dict, where: str) -> PlatformEntry:
    """One ``platforms`` entry, every field checked (see :func:`read_platforms_file`)."""
    text = e.get("platform")
    if not isinstance(text, str):
        raise BadInput(f"{where}: 'platform' is missing or not a string.", hint=_RERENDER)
    p = parse(text, where=f"{where}: 'platform'")
    if e.get("context") != p.slug:
        raise BadInput(
            f"{where}: 'context' is {str(e.get('context'))[:80]!r}; the {p.name} context is the folder {p.slug}.",
            hint=_RERENDER,
        )
    base_ref, digest, lock_sha = e.get("base_ref"), e.get("base_digest"), e.get("lock_sha256")
    if not isinstance(base_ref, str) or not base_ref:
        raise BadInput(f"{where}: 'base_ref' is missing or not a string.", hint=_RERENDER)
    if digest is not None and not (isinstance(digest, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", digest)):
        raise BadInput(f"{where}: 'base_digest' {str(digest)[:80]!r} is neither null nor sha256:<64 hex>.")
    if not (isinstance(lock_sha, str) and re.fullmatch(r"[0-9a-f]{64}", lock_sha)):
        raise BadInput(f"{where}: 'lock_sha256' {str(lock_sha)[:80]!r} is not 64 hex digits.", hint=_RERENDER)
    return PlatformEntry(platform=p, context=p.slug, base_ref=base_ref, base_digest=digest, lock_sha256=lock_sha)


def _read_doc(ctx: Path) -> dict:
    where = str(ctx / PLATFORMS_FILE)
    try:
        doc = load_json(read_bounded_text(ctx / PLATFORMS_FILE, "platforms.json"), where)
    except ValueError as exc:
        raise BadInput(f"{where} is not JSON ({exc}).", hint=_RERENDER) from None
    if not isinstance(doc, dict) or doc.get("schema") != PLATFORMS_SCHEMA:
        raise BadInput(
            f"{where} is not a build-image platforms file (schema {PLATFORMS_SCHEMA}).",
            hint=_RERENDER,
        )
    return doc


def select(held: Sequence[Platform], wanted: str | None, context: Path) -> tuple[Platform, ...]:
    """The platforms ``--platform`` selects of those the context holds (all for None); one it does not
    hold is BadInput naming what it holds."""
    if wanted is None or not wanted.strip():
        return tuple(held)
    chosen = parse_list(wanted)
    absent = [p.name for p in chosen if p not in held]
    if absent:
        raise BadInput(
            f"--platform {', '.join(absent)}: the context {context} was rendered for {joined(held)} only.",
            hint=f"pick of {joined(held)}, or render the context for {', '.join(absent)} "
            "(build-image render --platform ...).",
        )
    return tuple(p for p in held if p in chosen)


def read_multi_context(context: str | Path, repo: str | None, *, wanted: str | None = None) -> MultiContext:
    """Read and verify a multi-platform context (``platforms.json`` by :func:`read_platforms_file`, every
    sub-context as :func:`read_context` does, each lock against ``platforms.json``'s sha256 and platform, each
    base ref against the sub-context's Dockerfile)."""
    ctx = Path(context)
    pf = read_platforms_file(ctx)
    chosen = select(pf.held, wanted, ctx)
    subs = [_platform_context(ctx, e, repo, pf.vllm) for e in pf.entries if e.platform in chosen]
    tags = image_tags(
        repo or default_repo(), pf.vllm, index_lock_hash([(s.platform, s.context.lock_hash) for s in subs])
    )
    return MultiContext(out_dir=ctx, vllm=pf.vllm, held=pf.held, platforms=tuple(subs), tags=tuple(tags))


def _platform_context(ctx: Path, entry: PlatformEntry, repo: str | None, vllm: str) -> PlatformContext:
    p = entry.platform
    where = f"{ctx / PLATFORMS_FILE} ({p.name})"
    sub = ctx / p.slug
    lock_file = sub / "requirements.lock"
    if not lock_file.is_file():
        raise BadInput(f"{where}: {sub} holds no requirements.lock.", hint=_RERENDER)
    got = hashlib.sha256(read_bounded(lock_file, "lock")).hexdigest()
    if entry.lock_sha256 != got:
        raise IntegrityError(
            f"{where}: {lock_file} has sha256 {got[:16]}..., platforms.json says {entry.lock_sha256[:16]}...",
            hint="re-run `build-image render`.",
        )
    one = read_context(sub, repo)  # verifies every wheel and patched file
    if one.vllm != vllm:
        raise BadInput(f"{where}: the lock is for vllm {one.vllm}, platforms.json for {vllm}.")
    locked_for = lock_platform(one.lock)
    if locked_for != p:
        raise BadInput(f"{where}: its lock was made for {locked_for.name}, not {p.name}.", hint=_RERENDER)
    if entry.base_ref not in one.base_refs:
        raise BadInput(
            f"{where}: base_ref {entry.base_ref!r} is not what its Dockerfile builds FROM ({', '.join(one.base_refs)})."
        )
    return PlatformContext(
        platform=p, context=one, base_ref=entry.base_ref, base_digest=entry.base_digest, tags=platform_tags(one.tags, p)
    )


# ------------------------------------------------------------------------------------------------ build
@dataclass(frozen=True)
class MultiBuildResult:
    """One :class:`BuildResult` per platform (each carries its ``platform``), and the index tags a push uses."""

    builds: tuple[BuildResult, ...]
    index_tags: tuple[str, ...]

    @property
    def seconds(self) -> float:
        return round(sum(b.seconds for b in self.builds), 2)

    def to_dict(self) -> dict:
        return {
            "platforms": [b.to_dict() for b in self.builds],
            "index_tags": list(self.index_tags),
            "seconds": self.seconds,
        }


def check_bases(mc: MultiContext, engine, *, pull: bool = False) -> dict[str, ImageInfo | None]:
    """Before any build: every platform's base is held (unless ``pull``) and of that platform; returns
    what the engine said of each base (asked once, handed on to the builds)."""
    refs = sorted({r for s in mc.platforms for r in s.context.base_refs})
    inspected = inspect_bases(refs, engine)
    if not pull:
        missing = missing_bases(refs, engine, inspected)
        if missing:
            raise missing_base_error(missing)
    for s in mc.platforms:
        refused = base_platform_mismatch(s.context.base_refs, s.platform, engine, inspected=inspected)
        if refused is not None:
            raise refused
    return inspected


def build_platforms(
    mc: MultiContext, *, engine=None, pull: bool = False, reporter: Reporter = SILENT
) -> MultiBuildResult:
    """Build every selected platform of ``mc`` (bases checked for all of them first)."""
    engine = engine or engine_adapter.get_engine()
    engine.ping()
    inspected = check_bases(mc, engine, pull=pull)
    builds = []
    for s in mc.platforms:
        builds.append(
            build_image(
                s.context.out_dir,
                s.tags,
                vllm=s.context.vllm,
                lock_hash=s.context.lock_hash,
                base_refs=s.context.base_refs,
                engine=engine,
                pull=pull,
                bases_checked=True,
                reporter=reporter.scoped(f"{s.platform.name}: "),
                platform=s.platform,
                inspected=inspected,
            )
        )
    return MultiBuildResult(builds=tuple(builds), index_tags=mc.tags)


# ------------------------------------------------------------------------------------------------- push
@dataclass(frozen=True)
class IndexPushResult:
    """The pushed index (digest under every index tag) and each platform's push (digest, attestations)."""

    digest: str
    pinned: str  # REGISTRY/REPO@sha256:<index>
    tags: tuple[str, ...]
    platforms: tuple[tuple[Platform, PushResult], ...]
    moved_tags: tuple[str, ...]

    def to_dict(self) -> dict:
        return {
            "index": {
                "digest": self.digest,
                "pinned": self.pinned,
                "media_type": referrers.OCI_INDEX,
                "tags": list(self.tags),
            },
            "platforms": [{"platform": p.name} | r.to_dict() for p, r in self.platforms],
            "moved_tags": list(self.moved_tags),
        }


def index_document(children: Sequence[tuple[Platform, dict]]) -> bytes:
    """Pure: the OCI image index bytes listing each platform's manifest descriptor (mediaType, digest, size)."""
    manifests = [
        {
            "mediaType": d["mediaType"],
            "digest": d["digest"],
            "size": d["size"],
            "platform": {"architecture": p.arch, "os": p.os},
        }
        for p, d in children
    ]
    doc = {"schemaVersion": 2, "mediaType": referrers.OCI_INDEX, "manifests": manifests}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def _same_images(client, repository: str, doc: dict, want: dict[str, str]) -> bool:
    """Whether the index ``doc`` lists exactly ``want``'s architectures, each child's image config being the
    local image ID ``want`` names for it (the same build pushed again)."""
    manifests = doc.get("manifests")
    if not isinstance(manifests, list):
        return False
    listed = {(m.get("platform") or {}).get("architecture"): m.get("digest") for m in manifests if isinstance(m, dict)}
    if set(listed) != set(want):
        return False
    for arch, digest in listed.items():
        got = client.manifest(repository, digest) if isinstance(digest, str) else None
        if got is None or registry.config_of(got[1]) != want[arch]:
            return False
    return True


def _index_conflicts(mc: MultiContext, images: dict[str, str], want: str | None = None) -> tuple[list[str], list[str]]:
    """(conflicts, moving) of the index tags: a tag naming another manifest than ``want`` in the registry (before
    the push, ``want`` None: one that is not an index of the local images ``images``, arch -> image ID)."""
    conflicts, moving = [], []
    for t in mc.tags:
        client, ref = registry.client_for(t)
        client.ping()
        got = client.manifest(ref.repository, ref.tag or "latest")
        if got is None or got[0] == want or (want is None and _same_images(client, ref.repository, got[1], images)):
            continue
        (conflicts if is_content_addressed(t) else moving).append(f"{t} -> {got[0][:19]}…")
    return conflicts, moving


def local_images(mc: MultiContext, engine) -> dict[str, str]:
    """arch -> the local image ID of each selected platform; an image missing, or of another platform than
    its tag says (a tag moved by hand), is BadInput before anything is pushed."""
    images = {}
    for s in mc.platforms:
        info = engine.inspect(s.tags[0])
        if info is None:
            raise BadInput(
                f"no local image tagged {s.tags[0]} ({s.platform.name}).",
                hint=f"build it first: `build-image build {mc.out_dir}`.",
            )
        if info.architecture and info.platform != s.platform:
            raise BadInput(
                f"the local image tagged {s.tags[0]} is {info.platform_name}, not {s.platform.name}.",
                hint=f"build it again: `build-image build {mc.out_dir} --platform {s.platform.name}`.",
            )
        images[s.platform.arch] = info.id
    return images


def push_platforms(
    mc: MultiContext, *, force: bool = False, engine=None, reporter: Reporter = SILENT
) -> IndexPushResult:
    """Push each platform image (with its attestations), then the index under the index tags, all verified."""
    engine = engine or engine_adapter.get_engine()
    engine.ping()
    for t in mc.tags:
        if split_ref(t).registry == DOCKER_HUB and "/" not in t.split(":")[0]:
            raise BadInput(f"tag {t} has no registry host; use --tag HOST[:PORT]/REPO.")
    images = local_images(mc, engine)
    conflicts, _ = _index_conflicts(mc, images)
    for s in mc.platforms:  # every platform's own tags too: known before anything is pushed
        conflicts += tag_conflicts(registry_clients(s.tags), images[s.platform.arch])[0]
    if conflicts and not force:
        raise TagConflict(
            "tag(s) already point at a different image or index in the registry: "
            + "; ".join(conflicts)
            + ". Nothing was pushed.",
            hint="a content-addressed tag moving means the build is not the same; pass --force to move the tag(s).",
        )
    pushed = []
    for s in mc.platforms:
        pushed.append(
            (
                s.platform,
                push_image(
                    s.tags,
                    force=force,
                    engine=engine,
                    context=s.context.out_dir,
                    reporter=reporter.scoped(f"{s.platform.name}: "),
                ),
            )
        )
    client, ref = registry.client_for(mc.tags[0])
    children = [(p, referrers.subject_descriptor(client, ref.repository, r.digest or "")) for p, r in pushed]
    data = index_document(children)
    digest = referrers.digest_of(data)
    _, moving = _index_conflicts(mc, images, digest)
    for t in mc.tags:
        c, r = registry.client_for(t)
        reporter.step(f"index {t}")
        status, _, body = c.request(
            "PUT", f"/v2/{r.repository}/manifests/{r.tag}", {"Content-Type": referrers.OCI_INDEX}, data
        )
        if status not in (200, 201, 202):
            text = body.decode("utf-8", "replace").strip().replace("\n", " ")[:300]
            raise RegistryError(f"registry {c.registry} refused the image index under {t} (HTTP {status}: {text}).")
    verify_index(mc, digest, pushed)
    return IndexPushResult(
        digest=digest,
        pinned=f"{ref.registry}/{ref.repository}@{digest}",
        tags=mc.tags,
        platforms=tuple(pushed),
        moved_tags=tuple(m.split(" ->")[0] for m in moving),
    )


def verify_index(mc: MultiContext, digest: str, pushed: Sequence[tuple[Platform, PushResult]]) -> None:
    """Read the index back under every tag: its digest, each child's platform and digest, each child manifest's
    own digest and image config (the local image's ID)."""
    want = {p: r for p, r in pushed}
    for t in mc.tags:
        client, ref = registry.client_for(t)
        got = client.manifest(ref.repository, ref.tag or "latest")
        if got is None or got[0] != digest:
            raise RegistryError(
                f"after pushing the index under {t} the registry serves "
                f"{got[0] if got else 'nothing'}, not the index {digest}."
            )
        listed = {(m.get("platform") or {}).get("architecture"): m.get("digest") for m in got[1].get("manifests", [])}
        for p, r in want.items():
            if listed.get(p.arch) != r.digest:
                raise RegistryError(
                    f"the index under {t} lists {listed.get(p.arch) or 'nothing'} for {p.name}, "
                    f"the push was {r.digest}."
                )
            child = client.manifest(ref.repository, r.digest or "")
            if child is None or child[0] != r.digest or registry.config_of(child[1]) != r.image_id:
                raise RegistryError(
                    f"the {p.name} manifest {r.digest} of the index under {t} does not read back as "
                    f"the image {r.image_id}."
                )
