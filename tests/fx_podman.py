"""Fixture: podman (rootful, no daemon) with the stand-in base image in its store.

``podman_env``: the environment a ``build-image --engine podman`` subprocess runs with; the test is
skipped when ``podman`` is not installed, and when it cannot start a container here (a failure under
``BUILD_IMAGE_REQUIRE_DOCKER=1``: tests.fx_docker.missing).  The stand-in
(tests/fx_docker.py) is copied from Docker's store with ``docker save | podman load`` once per image ID:
podman never pulls.

Inside a container that lacks CAP_SYS_RESOURCE or has a hybrid cgroup hierarchy (this project's
sandboxes), podman's defaults (crun; nofile/nproc raised to the maximum) cannot start a container; the
fixture then runs podman with a ``CONTAINERS_CONF`` of its own (runc, cgroupfs, the host's limits),
written under the test's temp folder.  A CI VM runs podman's defaults.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fx_docker import DOCKER, missing

_SANDBOX_CONF = """\
[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


def _podman(args: list[str], env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, env=env, timeout=600, **kw)


def _load_standin(ref: str, env: dict) -> None:
    """``docker save REF | podman load`` unless podman holds the same image ID already."""
    want = subprocess.run(
        [DOCKER, "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True, check=True
    ).stdout.strip()
    have = _podman(["image", "inspect", "--format", "{{.Id}}", ref], env).stdout.strip()
    if have and want.endswith(have):
        return
    save = subprocess.Popen([DOCKER, "save", ref], stdout=subprocess.PIPE)
    load = _podman(["load"], env, stdin=save.stdout)
    save.wait(timeout=600)
    assert load.returncode == 0 and save.returncode == 0, load.stderr[-2000:]


@pytest.fixture(scope="session")
def podman_env(standin_base_image, tmp_path_factory) -> dict:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (scripts/services.sh install installs it)")
    env = dict(os.environ)
    _load_standin(standin_base_image.ref, env)
    probe = ["run", "--rm", "--pull=never", "--network=none", standin_base_image.ref, "true"]
    r = _podman(probe, env)
    if r.returncode != 0 and shutil.which("runc"):
        conf = tmp_path_factory.mktemp("podman") / "containers.conf"
        nofile = min(int(subprocess.run(["sh", "-c", "ulimit -Hn"], capture_output=True, text=True).stdout), 20000)
        conf.write_text(_SANDBOX_CONF.format(nofile=nofile, nproc=16384))
        env["CONTAINERS_CONF"] = str(conf)
        r = _podman(probe, env)
    if r.returncode != 0:  # installed but unable to run: a failure where the engines are required (CI)
        missing(f"podman cannot start a container here: {r.stderr.strip()[-300:]}")
    return env


def podman_inspect(ref: str, env: dict, fmt: str) -> str:
    return _podman(["image", "inspect", "--format", fmt, ref], env).stdout.strip()


def podman_path() -> Path:
    return Path(shutil.which("podman") or "podman")
