"""Every shipped release against PyPI (slow: network): the first, a middle one and the newest."""

from __future__ import annotations

import pytest

from builder.resolve.index import SimpleIndex
from builder.resolve.lock import target_tags
from builder.resolve.lockfile import load_lock
from builder.resolve.manifest import load_manifest
from builder.resolve.raychoice import choose, ray_releases
from builder.resolve.reconstruct import load_recipes, release_instant
from builder.spec import default_base_manifest, default_lock_path, supported_vllm_versions
from tests.conftest import run

pytestmark = pytest.mark.slow

RELEASES = supported_vllm_versions()
PICKED = sorted({RELEASES[0], RELEASES[len(RELEASES) // 2], RELEASES[-1]}, key=RELEASES.index)


def test_nine_releases_are_shipped_from_0_26_0_on():
    assert RELEASES[0] == "0.26.0" and len(RELEASES) >= 9


@pytest.mark.parametrize("vllm", PICKED)
def test_release_locks_on_its_own_base_and_agrees_with_the_committed_lock(vllm, tmp_path):
    base = load_manifest(default_base_manifest(vllm))
    committed = load_lock(default_lock_path(vllm))
    assert run("lock", "--vllm", vllm, "--check")[0] == 0  # the committed lock is fresh (no network needed)
    out = tmp_path / "requirements.lock"
    code, text = run("lock", "--vllm", vllm, "-o", str(out))
    assert code == 0, text
    lock = load_lock(out)
    assert lock.header["vllm"] == vllm and lock.header["base-ref"] == f"vllm/vllm-openai:v{vllm}"
    assert not [e.name for e in lock.entries if e.base_version], "the default lock moved a base distribution"
    # the ray rule decides the same today as when the lock was committed (a new ray release would show here)
    assert lock.by_name()["ray"].version == committed.by_name()["ray"].version
    assert lock.header["serve-backend"] == committed.header["serve-backend"]
    assert base.get("vllm").version == vllm


@pytest.mark.parametrize("vllm", PICKED)
def test_exclude_newer_is_the_wheels_upload_time_and_ray_follows_the_llm_pin(vllm):
    recipe = load_recipes()[vllm]
    uploaded, instant = release_instant(SimpleIndex(), vllm, recipe["python"], recipe["platform"])
    base = load_manifest(default_base_manifest(vllm))
    assert instant in base.provenance_method and base.provenance_recipe["exclude_newer"] == instant
    assert uploaded.year >= 2026
    rels = ray_releases(SimpleIndex(), vllm, target_tags("3.12", "cp312", recipe["platform"]))
    choice = choose(vllm, rels)
    if vllm == "0.26.0":
        assert choice.version == "2.58.1"
