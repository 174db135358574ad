#!/usr/bin/env python3
"""Mutation testing of the pure decision modules, on demand (not part of CI).

Two modes:

``scripts/mutation.py audit``
    Re-plants the mutants an audit of the suite once found unguarded (each a
    small, plausible bug in a decision rule), one at a time, into a scratch copy
    of the tree and runs the tests that pin that rule.  Every mutant must make
    them fail; the script exits 1 naming any that survives.  Takes ~30 s.

``scripts/mutation.py run MODULE [MODULE ...]``
    Runs mutmut 3 (``pip install -e '.[mutation]'``) over the module (a short name:
    ``abi`` is ``builder/resolve/abi.py``, see ``MODULES``; ``patches`` is the old name of
    ``series``) in a scratch copy of the tree, with that module's own tests as the test
    command (the narrowest selection that covers it: see ``TESTS``), and prints
    killed / survived / timeout / no-tests and the score per module.  One module
    at a time, nice'd, ``--max-children`` 1 by default: the machine is shared.
    ``--json FILE`` writes the per-module numbers and the surviving mutants.
    Survivors are shown with ``mutmut show NAME`` in ``--work``'s mutants dir.

Modules, their files and their test selections are in ``MODULES`` and ``TESTS`` below;
docs/testing.md lists the last measured scores and the survivors judged equivalent.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

#: module (short name) -> its file
MODULES: dict[str, str] = {
    "abi": "builder/resolve/abi.py",
    "diff": "builder/resolve/diff.py",
    "lockfile": "builder/resolve/lockfile/requirements.py",
    "plan": "builder/serving/plan/budget.py",
    "plan_shape": "builder/serving/plan/shape.py",
    "plan_layout": "builder/serving/plan/layout.py",
    "plan_settings": "builder/serving/plan/settings.py",
    "port": "builder/patching/port.py",
    "probe": "builder/patching/probe.py",
    "series": "builder/patching/series.py",
}
#: names the modules had before builder/ was grouped by concern
ALIASES = {"patches": "series"}

#: module -> the tests that exercise it (the test command mutmut runs per mutant).
TESTS: dict[str, list[str]] = {
    "abi": ["tests/test_abi.py", "tests/test_lock.py", "tests/test_diff.py"],
    "plan": ["tests/test_plan.py", "tests/test_release_facts.py"],
    "plan_shape": ["tests/test_plan.py", "tests/test_release_facts.py"],
    "plan_layout": ["tests/test_plan.py", "tests/test_release_facts.py"],
    "plan_settings": ["tests/test_plan.py", "tests/test_release_facts.py"],
    "diff": ["tests/test_diff.py", "tests/test_diff_release.py"],
    "lockfile": ["tests/test_lockfile.py", "tests/test_diff.py", "tests/test_pylock.py"],
    "series": ["tests/test_patches.py", "tests/test_patch_rules.py", "tests/test_patch_series.py"],
    "port": ["tests/test_port.py", "tests/test_patch_series.py"],
    "probe": ["tests/test_port.py", "tests/test_patch_series.py", "tests/test_patches.py"],
}


@dataclass(frozen=True)
class Mutant:
    """One planted bug: replace ``old`` (which must occur exactly once) by ``new``."""

    module: str
    what: str
    old: str
    new: str
    tests: tuple[str, ...]


AUDIT: list[Mutant] = [
    Mutant(
        "plan",
        "global KV heads of attention_k_eq_v models not divided by TP",
        'int(cfg["num_global_key_value_heads"]) // tp',
        'int(cfg["num_global_key_value_heads"])',
        ("tests/test_plan.py",),
    ),
    Mutant(
        "plan",
        "fp8_e5m2 KV counted as 2 bytes",
        '"fp8_e4m3": 1, "fp8_e5m2": 1,',
        '"fp8_e4m3": 1, "fp8_e5m2": 2,',
        ("tests/test_plan.py",),
    ),
    Mutant(
        "plan_layout",
        "chunked-attention window ignores in-flight tokens",
        "min(self.window + in_flight, max_len)",
        "min(self.window, max_len)",
        ("tests/test_plan.py",),
    ),
    Mutant(
        "diff",
        "a major downgrade grouped with the minor bumps",
        'c.group = 4 if "major" in c.tags else 5',
        'c.group = 4 if "major" in c.tags and "downgrade" not in c.tags else 5',
        ("tests/test_diff.py",),
    ),
    Mutant(
        "lockfile",
        "duplicate detection on the raw name",
        "        key = canonical_name(name)\n",
        "        key = name\n",
        ("tests/test_lockfile.py", "tests/test_diff.py"),
    ),
    Mutant(
        "lockfile",
        "allow-abi-change reason split at the last colon",
        'name, _, reason = val.partition(":")',
        'name, _, reason = val.rpartition(":")',
        ("tests/test_lockfile.py", "tests/test_diff.py"),
    ),
    Mutant(
        "series",
        "context compared after rstrip() (whitespace fuzz)",
        "if tuple(lines[start:start + len(old)]) == old:",
        "if tuple(x.rstrip() for x in lines[start:start + len(old)]) == tuple(x.rstrip() for x in old):",
        ("tests/test_patches.py", "tests/test_patch_rules.py"),
    ),
    Mutant(
        "series",
        "zero-context (-U0) insertion placed one line early",
        "start = start_line - 1 if length > 0 else start_line",
        "start = start_line - 1",
        ("tests/test_patches.py", "tests/test_patch_rules.py"),
    ),
]


def module_name(name: str) -> str:
    """A module's short name (``abi``) from a short name, an old name (``patches``), a path
    (``builder/resolve/abi.py``) or a dotted name (``builder.resolve.abi``)."""
    name = ALIASES.get(name, name)
    if name in MODULES:
        return name
    for short, path in MODULES.items():
        if name in (path, path[:-3].replace("/", ".")):
            return short
    raise argparse.ArgumentTypeError(f"unknown module {name!r}; one of {', '.join(sorted(MODULES))}")


def dotted(module: str) -> str:
    """``builder.resolve.abi``: how mutmut names the module's functions."""
    return MODULES[module][:-3].replace("/", ".")


