"""Ray Serve application: vLLM's OpenAI-compatible server, configured by build-image.

The image built by build-image carries this module in its site-packages, so a
RayService's ``serveConfigV2`` can name it without installing anything at
start-up::

    applications:
    - name: llm
      route_prefix: /
      import_path: build_image_serve_app:build_app
      args: {model: /models/qwen, tensor_parallel_size: 8, max_model_len: 4096,
             gpu_memory_utilization: 0.96, max_num_seqs: 16}

``build_app(args)`` prefers Ray's own vLLM integration (``ray.serve.llm``,
``build_openai_app``) and falls back, for a ray without it, to a Serve
deployment that runs vLLM's OpenAI server in the replica and forwards HTTP to
it (single node only).

Importing this module needs neither a GPU, nor vllm, nor ray: every heavy import
is deferred into the functions that need it, so the image can import-check it.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Mapping

__all__ = ["build_app", "parse_args", "engine_kwargs", "llm_config", "serving_args", "vllm_cli_args", "backend"]

# name -> (type, default); a default of REQUIRED means the key must be given.
REQUIRED = object()
ARGS: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "model": (str, REQUIRED),
    "model_id": (str, None),
    "tensor_parallel_size": (int, 1),
    "pipeline_parallel_size": (int, 1),
    "max_model_len": (int, None),
    "gpu_memory_utilization": ((int, float), 0.90),
    "max_num_seqs": (int, None),
    "kv_cache_dtype": (str, "auto"),
    "cpu_offload_gb": ((int, float), 0.0),
    "trust_remote_code": (bool, False),
    "enforce_eager": (bool, False),
    "num_replicas": (int, 1),
    "accelerator_type": (str, None),
    "backend": (str, "auto"),  # auto | ray-serve-llm | vllm-server
}
BACKENDS = ("auto", "ray-serve-llm", "vllm-server")


def parse_args(args: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate the application args; unknown keys and wrong types raise ValueError naming the key."""
    args = dict(args or {})
    unknown = sorted(set(args) - set(ARGS))
    if unknown:
        raise ValueError(
            f"build_image_serve_app: unknown arg(s) {', '.join(unknown)} (known: {', '.join(sorted(ARGS))})."
        )
    cfg: dict[str, Any] = {}
    for key, (typ, default) in ARGS.items():
        if key not in args or args[key] is None:
            if default is REQUIRED:
                raise ValueError(f"build_image_serve_app: arg '{key}' is required.")
            cfg[key] = default
            continue
        val = args[key]
        is_bool = isinstance(val, bool)
        if not isinstance(val, typ) or (is_bool and typ is not bool):
            raise ValueError(f"build_image_serve_app: arg '{key}' has the wrong type ({type(val).__name__}: {val!r}).")
        cfg[key] = val
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "num_replicas"):
        if cfg[key] < 1:
            raise ValueError(f"build_image_serve_app: arg '{key}' must be >= 1, got {cfg[key]}.")
    if not 0.0 < float(cfg["gpu_memory_utilization"]) <= 1.0:
        raise ValueError(
            f"build_image_serve_app: arg 'gpu_memory_utilization' must be in (0, 1], got {cfg['gpu_memory_utilization']}."
        )
    if cfg["backend"] not in BACKENDS:
        raise ValueError(f"build_image_serve_app: arg 'backend' must be one of {', '.join(BACKENDS)}, got {cfg['backend']!r}.")
    if not cfg["model_id"]:
        cfg["model_id"] = cfg["model"].rstrip("/").rsplit("/", 1)[-1] or cfg["model"]
    return cfg


