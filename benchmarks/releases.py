#!/usr/bin/env python3
"""Benchmark per vLLM release: `base recipe` (the recipe derived from the cached sdist, warm),
`base reconstruct` split into recipe, install (the replayed steps) and scan, and `build-image lock`
beside raw `uv pip compile` on the same inputs, in one run.

    .venv/bin/python benchmarks/releases.py                       # every shipped release
    .venv/bin/python benchmarks/releases.py --vllm 0.26.0 --vllm 0.33.0 --repeat 3
    .venv/bin/python benchmarks/releases.py --skip-reconstruct    # only the recipe and lock columns
    .venv/bin/python benchmarks/releases.py --scan-tree DIR       # scan one installed tree (warm), 5 times

Recipe: the real command `build-image base recipe --vllm X --json` in a subprocess (the sdist from the
download cache by its recorded sha256: no index asked; targets < 5 s), median of `--repeat` runs.
Reconstruct: the real function (`reconstruct()`), into a scratch tree it removes; "install" is the
replay of every step with uv's `pip install --target` (downloads when uv's cache is cold, hard links
when warm; target < 20 s warm for the whole reconstruction), "scan" the binary scan of the installed
tree.  Measured side by side, warm: "refresh" asks the index at every step (`--refresh`), the default
answers from uv's cache (a release replayed online before); "same": both give the same distributions.
Nothing is written: reconstruct() returns the manifest.

Lock: `build-image lock --vllm X --upgrade -o TMP --json` (a full resolution: ray choice, uv twice,
wheel facts from the cache) vs raw `uv pip compile` of exactly the overlay and base pins it hands to
uv (`--python-version/--python-platform` of the base, `--no-build`, `--generate-hashes`), each the
median of `--repeat` runs after one warm-up, interleaved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builder.resolve.lock import DEFAULT_RAY, base_requirements, parse_overlay  # noqa: E402
from builder.resolve.lockfile import load_lock  # noqa: E402
from builder.resolve.manifest import load_manifest  # noqa: E402
from builder.resolve.uv import Uv  # noqa: E402
from builder.spec import default_base_manifest, default_lock_path, supported_vllm_versions  # noqa: E402

BIN = Path(sys.executable).parent


def recipe_row(vllm: str, repeat: int) -> dict:
    cmd = [str(BIN / "build-image"), "base", "recipe", "--vllm", vllm, "--json"]
    times = []
    for i in range(repeat + 1):
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            return {"error": f"base recipe failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"}
        if i:  # the first run fills the download cache when it is cold
            times.append(time.monotonic() - t0)
    return {"recipe_s": round(statistics.median(times), 2)}


def reconstruct_row(vllm: str) -> dict:
    """One warm-up replay asking the index (fills uv's cache when cold, records the online replay),
    then, side by side and warm, the replay asking the index at every step (``--refresh``) and the
    default one answering from uv's cache."""
    from builder.resolve.reconstruct import reconstruct

    reconstruct(vllm, refresh=True)
    t0 = time.monotonic()
    online = reconstruct(vllm, refresh=True)
    online_s = time.monotonic() - t0
    t0 = time.monotonic()
    rec = reconstruct(vllm)
    total = time.monotonic() - t0
    same = online.manifest.distributions == rec.manifest.distributions
    return {
        "recipe_in_s": round(rec.timings["recipe"], 1),
        "index_s": round(rec.timings["index"], 1),
        "install_refresh_s": round(online.timings["install"], 1),
        "total_refresh_s": round(online_s, 1),
        "install_s": round(rec.timings["install"], 1),
        "offline_steps": rec.uv_steps.get("offline", 0),
        "scan_s": round(rec.timings["scan"], 1),
        "cleanup_s": round(rec.timings.get("cleanup", 0), 1),
        "total_s": round(total, 1),
        "speedup": round(online_s / total, 2),
        "same": same,
        "dists": len(rec.manifest.distributions),
    }


def scan_tree(tree: Path, n: int = 5) -> None:
    import os

    from builder.resolve.scanner import scan_site_packages

    files = sum(len(f) for _r, _d, f in os.walk(tree))
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        d = scan_site_packages(tree)
        times.append(time.monotonic() - t0)
    print(
        f"scan {tree}: {files} files, {len(d)} distributions; runs {', '.join(f'{t:.2f}' for t in times)} s; "
        f"median {statistics.median(times):.2f} s (first run includes the page cache warming)"
    )


def lock_rows(vllm: str, repeat: int) -> dict:
    base = load_manifest(default_base_manifest(vllm))
    lock = load_lock(default_lock_path(vllm))
    overlay = [
        r.replace(DEFAULT_RAY, f"ray[serve]=={lock.by_name()['ray'].version}") if r == DEFAULT_RAY else r
        for r in lock.overlay
    ]
    uv = Uv()
    with tempfile.TemporaryDirectory(prefix="bi-bench-rel-") as t:
        tmp = Path(t)
        (tmp / "overlay.in").write_text("\n".join(overlay) + "\n")
        (tmp / "base.in").write_text("\n".join(base_requirements(base, parse_overlay(overlay))) + "\n")
        raw = uv.compile_cmd(
            [tmp / "overlay.in", tmp / "base.in"],
            tmp / "raw.txt",
            python_version=base.python_version,
            platform=base.platform,
            hashes=True,
        )
        bi = [str(BIN / "build-image"), "lock", "--vllm", vllm, "--upgrade", "-o", str(tmp / "bi.lock"), "--json"]
        res: dict[str, list[float]] = {"uv": [], "bi": []}
        for i in range(repeat + 1):
            for key, cmd in (("uv", raw), ("bi", bi)):
                t0 = time.monotonic()
                r = subprocess.run(cmd, capture_output=True, text=True, env=Uv.env())
                dt = time.monotonic() - t0
                if r.returncode != 0:
                    return {"error": f"{key} failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"}
                if i:  # the first round warms uv's cache and the facts cache
                    res[key].append(dt)
        entries = len(load_lock(tmp / "bi.lock").entries)
    uv_s, bi_s = statistics.median(res["uv"]), statistics.median(res["bi"])
    return {
        "uv_compile_s": round(uv_s, 2),
        "lock_s": round(bi_s, 2),
        "ratio": round(bi_s / uv_s, 2),
        "entries": entries,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm", action="append", help="release (repeatable; default: every shipped one)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-reconstruct", action="store_true")
    ap.add_argument("--skip-lock", action="store_true")
    ap.add_argument("--skip-recipe", action="store_true")
    ap.add_argument("--scan-tree", type=Path)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.scan_tree:
        scan_tree(a.scan_tree)
        return
    rows = []
    for v in a.vllm or supported_vllm_versions():
        row = {"vllm": v}
        if not a.skip_recipe:
            row.update(recipe_row(v, a.repeat))
        if not a.skip_reconstruct:
            row.update(reconstruct_row(v))
        if not a.skip_lock:
            row.update(lock_rows(v, a.repeat))
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    cols = [
        k
        for k in (
            "vllm",
            "recipe_s",
            "recipe_in_s",
            "index_s",
            "install_refresh_s",
            "total_refresh_s",
            "install_s",
            "offline_steps",
            "scan_s",
            "cleanup_s",
            "total_s",
            "speedup",
            "same",
            "dists",
            "uv_compile_s",
            "lock_s",
            "ratio",
            "entries",
            "error",
        )
        if any(k in r for r in rows)
    ]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(k, "")) for k in cols))


if __name__ == "__main__":
    main()
