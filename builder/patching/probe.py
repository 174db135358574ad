"""Behavioural probes of a patch series: run each patch's probe through the package's own code.

A patch names its probe in the header (``Probe: 0001-name.probe.py``), a Python script
found (:func:`probe_path`) beside it in the series folder -- a release's own copy, for a probe
that must differ there -- or else in the package's shared probe folder next to the series
(``patches/<package>/probes/``), which holds the one copy every release whose code it fits uses.
The probe imports the package from ``PYTHONPATH`` (the tree under test), drives the code the
patch changes on CPU, and prints one line

    PROBE-RESULT {"checks": [{"name": "...", "ok": true, "detail": "..."}, ...]}

It **passes** when it printed that line with at least one check and every check is ok,
**fails** when it printed it with a failing check, and is an **error** otherwise (it
crashed, timed out, printed nothing): an error is never evidence for or against a patch.

For one series this module answers two questions per patch:

* *needed*: the probe fails on the unpatched tree (the package as shipped);
* *works*: the probe passes on the tree patched by the whole series.

Trees come from a wheel (its ``<package>/`` files without compiled ``.so`` files,
extracted once per wheel sha256 under the cache) or from a directory holding the
package.  The patched tree shares the unchanged files with the unpatched one by hard
link; the patched targets are new files, so the cached tree is never modified.

The interpreter is a CPU virtual environment built with uv from the series'
``probe-env.txt`` (one requirement a line), cached per content; a series without that
file runs its probes with the current interpreter (synthetic test packages).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from builder.errors import BadInput, ExternalToolError
from builder.events import SILENT, Reporter
from builder.patching import series as P
from builder.resolve.uv import Uv
from builder.scratch import cache_entry
from builder.util import atomic_write_bytes, cache_dir, sha256_file

PROBE_FIELD = "Probe"
PROBE_ENV = "probe-env.txt"
SHARED_PROBES = "probes"  # patches/<package>/probes/: the probes shared by the package's releases
RESULT_PREFIX = "PROBE-RESULT "
PASS, FAIL, ERROR = "pass", "fail", "error"
DEFAULT_TIMEOUT = 600


# =========================================================================== data
@dataclass
class ProbeRun:
    """One probe run on one tree."""

    status: str  # pass | fail | error
    checks: list[dict] = field(default_factory=list)
    output: str = ""  # stdout+stderr tail (evidence, error cause)
    seconds: float = 0.0

    @property
    def failed_checks(self) -> list[dict]:
        return [c for c in self.checks if not c.get("ok")]

    def summary(self) -> str:
        if self.status == ERROR:
            return "error: " + (self.output.strip().splitlines() or ["no output"])[-1][:300]
        bad = self.failed_checks
        if not bad:
            return f"{len(self.checks)} check(s) pass"
        more = f"; +{len(bad) - 3} more" if len(bad) > 3 else ""
        return (
            f"{len(bad)} of {len(self.checks)} check(s) fail: "
            + "; ".join(str(c.get("name"))[:120] for c in bad[:3])
            + more
        )

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "checks": self.checks,
            "seconds": round(self.seconds, 2),
            **({"output": self.output[-2000:]} if self.status == ERROR else {}),
        }


@dataclass
class PatchProbe:
    """Verdict for one patch: needed (fails unpatched) and works (passes patched)."""

    patch: str
    probe: str
    unpatched: ProbeRun
    patched: ProbeRun | None

    @property
    def needed(self) -> bool | None:
        return {FAIL: True, PASS: False}.get(self.unpatched.status)

    @property
    def works(self) -> bool | None:
        if self.patched is None:
            return None
        return {PASS: True, FAIL: False}.get(self.patched.status)

    def to_dict(self) -> dict:
        return {
            "patch": self.patch,
            "probe": self.probe,
            "needed": self.needed,
            "works": self.works,
            "unpatched": self.unpatched.to_dict(),
            "patched": self.patched.to_dict() if self.patched else None,
        }


# =========================================================================== parsing (pure)
def parse_output(stdout: str, returncode: int, stderr: str = "") -> ProbeRun:
    """A probe's output -> :class:`ProbeRun` (see the module doc for the contract)."""
    tail = (stdout[-3000:] + ("\n" + stderr[-3000:] if stderr else "")).strip()
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if not lines:
        return ProbeRun(ERROR, output=f"exit {returncode}, no {RESULT_PREFIX.strip()} line\n{tail}")
    try:
        doc = json.loads(lines[-1][len(RESULT_PREFIX) :])
        checks = doc["checks"]
        if not isinstance(checks, list) or not all(isinstance(c, dict) and "ok" in c for c in checks):
            raise ValueError("checks must be a list of {name, ok, detail}")
    except (ValueError, KeyError, TypeError) as exc:
        return ProbeRun(ERROR, output=f"malformed {RESULT_PREFIX.strip()} line ({exc})\n{tail}")
    if not checks:
        return ProbeRun(ERROR, checks, output=f"the probe ran no check\n{tail}")
    return ProbeRun(PASS if all(c["ok"] is True for c in checks) else FAIL, checks, output=tail)


