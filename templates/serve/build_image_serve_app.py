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

The default ``backend`` is the image's: ``build-image render`` writes the lock's
``serve-backend`` into the image as ``ENV BUILD_IMAGE_SERVE_BACKEND`` (and the
``org.build-image.serve-backend`` label); an explicit ``backend`` arg overrides it,
and without the variable the default is ``auto``.

``auto`` uses ``ray.serve.llm`` only when the installed ray's ``llm`` extra pins
the installed vllm (a ray whose LLM integration targets another vllm fails in
every replica); otherwise it falls back, and the replica log says why.

``python -m build_image_serve_app run --args JSON --port P`` starts a local Ray
head on loopback, deploys the application on it and keeps it running until
SIGTERM/SIGINT, printing timing and status lines prefixed ``build-image-serve:``
(``build-image smoke --serve`` runs it).

Importing this module needs neither a GPU, nor vllm, nor ray: every heavy import
is deferred into the functions that need it, so the image can import-check it.

No ``from __future__ import annotations`` here: FastAPI reads the annotations of
the fallback's route (``request: Request``) at runtime, and a string annotation
naming a class imported inside a function cannot be resolved (every request
then answers 422).
"""

import importlib
import importlib.util
import json
import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["build_app", "parse_args", "engine_kwargs", "llm_config", "serving_args", "vllm_cli_args", "backend",
           "backend_decision", "ray_llm_vllm_pin", "default_backend", "main"]

log = logging.getLogger("build_image_serve_app")

# name -> (type, default); a default of REQUIRED means the key must be given.
REQUIRED = object()
ARGS: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "model": (str, REQUIRED),
    "model_id": (str, None),
    "tensor_parallel_size": (int, 1),
    "pipeline_parallel_size": (int, 1),
    "distributed_executor_backend": (str, None),  # mp | ray (None: vLLM's choice)
    "max_model_len": (int, None),
    "gpu_memory_utilization": ((int, float), 0.90),
    "max_num_seqs": (int, None),
    "max_num_batched_tokens": (int, None),
    "kv_cache_dtype": (str, "auto"),
    "load_format": (str, "auto"),  # vLLM --load-format (safetensors, runai_streamer, fastsafetensors, ...)
    "cpu_offload_gb": ((int, float), 0.0),
    "trust_remote_code": (bool, False),
    "enforce_eager": (bool, False),
    "num_replicas": (int, 1),
    "accelerator_type": (str, None),
    "backend": (str, "auto"),  # auto | ray-serve-llm | vllm-server (default: default_backend())
    "vllm_bin": (str, None),   # fallback: the command that runs vLLM's CLI (default: this Python, -m vllm...)
}
BACKENDS = ("auto", "ray-serve-llm", "vllm-server")
EXECUTOR_BACKENDS = ("mp", "ray")  # vLLM's distributed_executor_backend values the application accepts
BACKEND_ENV = "BUILD_IMAGE_SERVE_BACKEND"  # the image's default backend (the lock's serve-backend)


def default_backend(environ: Mapping[str, str] | None = None) -> str:
    """The ``backend`` used when the args give none: ``$BUILD_IMAGE_SERVE_BACKEND`` (set by the
    image build from the lock), else ``auto``; a value outside BACKENDS raises ValueError."""
    value = (os.environ if environ is None else environ).get(BACKEND_ENV, "").strip()
    if not value:
        return "auto"
    if value not in BACKENDS:
        raise ValueError(f"build_image_serve_app: ${BACKEND_ENV} must be one of {', '.join(BACKENDS)}, got {value!r}.")
    return value


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
            if key == "backend":
                default = default_backend()
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
    if cfg["distributed_executor_backend"] is not None and cfg["distributed_executor_backend"] not in EXECUTOR_BACKENDS:
        raise ValueError(f"build_image_serve_app: arg 'distributed_executor_backend' must be one of "
                         f"{', '.join(EXECUTOR_BACKENDS)}, got {cfg['distributed_executor_backend']!r}.")
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
    for key in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "distributed_executor_backend"):
        if cfg.get(key) is not None:
            kw[key] = cfg[key]
    if cfg.get("cpu_offload_gb"):
        kw["cpu_offload_gb"] = float(cfg["cpu_offload_gb"])
    if cfg.get("load_format") not in (None, "auto"):
        kw["load_format"] = cfg["load_format"]
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
    """``vllm serve`` arguments of the fallback backend (after the command that runs vLLM's CLI)."""
    argv = ["serve", cfg["model"], "--host", "127.0.0.1", "--port", str(port), "--served-model-name", cfg["model_id"]]
    for key, val in engine_kwargs(cfg).items():
        flag = "--" + key.replace("_", "-")
        if val is True:
            argv.append(flag)
        else:
            argv += [flag, str(val)]
    return argv


def vllm_command(cfg: Mapping[str, Any], port: int) -> list[str]:
    """The fallback's child process: ``vllm serve MODEL ...`` (``vllm_bin`` replaces the CLI command)."""
    import shlex

    prefix = shlex.split(cfg["vllm_bin"]) if cfg.get("vllm_bin") else [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    return prefix + vllm_cli_args(cfg, port)


def upstream_url(base: str, path: str, query: str = "") -> str:
    """Where the fallback forwards a request: same path, same query string."""
    return f"{base}/{path}" + (f"?{query}" if query else "")


# Hop-by-hop headers (RFC 9110 7.6.1) and the ones the proxy recomputes are not forwarded.
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
               "transfer-encoding", "upgrade", "host", "content-length"}


def forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}


