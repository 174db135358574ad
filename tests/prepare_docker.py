"""Make ahead what the Docker tests read from the shared download cache, while other work runs
(``scripts/test.sh`` starts it beside the tests that need no engine): the stand-in base image
(debootstrap + a build on a fresh machine; the linux/arm64 one under QEMU), the stand-in find-links folders and the ray
wheelhouse of the ray-check tests, each downloaded from PyPI once.

Every item is made under its cache lock (tests/fx_cache.py) and only when it is not complete
yet, so a test fixture that needs one at the same time waits for it or finds it done; one that
fails here is made (and its failure reported) by its fixture again.  Exit status: the number of
items that failed.

    .venv/bin/python -m tests.prepare_docker
"""

from __future__ import annotations

import sys
import time


def _standin_base() -> None:
    from tests.fx_docker import make_standin_base

    proc = make_standin_base()
    if proc.returncode != 0:
        raise RuntimeError(f"make-standin-base.sh failed ({proc.returncode}):\n{proc.stderr[-2000:]}")


def _findlinks_plain() -> None:
    from tests.fx_docker import standin_findlinks

    standin_findlinks(())


def _findlinks_e2e() -> None:
    from tests.fx_docker import standin_findlinks
    from tests.test_image_e2e import OVERLAY

    standin_findlinks(tuple(OVERLAY))


def _standin_arm64() -> None:
    from tests.fx_docker import make_standin_base, qemu_arm64_ready

    if not qemu_arm64_ready():
        return  # the arm64 tests skip (or fail under BUILD_IMAGE_REQUIRE_DOCKER=1) and say why
    proc = make_standin_base("arm64")
    if proc.returncode != 0:
        raise RuntimeError(
            f"make-standin-base.sh --platform linux/arm64 failed ({proc.returncode}):\n{proc.stderr[-2000:]}"
        )


def _findlinks_platforms() -> None:
    from tests.fx_docker import standin_findlinks
    from tests.test_platforms_e2e import OVERLAY

    standin_findlinks(OVERLAY)


def _ray_wheelhouse() -> None:
    from tests.test_raycheck import ray_wheelhouse

    ray_wheelhouse()


# in order: the find-links folders hold the fake vllm wheel that the stand-in's script writes
STEPS = (
    ("ray wheelhouse", _ray_wheelhouse),
    ("stand-in base image", _standin_base),
    ("stand-in find-links", _findlinks_plain),
    ("stand-in find-links (e2e overlay)", _findlinks_e2e),
    ("stand-in find-links (two-platform overlay)", _findlinks_platforms),
    ("arm64 stand-in base image (QEMU)", _standin_arm64),
)


def main() -> int:
    from tests.fx_docker import engine_running

    if not engine_running():
        print("prepare-docker: no Docker engine: nothing prepared", flush=True)
        return 0
    failed = 0
    for name, step in STEPS:
        t0 = time.monotonic()
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - reported; the fixture makes it again
            failed += 1
            print(f"prepare-docker: {name} FAILED after {time.monotonic() - t0:.1f}s: {exc}", flush=True)
            continue
        print(f"prepare-docker: {name} ready in {time.monotonic() - t0:.1f}s", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