def probe_name(patch: P.Patch) -> str | None:
    return (patch.headers.get(PROBE_FIELD) or "").strip() or None


def shared_probes_dir(series_dir: Path) -> Path:
    """The package's shared probe folder for a series at ``patches/<package>/<version>/``."""
    return Path(series_dir).parent / SHARED_PROBES


def find_probe(series_dir: Path, name: str) -> Path | None:
    """The probe file ``name`` for the series in ``series_dir``: the series' own copy, else the shared one;
    None when neither is a file (or ``name`` is not a plain file name)."""
    if not name or "/" in name or name in (".", ".."):
        return None
    for d in (Path(series_dir), shared_probes_dir(series_dir)):
        if (d / name).is_file():
            return d / name
    return None


def probe_path(series_dir: Path, patch: P.Patch) -> Path:
    """The probe file a patch names (:func:`find_probe`); :class:`BadInput` if the header names none or a
    missing file."""
    name = probe_name(patch)
    shared = shared_probes_dir(series_dir)
    also = f", or in {shared}" if shared.is_dir() else ""
    if not name:
        raise BadInput(
            f"patch {series_dir / patch.name}: no '{PROBE_FIELD}:' header naming its probe "
            f"(a Python file beside it in {series_dir}{also})."
        )
    found = find_probe(series_dir, name)
    if found is None:
        raise BadInput(
            f"patch {series_dir / patch.name}: its probe {name!r} is not a file in {series_dir}"
            + (f" (nor in {shared})." if also else ".")
        )
    return found


def env_requirements(series_dir: Path) -> list[str] | None:
    """The series' probe-env.txt requirements, None when it has none."""
    f = Path(series_dir) / PROBE_ENV
    if not f.is_file():
        return None
    reqs = [ln.split("#", 1)[0].strip() for ln in f.read_text(encoding="utf-8").splitlines()]
    reqs = [r for r in reqs if r]
    if not reqs:
        raise BadInput(f"{f}: lists no requirement.")
    return reqs


# =========================================================================== adapters
class ProbeRunner:
    """Runs probe scripts: one subprocess per probe, ``PYTHONPATH`` = the tree under test."""

    def __init__(self, python: str | None = None, timeout: int = DEFAULT_TIMEOUT):
        self.python = python or sys.executable
        self.timeout = timeout

    def run(self, probe: Path, tree: Path) -> ProbeRun:
        import time

        t0 = time.monotonic()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PYTHON"))}
        env.update(
            PYTHONPATH=str(tree),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_LOGGING_LEVEL="INFO",
            PYTHONNOUSERSITE="1",
        )
        with tempfile.TemporaryDirectory(prefix="build-image-probe-") as cwd:
            try:
                r = subprocess.run(
                    [self.python, str(Path(probe).resolve())],
                    capture_output=True,
                    text=True,
                    cwd=cwd,
                    env=env,
                    timeout=self.timeout,
                )
            except subprocess.TimeoutExpired:
                return ProbeRun(ERROR, output=f"timed out after {self.timeout} s", seconds=time.monotonic() - t0)
            except OSError as exc:
                raise ExternalToolError(f"cannot run the probe interpreter {self.python}: {exc}.") from None
        run = parse_output(r.stdout, r.returncode, r.stderr)
        run.seconds = time.monotonic() - t0
        return run


