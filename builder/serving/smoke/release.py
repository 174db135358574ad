"""``smoke --vllm X``: what the shipped release X gives the smoke test.

The default lock of X (``lockfiles/vllm-X/requirements.lock``) names the image the
pipeline tags for it (``build-image/vllm-serving:vllmX-<lock hash>``) and the Serve
backend the lock chose; the patch series of X (``patches/vllm/X``), when one is
shipped, is what that image carries.  :func:`resolve_release` reads them (files of
this checkout only) into a :class:`Release` the report records; an X this checkout
ships no base manifest for is exit 2 naming the known releases.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from builder.errors import BadInput
from builder.image.naming import default_repo, image_tags, serve_backend_of
from builder.patching.series import load_series, series_dir_for
from builder.resolve.lockfile import load_lock
from builder.serving.plan import release_facts
from builder.spec import default_lock_path


@dataclass(frozen=True)
class Release:
    vllm: str
    default_gpu_memory_utilization: float
    kv_cache_dtypes: tuple[str, ...]
    lock: str | None = None  # the default lock's path (None: none committed)
    lock_hash: str | None = None
    image: str | None = None  # the content-addressed tag the pipeline gives its image
    serve_backend: str | None = None  # the lock's serve-backend
    ray: str | None = None  # the lock's ray line
    patch_series: str | None = None  # patches/vllm/X, when shipped
    patches: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kv_cache_dtypes"] = list(self.kv_cache_dtypes)
        return d


def resolve_release(vllm: str, *, repo: str | None = None) -> Release:
    """The release's facts, default lock, default image tag and patch series (BadInput for an unknown X)."""
    facts = release_facts(vllm)
    kw: dict[str, Any] = {}
    lock_path = default_lock_path(vllm)
    if lock_path.is_file():
        lock = load_lock(lock_path)
        kw.update(
            lock=str(lock_path),
            lock_hash=lock.lock_hash,
            serve_backend=serve_backend_of(lock),
            ray=lock.header.get("ray"),
            image=image_tags(repo or default_repo(), vllm, lock.lock_hash)[0],
        )
    try:
        series = load_series(series_dir_for(vllm), vllm)
    except BadInput:
        pass  # no series shipped for X: the report says none
    else:
        kw.update(patch_series=str(series.dir), patches=[p.name for p in series.patches])
    return Release(
        vllm=facts.vllm,
        default_gpu_memory_utilization=facts.default_gpu_memory_utilization,
        kv_cache_dtypes=facts.kv_cache_dtypes,
        **kw,
    )


def check_image_release(labels: dict[str, str], image: str, vllm: str) -> None:
    """An image built by build-image names its vllm in a label: one for another release is refused."""
    have = labels.get("org.build-image.vllm")
    if have and have != vllm:
        raise BadInput(
            f"smoke: image {image} is a vllm {have} image (label org.build-image.vllm), but --vllm {vllm} was given.",
            hint=f"drop --vllm, or smoke the vllm {vllm} image (`build-image smoke --vllm {vllm}` "
            "picks the default lock's tag).",
        )
