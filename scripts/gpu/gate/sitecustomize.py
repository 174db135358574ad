"""A gate for vLLM boots that share the one GPU of the H200 proof (scripts/gpu/proof-run.sh, MATRIX=1).

vLLM sizes its KV cache from the device memory that changes between its worker's init snapshot and the end of its
profile run, counting every process on the GPU; a process that frees memory inside that window also trips
``init_snapshot.free_memory >= free_gpu_memory``.  So, on PYTHONPATH with GPU_GATE set:

- GPU_GATE=ex (a boot that sizes its KV cache from the utilization): the engine's worker waits, unlocked, until
  GPU_GATE_FREE_GIB GiB are free, then holds an exclusive flock on GPU_GATE_LOCK from before
  ``Worker.init_device`` (the snapshot) to after ``Worker.compile_or_warm_up_model`` (KV cache allocated, warm-up
  done), once the device's used memory has held still for a second;
- GPU_GATE=sh (a fixed --kv-cache-memory boot): the same span under a shared lock;
- in the smoke process (either value): ``ServerProcess.stop`` runs under the shared lock, up to a second after the
  server's process group is gone, so no memory is freed inside an exclusive window.

Exclusive waiters go first (a turnstile lock beside the gate).  Each event is one line in GPU_GATE_LOG: time, pid,
tag (GPU_GATE_TAG), event, seconds waited, device MiB used, and at an exclusive window's end the MiB the other
processes' memory changed by inside it (0 = an undisturbed sizing).  Anything failing here is logged and the boot
goes on ungated; a wait longer than GPU_GATE_TIMEOUT seconds (default 300) is given up the same way.
"""

from __future__ import annotations

import os
import sys