_IMPORT_ERROR: dict = {}


def _has_ray_serve_llm() -> bool:
    """True when ``ray.serve.llm`` imports (it needs ray's ``llm`` extra, e.g. pyarrow); the
    import error, if any, becomes the fallback's reason."""
    try:
        if importlib.util.find_spec("ray.serve.llm") is None:
            _IMPORT_ERROR["ray.serve.llm"] = "ray.serve.llm is not installed"
            return False
        importlib.import_module("ray.serve.llm")
        return True
    except Exception as exc:  # noqa: BLE001 - any import failure means: use the fallback
        _IMPORT_ERROR["ray.serve.llm"] = f"{type(exc).__name__}: {exc}"[:500]
        return False


_EXTRA_LLM = re.compile(r"""extra\s*==\s*["']llm["']""")


def ray_llm_vllm_pin(requires: list | None = None) -> str | None:
    """The vllm requirement of the installed ray's ``llm`` extra (``vllm[audio]==0.26.0``), from
    ray's metadata; None when ray is not installed or its extra names no vllm."""
    if requires is None:
        from importlib import metadata

        try:
            requires = metadata.requires("ray") or []
        except metadata.PackageNotFoundError:
            return None
    for req in requires:
        body, _, marker = req.partition(";")
        if _EXTRA_LLM.search(marker) and re.match(r"\s*vllm\b", body):
            return body.strip()
    return None


def _installed_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def pin_mismatch(pin: str | None, vllm_version: str | None) -> str | None:
    """Why ray's LLM integration does not target the installed vllm, or None when it does
    (or when there is nothing to compare)."""
    if not pin or not vllm_version:
        return None
    try:
        from packaging.requirements import Requirement
        from packaging.version import Version

        ok = Requirement(pin).specifier.contains(Version(vllm_version), prereleases=True)
    except Exception:  # noqa: BLE001 - packaging absent or an odd pin: compare the == version only
        m = re.search(r"==\s*([^\s,;]+)", pin)
        ok = m is None or m.group(1) == vllm_version
    if ok:
        return None
    return (f"ray {_installed_version('ray') or '?'}'s llm extra requires {pin}, "
            f"but vllm {vllm_version} is installed")


