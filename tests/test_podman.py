"""podman as the engine (`--engine podman`): the pipeline builds the stand-in overlay image with podman
(``--pull=never``), pushes it to the loopback registry (digest from ``--digestfile``, verified against the
registry) and podman runs it.  Skipped where podman is not installed or cannot start a container."""

from __future__ import annotations

import json
import shutil
import uuid

import pytest

from builder.engine import DockerEngine
from tests.fx_docker import run_pipeline, standin_findlinks
from tests.fx_podman import podman_inspect, podman_path
from tests.fx_wheels import write_wheel

pytestmark = [pytest.mark.slow, pytest.mark.docker]


def test_podman_builds_pushes_and_runs_the_standin_image(podman_env, standin_manifest, local_registry, tmp_path):
    fl = tmp_path / "findlinks"
    shutil.copytree(standin_findlinks(()), fl)
    write_wheel(fl, "overlaypkg", "1.0.0", "py3-none-any", {"overlaypkg/__init__.py": "VALUE = 7\n"})
    # a repository of its own: a podman rebuild of the same lock is another image (its bytecode's times)
    repo = f"{local_registry}/build-image-test/podman-{uuid.uuid4().hex[:8]}"
    r = run_pipeline(
        ["--engine", "podman", "--vllm", "0.26.0", "--base", str(standin_manifest), "--no-patches",
         "--no-default-overlay", "--with", "overlaypkg==1.0.0", "--no-index", "--find-links", str(fl),
         "--lock", str(tmp_path / "requirements.lock"), "-o", str(tmp_path / "ctx"), "--tag", repo, "--push", "--json"],
        env={k: v for k, v in podman_env.items() if k == "CONTAINERS_CONF"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    assert "build: podman, --network=none" in r.stderr and "base manifest verified against" in r.stderr
    summary = json.loads(r.stdout)
    assert summary["status"] == "pushed" and summary["digest"].startswith("sha256:")
    tag = summary["tags"][0]
    # built in podman's store (Docker's holds no such tag), with the labels render wrote
    assert podman_inspect(tag, podman_env, "{{.Id}}")
    assert podman_inspect(tag, podman_env, '{{index .Labels "org.build-image.vllm"}}') == "0.26.0"
    engine = DockerEngine(docker=str(podman_path()), env=podman_env)
    assert engine.kind == "podman" and engine.inspect(tag).id == summary["image_id"]
    ran = engine.run(tag, ["python3", "-c", "import overlaypkg, vllm; print(overlaypkg.VALUE, vllm.__version__)"])
    assert ran.returncode == 0 and ran.stdout.split() == ["7", "0.26.0"], ran.stderr
