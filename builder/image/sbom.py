"""CycloneDX 1.6 SBOM of the image's Python layer, with ``cyclonedx-python-lib``.

A pure function of what render already knows (:class:`SbomInput`): every distribution of
the base (from the base manifest, with its binary facts as properties), every overlay
package (from the lock: purl, the installed wheel's sha256 and URL), the base image
(reference and digest) as the ancestor of the image component, and the vllm component's
pedigree: the unpatched wheel as its ancestor, each patch of the series (name, sha256,
diff text) and each patched file (its sha256 after the series, the wheel's original as a
property) as a sub-component.  A distribution the overlay moves appears once, at the
version the image installs, with the base's version as its ancestor.

The document is deterministic (serial number derived from the contents, timestamp from
``SOURCE_DATE_EPOCH``): the same inputs give the same bytes, so the image layer that
carries it (``/usr/share/build-image/sbom.cdx.json``) is a cache hit on a rebuild.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import uuid
import warnings
from dataclasses import dataclass, field

from builder import __version__
from builder.credentials import redact_text, redact_url  # a lock written before redaction keeps no secret in it
from builder.patching.series import PatchedFile
from builder.resolve.lockfile import LockEntry, LockFile
from builder.resolve.manifest import BaseManifest, Distribution
from builder.util import canonical_name

IMAGE_SBOM_PATH = "/usr/share/build-image/sbom.cdx.json"
PROP = "build-image"


@dataclass
class SbomInput:
    vllm: str
    base: BaseManifest
    lock: LockFile
    image_name: str  # repository (no tag)
    image_version: str  # the content-addressed tag
    patched: list[PatchedFile] = field(default_factory=list)
    patches: list[str] = field(default_factory=list)  # names, series order
    patch_texts: dict[str, str] = field(default_factory=dict)  # name -> patch file text
    vllm_wheel: tuple[str, str] | None = None  # (file name, sha256) the series is made for
    source_date_epoch: int = 0
    base_manifest: str | None = None  # where the manifest came from when the pipeline snapshotted the base


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _props(pairs):
    from cyclonedx.model import Property

    return [Property(name=f"{PROP}:{k}", value=str(v)) for k, v in pairs if v is not None and v != ""]


def _facts_props(facts, source: str):
    return _props(
        [
            ("source", source),
            ("binary", str(facts.binary).lower()),
            ("extensions", facts.extensions),
            ("numpy-abi", f"{facts.numpy_abi.get('1', 0)}/{facts.numpy_abi.get('2', 0)}"),
            ("glibc", facts.glibc),
            ("python-abi", facts.python_abi),
        ]
    )


def _pypi_purl(name: str, version: str, file_name: str | None = None):
    from packageurl import PackageURL

    return PackageURL(
        type="pypi",
        name=canonical_name(name),
        version=version,
        qualifiers={"file_name": file_name} if file_name else None,
    )


def _ref(name: str, version: str) -> str:
    return f"pkg:pypi/{canonical_name(name)}@{version}"


def _base_component(d: Distribution, ref: str | None = None):
    from cyclonedx.model.component import Component, ComponentType

    return Component(
        type=ComponentType.LIBRARY,
        name=d.name,
        version=d.version,
        bom_ref=ref or _ref(d.name, d.version),
        purl=_pypi_purl(d.name, d.version),
        properties=_facts_props(d.facts, "base-image"),
    )


def _overlay_component(e: LockEntry, base: BaseManifest):
    from cyclonedx.model import ExternalReference, ExternalReferenceType, HashAlgorithm, HashType, XsUri
    from cyclonedx.model.component import Component, ComponentType, Pedigree

    hashes, refs, fname = [], [], None
    if e.wheel is not None:
        fname = e.wheel.filename
        hashes = [HashType(alg=HashAlgorithm.SHA_256, content=e.wheel.sha256)]

        url = redact_url(e.wheel.url.split("#")[0])
        if url.startswith(("https://", "http://")):
            refs = [ExternalReference(type=ExternalReferenceType.DISTRIBUTION, url=XsUri(url), hashes=hashes)]
    pedigree = None
    moved = base.get(e.key)
    if moved is not None:  # the overlay replaces the base's version of this distribution
        pedigree = Pedigree(
            ancestors=[_base_component(moved, ref=f"base:{_ref(moved.name, moved.version)}")],
            notes=f"replaces {moved.name} {moved.version} of the base image",
        )
    return Component(
        type=ComponentType.LIBRARY,
        name=e.name,
        version=e.version,
        bom_ref=_ref(e.name, e.version),
        purl=_pypi_purl(e.name, e.version, fname),
        hashes=hashes,
        external_references=refs,
        pedigree=pedigree,
        properties=_facts_props(e.facts, "overlay") + _props([("wheel", fname), ("moves-base", e.base_version)]),
    )


def _vllm_pedigree(inp: SbomInput, vllm: Distribution):
    """vllm's pedigree: the unpatched wheel, the patches, the patched files."""
    from cyclonedx.model import AttachedText, HashAlgorithm, HashType
    from cyclonedx.model.component import Component, ComponentType, Diff, Patch, PatchClassification, Pedigree

    ancestors = []
    if inp.vllm_wheel:
        fname, sha = inp.vllm_wheel
        ancestors.append(
            Component(
                type=ComponentType.LIBRARY,
                name="vllm",
                version=vllm.version,
                bom_ref=f"upstream:{_ref('vllm', vllm.version)}",
                purl=_pypi_purl("vllm", vllm.version, fname),
                hashes=[HashType(alg=HashAlgorithm.SHA_256, content=sha)],
                properties=_props([("source", "pypi"), ("wheel", fname)]),
            )
        )
    patches = []
    for name in inp.patches:
        text = inp.patch_texts.get(name)
        diff = Diff(text=AttachedText(content=text, content_type="text/x-diff")) if text is not None else None
        patches.append(Patch(type=PatchClassification.UNOFFICIAL, diff=diff))
    sums = ", ".join(f"{n} sha256:{_sha(inp.patch_texts[n])}" for n in inp.patches if n in inp.patch_texts)
    notes = f"patched by build-image's series for vllm {inp.vllm}: {', '.join(inp.patches)}" + (
        f" ({sums})" if sums else ""
    )
    files = [
        Component(
            type=ComponentType.FILE,
            name=p.relpath,
            bom_ref=f"file:{p.relpath}",
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=p.patched_sha256)],
            properties=_props([("original-sha256", p.original_sha256), ("patched", "true")]),
        )
        for p in sorted(inp.patched, key=lambda p: p.relpath)
    ]
    return Pedigree(ancestors=ancestors, patches=patches, notes=notes), files


