#!/usr/bin/env python3
"""Benchmark: `build-image lock` vs raw `uv pip compile` vs `pip-compile --generate-hashes`.

Same inputs for every tool, as `build-image lock` hands them to uv: the overlay it resolves
(``ray[serve]`` with the ray chosen for the release, + ``--with``) as the requirements, every
base distribution the overlay does not name pinned ``name==version`` as constraints (``-c``), and
the image's ``UV_OVERRIDE`` pins as overrides (``--override``).  Run on demand; prints one
side-by-side table per release and one summary line per release with the ratios to raw uv.

    .venv/bin/python benchmarks/lock.py                     # every shipped release, one run
    .venv/bin/python benchmarks/lock.py --vllm 0.33.0       # one release (repeatable)
    .venv/bin/python benchmarks/lock.py --vllm 0.26.0 --with-pip-compile  # + pip-compile (slow: it
                                                            #   downloads every wheel to hash it; 367 s /
                                                            #   34.7 GB here; needs the bench extra:
                                                            #   pip install -e '.[bench]')

Notes on fairness:
* raw uv runs the command line the lock's uv adapter builds (:meth:`builder.resolve.lock.Uv.compile_cmd`:
  ``--python-version/--python-platform`` of the base, ``--no-build``, ``--python <this interpreter>``)
  with ``--generate-hashes``, in the same environment (``UV_PYTHON_DOWNLOADS=never``, no uv config);
* the ray the lock chooses for a release is chosen here the same way (ray[llm]'s vllm pin, from the
  index); when it does not fit on the base, the lock falls back to the newest ray that does, and so
  does the baseline;
* pip-compile cannot resolve for another interpreter/platform, nor take overrides: it resolves for
  this host's Python with the same requirements and constraints, the closest it can do;
* every tool runs ``--repeat`` times after one warm-up, interleaved; the median is reported;
* build-image runs as an installed tool does: its interpreter keeps compiled bytecode (in a
  scratch ``PYTHONPYCACHEPREFIX`` filled by the warm-up, so the checkout and the venv are not
  written to; an ambient ``PYTHONDONTWRITEBYTECODE`` would otherwise recompile every module on
  every run, ~0.05-0.1 s that no installed copy pays).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builder.resolve import index as ix  # noqa: E402
from builder.resolve.baseref import resolve_base  # noqa: E402
from builder.resolve.lock import DEFAULT_RAY, base_requirements, parse_overlay, request_for, target_tags  # noqa: E402
from builder.resolve.raychoice import choose, ray_releases  # noqa: E402
from builder.resolve.uv import Uv  # noqa: E402
from builder.spec import supported_vllm_versions  # noqa: E402

BIN = Path(sys.executable).parent
FRESH_TARGET = 1.1  # build-image lock --upgrade / raw uv fresh
CHECK_TARGET = 0.3  # seconds, build-image lock --check on an up-to-date lock


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


def shipped_releases() -> list[str]:
    """Every release this checkout ships a linux/amd64 base manifest for, oldest first (the
    ``-linux-arm64`` manifests are the same releases on another platform)."""
    return supported_vllm_versions()


class Inputs:
    """The lock's uv inputs for one release, written to ``work``: overlay.in, base.in (constraints),
    base-overrides.txt (overrides), and the raw uv command line on them."""

    def __init__(self, vllm: str, with_: list[str], work: Path, uv: Uv):
        self.vllm, self.work, self.uv = vllm, work, uv
        resolved = resolve_base(None, vllm)
        self.label = resolved.label
        req = request_for(vllm=vllm, base=resolved, with_=with_, default_overlay=True, vllm_given=True)
        self.base = base = req.base
        tags = target_tags(base.python_version, base.python_abi, base.platform)
        on_base = base.get("vllm").version if base.get("vllm") is not None else vllm
        req.ray = choose(on_base, ray_releases(ix.for_request([], False), on_base, tags))
        self.overlay = req.resolution_overlay()
        self.fell_back: str | None = None  # the chosen ray that does not fit on the base
        self.write(self.overlay)
        if req.ray.requirement and self.unsatisfiable():  # the lock's fallback: the newest ray that fits
            self.fell_back = req.ray.requirement
            self.overlay = [DEFAULT_RAY if r == req.ray.requirement else r for r in self.overlay]
            self.write(self.overlay)

    def write(self, overlay: list[str]) -> None:
        (self.work / "overlay.in").write_text("\n".join(overlay) + "\n")
        (self.work / "base.in").write_text("\n".join(base_requirements(self.base, parse_overlay(overlay))) + "\n")
        overrides = self.work / "base-overrides.txt"
        overrides.write_text("".join(f"{o}\n" for o in self.base.uv_overrides or ()))
        self.cmd = self.uv.compile_cmd(
            [self.work / "overlay.in"],
            self.work / "raw.txt",
            python_version=self.base.python_version,
            platform=self.base.platform,
            hashes=True,
            constraints=[self.work / "base.in"],
            overrides=[overrides] if self.base.uv_overrides else [],
        )

    def unsatisfiable(self) -> bool:
        (self.work / "raw.txt").unlink(missing_ok=True)
        r = subprocess.run(self.cmd, capture_output=True, text=True, env=Uv.env(), cwd=self.work)
        return r.returncode != 0

    def describe(self) -> str:
        overrides = len(self.base.uv_overrides or ())
        fell_back = (
            f" ({self.fell_back} does not fit on the base: the lock resolves it first, looks for the pins "
            "that would have to move, then locks the newest ray that fits; raw uv runs only the last)"
            if self.fell_back
            else ""
        )
        return (
            f"vllm {self.vllm}: overlay {self.overlay}{fell_back}, {len(self.base.distributions)} base pins as "
            f"constraints, {overrides} override(s), from {self.label}"
        )


def bench_release(vllm: str, args, uv: Uv) -> list[tuple[str, float | str]]:
    work = Path(tempfile.mkdtemp(prefix=f"bench-lock-{vllm}-"))
    try:
        inputs = Inputs(vllm, args.with_, work, uv)
        print(inputs.describe() + f"; median of {args.repeat} after a warm-up", file=sys.stderr, flush=True)
        env = Uv.env()
        bi_env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
        bi_env["PYTHONPYCACHEPREFIX"] = str(args.pycache)
        lock_out = work / "requirements.lock"
        bi = [str(BIN / "build-image"), "lock", "--vllm", vllm, "--json", "-o", str(lock_out)]
        bi_other = [str(BIN / "build-image"), "lock", "--vllm", vllm, "--json", "-o", str(work / "changed.lock")]
        for w in args.with_:
            bi += ["--with", w]
            bi_other += ["--with", w]

        def raw_fresh():
            (work / "raw.txt").unlink(missing_ok=True)  # no existing output: no preferences
            return timed(inputs.cmd, env=env, cwd=work)

        toggle = {"n": 0}

        def bi_changed():
            # each call changes an input (an overlay line already satisfied by the base), so the lock
            # is stale and re-resolved with the previous pins as preferences
            toggle["n"] += 1
            extra = ["--with", "requests"] if toggle["n"] % 2 else ["--with", "requests>=2"]
            return timed(bi_other + extra, env=bi_env, expect="written")

        rows = interleaved(
            args.repeat,
            [
                ("raw uv pip compile (fresh)", raw_fresh),
                ("build-image lock --upgrade (fresh)", lambda: timed(bi + ["--upgrade"], env=bi_env, expect="written")),
                ("raw uv pip compile (existing output)", lambda: timed(inputs.cmd, env=env, cwd=work)),
                ("build-image lock (input changed)", bi_changed),
                ("build-image lock (up to date: re-lock)", lambda: timed(bi, env=bi_env, expect="up-to-date")),
                (
                    "build-image lock --check (up to date)",
                    lambda: timed(bi + ["--check"], env=bi_env, expect="up-to-date"),
                ),
            ],
        )
        if args.with_pip_compile:
            if not (BIN / "pip-compile").exists():
                sys.exit("--with-pip-compile needs pip-tools: pip install -e '.[bench]'")
            pc = [
                str(BIN / "pip-compile"),
                "--generate-hashes",
                "--quiet",
                "--no-header",
                "-o",
                "pc.txt",
                "overlay.in",
                "-c",
                "base.in",
            ]
            rows.append(
                ("pip-compile --generate-hashes (host python)", timed(pc, cwd=work, timeout=args.pip_compile_timeout))
            )
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


def print_table(vllm: str, rows: list[tuple[str, float | str]]) -> None:
    refs = {"fresh": rows[0][1], "existing output": rows[2][1]}
    print(f"\nvllm {vllm}\n{'tool':<46} {'seconds':>9} {'x raw uv':>9}")
    for i, (name, val) in enumerate(rows):
        ref = refs["existing output"] if i in (2, 3) else refs["fresh"]
        if isinstance(val, str):
            print(f"{name:<46} {val}")
        else:
            ratio = f"{val / ref:.2f}x" if isinstance(ref, float) else "-"
            print(f"{name:<46} {val:9.2f} {ratio:>9}")


def ratio(a: float | str, b: float | str) -> float | None:
    return a / b if isinstance(a, float) and isinstance(b, float) else None


def print_summary(results: dict[str, list[tuple[str, float | str]]]) -> bool:
    """One line per release: the fresh and with-preferences ratios and --check; True when all meet the targets."""
    print(
        f"\n{'release':<9} {'raw uv s':>9} {'lock s':>9} {'fresh x':>8} {'prefs x':>8} {'--check s':>10}  targets "
        f"(fresh <= {FRESH_TARGET}x raw uv, --check < {CHECK_TARGET} s)"
    )
    all_met = True
    for vllm, rows in results.items():
        fresh, prefs, check = ratio(rows[1][1], rows[0][1]), ratio(rows[3][1], rows[2][1]), rows[5][1]
        met = fresh is not None and fresh <= FRESH_TARGET and isinstance(check, float) and check < CHECK_TARGET
        all_met &= met

        def num(v, fmt):
            return format(v, fmt) if isinstance(v, float) else "-"

        print(
            f"{vllm:<9} {num(rows[0][1], '9.2f'):>9} {num(rows[1][1], '9.2f'):>9} {num(fresh, '7.2f'):>8} "
            f"{num(prefs, '7.2f'):>8} {num(check, '10.2f'):>10}  {'met' if met else 'NOT met'}"
        )
    print(
        "(fresh: lock --upgrade / raw uv fresh; prefs: lock after an input change / raw uv with an existing "
        "output file)"
    )
    return all_met


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--vllm", action="append", default=[], help="release to measure (repeatable; default: every shipped release)"
    )
    ap.add_argument("--with", dest="with_", action="append", default=[], help="extra overlay requirement")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--with-pip-compile", action="store_true", help="also time pip-compile --generate-hashes (slow)")
    ap.add_argument("--pip-compile-timeout", type=int, default=900)
    args = ap.parse_args()
    uv = Uv()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-lock-pycache-") as pycache:
        args.pycache = pycache
        for vllm in args.vllm or shipped_releases():
            results[vllm] = bench_release(vllm, args, uv)
            print_table(vllm, results[vllm])
            sys.stdout.flush()
    if not args.with_pip_compile:
        print("\npip-compile --generate-hashes: skipped (--with-pip-compile; measured here on 0.26.0: 367 s, 34.7 GB)")
    print_summary(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
