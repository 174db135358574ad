"""The push stage: both tags of one local image -> the registry, its digest verified.

:func:`push_image` returns a frozen :class:`PushResult`; nothing is reported as pushed
that the registry does not serve.  Credentials come only from the engine's own store
(``docker login``): the tool never handles them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from builder import engine as engine_adapter
from builder.errors import BadInput, RegistryError, TagConflict
from builder.events import SILENT, Reporter
from builder.image import referrers, registry
from builder.image.naming import is_content_addressed
from builder.values import RefParts


@dataclass(frozen=True)
class PushedTag:
    ref: str
    digest: str
    pinned: str  # REGISTRY/REPO@sha256:...

    def to_dict(self) -> dict:
        return {"ref": self.ref, "digest": self.digest, "pinned": self.pinned}


@dataclass(frozen=True)
class PushResult:
    """The push stage's result: the registry's manifest digest of the image, pinned by digest."""

    image_id: str
    digest: str | None  # None only if the tags were pushed as different manifests
    pinned: str
    pushed: tuple[PushedTag, ...]
    moved_tags: tuple[str, ...]
    attestations: dict | None = None  # SBOM + provenance as OCI referrers (builder.image.referrers.push_attestations)
    compressed_bytes: int | None = None  # what a pull downloads: the registry manifest's layer + config sizes

    def to_dict(self) -> dict:
        doc = {
            "image_id": self.image_id,
            "digest": self.digest,
            "pinned": self.pinned,
            "pushed": [p.to_dict() for p in self.pushed],
            "moved_tags": list(self.moved_tags),
        }
        if self.attestations is not None:
            doc["attestations"] = self.attestations
        doc["compressed_bytes"] = self.compressed_bytes
        return doc


def registry_clients(tags: Sequence[str]) -> dict[str, tuple[registry.RegistryClient, RefParts]]:
    """A reachable registry client per tag (a tag without a registry host is BadInput)."""
    clients = {}
    for t in tags:
        client, ref = registry.client_for(t)
        if ref.registry == "docker.io" and "/" not in t.split(":")[0]:
            raise BadInput(f"tag {t} has no registry host; use --tag HOST[:PORT]/REPO.")
        client.ping()
        clients[t] = (client, ref)
    return clients


def tag_conflicts(
    clients: dict[str, tuple[registry.RegistryClient, RefParts]], image_id: str
) -> tuple[list[str], list[str]]:
    """(conflicts, moving): the tags already naming another image in the registry, content-addressed ones
    (a conflict) apart from moving ones (they move)."""
    conflicts, moving = [], []
    for t, (client, ref) in clients.items():
        got = client.manifest(ref.repository, ref.tag or "latest")
        if got is None:
            continue
        cfg = registry.config_of(got[1])
        if cfg != image_id:  # a manifest list / index (no single config) is a different image too
            what = (
                f"image {cfg[:19]}…"
                if cfg
                else f"{got[1].get('mediaType') or 'a manifest without a config'} {got[0][:19]}…"
            )
            (conflicts if is_content_addressed(t) else moving).append(f"{t} -> {what} (local {image_id[:19]}…)")
    return conflicts, moving


def push_image(
    tags: Sequence[str],
    *,
    force: bool = False,
    engine=None,
    context: Path | None = None,
    reporter: Reporter = SILENT,
    signer=None,
) -> PushResult:
    """Push every tag of one local image; verify the registry's manifest digest; with ``context``
    (the rendered context the image was built from), attach its SBOM and provenance as referrers (signed
    DSSE envelopes too, with ``signer``).

    Before pushing: a content-addressed tag (``…:vllm<v>-<12 hex>``) that already points at a
    different image in the registry -> TagConflict (unless ``force``).  The moving tag
    (``…:vllm<v>``) is meant to move to each new lock: it moves without ``force`` and is
    listed in ``moved_tags``.  After pushing: the registry's digest for each tag must
    equal the digest the engine pushed -> RegistryError otherwise.
    """
    say = reporter.step
    engine = engine or engine_adapter.get_engine()
    engine.ping()
    infos = {}
    for t in tags:
        info = engine.inspect(t)
        if info is None:
            raise BadInput(f"no local image tagged {t}.", hint="build it first: `build-image build`.")
        infos[t] = info
    ids = {i.id for i in infos.values()}
    if len(ids) != 1:
        raise BadInput(f"the tags {', '.join(tags)} point at different local images ({', '.join(sorted(ids))}).")
    image_id = ids.pop()
    clients = registry_clients(tags)
    conflicts, moving = tag_conflicts(clients, image_id)
    if conflicts and not force:
        raise TagConflict(
            "tag(s) already point at a different image in the registry: "
            + "; ".join(conflicts)
            + ". Nothing was pushed.",
            hint="a content-addressed tag moving means the build is not the same; pass --force to move the tag(s).",
        )
    for m in moving:
        say(f"moving tag {m}")
    pushed: list[PushedTag] = []
    compressed = None
    for t, (client, ref) in clients.items():
        say(t)
        res = engine.push(t)
        got = client.manifest(ref.repository, ref.tag or "latest")
        remote, cfg = (got[0], registry.config_of(got[1])) if got else (None, None)
        if remote != res.digest or cfg != image_id:
            raise RegistryError(
                f"after pushing {t} the registry serves manifest {remote or 'nothing'} (image {cfg or 'none'}), "
                f"but the engine pushed {res.digest} of the local image {image_id}.",
                details="pushed so far: " + (", ".join(p.ref for p in pushed) or "none"),
            )
        pushed.append(PushedTag(ref=t, digest=res.digest, pinned=f"{ref.registry}/{ref.repository}@{res.digest}"))
        if compressed is None:
            compressed = registry.compressed_size(got[1])
    digests = {p.digest for p in pushed}
    attestations = None
    if context is not None:
        attestations = referrers.push_attestations(context, pushed[0].pinned, list(tags), signer)
        say(referrers.summary_line(attestations))
    return PushResult(
        image_id=image_id,
        digest=pushed[0].digest if len(digests) == 1 else None,
        pinned=pushed[0].pinned,
        pushed=tuple(pushed),
        moved_tags=tuple(c.split(" ->")[0] for c in conflicts + moving),
        attestations=attestations,
        compressed_bytes=compressed,
    )
