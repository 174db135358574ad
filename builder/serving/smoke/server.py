"""The server's lifecycle: the command that starts it (``vllm serve`` here, the
same inside ``docker run``, or a test's override), the process started in its
own process group with its output in a log file, and stopping it by PID (its
process group) -- also while Ctrl-C / SIGTERM arrive.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from builder.engine import DockerEngine, docker_cli
from builder.errors import BadInput
from builder.serving.smoke.config import MULTICAST_OFF, SmokeConfig


def serve_flags(cfg: SmokeConfig, model_arg: str, port: int, host: str) -> list[str]:
    flags = [
        model_arg,
        "--host",
        host,
        "--port",
        str(port),
        "--tensor-parallel-size",
        str(cfg.tp),
        "--pipeline-parallel-size",
        str(cfg.pp),
    ]
    if cfg.distributed_executor_backend:
        flags += ["--distributed-executor-backend", cfg.distributed_executor_backend]
    if cfg.max_model_len is not None:
        flags += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.gpu_memory_utilization is not None:
        flags += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    if cfg.max_num_seqs is not None:
        flags += ["--max-num-seqs", str(cfg.max_num_seqs)]
    if cfg.cpu_offload_gb:
        flags += ["--cpu-offload-gb", f"{cfg.cpu_offload_gb:g}"]
    if cfg.kv_cache_dtype:
        flags += ["--kv-cache-dtype", vllm_kv_cache_dtype(cfg.kv_cache_dtype)]
    if cfg.load_format:
        flags += ["--load-format", cfg.load_format]
    return flags + list(cfg.extra_args)


# The planner (and the spec) accept short names; vLLM 0.26.0's --kv-cache-dtype
# (vllm/config/cache.py CacheDType) only knows "bfloat16" / "float16".
_VLLM_KV_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def vllm_kv_cache_dtype(name: str) -> str:
    return _VLLM_KV_DTYPE.get(name, name)


def build_local_command(cfg: SmokeConfig, port: int, vllm_bin: list[str]) -> list[str]:
    return vllm_bin + ["serve"] + serve_flags(cfg, str(Path(cfg.model).resolve()), port, "127.0.0.1")


def build_docker_command(
    cfg: SmokeConfig,
    port: int,
    name: str,
    docker_bin: str,
    *,
    entrypoint: str = "vllm",
    args: list[str] | None = None,
    volumes: list[tuple[str, str]] | None = None,
    env: dict[str, str] | None = None,
) -> list[str]:
    """``docker run`` of the image: ``vllm serve`` by default, or ``entrypoint args``.  GPUs as the engine
    requests them (:func:`builder.engine.gpu_flags`: ``--gpus`` for Docker, CDI ``--device nvidia.com/gpu=...``
    for podman)."""
    model = str(Path(cfg.model).resolve())
    cmd = [docker_bin, "run", "--rm", "--name", name, "--pull=never"]
    cmd += DockerEngine(docker=docker_bin).gpu_flags(cfg.docker_gpus)
    # host networking: the server binds 127.0.0.1:PORT on the host itself (no bridge needed,
    # nothing exposed beyond loopback)
    cmd += [
        "--ipc=host",
        "--network=host",
        "-v",
        f"{model}:/model:ro",
        "-e",
        "HF_HUB_OFFLINE=1",
        "-e",
        "VLLM_NO_USAGE_STATS=1",
    ]
    for host_path, path in volumes or []:
        cmd += ["-v", f"{host_path}:{path}"]
    for k, v in sorted({**(env or {}), **cfg.env, **MULTICAST_OFF}.items()):
        cmd += ["-e", f"{k}={v}"]
    cmd += ["--entrypoint", entrypoint, cfg.image or ""]
    if args is not None:
        return cmd + args
    return cmd + ["serve"] + serve_flags(cfg, "/model", port, "127.0.0.1")


def build_override_command(cfg: SmokeConfig, port: int) -> list[str]:
    text = (cfg.server_cmd or "").format(port=port, model=shlex.quote(str(cfg.model)))
    return shlex.split(text)


class ServerProcess:
    """A server started in its own process group; stopped by PID (group)."""

    def __init__(
        self,
        argv: list[str],
        log_path: str,
        env: dict[str, str] | None = None,
        cleanup: Callable[[], None] | None = None,
        spawn: Callable[..., subprocess.Popen] = subprocess.Popen,
    ):
        self.argv = argv
        self.log_path = log_path
        self._env = env
        self._cleanup = cleanup
        self._spawn = spawn  # docker mode: the engine adapter starts `docker run`
        self.proc: subprocess.Popen | None = None
        self._log_fh = None

    def start(self) -> None:
        self._log_fh = open(self.log_path, "ab", buffering=0)
        try:
            self.proc = self._spawn(
                self.argv,
                stdout=self._log_fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env,
                start_new_session=True,
            )
        except OSError as exc:
            self._log_fh.close()
            raise BadInput(f"smoke: cannot start the server {self.argv[0]!r}: {exc}") from exc
        except BaseException:
            self._log_fh.close()
            raise

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 15.0, hurry: threading.Event | None = None) -> int | None:
        """SIGTERM the process group, then SIGKILL after ``grace`` seconds (at
        once when ``hurry`` is set, e.g. by a second Ctrl-C)."""
        if self.proc is None:
            return None
        pgid = self.proc.pid  # start_new_session: the pid is the group id
        try:
            if self.proc.poll() is None:
                _killpg(pgid, signal.SIGTERM)
                until = time.monotonic() + grace
                while (
                    self.proc.poll() is None and time.monotonic() < until and not (hurry is not None and hurry.is_set())
                ):
                    time.sleep(0.05)
            # children (engine core, workers) may outlive the leader: kill the group
            _killpg(pgid, signal.SIGKILL)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            deadline = time.monotonic() + 10
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            if self._cleanup:
                try:
                    self._cleanup()
                except Exception:  # noqa: BLE001 - best effort
                    pass
            if self._log_fh:
                self._log_fh.close()
        return self.proc.returncode


def defer_signals(hurry: threading.Event) -> Callable[[], None]:
    """While the server is being stopped, SIGINT/SIGTERM set ``hurry`` instead of
    raising (main thread only; elsewhere signals cannot be handled anyway).
    Returns the function that puts the previous handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    saved = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            saved[sig] = signal.signal(sig, lambda signum, frame: hurry.set())
        except (ValueError, OSError):
            pass

    def restore() -> None:
        for sig, handler in saved.items():
            signal.signal(sig, handler)

    return restore