def _install() -> None:  # noqa: C901, PLR0915 - one closure set, installed once per process
    mode = os.environ.get("GPU_GATE", "")
    if mode not in ("ex", "sh"):
        return
    import fcntl  # why: only with GPU_GATE set; nothing is imported for other processes
    import functools
    import subprocess
    import time

    lock_path = os.environ.get("GPU_GATE_LOCK", "/tmp/gpu-gate.lock")
    log_path = os.environ.get("GPU_GATE_LOG", "/tmp/gpu-gate.log")
    tag = os.environ.get("GPU_GATE_TAG", "?")
    timeout = float(os.environ.get("GPU_GATE_TIMEOUT", "300"))
    held: dict[str, object] = {}

    def log(event: str, **kw: object) -> None:
        try:
            fields = " ".join(f"{k}={v}" for k, v in kw.items())
            with open(log_path, "a") as f:
                f.write(f"{time.time():.2f} pid={os.getpid()} tag={tag} {event} {fields}\n")
        except OSError:
            pass

    def smi(query: str, apps: bool = False) -> list[list[str]]:
        what = "--query-compute-apps" if apps else "--query-gpu"
        try:
            out = subprocess.run(
                ["nvidia-smi", f"{what}={query}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return []
        return [[x.strip() for x in ln.split(",")] for ln in out.splitlines() if ln.strip()]

    def used_free() -> tuple[int, int]:
        rows = smi("memory.used,memory.free")
        try:
            return int(rows[0][0]), int(rows[0][1])
        except (IndexError, ValueError):
            return -1, -1

    def others() -> int:
        me = str(os.getpid())
        total = 0
        for row in smi("pid,used_memory", apps=True):
            if len(row) == 2 and row[0] != me and row[1].isdigit():
                total += int(row[1])
        return total

    def flock(fd: int, op: int, until: float) -> bool:
        while True:
            try:
                fcntl.flock(fd, op | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() > until:
                    return False
                time.sleep(0.1)

    def acquire(kind: str) -> None:
        t0 = time.monotonic()
        until = t0 + timeout
        try:
            need = float(os.environ.get("GPU_GATE_FREE_GIB", "0")) * 1024 if kind == "ex" else 0
            while True:
                while 0 <= used_free()[1] < need and time.monotonic() < until:
                    time.sleep(0.5)
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
                turn = os.open(lock_path + ".turn", os.O_RDWR | os.O_CREAT, 0o666)
                ok = flock(turn, fcntl.LOCK_EX, until)
                ok = ok and flock(fd, fcntl.LOCK_EX if kind == "ex" else fcntl.LOCK_SH, until)
                fcntl.flock(turn, fcntl.LOCK_UN)
                os.close(turn)
                if not ok:
                    os.close(fd)
                    log(f"{kind}-timeout", waited=f"{time.monotonic() - t0:.1f}")
                    return
                if kind == "ex":  # memory freed just before (an exit) settles first, for 5 s at most
                    last, still, settle = None, 0, time.monotonic() + 5
                    while still < 2 and time.monotonic() < settle:
                        now = used_free()[0]
                        still = still + 1 if now == last else 0
                        last = now
                        time.sleep(0.5)
                # another sized boot took the memory between the wait and the lock: wait again
                if 0 <= used_free()[1] < need and time.monotonic() < until:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    os.close(fd)
                    continue
                break
            held["fd"] = fd
            if kind == "ex":
                held["others"] = others()
            used, free = used_free()
            log(f"{kind}-acquired", waited=f"{time.monotonic() - t0:.1f}", used_mib=used, free_mib=free)
        except Exception as e:  # noqa: BLE001 - the boot goes on ungated
            log(f"{kind}-error", error=repr(e)[:200])

    def release(kind: str) -> None:
        fd = held.pop("fd", None)
        if fd is None:
            return
        try:
            extra = {}
            if "others" in held:
                extra["others_delta_mib"] = others() - int(held.pop("others"))  # type: ignore[arg-type]
            used, free = used_free()
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            log(f"{kind}-released", used_mib=used, free_mib=free, **extra)
        except Exception as e:  # noqa: BLE001
            log(f"{kind}-error", error=repr(e)[:200])

    def patch_worker(mod) -> None:
        w = getattr(mod, "Worker", None)
        if w is None or not hasattr(w, "init_device") or not hasattr(w, "compile_or_warm_up_model"):
            log("no-worker-hook", module=mod.__name__)
            return
        init, warm = w.init_device, w.compile_or_warm_up_model

        @functools.wraps(init)
        def init_device(self, *a, **k):
            acquire(mode)
            try:
                return init(self, *a, **k)
            except BaseException:
                release(mode)
                raise

        @functools.wraps(warm)
        def compile_or_warm_up_model(self, *a, **k):
            try:
                return warm(self, *a, **k)
            finally:
                release(mode)

        w.init_device, w.compile_or_warm_up_model = init_device, compile_or_warm_up_model
        log("worker-hooked", module=mod.__name__)

    def patch_server(mod) -> None:
        sp = getattr(mod, "ServerProcess", None)
        if sp is None:
            return
        stop = sp.stop

        @functools.wraps(stop)
        def gated_stop(self, *a, **k):
            acquire("sh")
            try:
                return stop(self, *a, **k)
            finally:
                time.sleep(1.0)
                release("sh")

        sp.stop = gated_stop

    targets = {"vllm.v1.worker.gpu_worker": patch_worker, "builder.serving.smoke.server": patch_server}

    import importlib.abc  # why: the import hook exists only in gated processes

    class Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201
            if name not in targets:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            loader = spec.loader
            orig = loader.exec_module

            def exec_module(module):  # noqa: ANN001, ANN202
                orig(module)
                try:
                    targets[name](module)
                except Exception as e:  # noqa: BLE001
                    log("hook-error", module=name, error=repr(e)[:200])

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Hook())


_install()
del _install

# the next sitecustomize on the path (the interpreter's own, if any) still runs
try:
    import importlib.machinery as _m

    _here = os.path.dirname(os.path.abspath(__file__))
    _rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    _spec = _m.PathFinder.find_spec("sitecustomize", _rest)
    if _spec is not None and _spec.origin and os.path.dirname(os.path.abspath(_spec.origin)) != _here:
        _mod = __import__("importlib.util").util.module_from_spec(_spec)
        _spec.loader.exec_module(_mod)
except Exception:  # noqa: BLE001, S110 - best effort
    pass
