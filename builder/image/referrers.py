"""Attach the SBOM and the provenance to a pushed image as OCI 1.1 artifacts (referrers).

Each artifact is an OCI image manifest with ``artifactType`` (``application/vnd.cyclonedx+json``,
``application/vnd.in-toto+json``), the empty config, one layer (the document), and a
``subject`` naming the image's manifest.  A registry that implements the OCI 1.1 referrers
API answers the manifest PUT with an ``OCI-Subject`` header and lists the artifact under
``GET /v2/<repo>/referrers/<digest>``; one that does not (Debian 12's docker-registry 2.8)
stores the manifest as it is, and the client maintains the *referrers tag schema* the OCI
distribution spec defines for that case: an image index under the tag ``sha256-<hex>`` of
the subject listing every referrer.  Both are what ``oras discover`` / ``cosign tree`` read.

Every upload goes through :class:`builder.image.registry.RegistryClient` (the one registry client:
its auth, loopback-HTTP rule and error mapping); every digest is computed here and checked
against what the registry answers.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from builder import signing
from builder.errors import BadInput, RegistryError
from builder.image import provenance
from builder.image.naming import PROVENANCE_FILE, SBOM_FILE
from builder.image.registry import client_for, registry_json
from builder.validate import load_json

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
SBOM_TYPE = "application/vnd.cyclonedx+json"
INTOTO_TYPE = "application/vnd.in-toto+json"
TITLE = "org.opencontainers.image.title"
KIND = "org.build-image.attestation"  # sbom | provenance: the one of each kind build-image keeps indexed


#: JSON Schema (draft 2020-12) of an OCI content descriptor, and of an artifact manifest as a reader of
#: referrers takes one (:func:`builder.validate.load_typed_json`): fields typed, sizes bounded, the
#: digest in the OCI grammar; unknown fields an OCI document may carry are allowed.
_STRINGS = {"type": "object", "maxProperties": 256, "additionalProperties": {"type": "string", "maxLength": 8192}}
DESCRIPTOR_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "mediaType": {"type": "string", "maxLength": 255},
        "artifactType": {"type": "string", "maxLength": 255},
        "digest": {"type": "string", "pattern": "^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{1,256}$"},
        "size": {"type": "integer", "minimum": 0, "maximum": 2**62},
        "annotations": _STRINGS,
        "data": {"type": "string"},
    },
    "required": ["mediaType", "digest", "size"],
}
REFERRERS_SCHEMA: dict = {"type": "array", "maxItems": 10000, "items": DESCRIPTOR_SCHEMA}
ARTIFACT_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "schemaVersion": {"const": 2},
        "mediaType": {"const": OCI_MANIFEST},
        "artifactType": {"type": "string", "maxLength": 255},
        "config": DESCRIPTOR_SCHEMA,
        "layers": {"type": "array", "minItems": 1, "maxItems": 64, "items": DESCRIPTOR_SCHEMA},
        "subject": DESCRIPTOR_SCHEMA,
        "annotations": _STRINGS,
    },
    "required": ["schemaVersion", "config", "layers", "subject"],
}


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def referrers_tag(subject_digest: str) -> str:
    """The referrers-tag-schema tag of a subject: ``sha256:<hex>`` -> ``sha256-<hex>``."""
    return subject_digest.replace(":", "-", 1)


def artifact_manifest(
    artifact_type: str,
    blob: bytes,
    title: str,
    subject: dict,
    annotations: dict | None = None,
    *,
    layer_type: str | None = None,
    layer_annotations: dict | None = None,
) -> bytes:
    """The artifact's manifest bytes (pure; the digest is of exactly these bytes).  The layer's media type is
    ``artifact_type`` unless ``layer_type`` says otherwise (a signed statement: a DSSE envelope)."""
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": {"mediaType": EMPTY_TYPE, "digest": digest_of(EMPTY), "size": len(EMPTY), "data": "e30="},
        "layers": [
            {
                "mediaType": layer_type or artifact_type,
                "digest": digest_of(blob),
                "size": len(blob),
                "annotations": {**(layer_annotations or {}), TITLE: title},
            }
        ],
        "subject": subject,
    }
    if annotations:
        doc["annotations"] = dict(sorted(annotations.items()))
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def merge_index(index: dict | None, descriptor: dict) -> dict:
    """The referrers-tag index with ``descriptor`` added (pure).  An entry with the same digest, or one
    build-image wrote for the same kind (``org.build-image.attestation``: a re-push's provenance replaces
    the previous one), is replaced; every other referrer (signatures, other tools') is kept."""
    kind = (descriptor.get("annotations") or {}).get(KIND)
    manifests = [
        m
        for m in (index or {}).get("manifests", [])
        if m.get("digest") != descriptor["digest"] and not (kind and (m.get("annotations") or {}).get(KIND) == kind)
    ]
    manifests.append(descriptor)
    return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}