def backend_decision(cfg: Mapping[str, Any], *, has_ray_serve_llm: bool | None = None,
                     mismatch: str | None = "") -> tuple:
    """(backend, reason): which backend ``build_app`` uses for ``cfg`` and, for a fallback, why.
    ``mismatch`` "" means: read ray's metadata and the installed vllm."""
    have = _has_ray_serve_llm() if has_ray_serve_llm is None else has_ray_serve_llm
    if mismatch == "":
        mismatch = pin_mismatch(ray_llm_vllm_pin(), _installed_version("vllm")) if have else None
    if cfg["backend"] == "ray-serve-llm":
        if not have:
            raise RuntimeError("build_image_serve_app: backend 'ray-serve-llm' requested but this ray has no ray.serve.llm.")
        return "ray-serve-llm", None
    reason = None
    if cfg["backend"] == "vllm-server":
        reason = "backend 'vllm-server' requested"
    elif not have:
        reason = "this ray has no ray.serve.llm" + (
            f" ({_IMPORT_ERROR['ray.serve.llm']})" if has_ray_serve_llm is None and _IMPORT_ERROR.get("ray.serve.llm") else "")
    elif mismatch:
        reason = mismatch
    if reason is None:
        return "ray-serve-llm", None
    if cfg["pipeline_parallel_size"] > 1:
        raise RuntimeError(
            "build_image_serve_app: the fallback backend (vLLM's server in one replica) serves one node only; "
            f"pipeline parallelism across nodes needs ray.serve.llm ({reason})."
        )
    return "vllm-server", reason


def backend(cfg: Mapping[str, Any], *, has_ray_serve_llm: bool | None = None, mismatch: str | None = "") -> str:
    """Which backend ``build_app`` uses for ``cfg``."""
    return backend_decision(cfg, has_ray_serve_llm=has_ray_serve_llm, mismatch=mismatch)[0]


def build_app(args: Mapping[str, Any] | None = None):
    """Ray Serve application builder (``import_path: build_image_serve_app:build_app``)."""
    cfg = parse_args(args)
    chosen, reason = backend_decision(cfg)
    if chosen == "ray-serve-llm":
        from ray.serve.llm import build_openai_app

        log.info("build_image_serve_app: backend ray-serve-llm (ray.serve.llm.build_openai_app)")
        return build_openai_app(serving_args(cfg))
    log.warning("build_image_serve_app: backend vllm-server (vLLM's server in the replica): %s", reason)
    return _build_vllm_server_app(cfg, reason)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the replica process dies (Linux)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the replica's __del__ still stops it
        pass


def _build_vllm_server_app(cfg: Mapping[str, Any], reason: str | None = None):
    """Fallback: one replica holding all GPUs runs ``vllm serve`` as a child process; the
    Serve ingress forwards every request to it, streaming the response body through."""
    import http.client
    import socket
    import subprocess

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse
    from ray import serve

    app = FastAPI()
    gpus = cfg["tensor_parallel_size"] * cfg["pipeline_parallel_size"]

    def _healthy(port: int) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    @serve.deployment(num_replicas=cfg["num_replicas"], ray_actor_options={"num_gpus": gpus},
                      max_ongoing_requests=max(1024, 2 * int(cfg.get("max_num_seqs") or 256)))
    @serve.ingress(app)
    class VLLMServer:
        def __init__(self) -> None:
            logger = logging.getLogger("ray.serve")
            logger.warning("build_image_serve_app: backend vllm-server: %s", reason or "fallback")
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            argv = vllm_command(cfg, self.port)
            logger.info("build_image_serve_app: starting %s", " ".join(argv))
            self.proc = subprocess.Popen(argv, preexec_fn=_die_with_parent)
            self.base = f"http://127.0.0.1:{self.port}"
            self.session = None
            deadline = time.monotonic() + 3600
            while not _healthy(self.port):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"vLLM server exited with code {self.proc.returncode} during start-up")
                if time.monotonic() > deadline:
                    raise RuntimeError("vLLM server did not answer /health within an hour")
                time.sleep(1)
            logger.info("build_image_serve_app: vLLM server ready on %s", self.base)

        def check_health(self) -> None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with code {self.proc.returncode}")

        def __del__(self) -> None:
            proc = getattr(self, "proc", None)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()

        async def _session(self):
            import aiohttp

            if self.session is None or self.session.closed:
                self.session = aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
                    connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
            return self.session

        @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
        async def forward(self, path: str, request: Request):
            import aiohttp

            session = await self._session()
            try:
                upstream = await session.request(
                    request.method, upstream_url(self.base, path, request.url.query),
                    data=await request.body(), headers=forward_headers(request.headers),
                )
            except aiohttp.ClientError as exc:
                return JSONResponse({"error": {"message": f"vLLM server unreachable: {exc}", "type": "BadGateway",
                                               "code": 502}}, status_code=502)

            async def body():
                try:
                    async for chunk in upstream.content.iter_any():
                        yield chunk
                finally:
                    upstream.release()

            headers = forward_headers(upstream.headers)
            return StreamingResponse(body(), status_code=upstream.status, headers=headers,
                                     media_type=upstream.headers.get("content-type"))

    return VLLMServer.bind()


