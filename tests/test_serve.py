"""The image's Ray Serve application (templates/serve/build_image_serve_app.py) on CPU:
the backend decision read from ray's metadata, and requests through a real local Ray
Serve deployment of the fallback to the fake OpenAI server (`smoke --serve`)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from builder.serving.smoke import SmokeConfig, render_text, run_smoke

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fake_openai_server.py"
MODULE = ROOT / "templates" / "serve" / "build_image_serve_app.py"


def load_module():
    spec = importlib.util.spec_from_file_location("build_image_serve_app_t", MODULE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


RAY_259_REQUIRES = [  # ray 2.59.0's metadata: its llm extra is written for vllm 0.27.0
    "click>=7.0",
    'vllm[audio]==0.27.0; extra == "llm"',
    'fastapi>=0.133.0; extra == "serve"',
]


def test_ray_llm_pin_is_read_from_the_metadata():
    m = load_module()
    assert m.ray_llm_vllm_pin(RAY_259_REQUIRES) == "vllm[audio]==0.27.0"
    assert m.ray_llm_vllm_pin(["click>=7.0", 'vllm>=0.5; extra == "serve"']) is None
    assert "requires vllm[audio]==0.27.0, but vllm 0.26.0 is installed" in m.pin_mismatch(
        "vllm[audio]==0.27.0", "0.26.0"
    )
    assert m.pin_mismatch("vllm[audio]==0.26.0", "0.26.0") is None
    assert m.pin_mismatch("vllm>=0.25,<0.27", "0.26.0") is None
    assert m.pin_mismatch(None, "0.26.0") is None


def test_installed_ray_metadata():
    pytest.importorskip("ray")
    from importlib import metadata

    m = load_module()
    pin = m.ray_llm_vllm_pin()
    assert pin is not None and pin.startswith("vllm") and "==" in pin, pin
    assert metadata.version("ray") == "2.58.1" and pin.endswith("==0.26.0")


def test_auto_falls_back_when_rays_llm_extra_targets_another_vllm():
    m = load_module()
    cfg = m.parse_args({"model": "/m"})
    why = m.pin_mismatch("vllm[audio]==0.27.0", "0.26.0")
    assert m.backend_decision(cfg, has_ray_serve_llm=True, mismatch=why) == ("vllm-server", why)
    assert m.backend_decision(cfg, has_ray_serve_llm=True, mismatch=None) == ("ray-serve-llm", None)
    assert m.backend_decision(cfg, has_ray_serve_llm=False, mismatch=None) == (
        "vllm-server",
        "this ray has no ray.serve.llm",
    )
    forced = m.parse_args({"model": "/m", "backend": "ray-serve-llm"})
    assert m.backend_decision(forced, has_ray_serve_llm=True, mismatch=why) == ("ray-serve-llm", None)
    with pytest.raises(RuntimeError, match="one node only.*requires vllm"):
        m.backend_decision(
            m.parse_args({"model": "/m", "pipeline_parallel_size": 2}), has_ray_serve_llm=True, mismatch=why
        )


def test_the_default_backend_is_the_images(monkeypatch):
    """The image carries the lock's serve-backend as BUILD_IMAGE_SERVE_BACKEND: it is the default of
    the application's `backend`; an explicit arg overrides it; a bad value names the variable."""
    m = load_module()
    monkeypatch.delenv("BUILD_IMAGE_SERVE_BACKEND", raising=False)
    assert m.parse_args({"model": "/m"})["backend"] == "auto"
    monkeypatch.setenv("BUILD_IMAGE_SERVE_BACKEND", "vllm-server")
    cfg = m.parse_args({"model": "/m"})
    assert cfg["backend"] == "vllm-server"
    # the lock's choice holds even where auto would take ray.serve.llm
    assert m.backend_decision(cfg, has_ray_serve_llm=True, mismatch=None) == (
        "vllm-server",
        "backend 'vllm-server' requested",
    )
    assert m.parse_args({"model": "/m", "backend": "ray-serve-llm"})["backend"] == "ray-serve-llm"
    monkeypatch.setenv("BUILD_IMAGE_SERVE_BACKEND", "ray-serve-llm")
    assert m.backend_decision(
        m.parse_args({"model": "/m"}), has_ray_serve_llm=True, mismatch="ray's llm extra requires vllm==0.27.0"
    ) == ("ray-serve-llm", None)
    monkeypatch.setenv("BUILD_IMAGE_SERVE_BACKEND", "fast")
    with pytest.raises(
        ValueError,
        match=r"\$BUILD_IMAGE_SERVE_BACKEND must be one of auto, ray-serve-llm, "
        r"vllm-server, got 'fast'",
    ):
        m.parse_args({"model": "/m"})