@dataclass
class Attached:
    artifact_type: str
    digest: str
    size: int
    referrers: str  # "api" (the registry lists it) | "tag-schema" (sha256-<hex> index)


def _check(status: int, body: bytes, what: str, registry: str, ok=(200, 201, 202, 204)) -> None:
    if status not in ok:
        text = body.decode("utf-8", "replace").strip().replace("\n", " ")[:300]
        raise RegistryError(f"registry {registry} refused {what} (HTTP {status}{': ' + text if text else ''}).")


def upload_blob(client, repository: str, data: bytes) -> str:
    """Monolithic blob upload (skipped when the registry has it); returns its digest."""
    digest = digest_of(data)
    status, _, _ = client.request("HEAD", f"/v2/{repository}/blobs/{digest}")
    if status == 200:
        return digest
    status, headers, body = client.request("POST", f"/v2/{repository}/blobs/uploads/")
    _check(status, body, "a blob upload", client.registry)
    loc = headers.get("Location") or headers.get("location")
    if not loc:
        raise RegistryError(f"registry {client.registry} started a blob upload without a Location.")
    sep = "&" if "?" in loc else "?"
    status, headers, body = client.request(
        "PUT", f"{loc}{sep}digest={digest}", {"Content-Type": "application/octet-stream"}, data
    )
    _check(status, body, f"the blob {digest[:19]}…", client.registry)
    got = headers.get("Docker-Content-Digest")
    if got and got != digest:
        raise RegistryError(f"registry {client.registry} stored blob {got}, the upload was {digest}.")
    return digest


def subject_descriptor(client, repository: str, digest: str) -> dict:
    """(mediaType, digest, size) of the pushed image manifest, read back and its digest verified."""
    status, headers, body = client.request(
        "GET",
        f"/v2/{repository}/manifests/{digest}",
        {
            "Accept": f"{OCI_MANIFEST}, {OCI_INDEX}, "
            "application/vnd.docker.distribution.manifest.v2+json, "
            "application/vnd.docker.distribution.manifest.list.v2+json"
        },
    )
    _check(status, body, f"to show {repository}@{digest}", client.registry, ok=(200,))
    if digest_of(body) != digest:
        raise RegistryError(
            f"registry {client.registry} served {repository}@{digest} with content of digest {digest_of(body)}."
        )
    media = (
        headers.get("Content-Type")
        or registry_json(body, f"the manifest {repository}@{digest}", client.registry).get("mediaType")
        or OCI_MANIFEST
    )
    return {"mediaType": media.split(";")[0].strip(), "digest": digest, "size": len(body)}


def attach(
    client,
    repository: str,
    subject: dict,
    blob: bytes,
    artifact_type: str,
    title: str,
    annotations: dict | None = None,
    *,
    layer_type: str | None = None,
    layer_annotations: dict | None = None,
) -> Attached:
    """Push ``blob`` as an artifact referring to ``subject``; index it when the registry has no referrers API."""
    upload_blob(client, repository, EMPTY)
    upload_blob(client, repository, blob)
    manifest = artifact_manifest(
        artifact_type, blob, title, subject, annotations, layer_type=layer_type, layer_annotations=layer_annotations
    )
    digest = digest_of(manifest)
    status, headers, body = client.request(
        "PUT", f"/v2/{repository}/manifests/{digest}", {"Content-Type": OCI_MANIFEST}, manifest
    )
    _check(status, body, f"the {artifact_type} artifact manifest", client.registry)
    got = headers.get("Docker-Content-Digest")
    if got and got != digest:
        raise RegistryError(f"registry {client.registry} stored the artifact as {got}, its digest is {digest}.")
    if headers.get("OCI-Subject") == subject["digest"]:
        return Attached(artifact_type, digest, len(manifest), "api")
    # no referrers API: the referrers tag schema (OCI distribution spec 1.1, "Referrers Tag Schema")
    tag = referrers_tag(subject["digest"])
    status, _, body = client.request("GET", f"/v2/{repository}/manifests/{tag}", {"Accept": OCI_INDEX})
    index = registry_json(body, f"the referrers index {tag}", client.registry) if status == 200 else None
    desc = {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(manifest), "artifactType": artifact_type}
    if annotations:
        desc["annotations"] = dict(sorted(annotations.items()))
    data = json.dumps(merge_index(index, desc), separators=(",", ":"), sort_keys=True).encode()
    status, _, body = client.request("PUT", f"/v2/{repository}/manifests/{tag}", {"Content-Type": OCI_INDEX}, data)
    _check(status, body, f"the referrers index {tag}", client.registry)
    return Attached(artifact_type, digest, len(manifest), "tag-schema")


