"""The one resolver of base inputs: what ``--base`` (or the spec's ``base``) names.

Rule, the same for every command (``lock``, ``render``, ``plan``, ``diff``, the
pipeline, ``kuberay``):

1. **nothing given** -> the shipped manifest for ``--vllm X``:
   ``lockfiles/base/vllm-openai-vX.json`` of the checkout the command runs in
   (see :func:`builder.spec.lockfiles_dir`); an X with no shipped manifest is
   exit 2 listing the known releases and how to add one;
2. **a value ending in ``.json``, or naming an existing file** -> that base
   manifest file (relative paths are relative to the current directory, flags and
   spec alike); a missing or malformed file is exit 2 naming it;
3. **anything else** -> a reference to a LOCAL container image, snapshotted
   through the engine (never pulled): exit 2 when the reference is malformed,
   exit 8 when no engine answers.

:func:`resolve_base` returns a :class:`ResolvedBase` (the manifest, the bytes the
lock's inputs hash covers, a label for messages, whether it is the shipped default).
:func:`vllm_on_base` is the one rule for ``--vllm X`` against a base: a base
with another vllm is exit 2 naming both; a base without vllm gets ``vllm==X``
in the overlay.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder import platforms as P
from builder.errors import BadInput
from builder.platforms import DEFAULT, Platform
from builder.resolve.base import snapshot_image
from builder.resolve.manifest import BaseManifest, load_manifest, parse_manifest
from builder.spec import check_vllm_version, default_base_manifest


@dataclass
class ResolvedBase:
    manifest: BaseManifest
    data: bytes  # the manifest file's bytes, or the snapshot's JSON: what the lock's inputs hash covers
    label: str  # for messages: the path or the image reference
    kind: str  # "default" | "manifest" | "image"
    path: Path | None = None  # the manifest file, when the base is one

    @property
    def is_default(self) -> bool:
        return self.kind == "default"

    @property
    def vllm(self) -> str | None:
        d = self.manifest.get("vllm")
        return d.version if d is not None else None


def classify(value: str | None) -> str:
    """``"default"`` / ``"manifest"`` / ``"image"`` for a --base value (pure but for one ``exists``)."""
    if not value:
        return "default"
    if value.endswith(".json") or Path(value).is_file():
        return "manifest"
    return "image"


def base_platform(manifest: BaseManifest, label: str) -> Platform:
    """The image platform a base manifest describes (its uv ``platform``: ``aarch64-manylinux_2_39``)."""
    return P.from_uv_platform(manifest.platform, where=f"base {label}: platform")


def check_base_platform(manifest: BaseManifest, label: str, platform: Platform) -> None:
    """:class:`BadInput` (exit 2) when the base describes another platform's image than the one asked for:
    a lock made against it would describe one image while the build installs into the other."""
    have = base_platform(manifest, label)
    if have != platform:
        raise BadInput(
            f"the base {label} describes a {have.name} image ({manifest.platform}), but the lock is "
            f"for {platform.name}: a lock and its base must be of one platform.",
            hint=f"give the {platform.name} manifest of that image (--platform {have.name} builds "
            f"for the one this base describes).",
        )


def resolve_base(
    value: str | None, vllm: str, *, snapshot=None, kind: str | None = None, platform: Platform = DEFAULT
) -> ResolvedBase:
    """Resolve a ``--base`` value (None: the shipped default for ``vllm`` and ``platform``) — see the module doc.

    ``snapshot(ref) -> BaseManifest`` makes the manifest of a local image (default:
    :func:`builder.resolve.base.snapshot_image`); ``kind``: what :func:`classify` said of
    ``value``, when the caller asked it already.  A manifest of another platform's image is exit 2."""
    kind = kind or classify(value)
    if kind == "default":
        check_vllm_version(vllm, platform=platform)
        p = default_base_manifest(vllm, platform)
        resolved = ResolvedBase(manifest=load_manifest(p), data=p.read_bytes(), label=str(p), kind=kind, path=p)
    elif kind == "manifest":
        p = Path(value)
        if not p.is_file():
            raise BadInput(
                f"base manifest {p} does not exist (a --base value ending in .json names a manifest file).",
                hint="make one with `build-image base snapshot` or `build-image base reconstruct`.",
            )
        manifest = load_manifest(p)
        resolved = ResolvedBase(manifest=manifest, data=p.read_bytes(), label=str(p), kind=kind, path=p)
    else:
        return _snapshot_base(value, kind, snapshot, platform)
    check_base_platform(resolved.manifest, resolved.label, platform)
    return resolved


def _snapshot_base(value: str, kind: str, snapshot, platform: Platform) -> ResolvedBase:
    if snapshot is None:
        snapshot = snapshot_image
    manifest = snapshot(value)
    check_base_platform(manifest, value, platform)
    text = manifest.to_json()
    parse_manifest(text, value)  # round-trip check: what is hashed is what is read back
    return ResolvedBase(manifest=manifest, data=text.encode(), label=value, kind=kind)


def vllm_on_base(base: ResolvedBase, vllm: str) -> str | None:
    """The requirement ``--vllm X`` adds to the overlay (``vllm==X`` on a base without vllm), or None
    when the base ships vllm X; a base shipping another vllm is :class:`BadInput` naming both."""
    have = base.vllm
    if have is None:
        return f"vllm=={vllm}"
    from packaging.version import Version

    try:
        same = Version(have) == Version(vllm)
    except ValueError:  # InvalidVersion, or a part past int()'s digit limit
        same = have == vllm
    if not same:
        raise BadInput(
            f"--vllm {vllm} does not match the base {base.label}, which ships vllm {have}: the overlay never "
            "replaces the base's vllm.",
            hint=f"use --vllm {have} on this base, or the base for vllm {vllm} "
            f"(lockfiles/base/vllm-openai-v{vllm}.json; `build-image base list` shows the shipped ones).",
        )
    return None