def _group_alive(pgid: int) -> bool:
    """Any non-zombie process left in the process group?"""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def file_size(path: str) -> int | None:
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_vllm() -> list[str]:
    exe = shutil.which("vllm")
    if exe:
        return [exe]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def find_docker() -> str:
    """The Docker CLI, as every command finds it (:func:`builder.engine.docker_cli`;
    none: EngineUnavailable, exit 8)."""
    return docker_cli()


def docker_spawn(docker: str) -> Callable[..., subprocess.Popen]:
    """``ServerProcess``'s spawn for docker mode: the engine adapter starts the
    ``docker run`` command line that :func:`build_docker_command` made."""
    engine = DockerEngine(docker=docker)

    def spawn(argv: list[str], **popen_kw) -> subprocess.Popen:
        return engine.popen(argv[1:], **popen_kw)

    return spawn


def remove_container(docker: str, name: str) -> None:
    """``docker rm -f NAME`` through the engine adapter (the container outlives a killed CLI)."""
    DockerEngine(docker=docker).cli(["rm", "-f", name], timeout=60)


def check_docker_image(docker: str, image: str) -> None:
    """Before `docker run --pull=never`: the engine answers (else EngineUnavailable,
    exit 8) and holds the image (else BadInput, exit 2) -- not a FAIL verdict with
    `docker run`'s exit code 125 in it."""
    eng = DockerEngine(docker=docker)
    eng.ping()
    if eng.inspect(image) is None:
        raise BadInput(
            f"smoke: image {image} is not in the local engine (the smoke test runs it with --pull=never); "
            "build it, or pull it first"
        )