COSIGN_SIGNATURE = "dev.cosignproject.cosign/signature"
COSIGN_CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"


def cosign_tag(subject_digest: str, suffix: str = "att") -> str:
    """cosign's tag-based discovery: ``sha256:<hex>`` -> ``sha256-<hex>.att`` (attestations), ``.sig``."""
    return f"{referrers_tag(subject_digest)}.{suffix}"


def cosign_manifest(layers: list[tuple[dict, bytes]]) -> tuple[bytes, bytes]:
    """Pure: (config, manifest) bytes of cosign's attestation image: an OCI image manifest whose layers are
    the DSSE envelopes (each with its descriptor annotations), and an image config listing them as its
    uncompressed layers (``rootfs.diff_ids``), as go-containerregistry writes one for cosign."""
    digests = [digest_of(blob) for _ann, blob in layers]
    config = {
        "architecture": "",
        "config": {},
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"} for _ in layers],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": digests},
    }
    cfg = json.dumps(config, separators=(",", ":"), sort_keys=True).encode()
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": COSIGN_CONFIG_TYPE, "size": len(cfg), "digest": digest_of(cfg)},
        "layers": [
            {"mediaType": "application/vnd.dsse.envelope.v1+json", "size": len(blob), "digest": d, "annotations": ann}
            for (ann, blob), d in zip(layers, digests)
        ],
    }
    return cfg, json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def attach_cosign_attestation(
    client, repository: str, subject_digest: str, envelope: bytes, annotations: dict, replaces: tuple[str, str] | None
) -> str:
    """Add ``envelope`` to the subject's cosign attestation image (``sha256-<hex>.att``), the layout
    ``cosign attest --key`` writes and ``cosign verify-attestation`` / Kyverno read: the envelope a layer with
    ``dev.cosignproject.cosign/signature: ""`` and ``annotations`` (``predicateType``, …).  A layer whose
    annotation ``replaces[0]`` equals ``replaces[1]`` is replaced; every other layer (cosign's, other
    tools') is kept.  Returns the attestation image's manifest digest."""
    tag = cosign_tag(subject_digest)
    status, _h, body = client.request("GET", f"/v2/{repository}/manifests/{tag}", {"Accept": OCI_MANIFEST})
    kept: list[tuple[dict, bytes]] = []
    if status == 200:
        old = registry_json(body, f"the attestation image {tag}", client.registry)
        for layer in old.get("layers") or []:
            ann = layer.get("annotations") if isinstance(layer, dict) else None
            if not isinstance(ann, dict) or (replaces and ann.get(replaces[0]) == replaces[1]):
                continue
            st, _h, blob = client.request("GET", f"/v2/{repository}/blobs/{layer.get('digest')}")
            if st == 200 and digest_of(blob) == layer.get("digest"):
                kept.append((ann, blob))
    layers = [*kept, ({**annotations, COSIGN_SIGNATURE: ""}, envelope)]
    cfg, manifest = cosign_manifest(layers)
    upload_blob(client, repository, cfg)
    for _ann, blob in layers:
        upload_blob(client, repository, blob)
    status, _h, body = client.request(
        "PUT", f"/v2/{repository}/manifests/{tag}", {"Content-Type": OCI_MANIFEST}, manifest
    )
    _check(status, body, f"the attestation image {tag}", client.registry)
    return digest_of(manifest)


def list_referrers(client, repository: str, subject_digest: str) -> tuple[str, list[dict]]:
    """("api" | "tag-schema" | "none", descriptors) as a reader (oras discover) finds them."""
    status, _, body = client.request("GET", f"/v2/{repository}/referrers/{subject_digest}", {"Accept": OCI_INDEX})
    if status == 200:
        return "api", registry_json(body, f"the referrers of {subject_digest}", client.registry).get("manifests", [])
    status, _, body = client.request(
        "GET", f"/v2/{repository}/manifests/{referrers_tag(subject_digest)}", {"Accept": OCI_INDEX}
    )
    if status == 200:
        return "tag-schema", registry_json(body, f"the referrers index of {subject_digest}", client.registry).get(
            "manifests", []
        )
    return "none", []


CYCLONEDX_PREDICATE = "https://cyclonedx.org/bom"  # cosign attest --type cyclonedx
SIGNER_ANNOTATION = "org.build-image.signer"  # the fingerprint the signer claims (a hint; the signature decides)


