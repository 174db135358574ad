"""The recipe reader: a release's build files → its image recipe with provenance (builder/resolve/recipe.py).

Fast tests read the hand-written miniatures of tests/fx_sdist.py and small snippets; the slow ones read
the nine shipped releases' real sdists (downloaded once, sha256-verified) and require recipes.toml to be
exactly their derivation."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone

import pytest
from click.testing import CliRunner

from builder.cli import main
from builder.errors import BadInput
from builder.resolve import recipe as R
from tests.fx_sdist import DOCKERFILE, PIPELINE, build_files, write_sdist

SHA = "0" * 64


def derive(dockerfile=DOCKERFILE, pipeline=PIPELINE, requirements=None, vllm="0.99.0") -> R.Recipe:
    return R.derive(
        R.BuildFiles(vllm, R.SdistRef(f"vllm-{vllm}.tar.gz", SHA), build_files(dockerfile, pipeline, requirements))
    )


def line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


# --------------------------------------------------------------------------- the miniature, value by value
def test_build_args_override_arg_defaults_with_the_pipeline_line_as_provenance():
    r = derive()
    # CUDA_VERSION and UBUNTU_VERSION overridden by the pipeline
    assert r.final_base_image.value == "nvidia/cuda:13.0.2-base-ubuntu24.04"
    assert str(r.final_base_image.where[0]) == f"docker/Dockerfile:{line_of(DOCKERFILE, 'AS vllm-runtime-base')}"
    assert f".buildkite/release-pipeline.yaml:{line_of(PIPELINE, 'UBUNTU_VERSION=24.04')}" in map(str, r.os.where)
    assert (r.os.value, r.glibc.value, r.platform) == ("Ubuntu 24.04", "2.39", "x86_64-manylinux_2_39")
    assert r.glibc.rule == R.UBUNTU_GLIBC_SOURCE
    assert (
        r.cuda.value == "13.0"
        and str(r.cuda.where[0]) == f".buildkite/release-pipeline.yaml:{line_of(PIPELINE, 'CUDA_VERSION=13.0.2')}"
    )
    assert r.python.value == "3.12" and str(r.python.where[0]) == "docker/Dockerfile:3"
    assert r.site_packages.value == "/usr/local/lib/python3.12/dist-packages"
    assert str(r.site_packages.where[0]) == f"docker/Dockerfile:{line_of(DOCKERFILE, 'apt-get update -y')}"
    assert r.pipeline_step.value == R.RELEASE_STEP
    assert dict(r.build_args)["torch_cuda_arch_list"].value == "9.0 10.0"  # the pipeline's env expanded
    assert "build" not in dict(r.build_args)  # the metadata-args substitution is not a build arg


def test_the_stage_chain_to_the_target_and_only_its_steps():
    r = derive()
    assert [s.value.split(" FROM ")[0] for s in r.stages] == [
        "vllm-runtime-base",
        "vllm-base",
        "vllm-openai-base",
        "vllm-openai",
    ]
    every = [x for s in r.steps for x in s.requirements]
    assert "sagemaker-only" not in every and "nothing-that-counts" not in every  # other targets' stages


def test_every_install_step_in_dockerfile_order_with_what_it_takes():
    r = derive()
    kinds = [(s.n, s.replay, s.requirements or s.requirement_files) for s in r.steps]
    assert kinds == [
        (1, "index", ("uv",)),
        (2, "index", ("requirements/cuda.txt",)),
        (3, "off-index", ("jit-cache==0.6.14",)),
        (4, "index", ("accelerate", "timm>=1.0.17")),
        (5, "index", ("vllm==0.99.0",)),
        (6, "source-build", ("ep_kernels/dist/*.whl",)),
        (7, "index", ("requirements/kv_connectors.txt",)),
        (8, "uninstall", ("moon-engine",)),
        (9, "index", ("moon-engine-cuda13=={installed:moon-engine}",)),
    ]
    s = {x.n: x for x in r.steps}
    assert s[1].installer == "pip" and s[2].installer == "uv"
    assert s[1].overrides == ()  # the override file is written after it
    assert s[2].overrides == ("nvidia-nccl-cu13==2.30.7",)  # UV_OVERRIDE, the file its RUN wrote
    assert [d.value for d in r.image_overrides] == ["nvidia-nccl-cu13==2.30.7"]  # still in the image's ENV
    assert [str(w) for w in s[2].override_where] == [
        f"docker/Dockerfile:{line_of(DOCKERFILE, 'CUDA_MAJOR=$(echo')}",
        f"docker/Dockerfile:{line_of(DOCKERFILE, 'ENV UV_OVERRIDE')}",
    ]
    assert s[2].extra_index_urls == ("https://download.example.invalid/whl/cu130",)  # $(... | tr -d '.')
    assert s[2].file_indexes == ("https://jit.example.invalid/whl/ (requirements/cuda.txt:2)",)
    assert s[3].index_url == "https://jit.example.invalid/whl/cu130" and s[3].names == ("jit-cache",)
    assert "stands for it" in s[5].note  # the image's own wheel: the release's wheel on the index
    assert s[6].names == ("deep-ep",)
    assert s[7].constrain_installed == ("torch", "triton") and s[7].flags == ("--no-build",)
    assert s[7].fallback and "--no-build-isolation" in s[7].fallback
    assert s[8].when_installed == s[9].when_installed == "moon-engine"
    assert s[9].constrain_installed == ("torch", "triton")
    assert str(s[7].where) == f"docker/Dockerfile:{line_of(DOCKERFILE, 'source=requirements,target')}"  # the RUN's line


def test_a_false_condition_drops_its_install_and_a_default_arg_applies():
    pipe = PIPELINE.replace("--build-arg INSTALL_KV_CONNECTORS=true \\\n", "")
    r = derive(pipeline=pipe)
    assert [s.n for s in r.steps] == [1, 2, 3, 4, 5, 6]  # INSTALL_KV_CONNECTORS defaults to false
    r = derive(pipeline=PIPELINE.replace("UBUNTU_VERSION=24.04", "UBUNTU_VERSION=22.04"))
    assert (r.os.value, r.glibc.value) == ("Ubuntu 22.04", "2.35")


def test_unversioned_names_and_what_a_replay_lacks():
    r = derive()
    assert set(r.unversioned_names()) == {"jit-cache", "deep-ep"}
    lacks = r.lacks()
    assert any("jit-cache" in x for x in lacks["off_index"]) and any("deep-ep" in x for x in lacks["source_builds"])
    assert any(x.startswith("https://download.example.invalid/whl/cu130:") for x in lacks["other_indexes"])
    assert "python3.12" in lacks["os_packages"]


def test_the_recipe_table_round_trips_through_recipes_toml():
    r = derive()
    text = R.render_recipes({"0.99.0": R.recipe_table(r)})
    assert text.startswith("# GENERATED FILE: do not edit.") and "build-image base recipe --vllm X --write" in text
    back = R.parse_recipes(text)
    assert back == {"0.99.0": R.recipe_table(r)}
    t = back["0.99.0"]
    assert t["from"]["glibc"][0].startswith("docker/Dockerfile:") and t["rules"]["glibc"] == R.UBUNTU_GLIBC_SOURCE
    with pytest.raises(BadInput, match="'schema' must be 'build-image/base-recipes/v2'"):
        R.parse_recipes('schema = "build-image/base-recipes/v1"\n')


# --------------------------------------------------------------------------- the named interpretation rules
@pytest.mark.parametrize(
    "cmd, value",
    [
        ("echo $CUDA_VERSION | cut -d. -f1", "13"),
        ("echo $CUDA_VERSION | cut -d. -f1,2 | tr -d '.'", "130"),
        ("echo ${CUDA_VERSION} | cut -d. -f1,2 | tr '.' '-'", "13-0"),
        ("echo $CUDA_VERSION | cut -d. -f1,2", "13.0"),
        (
            """python3 -c "import importlib.metadata as m; print(m.version('a-b'))" 2>/dev/null || true""",
            "{installed:a-b}",
        ),
    ],
)
def test_substitutions(cmd, value):
    assert R.substitute(cmd, {"CUDA_VERSION": "13.0.2"}.__getitem__) == value


def test_an_unknown_substitution_is_not_guessed():
    with pytest.raises(R.Unknown, match=r"\$\(uname -m\)"):
        R.substitute("uname -m", {}.__getitem__)


@pytest.mark.parametrize(
    "raw, words",
    [
        ('"${V%%.*}"', ["13"]),
        ("${V%.*}", ["13.0"]),
        ("${E:-dflt}", ["dflt"]),
        ("${V:+set}", ["set"]),
        ("'$V'", ["$V"]),
        ('"a b"', ["a b"]),
        ("$W", ["x", "y"]),
        ('"$W"', ["x y"]),
        ("pre${V}post", ["pre13.0.2post"]),
    ],
)
def test_expansion(raw, words):
    env = {"V": "13.0.2", "E": "", "W": "x y"}
    assert R.expand(raw, env.__getitem__) == words


def test_the_shell_reader_takes_the_left_of_or_and_records_the_fallback():
    seq = R.parse_script("a && b || ( c; d ); if [ x = y ]; then e; elif [ -n z ]; then f; else g; fi")
    assert isinstance(seq.items[0], R.AndOr) and seq.items[0].rest[1][0] == "||"
    assert isinstance(seq.items[1].first, R.If) and len(seq.items[1].first.branches) == 2


# --------------------------------------------------------------------------- bad input: exit 2, naming the file
def test_a_dockerfile_without_the_target_stage_is_refused():
    with pytest.raises(BadInput, match=r"docker/Dockerfile has no stage 'vllm-openai' \(stages: .*vllm-sagemaker"):
        derive(dockerfile=DOCKERFILE.replace("AS vllm-openai\n", "AS vllm-api\n"))


def test_a_build_step_whose_machine_nothing_names_is_refused_naming_its_line():
    with pytest.raises(
        BadInput, match=r"release-pipeline.yaml:\d+: the step 'Build image' may build r:\{commit\}-x86_64"
    ):
        derive(pipeline=PIPELINE.replace("Build release image - x86_64 - CUDA 13.0", "Build image"))


def test_an_sdist_without_its_dockerfile_or_a_requirements_file_is_refused():
    with pytest.raises(BadInput, match=r"vllm-0.99.0.tar.gz has no docker/Dockerfile"):
        derive(dockerfile=None)
    with pytest.raises(BadInput, match=r"vllm-0.99.0.tar.gz has no requirements/kv_connectors.txt \(step 7"):
        derive(requirements={"requirements/cuda.txt": "torch\n"})


def test_an_install_the_reader_cannot_interpret_is_refused_with_its_line():
    bad = DOCKERFILE.replace(
        'RUN uv pip install --system accelerate "timm${TIMM_VERSION}"', 'RUN uv pip install --system "acc$(uname -m)"'
    )
    with pytest.raises(BadInput, match=rf"docker/Dockerfile:{line_of(bad, 'uname -m')}: cannot interpret the RUN line"):
        derive(dockerfile=bad)


# --------------------------------------------------------------------------- the command
@pytest.fixture()
def sdist_index(tmp_path, monkeypatch):
    from tests.fx_index import serve_index

    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path / "cache"))
    p = write_sdist(tmp_path, "0.99.0", build_files())
    with serve_index({p: datetime(2026, 4, 2, tzinfo=timezone.utc)}) as url:
        monkeypatch.setenv("UV_DEFAULT_INDEX", url)
        yield p


def test_base_recipe_prints_the_recipe_and_writes_recipes_toml(sdist_index, tmp_path):
    import hashlib

    sha = hashlib.sha256(sdist_index.read_bytes()).hexdigest()
    out = tmp_path / "recipes.toml"
    r = CliRunner().invoke(main, ["base", "recipe", "--vllm", "0.99.0", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["sdist"] == {"filename": "vllm-0.99.0.tar.gz", "sha256": sha}
    assert doc["glibc"]["value"] == "2.39" and doc["steps"][1]["overrides"] == ["nvidia-nccl-cu13==2.30.7"]
    r = CliRunner().invoke(
        main, ["base", "recipe", "--vllm", "0.99.0", "--write", "--recipes", str(out)], catch_exceptions=False
    )
    assert r.exit_code == 0 and "stage vllm-openai-base" in r.output
    assert f"wrote the table of 0.99.0 into {out}" in r.output
    assert R.parse_recipes(out.read_text())["0.99.0"]["sdist_sha256"] == sha


def test_base_recipe_of_a_release_without_an_sdist_is_exit_2_and_writes_nothing(sdist_index, tmp_path):
    out = tmp_path / "recipes.toml"
    r = CliRunner().invoke(main, ["base", "recipe", "--vllm", "0.98.0", "--write", "--recipes", str(out)])
    assert r.exit_code == 2 and "vllm 0.98.0 has no sdist (vllm-0.98.0.tar.gz) on the index" in r.output
    assert not out.exists()


@pytest.mark.parametrize(
    "files, message",
    [
        (
            build_files(dockerfile=DOCKERFILE.replace("AS vllm-openai\n", "AS x\n")),
            "docker/Dockerfile has no stage 'vllm-openai'",
        ),
        (
            build_files(dockerfile=DOCKERFILE.replace("AS vllm-openai-base\n", "AS vllm-api-base\n")),
            "stage 'vllm-openai' is built FROM 'vllm-openai-base', which is no stage of docker/Dockerfile",
        ),
        (
            build_files(pipeline=PIPELINE.replace("vllm/vllm-openai:v$RELEASE_VERSION", "vllm/vllm-openai:nightly")),
            "no command in .buildkite/release-pipeline.yaml or the scripts it calls publishes vllm/vllm-openai:v0.99.0",
        ),
        (build_files(dockerfile=None), "vllm-0.99.0.tar.gz has no docker/Dockerfile"),
        (build_files(pipeline=None), "vllm-0.99.0.tar.gz has no .buildkite/release-pipeline.yaml"),
    ],
    ids=["no-target-stage", "no-stage-of-the-chain", "no-publish", "no-dockerfile", "no-pipeline"],
)
def test_base_recipe_of_an_sdist_lacking_what_it_needs_is_exit_2_naming_it_and_writes_nothing(
    tmp_path, monkeypatch, files, message
):
    from tests.fx_index import serve_index

    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path / "cache"))
    p = write_sdist(tmp_path, "0.99.0", files)
    out = tmp_path / "recipes.toml"
    # a recipes file build-image wrote (a hand-written one is refused before anything: the output rule)
    out.write_text(before := "# GENERATED FILE: do not edit.  Written by `build-image base recipe --vllm X`\n")
    with serve_index({p: datetime(2026, 4, 2, tzinfo=timezone.utc)}) as url:
        monkeypatch.setenv("UV_DEFAULT_INDEX", url)
        r = CliRunner().invoke(main, ["base", "recipe", "--vllm", "0.99.0", "--write", "--recipes", str(out)])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert out.read_text() == before and sorted(x.name for x in tmp_path.iterdir()) == sorted(
        ["cache", "recipes.toml", "vllm-0.99.0.tar.gz"]
    )


def test_a_corrupt_cached_sdist_is_fetched_again_and_verified(sdist_index, tmp_path, monkeypatch):
    from builder.errors import BuildImageError
    from builder.fetch import cached_path
    from builder.resolve import sdist

    sha = hashlib.sha256(sdist_index.read_bytes()).hexdigest()
    path, _ = sdist.sdist_file("0.99.0")
    assert path == cached_path(sha, "vllm-0.99.0.tar.gz")
    path.write_bytes(b"not the sdist")  # damaged in the cache
    again, ref = sdist.sdist_file("0.99.0", sha256=sha)  # not served from the cache: the index is asked again
    assert ref.sha256 == sha and again.read_bytes() == sdist_index.read_bytes()
    again.write_bytes(b"damaged once more")
    monkeypatch.setenv("UV_DEFAULT_INDEX", "http://127.0.0.1:9/simple")  # no index: a damaged copy is never used
    with pytest.raises(BuildImageError):
        sdist.sdist_file("0.99.0", sha256=sha)


def test_a_download_whose_bytes_differ_from_the_index_hash_is_refused(tmp_path, monkeypatch):
    from builder.errors import IntegrityError
    from builder.fetch import downloads_dir
    from builder.resolve import sdist
    from builder.resolve.index import IndexFile

    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path / "cache"))
    p = write_sdist(tmp_path, "0.99.0", build_files())

    class Index:  # lists the sdist with a hash its bytes do not have
        def files(self, name):
            return [IndexFile(filename=p.name, url=p.as_uri(), sha256="a" * 64, upload_time=None)]

    with pytest.raises(IntegrityError, match="expected " + "a" * 64):
        sdist.sdist_file("0.99.0", index=Index())
    assert not any(x.is_file() and not x.name.endswith(".part") for x in downloads_dir().rglob("*"))


# --------------------------------------------------------------------------- the nine real releases
RELEASES = ["0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"]


@pytest.mark.slow
@pytest.mark.parametrize("vllm", RELEASES)
def test_recipes_toml_is_exactly_the_derivation_of_each_release_sdist(vllm):
    from builder.resolve import sdist
    from builder.resolve.reconstruct import load_recipes

    table = load_recipes()[vllm]
    r = R.derive(sdist.load(vllm, sha256=table["sdist_sha256"]))
    assert R.recipe_table(r) == table


@pytest.mark.slow
@pytest.mark.parametrize("vllm", ["0.32.0", "0.33.0", "0.34.0"])
def test_the_aarch64_recipes_file_is_exactly_the_derivation_of_each_release_s_aarch64_step(vllm):
    from builder import platforms
    from builder.resolve import sdist
    from builder.resolve.reconstruct import default_recipes_path, load_recipes

    table = load_recipes(default_recipes_path(platforms.ARM64), platforms.ARM64)[vllm]
    files = sdist.load(vllm, sha256=table["sdist_sha256"])
    arm, x86 = R.derive(files, platform=platforms.ARM64), R.derive(files)
    assert R.recipe_table(arm) == table
    assert table["pipeline_step"] == "Build release image - aarch64 - CUDA 13.0"
    assert table["build_args"]["BUILD_BASE_IMAGE"].startswith("pytorch/manylinuxaarch64-builder:")
    assert table["sdist_sha256"] == load_recipes()[vllm]["sdist_sha256"]  # one sdist, two platforms' steps
    assert arm.glibc.value == x86.glibc.value and arm.platform.startswith("aarch64-")


@pytest.mark.slow
def test_the_shipped_releases_facts_as_their_files_say():
    from builder.resolve.reconstruct import load_recipes

    t = load_recipes()
    assert sorted(t) == RELEASES
    assert {v: t[v]["os"] for v in RELEASES} == {v: "Ubuntu 22.04" if v < "0.28" else "Ubuntu 24.04" for v in RELEASES}
    assert {t[v]["cuda"] for v in RELEASES} == {"13.0"} and {t[v]["python"] for v in RELEASES} == {"3.12"}
    steps = {v: [s for s in t[v]["steps"]] for v in RELEASES}
    for v in RELEASES:  # the kv-connectors step runs last among the index steps (INSTALL_KV_CONNECTORS=true)
        kv = [s for s in steps[v] if "requirements/kv_connectors.txt" in s.get("requirement_files", [])]
        assert kv and kv[0]["stage"] == "vllm-openai-base", v
    assert all(
        s.get("overrides") == ["nvidia-nccl-cu13==2.30.7"]
        for s in steps["0.30.0"]
        if s["n"] > 1 and s["replay"] != "uninstall"
    )  # the pip step before the file is written has none
    assert "overrides" not in json.dumps(steps["0.26.0"])  # no NCCL_VERSION before 0.27.0
    assert t["0.26.0"].get("image_overrides", []) == []
    assert t["0.33.0"]["image_overrides"] == ["nvidia-nccl-cu13==2.31.2"]
    # 0.34.0's torch step: requirements/cuda.txt (copied to /tmp/requirements-cuda.txt, behind an if on
    # INSTALL_RUBIN_PRERELEASE) from the PyTorch index first, the Python index as extra, unsafe-first-match
    torch = steps["0.34.0"][1]
    assert (
        torch["replay"],
        torch["requirement_files"],
        torch["index_url"],
        torch["extra_index_urls"],
        torch["index_strategy"],
    ) == (
        "index",
        ["requirements/cuda.txt"],
        "https://download.pytorch.org/whl/cu130",
        ["https://pypi.org/simple"],
        "unsafe-first-match",
    )
    assert not [s for s in steps["0.34.0"] if s["replay"] == "off-index" and not s.get("names")]


def test_the_sdist_is_downloaded_once_and_then_read_from_the_cache_by_its_recorded_sha256(
    sdist_index, tmp_path, monkeypatch
):
    from builder.resolve import sdist

    out = tmp_path / "recipes.toml"
    r = CliRunner().invoke(
        main, ["base", "recipe", "--vllm", "0.99.0", "--write", "--recipes", str(out)], catch_exceptions=False
    )
    assert r.exit_code == 0, r.output
    monkeypatch.setenv("UV_DEFAULT_INDEX", "http://127.0.0.1:9/simple")  # nothing listens: no index asked
    r = CliRunner().invoke(
        main, ["base", "recipe", "--vllm", "0.99.0", "--json", "--recipes", str(out)], catch_exceptions=False
    )
    assert r.exit_code == 0, r.output
    sha = R.parse_recipes(out.read_text())["0.99.0"]["sdist_sha256"]
    path, ref = sdist.sdist_file("0.99.0", sha256=sha)
    assert ref.sha256 == sha and path.read_bytes() == sdist_index.read_bytes()


def test_an_index_hash_other_than_the_recorded_one_is_an_integrity_error(sdist_index):
    from builder.errors import IntegrityError
    from builder.resolve import sdist

    with pytest.raises(IntegrityError, match="the index lists vllm-0.99.0.tar.gz with sha256"):
        sdist.sdist_file("0.99.0", sha256="f" * 64)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda d: d.replace('ENV UV_OVERRIDE=/etc/uv-overrides.txt', 'ENV UV_OVERRIDE="/etc/uv-overrides.txt'),
        lambda d: d.replace("RUN python3 -m pip install uv", "RUN python3 -m pip install 'uv"),
        lambda d: d.replace("ARG PYTHON_VERSION=3.12\n", ""),
    ],
)
def test_mangled_build_files_are_bad_input_never_an_internal_error(mangle):
    with pytest.raises(BadInput, match="vllm-0.99.0.tar.gz|docker/Dockerfile"):
        derive(dockerfile=mangle(DOCKERFILE))
