#!/usr/bin/env python3
"""A CDI spec for the host's NVIDIA GPUs, for hosts without ``nvidia-ctk`` (podman ``--device nvidia.com/gpu=all``).

    cdi_spec.py OUT.json --hook PATH

What ``nvidia-ctk cdi generate`` writes, as far as a container needs to run CUDA: each ``/dev/nvidiaN`` as a device
``N`` (and ``all``), the control nodes (``nvidiactl``, ``nvidia-uvm``, ``nvidia-uvm-tools``, ``nvidia-modeset``),
the driver's user-space libraries bound read-only into ``/usr/lib/x86_64-linux-gnu`` under their file names and
their sonames, ``nvidia-smi`` into ``/usr/bin``, and a createContainer hook (``--hook``: ``cdi_ldcache_hook.py``)
that runs ``ldconfig`` in the container's root so ``libcuda.so.1`` is in its cache (Triton reads ``ldconfig -p``).
The libraries are found through the host's ``ldconfig -p`` and the driver folder ``/usr/local/nvidia``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

LIB = re.compile(r"^lib(cuda|cudadebugger|nvidia-[a-z0-9_-]+|nvcuvid|nvoptix)\.so(\.\d+)*$")
CONTROL = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
TARGET = "/usr/lib/x86_64-linux-gnu"


def driver_libraries() -> dict[str, str]:
    """container file name -> host file, for every driver library (soname links included)."""
    found: dict[str, str] = {}
    text = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    paths = [line.rsplit("=>", 1)[1].strip() for line in text.splitlines() if "=>" in line and "x86-64" in line]
    for folder in (Path("/usr/local/nvidia/lib64"), Path("/usr/local/nvidia/lib")):
        if folder.is_dir():
            paths += [str(p) for p in folder.iterdir()]
    for path in paths:
        name = os.path.basename(path)
        if LIB.match(name) and os.path.exists(path):
            found.setdefault(name, os.path.realpath(path))
            found.setdefault(os.path.basename(os.path.realpath(path)), os.path.realpath(path))
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--hook", required=True)
    a = ap.parse_args()
    gpus = sorted(int(p.name[6:]) for p in Path("/dev").glob("nvidia[0-9]*") if p.name[6:].isdigit())
    control = [{"path": f"/dev/{n}"} for n in CONTROL if Path(f"/dev/{n}").exists()]
    libs = driver_libraries()
    if not gpus or not libs:
        print(f"cdi_spec: no GPU device nodes ({gpus}) or no driver libraries ({len(libs)})", file=sys.stderr)
        return 1
    mounts = [
        {"hostPath": host, "containerPath": f"{TARGET}/{name}", "options": ["ro", "nosuid", "nodev", "bind"]}
        for name, host in sorted(libs.items())
    ]
    # the driver's own binary (a host's /usr/bin/nvidia-smi can be a script that runs it)
    smi = next((p for p in ("/usr/local/nvidia/bin/nvidia-smi", "/usr/bin/nvidia-smi") if os.path.exists(p)), None)
    if smi:
        mounts.append(
            {"hostPath": smi, "containerPath": "/usr/bin/nvidia-smi", "options": ["ro", "nosuid", "nodev", "bind"]}
        )
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": str(i), "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}"}]}} for i in gpus]
        + [{"name": "all", "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}"} for i in gpus]}}],
        "containerEdits": {
            "deviceNodes": control,
            "mounts": mounts,
            "hooks": [{"hookName": "createContainer", "path": a.hook, "args": [os.path.basename(a.hook)]}],
        },
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(spec, indent=1) + "\n")
    print(f"cdi_spec: {len(gpus)} GPU(s), {len(control)} control nodes, {len(libs)} library names -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
