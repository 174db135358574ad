"""Smoke across several GPUs, on CPU: --tp / --pp / --distributed-executor-backend reach the
server (local `vllm serve`, docker `-e`, the Serve application's engine kwargs, the spec and
the RayService), NVLink multicast stays off in every environment smoke starts, the GPU count
is checked against nvidia-smi, and the Ray executor gets a loopback Ray head smoke starts and
stops by PID (or the cluster --ray-address names)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.errors import BadInput
from builder.events import SILENT, Recorder
from builder.serving.kuberay import serve_args
from builder.serving.smoke import SmokeConfig, render_text, run_smoke
from builder.serving.smoke.config import MULTICAST_OFF, check_gpus_visible, config_from_serving
from builder.serving.smoke.runner import prepare_launch
from builder.serving.smoke.serve import app_args
from builder.serving.smoke.server import build_docker_command, build_local_command
from builder.spec import parse_spec

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fake_openai_server.py"
CLI = [sys.executable, "-c", "import sys; from builder.cli import main; main(prog_name='build-image')"]
ENABLE_MULTICAST = {"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0", "NVSHMEM_DISABLE_NVLS": "0"}


def _serve_module():
    spec = importlib.util.spec_from_file_location(
        "build_image_serve_app_parallel", ROOT / "templates" / "serve" / "build_image_serve_app.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _local_run(tmp_path, record: Path, messages: list[str] | None = None, **kw) -> object:
    """`smoke --local` whose `vllm` is the fake server, recording its argv and environment."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    vllm_bin = " ".join(shlex.quote(a) for a in (sys.executable, str(FAKE), "--record", str(record)))
    kw.setdefault("boot_timeout", 60)
    cfg = SmokeConfig(
        model=str(model),
        vllm_bin=vllm_bin,
        log_file=str(tmp_path / "server.log"),
        rounds=1,
        concurrency=2,
        max_tokens=4,
        prompt_tokens=8,
        timeout=10,
        stop_grace=2,
        **kw,
    )
    return run_smoke(cfg, reporter=Recorder(messages) if messages is not None else SILENT)


def test_local_server_receives_parallel_flags_and_multicast_stays_off(tmp_path, monkeypatch):
    for k, v in ENABLE_MULTICAST.items():  # the caller's shell asks for multicast: smoke still turns it off
        monkeypatch.setenv(k, v)
    record = tmp_path / "record.json"
    rep = _local_run(tmp_path, record, tp=2, pp=2, distributed_executor_backend="mp", env=dict(ENABLE_MULTICAST))
    assert rep.passed, rep.failures
    seen = json.loads(record.read_text())
    argv = seen["argv"]
    assert argv[2:4] == ["serve", str((tmp_path / "model").resolve())]  # after the fake's own --record FILE
    assert _flag(argv, "--tensor-parallel-size") == "2"
    assert _flag(argv, "--pipeline-parallel-size") == "2"
    assert _flag(argv, "--distributed-executor-backend") == "mp"
    for k, v in MULTICAST_OFF.items():
        assert seen["env"][k] == v, k
    assert "RAY_ADDRESS" not in seen["env"] or seen["env"]["RAY_ADDRESS"] == os.environ.get("RAY_ADDRESS")
    assert rep.to_dict()["settings"]["distributed_executor_backend"] == "mp"
    assert "parallel: tp=2 pp=2 executor=mp" in render_text(rep)


def test_docker_and_serve_environments_keep_multicast_off(tmp_path):
    cfg = SmokeConfig(
        model=str(tmp_path),
        image="reg:5000/vllm:1",
        tp=4,
        distributed_executor_backend="ray",
        ray_address="127.0.0.1:6380",
        env=dict(ENABLE_MULTICAST),
        docker_bin="/usr/bin/docker",
    )
    launch = prepare_launch(cfg)
    argv = launch.argv
    env_args = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    for k, v in MULTICAST_OFF.items():
        assert f"{k}={v}" in env_args
        assert f"{k}={ENABLE_MULTICAST[k]}" not in env_args
    assert "RAY_ADDRESS=127.0.0.1:6380" in env_args
    assert _flag(argv, "--distributed-executor-backend") == "ray" and _flag(argv, "--tensor-parallel-size") == "4"
    # serve mode in the image: the runner's container gets the same -e lines and the backend as an app arg
    cfg = dataclasses.replace(cfg, serve=True, ray_address=None)
    launch = prepare_launch(cfg)
    env_args = [launch.argv[i + 1] for i, a in enumerate(launch.argv) if a == "-e"]
    for k, v in MULTICAST_OFF.items():
        assert f"{k}={v}" in env_args
    args = json.loads(_flag(launch.argv, "--args"))
    assert args["distributed_executor_backend"] == "ray" and args["tensor_parallel_size"] == 4
    # local serve mode: the runner's own environment
    cfg = dataclasses.replace(cfg, image=None)
    launch = prepare_launch(cfg)
    for k, v in MULTICAST_OFF.items():
        assert launch.env[k] == v
    # the plain docker command line builder, without the runner
    dk = build_docker_command(SmokeConfig(model=str(tmp_path), image="x:1", env={"NCCL_NVLS_ENABLE": "1"}), 1, "n", "d")
    assert "NCCL_NVLS_ENABLE=0" in dk and "NCCL_NVLS_ENABLE=1" not in dk


