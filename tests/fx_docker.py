"""Fixtures: Docker engine, local registry, stand-in base image.

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
- ``standin_pinned_manifest``: the same after pushing the stand-in to the local registry (has a digest).
- ``built_overlay_image``: factory ``(requirements: list[str], find_links=None) -> BuiltImage``:
  lock those requirements on the stand-in base, render, build; cached per requirement list
  for the session.  Use it to get e.g. an image with ``ray`` cheaply.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fx_cache import cache_lock

ROOT = Path(__file__).resolve().parent.parent


def _docker_cli() -> str:
    """The CLI the tool itself runs (builder.engine.docker_cli); "docker" when there is none
    (the tests that need it are skipped then)."""
    from builder.engine import docker_cli
    from builder.errors import EngineUnavailable

    try:
        return docker_cli()
    except EngineUnavailable:
        return "docker"


DOCKER = _docker_cli()
REGISTRY = "127.0.0.1:5000"
STANDIN_REF = "standin.local/vllm/vllm-openai:v0.26.0"
# the arm64 stand-in: another tag (Docker's classic image store keeps one image per tag)
STANDIN_ARM64_REF = "standin.local/vllm/vllm-openai:v0.26.0-linux-arm64"
STANDIN_DATA = ROOT / "tests" / "data" / "standin"


@dataclass(frozen=True)
class StandinBase:
    ref: str  # local image tag, "standin.local/vllm/vllm-openai:v0.26.0"
    vllm_wheel: Path  # the fake vllm 0.26.0 wheel installed in it (the patch series' source)
    python: str = "3.11"
    site_packages: str = "/usr/local/lib/python3.11/dist-packages"
    series_dir: Path = STANDIN_DATA / "patches"  # a test patch series that applies to the fake vllm

    def __str__(self) -> str:
        return self.ref


def missing(reason: str):
    """Skip the test for a missing engine, registry or tool it needs, or fail it where
    ``BUILD_IMAGE_REQUIRE_DOCKER=1`` says these are meant to be there (CI, scripts/test.sh)."""
    if os.environ.get("BUILD_IMAGE_REQUIRE_DOCKER") == "1":
        pytest.fail(reason + " (BUILD_IMAGE_REQUIRE_DOCKER=1)")
    pytest.skip(reason)


_missing = missing


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


def make_standin_base(arch: str = "amd64") -> subprocess.CompletedProcess:
    """scripts/make-standin-base.sh (idempotent: nothing to do when the image is up to date), one
    build of the tag at a time (xdist workers, concurrent runs, tests/prepare_docker.py).
    ``arch="arm64"``: the linux/arm64 stand-in (debootstrap's second stage and the build's RUN
    steps under QEMU on an x86_64 host), tagged :data:`STANDIN_ARM64_REF`."""
    env = dict(os.environ, BUILD_IMAGE_CACHE=str(_cache_dir()), DOCKER=DOCKER)
    ref = STANDIN_REF if arch == "amd64" else STANDIN_ARM64_REF
    with cache_lock("standin-base" if arch == "amd64" else f"standin-base-{arch}"):
        return subprocess.run(
            ["bash", str(ROOT / "scripts" / "make-standin-base.sh"), "--platform", f"linux/{arch}", ref],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )


def qemu_arm64_ready() -> bool:
    """Can this host run linux/arm64 binaries: it is aarch64, or binfmt_misc has qemu-aarch64 (services.sh install)."""
    return os.uname().machine == "aarch64" or Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists()


@pytest.fixture(scope="session")
def standin_base_image(docker_engine) -> StandinBase:
    proc = make_standin_base()
    if proc.returncode != 0:
        pytest.fail(f"make-standin-base.sh failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    wheel = _cache_dir() / "standin" / "vllm-0.26.0-py3-none-any.whl"
    assert wheel.is_file(), wheel
    return StandinBase(ref=STANDIN_REF, vllm_wheel=wheel)


@pytest.fixture(scope="session")
def standin_arm64_base_image(docker_engine) -> StandinBase:
    """The linux/arm64 stand-in (same recipe as :func:`standin_base_image`, built under QEMU; cached)."""
    if not qemu_arm64_ready():
        _missing(
            "this host cannot run linux/arm64 binaries: no qemu-aarch64 in binfmt_misc "
            "(scripts/services.sh install registers it)"
        )
    proc = make_standin_base("arm64")
    if proc.returncode != 0:
        pytest.fail(f"make-standin-base.sh --platform linux/arm64 failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    wheel = _cache_dir() / "standin" / "vllm-0.26.0-py3-none-any.whl"
    return StandinBase(ref=STANDIN_ARM64_REF, vllm_wheel=wheel)


# --------------------------------------------------------------------------- overlays on the stand-in
VENV_BIN = Path(__import__("sys").executable).parent
BUILD_IMAGE = str(VENV_BIN / "build-image")
# every distribution of the stand-in base except vllm (the lock resolves the base pins too)
STANDIN_PINS = (
    "numpy==1.24.2",
    "numexpr==2.8.4",
    "packaging==23.0",
    "pip==23.0.1",
    "setuptools==66.1.1",
    "wheel==0.38.4",
)
_PIP_TARGET = [
    "--only-binary=:all:",
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
    "--abi",
    "cp311",
    "--platform",
    "manylinux2014_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_34_x86_64",
]


def standin_findlinks(requirements: list[str] | tuple[str, ...] = ()) -> Path:
    """A --find-links folder for locking ``requirements`` on the stand-in base offline (--no-index).

    Holds the stand-in's fake vllm wheel, wheels for every other base pin (numpy 1.24.2 ...),
    and ``requirements`` with their dependencies for CPython 3.11 / manylinux x86_64 (downloaded
    once from PyPI with pip, constrained to the base's versions; cached by requirement list + pins).
    Why offline: PyPI's real vllm 0.26.0 needs numpy>=1.25, which Debian bookworm's 1.24.2 is not.
    """
    import hashlib

    key = hashlib.sha256("\n".join(sorted(requirements) + ["--pins--", *STANDIN_PINS]).encode()).hexdigest()[:12]
    root = _cache_dir() / "standin" / f"findlinks-{key}"
    if (root / ".complete").exists():
        return root
    with cache_lock(f"standin-findlinks-{key}"):
        if (root / ".complete").exists():  # made by another process while this one waited
            return root
        return _make_findlinks(root, requirements)


def _make_findlinks(root: Path, requirements: list[str] | tuple[str, ...]) -> Path:
    import shutil

    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    pip = [str(VENV_BIN / "python"), "-m", "pip", "download", "-q", "--disable-pip-version-check", "-d", str(tmp)]
    r = subprocess.run(pip + ["--no-deps", *_PIP_TARGET, *STANDIN_PINS], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    if requirements:
        cons = tmp / "constraints.txt"
        cons.write_text("".join(p + "\n" for p in STANDIN_PINS))  # stay compatible with the base
        r = subprocess.run(
            pip + [*_PIP_TARGET, "-c", str(cons), *requirements], capture_output=True, text=True, timeout=1800
        )
        cons.unlink()
        assert r.returncode == 0, r.stderr[-2000:]
    wheel = _cache_dir() / "standin" / "vllm-0.26.0-py3-none-any.whl"
    shutil.copyfile(wheel, tmp / wheel.name)
    (tmp / ".complete").write_text("ok\n")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return root


@pytest.fixture(scope="session")
def standin_manifest(standin_base_image, tmp_path_factory) -> Path:
    """Base manifest read from the stand-in image with `build-image base snapshot --image`."""
    out = tmp_path_factory.mktemp("standin-manifest") / "standin.json"
    r = subprocess.run(
        [BUILD_IMAGE, "base", "snapshot", "--image", standin_base_image.ref, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="session")
def standin_pinned_manifest(standin_base_image, local_registry, tmp_path_factory) -> Path:
    """Like ``standin_manifest`` but with a digest: the stand-in is pushed to the local registry as
    ``127.0.0.1:5000/vllm/vllm-openai:v0.26.0`` first, so the Dockerfile's FROM is ``ref@sha256:...``."""
    ref = f"{local_registry}/vllm/vllm-openai:v0.26.0"
    for args in (["tag", standin_base_image.ref, ref], ["push", "-q", ref]):
        r = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
    out = tmp_path_factory.mktemp("standin-pinned") / "standin-pinned.json"
    r = subprocess.run(
        [BUILD_IMAGE, "base", "snapshot", "--image", ref, "-o", str(out)], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["image"]["digest"], "the snapshot has no digest"
    return out


@dataclass
class BuiltImage:
    tags: list[str]
    image_id: str
    context: Path
    lock: Path
    summary: dict
    manifest: Path | None = None


def run_pipeline(args: list[str], *, env: dict | None = None, timeout: int = 1800) -> subprocess.CompletedProcess:
    """``build-image ARGS`` as a subprocess (the real CLI, the real engine)."""
    return subprocess.run(
        [BUILD_IMAGE, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {}))
    )


@pytest.fixture(scope="session")
def built_overlay_image(standin_base_image, standin_manifest, tmp_path_factory):
    """Factory ``(requirements, *, series=None, repo=..., manifest=None) -> BuiltImage``: lock ``requirements``
    on the stand-in base (offline, see :func:`standin_findlinks`), render, build.  Cached per
    (requirements, series, repo) for the session.  ``series=None``: no patches (``--no-patches``).
    E.g. ``built_overlay_image(["ray[serve]==2.52.0"])`` gives an image with ray on the stand-in base."""
    cache: dict = {}

    def _build(
        requirements,
        *,
        series: Path | None = None,
        repo: str = "build-image-test/overlay",
        manifest: Path | None = None,
    ) -> BuiltImage:
        key = (tuple(requirements), str(series), repo, str(manifest))
        if key in cache:
            return cache[key]
        fl = standin_findlinks(tuple(requirements))
        work = tmp_path_factory.mktemp("overlay")
        args = [
            "--vllm",
            "0.26.0",
            "--base",
            str(manifest or standin_manifest),
            "--lock",
            str(work / "requirements.lock"),
            "--no-default-overlay",
            "--no-index",
            "--find-links",
            str(fl),
            "-o",
            str(work / "ctx"),
            "--tag",
            repo,
            "--json",
        ]
        for req in requirements:
            args += ["--with", req]
        if series is not None:
            args += ["--series", str(series), "--wheel", str(standin_base_image.vllm_wheel)]
        else:  # not the repository's real vllm series: the stand-in's vllm is a fake
            args += ["--no-patches"]
        r = run_pipeline(args)
        assert r.returncode == 0, f"pipeline failed ({r.returncode}):\n{r.stderr[-4000:]}"
        summary = json.loads(r.stdout)
        built = BuiltImage(
            tags=summary["tags"],
            image_id=summary["image_id"],
            context=work / "ctx",
            lock=work / "requirements.lock",
            summary=summary,
            manifest=manifest or standin_manifest,
        )
        cache[key] = built
        return built

    return _build