def cpu_env(requirements: list[str], *, find_links: list[str] | None = None) -> str:
    """The python of a CPU venv holding ``requirements`` (built once per content, cached; a relocatable
    venv built beside its cache entry and renamed into place, so concurrent builders never share one)."""
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    links = find_links if find_links is not None else default_find_links()

    def build(venv: Path) -> None:
        uv = Uv()
        uv.venv(venv, python=sys.executable, relocatable=True)
        r = uv.pip_install(venv / "bin" / "python", requirements, find_links=links)
        if r.returncode != 0:
            raise ExternalToolError(
                f"cannot build the probe environment ({', '.join(requirements[:3])}, ...): " + r.stderr.strip()[-1500:]
            )

    venv = cache_entry(cache_dir() / "probe-env" / f"venv-{key}", build, lambda v: (v / "bin" / "python").exists())
    return str(venv / "bin" / "python")


def default_find_links() -> list[str]:
    """Where CPU torch wheels come from: ``PIP_FIND_LINKS``, else /opt/wheels when present."""
    links = [p for p in os.environ.get("PIP_FIND_LINKS", "").split() if p]
    if not links and Path("/opt/wheels").is_dir():
        links = ["/opt/wheels"]
    return links


def unpatched_tree(source: str | os.PathLike, package: str = "vllm") -> Path:
    """A directory whose ``<package>/`` is the source's (a wheel, extracted once; or a directory)."""
    src = Path(source)
    if src.is_dir():
        if not (src / package).is_dir():
            raise BadInput(f"{src} holds no {package}/ package to probe.")
        return src
    if not (src.is_file() and zipfile.is_zipfile(src)):
        raise BadInput(f"probe source {src} is neither a wheel nor a directory.")

    def extract(tmp: Path) -> None:
        with zipfile.ZipFile(src) as z:
            members = [
                m for m in z.namelist() if (m.startswith(f"{package}/") and not m.endswith(".so")) or ".dist-info/" in m
            ]
            z.extractall(tmp, members)

    return cache_entry(cache_dir() / "probe-trees" / sha256_file(src)[:32], extract)


def patched_tree(unpatched: Path, files: dict[str, bytes], dest: Path) -> Path:
    """``dest``: ``unpatched`` with ``files`` (relpath -> bytes) replaced; unchanged files hard-linked."""

    def _copy(s, d):
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(unpatched, dest, copy_function=_copy)  # __pycache__ too: valid for unchanged files
    for rel, data in files.items():
        target = dest / rel
        target.unlink(missing_ok=True)  # a new inode: the hard-linked original stays as shipped
        atomic_write_bytes(target, data)
        # the copied bytecode of the original could pass Python's mtime+size check: drop it
        for pyc in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
            pyc.unlink()
    return dest


def series_files(series: P.Series, source: str | os.PathLike) -> dict[str, bytes]:
    """The series' patched target files (relpath -> bytes) applied in memory to ``source``."""
    src = P._Source(source)
    try:
        results, _, final = P._patch_texts(series, src)
    finally:
        src.close()
    P._raise_if_failed(series, results, source)
    return final


def runner_for(series_dir: Path, python: str | None = None) -> ProbeRunner:
    """The interpreter for a series' probes: ``python`` if given, else its probe-env, else this one."""
    if python:
        return ProbeRunner(python)
    reqs = env_requirements(series_dir)
    return ProbeRunner(cpu_env(reqs) if reqs else None)


# =========================================================================== the check
def probe_series(
    series: P.Series, source: str | os.PathLike, *, runner: ProbeRunner | None = None, reporter: Reporter = SILENT
) -> list[PatchProbe]:
    """Run every patch's probe on ``source`` unpatched and patched by the whole series; each probe is a step on
    ``reporter``."""
    probes = [(p, probe_path(series.dir, p)) for p in series.patches]
    runner = runner or runner_for(series.dir)
    base = unpatched_tree(source, series.package)
    files = series_files(series, source)
    out: list[PatchProbe] = []
    from concurrent.futures import ThreadPoolExecutor

    with tempfile.TemporaryDirectory(prefix="build-image-patched-") as tmp:
        # the cached tree's bytecode (from earlier runs) is shared with the patched copy
        patched = patched_tree(base, files, Path(tmp) / "tree")
        for p, probe in probes:
            reporter.step(f"probe {probe.name}: unpatched and patched")
            with ThreadPoolExecutor(max_workers=2) as pool:  # two independent processes, side by side
                before = pool.submit(runner.run, probe, base)
                after = pool.submit(runner.run, probe, patched)
                out.append(PatchProbe(p.name, probe.name, before.result(), after.result()))
    return out