def _base_image(base: BaseManifest):
    from cyclonedx.model import HashAlgorithm, HashType
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    ref = (base.image_ref or "").split("@")[0]
    repo, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "")
    digest = base.image_digest
    qualifiers = {"repository_url": repo if "/" in repo and "." in repo.split("/")[0] else f"docker.io/{repo}"}
    if tag:
        qualifiers["tag"] = tag
    purl = (
        PackageURL(type="oci", name=repo.rsplit("/", 1)[-1], version=digest, qualifiers=qualifiers) if digest else None
    )
    return Component(
        type=ComponentType.CONTAINER,
        name=repo,
        version=tag or None,
        bom_ref=f"base-image:{ref}",
        purl=purl,
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=digest.split(":", 1)[1])] if digest else [],
        properties=_props(
            [
                ("digest", digest or "unknown (manifest reconstructed, not read from a pinned image)"),
                ("python", base.python_version),
                ("platform", base.platform),
                ("cuda", base.cuda),
                ("os", base.os),
            ]
        ),
    )


def build_bom(inp: SbomInput):
    """The :class:`cyclonedx.model.bom.Bom` (pure)."""
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentType, Pedigree
    from cyclonedx.model.tool import ToolRepository

    overlay = {e.key: e for e in inp.lock.entries}
    components = []
    for key, d in sorted(inp.base.distributions.items()):
        if key in overlay:
            continue  # listed once, at the version the image installs (its ancestor is the base's)
        c = _base_component(d)
        if key == "vllm" and (inp.patches or inp.patched):
            c.pedigree, files = _vllm_pedigree(inp, d)
            c.components = files
            c.properties.update(_props([("patched", "true"), ("patch-series", ",".join(inp.patches))]))
        components.append(c)
    components += [_overlay_component(e, inp.base) for e in sorted(inp.lock.entries, key=lambda e: e.key)]

    image = Component(
        type=ComponentType.CONTAINER,
        name=inp.image_name,
        version=inp.image_version,
        bom_ref=f"image:{inp.image_name}:{inp.image_version}",
        pedigree=Pedigree(ancestors=[_base_image(inp.base)], notes="built FROM the base image (its parent)"),
        properties=_props(
            [
                ("vllm", inp.vllm),
                ("lock-hash", inp.lock.lock_hash),
                ("overlay", ", ".join(inp.lock.overlay)),
                ("base-manifest-sha256", inp.lock.header.get("base-manifest-sha256")),
                ("base-manifest", inp.base_manifest),
            ]
        ),
    )
    tool = Component(type=ComponentType.APPLICATION, name="build-image", version=__version__)
    ts = _dt.datetime.fromtimestamp(int(inp.source_date_epoch), tz=_dt.timezone.utc)
    seed = json.dumps(
        [
            inp.image_name,
            inp.image_version,
            inp.lock.lock_hash,
            inp.base.image_digest,
            [(p.relpath, p.patched_sha256) for p in inp.patched],
            {n: _sha(t) for n, t in inp.patch_texts.items()},
            __version__,
        ],
        sort_keys=True,
    )
    bom = Bom(
        components=components,
        serial_number=uuid.uuid5(uuid.NAMESPACE_URL, "build-image-sbom:" + seed),
        metadata=BomMetaData(
            component=image,
            timestamp=ts,
            tools=ToolRepository(components=[tool]),
            properties=_props([("python", inp.base.python_version), ("site-packages", inp.base.site_packages)]),
        ),
    )
    bom.register_dependency(image, components)
    return bom


def sbom_json(inp: SbomInput) -> str:
    """The SBOM as CycloneDX 1.6 JSON text (deterministic)."""
    from cyclonedx.output.json import JsonV1Dot6

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the library warns about components without dependencies
        text = JsonV1Dot6(build_bom(inp)).output_as_string(indent=1)
    return redact_text(text if text.endswith("\n") else text + "\n")  # the file rule: no credential in it


def validate(text: str) -> list[str]:
    """Schema errors of a CycloneDX 1.6 JSON document (the library's strict validator); [] when valid."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    errors = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text, all_errors=True)
    if errors is None:
        return []
    if not isinstance(errors, (list, tuple)):
        errors = list(errors) if hasattr(errors, "__iter__") and not hasattr(errors, "data") else [errors]
    return [str(getattr(e, "data", e)) for e in errors]
