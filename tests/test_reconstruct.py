"""`base reconstruct` / `base list` offline: a small sdist whose Dockerfile installs in several steps, a fake
vllm wheel and a loopback index with made-up upload times (uv's --exclude-newer and the index adapter read
the same listing); the replay of the steps in order, each seeing what the earlier ones installed."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import main
from builder.resolve.manifest import load_manifest
from builder.resolve.recipe import BuildFiles, SdistRef, Step, Where, derive
from builder.resolve.reconstruct import (
    drop_lines,
    installed_in,
    moved,
    pinned_in_index_files,
    plan_step,
    provenance_text,
    sanitized_requirements,
)
from builder.resolve.uv import Uv
from builder.spec import supported_vllm_versions
from tests.fx_index import serve_index
from tests.fx_sdist import write_sdist
from tests.fx_wheels import write_wheel

T_OLD = datetime(2026, 3, 1, 8, 0, 0, tzinfo=timezone.utc)
T_VLLM = datetime(2026, 4, 2, 10, 40, 32, 107640, tzinfo=timezone.utc)
T_NEW = datetime(2026, 4, 3, 9, 0, 0, tzinfo=timezone.utc)

DOCKERFILE = """\
ARG CUDA_VERSION=13.0.1
ARG PYTHON_VERSION=3.12
ARG UBUNTU_VERSION=22.04
ARG FINAL_BASE_IMAGE=nvidia/cuda:${CUDA_VERSION}-base-ubuntu${UBUNTU_VERSION}
ARG INSTALL_KV_CONNECTORS=false
FROM ${FINAL_BASE_IMAGE} AS build
FROM ${FINAL_BASE_IMAGE} AS vllm-base
ARG CUDA_VERSION
ARG PYTHON_VERSION
RUN apt-get install -y python${PYTHON_VERSION} && update-alternatives --install /usr/bin/python3 python3 /usr/bin/python${PYTHON_VERSION} 1
RUN echo "numpy==1.26.4" > /etc/uv-overrides.txt
ENV UV_OVERRIDE=/etc/uv-overrides.txt
COPY requirements/cuda.txt /tmp/requirements-cuda.txt
RUN uv pip install --system -r /tmp/requirements-cuda.txt
RUN uv pip install --system jit-cache==1.0 --index-url https://jit.example.invalid/whl/cu$(echo $CUDA_VERSION | cut -d. -f1,2 | tr -d '.')
RUN uv pip install --system "extra-a>=1"
RUN --mount=type=bind,from=build,src=/workspace/dist,target=/vllm-workspace/dist uv pip install --system dist/*.whl
FROM vllm-base AS vllm-openai-base
ARG INSTALL_KV_CONNECTORS
RUN --mount=type=bind,source=requirements/kv_connectors.txt,target=/tmp/kv_connectors.txt,ro \\
    if [ "$INSTALL_KV_CONNECTORS" = "true" ]; then uv pip install --system -r /tmp/kv_connectors.txt --no-build; fi
FROM vllm-openai-base AS vllm-openai
"""  # noqa: E501 - verbatim Dockerfile text

PIPELINE = """\
steps:
  - label: "Build release image - x86_64 - CUDA 13.0"
    commands:
      - "docker build -t r:$BUILDKITE_COMMIT-$(uname -m) --build-arg INSTALL_KV_CONNECTORS=true --target vllm-openai -f docker/Dockerfile ."
      - "docker tag r:$BUILDKITE_COMMIT-$(uname -m) vllm/vllm-openai:v$RELEASE_VERSION"
"""  # noqa: E501 - a pipeline's one-line command

REQS = {
    "requirements/common.txt": "purepkg\n",
    "requirements/cuda.txt": "-r common.txt\n--extra-index-url https://jit.example.invalid/whl/\njit-cubin==1.0\n",
    "requirements/kv_connectors.txt": "kvpin\n",
}


def _files(version: str = "0.99.0") -> dict[str, str]:
    return {"docker/Dockerfile": DOCKERFILE, ".buildkite/release-pipeline.yaml": PIPELINE, **REQS}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path_factory.mktemp("bi-cache-rec")))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path_factory.mktemp("uv-cache-rec")))


@pytest.fixture(scope="module")
def index_files(tmp_path_factory, wheelhouse) -> dict[Path, datetime]:
    d = tmp_path_factory.mktemp("recipe-wheels")
    w = {
        write_wheel(
            d, "vllm", "0.99.0", "py3-none-any", {"vllm/__init__.py": ""}, requires=["purepkg", "fakearrow"]
        ): T_VLLM,
        write_wheel(d, "purepkg", "1.0.0", "py3-none-any", {"purepkg/__init__.py": ""}): T_OLD,
        write_wheel(d, "purepkg", "1.2.0", "py3-none-any", {"purepkg/__init__.py": ""}): T_OLD,
        write_wheel(d, "purepkg", "2.0.0", "py3-none-any", {"purepkg/__init__.py": ""}): T_NEW,  # after vllm: excluded
        write_wheel(d, "extra-a", "1.5.0", "py3-none-any", {"extra_a/__init__.py": ""}): T_OLD,
        # the last step's requirement moves purepkg below what the first step installed
        write_wheel(d, "kvpin", "1.0.0", "py3-none-any", {"kvpin/__init__.py": ""}, requires=["purepkg<1.1"]): T_OLD,
        write_sdist(d, "0.99.0", _files()): T_VLLM,
        write_sdist(
            d, "0.99.1", {**_files(), "docker/Dockerfile": DOCKERFILE.replace("ubuntu${UBUNTU_VERSION}", "ubuntu24.04")}
        ): T_VLLM,
    }
    for p in wheelhouse.glob("fakearrow-14.0.2-*.whl"):  # a real gcc-built extension (numpy 1.x C-API)
        w[p] = T_OLD
    for p in wheelhouse.glob("numpy-1.26.4-*.whl"):
        w[p] = T_OLD
    return w


def _recipe():
    return derive(BuildFiles("0.99.0", SdistRef("vllm-0.99.0.tar.gz", "0" * 64), _files()))


def test_plan_step_from_what_the_tree_holds():
    r = _recipe()
    steps = {s.n: s for s in r.steps}
    p = plan_step(steps[1], {}, {})
    assert p.action == "install" and p.requirement_files == ("requirements/cuda.txt",)
    assert p.overrides == ("numpy==1.26.4",)  # UV_OVERRIDE's file, for every later uv step
    assert plan_step(steps[2], {}, {}).action == "skip" and "jit.example.invalid" in plan_step(steps[2], {}, {}).reason
    where = Where("docker/Dockerfile", 9)
    swap = Step(
        9,
        "s",
        where,
        "index",
        requirements=("eng-cuda13=={installed:eng}",),
        when_installed="eng",
        constrain_installed=("torch", "absent"),
        flags=("--force-reinstall", "--no-deps", "--pre"),
    )
    assert plan_step(swap, {"torch": "2.11.0"}, {}).action == "skip"  # eng not installed
    p = plan_step(swap, {"torch": "2.11.0"}, {"eng": "0.3.12"})  # captured before the uninstall
    assert p.requirements == ("eng-cuda13==0.3.12",) and p.constraint_pins == ("torch==2.11.0",)
    assert p.flags == ("--reinstall", "--no-deps", "--prerelease", "allow")
    un = Step(8, "s", where, "uninstall", requirements=("eng", "other"))
    assert plan_step(un, {"eng": "1"}, {}).requirements == ("eng",)
    assert plan_step(un, {}, {}).action == "skip"


def test_unmet_requirements_of_a_tree():
    from builder.resolve.manifest import target_environment
    from builder.resolve.reconstruct import unmet_requirements

    tree = {
        "nixl": ("1.3.1", ["nixl-cu13==1.3.1", 'extra-only; extra == "x"']),
        "nixl-cu13": ("1.3.2", []),
        "a": ("1", ['old>=2; python_version < "3.0"', "gone"]),
    }
    assert unmet_requirements(tree, target_environment("3.12", "x86_64-manylinux_2_35")) == [
        "a 1 requires gone, which the image does not hold",
        "nixl 1.3.1 requires nixl-cu13==1.3.1, the image holds nixl-cu13 1.3.2",
    ]


def test_pure_helpers_of_the_replay(tmp_path):
    assert moved({"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "1", "d": "4"}) == {
        "b": "2 -> 1",
        "c": "-3",
        "d": "+4",
    }
    assert sanitized_requirements("a\n--extra-index-url https://x/\nb\n").splitlines()[1].startswith("# (index option")
    assert drop_lines("a\nb\n", {2}, "why") == "a\n# (why) b\n"
    assert pinned_in_index_files(REQS, ("requirements/cuda.txt",)) == [
        ("jit-cubin", "1.0", "requirements/cuda.txt:3", "https://jit.example.invalid/whl/")
    ]
    (tmp_path / "purepkg-1.2.0.dist-info").mkdir()
    (tmp_path / "Foo_Bar-2.0.dist-info").mkdir()
    assert installed_in(tmp_path) == {"purepkg": "1.2.0", "foo-bar": "2.0"}


def test_provenance_names_the_sdist_the_steps_the_instant_and_the_differences():
    text = provenance_text(
        _recipe(),
        uv_version="0.13.9",
        uploaded=T_VLLM,
        instant="2026-04-02T10:40:33Z",
        cuda_found="13.1",
        day="2026-12-01",
    )
    assert "vllm-0.99.0.tar.gz (sha256 " + "0" * 64 in text and "2026-04-02T10:40:32.107640+00:00" in text
    assert "--exclude-newer 2026-04-02T10:40:33Z" in text and "jit-cache" in text
    assert "CUDA 13.1, the recipe 13.0" in text and "unverified" not in text


def _write_recipes(url_env, tmp_path, version="0.99.0") -> Path:
    recipes = tmp_path / "recipes.toml"
    r = CliRunner().invoke(
        main, ["base", "recipe", "--vllm", version, "--write", "--recipes", str(recipes)], catch_exceptions=False
    )
    assert r.exit_code == 0, r.output
    return recipes


def test_reconstruct_replays_the_steps_in_order_and_a_later_step_moves_an_earlier_pin(
    index_files, tmp_path, monkeypatch
):
    out = tmp_path / "m.json"
    with serve_index(index_files) as url:
        monkeypatch.setenv("UV_DEFAULT_INDEX", url)
        recipes = _write_recipes(url, tmp_path)
        r = CliRunner().invoke(
            main,
            ["base", "reconstruct", "--vllm", "0.99.0", "--recipes", str(recipes), "-o", str(out), "--json"],
            catch_exceptions=False,
        )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["exclude_newer"] == "2026-04-02T10:40:33Z"  # the upload time, rounded up: the wheel itself is in
    m = load_manifest(out)
    assert m.get("vllm").version == "0.99.0" and m.get("extra-a").version == "1.5.0"
    assert m.get("purepkg").version == "1.0.0"  # step 1 put 1.2.0, the kv step moved it down; 2.0.0 was too new
    assert m.get("fakearrow").facts.numpy_abi == {"1": 1, "2": 0}  # scanned, not named
    # the index's build stands for the image's: its ELF digest would be a claim about other files
    assert m.get("fakearrow").facts.binary and m.get("fakearrow").facts.native_sha256 is None
    assert "native_sha256" not in json.loads(out.read_text())["distributions"]["fakearrow"]
    assert m.image_ref == "vllm/vllm-openai:v0.99.0" and (m.glibc, m.os) == (
        "2.35",
        "Ubuntu 22.04 (nvidia/cuda:13.0.1-base-ubuntu22.04)",
    )
    assert m.site_packages == "/usr/local/lib/python3.12/dist-packages" and m.provenance_kind == "reconstructed"
    steps = m.provenance_recipe["steps"]
    assert m.provenance_recipe["sdist"]["filename"] == "vllm-0.99.0.tar.gz"
    assert [s["action"] for s in steps] == ["install", "skip", "install", "install", "install"]
    assert steps[0]["moved"]["purepkg"] == "+1.2.0"
    assert steps[4]["moved"] == {"kvpin": "+1.0.0", "purepkg": "1.2.0 -> 1.0.0"}
    assert "--override step1-overrides.txt" in steps[0]["command"] and steps[0]["overrides"] == ["numpy==1.26.4"]
    assert set(m.unversioned) == {"jit-cache", "jit-cubin"}  # another index's wheel, a pin only it serves
    assert any("jit-cubin==1.0 (requirements/cuda.txt:3" in x for x in m.lacks["off_index"])
    assert "python3.12" in m.lacks["os_packages"] and "unverified" not in m.provenance_method
    assert m.provenance_recipe["unmet_requirements"] == []  # purepkg 1.0.0 still satisfies vllm's requirement
    assert {"index", "install", "scan", "recipe"} <= set(doc["timings"])


def _manifest_without_day(path: Path) -> dict:
    doc = json.loads(path.read_text())
    doc["provenance"]["method"] = re.sub(r"On \d{4}-\d\d-\d\d", "On DAY", doc["provenance"]["method"])
    return doc


def test_a_replay_done_online_before_answers_from_uv_s_cache_and_falls_back_to_the_index(
    index_files, tmp_path, monkeypatch
):
    def run(out: Path, *extra: str) -> dict:
        r = CliRunner().invoke(
            main,
            ["base", "reconstruct", "--vllm", "0.99.0", "--recipes", str(recipes), "-o", str(out), "--json", *extra],
            catch_exceptions=False,
        )
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    with serve_index(index_files) as url:
        monkeypatch.setenv("UV_DEFAULT_INDEX", url)
        recipes = _write_recipes(url, tmp_path)
        first = run(tmp_path / "1.json")
        assert first["uv_steps"] == {"offline": 0, "online": 4}  # nothing recorded yet: every step asks the index
        second = run(tmp_path / "2.json")
        assert second["uv_steps"] == {"offline": 4, "online": 0}
        assert _manifest_without_day(tmp_path / "2.json") == _manifest_without_day(tmp_path / "1.json")
        assert run(tmp_path / "3.json", "--refresh")["uv_steps"] == {"offline": 0, "online": 4}
        # uv's cache emptied under the record: each step finds nothing offline and asks the index
        subprocess.run([Uv().binary, "cache", "clean"], check=True, capture_output=True, env=Uv.env())
        fourth = run(tmp_path / "4.json")
        assert fourth["uv_steps"] == {"offline": 0, "online": 4}
        assert _manifest_without_day(tmp_path / "4.json") == _manifest_without_day(tmp_path / "1.json")
        # another uv cache is another record: its first replay asks the index
        monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "other-uv-cache"))
        assert run(tmp_path / "5.json")["uv_steps"] == {"offline": 0, "online": 4}


def test_reconstruct_refuses_a_stale_recipe_a_missing_recipe_and_a_platform_without_the_wheel(
    index_files, tmp_path, monkeypatch
):
    out = tmp_path / "m.json"
    with serve_index(index_files) as url:
        monkeypatch.setenv("UV_DEFAULT_INDEX", url)
        recipes = _write_recipes(url, tmp_path)
        r = CliRunner().invoke(
            main, ["base", "reconstruct", "--vllm", "0.98.0", "--recipes", str(recipes), "-o", str(out)]
        )
        assert r.exit_code == 2 and "no recipe for vllm 0.98.0" in r.output and "base recipe --vllm 0.98.0" in r.output
        recipes.write_text(recipes.read_text().replace('glibc = "2.35"', 'glibc = "2.31"'))
        r = CliRunner().invoke(
            main, ["base", "reconstruct", "--vllm", "0.99.0", "--recipes", str(recipes), "-o", str(out)]
        )
        assert r.exit_code == 2 and "differs from what its sdist vllm-0.99.0.tar.gz says" in r.output
        recipes = _write_recipes(url, tmp_path, "0.99.1")
        r = CliRunner().invoke(
            main, ["base", "reconstruct", "--vllm", "0.99.1", "--recipes", str(recipes), "-o", str(out)]
        )
        assert r.exit_code == 4 and "no vllm 0.99.1 wheel" in r.output
    assert not out.exists()


def test_base_list_shows_every_shipped_release():
    from builder.spec import supported_vllm_versions

    r = CliRunner().invoke(main, ["base", "list", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [x["vllm"] for x in rows] == sorted(supported_vllm_versions(), key=lambda v: tuple(map(int, v.split("."))))
    first = rows[0]
    assert first["vllm"] == "0.26.0" and first["torch"] == "2.11.0" and first["ray"] == "2.58.1"
    assert first["sdist"] == "vllm-0.26.0.tar.gz" and first["steps"] == 9 and "deep-ep" in first["unversioned"]
    assert {r["vllm"]: r["glibc"] for r in rows}["0.28.0"] == "2.39"  # derived: Ubuntu 24.04 from 0.28.0 on
    text = CliRunner().invoke(main, ["base", "list"], catch_exceptions=False).output
    assert text.splitlines()[0].split()[:3] == ["vllm", "torch", "CUDA"]
    assert any(line.startswith("0.26.0 ") for line in text.splitlines())


@pytest.mark.parametrize("vllm", supported_vllm_versions())
def test_each_shipped_manifest_is_the_replay_of_its_derived_recipe(vllm):
    """Every value the manifest takes from the recipe equals the derived table in recipes.toml; the provenance
    names the sdist by its sha256 and every step by its Dockerfile line; nothing derived says "unverified"."""
    from builder.resolve.reconstruct import load_recipes
    from builder.spec import default_base_manifest

    t = load_recipes()[vllm]
    path = default_base_manifest(vllm)
    m = load_manifest(path)
    assert "unverified" not in path.read_text().lower()
    assert m.provenance_kind == "reconstructed"
    assert (m.image_ref, m.glibc, m.cuda, m.python_version, m.site_packages, m.platform) == (
        t["image"],
        t["glibc"],
        t["cuda"],
        t["python"],
        t["site_packages"],
        t["platform"],
    )
    assert m.os.startswith(t["os"])
    pr = m.provenance_recipe
    assert pr["sdist"] == {"filename": t["sdist"], "sha256": t["sdist_sha256"]}
    assert t["sdist_sha256"] in m.provenance_method
    assert [(s["n"], s["from"]) for s in pr["steps"]] == [(s["n"], s["from"]) for s in t["steps"]]
    for s, ts in zip(pr["steps"], t["steps"]):  # what the replay could not take is skipped, with the reason
        if ts["replay"] in ("off-index", "source-build", "undecided"):
            assert s["action"] == "skip", (s, ts["replay"])
        elif s["action"] == "skip":  # a step that depends on what the tree holds (a relaxed name is absent)
            assert ts.get("when_installed") or ts["replay"] == "uninstall", (s, ts)
            assert "installed" in s["reason"] and m.lacks.get("relaxed"), s
    assert (m.uv_overrides or []) == t["image_overrides"]
    assert set(m.unversioned) and not set(m.unversioned) & set(m.distributions)
    assert set(m.lacks) >= {"off_index", "source_builds", "other_indexes", "os_packages", "unversioned"}
    assert m.get("vllm").version == vllm


def test_manifest_differences_names_each_move_and_ignores_the_replay_s_day():
    from builder.resolve.reconstruct import manifest_differences

    method = "Reconstructed. On 2026-12-02 with uv 0.13.9: x"
    old = {
        "glibc": "2.31",
        "provenance": {"kind": "reconstructed", "method": method},
        "distributions": {
            "numpy": {"name": "numpy", "version": "1.26.4"},
            "gone": {"name": "gone", "version": "1"},
            "torch": {"name": "torch", "version": "2.11.0", "binary": True},
        },
    }
    new = json.loads(json.dumps(old))
    new["provenance"]["method"] = new["provenance"]["method"].replace("2026-12-02", "2027-01-05")
    assert manifest_differences(json.dumps(old), json.dumps(new)) == []
    new["glibc"] = "2.35"
    new["distributions"]["numpy"]["version"] = "2.2.6"
    del new["distributions"]["gone"]
    new["distributions"]["added"] = {"name": "added", "version": "3"}
    new["distributions"]["torch"]["native_sha256"] = "a" * 64
    new["provenance"]["method"] = new["provenance"]["method"].replace("uv 0.13.9", "uv 0.14.0")
    assert manifest_differences(json.dumps(old), json.dumps(new)) == [
        "added: added 3",
        "gone: removed (was 1)",
        "numpy: 1.26.4 -> 2.2.6",
        "torch 2.11.0: native_sha256 differ",
        "glibc: 2.31 -> 2.35",
        "provenance: method differ",
    ]


def test_reconstruct_check_writes_nothing_and_fails_listing_the_moves(index_files, tmp_path, monkeypatch):
    out = tmp_path / "m.json"
    with serve_index(index_files) as url:
        monkeypatch.setenv("UV_DEFAULT_INDEX", url)
        recipes = _write_recipes(url, tmp_path)
        args = ["base", "reconstruct", "--vllm", "0.99.0", "--recipes", str(recipes), "-o", str(out)]
        r = CliRunner().invoke(main, [*args, "--check"])
        assert r.exit_code == 2 and "no manifest" in r.output and not out.exists()
        assert CliRunner().invoke(main, args, catch_exceptions=False).exit_code == 0
        before = out.read_bytes()
        r = CliRunner().invoke(main, [*args, "--check"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        doc = json.loads(before)
        doc["distributions"]["purepkg"]["version"] = "1.2.0"
        out.write_text(json.dumps(doc, indent=2))
        edited = out.read_bytes()
        r = CliRunner().invoke(main, [*args, "--check", "--json"])
        assert r.exit_code == 1 and "purepkg: 1.2.0 -> 1.0.0" in r.output
        assert out.read_bytes() == edited  # --check never rewrites