def test_smoke_serve_leaves_the_backend_to_the_image_unless_asked():
    from builder.serving.smoke.serve import app_args

    assert "backend" not in app_args(SmokeConfig(model="/m", serve=True), "/models/m")
    assert app_args(SmokeConfig(model="/m", serve=True, serve_backend="auto"), "/models/m")["backend"] == "auto"


def test_fallback_starts_vllm_serve():
    m = load_module()
    cfg = m.parse_args({"model": "/models/q", "enforce_eager": True, "max_num_batched_tokens": 8192})
    argv = m.vllm_command(cfg, 8123)
    assert argv[:4] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    assert argv[4] == "/models/q" and argv[argv.index("--port") + 1] == "8123"
    assert "--enforce-eager" in argv and argv[argv.index("--max-num-batched-tokens") + 1] == "8192"
    custom = m.vllm_command(m.parse_args({"model": "/m", "vllm_bin": "/opt/venv/bin/vllm"}), 1)
    assert custom[:3] == ["/opt/venv/bin/vllm", "serve", "/m"]
    assert m.forward_headers(
        {
            "Host": "x",
            "Content-Length": "3",
            "Content-Type": "application/json",
            "Transfer-Encoding": "chunked",
            "Authorization": "Bearer t",
        }
    ) == {"Content-Type": "application/json", "Authorization": "Bearer t"}


def test_the_fallback_route_annotations_resolve():
    """FastAPI reads the route's annotations at runtime: string annotations naming the local
    Request class made every request a 422 (the module must not defer annotations)."""
    src = MODULE.read_text()
    assert "from __future__ import annotations" not in src.split('"""', 2)[2]


def _serve_cfg(tmp_path, *fake_flags, **kw) -> SmokeConfig:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 1000}))
    kw.setdefault("rounds", 2)
    kw.setdefault("concurrency", 4)
    kw.setdefault("max_tokens", 8)
    kw.setdefault("prompt_tokens", 16)
    kw.setdefault("timeout", 30)
    kw.setdefault("boot_timeout", 240)
    kw.setdefault("stop_grace", 20)
    vllm_bin = " ".join([sys.executable, str(FAKE), *fake_flags])
    # the backend as an image built from a vllm-server lock sets it (ENV BUILD_IMAGE_SERVE_BACKEND),
    # not as an application arg: the application's default comes from the environment
    kw.setdefault("env", {"BUILD_IMAGE_SERVE_BACKEND": "vllm-server"})
    return SmokeConfig(
        model=str(model),
        serve=True,
        serve_num_gpus=1,
        vllm_bin=vllm_bin,
        plan=False,
        log_file=str(tmp_path / "serve.log"),
        **kw,
    )


