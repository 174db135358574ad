"""`base reconstruct` / `base list` offline: a synthetic recipe, a fake vllm wheel, a loopback index
with made-up upload times (uv's --exclude-newer and the index adapter read the same listing)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import main
from builder.errors import BadInput
from builder.resolve.manifest import load_manifest
from builder.resolve.reconstruct import parse_recipes, provenance_text, recipe_for
from tests.fx_index import serve_index
from tests.fx_wheels import write_wheel

T_OLD = datetime(2026, 3, 1, 8, 0, 0, tzinfo=timezone.utc)
T_VLLM = datetime(2026, 4, 2, 10, 40, 32, 107640, tzinfo=timezone.utc)
T_NEW = datetime(2026, 4, 3, 9, 0, 0, tzinfo=timezone.utc)

RECIPES = '''
schema = "build-image/base-recipes/v1"
[defaults]
image = "example.invalid/vllm-openai:v{vllm}"
python = "3.12"
site_packages = "/usr/local/lib/python3.12/dist-packages"
arch = "x86_64"
cuda = "13.0"
final_base_image = "nvidia/cuda:13.0.1-base-ubuntu22.04"
os = "Ubuntu 22.04"
glibc = "2.35"
extras = ["extra-a>=1"]
not_on_index = ["jit-cache-elsewhere"]
source = "a synthetic recipe"
[release."0.99.0"]
[release."0.99.1"]
os = "Ubuntu 24.04"
glibc = "2.39"
extras = []
'''


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path_factory.mktemp("bi-cache-rec")))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path_factory.mktemp("uv-cache-rec")))


@pytest.fixture(scope="module")
def index_wheels(tmp_path_factory, wheelhouse) -> dict[Path, datetime]:
    d = tmp_path_factory.mktemp("recipe-wheels")
    w = {
        write_wheel(d, "vllm", "0.99.0", "py3-none-any", {"vllm/__init__.py": ""},
                    requires=["purepkg", "fakearrow"]): T_VLLM,
        write_wheel(d, "purepkg", "1.0.0", "py3-none-any", {"purepkg/__init__.py": ""}): T_OLD,
        write_wheel(d, "purepkg", "2.0.0", "py3-none-any", {"purepkg/__init__.py": ""}): T_NEW,  # after vllm: excluded
        write_wheel(d, "extra-a", "1.5.0", "py3-none-any", {"extra_a/__init__.py": ""}): T_OLD,
    }
    for p in wheelhouse.glob("fakearrow-14.0.2-*.whl"):  # a real gcc-built extension (numpy 1.x C-API)
        w[p] = T_OLD
    for p in wheelhouse.glob("numpy-1.26.4-*.whl"):
        w[p] = T_OLD
    return w


def test_recipes_parse_defaults_overrides_and_errors():
    r = parse_recipes(RECIPES)
    assert sorted(r) == ["0.99.0", "0.99.1"]
    a, b = r["0.99.0"], r["0.99.1"]
    assert a.image == "example.invalid/vllm-openai:v0.99.0" and a.platform == "x86_64-manylinux_2_35"
    assert a.requirements == ["vllm==0.99.0", "extra-a>=1"]
    assert b.glibc == "2.39" and b.platform == "x86_64-manylinux_2_39" and b.extras == ()
    with pytest.raises(BadInput, match="no recipe for vllm 1.0.0 .*known: 0.99.0, 0.99.1"):
        recipe_for(r, "1.0.0")
    for bad, needle in [(RECIPES.replace('glibc = "2.39"', 'glibc = "2.39.1"'), "'glibc' must look like X.Y"),
                        (RECIPES.replace('extras = []', 'extra = []'), "unknown key 'extra'"),
                        (RECIPES.replace('image = "example.invalid/vllm-openai:v{vllm}"', ''), "lacks image"),
                        (RECIPES.replace("v1", "v9"), "'schema' must be")]:
        with pytest.raises(BadInput, match=needle):
            parse_recipes(bad)


def test_the_shipped_recipes_cover_every_shipped_manifest():
    from builder.resolve.reconstruct import load_recipes
    from builder.spec import supported_vllm_versions

    recipes = load_recipes()
    assert set(supported_vllm_versions()) <= set(recipes)


def test_provenance_names_the_command_the_instant_and_the_differences():
    rec = parse_recipes(RECIPES)["0.99.0"]
    text = provenance_text(rec, command="uv pip install --target DIR vllm==0.99.0", uv_version="uv 0.13.9",
                           uploaded=T_VLLM, instant="2026-04-02T10:40:33Z", cuda_found="13.1", day="2026-12-01")
    assert "`uv pip install --target DIR vllm==0.99.0`" in text and "2026-04-02T10:40:32.107640+00:00" in text
    assert "jit-cache-elsewhere" in text and "CUDA 13.1, the recipe 13.0" in text and "a synthetic recipe" in text


def test_reconstruct_uses_the_wheels_upload_time_and_scans_the_tree(index_wheels, tmp_path, monkeypatch):
    recipes = tmp_path / "recipes.toml"
    recipes.write_text(RECIPES)
    out = tmp_path / "m.json"
    with serve_index(index_wheels) as url:
        monkeypatch.setenv("UV_DEFAULT_INDEX", url)
        r = CliRunner().invoke(main, ["base", "reconstruct", "--vllm", "0.99.0", "--recipes", str(recipes),
                                      "-o", str(out), "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["exclude_newer"] == "2026-04-02T10:40:33Z"  # the upload time, rounded up: the wheel itself is in
    m = load_manifest(out)
    assert m.get("vllm").version == "0.99.0"
    assert m.get("purepkg").version == "1.0.0"  # 2.0.0 was uploaded after vllm: not what the image saw
    assert m.get("extra-a").version == "1.5.0"
    assert m.get("fakearrow").facts.numpy_abi == {"1": 1, "2": 0}  # scanned, not named
    assert m.image_ref == "example.invalid/vllm-openai:v0.99.0" and m.glibc == "2.35"
    assert m.site_packages == "/usr/local/lib/python3.12/dist-packages" and m.provenance_kind == "reconstructed"
    assert "--exclude-newer 2026-04-02T10:40:33Z" in m.provenance_method
    assert {"index", "install", "scan"} <= set(doc["timings"])


def test_reconstruct_without_a_wheel_for_the_platform_or_recipe_is_refused(index_wheels, tmp_path, monkeypatch):
    recipes = tmp_path / "recipes.toml"
    recipes.write_text(RECIPES)
    out = tmp_path / "m.json"
    with serve_index(index_wheels) as url:
        monkeypatch.setenv("UV_DEFAULT_INDEX", url)
        r = CliRunner().invoke(main, ["base", "reconstruct", "--vllm", "0.99.1", "--recipes", str(recipes),
                                      "-o", str(out)])
        assert r.exit_code == 4 and "no vllm 0.99.1 wheel" in r.output
        r = CliRunner().invoke(main, ["base", "reconstruct", "--vllm", "0.98.0", "--recipes", str(recipes),
                                      "-o", str(out)])
        assert r.exit_code == 2 and "no recipe for vllm 0.98.0" in r.output
    assert not out.exists()


def test_base_list_shows_every_shipped_release():
    from builder.spec import supported_vllm_versions

    r = CliRunner().invoke(main, ["base", "list", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [x["vllm"] for x in rows] == sorted(supported_vllm_versions(), key=lambda v: tuple(map(int, v.split("."))))
    first = rows[0]
    assert first["vllm"] == "0.26.0" and first["torch"] == "2.11.0" and first["ray"] == "2.58.1"
    text = CliRunner().invoke(main, ["base", "list"], catch_exceptions=False).output
    assert text.splitlines()[0].split()[:3] == ["vllm", "torch", "CUDA"]
    assert any(line.startswith("0.26.0 ") for line in text.splitlines())
