"""What the tests build or download into the shared download cache (``builder.util.cache_dir()``,
``~/.cache/build-image`` unless ``BUILD_IMAGE_CACHE`` says otherwise), kept safe when several
processes want it at once: pytest-xdist workers of one run (each runs the session fixtures
itself) and two runs on one machine.

``cache_lock(name)`` holds ``<cache>/test-locks/<name>.lock`` (filelock) while one cached thing
is made; the others wait for it, then find it complete (each maker checks its ``.complete``
marker again once it holds the lock) and reuse it.  ``real_vllm_wheel(version, sha256=None)``
is the release's vllm wheel in the download cache, fetched once under such a lock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

LOCK_TIMEOUT_S = 3600  # the slowest maker (debootstrap + a docker build on a cold machine) is far below


def cache_root() -> Path:
    from builder.util import cache_dir

    return cache_dir()


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold the lock named ``name`` (one per cached thing) for the duration."""
    from filelock import FileLock

    path = cache_root() / "test-locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path), timeout=LOCK_TIMEOUT_S):
        yield


def real_vllm_wheel(version: str, sha256: str | None = None) -> Path:
    """vllm ``version``'s wheel from PyPI in the download cache (sha256-verified by ``builder.fetch``:
    ``sha256``, else the pin of the release's shipped patch series); a second process asking at the
    same time waits for the first download instead of repeating it."""
    from builder.events import SILENT
    from builder.fetch import vllm_wheel
    from builder.patching import series as P

    if sha256 is None:
        sha256 = P.load_series(P.series_dir_for(version), version).wheel_sha256
    with cache_lock(f"vllm-wheel-{version}"):
        return vllm_wheel(version, sha256, reporter=SILENT)
