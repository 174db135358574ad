"""Integration tests of `build-image lock` against PyPI (slow: network, real wheels)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder.resolve.lockfile import load_lock
from builder.resolve.manifest import load_manifest
from builder.util import project_root
from tests.conftest import run

pytestmark = pytest.mark.slow

ROOT = project_root()
MANIFEST = ROOT / "lockfiles" / "base" / "vllm-openai-v0.26.0.json"
COMMITTED_LOCK = ROOT / "lockfiles" / "vllm-0.26.0" / "requirements.lock"


@pytest.fixture(scope="module")
def default_lock(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("deflock") / "requirements.lock"
    code, text = run("lock", "--vllm", "0.26.0", "-o", str(out))
    assert code == 0, text
    return out


def test_default_lock_leaves_every_base_version_unchanged(default_lock):
    base = load_manifest(MANIFEST)
    lock = load_lock(default_lock)
    assert lock.header["vllm"] == "0.26.0" and lock.header["base-ref"] == base.image_ref
    assert lock.header["python"] == base.python_version and lock.header["platform"] == base.platform
    assert lock.overlay == ["ray[serve]"]
    moved = [(e.name, e.base_version, e.version) for e in lock.entries if base.get(e.name) is not None]
    assert moved == [], f"base distributions moved: {moved}"
    names = lock.by_name()
    assert "ray" in names
    # ray per release: the newest ray whose ray[llm] pins vllm 0.26.0
    assert names["ray"].version == "2.58.1" and lock.header["serve-backend"] == "ray-serve-llm"
    for e in lock.entries:
        assert e.wheel is not None and e.wheel.url.startswith("https://")
        assert e.wheel.sha256 in e.hashes
    assert names["ray"].facts.binary and names["ray"].facts.python_abi == "cp312"


def test_check_fresh_then_stale_after_an_input_changes(default_lock):
    before = default_lock.read_bytes()
    assert run("lock", "--vllm", "0.26.0", "-o", str(default_lock), "--check")[0] == 0
    code, text = run("lock", "--vllm", "0.26.0", "--with", "ray[serve,tune]", "-o", str(default_lock), "--check")
    assert code == 5, text
    assert default_lock.read_bytes() == before


def test_committed_default_lock_is_fresh():
    """lockfiles/vllm-0.26.0/requirements.lock matches the committed manifest and this tool."""
    code, text = run("lock", "--vllm", "0.26.0", "-o", str(COMMITTED_LOCK), "--check")
    assert code == 0, f"regenerate it with `build-image lock --vllm 0.26.0 --upgrade`: {text}"


@pytest.fixture(scope="module")
def pyarrow14_base(tmp_path_factory) -> Path:
    """A base made with --site-packages from real pyarrow 14.0.2 + numpy 1.26.4 wheels (cp312)."""
    d = tmp_path_factory.mktemp("pa14")
    sp = d / "site-packages"
    cmd = [
        str(Path(sys.executable).with_name("uv")),
        "pip",
        "install",
        "--quiet",
        "--target",
        str(sp),
        "--python",
        sys.executable,
        "--python-version",
        "3.12",
        "--python-platform",
        "x86_64-manylinux_2_35",
        "--no-build",
        "--no-deps",
        "pyarrow==14.0.2",
        "numpy==1.26.4",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"})
    assert r.returncode == 0, r.stderr
    out = d / "base.json"
    code, text = run(
        "base", "snapshot", "--site-packages", str(sp), "--python", "3.12", "--glibc", "2.35", "-o", str(out)
    )
    assert code == 0, text
    pa = load_manifest(out).get("pyarrow")
    assert pa.facts.numpy_abi["1"] >= 1 and pa.facts.numpy_abi["2"] == 0
    return out


def test_numpy2_overlay_on_numpy1_binary_base_is_refused(pyarrow14_base, tmp_path):
    out = tmp_path / "r.lock"
    base = [
        "lock",
        "--base",
        str(pyarrow14_base),
        "--no-default-overlay",
        "--exclude-newer",
        "2026-07-25",
        "--with",
        "opencv-python-headless>=4.12",
        "-o",
        str(out),
    ]
    code, text = run(*base)
    assert code == 4, text
    assert "numpy==1.26.4 is pinned by the base; pyarrow 14.0.2 there has" in text
    assert "built against numpy 1.x" in text and "opencv-python-headless" in text
    code, text = run(*base, "--with", "numpy>=2")
    assert code == 3, text
    assert "[numpy-abi] numpy 1.26.4 -> 2." in text
    assert "evidence: pyarrow 14.0.2:" in text and "built against numpy 1.x" in text
    assert "← opencv-python-headless " in text and "(numpy>=2)" in text
    assert not out.exists()


@pytest.mark.docker
def test_base_given_as_a_local_image_ref_is_snapshotted(standin_base_image, tmp_path):
    """--base REF: the stand-in image is read through the engine (never pulled) and locked on."""
    from tests.fx_docker import standin_findlinks

    fl = standin_findlinks(())
    out = tmp_path / "r.lock"
    args = [
        "lock",
        "--base",
        standin_base_image.ref,
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(fl),
        "-o",
        str(out),
    ]
    code, text = run(*args, "--with", "packaging")
    assert code == 0, text
    lock = load_lock(out)
    assert lock.header["base-ref"] == standin_base_image.ref.split("@")[0]
    assert lock.header["python"] == "3.11" and lock.entries == []  # packaging is already in the base
    assert run(*args, "--with", "packaging", "--check")[0] == 0
    code, text = run(*args, "--with", "packaging>=99")
    assert code == 4 and "packaging" in text


def test_vllm_alone_refuses_the_numpy1_ray_base(pyarrow14_base, tmp_path):
    """The numpy-1 ray base's headline: `lock --vllm 0.26.0` on a ray-like base (pyarrow built for numpy 1.x, no vllm)
    adds vllm==0.26.0 and is refused naming numpy, pyarrow's numpy-1.x extension and the chain."""
    out = tmp_path / "r.lock"
    code, text = run(
        "lock", "--vllm", "0.26.0", "--base", str(pyarrow14_base), "--exclude-newer", "2026-07-25", "-o", str(out)
    )
    assert code in (3, 4), text
    assert "vllm==0.26.0" in text
    assert "numpy==1.26.4 is pinned by the base; pyarrow 14.0.2 there has" in text and "numpy 1.x" in text
    assert "every base pin that must move" in text and "numpy 1.26.4 -> 2." in text
    assert not out.exists()
