"""Benchmark: `build-image diff` of two ~220-package locks, as a whole process.

    .venv/bin/python benchmarks/diff.py [--runs 15] [--packages 220]

Target: < 0.3 s per `build-image diff OLD NEW` (the command runs as a git textconv
and on every PR).  Prints, side by side (median of --runs, wall clock):

  python -c pass                 interpreter floor
  python -c 'import builder.cli' CLI import (every command module is imported at startup)
  build-image --help             CLI startup
  build-image diff (text/json/markdown), --textconv
  in-process diff_locks + render (no startup)

and the import cost of each command module (python -X importtime, cumulative µs),
so a slow startup can be pinned on the module responsible.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builder.resolve.lockfile import LockEntry, LockFile, WheelRef, format_lock  # noqa: E402
from builder.resolve.manifest import DistFacts  # noqa: E402

TARGET_S = 0.3


def _h(rng: random.Random) -> str:
    return "%064x" % rng.getrandbits(256)


def _wheel_url(name: str, version: str, sha: str) -> str:
    return f"https://files.pythonhosted.org/packages/{sha[:2]}/{name.replace('-', '_')}-{version}-py3-none-any.whl"


def make_pair(n: int, seed: int = 7) -> tuple[str, str]:
    """Two realistic locks of ``n`` entries: the new one bumps ~10%, adds and
    removes a few, re-hashes some, moves numpy across a major (group 1)."""
    rng = random.Random(seed)
    header = {
        "build-image-lock": "1",
        "tool": "build-image 0.1.0 (uv 0.13.9)",
        "vllm": "0.26.0",
        "base-ref": "vllm/vllm-openai:v0.26.0",
        "base-digest": "sha256:" + _h(rng),
        "base-manifest-sha256": _h(rng),
        "python": "3.12",
        "platform": "x86_64-manylinux_2_35",
        "inputs-sha256": _h(rng),
    }
    entries = []
    for i in range(n):
        binary = rng.random() < 0.35
        f = DistFacts(
            binary=binary,
            extensions=rng.randint(1, 40) if binary else 0,
            numpy_abi={"1": 0, "2": rng.randint(0, 2) if binary else 0},
            glibc="2.17" if binary else None,
            python_abi="cp312" if binary else "none",
        )
        v = f"{rng.randint(0, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 20)}"
        sha = _h(rng)
        entries.append(
            LockEntry(
                name=f"pkg-{i:03d}",
                version=v,
                hashes=[sha, _h(rng)] if binary else [sha],
                via=[f"pkg-{rng.randint(0, n - 1):03d}", "-r overlay"][: rng.randint(1, 2)],
                wheel=WheelRef(_wheel_url(f"pkg-{i:03d}", v, sha), sha),
                facts=f,
                base_version=v if rng.random() < 0.1 else None,
            )
        )
    old = LockFile(header=dict(header), overlay=["ray[serve]"], allow_abi_change={}, entries=entries)
    import copy

    new = copy.deepcopy(old)
    new.header["inputs-sha256"] = _h(rng)
    for e in rng.sample(new.entries, n // 10):
        parts = e.version.split(".")
        parts[rng.randint(0, 2)] = str(int(parts[0]) + 1)
        e.version = ".".join(parts)
        e.hashes = [_h(rng)]
        e.wheel = WheelRef(_wheel_url(e.name, e.version, e.hashes[0]), e.hashes[0])
    for e in rng.sample(new.entries, n // 20):
        e.hashes = [_h(rng)]
        e.wheel = WheelRef(_wheel_url(e.name, e.version, e.hashes[0]), e.hashes[0])
    del new.entries[:4]
    sha = _h(rng)
    new.entries.append(
        LockEntry(
            name="numpy",
            version="2.2.6",
            hashes=[sha],
            via=["-r overlay"],
            wheel=WheelRef(_wheel_url("numpy", "2.2.6", sha), sha),
            facts=DistFacts(binary=True, extensions=12, glibc="2.17", python_abi="cp312"),
            base_version="1.26.4",
        )
    )
    sha = _h(rng)
    new.entries.append(
        LockEntry(
            name="pyarrow",
            version="14.0.2",
            hashes=[sha],
            via=["pkg-001"],
            wheel=WheelRef(_wheel_url("pyarrow", "14.0.2", sha), sha),
            facts=DistFacts(binary=True, extensions=20, numpy_abi={"1": 1, "2": 0}, glibc="2.17", python_abi="cp312"),
        )
    )
    return format_lock(old), format_lock(new)


ENV: dict[str, str] = {}


def _child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timeit(cmd: list[str], runs: int, ok=(0, 1)) -> tuple[float, float, float]:
    """(median wall, min wall, median CPU user+sys) of ``runs`` runs.  CPU time is
    far less sensitive than wall time to other work on the machine."""
    subprocess.run(cmd, capture_output=True, env=ENV)  # warm-up: writes the bytecode cache
    times, cpu = [], []
    for _ in range(runs):
        c = _child_cpu()
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, env=ENV)
        times.append(time.perf_counter() - t)
        cpu.append(_child_cpu() - c)
        if p.returncode not in ok:
            raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.decode()[-500:]}")
    return statistics.median(times), min(times), statistics.median(cpu)


def import_costs(py: str, args: list[str], runs: int = 5) -> list[tuple[str, int, int]]:
    """(module, self µs, cumulative µs), the minimum over ``runs`` runs of
    ``python -X importtime -m builder.cli ARGS``: builder.* modules and the big
    third-party packages."""
    best: dict[str, list[int]] = {}
    wanted = (
        "click",
        "rich",
        "packaging",
        "packaging.requirements",
        "packaging.version",
        "jinja2",
        "docker",
        "yaml",
        "elftools",
        "json",
        "http.client",
        "urllib.request",
        "asyncio",
        "email.parser",
    )
    for _ in range(runs):
        p = subprocess.run(
            [py, "-X", "importtime", "-m", "builder.cli", *args], capture_output=True, text=True, env=ENV
        )
        for line in p.stderr.splitlines():
            parts = [x.strip() for x in line.split("|")]
            if len(parts) != 3 or not (parts[2].startswith("builder.") or parts[2] in wanted):
                continue
            try:
                self_us, cum_us = int(parts[0].split(":")[-1]), int(parts[1])
            except ValueError:
                continue
            cur = best.setdefault(parts[2], [self_us, cum_us])
            cur[0], cur[1] = min(cur[0], self_us), min(cur[1], cum_us)
    return sorted(((k, v[0], v[1]) for k, v in best.items()), key=lambda x: -x[2])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--packages", type=int, default=220)
    ap.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="time cold starts: every module compiled from source on every run",
    )
    args = ap.parse_args()
    py = sys.executable
    exe = str(Path(py).parent / "build-image")
    old_text, new_text = make_pair(args.packages)
    with tempfile.TemporaryDirectory() as td:
        # Measure what users get: a bytecode cache (CI images and dev shells often set
        # PYTHONDONTWRITEBYTECODE, which makes every start recompile every module).
        ENV.update({k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
        ENV["PYTHONPYCACHEPREFIX"] = str(Path(td) / "pycache")
        if args.no_bytecode_cache:
            ENV["PYTHONDONTWRITEBYTECODE"] = "1"
            ENV.pop("PYTHONPYCACHEPREFIX")
        old, new = Path(td) / "old.lock", Path(td) / "new.lock"
        old.write_text(old_text)
        new.write_text(new_text)
        rows = [
            ("python -c pass", timeit([py, "-c", "pass"], args.runs)),
            ("python -c 'import builder.cli'", timeit([py, "-c", "import builder.cli"], args.runs)),
            ("build-image --help", timeit([exe, "--help"], args.runs)),
            ("build-image diff (text)", timeit([exe, "diff", str(old), str(new)], args.runs)),
            (
                "build-image diff --format json",
                timeit([exe, "diff", str(old), str(new), "--format", "json"], args.runs),
            ),
            (
                "build-image diff --format markdown",
                timeit([exe, "diff", str(old), str(new), "--format", "markdown"], args.runs),
            ),
            ("build-image diff --textconv", timeit([exe, "diff", "--textconv", str(new)], args.runs)),
        ]
        # in-process: parse + diff + render, no interpreter/CLI startup
        from builder.report import render_json, render_text
        from builder.resolve.diff import diff_locks, to_document, to_json_doc
        from builder.resolve.lockfile import parse_lock

        t = time.perf_counter()
        reps = 20
        for _ in range(reps):
            d = diff_locks(
                parse_lock(old_text, "old"), parse_lock(new_text, "new"), old_text=old_text, new_text=new_text
            )
            render_text(to_document(d))
            render_json(to_json_doc([d]))
        per = (time.perf_counter() - t) / reps
        rows.append(("in-process parse+diff+render", (per, per, per)))
        costs = import_costs(py, ["diff", str(old), str(new)])
    n_old = old_text.count("# facts:")
    n_new = new_text.count("# facts:")
    cache = "no bytecode cache" if args.no_bytecode_cache else "bytecode cache warm"
    print(
        f"locks: {n_old} and {n_new} packages; median of {args.runs} runs ({cache}); "
        f"target {TARGET_S:.2f} s for the diff"
    )
    floor = rows[0][1][0]
    diff_t = rows[3][1][0]
    print(f"{'what':40} {'median s':>8} {'min s':>7} {'cpu s':>7} {'x python':>9} {'x target':>9}")
    for name, (med, low, cpu) in rows:
        print(f"{name:40} {med:8.3f} {low:7.3f} {cpu:7.3f} {med / floor:9.2f} {med / TARGET_S:9.2f}")
    print(f"\nload average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (other work inflates every row alike)")
    diff_low, diff_cpu = rows[3][1][1], rows[3][1][2]
    print(
        f"\nverdict: build-image diff median {diff_t:.3f} s, min {diff_low:.3f} s, cpu {diff_cpu:.3f} s -> "
        f"{'PASS' if diff_t < TARGET_S else 'FAIL'} (median < {TARGET_S} s)"
    )
    print("\nimports of `build-image diff OLD NEW` (ms, min of 5 runs; cumulative includes children):")
    print(f"  {'module':36} {'self':>7} {'cumulative':>11}")
    for name, self_us, cum_us in costs[:20]:
        print(f"  {name:36} {self_us / 1000:7.1f} {cum_us / 1000:11.1f}")


if __name__ == "__main__":
    main()
