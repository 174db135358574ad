"""`base materialize`: the replay of a small release (a miniature sdist whose Dockerfile installs in steps, a
loopback index with made-up upload times) made an image on the stand-in floor, labelled as a replay, and used as
the pipeline's --base.  Fast tests: the pure parts and the bad inputs that stop before the engine."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import main
from builder.image import materialize as mat
from builder.image.replay_config import image_config
from builder.resolve.index import FindLinks
from builder.resolve.manifest import load_manifest
from builder.resolve.recipe import BuildFiles, SdistRef, derive
from tests.fx_index import serve_index
from tests.fx_sdist import write_sdist
from tests.fx_wheels import write_wheel

T_OLD = datetime(2026, 3, 1, 8, 0, 0, tzinfo=timezone.utc)
T_VLLM = datetime(2026, 4, 2, 10, 40, 32, tzinfo=timezone.utc)
T_NEW = datetime(2026, 4, 3, 9, 0, 0, tzinfo=timezone.utc)
VLLM = "0.99.0"

# Python 3.11 and a dist-packages under /usr/local: what the stand-in floor (Debian bookworm) holds
DOCKERFILE = """\
ARG CUDA_VERSION=13.0.1
ARG PYTHON_VERSION=3.11
ARG FINAL_BASE_IMAGE=nvidia/cuda:${CUDA_VERSION}-base-ubuntu22.04
FROM ${FINAL_BASE_IMAGE} AS build
FROM ${FINAL_BASE_IMAGE} AS vllm-base
ARG CUDA_VERSION
ARG PYTHON_VERSION
WORKDIR /vllm-workspace
ENV CUDA_HOME=/usr/local/cuda
ENV PATH="${CUDA_HOME}/bin:${PATH}"
RUN apt-get install -y python${PYTHON_VERSION}
RUN echo "purepkg==1.0.0" > /etc/uv-overrides.txt
ENV UV_OVERRIDE=/etc/uv-overrides.txt
COPY requirements/common.txt /tmp/requirements-common.txt
RUN uv pip install --system -r /tmp/requirements-common.txt
RUN uv pip install --system "extra-a>=1"
RUN --mount=type=bind,from=build,src=/workspace/dist,target=/vllm-workspace/dist uv pip install --system dist/*.whl
FROM vllm-base AS vllm-openai-base
ENV VLLM_USAGE_SOURCE production-docker-image
FROM vllm-openai-base AS vllm-openai
ENTRYPOINT ["vllm", "serve"]
"""

PIPELINE = """\
steps:
  - label: "Publish release images"
    commands:
      - "docker manifest create vllm/vllm-openai:v$RELEASE_VERSION r:$BUILDKITE_COMMIT-x86_64"
      - "docker manifest push vllm/vllm-openai:v$RELEASE_VERSION"
  - label: "Build release image - x86_64 - CUDA 13.0"
    commands:
      - "docker build --target vllm-openai -f docker/Dockerfile ."
      - "docker push r:$BUILDKITE_COMMIT-$(uname -m)"
"""


def _files() -> dict[str, str]:
    return {
        "docker/Dockerfile": DOCKERFILE,
        ".buildkite/release-pipeline.yaml": PIPELINE,
        "requirements/common.txt": "purepkg\n",
    }


VLLM_CLI = "import sys\n\ndef main():\n    print('vllm ' + ' '.join(sys.argv[1:]))\n"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path_factory.mktemp("bi-cache-mat")))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path_factory.mktemp("uv-cache-mat")))


@pytest.fixture(scope="module")
def index_files(tmp_path_factory) -> dict[Path, datetime]:
    d = tmp_path_factory.mktemp("materialize-wheels")
    return {
        write_wheel(
            d,
            "vllm",
            VLLM,
            "py3-none-any",
            {
                "vllm/__init__.py": f"__version__ = '{VLLM}'\n",
                "vllm/cli.py": VLLM_CLI,
                f"vllm-{VLLM}.dist-info/entry_points.txt": "[console_scripts]\nvllm = vllm.cli:main\n",
            },
            requires=["purepkg"],
        ): T_VLLM,
        write_wheel(d, "purepkg", "1.0.0", "py3-none-any", {"purepkg/__init__.py": ""}): T_OLD,
        write_wheel(d, "purepkg", "1.2.0", "py3-none-any", {"purepkg/__init__.py": ""}): T_OLD,
        write_wheel(d, "extra-a", "1.5.0", "py3-none-any", {"extra_a/__init__.py": ""}): T_OLD,
        write_wheel(d, "extra-a", "2.0.0", "py3-none-any", {"extra_a/__init__.py": ""}): T_NEW,  # after vllm
        write_sdist(d, VLLM, _files()): T_VLLM,
    }


@pytest.fixture(scope="module")
def standin_wheels() -> Path:
    """The stand-in base's own wheels (tests/fx_docker.py: standin_findlinks), from the shared cache: a
    module fixture, made before the tests' private cache is set."""
    from tests.fx_docker import standin_findlinks

    return standin_findlinks(())


def _recipe():
    return derive(BuildFiles(VLLM, SdistRef(f"vllm-{VLLM}.tar.gz", "0" * 64), _files()))


def _replay(url: str, tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """(recipes file, manifest) of the release: `base recipe --write` and `base reconstruct` from the index."""
    monkeypatch.setenv("UV_DEFAULT_INDEX", url)
    recipes, manifest = tmp_path / "recipes.toml", tmp_path / "replay.json"
    for args in (
        ["base", "recipe", "--vllm", VLLM, "--write", "--recipes", str(recipes)],
        ["base", "reconstruct", "--vllm", VLLM, "--recipes", str(recipes), "-o", str(manifest)],
    ):
        r = CliRunner().invoke(main, args, catch_exceptions=False)
        assert r.exit_code == 0, r.output
    return recipes, manifest


# --------------------------------------------------------------------------- pure parts
def test_the_image_config_is_the_release_dockerfile_s():
    cfg = image_config(BuildFiles(VLLM, SdistRef("x", "0" * 64), _files()), _recipe())
    env = [(e.name, e.value, e.from_floor) for e in cfg.env]
    assert env[0] == ("CUDA_VERSION", "13.0.1", False)  # what the nvidia/cuda base image sets
    assert ("PATH", "${CUDA_HOME}/bin:${PATH}", True) in env  # the floor's PATH: the engine expands it
    assert ("UV_OVERRIDE", "/etc/uv-overrides.txt", False) in env
    assert ("VLLM_USAGE_SOURCE", "production-docker-image", False) in env
    assert cfg.workdir == "/vllm-workspace" and cfg.entrypoint == ("vllm", "serve") and cfg.cmd is None
    text = mat.dockerfile_text(
        load_manifest_stub(), _recipe(), cfg, floor="floor:1", labels={"a": "x$y"}, overrides_path=None
    )
    assert 'ENV PATH="${CUDA_HOME}/bin:${PATH}"' in text and 'a="x\\$y"' in text  # a label is never expanded
    assert 'ENTRYPOINT ["vllm", "serve"]' in text and "--require-hashes" in text and "--no-index" in text


def test_an_env_value_with_a_control_character_is_refused_naming_its_line():
    from builder.errors import BadInput

    files = {**_files(), "docker/Dockerfile": DOCKERFILE.replace("ENV CUDA_HOME=/usr/local/cuda", "ENV A=\x07b")}
    with pytest.raises(BadInput, match=r"docker/Dockerfile:9: ENV A holds a control character"):
        image_config(BuildFiles(VLLM, SdistRef("x", "0" * 64), files), _recipe())


def load_manifest_stub():
    from builder.resolve.manifest import BaseManifest

    r = _recipe()
    return BaseManifest(
        image_ref=r.image,
        image_digest=None,
        os=None,
        glibc=r.glibc.value,
        python_version=r.python.value,
        python_abi="cp311",
        site_packages=r.site_packages.value,
        cuda=r.cuda.value,
        platform=r.platform,
        provenance_kind="reconstructed",
        provenance_method="-",
        distributions={},
        provenance_recipe={"sdist": {"filename": r.sdist.filename, "sha256": r.sdist.sha256}},
        uv_overrides=["purepkg==1.0.0"],
    )


def test_recipe_mismatches_name_each_field():
    m = load_manifest_stub()
    assert mat.recipe_mismatches(m, _recipe()) == []
    m.python_version, m.site_packages, m.uv_overrides = "3.12", "/x", None
    wrong = mat.recipe_mismatches(m, _recipe())
    assert [w.split(":")[0] for w in wrong] == ["python.version", "python.site_packages", "uv_overrides"]
    m.provenance_kind = "read-from-image"
    assert mat.recipe_mismatches(m, _recipe())[0].startswith("provenance.kind: manifest 'read-from-image'")


def test_select_wheels_takes_the_exact_version_before_the_instant(index_files, tmp_path):
    from builder.resolve.manifest import Distribution

    folder = next(iter(index_files)).parent
    m = load_manifest_stub()
    m.distributions = {"extra-a": Distribution("extra-a", "1.5.0"), "purepkg": Distribution("purepkg", "1.0.0")}
    chosen, missing = mat.select_wheels(m, FindLinks([folder]), before=None)
    assert {k: f.filename for k, f in chosen.items()} == {
        "extra-a": "extra_a-1.5.0-py3-none-any.whl",
        "purepkg": "purepkg-1.0.0-py3-none-any.whl",
    } and missing == []
    m.distributions["extra-a"] = Distribution("extra-a", "2.0.0")
    chosen, missing = mat.select_wheels(m, FindLinks([folder]), before=datetime(2000, 1, 1, tzinfo=timezone.utc))
    assert chosen == {} and [x.split(" ")[0] for x in missing] == ["extra-a==2.0.0", "purepkg==1.0.0"]


def test_the_replay_label_and_the_drift_check_s_words():
    from builder.resolve.base import replay_of, replay_words

    assert replay_of({"org.build-image.base.replay": "false"}) is None and replay_of(None) is None
    rep = replay_of({"org.build-image.base.replay": "true", "org.build-image.base.manifest-sha256": "ab"})
    assert (
        "REPLAY" in replay_words(rep)
        and "sha256 ab" in replay_words(rep)
        and "not the published" in (replay_words(rep))
    )


# --------------------------------------------------------------------------- bad input before the engine
def test_a_manifest_that_is_not_its_recipe_s_replay_is_exit_2_naming_the_fields(index_files, tmp_path, monkeypatch):
    with serve_index(index_files) as url:
        recipes, manifest = _replay(url, tmp_path, monkeypatch)
        doc = json.loads(manifest.read_text())
        doc["python"]["site_packages"] = "/opt/elsewhere"
        doc["provenance"]["recipe"]["sdist"]["sha256"] = "1" * 64
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(doc))
        r = CliRunner().invoke(
            main,
            ["base", "materialize", "--vllm", VLLM, "--manifest", str(bad), "--recipes", str(recipes)],
        )
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert "does not match the recipe of vllm 0.99.0" in out
    assert "python.site_packages: manifest '/opt/elsewhere'" in out
    assert "provenance.recipe.sdist.sha256" in out


def test_a_platform_the_engine_cannot_build_and_an_unknown_engine_are_exit_2(monkeypatch, tmp_path):
    import builder.image.materialize

    monkeypatch.setattr(builder.image.materialize, "builds_for", lambda platform: False)
    r = CliRunner().invoke(main, ["base", "materialize", "--vllm", VLLM, "--platform", "linux/arm64"])
    assert r.exit_code == 2 and "cannot build linux/arm64 images" in " ".join(r.output.split()), r.output
    monkeypatch.setenv("BUILD_IMAGE_ENGINE", "nerdctl")
    r = CliRunner().invoke(main, ["base", "materialize", "--vllm", VLLM])
    assert r.exit_code == 2 and "'nerdctl'" in r.output, r.output
    r = CliRunner().invoke(main, ["--engine", "lxc", "base", "materialize", "--vllm", VLLM])
    assert r.exit_code == 2 and "'lxc'" in r.output, r.output


# --------------------------------------------------------------------------- end to end on the stand-in floor
def _build_image(*args: str, env: dict | None = None, timeout: int = 1200) -> subprocess.CompletedProcess:
    from tests.fx_docker import run_pipeline

    return run_pipeline(list(args), env=env, timeout=timeout)


@pytest.mark.slow
@pytest.mark.docker
def test_materialize_a_small_base_and_build_on_it(
    index_files, standin_base_image, docker_engine, standin_wheels, tmp_path, monkeypatch
):
    from tests.fx_docker import DOCKER

    tag = "build-image-test/materialized:v0.99.0-replay"
    with serve_index(index_files) as url:
        recipes, manifest = _replay(url, tmp_path, monkeypatch)
        env = {"UV_DEFAULT_INDEX": url}
        r = _build_image(
            "base", "materialize", "--vllm", VLLM, "--manifest", str(manifest), "--recipes", str(recipes),
            "--from", standin_base_image.ref, "--tag", tag, "--json", env=env,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        # a floor the engine does not hold: exit 2 naming it, nothing pulled
        missing = _build_image(
            "base", "materialize", "--vllm", VLLM, "--manifest", str(manifest), "--recipes", str(recipes),
            "--from", "build-image-test/no-such-floor:1", "--tag", tag + "-x", env=env,
        )  # fmt: skip
    assert missing.returncode == 2 and "no-such-floor:1 is not in the local docker store" in missing.stderr
    doc = json.loads(r.stdout)
    digest = __import__("hashlib").sha256(manifest.read_bytes()).hexdigest()
    assert doc["replay"] is True and doc["manifest_sha256"] == digest and doc["distributions"] == 3
    info = docker_engine.inspect(tag)
    labels = info.labels
    assert labels["org.build-image.base.replay"] == "true"
    assert labels["org.build-image.base.manifest-sha256"] == digest
    assert labels["org.build-image.base.replays"] == "vllm/vllm-openai:v0.99.0"
    lacks = json.loads(labels["org.build-image.base.lacks"])
    assert "python3.11" in lacks["os_packages"] and standin_base_image.ref in lacks["floor"][0]
    cfg = json.loads(
        subprocess.run([DOCKER, "image", "inspect", tag], capture_output=True, text=True, check=True).stdout
    )[0]["Config"]
    assert cfg["Entrypoint"] == ["vllm", "serve"] and cfg["WorkingDir"] == "/vllm-workspace"
    env_of = dict(kv.split("=", 1) for kv in cfg["Env"])
    assert env_of["PATH"].startswith("/usr/local/cuda/bin:/usr/local/sbin")  # expanded from the floor's PATH
    assert env_of["CUDA_VERSION"] == "13.0.1" and env_of["VLLM_USAGE_SOURCE"] == "production-docker-image"
    # the entrypoint runs the replay's vllm, installed in the recipe's site-packages
    run = docker_engine.run(tag, ["--port", "1"])
    assert run.returncode == 0 and run.stdout.strip() == "vllm serve --port 1", run.stderr
    where = subprocess.run(
        [DOCKER, "run", "--rm", "--pull=never", "--network=none", "--entrypoint", "python3", tag, "-c",
         "import vllm, purepkg, importlib.metadata as m; print(vllm.__file__, m.version('purepkg'))"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert where.stdout.split() == ["/usr/local/lib/python3.11/dist-packages/vllm/__init__.py", "1.0.0"]

    # the replay as the pipeline's --base: its snapshot says it is a replay, the image builds on it
    fl = tmp_path / "findlinks"
    shutil.copytree(standin_wheels, fl)
    for p in fl.glob("vllm-0.26.0-*.whl"):
        p.unlink()
    for p in index_files:
        if p.name.endswith(".whl"):
            shutil.copy(p, fl / p.name)
    write_wheel(fl, "overlaypkg", "1.0.0", "py3-none-any", {"overlaypkg/__init__.py": ""}, requires=["purepkg"])
    out = tmp_path / "ctx"
    r = _build_image(
        "--vllm", VLLM, "--base", tag, "--no-patches", "--no-default-overlay", "--with", "overlaypkg==1.0.0",
        "--no-index", "--find-links",
        str(fl), "--lock", str(tmp_path / "requirements.lock"), "-o", str(out), "--tag", "build-image-test/on-replay",
        "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    summary = json.loads(r.stdout)
    assert summary["image_id"]
    shipped = json.loads((out / "checks" / "base-manifest.json").read_text())
    assert "REPLAY of vllm/vllm-openai:v0.99.0" in shipped["provenance"]["method"]
    assert shipped["distributions"]["vllm"]["version"] == VLLM


def test_manifest_fixture_is_a_replay(index_files, tmp_path, monkeypatch):
    with serve_index(index_files) as url:
        _recipes, manifest = _replay(url, tmp_path, monkeypatch)
    m = load_manifest(manifest)
    assert m.provenance_kind == "reconstructed"
    assert {k: d.version for k, d in m.distributions.items()} == {"extra-a": "1.5.0", "purepkg": "1.0.0", "vllm": VLLM}
    assert mat.recipe_mismatches(m, _recipe())[0].startswith("provenance.recipe.sdist.sha256")  # a made-up sha


@pytest.mark.slow
@pytest.mark.docker
def test_the_drift_check_says_it_compared_against_a_replay(
    index_files, standin_base_image, docker_engine, standin_wheels, tmp_path, monkeypatch
):
    """A replay tagged with the published name (the manifest's image.ref) is what the engine holds: the
    pipeline's drift check compares against it and says so, in its message and its summary."""
    published = f"vllm/vllm-openai:v{VLLM}"
    with serve_index(index_files) as url:
        recipes, manifest = _replay(url, tmp_path, monkeypatch)
        r = _build_image(
            "base", "materialize", "--vllm", VLLM, "--manifest", str(manifest), "--recipes", str(recipes),
            "--from", standin_base_image.ref, "--tag", published, env={"UV_DEFAULT_INDEX": url},
        )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "a REPLAY of vllm/vllm-openai:v0.99.0" in r.stdout and "the replay lacks:" in r.stdout
    assert "os packages: python3.11" in r.stdout  # the manifest's lacks, listed
    try:
        fl = tmp_path / "findlinks"
        shutil.copytree(standin_wheels, fl)
        for p in index_files:
            if p.name.endswith(".whl"):
                shutil.copy(p, fl / p.name)
        write_wheel(fl, "overlaypkg", "1.0.0", "py3-none-any", {"overlaypkg/__init__.py": ""})
        r = _build_image(
            "--vllm", VLLM, "--base", str(manifest), "--no-patches", "--no-default-overlay", "--with",
            "overlaypkg==1.0.0", "--no-index", "--find-links", str(fl), "--lock", str(tmp_path / "req.lock"),
            "-o", str(tmp_path / "ctx"), "--tag", "build-image-test/on-replay-drift", "--allow-base-drift", "--json",
        )  # fmt: skip
    finally:
        docker_engine.remove(published)
    assert r.returncode == 0, r.stderr[-4000:]
    said = " ".join(r.stderr.split())
    assert "a REPLAY of vllm/vllm-openai:v0.99.0 built by `build-image base materialize`" in said
    check = json.loads(r.stdout)["base_check"]
    digest = __import__("hashlib").sha256(manifest.read_bytes()).hexdigest()
    assert check["against_replay"] == {"replays": published, "manifest_sha256": digest}


@pytest.mark.slow
@pytest.mark.docker
def test_materialize_through_podman(index_files, standin_base_image, podman_env, tmp_path, monkeypatch):
    from tests.fx_podman import podman_inspect

    tag = "build-image-test/materialized-podman:v0.99.0-replay"
    env = {k: v for k, v in podman_env.items() if k == "CONTAINERS_CONF"}
    with serve_index(index_files) as url:
        recipes, manifest = _replay(url, tmp_path, monkeypatch)
        r = _build_image(
            "--engine", "podman", "base", "materialize", "--vllm", VLLM, "--manifest", str(manifest),
            "--recipes", str(recipes), "--from", standin_base_image.ref, "--tag", tag, "--json",
            env={**env, "UV_DEFAULT_INDEX": url},
        )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert podman_inspect(tag, podman_env, '{{index .Labels "org.build-image.base.replay"}}') == "true"
    assert json.loads(r.stdout)["image_id"].endswith(podman_inspect(tag, podman_env, "{{.Id}}"))
    from builder.engine import DockerEngine
    from tests.fx_podman import podman_path

    ran = DockerEngine(docker=str(podman_path()), env=podman_env).run(tag, ["--port", "2"])
    assert ran.returncode == 0 and ran.stdout.strip() == "vllm serve --port 2", ran.stderr
