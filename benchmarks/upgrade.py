"""Benchmark: `build-image upgrade --from 0.26.0 --to 0.33.0`, warm.

    .venv/bin/python benchmarks/upgrade.py [--from 0.26.0] [--to 0.33.0] [--repeat 2]

Warm means: both vllm wheels are in the download cache (sha256-verified), the probe
environment and the extracted trees exist, uv's cache holds the overlay's wheels.  A first
run warms them (its time is printed, not counted); then ``--repeat`` timed runs of the
whole CLI (a fresh process each, `--format json`, nothing written), reporting wall time,
the CPU time of the process tree (user+sys, from ``resource.getrusage(RUSAGE_CHILDREN)``;
on a shared, loaded machine wall time mostly measures the neighbours) and the stage
timings the report carries (bases, port, lock).  The goal is < 60 s wall on an idle
machine.  Figures: docs/patches.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = str(Path(sys.executable).with_name("build-image"))


def run(a: str, b: str) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run([CLI, "upgrade", "--from", a, "--to", b, "--format", "json"], capture_output=True,
                       text=True, cwd=ROOT, timeout=1800)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode not in (0, 1):
        sys.exit(f"upgrade failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    doc = json.loads(r.stdout)
    return {"wall_s": round(wall, 1),
            "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
            "exit": r.returncode, "stages_s": doc["seconds"],
            "patches": {p["patch"]: p["status"] for p in doc["patches"]["patches"]},
            "probe_s": {p["patch"]: [p[k]["seconds"] for k in ("probe_unpatched", "probe_ported") if p[k]]
                        for p in doc["patches"]["patches"]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="a", default="0.26.0")
    ap.add_argument("--to", dest="b", default="0.33.0")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    warm = run(args.a, args.b)
    print(f"warm-up run (not counted): {warm['wall_s']} s wall")
    runs = [run(args.a, args.b) for _ in range(args.repeat)]
    for i, r in enumerate(runs, 1):
        print(f"run {i}: {json.dumps(r)}")
    best = min(runs, key=lambda r: r["wall_s"])
    print(f"best: {best['wall_s']} s wall, {best['cpu_s']} s CPU (goal < 60 s wall); "
          f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
