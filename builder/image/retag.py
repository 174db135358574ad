"""Moving a tag in the registry to a manifest it already holds, and reading an image's container config.

``promote`` and ``rollback`` never push an image: the image is in the registry (by digest) and only its
tag moves.  Every manifest is read by digest and its bytes hashed (:func:`manifest_by_digest`); the tag is
moved by putting exactly those bytes under it (the digest does not change), and read back.  A move
across repositories of one registry mounts the blobs first (``POST …/blobs/uploads/?mount=``).
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.errors import BadInput, RegistryError
from builder.image.referrers import OCI_INDEX, OCI_MANIFEST, digest_of
from builder.image.registry import MANIFEST_TYPES, blob_limit, registry_json
from builder.platforms import Platform, from_oci, known_names

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
#: what a rollback record keeps of an image's config: what the container runs with
CONFIG_KEYS = ("Env", "Entrypoint", "Cmd", "Labels", "WorkingDir", "User", "ExposedPorts", "StopSignal")


@dataclass(frozen=True)
class Manifest:
    digest: str
    media_type: str
    body: bytes

    @property
    def doc(self) -> dict:
        return registry_json(self.body, f"the manifest {self.digest}", "")

    @property
    def config_digest(self) -> str | None:
        cfg = (self.doc.get("config") or {}).get("digest")
        return cfg if isinstance(cfg, str) else None


def manifest_by_digest(client, repository: str, digest: str) -> Manifest | None:
    """The manifest ``repository@digest`` (None when the registry does not hold it), its bytes verified."""
    status, headers, body = client.request("GET", f"/v2/{repository}/manifests/{digest}", {"Accept": MANIFEST_TYPES})
    if status == 404:
        return None
    if status != 200:
        raise RegistryError(f"registry {client.registry}: GET {repository}@{digest} answered HTTP {status}.")
    if digest_of(body) != digest:
        raise RegistryError(
            f"registry {client.registry} served {repository}@{digest} with content of digest {digest_of(body)}."
        )
    doc = registry_json(body, f"the manifest {repository}@{digest}", client.registry)
    media = (headers.get("Content-Type") or doc.get("mediaType") or OCI_MANIFEST).split(";")[0].strip()
    return Manifest(digest=digest, media_type=media, body=body)


def tag_digest(client, repository: str, tag: str) -> str | None:
    """The digest ``repository:tag`` points at now (None: no such tag); computed from the bytes when the
    registry sends no ``Docker-Content-Digest``."""
    status, headers, body = client.request("GET", f"/v2/{repository}/manifests/{tag}", {"Accept": MANIFEST_TYPES})
    if status == 404:
        return None
    if status != 200:
        raise RegistryError(f"registry {client.registry}: GET {repository}:{tag} answered HTTP {status}.")
    return digest_of(body)


def container_config(client, repository: str, manifest: Manifest) -> dict:
    """The container configuration (env, entrypoint, cmd, labels, …) of a single-image manifest, from its config
    blob (digest verified); an index has none (BadInput: promote names one image, not a list)."""
    cfg, doc = _image_config(client, repository, manifest)
    inner = doc.get("config") or {}
    if not isinstance(inner, dict):
        raise RegistryError(f"registry {client.registry}: the config {cfg} is not an image config.")
    return {"digest": cfg, **{k: inner.get(k) for k in CONFIG_KEYS if inner.get(k) is not None}}


def config_platform(client, repository: str, manifest: Manifest) -> Platform:
    """The platform of a single-image manifest, from its config blob's ``os`` / ``architecture`` / ``variant``
    (digest verified; :func:`builder.platforms.from_oci`).  An image of a platform build-image does not build,
    or whose config names none, is :class:`BadInput`: what it runs on is unknown, so it is never promoted."""
    cfg, doc = _image_config(client, repository, manifest)
    os_name, arch, variant = doc.get("os"), doc.get("architecture"), doc.get("variant")
    found = None
    if isinstance(os_name, str) and isinstance(arch, str) and (variant is None or isinstance(variant, str)):
        found = from_oci(os_name, arch, variant)
    if found is None:
        shown = "/".join(str(x)[:40] for x in (os_name, arch, variant) if x is not None) or "none"
        raise BadInput(
            f"{client.registry}/{repository}@{manifest.digest}: its config {cfg} names the platform {shown!r}, "
            f"not one of {known_names()}; the pods' nodes cannot be chosen for it."
        )
    return found


def _image_config(client, repository: str, manifest: Manifest) -> tuple[str, dict]:
    """(digest, document) of a single-image manifest's config blob, its digest verified."""
    cfg = manifest.config_digest
    if manifest.media_type in (OCI_INDEX, "application/vnd.docker.distribution.manifest.list.v2+json") or not cfg:
        raise BadInput(
            f"{client.registry}/{repository}@{manifest.digest} is an image index, not one image; "
            "promote the platform's image digest (KubeRay pods run one image)."
        )
    limit = blob_limit(manifest.doc.get("config"), f"the config of {repository}@{manifest.digest}", client.registry)
    status, _h, body = client.request("GET", f"/v2/{repository}/blobs/{cfg}", limit=limit)
    if status != 200:
        raise RegistryError(
            f"registry {client.registry}: the config {cfg} of {repository}@{manifest.digest} answered HTTP {status}."
        )
    if digest_of(body) != cfg:
        raise RegistryError(
            f"registry {client.registry} served the config {cfg} with content of digest {digest_of(body)}."
        )
    doc = registry_json(body, f"the config {cfg}", client.registry)
    if not isinstance(doc, dict):
        raise RegistryError(f"registry {client.registry}: the config {cfg} is not an image config.")
    return cfg, doc


def mount_blobs(client, repository: str, source_repository: str, manifest: Manifest) -> None:
    """Make the manifest's config and layers present in ``repository`` (cross-repository mount)."""
    if repository == source_repository:
        return
    doc = manifest.doc
    digests = [(doc.get("config") or {}).get("digest")] + [x.get("digest") for x in doc.get("layers") or []]
    for d in [x for x in digests if isinstance(x, str)]:
        status, _h, _b = client.request("HEAD", f"/v2/{repository}/blobs/{d}")
        if status == 200:
            continue
        status, _h, body = client.request("POST", f"/v2/{repository}/blobs/uploads/?mount={d}&from={source_repository}")
        if status != 201:
            raise RegistryError(
                f"registry {client.registry} did not mount {d} from {source_repository} into "
                f"{repository} (HTTP {status})."
            )


def put_tag(client, repository: str, tag: str, manifest: Manifest) -> None:
    """Point ``repository:tag`` at ``manifest`` (its exact bytes) and check the registry's answer."""
    status, headers, body = client.request(
        "PUT", f"/v2/{repository}/manifests/{tag}", {"Content-Type": manifest.media_type}, manifest.body
    )
    if status not in (200, 201):
        text = body.decode("utf-8", "replace").strip().replace("\n", " ")[:300]
        raise RegistryError(f"registry {client.registry} refused to move {repository}:{tag} (HTTP {status}: {text}).")
    got = headers.get("Docker-Content-Digest")
    if got and got != manifest.digest:
        raise RegistryError(f"registry {client.registry} stored {repository}:{tag} as {got}, not {manifest.digest}.")