def engine_kwargs(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM engine arguments (the names of ``vllm.engine.arg_utils.EngineArgs``)."""
    kw: dict[str, Any] = {
        "tensor_parallel_size": cfg["tensor_parallel_size"],
        "pipeline_parallel_size": cfg["pipeline_parallel_size"],
        "gpu_memory_utilization": float(cfg["gpu_memory_utilization"]),
        "kv_cache_dtype": cfg["kv_cache_dtype"],
    }
    for key in ("max_model_len", "max_num_seqs"):
        if cfg.get(key) is not None:
            kw[key] = cfg[key]
    if cfg.get("cpu_offload_gb"):
        kw["cpu_offload_gb"] = float(cfg["cpu_offload_gb"])
    if cfg.get("trust_remote_code"):
        kw["trust_remote_code"] = True
    if cfg.get("enforce_eager"):
        kw["enforce_eager"] = True
    return kw


def llm_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """One ``ray.serve.llm.LLMConfig`` as a dict (no runtime_env: the image has everything)."""
    out: dict[str, Any] = {
        "model_loading_config": {"model_id": cfg["model_id"], "model_source": cfg["model"]},
        "engine_kwargs": engine_kwargs(cfg),
        "deployment_config": {"num_replicas": cfg["num_replicas"]},
    }
    if cfg.get("accelerator_type"):
        out["accelerator_type"] = cfg["accelerator_type"]
    return out


def serving_args(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The argument of ``ray.serve.llm.build_openai_app``."""
    return {"llm_configs": [llm_config(cfg)]}


def vllm_cli_args(cfg: Mapping[str, Any], port: int) -> list[str]:
    """Command line of vLLM's OpenAI server for the fallback backend."""
    argv = ["-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port),
            "--model", cfg["model"], "--served-model-name", cfg["model_id"]]
    for key, val in engine_kwargs(cfg).items():
        flag = "--" + key.replace("_", "-")
        if val is True:
            argv.append(flag)
        else:
            argv += [flag, str(val)]
    return argv


def upstream_url(base: str, path: str, query: str = "") -> str:
    """Where the fallback forwards a request: same path, same query string."""
    return f"{base}/{path}" + (f"?{query}" if query else "")


def _has_ray_serve_llm() -> bool:
    """True when ``ray.serve.llm`` imports (it needs ray's ``llm`` extra, e.g. pyarrow)."""
    try:
        if importlib.util.find_spec("ray.serve.llm") is None:
            return False
        importlib.import_module("ray.serve.llm")
        return True
    except Exception:  # noqa: BLE001 - any import failure means: use the fallback
        return False


def backend(cfg: Mapping[str, Any], *, has_ray_serve_llm: bool | None = None) -> str:
    """Which backend ``build_app`` uses for ``cfg``."""
    have = _has_ray_serve_llm() if has_ray_serve_llm is None else has_ray_serve_llm
    if cfg["backend"] == "ray-serve-llm" and not have:
        raise RuntimeError("build_image_serve_app: backend 'ray-serve-llm' requested but this ray has no ray.serve.llm.")
    if cfg["backend"] == "vllm-server" or (cfg["backend"] == "auto" and not have):
        if cfg["pipeline_parallel_size"] > 1:
            raise RuntimeError(
                "build_image_serve_app: the fallback backend (vLLM's server in one replica) serves one node only; "
                "pipeline parallelism across nodes needs ray.serve.llm (ray >= 2.44)."
            )
        return "vllm-server"
    return "ray-serve-llm"


def build_app(args: Mapping[str, Any] | None = None):
    """Ray Serve application builder (``import_path: build_image_serve_app:build_app``)."""
    cfg = parse_args(args)
    if backend(cfg) == "ray-serve-llm":
        from ray.serve.llm import build_openai_app

        return build_openai_app(serving_args(cfg))
    return _build_vllm_server_app(cfg)


def _build_vllm_server_app(cfg: Mapping[str, Any]):
    """Fallback: one replica holding all GPUs runs ``vllm.entrypoints.openai.api_server``
    as a child process; the Serve ingress forwards every request to it (streaming)."""
    import socket
    import subprocess
    import sys
    import time

    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse
    from ray import serve

    app = FastAPI()
    gpus = cfg["tensor_parallel_size"] * cfg["pipeline_parallel_size"]

    @serve.deployment(num_replicas=cfg["num_replicas"], ray_actor_options={"num_gpus": gpus})
    @serve.ingress(app)
    class VLLMServer:
        def __init__(self) -> None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            self.proc = subprocess.Popen([sys.executable, *vllm_cli_args(cfg, self.port)])
            self.base = f"http://127.0.0.1:{self.port}"
            deadline = time.monotonic() + 3600
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"vLLM server exited with code {self.proc.returncode} during start-up")
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                        break
                except OSError:
                    time.sleep(2)
            else:
                raise RuntimeError("vLLM server did not start listening within an hour")

        def check_health(self) -> None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with code {self.proc.returncode}")

        def __del__(self) -> None:
            proc = getattr(self, "proc", None)
            if proc is not None and proc.poll() is None:
                proc.terminate()

        @app.api_route("/{path:path}", methods=["GET", "POST"])
        async def forward(self, path: str, request: Request):
            import aiohttp

            session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
            upstream = await session.request(
                request.method, upstream_url(self.base, path, request.url.query), data=await request.body(),
                headers={k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization", "accept")},
            )

            async def body():
                try:
                    async for chunk in upstream.content.iter_any():
                        yield chunk
                finally:
                    upstream.release()
                    await session.close()

            return StreamingResponse(body(), status_code=upstream.status,
                                     media_type=upstream.headers.get("content-type"))

    return VLLMServer.bind()
