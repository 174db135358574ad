#!/usr/bin/env python3
"""Benchmark: `build-image lock` vs raw `uv pip compile` vs `pip-compile --generate-hashes`.

Same inputs for every tool: the overlay (ray[serve] + --with) as one requirements
file and every base distribution pinned ``name==version`` as another (exactly what
`build-image lock` hands to uv).  Run on demand; prints one side-by-side table with
ratios to raw uv.

    .venv/bin/python benchmarks/lock.py                     # build-image vs raw uv, --check, re-lock
    .venv/bin/python benchmarks/lock.py --with-pip-compile  # + pip-compile (slow: it downloads every
                                                            #   wheel to hash it; 367 s / 34.7 GB here;
                                                            #   needs the bench extra: pip install -e '.[bench]')

Notes on fairness:
* raw uv gets the same flags build-image uses (``--python-version/--python-platform`` of the
  base, ``--no-build``, ``--generate-hashes``, ``--python <this interpreter>`` and
  ``UV_PYTHON_DOWNLOADS=never`` — without the last two uv spends seconds trying to find or
  download a CPython 3.12 it does not need);
* pip-compile cannot resolve for another interpreter/platform: it resolves for this host's
  Python, which is the closest it can do on the same inputs;
* every tool runs ``--repeat`` times after one warm-up; the median is reported.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builder.resolve.lock import base_requirements, find_uv, parse_overlay  # noqa: E402
from builder.resolve.manifest import load_manifest  # noqa: E402
from builder.spec import default_base_manifest  # noqa: E402

BIN = Path(sys.executable).parent


def timed(cmd: list[str], *, env=None, cwd=None, timeout=None, ok=(0,), expect: str | None = None) -> float | str:
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timeout>{timeout}s"
    dt = time.monotonic() - t0
    if r.returncode not in ok:
        return f"failed({r.returncode}): {(r.stderr or r.stdout).strip().splitlines()[-1:]}"
    if expect is not None:  # build-image --json: make sure the row measured what it claims
        import json

        status = json.loads(r.stdout).get("status")
        if status != expect:
            return f"measured the wrong thing: status {status!r}, expected {expect!r}"
    return dt


def interleaved(n: int, tools: list[tuple[str, object]]) -> list[tuple[str, float | str]]:
    """Warm each tool up once, then run the tools in turn ``n`` rounds (network drift hits all
    of them alike); the median per tool."""
    for _, fn in tools:
        fn()
    vals: dict[str, list[float] | str] = {name: [] for name, _ in tools}
    for _ in range(n):
        for name, fn in tools:
            if isinstance(vals[name], str):
                continue
            v = fn()
            vals[name] = v if isinstance(v, str) else vals[name] + [v]
    return [(name, v if isinstance(v, str) else statistics.median(v)) for name, v in vals.items()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm", default="0.26.0")
    ap.add_argument("--with", dest="with_", action="append", default=[], help="extra overlay requirement")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--with-pip-compile", action="store_true", help="also time pip-compile --generate-hashes (slow)")
    ap.add_argument("--pip-compile-timeout", type=int, default=900)
    args = ap.parse_args()

    manifest_path = default_base_manifest(args.vllm)
    base = load_manifest(manifest_path)
    overlay = ["ray[serve]", *args.with_]
    uv = find_uv()
    work = Path(tempfile.mkdtemp(prefix="bench-lock-"))
    (work / "overlay.in").write_text("\n".join(overlay) + "\n")
    (work / "base.in").write_text("\n".join(base_requirements(base, parse_overlay(overlay))) + "\n")
    lock_out = work / "requirements.lock"
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_NO_CONFIG": "1"}
    bi = [str(BIN / "build-image"), "lock", "--vllm", args.vllm, "--json", "-o", str(lock_out)]
    bi_other = [str(BIN / "build-image"), "lock", "--vllm", args.vllm, "--json", "-o", str(work / "changed.lock")]
    for w in args.with_:
        bi += ["--with", w]
        bi_other += ["--with", w]
    raw = [uv, "pip", "compile", "overlay.in", "base.in", "-o", "raw.txt", "--quiet",
           "--python-version", base.python_version, "--python-platform", base.platform,
           "--no-build", "--generate-hashes", "--python", sys.executable]

    rows: list[tuple[str, float | str]] = []
    print(f"inputs: {len(base.distributions)} base pins from {manifest_path}, overlay {overlay}; "
          f"median of {args.repeat} after a warm-up", file=sys.stderr)
    def raw_fresh():
        (work / "raw.txt").unlink(missing_ok=True)  # no existing output: no preferences
        return timed(raw, env=env, cwd=work)

    toggle = {"n": 0}

    def bi_changed():
        # each call changes an input (an overlay line already satisfied by the base), so the lock
        # is stale and re-resolved with the previous pins as preferences
        toggle["n"] += 1
        extra = ["--with", "requests"] if toggle["n"] % 2 else ["--with", "requests>=2"]
        return timed(bi_other + extra, env=env, expect="written")

    rows += interleaved(args.repeat, [
        ("raw uv pip compile (fresh)", raw_fresh),
        ("build-image lock --upgrade (fresh)", lambda: timed(bi + ["--upgrade"], env=env, expect="written")),
        ("raw uv pip compile (existing output)", lambda: timed(raw, env=env, cwd=work)),
        ("build-image lock (input changed)", bi_changed),
        ("build-image lock (up to date: re-lock)", lambda: timed(bi, env=env, expect="up-to-date")),
        ("build-image lock --check (up to date)", lambda: timed(bi + ["--check"], env=env, expect="up-to-date")),
    ])
    if args.with_pip_compile:
        if not (BIN / "pip-compile").exists():
            sys.exit("--with-pip-compile needs pip-tools: pip install -e '.[bench]'")
        pc = [str(BIN / "pip-compile"), "--generate-hashes", "--quiet", "--no-header", "-o", "pc.txt",
              "overlay.in", "base.in"]
        rows.append(("pip-compile --generate-hashes (host python)",
                     timed(pc, cwd=work, timeout=args.pip_compile_timeout)))
    else:
        rows.append(("pip-compile --generate-hashes", "skipped (--with-pip-compile; measured here: 367 s, 34.7 GB)"))

    refs = {"fresh": rows[0][1], "existing output": rows[2][1]}
    print(f"\n{'tool':<46} {'seconds':>9} {'x raw uv':>9}")
    for i, (name, val) in enumerate(rows):
        ref = refs["existing output"] if i in (2, 3) else refs["fresh"]
        if isinstance(val, str):
            print(f"{name:<46} {val}")
        else:
            ratio = f"{val / ref:.2f}x" if isinstance(ref, float) else "-"
            print(f"{name:<46} {val:9.2f} {ratio:>9}")
    print("(ratios: rows 1-2 and 5-7 against raw uv fresh; rows 3-4 against raw uv with an existing output file)")
    for label, a, b in (("fresh", rows[1][1], rows[0][1]), ("with preferences", rows[3][1], rows[2][1])):
        if isinstance(a, float) and isinstance(b, float):
            print(f"target build-image/raw uv <= 1.3x ({label}): {'met' if a / b <= 1.3 else 'NOT met'} ({a / b:.2f}x)")
    check = rows[5][1]
    if isinstance(check, float):
        print(f"target up-to-date --check < 1 s warm: {'met' if check < 1.0 else 'NOT met'} ({check:.2f} s)")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
