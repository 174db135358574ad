"""`--vllm X` on any base, offline: a ray-like base (a numpy-1.x extension, no vllm) is
refused with only `--vllm`; a base with another vllm is exit 2 naming both; the header never names a
vllm that is neither in the base nor in the lock; a lock on another base never replaces one."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.resolve.lockfile import load_lock
from builder.resolve.manifest import load_manifest
from tests.conftest import run
from tests.fx_wheels import install_into, write_wheel

PRIVATE_CACHE = "bi-cache-vob"  # the download cache of this module's tests (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture(scope="module")
def vllm_house(tmp_path_factory) -> Path:
    """A fake vllm 0.26.0 whose requirement chain needs numpy>=2 (as vllm's opencv-python-headless does),
    a fake vllm 0.27.0 that needs nothing, and a pure ray (no llm extra)."""
    d = tmp_path_factory.mktemp("vllmhouse")
    write_wheel(
        d, "fake-opencv-headless", "4.13.0", "py3-none-any", {"fake_opencv/__init__.py": ""}, requires=["numpy>=2"]
    )
    write_wheel(d, "vllm", "0.26.0", "py3-none-any", {"vllm/__init__.py": ""}, requires=["fake-opencv-headless"])
    write_wheel(d, "vllm", "0.27.0", "py3-none-any", {"vllm/__init__.py": ""}, requires=["purepkg"])
    write_wheel(d, "purepkg", "1.0.0", "py3-none-any", {"purepkg/__init__.py": ""})
    return d


def _snapshot(sp: Path, out: Path, ref: str | None = None) -> Path:
    args = ["base", "snapshot", "--site-packages", str(sp), "--python", "3.12", "--glibc", "2.35", "-o", str(out)]
    code, text = run(*(args + (["--image-ref", ref] if ref else [])))
    assert code == 0, text
    return out


@pytest.fixture(scope="module")
def raylike_base(tmp_path_factory, wheelhouse) -> Path:
    """A rayproject/ray stand-in: pyarrow-like extension built against numpy 1.x, numpy 1.26.4, no vllm."""
    d = tmp_path_factory.mktemp("raylike")
    sp = install_into(d / "sp", ["fakearrow==14.0.2", "numpy==1.26.4", "purepkg==1.0.0"], wheelhouse)
    m = _snapshot(sp, d / "ray-like.json", "example.invalid/rayproject/ray:2.x")
    assert load_manifest(m).get("vllm") is None
    return m


def _lock(base: Path, houses, *extra: str):
    links = [a for h in houses for a in ("--find-links", str(h))]
    return run("lock", "--base", str(base), "--no-default-overlay", "--no-index", *links, *extra)


def test_vllm_alone_is_enough_to_refuse_the_numpy1_ray_base_with_the_evidence(
    raylike_base, wheelhouse, vllm_house, tmp_path
):
    out = tmp_path / "r.lock"
    code, text = _lock(raylike_base, [wheelhouse, vllm_house], "--vllm", "0.26.0", "--with", "purepkg", "-o", str(out))
    assert code in (3, 4), text
    assert "vllm==0.26.0" in text  # added to the overlay by --vllm
    assert "numpy==1.26.4 is pinned by the base" in text
    assert "fakearrow 14.0.2 there has 1 extension built against numpy 1.x" in text
    assert "fake-opencv-headless" in text and "numpy>=2" in text  # the chain that pulls numpy 2
    assert not out.exists()
    # releasing numpy: the gate refuses with the chain down to vllm
    code, text = _lock(raylike_base, [wheelhouse, vllm_house], "--vllm", "0.26.0", "--with", "numpy>=2", "-o", str(out))
    assert code == 3, text
    assert "[numpy-abi] numpy 1.26.4 -> 2.1.0" in text
    assert "fake-opencv-headless 4.13.0 (numpy>=2) ← vllm 0.26.0" in text
    assert not out.exists()


def test_vllm_added_to_a_base_without_one_is_in_the_lock_and_its_header(raylike_base, wheelhouse, vllm_house, tmp_path):
    out = tmp_path / "ok.lock"
    code, text = _lock(raylike_base, [wheelhouse, vllm_house], "--vllm", "0.27.0", "--with", "purepkg", "-o", str(out))
    assert code == 0, text
    lock = load_lock(out)
    assert lock.by_name()["vllm"].version == "0.27.0" and lock.header["vllm"] == "0.27.0"
    assert lock.overlay == ["purepkg", "vllm==0.27.0"]
    # without --vllm (no spec either): nothing is added, and the header names no vllm
    out2 = tmp_path / "novllm.lock"
    code, text = _lock(raylike_base, [wheelhouse], "--with", "purepkg", "-o", str(out2))
    assert code == 0, text
    lock = load_lock(out2)
    assert "vllm" not in lock.by_name() and lock.header["vllm"] == "-"


def test_a_base_with_another_vllm_is_refused_naming_both(wheelhouse, vllm_house, tmp_path):
    sp = install_into(tmp_path / "sp", ["vllm==0.27.0", "purepkg==1.0.0"], vllm_house)
    base = _snapshot(sp, tmp_path / "v27.json")
    code, text = _lock(
        base, [wheelhouse, vllm_house], "--vllm", "0.26.0", "--with", "purepkg", "-o", str(tmp_path / "x.lock")
    )
    assert code == 2, text
    assert "--vllm 0.26.0" in text and "ships vllm 0.27.0" in text
    assert not (tmp_path / "x.lock").exists()
    # without --vllm the base's own vllm is the one locked for (not the built-in default)
    code, text = _lock(base, [wheelhouse, vllm_house], "--with", "purepkg", "-o", str(tmp_path / "x.lock"))
    assert code == 0, text
    assert load_lock(tmp_path / "x.lock").header["vllm"] == "0.27.0"


def test_a_lock_on_another_base_never_replaces_the_lock_there(raylike_base, wheelhouse, vllm_house, tmp_path):
    sp = install_into(tmp_path / "sp", ["vllm==0.27.0", "purepkg==1.0.0"], vllm_house)
    official = _snapshot(sp, tmp_path / "official.json", "example.invalid/vllm/vllm-openai:v0.27.0")
    standin = _snapshot(sp, tmp_path / "standin.json", "standin.local/vllm/vllm-openai:v0.27.0")
    lock = tmp_path / "requirements.lock"
    code, text = _lock(official, [wheelhouse, vllm_house], "--vllm", "0.27.0", "--with", "purepkg", "-o", str(lock))
    assert code == 0, text
    before = lock.read_bytes()
    code, text = _lock(standin, [wheelhouse, vllm_house], "--vllm", "0.27.0", "--with", "purepkg", "-o", str(lock))
    assert code == 2, text
    assert "was made on another base (example.invalid/vllm/vllm-openai:v0.27.0)" in text and "--force" in text
    assert lock.read_bytes() == before
    code, text = _lock(
        standin, [wheelhouse, vllm_house], "--vllm", "0.27.0", "--with", "purepkg", "-o", str(lock), "--force"
    )
    assert code == 0, text
    assert load_lock(lock).header["base-ref"] == "standin.local/vllm/vllm-openai:v0.27.0"


def test_a_release_without_a_patch_series_stops_the_pipeline_naming_patch_port(tmp_path):
    """Before any lock or download: the image would silently carry none of the loader patches.  The release
    has a base (given with --base); without one it is refused as unknown (exit 2) before the series is looked at."""
    manifest = Path(__file__).resolve().parents[1] / "lockfiles" / "base" / "vllm-openai-v0.33.0.json"
    code, text = run("--vllm", "0.99.0", "--base", str(manifest), "-o", str(tmp_path / "ctx"))
    assert code == 6, text
    assert "no patch series for vllm 0.99.0 yet" in text
    assert "build-image patch port --from " in text and "--to 0.99.0" in text and "--no-patches" in text
    assert not (tmp_path / "ctx").exists()
