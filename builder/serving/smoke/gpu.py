"""GPU memory as ``nvidia-smi`` reports it (the one adapter for that tool)."""

from __future__ import annotations

import shutil
import subprocess


def nvidia_smi_memory() -> dict[str, int] | None:
    """Summed memory.used / memory.total (MiB) over visible GPUs, or None."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    used = total = 0
    n = 0
    for line in out.stdout.strip().splitlines():
        try:
            u, t = (int(float(x)) for x in line.split(","))
        except ValueError:
            continue
        used += u
        total += t
        n += 1
    return {"memory_used_mib": used, "memory_total_mib": total, "gpus": n} if n else None


def nvidia_smi_names() -> list[str] | None:
    """The model name of each visible GPU (``nvidia-smi --query-gpu=name``), or None."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []
    return names or None