def _copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked + untracked, not ignored), uncommitted edits included."""
    files = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, files):
        src = ROOT / rel
        if rel.startswith("mutants/") or not (src.is_file() or src.is_symlink()):
            continue
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():  # builder/data/* link to the top-level data folders
            if out.is_symlink() or out.exists():
                out.unlink() if not out.is_dir() or out.is_symlink() else shutil.rmtree(out)
            os.symlink(os.readlink(src), out)
            continue
        shutil.copy2(src, out, follow_symlinks=False)


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "NO_COLOR": "1"}
    env.pop("UPDATE_GOLDEN", None)
    return env


def _pytest(cwd: Path, tests: tuple[str, ...] | list[str], timeout: int = 600) -> int:
    cmd = [
        "nice",
        "-n",
        "10",
        str(VENV_BIN / "python"),
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        "-m",
        "not slow",
        *tests,
    ]
    env = _env()
    env["PYTHONPATH"] = str(cwd)  # the scratch copy's builder, not the editable install's
    return subprocess.run(
        cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout
    ).returncode


def audit(work: Path) -> int:
    _copy_tree(work)
    survivors = []
    for m in AUDIT:
        path = work / MODULES[m.module]
        text = path.read_text()
        if text.count(m.old) != 1:
            print(f"?  {m.module}: {m.what}: the code it mutates is not there once (rule moved?)")
            survivors.append(m)
            continue
        path.write_text(text.replace(m.old, m.new))
        try:
            t0 = time.monotonic()
            rc = _pytest(work, m.tests)
        finally:
            path.write_text(text)
        verdict = "killed" if rc == 1 else "SURVIVED" if rc == 0 else f"error (pytest exit {rc})"
        print(f"{'ok' if rc == 1 else '!!'} {m.module}: {m.what}: {verdict} ({time.monotonic() - t0:.0f} s)")
        if rc != 1:
            survivors.append(m)
    if _pytest(work, sorted({t for m in AUDIT for t in m.tests})) != 0:
        print("!! the unmutated tree fails these tests: the verdicts above mean nothing")
        return 1
    print(f"{len(AUDIT) - len(survivors)}/{len(AUDIT)} audit mutants killed")
    return 1 if survivors else 0


def _mutmut_config(module: str, work: Path) -> str:
    tests = ", ".join(json.dumps(t) for t in TESTS[module])
    # mutmut runs the tests inside work/mutants/: everything else they read comes along
    extra = sorted(p.name for p in work.iterdir() if p.name not in ("builder", "tests", "mutants", "pyproject.toml"))
    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["builder"]\n'
        f'only_mutate = ["{MODULES[module]}"]\n'
        f"pytest_add_cli_args_test_selection = [{tests}]\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-m", "not slow", "-q"]\n'
        "use_git_change_detection = false\n"
        f"also_copy = {json.dumps(extra)}\n"
        f"debug = {'true' if os.environ.get('MUTATION_DEBUG') else 'false'}\n"
    )


def _mutmut_stats(work: Path, only: list[str] | None = None) -> tuple[dict[str, int], list[str], list[str]]:
    out = subprocess.run(
        [str(VENV_BIN / "mutmut"), "results", "--all", "true"],
        cwd=work,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts: dict[str, int] = {}
    survivors, everything = [], []
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if not sep or (only and not any(fnmatch.fnmatch(name, pat) for pat in only)):
            continue
        counts[status] = counts.get(status, 0) + 1
        everything.append(name)
        if status in ("survived", "no tests"):
            survivors.append(name)
    return counts, survivors, everything


def _refresh_tree(wdir: Path, module: str) -> None:
    """Copy the current tree over a finished run's (work/, and work/mutants/ for all but the
    mutated module, which must be unchanged) so that the survivors can be re-run against the
    new tests."""
    mutated = wdir / "mutants" / MODULES[module]
    if (ROOT / MODULES[module]).read_bytes() != (wdir / MODULES[module]).read_bytes():
        raise SystemExit(f"--survivors: {MODULES[module]} changed since the run in {wdir}; run it afresh")
    keep = mutated.read_bytes()
    _copy_tree(wdir)
    _copy_tree(wdir / "mutants")
    mutated.write_bytes(keep)
    with open(wdir / "pyproject.toml", "a") as f:
        f.write(_mutmut_config(module, wdir))
    shutil.copy2(wdir / "pyproject.toml", wdir / "mutants" / "pyproject.toml")
    (wdir / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)  # the tests changed: re-map them


def run(
    modules: list[str],
    work: Path,
    max_children: int,
    show: bool,
    survivors_only: bool = False,
    functions: list[str] | None = None,
) -> dict:
    report = {}
    for module in modules:
        wdir = work / module
        names: list[str] = []
        only = [f"{dotted(module)}.x{'' if f.startswith('ǁ') else '_'}{f}__mutmut_*" for f in functions or []]
        if survivors_only:
            if not (wdir / "mutants").is_dir():
                raise SystemExit(f"--survivors: no earlier run of {module} in {wdir}")
            names = _mutmut_stats(wdir, only)[1]
            _refresh_tree(wdir, module)
        else:
            if wdir.exists():
                shutil.rmtree(wdir)
            wdir.mkdir(parents=True)
            _copy_tree(wdir)
            with open(wdir / "pyproject.toml", "a") as f:
                f.write(_mutmut_config(module, wdir))
            _copy_tree(wdir / "mutants")  # mutmut copies .py files, not the builder/data links: lay them first
            shutil.copy2(wdir / "pyproject.toml", wdir / "mutants" / "pyproject.toml")
        t0 = time.monotonic()
        env = _env()
        env.pop("PYTHONPATH", None)  # mutmut puts work/mutants first on sys.path itself
        mutmut = ["nice", "-n", "10", str(VENV_BIN / "mutmut"), "run", "--max-children", str(max_children)]
        out = subprocess.DEVNULL if not show else None
        rc = subprocess.run(mutmut + only, cwd=wdir, env=env, stdout=out).returncode  # new / not yet checked
        if names:  # the earlier survivors, against the current tests
            live = set(_mutmut_stats(wdir, only)[2])
            rc = subprocess.run(mutmut + [n for n in names if n in live], cwd=wdir, env=env, stdout=out).returncode
        secs = time.monotonic() - t0
        counts, survivors, _ = _mutmut_stats(wdir, only)
        killed = counts.get("killed", 0) + counts.get("timeout", 0) + counts.get("caught by type check", 0)
        tested = sum(counts.values()) - counts.get("skipped", 0)
        score = 100.0 * killed / tested if tested else 0.0
        report[module] = {
            "functions": functions or "all",
            "counts": counts,
            "tested": tested,
            "killed": killed,
            "score": round(score, 1),
            "seconds": round(secs),
            "survivors": survivors,
            "mutmut_exit": rc,
            "work": str(wdir),
        }
        print(f"{module:9} {killed}/{tested} killed = {score:.1f}%  {counts}  ({secs:.0f} s, {wdir})")
        for s in survivors:
            print(f"    survivor: {s}")
    return report


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("audit", help="re-plant the audit's mutants; each must fail the tests that pin it")
    a.add_argument("--work", type=Path, help="scratch directory (default: a fresh temporary one)")
    r = sub.add_parser(
        "run", help="mutmut over one module (abi, diff, lockfile, plan, port, probe, series) with that module's tests"
    )
    r.add_argument(
        "modules",
        nargs="+",
        type=module_name,
        metavar="MODULE",
        help=f"one of {', '.join(sorted(MODULES))} (or its path, or 'patches' for series)",
    )
    r.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "build-image-mutation")
    r.add_argument("--max-children", type=int, default=1)
    r.add_argument("--json", type=Path, help="write the per-module report here")
    r.add_argument("--show", action="store_true", help="show mutmut's own progress")
    r.add_argument(
        "--functions",
        nargs="+",
        metavar="NAME",
        help="mutate only these functions of the module (a budget on 2 shared cores); the score covers them",
    )
    r.add_argument(
        "--survivors",
        action="store_true",
        help="re-run only the survivors of the last run in --work, against the current tests",
    )
    args = ap.parse_args(argv)
    if args.cmd == "audit":
        if args.work:
            args.work.mkdir(parents=True, exist_ok=True)
            return audit(args.work)
        with tempfile.TemporaryDirectory(prefix="mutation-audit-") as d:
            return audit(Path(d))
    if not (VENV_BIN / "mutmut").exists():
        print("mutmut is not installed: pip install -e '.[mutation]'", file=sys.stderr)
        return 2
    report = run(args.modules, args.work, args.max_children, args.show, args.survivors, args.functions)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
