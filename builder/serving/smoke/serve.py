"""``smoke --serve``: the image's Ray Serve application on a local Ray head.

The server process is ``python -m build_image_serve_app run`` (the module the image
carries; locally the one in ``templates/serve/``): it starts a Ray head on loopback
with its own temp directory, deploys ``build_app(args)`` with the spec's serving
settings, and prints ``build-image-serve:`` lines (Ray start, application RUNNING,
status changes, a replica restart, FAILED) while Ray forwards every replica's output
(vLLM's engine included) to it.  The smoke client then talks to Serve's HTTP proxy exactly as
it talks to ``vllm serve``.  Pure functions (application args, commands, reading the
lines) plus the replica log files of the Ray session.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from builder.errors import BadInput
from builder.image.naming import SERVE_MODULE, serve_app_source
from builder.serving.smoke.config import SmokeConfig, with_multicast_off
from builder.serving.smoke.server import vllm_kv_cache_dtype

READY = re.compile(r"build-image-serve: application RUNNING after ([\d.]+) s")
RAY_STARTED = re.compile(r"build-image-serve: ray (\S+) started in ([\d.]+) s")
BACKEND = re.compile(r"build-image-serve: backend (\S+)(?: \((.*)\))?$")
FAILED = re.compile(r"build-image-serve: FAILED: (.*)")
RESTARTED = re.compile(r"build-image-serve: replica restarted: (.*)")

# `vllm serve` flags that have an application arg (everything else is refused in serve mode:
# the Serve application would silently not get it).
_FLAG_ARGS = {"--max-num-batched-tokens": ("max_num_batched_tokens", int)}


def app_args(cfg: SmokeConfig, model_arg: str) -> dict[str, Any]:
    """``build_app``'s args from the smoke settings (the same keys ``kuberay.serve_args`` renders)."""
    args: dict[str, Any] = {
        "model": model_arg,
        "model_id": Path(cfg.model).resolve().name or "model",
        "tensor_parallel_size": cfg.tp,
        "pipeline_parallel_size": cfg.pp,
    }
    if cfg.distributed_executor_backend is not None:
        args["distributed_executor_backend"] = cfg.distributed_executor_backend
    if cfg.serve_backend is not None:  # else the application's default: the image's BUILD_IMAGE_SERVE_BACKEND
        args["backend"] = cfg.serve_backend
    if cfg.max_model_len is not None:
        args["max_model_len"] = cfg.max_model_len
    if cfg.gpu_memory_utilization is not None:
        args["gpu_memory_utilization"] = float(cfg.gpu_memory_utilization)
    if cfg.max_num_seqs is not None:
        args["max_num_seqs"] = cfg.max_num_seqs
    if cfg.kv_cache_dtype:
        args["kv_cache_dtype"] = vllm_kv_cache_dtype(cfg.kv_cache_dtype)
    if cfg.cpu_offload_gb:
        args["cpu_offload_gb"] = float(cfg.cpu_offload_gb)
    if cfg.load_format:
        args["load_format"] = cfg.load_format
    extra = list(cfg.extra_args)
    i = 0
    while i < len(extra):
        a = extra[i]
        flag, _, inline = a.partition("=")
        if a == "--enforce-eager":
            args["enforce_eager"] = True
        elif flag in _FLAG_ARGS:
            key, typ = _FLAG_ARGS[flag]
            value = inline if inline else (extra[i + 1] if i + 1 < len(extra) else "")
            if not inline:
                i += 1
            try:
                args[key] = typ(value)
            except ValueError:
                raise BadInput(f"smoke: --extra-arg {flag} needs a number, got {value!r}") from None
        else:
            raise BadInput(
                f"smoke --serve: --extra-arg {a} has no Serve application setting (the application takes "
                f"--enforce-eager and {', '.join(sorted(_FLAG_ARGS))}); run it without --serve"
            )
        i += 1
    if cfg.vllm_bin and not cfg.image:
        args["vllm_bin"] = cfg.vllm_bin
    return args


def module_dir() -> Path:
    """Where this checkout keeps the Serve application module (put first on PYTHONPATH locally)."""
    return Path(serve_app_source()).parent


def runner_args(args: dict[str, Any], port: int, temp_dir: str, num_gpus: int | None = None) -> list[str]:
    argv = [
        "-m",
        SERVE_MODULE,
        "run",
        "--args",
        json.dumps(args, sort_keys=True),
        "--port",
        str(port),
        "--temp-dir",
        temp_dir,
    ]
    return argv + (["--num-gpus", str(num_gpus)] if num_gpus is not None else [])


def local_command(cfg: SmokeConfig, port: int, temp_dir: str) -> list[str]:
    python = cfg.serve_python or sys.executable
    return [python] + runner_args(app_args(cfg, str(Path(cfg.model).resolve())), port, temp_dir, cfg.serve_num_gpus)


def local_env(env: dict[str, str]) -> dict[str, str]:
    out = dict(env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(module_dir()), env.get("PYTHONPATH", "")) if p)
    return serve_env(out)


def serve_env(env: dict[str, str]) -> dict[str, str]:
    out = dict(env)
    out.setdefault("RAY_DEDUP_LOGS", "0")  # every replica line, not "[repeated 2x across cluster]"
    out.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    out.setdefault("RAY_COLOR_PREFIX", "0")  # plain "(ServeReplica:... pid=N)" prefixes in the log
    return with_multicast_off(out)


def parse_serve_lines(text: str) -> dict[str, Any]:
    """The runner's own lines: Ray's timings, the backend it chose and why, failures, restarts."""
    out: dict[str, Any] = {
        "ray_version": None,
        "ray_start_s": None,
        "app_running_s": None,
        "backend": None,
        "backend_reason": None,
        "failed": [],
        "restarts": [],
    }
    for line in text.splitlines():
        if m := RAY_STARTED.search(line):
            out["ray_version"], out["ray_start_s"] = m.group(1), float(m.group(2))
        elif m := READY.search(line):
            out["app_running_s"] = float(m.group(1))
        elif (m := BACKEND.search(line)) and out["backend"] is None:
            out["backend"], out["backend_reason"] = m.group(1), m.group(2)
        elif m := FAILED.search(line):
            out["failed"].append(m.group(1).strip()[:600])
        elif m := RESTARTED.search(line):
            out["restarts"].append(m.group(1).strip()[:600])
    return out


def is_ready(text: str) -> bool:
    return READY.search(text) is not None


def replica_log_tail(temp_dir: str | None, n: int = 40) -> tuple[str | None, list[str]]:
    """The newest worker log of a Serve replica in the Ray session under ``temp_dir``
    (Ray marks an actor's worker log with ``:actor_name:ServeReplica:...``)."""
    if not temp_dir:
        return None, []
    logs = Path(temp_dir) / "session_latest" / "logs"
    best: tuple[float, Path] | None = None
    try:
        files = list(logs.glob("worker-*.err")) + list(logs.glob("worker-*.out"))
    except OSError:
        return None, []
    for f in files:
        try:
            head = f.read_bytes()[:4096].decode("utf-8", "replace")
            if ":actor_name:ServeReplica" not in head or f.stat().st_size <= len(":actor_name:ServeReplica") + 40:
                continue
            mtime = f.stat().st_mtime
        except OSError:
            continue
        if best is None or mtime > best[0]:
            best = (mtime, f)
    if best is None:
        return None, []
    text = best[1].read_text("utf-8", "replace")
    return str(best[1]), [ln.rstrip()[:400] for ln in text.splitlines()[-n:]]
