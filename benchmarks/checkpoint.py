"""Benchmark: `build-image checkpoint verify` on a synthetic multi-GB checkpoint.

    .venv/bin/python benchmarks/checkpoint.py [--small 16] [--small-mb 64] [--large-mb 1024] [--repeat 2] [--dir DIR]

Writes a safetensors checkpoint (``--small`` shards of ``--small-mb`` MB and one
``--large-mb`` MB shard, random data, an index and a config; ~2 GB by default)
under ``--dir`` (default: a temp dir), measures, and deletes it again:

1. the structural pass (headers only) on it, and on sparse stand-ins of the Qwen sparse-attention checkpoint's
   186 GB / 31-file checkpoint and of a 600 GB / 163-file / 91k-tensor one (no disk used): the goal is < 1 s
   whatever the size;
2. sha256 throughput, side by side in one run on the same files: ``sha256sum`` on the
   large shard vs build-image's hasher on it (per-job rate; goal >= 90% of sha256sum),
   then ``sha256sum`` over every shard vs ``build-image checkpoint verify --sha256``
   (whole CLI, --rehash) at --jobs 1 and --jobs 2 (scaling on this machine's cores).
   Each measurement is taken twice: page cache warm (the CPU cost of hashing) and
   cold (the files evicted with posix_fadvise(DONTNEED) first: disk + CPU);
3. a re-verify with the digest cache (nothing changed: nothing hashed);
4. what the measured rates mean for 186 GB (largest shard 102.4 GB: one file is one
   sequential stream, so it bounds the wall time whatever --jobs is) and 600 GB.

Figures from a run on the 2-core development machine: docs/checkpoint.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builder.serving.checkpoint import FileEntry, inspect_checkpoint  # noqa: E402
from builder.serving.checkpoint_content import Sha256Hasher  # noqa: E402

MB = 10**6
GB = 10**9


def _header(tensors: dict[str, tuple[str, list[int], int]]) -> bytes:
    doc, pos = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        doc[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    raw = json.dumps(doc, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    return len(raw).to_bytes(8, "little") + raw


def _shard_tensors(i: int, nbytes: int, count: int = 1, width: int = 4096) -> dict[str, tuple[str, list[int], int]]:
    """``count`` BF16 tensors sharing ``nbytes`` (real checkpoints: hundreds per shard)."""
    rows = nbytes // (2 * width * count)
    return {f"model.layers.{i}.experts.{j}.weight": ("BF16", [rows, width], rows * width * 2) for j in range(count)}


def write_shard(path: Path, tensors, *, sparse: bool = False, block: bytes = b"") -> int:
    head = _header(tensors)
    data = sum(t[2] for t in tensors.values())
    with open(path, "wb") as fh:
        fh.write(head)
        if sparse:
            fh.truncate(len(head) + data)
        else:
            left = data
            while left:
                n = min(left, len(block))
                fh.write(block[:n])
                left -= n
            fh.flush()
            os.fsync(fh.fileno())
    return len(head) + data


def make_checkpoint(d: Path, sizes: list[int], *, sparse: bool, tensors_per_shard: int = 1) -> dict[str, str]:
    d.mkdir(parents=True)
    block = os.urandom(8 << 20) if not sparse else b""
    wm = {}
    n = len(sizes)
    for i, size in enumerate(sizes):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        tensors = _shard_tensors(i, size, tensors_per_shard)
        if not sparse:  # vary the data per shard (identical shards would still hash the same cost)
            block = block[4096:] + block[:4096]
        write_shard(d / name, tensors, sparse=sparse, block=block)
        wm.update({t: name for t in tensors})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": n}))
    return wm


def evict(paths) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(paths) -> None:
    for p in paths:
        with open(p, "rb", buffering=0) as fh:
            while fh.read(8 << 20):
                pass


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cpu_seconds(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def timed_cpu(fn, who: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of ``who``: RUSAGE_SELF or RUSAGE_CHILDREN)."""
    c0 = cpu_seconds(who)
    wall = timed(fn)
    return wall, cpu_seconds(who) - c0


def sha256sum(paths) -> None:
    subprocess.run(["sha256sum", *map(str, paths)], check=True, stdout=subprocess.DEVNULL)


