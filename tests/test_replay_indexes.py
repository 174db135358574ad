"""The replay asks the indexes each step's Dockerfile line names; a step no reachable index satisfies
names the missing distribution and both ways through; --relax replays without it.

Two loopback indexes stand in for the Python index and the PyTorch index: the torch step's line
names the PyTorch one as --index-url with the Python index as extra (which uv asks first) and
unsafe-first-match, and pins a +cu130 build only the PyTorch one serves.  When that index answers,
the replay installs its build; when it does not, the Python index takes its place and the pin it
lacks is left out and listed."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import main
from builder.resolve.manifest import load_manifest
from builder.resolve.recipe import Step, Where
from builder.resolve.stepindex import Relaxation, explain_unsatisfiable, plan_indexes, relax_file, relax_requirement
from tests.fx_index import serve_index
from tests.fx_sdist import write_sdist
from tests.fx_wheels import write_wheel

T_OLD = datetime(2026, 3, 1, 8, 0, 0, tzinfo=timezone.utc)
T_VLLM = datetime(2026, 4, 2, 10, 40, 32, tzinfo=timezone.utc)
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens there

DOCKERFILE = """\
ARG CUDA_VERSION=13.0.1
ARG PYTHON_VERSION=3.12
ARG FINAL_BASE_IMAGE=nvidia/cuda:${CUDA_VERSION}-base-ubuntu22.04
ARG PYTORCH_CUDA_INDEX_BASE_URL=@TORCH@
FROM ${FINAL_BASE_IMAGE} AS build
FROM ${FINAL_BASE_IMAGE} AS vllm-openai
ARG CUDA_VERSION
ARG PYTHON_VERSION
ARG PYTORCH_CUDA_INDEX_BASE_URL
COPY requirements/cuda.txt /tmp/requirements-cuda.txt
RUN uv pip install --system -r /tmp/requirements-cuda.txt \\
      --index-url ${PYTORCH_CUDA_INDEX_BASE_URL}/cu$(echo $CUDA_VERSION | cut -d. -f1,2 | tr -d '.') \\
      --extra-index-url https://pypi.org/simple --index-strategy unsafe-first-match
