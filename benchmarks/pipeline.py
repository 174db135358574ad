"""Pipeline timings on the local stand-in base (needs the Docker engine + registry running).

    .venv/bin/python benchmarks/pipeline.py [--runs N] [--with REQ ...]

Three scenarios, each the real CLI (`build-image --vllm 0.26.0 ... --push --json`):

  full       a fresh lock (resolved again), render, a build whose dependency layer is not
             in the cache (SOURCE_DATE_EPOCH changed -> the install layer's ARG changed), push
  no-op      the same command again: lock reused, context re-rendered, every layer CACHED
  patch-only one patch of the test series edited: lock reused, dependency layer CACHED,
             only the patch layer rebuilt (pushed with --force: same lock, new image)

Prints per-stage seconds side by side and the ratios to the full run, then the floor checks'
cost: the context built again with --no-cache, each step's seconds from BuildKit's plain log
(the drift check in the parallel checks stage, the consistency check + constraint set after the
install), and whether the no-op rebuild was all cache hits (same image ID).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fx_docker import (  # noqa: E402
    BUILD_IMAGE,
    REGISTRY,
    STANDIN_DATA,
    engine_running,
    registry_running,
    standin_findlinks,
)

DEFAULT_OVERLAY = ["six==1.17.0", "markupsafe==3.0.2"]


def sh(args, env=None, check=True):
    r = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, **(env or {})))
    if check and r.returncode != 0:
        sys.exit(f"{' '.join(map(str, args[:3]))} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


HAVE_PATCHES = importlib.util.find_spec("builder.patching.series") is not None


def pipeline(work: Path, manifest: Path, fl: Path, series: Path, wheel: Path, overlay, epoch: int, force=False):
    args = [
        BUILD_IMAGE,
        "--vllm",
        "0.26.0",
        "--base",
        str(manifest),
        "--lock",
        str(work / "requirements.lock"),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(fl),
        "-o",
        str(work / "ctx"),
        "--tag",
        f"{REGISTRY}/bench/vllm",
        "--push",
        "--json",
    ]
    if HAVE_PATCHES:
        args += ["--series", str(series), "--wheel", str(wheel)]
    else:
        args += ["--no-patches"]
    for req in overlay:
        args += ["--with", req]
    if force:
        args.append("--force")
    t0 = time.monotonic()
    r = sh(args, env={"SOURCE_DATE_EPOCH": str(epoch)})
    wall = time.monotonic() - t0
    doc = json.loads(r.stdout)
    doc["wall_s"] = round(wall, 2)
    return doc


def floor_steps(ctx: Path) -> dict:
    """Seconds of each step of a --no-cache build of ``ctx`` (BuildKit plain log): the floor steps,
    the install step and the whole build."""
    import re

    from builder.engine import docker_cli

    t0 = time.monotonic()
    r = sh(
        [
            docker_cli(),
            "build",
            "--progress=plain",
            "--no-cache",
            "--network=none",
            "-t",
            "bench/floor:nocache",
            str(ctx),
        ],
        env={"DOCKER_BUILDKIT": "1"},
    )
    wall = time.monotonic() - t0
    heads, done = {}, {}
    for line in r.stderr.splitlines():
        m = re.match(r"^#(\d+) (\[[^\]]+\] .*)$", line)
        if m and "[internal]" not in m.group(2):
            heads.setdefault(m.group(1), m.group(2))
        m = re.match(r"^#(\d+) DONE ([\d.]+)s$", line)
        if m:
            done[m.group(1)] = float(m.group(2))
    out = {"build_no_cache_s": round(wall, 2)}
    for n, head in heads.items():
        if "base_check.py drift" in head:
            out["checks_stage_run_s"] = done.get(n)
        elif "base_check.py consistency" in head:
            out["consistency_and_constraints_s"] = done.get(n)
        elif "--require-hashes" in head:
            out["install_s"] = done.get(n)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--with", dest="overlay", action="append", help="overlay requirement (default: six, markupsafe)")
    opts = ap.parse_args()
    overlay = opts.overlay or DEFAULT_OVERLAY
    if not engine_running() or not registry_running():
        sys.exit("needs the Docker engine and the registry on 127.0.0.1:5000 (scripts/services.sh start)")
    t0 = time.monotonic()
    sh(["bash", str(ROOT / "scripts" / "make-standin-base.sh")])
    standin_s = time.monotonic() - t0
    from builder.util import cache_dir

    wheel = cache_dir() / "standin" / "vllm-0.26.0-py3-none-any.whl"
    fl = standin_findlinks(tuple(overlay))
    with tempfile.TemporaryDirectory(prefix="bench-pipeline.") as tmp:
        work = Path(tmp)
        manifest = work / "base.json"
        sh([BUILD_IMAGE, "base", "snapshot", "--image", "standin.local/vllm/vllm-openai:v0.26.0", "-o", str(manifest)])
        series = work / "series"
        shutil.copytree(STANDIN_DATA / "patches", series)
        epoch = int(time.time())  # a value no earlier build used: the dependency layer is rebuilt
        results = {}
        results["full"] = pipeline(work, manifest, fl, series, wheel, overlay, epoch, force=True)
        results["no-op"] = pipeline(work, manifest, fl, series, wheel, overlay, epoch)
        if HAVE_PATCHES:
            p = series / "0002-api-server-banner.patch"
            p.write_text(p.read_text().replace("(patched by build-image)", "(patched by build-image, v2)"))
            results["patch-only"] = pipeline(work, manifest, fl, series, wheel, overlay, epoch, force=True)
        else:
            print("note: builder.patching.series is missing in this checkout; the patch-only run is skipped")
        floor = floor_steps(work / "ctx")

    names = list(results)
    stages = []
    for doc in results.values():
        for k in doc["stages_s"]:
            if k not in stages:
                stages.append(k)
    print(f"stand-in base ready in {standin_s:.1f}s (cached after the first run); overlay: {', '.join(overlay)}")
    print(f"{'stage':<14}" + "".join(f"{n:>12}" for n in names) + "".join(f"{n + '/full':>16}" for n in names[1:]))
    rows = [(s, [doc["stages_s"].get(s) for doc in results.values()]) for s in stages]
    rows.append(("total (CLI)", [doc["total_s"] for doc in results.values()]))
    rows.append(("wall", [doc["wall_s"] for doc in results.values()]))
    for name, vals in rows:
        cells = "".join(f"{v:>12.2f}" if v is not None else f"{'-':>12}" for v in vals)
        ratios = "".join(f"{(v / vals[0]):>16.2f}" if v is not None and vals[0] else f"{'-':>16}" for v in vals[1:])
        print(f"{name:<14}{cells}{ratios}")
    print("cached build steps: " + ", ".join(f"{n} {d.get('cached_steps')}" for n, d in results.items()))
    print("image ids: " + ", ".join(f"{n} {d.get('image_id', '')[7:19]}" for n, d in results.items()))
    print(
        f"no-op rebuild all cache hits: {results['no-op'].get('image_id') == results['full'].get('image_id')} "
        f"(same image ID as the full run)"
    )
    print(
        f"floor checks, --no-cache build of the context ({floor['build_no_cache_s']} s): drift check in the "
        f"checks stage {floor.get('checks_stage_run_s')} s (in parallel with the install, "
        f"{floor.get('install_s')} s); consistency check + constraint set after the install "
        f"{floor.get('consistency_and_constraints_s')} s"
    )
    check = results["full"].get("base_check") or {}
    if check:
        print(
            f"base verification: {check.get('status')}, snapshot {check.get('snapshot_s')} s "
            f"(full run), reused {results['no-op'].get('base_check', {}).get('snapshot_reused')} (no-op run)"
        )


if __name__ == "__main__":
    main()