def sbom_statement(sbom: bytes, name: str, digest: str) -> bytes:
    """Pure: the CycloneDX SBOM as an in-toto Statement v1 about ``name@digest`` (predicate type
    ``https://cyclonedx.org/bom``, as ``cosign attest --type cyclonedx`` writes it), to be signed."""
    try:
        predicate = load_json(sbom, f"the context's {SBOM_FILE}")
    except ValueError as exc:
        raise BadInput(f"the context's {SBOM_FILE} is not JSON ({exc}); it cannot be signed.") from None
    doc = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": name, "digest": {"sha256": digest.split(":", 1)[1]}}],
        "predicateType": CYCLONEDX_PREDICATE,
        "predicate": predicate,
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def _attach_signed(client, repository: str, subject: dict, statement: bytes, kind: str, title: str, signer) -> Attached:
    """``statement`` (an in-toto statement) signed by ``signer`` as a DSSE envelope: attached as a referrer
    (artifact type in-toto, the envelope its layer) and added to cosign's ``sha256-<hex>.att`` image."""
    envelope = signing.sign_envelope(statement, signer)
    ptype = str(json.loads(statement).get("predicateType"))
    layer_ann = {"predicateType": ptype, COSIGN_SIGNATURE: ""}
    ann = {KIND: kind, SIGNER_ANNOTATION: signer.fingerprint}
    att = attach(
        client,
        repository,
        subject,
        envelope,
        INTOTO_TYPE,
        title,
        ann,
        layer_type=signing.ENVELOPE_TYPE,
        layer_annotations=layer_ann,
    )
    attach_cosign_attestation(
        client, repository, subject["digest"], envelope, {"predicateType": ptype, KIND: kind}, replaces=(KIND, kind)
    )
    return att


def push_attestations(context: str | Path, pinned: str, tags: list[str], signer=None) -> dict:
    """After a push: record the registry digest as the provenance subject, then push the SBOM and the
    provenance as referrers of ``pinned`` (``HOST/REPO@sha256:…``).  With ``signer``
    (:class:`builder.signing.Signer`), the provenance and the SBOM (wrapped in an in-toto statement) are
    attached as signed DSSE envelopes too, where cosign stores key-signed attestations.  A registry that
    refuses them is reported (``pushed: false`` and why), not an error: the files stay in the context."""
    ctx = Path(context)
    client, ref = client_for(pinned)
    digest = ref.digest
    out: dict = {"subject": pinned, "files": {}}
    prov = provenance.record_subject(
        ctx, provenance.image_subject([f"{ref.registry}/{ref.repository}"], digest), stage="push"
    )
    docs = []
    if (ctx / SBOM_FILE).is_file():
        docs.append(("sbom", SBOM_TYPE, SBOM_FILE, (ctx / SBOM_FILE).read_bytes()))
    if prov is not None:
        docs.append(("provenance", INTOTO_TYPE, PROVENANCE_FILE, (ctx / PROVENANCE_FILE).read_bytes()))
    for key, _t, name, _b in docs:
        out["files"][key] = str(ctx / name)
    try:
        subject = subject_descriptor(client, ref.repository, digest)
        for key, atype, name, blob in docs:
            a = attach(client, ref.repository, subject, blob, atype, name, {KIND: key})
            out[key] = {
                "digest": a.digest,
                "artifactType": a.artifact_type,
                "ref": f"{ref.registry}/{ref.repository}@{a.digest}",
                "referrers": a.referrers,
            }
            if signer is not None:
                statement = (
                    blob if key == "provenance" else sbom_statement(blob, f"{ref.registry}/{ref.repository}", digest)
                )
                signed = _attach_signed(client, ref.repository, subject, statement, f"{key}-signed", name, signer)
                out[key]["signed"] = {"digest": signed.digest, "signer": signer.fingerprint}
        out["pushed"] = bool(docs)
        if docs:
            out["referrers"] = out[docs[0][0]]["referrers"]
            if out["referrers"] == "tag-schema":
                out["index"] = f"{ref.registry}/{ref.repository}:{referrers_tag(digest)}"
    except RegistryError as exc:
        out["pushed"] = False
        out["reason"] = exc.message
    return out


def summary_line(att: dict) -> str:
    """One line for the terminal: what the registry accepted, or why the files stayed local."""
    if att.get("pushed"):
        kinds = ", ".join(f"{k} {att[k]['digest'][:19]}…" for k in ("sbom", "provenance") if k in att)
        how = (
            "listed by its referrers API"
            if att.get("referrers") == "api"
            else f"indexed under the referrers tag {att.get('index')} (the registry has no referrers API)"
        )
        signed = [att[k]["signed"]["signer"] for k in ("sbom", "provenance") if "signed" in att.get(k, {})]
        sig = f"; signed by {signed[0]} (also under {cosign_tag(att['subject'].rsplit('@', 1)[-1])})" if signed else ""
        return f"attached to {att['subject']}: {kinds}; {how}{sig}"
    files = ", ".join(att.get("files", {}).values()) or "none"
    reason = str(att.get("reason") or "nothing to push").rstrip(".")
    return f"SBOM/provenance not pushed ({reason}); kept as files: {files}"
