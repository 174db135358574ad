"""Which ray goes into the default overlay for a vLLM release.

Ray's ``llm`` extra pins the vllm its ``ray.serve.llm`` integration is written
for (ray 2.58.1: ``vllm[audio]==0.26.0; extra == "llm"``).  The Serve
application can use Ray's own vLLM integration only with such a ray; with any
other it must start vLLM's own server (``vllm serve``) in one replica.

Rule (:func:`choose`): the newest ray release, installable on the base, whose
``llm`` extra pins exactly the image's vllm; when none does, ray is left to the
resolver (the newest that fits) and the Serve app uses its ``vllm-server``
fallback.  The choice and its reason are recorded in the lock header
(``# ray: ...``, ``# serve-backend: ...``).

:func:`llm_vllm_pin` and :func:`choose` are pure; :func:`ray_releases` reads the
index (through :mod:`builder.resolve.index`) for as few releases as the rule needs:
newest first, it stops at the first ray whose ``llm`` extra pins an older vllm
(ray releases move their pin forward).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag
from packaging.version import Version

from builder.resolve.index import Index, IndexFile, metadata_field

BACKEND_RAY_LLM = "ray-serve-llm"
BACKEND_FALLBACK = "vllm-server"
MAX_RELEASES_READ = 24  # ray releases whose metadata is read at most (newest first)


@dataclass(frozen=True)
class RayRelease:
    version: str
    llm_vllm: str | None  # the vllm version ray[llm] pins with ==, None when it pins none


@dataclass(frozen=True)
class RayChoice:
    requirement: str | None  # what the default overlay gets (None: leave ray to the resolver)
    version: str | None  # the chosen ray, None when the resolver picks
    backend: str  # BACKEND_RAY_LLM | BACKEND_FALLBACK
    reason: str

    def header(self) -> str:
        return f"{self.version or 'resolver'} ({self.reason})"


def llm_vllm_pin(requires_dist: Iterable[str]) -> str | None:
    """The vllm version a ray wheel's ``llm`` extra pins exactly (``==X``), else None (pure)."""
    for raw in requires_dist:
        if "vllm" not in raw.lower():  # not a requirement on vllm: not parsed (ray lists hundreds)
            continue
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            continue
        if req.name.lower() != "vllm" or req.marker is None:
            continue
        if not req.marker.evaluate({"extra": "llm"}) or req.marker.evaluate({"extra": ""}):
            continue
        pins = [s.version for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
        if len(pins) == 1:
            return pins[0]
    return None


def choose(vllm: str, releases: Iterable[RayRelease]) -> RayChoice:
    """The default ray for ``vllm`` from ``releases`` (any order) — see the module doc (pure)."""
    rels = sorted(releases, key=lambda r: Version(r.version), reverse=True)
    want = Version(vllm)
    for r in rels:
        if r.llm_vllm is not None and _v(r.llm_vllm) == want:
            return RayChoice(
                requirement=f"ray[serve]=={r.version}",
                version=r.version,
                backend=BACKEND_RAY_LLM,
                reason=f"ray[llm] {r.version} pins vllm=={r.llm_vllm}: the Serve app uses ray.serve.llm",
            )
    seen = ", ".join(f"{r.version}->{r.llm_vllm or 'none'}" for r in rels[:4]) or "no ray release found"
    return RayChoice(
        requirement=None,
        version=None,
        backend=BACKEND_FALLBACK,
        reason=f"no ray release's llm extra pins vllm=={vllm} (newest: {seen}); newest ray that fits, "
        "the Serve app starts `vllm serve` (its vllm-server fallback)",
    )


def _v(text: str) -> Version | None:
    try:
        return Version(text)
    except ValueError:  # InvalidVersion, or a part past int()'s digit limit
        return None


def ray_releases(index: Index, vllm: str, tags: list[Tag], exclude_newer: datetime | None = None) -> list[RayRelease]:
    """Ray releases with a wheel for ``tags``, newest first, read until one pins a vllm older than ``vllm``."""
    by_version: dict[Version, list[IndexFile]] = {}
    tagset = set(tags)
    for f in index.files("ray"):
        v = f.version
        if v is None or v.is_prerelease or v.is_devrelease or f.yanked:
            continue
        if exclude_newer is not None and f.upload_time is not None and f.upload_time > exclude_newer:
            continue
        if tagset.isdisjoint(f.tags):
            continue
        by_version.setdefault(v, []).append(f)
    want = Version(vllm)
    out: list[RayRelease] = []
    for v in sorted(by_version, reverse=True)[:MAX_RELEASES_READ]:
        pin = llm_vllm_pin(metadata_field(index.metadata(by_version[v][0]), "Requires-Dist"))
        out.append(RayRelease(version=str(v), llm_vllm=pin))
        pv = _v(pin) if pin else None
        if pv is not None and pv <= want:
            break
    return out


def backend_for(index: Index, ray_version: str, vllm: str | None, tags: list[Tag]) -> RayChoice:
    """The Serve backend a given ray supports for ``vllm`` (its ``llm`` extra's pin, read from the index)."""
    files = [f for f in index.files("ray") if f.version == Version(ray_version) and not set(tags).isdisjoint(f.tags)]
    pin = llm_vllm_pin(metadata_field(index.metadata(files[0]), "Requires-Dist")) if files else None
    if vllm is not None and pin is not None and _v(pin) == _v(vllm):
        return RayChoice(
            requirement=None,
            version=ray_version,
            backend=BACKEND_RAY_LLM,
            reason=f"ray[llm] {ray_version} pins vllm=={pin}: the Serve app uses ray.serve.llm",
        )
    return RayChoice(
        requirement=None,
        version=ray_version,
        backend=BACKEND_FALLBACK,
        reason=f"ray[llm] {ray_version} pins vllm=={pin or 'nothing'}, not {vllm}: "
        "the Serve app starts `vllm serve` (its vllm-server fallback)",
    )
