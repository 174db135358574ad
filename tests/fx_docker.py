"""Fixtures: Docker engine, local registry, stand-in base image (owned by the render/build work).

Session scoped; every docker-needing test should be marked ``@pytest.mark.slow``
and ``@pytest.mark.docker``.  Tests are *skipped* (not failed) when the engine or
the registry is not running, unless ``BUILD_IMAGE_REQUIRE_DOCKER=1`` (CI sets it),
in which case a missing engine is an error.

- ``docker_engine``: ``builder.engine.DockerEngine`` connected to the running engine.
- ``local_registry``: ``"127.0.0.1:5000"`` once ``/v2/`` answers.
- ``standin_base_image``: :class:`StandinBase` (``.ref``, ``.vllm_wheel``, ...) — the
  local stand-in for ``vllm/vllm-openai:v0.26.0`` built by scripts/make-standin-base.sh
  (Debian bookworm minbase + python3 3.11 + python3-numpy 1.x + a fake installed vllm 0.26.0).
- ``standin_manifest``: path of a base manifest snapshotted from that image (``base snapshot --image``).
- ``built_overlay_image``: factory ``(requirements: list[str], find_links=None) -> BuiltImage``:
  lock those requirements on the stand-in base, render, build; cached per requirement list
  for the session.  Use it to get e.g. an image with ``ray`` cheaply.
"""

from __future__ import annotations

import os
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKER = "/usr/bin/docker"
REGISTRY = "127.0.0.1:5000"
STANDIN_REF = "standin.local/vllm/vllm-openai:v0.26.0"
STANDIN_DATA = ROOT / "tests" / "data" / "standin"


@dataclass(frozen=True)
class StandinBase:
    ref: str                 # local image tag, "standin.local/vllm/vllm-openai:v0.26.0"
    vllm_wheel: Path         # the fake vllm 0.26.0 wheel installed in it (the patch series' source)
    python: str = "3.11"
    site_packages: str = "/usr/local/lib/python3.11/dist-packages"
    series_dir: Path = STANDIN_DATA / "patches"   # a test patch series that applies to the fake vllm

    def __str__(self) -> str:
        return self.ref


def _missing(reason: str):
    if os.environ.get("BUILD_IMAGE_REQUIRE_DOCKER") == "1":
        pytest.fail(reason + " (BUILD_IMAGE_REQUIRE_DOCKER=1)")
    pytest.skip(reason)


def engine_running() -> bool:
    try:
        return subprocess.run([DOCKER, "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def registry_running(addr: str = REGISTRY) -> bool:
    try:
        with urllib.request.urlopen(f"http://{addr}/v2/", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def docker_engine():
    if not engine_running():
        _missing("no Docker engine (start it with scripts/services.sh start)")
    from builder.engine import DockerEngine

    return DockerEngine()


@pytest.fixture(scope="session")
def local_registry() -> str:
    if not registry_running():
        _missing(f"no registry on {REGISTRY} (start it with scripts/services.sh start)")
    return REGISTRY


def _cache_dir() -> Path:
    from builder.util import cache_dir

    return cache_dir()


@pytest.fixture(scope="session")
def standin_base_image(docker_engine) -> StandinBase:
    env = dict(os.environ, BUILD_IMAGE_CACHE=str(_cache_dir()), DOCKER=DOCKER)
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "make-standin-base.sh"), STANDIN_REF],
        capture_output=True, text=True, env=env, timeout=1200,
    )
    if proc.returncode != 0:
        pytest.fail(f"make-standin-base.sh failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    wheel = _cache_dir() / "standin" / "vllm-0.26.0-py3-none-any.whl"
    assert wheel.is_file(), wheel
    return StandinBase(ref=STANDIN_REF, vllm_wheel=wheel)
