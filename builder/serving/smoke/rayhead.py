"""A loopback-only Ray head for vLLM's Ray executor (``--distributed-executor-backend ray``).

``ray start --head --block`` runs in its own process group with every address on
127.0.0.1 (GCS, raylet, no dashboard), its own temp directory and its own log; the
head is ready when ``ray start`` prints "Ray runtime started".  It is stopped by its
PID (the process group: SIGTERM, then SIGKILL), never by ``ray stop``, which would
stop every Ray on the machine.  The vLLM server gets the address as ``RAY_ADDRESS``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from builder.errors import BadInput
from builder.events import SILENT, Reporter
from builder.serving.smoke.config import with_multicast_off
from builder.serving.smoke.server import ServerProcess, free_port

READY_LINE = "Ray runtime started"


def ray_command() -> list[str]:
    """``ray`` next to this Python (its venv), else on PATH, else ``python -m ray.scripts.scripts``."""
    beside = Path(sys.executable).with_name("ray")
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    exe = shutil.which("ray")
    if exe:
        return [exe]
    return [sys.executable, "-m", "ray.scripts.scripts"]


def head_command(ray: list[str], port: int, temp_dir: str, num_gpus: int | None = None) -> list[str]:
    """``ray start --head --block`` bound to loopback only."""
    argv = ray + [
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
    ]
    return argv + ([f"--num-gpus={num_gpus}"] if num_gpus is not None else [])


class RayHead:
    """The head this run started: ``address`` for RAY_ADDRESS, stopped by PID."""

    def __init__(self, proc: ServerProcess, address: str, temp_dir: str, log_path: str):
        self.proc = proc
        self.address = address
        self.temp_dir = temp_dir
        self.log_path = log_path

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def stop(self, grace: float = 15.0) -> None:
        try:
            self.proc.stop(grace)
        finally:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


# Ray's own start-up wait for its raylet to register with the GCS is a fixed 30 s; on a loaded
# machine ``ray start`` then exits with this line although nothing is wrong with the node.
REGISTER_TIMEOUT_LINE = "timed out during startup"


def start_head(
    env: dict[str, str],
    *,
    timeout: float = 120.0,
    ray: list[str] | None = None,
    num_gpus: int | None = None,
    reporter: Reporter = SILENT,
    attempts: int = 2,
) -> RayHead:
    """Start a loopback Ray head and wait until it is up; BadInput (with the log's tail) when
    it exits or does not come up within ``timeout`` seconds (then it is stopped first).  A head
    that exits on Ray's raylet registration timeout is started again (``attempts`` in all, each
    on a fresh port and temp dir, the whole within ``timeout``)."""
    deadline = time.monotonic() + timeout
    attempt = 1
    while True:
        head = _start_once(
            env,
            deadline=deadline,
            timeout=timeout,
            ray=ray,
            num_gpus=num_gpus,
            reporter=reporter,
            may_retry=attempt < attempts,
        )
        if head is not None:
            return head
        reporter.step("the Ray head exited on Ray's raylet registration timeout (a loaded machine); starting it again")
        attempt += 1


def _start_once(env, *, deadline: float, timeout: float, ray, num_gpus, reporter, may_retry: bool) -> RayHead | None:
    """One ``ray start``: the head when it is up; None when it exited on the registration timeout
    and ``may_retry`` (stopped and cleaned up); BadInput otherwise."""
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="smoke-rayhead-", dir="/tmp" if os.access("/tmp", os.W_OK) else None)
    log_path = os.path.join(temp_dir, "ray-start.log")
    head_env = with_multicast_off(dict(env))
    head_env.pop("RAY_ADDRESS", None)
    head_env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    argv = head_command(ray or ray_command(), port, temp_dir, num_gpus)
    reporter.step(f"starting a loopback Ray head: {' '.join(argv)}")
    proc = ServerProcess(argv, log_path, env=head_env)
    head = RayHead(proc, f"127.0.0.1:{port}", temp_dir, log_path)
    try:
        proc.start()
    except BadInput:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    t0 = time.monotonic()
    try:
        while True:
            text = _read(log_path)
            if READY_LINE in text:
                reporter.step(f"Ray head {head.address} up after {time.monotonic() - t0:.1f} s (pid {proc.pid})")
                return head
            if may_retry and not proc.alive() and REGISTER_TIMEOUT_LINE in text and time.monotonic() < deadline:
                head.stop()
                return None
            if not proc.alive() or time.monotonic() > deadline:
                why = f"exited with {proc.poll()}" if not proc.alive() else f"not up after {timeout:g} s"
                tail = "\n".join(text.splitlines()[-15:])
                raise BadInput(
                    f"smoke: the loopback Ray head for --distributed-executor-backend ray {why} "
                    f"({' '.join(argv)}); its log:\n{tail}",
                    hint="install ray in the Python that runs build-image, or join a running "
                    "cluster with --ray-address.",
                )
            time.sleep(0.2)
    except BaseException:
        head.stop()
        raise


def _read(path: str) -> str:
    try:
        return Path(path).read_text("utf-8", "replace")
    except OSError:
        return ""
