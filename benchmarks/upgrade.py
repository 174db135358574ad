"""Benchmark: release day — `build-image upgrade --to X` on a checkout that does not have X yet, cold (empty
download and uv caches) and warm, side by side with the same run's `base reconstruct` and `lock` of X.

    .venv/bin/python benchmarks/upgrade.py                      # --to 0.34.0, cold and warm
    .venv/bin/python benchmarks/upgrade.py --to 0.34.0 --skip-cold
    .venv/bin/python benchmarks/upgrade.py --json

The checkout without X: `git archive HEAD` of this repository into a scratch folder, less X's base
manifest, its recipes table, its patch series and its lock (the state of main before X shipped); the
commands run from it through this virtualenv's Python with that folder first on PYTHONPATH, so the
package data they read (lockfiles/, patches/) is the stripped copy's.

Cold: BUILD_IMAGE_CACHE and UV_CACHE_DIR are new empty folders for the upgrade, then again for
`base reconstruct` (the same relaxations the upgrade needed, `--sdist` of the cached sdist) and for
`lock` (on the manifest the upgrade wrote): each command pays its own downloads.  Warm: the same three
again on the caches the cold upgrade filled (a second process each).  Wall time and the CPU time of the
process tree; the load average is printed (on a shared machine wall time partly measures neighbours).
Targets on the project's 2-core machine: cold upgrade < 5 minutes, warm < 60 s.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CLI = [PY, "-c", "import sys; from builder.cli import main; sys.exit(main(prog_name='build-image'))"]


def stripped_checkout(dest: Path, version: str) -> Path:
    """HEAD of this repository without release ``version``'s files."""
    data = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        tf.extractall(dest, filter="tar")
    for p in (
        dest / "lockfiles" / "base" / f"vllm-openai-v{version}.json",
        dest / "lockfiles" / f"vllm-{version}",
        dest / "patches" / "vllm" / version,
    ):
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    sys.path.insert(0, str(dest))
    from builder.resolve.recipe import parse_recipes, render_recipes

    rp = dest / "lockfiles" / "base" / "recipes.toml"
    tables = parse_recipes(rp.read_text(encoding="utf-8"))
    tables.pop(version, None)
    rp.write_text(render_recipes(tables), encoding="utf-8")
    sys.path.pop(0)
    return dest


def timed(argv: list[str], cwd: Path, env: dict) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
        "exit": r.returncode,
        "stdout": r.stdout,
        "stderr": r.stderr[-2000:],
    }


def run_three(co: Path, version: str, env: dict, out: Path, sdist: Path | None, relax: list[str]) -> dict:
    rows = {}
    up = timed([*CLI, "upgrade", "--to", version, "--format", "json", "-o", str(out)], co, env)
    if up["exit"] not in (0, 1):
        sys.exit(f"upgrade failed (exit {up['exit']}):\n{up['stderr']}")
    doc = json.loads(up["stdout"])
    rows["upgrade"] = {k: up[k] for k in ("wall_s", "cpu_s", "exit")} | {"stages_s": doc["seconds"]}
    relax = relax or [r.split(" (")[0] for r in doc.get("relaxed", [])]
    manifest = out / "lockfiles" / "base" / f"vllm-openai-v{version}.json"
    src = ["--sdist", str(sdist)] if sdist else ["--vllm", version]
    rec = timed(
        [
            *CLI,
            "base",
            "reconstruct",
            *src,
            "-o",
            str(out / "reconstructed.json"),
            *[a for r in relax for a in ("--relax", r)],
            "--json",
        ],
        co,
        env,
    )
    rows["base reconstruct"] = {k: rec[k] for k in ("wall_s", "cpu_s", "exit")}
    lk = timed(
        [
            *CLI,
            "lock",
            "--base",
            str(manifest),
            "--vllm",
            version,
            "-o",
            str(out / "lock" / "requirements.lock"),
            "--upgrade",
            "--json",
        ],
        co,
        env,
    )
    rows["lock"] = {k: lk[k] for k in ("wall_s", "cpu_s", "exit")}
    return rows, relax


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--to", default="0.34.0")
    ap.add_argument("--skip-cold", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bi-bench-upgrade-") as t:
        tmp = Path(t)
        co = stripped_checkout(tmp / "checkout", a.to)
        base_env = {**os.environ, "PYTHONPATH": str(co)}
        cache = {"BUILD_IMAGE_CACHE": str(tmp / "cache-bi"), "UV_CACHE_DIR": str(tmp / "cache-uv")}
        results: dict[str, dict] = {}
        relax: list[str] = []
        sdist = None
        if not a.skip_cold:
            # each command cold: its own empty caches
            rows = {}
            for which in ("upgrade", "base reconstruct", "lock"):
                fresh = {
                    "BUILD_IMAGE_CACHE": str(tmp / f"cold-{which[:4]}-bi"),
                    "UV_CACHE_DIR": str(tmp / f"cold-{which[:4]}-uv"),
                }
                env = {**base_env, **(cache if which == "upgrade" else fresh)}
                out = tmp / f"out-cold-{which[:4]}"
                if which == "upgrade":
                    r3, relax = run_three(co, a.to, env, out, None, [])
                    rows["upgrade"] = r3["upgrade"]
                    sdist = next(Path(cache["BUILD_IMAGE_CACHE"]).rglob(f"vllm-{a.to}.tar.gz"), None)
                    cold_out = out
                elif which == "base reconstruct":
                    r = timed(
                        [
                            *CLI,
                            "base",
                            "reconstruct",
                            "--sdist",
                            str(sdist),
                            "-o",
                            str(out / "m.json"),
                            *[x for rr in relax for x in ("--relax", rr)],
                            "--json",
                        ],
                        co,
                        env,
                    )
                    rows[which] = {k: r[k] for k in ("wall_s", "cpu_s", "exit")}
                    shutil.rmtree(fresh["UV_CACHE_DIR"], ignore_errors=True)
                else:
                    manifest = cold_out / "lockfiles" / "base" / f"vllm-openai-v{a.to}.json"
                    r = timed(
                        [
                            *CLI,
                            "lock",
                            "--base",
                            str(manifest),
                            "--vllm",
                            a.to,
                            "-o",
                            str(out / "requirements.lock"),
                            "--upgrade",
                            "--json",
                        ],
                        co,
                        env,
                    )
                    rows[which] = {k: r[k] for k in ("wall_s", "cpu_s", "exit")}
            results["cold"] = rows
        env = {**base_env, **cache}
        if a.skip_cold:  # warm the caches first (not counted)
            run_three(co, a.to, env, tmp / "out-warmup", None, [])
        sdist = sdist or next(Path(cache["BUILD_IMAGE_CACHE"]).rglob(f"vllm-{a.to}.tar.gz"), None)
        results["warm"], _ = run_three(co, a.to, env, tmp / "out-warm", sdist, relax)
    print(f"load average after: {os.getloadavg()[0]:.1f}", file=sys.stderr)
    if a.json:
        print(json.dumps(results, indent=2))
        return
    print(f"release day: vllm {a.to} on a checkout without it (targets: cold upgrade < 300 s, warm < 60 s)")
    print("state | command | wall s | CPU s | exit")
    for state, rows in results.items():
        for cmd, r in rows.items():
            print(f"{state} | {cmd} | {r['wall_s']} | {r['cpu_s']} | {r['exit']}")
        if "upgrade" in rows and "stages_s" in rows["upgrade"]:
            print(f"{state} upgrade stages: {json.dumps(rows['upgrade']['stages_s'])}")


if __name__ == "__main__":
    main()