# --------------------------------------------------------------------------- local runner


def _say(msg: str) -> None:
    print(f"build-image-serve: {msg}", flush=True)


def _descendants(pid: int) -> list:
    """PIDs below ``pid`` (from /proc), deepest last."""
    children: dict = {}
    try:
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(d))
    except OSError:
        return []
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _reap(pids: set, grace: float = 8.0) -> None:
    """What ``ray.shutdown()`` left of the processes this runner started, by PID: SIGTERM,
    then SIGKILL after ``grace`` seconds; returns once they are gone (or 5 s after SIGKILL)."""
    import signal

    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        left = [p for p in pids if _alive(p)]
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        until = time.monotonic() + wait_s
        while time.monotonic() < until and any(_alive(p) for p in left):
            time.sleep(0.1)


def _status_line(app_name: str):
    """(app status, {deployment: (status, replica_states, message)}) from serve.status()."""
    from ray import serve

    st = serve.status().applications.get(app_name)
    if st is None:
        return None, {}, ""
    deps = {name: (str(getattr(d.status, "value", d.status)), dict(d.replica_states or {}), d.message or "")
            for name, d in st.deployments.items()}
    return str(getattr(st.status, "value", st.status)), deps, st.message or ""


def run_local(args: Mapping[str, Any], *, port: int, temp_dir: str | None = None, app_name: str = "llm",
              num_gpus: int | None = None) -> int:
    """Start a Ray head on loopback in this process, deploy the application, and watch it until
    SIGTERM/SIGINT.  Prints ``build-image-serve:`` lines: the timings (``ray started in S s``,
    ``application RUNNING after S s``), status changes, ``replica restarted``, ``FAILED: ...``."""
    import signal

    stop = {"sig": None}

    def on_signal(signum, frame):
        stop["sig"] = signum
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    t0 = time.monotonic()
    rc = 0
    import ray
    from ray import serve

    try:
        init_kw: dict = {"include_dashboard": False, "_node_ip_address": "127.0.0.1", "log_to_driver": True}
        if temp_dir:
            init_kw["_temp_dir"] = temp_dir
        if num_gpus is not None:
            init_kw["num_gpus"] = num_gpus
        for attempt in (1, 2):
            try:
                ray.init(**init_kw)
                break
            except Exception as exc:  # noqa: BLE001 - Ray waits a fixed 30 s for its raylet to register
                if attempt == 2 or "timed out during startup" not in str(exc):
                    raise
                _say(f"ray start failed after {time.monotonic() - t0:.2f} s ({exc}); retrying once")
                try:
                    ray.shutdown()
                except Exception:  # noqa: BLE001
                    pass
                _reap(set(_descendants(os.getpid())), grace=3.0)
        # Ray's core worker installs its own SIGTERM handler (print a stack, die at once), which
        # would leave the replicas and their children running: take SIGTERM/SIGINT back.
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        _say(f"ray {ray.__version__} started in {time.monotonic() - t0:.2f} s "
             f"(resources {json.dumps(ray.cluster_resources(), sort_keys=True)})")
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        cfg = parse_args(args)
        chosen, reason = backend_decision(cfg)
        _say(f"backend {chosen}" + (f" ({reason})" if reason else ""))
        t_deploy = time.monotonic()
        serve.run(build_app(args), name=app_name, route_prefix="/", blocking=False)
        last = None
        running = False
        seen_replicas: dict = {}
        while True:
            app_status, deps, message = _status_line(app_name)
            line = (app_status, {k: (v[0], v[1]) for k, v in deps.items()})
            if line != last:
                _say(f"status {app_status} " + json.dumps({k: {"status": v[0], "replicas": v[1]} for k, v in deps.items()},
                                                         sort_keys=True))
                last = line
            if app_status in ("DEPLOY_FAILED", "UNHEALTHY"):
                detail = message or "; ".join(v[2] for v in deps.values() if v[2])
                _say(f"FAILED: application {app_status}: {detail[-3000:]}")
                rc = 3
                break
            if app_status == "RUNNING" and not running:
                running = True
                _say(f"application RUNNING after {time.monotonic() - t_deploy:.2f} s "
                     f"(total {time.monotonic() - t0:.2f} s)")
                seen_replicas = {k: v[1] for k, v in deps.items()}
            elif running:
                for k, v in deps.items():
                    states = v[1]
                    if any(s != "RUNNING" and n for s, n in states.items()) and states != seen_replicas.get(k):
                        _say(f"replica restarted: deployment {k} replicas {json.dumps(states, sort_keys=True)}"
                             + (f": {v[2][-2000:]}" if v[2] else ""))
                    seen_replicas[k] = states
            time.sleep(1.0)
    except KeyboardInterrupt:
        _say(f"stopping (signal {stop['sig'] or 'SIGINT'})")
    except Exception as exc:  # noqa: BLE001 - the failure is the report
        import traceback

        traceback.print_exc()
        _say(f"FAILED: {type(exc).__name__}: {exc}"[:3000])
        rc = 3
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Stopped by PID: every process below this one (Ray's GCS and raylet, the Serve
        # controller, proxy and replicas, vLLM's processes).  Ray's workers run in process
        # groups of their own, so the caller's killpg would not reach them; serve.shutdown()
        # waits for graceful replica shutdowns (20 s each) and may outlast the caller's grace.
        _reap(set(_descendants(os.getpid())), grace=6.0)
        _say("stopped")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)   # Ray's atexit hooks would try to reach the processes just stopped
    return rc


def main(argv: list | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m build_image_serve_app")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="start a local Ray head (loopback), deploy the application, serve until SIGTERM")
    r.add_argument("--args", required=True, help="the application args as JSON (or @FILE)")
    r.add_argument("--port", type=int, default=8000, help="Serve's HTTP port on 127.0.0.1")
    r.add_argument("--temp-dir", default=None, help="Ray's temp/log directory (default: Ray's)")
    r.add_argument("--num-gpus", type=int, default=None)
    r.add_argument("--app-name", default="llm")
    a = p.parse_args(argv)
    text = a.args
    if text.startswith("@"):
        with open(text[1:]) as fh:
            text = fh.read()
    try:
        args = json.loads(text)
        parse_args(args)
    except ValueError as exc:
        print(f"build-image-serve: bad --args: {exc}", file=sys.stderr)
        return 2
    return run_local(args, port=a.port, temp_dir=a.temp_dir, app_name=a.app_name, num_gpus=a.num_gpus)


if __name__ == "__main__":
    sys.exit(main())