def verify_cli(d: Path, sums: Path, jobs: int, env: dict, *, rehash: bool = True) -> dict:
    cmd = [
        str(ROOT / ".venv" / "bin" / "build-image"),
        "checkpoint",
        "verify",
        str(d),
        "--sha256",
        str(sums),
        "--jobs",
        str(jobs),
        "--json",
    ] + (["--rehash"] if rehash else [])
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"verify failed ({r.returncode}): {r.stderr}")
    return json.loads(r.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", type=int, default=16)
    ap.add_argument("--small-mb", type=int, default=64)
    ap.add_argument("--large-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=2, help="warm-cache runs per tool (best is kept)")
    ap.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temp dir)")
    ap.add_argument("--structural-only", action="store_true", help="only the structural pass on the sparse stand-ins")
    args = ap.parse_args()
    if not shutil.which("sha256sum"):
        raise SystemExit("sha256sum (coreutils) is needed for the side-by-side figure")
    work = Path(tempfile.mkdtemp(prefix="bench-checkpoint-", dir=args.dir))
    env = {**os.environ, "BUILD_IMAGE_CACHE": str(work / "cache")}
    try:
        return run(work, args, env)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path, args, env: dict) -> int:
    cpus = len(os.sched_getaffinity(0))
    print(
        f"machine: {cpus} usable CPU(s); sha256sum "
        f"{subprocess.run(['sha256sum', '--version'], capture_output=True, text=True).stdout.splitlines()[0]}"
    )
    print(
        f"python hashlib: {__import__('ssl').OPENSSL_VERSION}; load average {os.getloadavg()[0]:.1f} (a shared machine)"
    )

    # 1. structural pass: sparse stand-ins of real checkpoints (no disk used)
    print("\n== structural pass (headers only)")
    qwen_sparse = [int(102.4 * GB)] + [int((186.4 - 102.4) / 30 * GB)] * 30
    big600 = [int(600 / 163 * GB)] * 163
    for label, sizes, per_shard in (
        (
            "Qwen sparse-attention checkpoint (31 files, 186.4 GB, one 102.4 GB shard, 2,000 tensors), sparse",
            qwen_sparse,
            65,
        ),
        ("600 GB in 163 shards, 91,000 tensors (DeepSeek-V3-like), sparse", big600, 560),
    ):
        d = work / label.split()[0].replace("(", "")
        make_checkpoint(d, sizes, sparse=True, tensors_per_shard=per_shard)
        runs, cpu = [], []
        for _ in range(3):
            c0 = time.process_time()
            runs.append(inspect_checkpoint(d))
            cpu.append(time.process_time() - c0)
        rep = runs[-1]
        assert rep.ready(), [p.message for p in rep.errors]
        best = min(r.structural_seconds for r in runs)
        print(
            f"  {label}: {rep.weight_bytes / GB:.1f} GB of weights in {rep.tensors:,} tensors, "
            f"READY in {best * 1000:.1f} ms wall, {min(cpu) * 1000:.1f} ms CPU (best of 3)"
        )
        shutil.rmtree(d)

    if args.structural_only:
        return 0

    # 2. the real checkpoint
    sizes = [args.small_mb * MB] * args.small + [args.large_mb * MB]
    d = work / "ckpt"
    t = timed(lambda: make_checkpoint(d, sizes, sparse=False))
    shards = sorted(d.glob("*.safetensors"))
    total = sum(p.stat().st_size for p in shards)
    large = max(shards, key=lambda p: p.stat().st_size)
    print(
        f"\n== synthetic checkpoint: {len(shards)} shards, {total / GB:.2f} GB "
        f"({args.small} x {args.small_mb} MB + 1 x {args.large_mb} MB), written in {t:.1f} s"
    )
    rep = inspect_checkpoint(d)
    print(f"  structural pass: {rep.structural_seconds * 1000:.1f} ms, {'READY' if rep.ready() else 'NOT READY'}")

    bi = str(ROOT / ".venv" / "bin" / "build-image")
    t_fixed = min(
        timed(
            lambda: subprocess.run(
                [bi, "checkpoint", "verify", str(d), "--json"], check=True, capture_output=True, env=env
            )
        )
        for _ in range(3)
    )
    print(f"  whole CLI without hashing (interpreter start, imports, structural pass): {t_fixed:.2f} s (best of 3)")

    sums = work / "SUMS"
    r = subprocess.run(["sha256sum", *[p.name for p in shards]], cwd=d, capture_output=True, text=True, check=True)
    sums.write_text(r.stdout)

    st = large.stat()
    entry = FileEntry(large.name, large, large, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)
    one = Sha256Hasher(1)
    results: dict[str, float] = {}
    for cache_state in ("warm", "cold"):
        # warm: best of --repeat, the tools alternating (a shared machine is noisy); cold: once each
        reps = args.repeat if cache_state == "warm" else 1
        prep = warm if cache_state == "warm" else evict
        print(
            f"\n== sha256, page cache {cache_state} "
            f"({'best of %d, alternating' % reps if reps > 1 else 'one run each'}; "
            f"load average {os.getloadavg()[0]:.1f})"
        )
        t_sum = t_ours = c_sum = c_ours = float("inf")
        for _ in range(reps):
            prep([large])
            w, c = timed_cpu(lambda: sha256sum([large]), resource.RUSAGE_CHILDREN)
            t_sum, c_sum = min(t_sum, w), min(c_sum, c)
            prep([large])
            w, c = timed_cpu(lambda: one.hash_file(entry.path), resource.RUSAGE_SELF)
            t_ours, c_ours = min(t_ours, w), min(c_ours, c)
        results[f"sha256sum-1-{cache_state}"], results[f"hasher-1-{cache_state}"] = t_sum, t_ours
        results[f"hasher-cpu-{cache_state}"] = c_ours
        rs, ro = st.st_size / t_sum, st.st_size / t_ours
        print(
            f"  one file ({st.st_size / GB:.2f} GB): sha256sum {rs / MB:.0f} MB/s, build-image hasher "
            f"{ro / MB:.0f} MB/s "
            f"= {100 * ro / rs:.0f}% of sha256sum"
        )
        print(
            f"    per CPU-second (independent of the machine's load): sha256sum {st.st_size / c_sum / MB:.0f} MB, "
            f"build-image hasher {st.st_size / c_ours / MB:.0f} MB"
        )
        job_counts = sorted({1, 2, cpus})
        t_all, t_cli = float("inf"), {j: float("inf") for j in job_counts}
        cores: dict[int, float] = {}
        for _ in range(reps):
            prep(shards)
            t_all = min(t_all, timed(lambda: sha256sum(shards)))
            for jobs in job_counts:
                prep(shards)
                w, c = timed_cpu(lambda: verify_cli(d, sums, jobs, env), resource.RUSAGE_CHILDREN)
                if w < t_cli[jobs]:
                    t_cli[jobs], cores[jobs] = w, c / w
        print(f"  all shards ({total / GB:.2f} GB): sha256sum (one process) {total / t_all / MB:.0f} MB/s")
        for jobs in job_counts:
            results[f"cli-{jobs}-{cache_state}"] = t_cli[jobs]
            net = t_cli[jobs] - t_fixed
            alone = f"{total / net / MB:.0f} MB/s" if net > 0.5 * t_cli[jobs] else "n/a (startup dominates)"
            print(
                f"  build-image checkpoint verify --jobs {jobs} (whole CLI): {t_cli[jobs]:.2f} s, "
                f"{total / t_cli[jobs] / MB:.0f} MB/s = {t_all / t_cli[jobs]:.2f}x sha256sum, "
                f"{t_cli[1] / t_cli[jobs]:.2f}x --jobs 1; hashing alone {alone}; "
                f"CPU/wall {cores[jobs]:.2f} (cores the machine gave it)"
            )
        results[f"sha256sum-all-{cache_state}"] = t_all

    # 3. digest cache
    verify_cli(d, sums, 2, env, rehash=False)  # fill the cache
    t0 = time.perf_counter()
    doc = verify_cli(d, sums, 2, env, rehash=False)
    t_cached = time.perf_counter() - t0
    print(
        f"\n== re-verify, nothing changed: {t_cached:.2f} s, hashed {doc['content']['hashed_files']} of "
        f"{doc['content']['files']} files (digest cache)"
    )

    # 4. extrapolation at the cold (disk + CPU) rates measured above
    per_job = st.st_size / results["hasher-1-cold"]
    best_jobs = max(sorted({1, 2, cpus}), key=lambda j: total / results[f"cli-{j}-cold"])
    agg = total / results[f"cli-{best_jobs}-cold"]
    print(
        f"\n== extrapolation (cold cache: one stream {per_job / MB:.0f} MB/s, all shards with --jobs {best_jobs} "
        f"{agg / MB:.0f} MB/s)"
    )
    per_cpu_s = st.st_size / results["hasher-cpu-warm"]
    for label, tot, largest in (
        ("Qwen sparse-attention checkpoint: 186.4 GB, largest shard 102.4 GB", 186.4 * GB, 102.4 * GB),
        ("600 GB in 163 x 3.7 GB shards", 600 * GB, 600 / 163 * GB),
    ):
        bound = max(tot / agg, largest / per_job)
        print(
            f"  {label}: {bound / 60:.1f} min here (aggregate {tot / agg / 60:.1f} min; the largest shard alone "
            f"{largest / per_job / 60:.1f} min as one stream); CPU cost {tot / per_cpu_s / 60:.1f} CPU-min "
            f"at {per_cpu_s / MB:.0f} MB per CPU-second"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