def test_serve_app_engine_kwargs_and_spec_carry_the_executor_backend():
    mod = _serve_module()
    cfg = mod.parse_args(
        {"model": "/m", "tensor_parallel_size": 2, "pipeline_parallel_size": 2, "distributed_executor_backend": "ray"}
    )
    kw = mod.engine_kwargs(cfg)
    assert kw["distributed_executor_backend"] == "ray" and kw["pipeline_parallel_size"] == 2
    argv = mod.vllm_cli_args(cfg, 8000)
    assert _flag(argv, "--distributed-executor-backend") == "ray"
    assert "distributed_executor_backend" not in mod.engine_kwargs(mod.parse_args({"model": "/m"}))
    with pytest.raises(ValueError, match="distributed_executor_backend"):
        mod.parse_args({"model": "/m", "distributed_executor_backend": "nccl"})
    spec = parse_spec(
        '[serving]\nmodel = "/models/q"\ngpus = 8\ntp = 4\npp = 2\ndistributed_executor_backend = "ray"\n', "spec.toml"
    )
    args = serve_args(spec)
    assert args["distributed_executor_backend"] == "ray"
    assert mod.engine_kwargs(mod.parse_args(args))["distributed_executor_backend"] == "ray"
    smoke_cfg = config_from_serving(spec.serving, model="/models/q")
    assert (smoke_cfg.tp, smoke_cfg.pp, smoke_cfg.distributed_executor_backend) == (4, 2, "ray")
    assert app_args(smoke_cfg, "/model")["distributed_executor_backend"] == "ray"
    local = build_local_command(smoke_cfg, 8000, ["vllm"])
    assert _flag(local, "--pipeline-parallel-size") == "2"
    with pytest.raises(BadInput, match="serving.distributed_executor_backend"):
        parse_spec('[serving]\ndistributed_executor_backend = "nccl"\n', "spec.toml")
    with pytest.raises(BadInput, match="serving.pp"):
        parse_spec('[serving]\npp = 0\n', "spec.toml")


@pytest.mark.parametrize(
    "kwargs,msg",
    [
        ({"tp": 0}, "--tp"),
        ({"pp": -1}, "--pp"),
        ({"tp": 2.0}, "--tp"),
        ({"distributed_executor_backend": "nccl"}, "--distributed-executor-backend"),
        ({"ray_address": "127.0.0.1:6379"}, "--ray-address"),
        ({"ray_address": "127.0.0.1:6379", "distributed_executor_backend": "ray", "serve": True}, "--ray-address"),
    ],
)
def test_parallel_settings_are_validated(tmp_path, kwargs, msg):
    with pytest.raises(BadInput, match=msg):
        SmokeConfig(model=str(tmp_path), **kwargs).validate()


def test_tp_times_pp_above_the_visible_gpus_is_bad_input(tmp_path, monkeypatch):
    check_gpus_visible(SmokeConfig(model=".", tp=4, pp=2), 8)
    check_gpus_visible(SmokeConfig(model=".", tp=64), None)  # no nvidia-smi: nothing to check against
    with pytest.raises(BadInput, match=r"--tp 4 x --pp 2 = 8 GPUs, but nvidia-smi reports 4"):
        check_gpus_visible(SmokeConfig(model=".", tp=4, pp=2), 4)
    # through the CLI, with an nvidia-smi that reports two GPUs: exit 2 before anything starts
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '100, 143771'\necho '100, 143771'\n")
    smi.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(
        CLI + ["smoke", "--local", "--model", str(model), "--tp", "4", "--vllm-bin", "/nonexistent"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "--tp 4" in r.stderr and "nvidia-smi reports 2" in r.stderr
    r = subprocess.run(
        CLI + ["smoke", "--local", "--model", str(model), "--distributed-executor-backend", "nccl"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 2 and "--distributed-executor-backend" in r.stderr


def test_ray_address_is_joined_without_starting_a_head(tmp_path):
    record = tmp_path / "record.json"
    messages: list[str] = []
    rep = _local_run(tmp_path, record, messages, tp=2, distributed_executor_backend="ray", ray_address="127.0.0.1:6390")
    assert rep.passed, rep.failures
    seen = json.loads(record.read_text())
    assert seen["env"]["RAY_ADDRESS"] == "127.0.0.1:6390"
    assert _flag(seen["argv"], "--distributed-executor-backend") == "ray"
    assert not any("Ray head" in m for m in messages)


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


@pytest.mark.slow
@pytest.mark.xdist_group("local-ray")  # one local Ray head at a time
def test_ray_executor_starts_and_stops_a_loopback_ray_head(tmp_path):
    pytest.importorskip("ray")
    record = tmp_path / "record.json"
    messages: list[str] = []
    # a Ray head on a loaded 2-core machine can take more than a minute to register its raylet
    rep = _local_run(tmp_path, record, messages, tp=2, distributed_executor_backend="ray", boot_timeout=180)
    assert rep.passed, rep.failures
    seen = json.loads(record.read_text())
    address = seen["env"]["RAY_ADDRESS"]
    host, port = address.rsplit(":", 1)
    assert host == "127.0.0.1"
    assert _flag(seen["argv"], "--distributed-executor-backend") == "ray"
    up = [m for m in messages if m.startswith(f"Ray head {address} up")]
    assert up, messages
    pid = int(up[0].rsplit("pid ", 1)[1].rstrip(")"))
    deadline = time.monotonic() + 10
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _pid_alive(pid), "the Ray head smoke started is still running"
    with socket.socket() as s:  # its GCS port is closed again
        s.settimeout(1)
        assert s.connect_ex((host, int(port))) != 0