RUN uv pip install --system "needy[s3,azure]>=1"
RUN --mount=type=bind,from=build,src=/workspace/dist,target=/vllm-workspace/dist uv pip install --system dist/*.whl
"""
PIPELINE = """\
steps:
  - label: "Build release image - x86_64 - CUDA 13.0"
    commands:
      - "docker build -t r:$BUILDKITE_COMMIT-$(uname -m) --target vllm-openai -f docker/Dockerfile ."
      - "docker tag r:$BUILDKITE_COMMIT-$(uname -m) vllm/vllm-openai:v$RELEASE_VERSION"
"""
REQS = {"requirements/cuda.txt": "torchlike==2.0.0+cu130\npurepkg\n"}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path_factory.mktemp("bi-cache-idx")))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path_factory.mktemp("uv-cache-idx")))


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, dict[Path, datetime]]:
    d = tmp_path_factory.mktemp("idx-wheels")
    py = {
        write_wheel(
            d,
            "vllm",
            "0.99.0",
            "py3-none-any",
            {"vllm/__init__.py": ""},
            requires=["torchlike==2.0.0+cu130", "purepkg"],
        ): T_VLLM,
        write_wheel(d, "purepkg", "1.0.0", "py3-none-any", {"purepkg/__init__.py": ""}): T_OLD,
        write_wheel(
            d,
            "needy",
            "1.0.0",
            "py3-none-any",
            {"needy/__init__.py": ""},
            extras=["s3", "azure"],
            requires=['needy-s3==1.0.0; extra == "s3"', 'needy-azure==1.0.0; extra == "azure"'],
        ): T_OLD,
        write_wheel(d, "needy-s3", "1.0.0", "py3-none-any", {"needy_s3/__init__.py": ""}): T_OLD,
    }
    t = tmp_path_factory.mktemp("idx-torch")
    torch = {write_wheel(t, "torchlike", "2.0.0+cu130", "py3-none-any", {"torchlike/__init__.py": "cu"}): T_OLD}
    return {"python": py, "torch": torch}


def _reconstruct(wheels, tmp_path, monkeypatch, torch_url: str | None, *extra: str):
    """(exit code, output, manifest) of recipe --write + reconstruct with the torch index at torch_url (its
    own server when None)."""
    import contextlib

    out = tmp_path / "m.json"
    with contextlib.ExitStack() as stack:
        if torch_url is None:
            torch_url = stack.enter_context(serve_index(wheels["torch"], prefix="cu130")).rsplit("/", 1)[0]
        sd = write_sdist(
            tmp_path,
            "0.99.0",
            {
                "docker/Dockerfile": DOCKERFILE.replace("@TORCH@", torch_url),
                ".buildkite/release-pipeline.yaml": PIPELINE,
                **REQS,
            },
        )
        url = stack.enter_context(serve_index({**wheels["python"], sd: T_VLLM}))
        monkeypatch.setenv("UV_DEFAULT_INDEX", url)
        recipes = tmp_path / "recipes.toml"
        r = CliRunner().invoke(main, ["base", "recipe", "--vllm", "0.99.0", "--write", "--recipes", str(recipes)])
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(
            main, ["base", "reconstruct", "--vllm", "0.99.0", "--recipes", str(recipes), "-o", str(out), *extra]
        )
    return r.exit_code, r.output, (load_manifest(out) if out.is_file() else None)


def test_a_step_asks_the_index_its_line_names_first_where_it_answers(wheels, tmp_path, monkeypatch):
    code, output, m = _reconstruct(wheels, tmp_path, monkeypatch, None, "--relax", "needy[azure]")
    assert code == 0, output
    assert m.get("torchlike").version == "2.0.0+cu130"  # from the PyTorch index, which the line names
    step = m.provenance_recipe["steps"][0]
    assert step["indexes"][0].endswith("/cu130") and "unreachable_indexes" not in step
    assert "--index-strategy unsafe-first-match" in step["command"]
    assert not m.lacks.get("approximated") and "torchlike" not in m.unversioned
    assert any(": asked (step 1)" in x for x in m.lacks["other_indexes"])


def test_an_index_that_does_not_answer_is_named_and_its_pins_listed(wheels, tmp_path, monkeypatch):
    code, output, m = _reconstruct(wheels, tmp_path, monkeypatch, CLOSED, "--relax", "needy[azure]")
    assert code == 0, output
    assert f"{CLOSED}/cu130 does not answer from here" in output
    assert m.get("torchlike") is None  # left out and excluded: vllm, which pins it, still installs
    assert m.get("vllm").version == "0.99.0" and m.get("purepkg").version == "1.0.0"
    assert any(x.startswith("torchlike==2.0.0+cu130 (requirements/cuda.txt:1)") for x in m.lacks["approximated"])
    assert "torchlike" in m.unversioned and "approximated" in m.unversioned["torchlike"]
    assert any(x.startswith(f"{CLOSED}/cu130: does not answer from here") for x in m.lacks["other_indexes"])
    assert "pins no reachable index serves are left out" in m.provenance_method


def test_a_step_no_index_satisfies_names_what_is_missing_and_both_ways(wheels, tmp_path, monkeypatch):
    code, output, m = _reconstruct(wheels, tmp_path, monkeypatch, None)
    assert code == 4 and m is None
    assert "needy-azure is on none of them" in output and "needy[s3,azure]>=1 needs it" in output
    assert "--relax 'needy[azure]'" in output and "base snapshot --image vllm/vllm-openai:v0.99.0" in output
    assert "Traceback" not in output


def test_relax_drops_the_extra_and_the_manifest_says_so(wheels, tmp_path, monkeypatch):
    code, output, m = _reconstruct(wheels, tmp_path, monkeypatch, None, "--relax", "needy[azure]")
    assert code == 0, output
    assert m.get("needy").version == "1.0.0" and m.get("needy-s3").version == "1.0.0"
    assert m.get("needy-azure") is None
    assert m.lacks["relaxed"] == ["needy[azure]: replayed without its extras azure (--relax)"]
    step = m.provenance_recipe["steps"][1]
    assert step["relaxed"] == ["needy[s3,azure]>=1: extras azure dropped (docker/Dockerfile:14)"]


@pytest.mark.parametrize("spec", ["needy>=1", "needy; python_version>'3'", "not a name!", "x @ https://e/x.whl"])
def test_a_relaxation_is_a_name_and_extras_only(wheels, tmp_path, monkeypatch, spec):
    r = CliRunner().invoke(
        main, ["base", "reconstruct", "--vllm", "0.99.0", "-o", str(tmp_path / "m.json"), "--relax", spec, "--no-index"]
    )
    assert r.exit_code == 2 and "--relax" in r.output and not (tmp_path / "m.json").exists()


def test_plan_indexes_keeps_the_line_order_and_maps_the_python_index():
    w = Where("docker/Dockerfile", 9)
    step = Step(
        2,
        "s",
        w,
        "index",
        requirement_files=("requirements/cuda.txt",),
        index_url="https://t.invalid/cu130",
        extra_index_urls=("https://pypi.org/simple",),
        index_strategy="unsafe-first-match",
    )
    base = ["--index-url", "http://mirror/simple", "--find-links", "/w"]
    si = plan_indexes(step, base, lambda u: True)
    assert (si.primary, si.extras, si.unreachable) == ("https://t.invalid/cu130", ("http://mirror/simple",), ())
    assert si.args(base) == [
        "--default-index",
        "https://t.invalid/cu130",
        "--find-links",
        "/w",
        "--index",
        "http://mirror/simple",
        "--index-strategy",
        "unsafe-first-match",
    ]
    si = plan_indexes(step, base, lambda u: False)
    assert (si.primary, si.extras, si.unreachable) == ("http://mirror/simple", (), ("https://t.invalid/cu130",))
    assert plan_indexes(step, [*base, "--no-index"], lambda u: True) is None
    assert plan_indexes(Step(1, "s", w, "index", requirements=("a",)), base, lambda u: True) is None


def test_relaxations_on_requirements_and_files():
    rx = (Relaxation.parse("runai-model-streamer[azure]"), Relaxation.parse("Nixl_CU12"))
    assert relax_requirement("runai-model-streamer[s3,gcs,azure]>=0.17.1", rx) == (
        "runai-model-streamer[gcs,s3]>=0.17.1",
        ["runai-model-streamer[s3,gcs,azure]>=0.17.1: extras azure dropped"],
    )
    assert relax_requirement("nixl-cu12==1.5.2", rx) == (None, ["nixl-cu12==1.5.2 dropped"])
    assert relax_requirement("dist/*.whl", rx) == ("dist/*.whl", [])
    text, done = relax_file("-r common.txt\nnixl_cu12 == 1.5.2  # pin\nother\n", rx, "requirements/kv.txt")
    assert text == "-r common.txt\n# (relaxed) nixl_cu12 == 1.5.2  # pin\nother\n"
    assert done == ["nixl_cu12 == 1.5.2 dropped (requirements/kv.txt:2)"]


def test_explain_unsatisfiable_from_uv_messages():
    w = Where("docker/Dockerfile", 973)
    step = Step(3, "s", w, "index", requirements=("runai-model-streamer[s3,gcs,azure]>=0.17.1",))
    miss = explain_unsatisfiable(
        "Because runai-model-streamer-azure==0.17.1 was not found in the package registry and\n"
        "runai-model-streamer[azure]==0.17.1 depends on runai-model-streamer-azure==0.17.1, we can conclude ...",
        step,
    )
    assert (miss.distribution, miss.needed_by, miss.relax) == (
        "runai-model-streamer-azure==0.17.1",
        "runai-model-streamer[s3,gcs,azure]>=0.17.1",
        "runai-model-streamer[azure]",
    )
    kv = Step(6, "s", w, "index", requirement_files=("requirements/kv_connectors.txt",))
    miss = explain_unsatisfiable(
        "Because only mooncake-transfer-engine<=0.3.13.post1 is available and you require "
        "mooncake-transfer-engine>=0.3.14, we can conclude ...",
        kv,
    )
    assert miss.relax == "mooncake-transfer-engine" and miss.distribution == "mooncake-transfer-engine>=0.3.14"
    miss = explain_unsatisfiable("Because there is no version of flashinfer-python==0.7.3 and you require ...", kv)
    assert miss.relax == "flashinfer-python"
    assert explain_unsatisfiable("error: some other failure", kv) is None


def test_the_reconstruct_json_names_the_asked_indexes(wheels, tmp_path, monkeypatch):
    code, output, m = _reconstruct(wheels, tmp_path, monkeypatch, None, "--relax", "needy[azure]", "--json")
    assert code == 0, output
    doc = json.loads(output[output.index("{") :])
    assert doc["steps"][0]["indexes"][0].endswith("/cu130")


# --------------------------------------------------------------------------- release day, end to end
def test_upgrade_to_an_unshipped_release_relaxes_for_review_and_writes_what_it_needs(
    wheels, tmp_path, monkeypatch, make_site_packages
):
    """`upgrade --to X -o DIR` for a release with no manifest, no recipes table and no series in the checkout:
    its base is reconstructed from its sdist (the PyTorch stand-in answering, `needy[azure]` missing from every
    index: relaxed by the replay itself), the series ported, and DIR gets the manifest, the recipes table and
    the series; the verdict is exit 1 with the relaxation named, never exit 4."""
    from tests.test_port import A_MOD, HEADER, PATCHED_A, PROBE, diff, tree

    a_tree = tree(tmp_path / "a-tree", A_MOD)
    b_tree = tree(tmp_path / "b-tree", A_MOD)
    series = tmp_path / "series-0.98.0"
    series.mkdir()
    (series / "0001-f.patch").write_text(HEADER.format(v="0.98.0") + diff("toy/mod.py", A_MOD, PATCHED_A))
    (series / "0001-f.probe.py").write_text(PROBE)
    (series / "series").write_text("0001-f.patch\n")
    sp = make_site_packages(tmp_path / "a-sp", ["purepkg==1.0.0"])
    base_a = tmp_path / "a.json"
    r = CliRunner().invoke(
        main,
        [
            "base",
            "snapshot",
            "--site-packages",
            str(sp),
            "--python",
            "3.12",
            "--glibc",
            "2.35",
            "--cuda",
            "13.0",
            "-o",
            str(base_a),
        ],
    )
    assert r.exit_code == 0, r.output
    out = tmp_path / "pr"
    with serve_index(wheels["torch"], prefix="cu130") as torch_url:
        sd = write_sdist(
            tmp_path,
            "0.99.0",
            {
                "docker/Dockerfile": DOCKERFILE.replace("@TORCH@", torch_url.rsplit("/", 1)[0]),
                ".buildkite/release-pipeline.yaml": PIPELINE,
                **REQS,
            },
        )
        with serve_index({**wheels["python"], sd: T_VLLM}) as url:
            monkeypatch.setenv("UV_DEFAULT_INDEX", url)
            args = [
                "upgrade",
                "--from",
                "0.98.0",
                "--to",
                "0.99.0",
                "--series",
                str(series),
                "--from-wheel",
                str(a_tree),
                "--to-wheel",
                str(b_tree),
                "--base-from",
                str(base_a),
                "--no-default-overlay",
                "--with",
                "purepkg",
                "--format",
                "json",
                "-o",
                str(out),
            ]
            strict = CliRunner().invoke(main, [*args[:-2], "--strict"])
            r = CliRunner().invoke(main, args)
    assert strict.exit_code == 4 and "--relax 'needy[azure]'" in strict.output  # --strict: no way forward taken
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["relaxed"] == ["needy[azure] (added by upgrade: what it needs is on no index the replay can ask)"]
    assert doc["needs_review"][0].startswith("base: relaxed needy[azure]")
    assert any(n.startswith("relaxed: needy[azure]") for n in doc["base_notes"])
    m = load_manifest(out / "lockfiles" / "base" / "vllm-openai-v0.99.0.json")
    assert m.get("needy").version == "1.0.0" and m.get("torchlike").version == "2.0.0+cu130"
    from builder.resolve.recipe import parse_recipes

    tables = parse_recipes((out / "lockfiles" / "base" / "recipes.toml").read_text())
    assert "0.99.0" in tables and "0.26.0" in tables  # B's table beside the shipped ones
    assert [p.parent.name for p in (out / "patches").glob("*/*/series")] == ["0.99.0"]  # the ported series
    assert (out / "upgrade-0.98.0-0.99.0.json").is_file()