def _own_ray_processes(temp_dir: str) -> list[int]:
    """Processes still running that belong to this test's Ray session (by its temp dir)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if temp_dir in cmd and state != "Z":
                out.append(int(d.name))
    return out


@pytest.mark.slow
@pytest.mark.xdist_group("local-ray")  # one local Ray head at a time
def test_requests_through_a_real_ray_serve_deployment_of_the_fallback(tmp_path):
    pytest.importorskip("ray.serve")
    rep = run_smoke(_serve_cfg(tmp_path, "--pidfile", str(tmp_path / "fake.pid")))
    text = render_text(rep)
    assert rep.verdict == "PASS", text
    # every request answered 200 through Serve's proxy, streaming (even) and not (odd); the chat round too
    assert [(r.kind, r.ok, r.failed) for r in rep.rounds] == [("completion", 4, 0)] * 2 + [("chat", 4, 0)]
    assert rep.boot["first_token_s"] is not None
    sv = rep.serve
    assert sv["ray_version"] == "2.58.1" and sv["backend"] == "vllm-server"
    assert sv["ray_start_s"] > 0 and sv["app_running_s"] > 0
    log = Path(tmp_path / "serve.log").read_text()
    assert "ServeReplica:llm:VLLMServer" in log and "backend vllm-server" in log
    assert "Starting vLLM server on" in log  # the fake's boot lines came through the replica
    assert rep.kv_cache["tokens"] == 3_024_928  # ... and were parsed like `vllm serve`'s
    # stopped by PID: the fake vLLM server, the replica and Ray's processes are gone
    pid = int((tmp_path / "fake.pid").read_text())
    assert (
        not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    )
    temp_dirs = [a for a in rep.command if a.startswith("/tmp/smoke-ray-")]
    assert temp_dirs and not _own_ray_processes(temp_dirs[0])
    assert not os.path.exists(temp_dirs[0])  # removed after a PASS


@pytest.mark.slow
@pytest.mark.xdist_group("local-ray")
def test_a_replica_that_fails_to_start_is_a_fail_with_the_replica_log(tmp_path):
    pytest.importorskip("ray.serve")
    rep = run_smoke(_serve_cfg(tmp_path, "--exit-during-boot", boot_timeout=240))
    text = render_text(rep)
    assert rep.verdict == "FAIL", text
    assert any(f.startswith("serve: ") and "Deploying application llm failed" in f for f in rep.failures), rep.failures
    joined = " ".join(rep.failures)
    assert "larger than the available KV cache memory" in joined or "vLLM server exited" in joined, rep.failures
    assert rep.serve["replica_log_tail"] and "replica log tail" in text
    assert "\x1b[" not in " ".join(rep.failures)  # no terminal colours in the report
    assert rep.serve["ray_temp_dir"] and os.path.isdir(rep.serve["ray_temp_dir"])  # kept for a FAIL


def test_runner_lines_are_read_into_the_report():
    from builder.serving.smoke import serve as sv

    text = "\n".join(
        [
            "build-image-serve: ray 2.58.1 started in 13.73 s (resources {\"GPU\": 1.0})",
            "build-image-serve: backend vllm-server (ray 2.59.0's llm extra requires vllm[audio]==0.27.0, but vllm "
            "0.26.0 "
            "is installed)",
            "(ServeReplica:llm:VLLMServer pid=8290) INFO ... vLLM server ready",
            "build-image-serve: status RUNNING {}",
            "build-image-serve: application RUNNING after 55.42 s (total 68.00 s)",
            "build-image-serve: replica restarted: deployment VLLMServer replicas {\"STARTING\": 1}: vLLM server "
            "exited with code 3",
            "build-image-serve: FAILED: application UNHEALTHY: replica died",
        ]
    )
    info = sv.parse_serve_lines(text)
    assert info["ray_version"] == "2.58.1" and info["ray_start_s"] == 13.73 and info["app_running_s"] == 55.42
    assert info["backend"] == "vllm-server" and "requires vllm[audio]==0.27.0" in info["backend_reason"]
    assert info["restarts"] == ['deployment VLLMServer replicas {"STARTING": 1}: vLLM server exited with code 3']
    assert info["failed"] == ["application UNHEALTHY: replica died"]
    assert sv.is_ready(text) and not sv.is_ready("build-image-serve: status DEPLOYING {}")


def test_serve_app_args_carry_the_serving_settings_and_refuse_what_the_app_cannot_take(tmp_path):
    from builder.errors import BadInput
    from builder.serving.smoke import serve as sv

    cfg = SmokeConfig(
        model=str(tmp_path),
        serve=True,
        tp=2,
        max_model_len=4096,
        gpu_memory_utilization=0.5,
        max_num_seqs=32,
        kv_cache_dtype="bf16",
        extra_args=["--enforce-eager", "--max-num-batched-tokens=8192"],
    )
    args = sv.app_args(cfg, "/model")
    assert args["model"] == "/model" and args["tensor_parallel_size"] == 2 and args["kv_cache_dtype"] == "bfloat16"
    assert args["enforce_eager"] is True and args["max_num_batched_tokens"] == 8192
    assert "backend" not in args  # the image's default (its lock's serve-backend)
    load_module().parse_args(args)  # the application accepts every key
    with pytest.raises(BadInput, match="--kv-cache-memory has no Serve application setting"):
        sv.app_args(SmokeConfig(model=str(tmp_path), serve=True, extra_args=["--kv-cache-memory", "2GiB"]), "/model")
