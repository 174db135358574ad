"""Lock stage: resolve the overlay on top of the base with uv, build the LockFile.

Layers (each usable on its own):

* pure functions — :func:`base_requirements`, :func:`inputs_sha256`,
  :func:`parse_uv_requirements`, :func:`parse_pylock`, :func:`select_wheel` (both by
  ``packaging.pylock``, :mod:`builder.resolve.lockfile.pylock`),
  :func:`explain_unsatisfiable`, :func:`build_entries` — data in, data out;
* the **uv adapter** (:class:`Uv`): the only place that runs uv (its CLI, the
  binary shipped by the pinned ``uv`` package);
* the **wheel fetcher** (:func:`fetch_wheel`): sha256-verified download cache
  under ``builder.util.cache_dir()/wheels``; plus a facts cache keyed by the
  wheel's sha256 so a wheel is scanned once;
* :func:`lock` — the resolution: request in, :class:`LockResult` out (nothing is written);
* :func:`run` — the stage: freshness, resolution, gate; the lock file is read, checked, swept and written
  (with its PEP 751 twin) through :mod:`builder.resolve.lockfile` alone.

Resolution: every base distribution is passed as a *requirement* ``name==version``
(not only a constraint) so uv's derivation names the real culprit; a base
distribution named in the overlay (``--with``) loses its pin and may move.  uv
runs twice: ``requirements.txt`` output (the ``# via`` graph) and, offline from
uv's cache, ``pylock.toml`` output (the wheel URLs and sha256 of the files usable
on the base's platform).  The second run starts alongside the first; when it
could not answer from the cache or saw other versions, it runs again after the
first, constrained to exactly its resolution (``-c requirements.txt``).
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

from builder import __version__
from builder.credentials import redact_text, redact_url, remember
from builder.errors import AbiRejected, BadInput, ExternalToolError, IntegrityError, StaleLock, Unsatisfiable
from builder.events import SILENT, Reporter
from builder.fetch import fetch
from builder.platforms import from_uv_platform
from builder.resolve import index as ix
from builder.resolve import lockfile
from builder.resolve.abi import GateResult, evaluate, format_rejection, is_exact_coupled
from builder.resolve.baseref import ResolvedBase, vllm_on_base
from builder.resolve.elfsyms import demangle
from builder.resolve.explain import (
    explain_unsatisfiable,
    find_pin_moves,
    format_pin_moves,
    trim_derivation,
)
from builder.resolve.lockfile import LockEntry, LockFile, WheelCandidate, WheelRef
from builder.resolve.lockfile import pylock as _pylock
from builder.resolve.lockstep import Family, all_families
from builder.resolve.manifest import BaseManifest, DistFacts
from builder.resolve.raychoice import BACKEND_FALLBACK, RayChoice, backend_for, choose, ray_releases
from builder.resolve.scanner import scan_wheel
from builder.resolve.uv import Uv, is_resolution_failure
from builder.util import atomic_write_text, cache_dir, canonical_name, same_version, sha256_bytes

FACTS_CACHE_VERSION = "4"  # 2: ELF machines (elf-machine); 3: torch symbols (torch-abi); 4: all fat binaries
DEFAULT_RAY = "ray[serve]"  # the default overlay (builder.spec.DEFAULT_OVERLAY)
RAY_POLICY = "ray[llm]-pins-vllm/1"  # inputs-sha256 names the rule that picks the default ray


# =========================================================================== request


@dataclass
class LockRequest:
    """Everything a lock depends on (and nothing else)."""

    vllm: str
    base: BaseManifest
    base_bytes: bytes  # the manifest file's bytes (or its JSON for an image snapshot)
    overlay: list[str]  # ray[serve] + --with
    allow: dict[str, str] = field(default_factory=dict)
    find_links: list[str] = field(default_factory=list)
    no_index: bool = False
    exclude_newer: str | None = None
    # the default overlay's ray is chosen per vLLM release (builder.resolve.raychoice); False when the
    # overlay names ray itself or the default overlay is off
    default_ray: bool = False
    ray: RayChoice | None = None  # the choice, made when resolving (not an input: the policy is)
    lockstep: tuple[Family, ...] = ()  # the spec's [[lockstep]] families, added to the shipped table

    @property
    def manifest_sha256(self) -> str:
        return sha256_bytes(self.base_bytes)

    def resolution_overlay(self) -> list[str]:
        """What uv resolves: the overlay, with the default ray replaced by the chosen one."""
        if not (self.default_ray and self.ray and self.ray.requirement):
            return list(self.overlay)
        return [self.ray.requirement if r == DEFAULT_RAY else r for r in self.overlay]


def parse_overlay(reqs: Iterable[str], where: str = "--with") -> list[Requirement]:
    """Parse overlay requirements; a malformed one or two different requirements
    on the same package are :class:`BadInput`."""
    out: list[Requirement] = []
    seen: dict[str, str] = {}
    for raw in reqs:
        try:
            req = Requirement(raw)
        except InvalidRequirement as exc:
            raise BadInput(f"{where} requirement {raw!r} is not a valid PEP 508 requirement ({exc}).") from None
        if req.url:
            raise BadInput(f"{where} requirement {raw!r}: direct URLs are not supported; use --find-links DIR.")
        key = canonical_name(req.name)
        if key in seen and seen[key] != str(req):
            a, b = Requirement(seen[key]), req
            if str(a.specifier) and str(b.specifier) and str(a.specifier) != str(b.specifier):
                raise BadInput(
                    f"conflicting overlay requirements for {req.name}: {seen[key]!r} and {raw!r} "
                    f"({where}); give one requirement per package.",
                )
        seen[key] = str(req)
        out.append(req)
    return out


def check_overlay_against_vllm(overlay: list[Requirement], vllm: str) -> None:
    for req in overlay:
        if (
            canonical_name(req.name) == "vllm"
            and str(req.specifier)
            and not req.specifier.contains(vllm, prereleases=True)
        ):
            raise BadInput(
                f"--with {str(req)!r} conflicts with --vllm {vllm}: the overlay cannot replace the base's vllm.",
            )


def base_requirements(base: BaseManifest, overlay: Iterable[Requirement | str]) -> list[str]:
    """``name==version`` for every base distribution not named in the overlay."""
    released = {canonical_name(r.name if isinstance(r, Requirement) else Requirement(r).name) for r in overlay}
    return [f"{d.name}=={d.version}" for key, d in sorted(base.distributions.items()) if key not in released]


def recorded_overlay(req: LockRequest) -> list[str]:
    """The overlay as the lock records it: a direct-URL requirement (``pkg @ https://user:PW@host/pkg.whl``)
    without its credential, which is not an input (the same wheel with a rotated password is the same lock)."""
    return [redact_text(r) for r in req.overlay]


def inputs_sha256(req: LockRequest, uv_version: str, tool_version: str = __version__) -> str:
    """Hash over every input of the lock: manifest bytes, overlay, allowed ABI
    changes, index flags, exclude-newer, tool and uv versions."""
    doc = {
        "manifest": req.manifest_sha256,
        "vllm": req.vllm,
        "overlay": recorded_overlay(req),
        "allow": sorted((canonical_name(k), v) for k, v in req.allow.items()),
        # a credential in a URL is not an input: the same index with another password is the same lock
        "find_links": [str(Path(f).resolve()) if "://" not in f else redact_url(f) for f in req.find_links],
        "no_index": req.no_index,
        "exclude_newer": req.exclude_newer,
        "tool": tool_version,
        "uv": uv_version,
    }
    if req.default_ray:
        doc["ray_policy"] = RAY_POLICY
    if req.lockstep:  # only when given: a lock without them keeps its hash
        doc["lockstep"] = [f.doc() for f in req.lockstep]
    return sha256_bytes(json.dumps(doc, sort_keys=True).encode())


# =========================================================================== uv output parsing


_UV_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+?)\s*(?:\\)?\s*(?:;.*)?$")


def _norm_via(v: str) -> str:
    v = v.strip()
    if v.startswith("-r ") or v.startswith("-c "):
        stem = Path(v[3:].strip()).stem
        return f"{v[:2]} {stem}"
    return v


def parse_uv_requirements(text: str) -> dict[str, tuple[str, str, list[str]]]:
    """uv's ``requirements.txt`` output -> ``{key: (name, version, via)}``."""
    out: dict[str, tuple[str, str, list[str]]] = {}
    cur: str | None = None
    in_via = False
    for raw in text.splitlines():
        if not raw.strip():
            continue
        if not raw.startswith((" ", "#")):
            m = _UV_REQ.match(raw.strip())
            if m:
                name, ver = m.group(1), m.group(2)
                cur = canonical_name(name)
                out[cur] = (name, ver, [])
                in_via = False
            continue
        s = raw.strip()
        if cur is None or not s.startswith("#"):
            continue
        body = s[1:].strip()
        if body.startswith("via "):
            out[cur][2].append(_norm_via(body[4:]))
            in_via = False
        elif body == "via":
            in_via = True
        elif in_via and body:
            out[cur][2].append(_norm_via(body))
    return out


def parse_pylock(text: str, base_dir: Path | None = None) -> dict[str, tuple[str, str, list[WheelCandidate]]]:
    """uv's ``pylock.toml`` -> ``{key: (name, version, wheels)}`` (read and validated by
    ``packaging.pylock``; ``path`` entries become ``file://`` URLs)."""
    try:
        doc = _pylock.read(text, "uv's pylock.toml")
    except BadInput as exc:
        raise ExternalToolError(f"uv wrote an unreadable pylock.toml: {exc.message}") from None
    return _pylock.candidates(doc, base_dir)


def target_tags(python_version: str, python_abi: str, platform: str) -> list[Tag]:
    """The wheel tags an installer accepts on the base, most preferred first
    (``x86_64-manylinux_2_35`` -> manylinux_2_35 ... 2_5, manylinux1, linux)."""
    m = re.match(r"^(x86_64|aarch64)-manylinux_(\d+)_(\d+)$", platform)
    if not m:
        raise BadInput(f"base platform {platform!r} is not of the form <arch>-manylinux_<major>_<minor>.")
    arch, major, minor = m.group(1), int(m.group(2)), int(m.group(3))
    plats = [f"manylinux_{major}_{v}_{arch}" for v in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    plats_full = []
    for p in plats:
        plats_full.append(p)
        v = int(p.split("_")[2])
        if major == 2 and v in legacy:
            plats_full.append(f"{legacy[v]}_{arch}")
    plats_full.append(f"linux_{arch}")
    pv = tuple(int(x) for x in python_version.split(".")[:2])
    tags = list(cpython_tags(pv, abis=[python_abi], platforms=plats_full))
    tags += list(compatible_tags(pv, interpreter=f"cp{pv[0]}{pv[1]}", platforms=plats_full))
    return tags


def select_wheel(cands: list[WheelCandidate], tags: list[Tag], name: str = "x") -> WheelCandidate | None:
    """The candidate an installer would pick (``packaging.pylock``'s selection for ``tags``)."""
    return _pylock.select_wheel(cands, tags, name)


def is_pure_wheel(filename: str) -> bool:
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except Exception:  # noqa: BLE001
        return False
    return all(t.platform == "any" for t in tags)


def pure_facts(filename: str) -> DistFacts:
    abis = set()
    try:
        _, _, _, tags = parse_wheel_filename(filename)
        abis = {t.abi for t in tags}
    except Exception:  # noqa: BLE001
        pass
    abi = "none" if not abis or abis == {"none"} else sorted(abis)[0]
    return DistFacts(binary=False, extensions=0, numpy_abi={"1": 0, "2": 0}, glibc=None, python_abi=abi)


# =========================================================================== wheels


def fetch_wheel(url: str, sha256: str, filename: str | None = None) -> Path:
    """A verified local copy of ``url`` from the one download cache (:func:`builder.fetch.fetch`)."""
    # no second live display under the lock's own status line
    return Path(fetch(url, sha256, filename=filename, reporter=SILENT))


def _facts_cache_path(sha256: str) -> Path:
    return cache_dir() / "facts" / f"{sha256}.v{FACTS_CACHE_VERSION}.json"


def wheel_facts(cand: WheelCandidate) -> tuple[DistFacts, list[str]]:
    """(binary facts, Requires-Dist) of a candidate: pure wheels from the name only,
    binary wheels downloaded (verified) and scanned, both cached by sha256."""
    if is_pure_wheel(cand.filename):
        return pure_facts(cand.filename), []
    cpath = _facts_cache_path(cand.sha256)
    if cpath.exists():
        try:
            doc = json.loads(cpath.read_text())
            return DistFacts(**doc["facts"]), list(doc["requires"])
        except (ValueError, KeyError, TypeError):
            cpath.unlink(missing_ok=True)

    path = fetch_wheel(cand.url, cand.sha256, cand.filename)
    _, _, facts = scan_wheel(path)
    requires = wheel_requires(path)
    atomic_write_text(cpath, json.dumps({"facts": facts.__dict__, "requires": requires}))
    return facts, requires


def requires_of(cand: WheelCandidate) -> list[str]:
    """Requires-Dist of a candidate (fetched sha256-verified and cached by sha256);
    used to show what each link of a chain asked for."""
    cpath = _facts_cache_path(cand.sha256)
    if cpath.exists():
        try:
            return list(json.loads(cpath.read_text())["requires"])
        except (ValueError, KeyError, TypeError):
            cpath.unlink(missing_ok=True)
    path = fetch_wheel(cand.url, cand.sha256, cand.filename)
    requires = wheel_requires(path)
    if is_pure_wheel(cand.filename):
        atomic_write_text(cpath, json.dumps({"facts": pure_facts(cand.filename).__dict__, "requires": requires}))
    return requires


def chain_ancestors(entries: list[LockEntry], names: Iterable[str]) -> set[str]:
    """Canonical names of the lock entries on any ``# via`` path above ``names``."""
    via = {e.key: [canonical_name(v) for v in e.via if not v.startswith("-")] for e in entries}
    todo, seen = [canonical_name(n) for n in names], set()
    while todo:
        k = todo.pop()
        for p in via.get(k, []):
            if p not in seen and p in via:
                seen.add(p)
                todo.append(p)
    return seen


def wheel_requires(path: Path) -> list[str]:
    try:
        with zipfile.ZipFile(path) as zf:
            meta = [n for n in zf.namelist() if re.match(r"^[^/]+\.dist-info/METADATA$", n)]
            if not meta:
                return []
            msg = HeaderParser().parsestr(zf.read(meta[0]).decode("utf-8", "replace"))
            return list(msg.get_all("Requires-Dist") or [])
    except (zipfile.BadZipFile, OSError):
        return []


# =========================================================================== the stage


@dataclass
class LockResult:
    lock: LockFile
    gate: GateResult
    resolved: int  # distributions in the whole resolution (base pins included)
    timings: dict[str, float] = field(default_factory=dict)


def build_entries(
    base: BaseManifest,
    resolved: Mapping[str, tuple[str, str, list[str]]],
    wheels: Mapping[str, tuple[str, str, list[WheelCandidate]]],
    tags: list[Tag],
) -> tuple[list[LockEntry], dict[str, WheelCandidate]]:
    """Entries for what is not already in the base at the same version (pure)."""
    entries: list[LockEntry] = []
    chosen: dict[str, WheelCandidate] = {}
    for key, (name, version, via) in sorted(resolved.items()):
        b = base.get(key)
        if b is not None and same_version(b.version, version):
            continue
        wl = wheels.get(key)
        if wl is None:
            raise ExternalToolError(f"uv's pylock.toml lacks {name}=={version} that its requirements output has.")
        cands = wl[2]
        pick = select_wheel(cands, tags, name)
        if pick is None:
            raise Unsatisfiable(
                f"{name}=={version} has no wheel installable on the base "
                f"(none of {', '.join(c.filename for c in cands) or 'no files'} matches its platform)."
            )
        chosen[key] = pick
        entries.append(
            LockEntry(
                name=wl[0],
                version=version,
                hashes=sorted({c.sha256 for c in cands}),
                via=list(via),
                wheel=WheelRef(url=redact_url(pick.url), sha256=pick.sha256),
                base_version=b.version if b is not None else None,
            )
        )
    return entries, chosen


def _agrees(
    resolved: Mapping[str, tuple[str, str, list[str]]], wheels: Mapping[str, tuple[str, str, list[WheelCandidate]]]
) -> bool:
    """Do the two uv runs describe the same resolution?"""
    return bool(wheels) and all(k in wheels and same_version(wheels[k][1], v) for k, (_, v, _) in resolved.items())


def lock(
    req: LockRequest, uv: Uv | None = None, reporter: Reporter = SILENT, prefer: Mapping[str, str] | None = None
) -> LockResult:
    """Resolve ``req`` and judge it; raises :class:`Unsatisfiable` / tool errors.
    Returns the LockFile and the gate's result (the caller decides on exit 3).

    ``prefer`` (name -> version, e.g. the previous lock's pins) are resolver
    preferences, as uv and pip-compile treat an existing output file: kept when
    they still fit, so a re-lock after an input change moves as little as possible."""
    uv = uv or Uv()
    base = req.base
    resolving = req.resolution_overlay()
    overlay_reqs = parse_overlay(resolving)
    for f in req.find_links:  # their credentials, in memory only, for the wheel downloads below
        remember(f)
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bi-lock-") as t:
        run = _UvRun(uv=uv, tmp=Path(t), req=req, resolving=resolving)
        run.write_inputs(overlay_reqs, prefer)
        reporter.step(f"resolving {', '.join(resolving)} on top of {len(base.distributions)} base pins (uv)")
        t0 = time.monotonic()
        resolved, r2 = run.resolve(reporter)
        timings["resolve"] = time.monotonic() - t0
        t0 = time.monotonic()
        wheels = run.wheels(resolved, r2, reporter)
        timings["wheels"] = time.monotonic() - t0
    tags = target_tags(base.python_version, base.python_abi, base.platform)
    entries, chosen = build_entries(base, resolved, wheels, tags)
    t0 = time.monotonic()
    requires = _scan_wheels(req, entries, chosen, reporter)
    gate = _judge(req, entries, requires, resolving)
    flagged = [f.name for f in gate.violations + gate.allowed + gate.notices]
    missing = [k for k in chain_ancestors(entries, flagged) if not requires.get(k)]
    if missing:  # what each link of the chains asked for: fetch those few (pure) wheels
        reporter.step(f"reading the requirements of {len(missing)} package(s) on the chains")
        for k in missing:
            requires[k] = requires_of(chosen[k])
        gate = _judge(req, entries, requires, resolving)
    timings["scan"] = time.monotonic() - t0
    header = lock_header(req, uv.version())
    header.update(ray_header(req, entries, base))
    allow_used = {canonical_name(k): v for k, v in req.allow.items()}
    lockfile = LockFile(header=header, overlay=recorded_overlay(req), allow_abi_change=allow_used, entries=entries)
    return LockResult(lock=lockfile, gate=gate, resolved=len(resolved), timings=timings)


def _judge(
    req: LockRequest, entries: list[LockEntry], requires: dict[str, list[str]], resolving: list[str]
) -> GateResult:
    """The gate's verdict on ``entries`` (symbol names demangled, the shipped and the spec's lockstep families)."""
    return evaluate(
        req.base,
        entries,
        req.allow,
        vllm=req.vllm,
        requires=requires,
        overlay=resolving,
        demangle=demangle,
        lockstep=all_families(req.lockstep),
    )


@dataclass
class _UvRun:
    """One lock's uv runs in its scratch directory: the resolution (requirements.txt) and the
    wheel URLs and hashes (pylock.toml) of the same inputs."""

    uv: Uv
    tmp: Path
    req: LockRequest
    resolving: list[str]

    @property
    def sources(self) -> list[Path]:
        # The base's pins constrain what the overlay pulls in (installed distributions never move unless
        # --with releases them), as `uv pip install` into the image keeps them; a base pin the overlay does
        # not reach is not re-resolved: the published images are not pip-consistent as a whole (a step
        # installed with --no-deps, or a later step moving a pin an earlier package needed).
        return [self.tmp / "overlay.in"]

    @property
    def common(self) -> dict:
        base, req = self.req.base, self.req
        common = dict(
            python_version=base.python_version,
            platform=base.platform,
            find_links=req.find_links,
            no_index=req.no_index,
            exclude_newer=req.exclude_newer,
            cwd=self.tmp,
            constraints=[self.tmp / "base.in"],
        )
        if base.uv_overrides:  # the image's UV_OVERRIDE applies to any `uv pip install` in it: the overlay's too
            common["overrides"] = [self.tmp / "base-overrides.txt"]
        return common

    @property
    def pylock_args(self) -> dict:
        return dict(fmt="pylock.toml", hashes=True, offline=True, **self.common)

    def write_inputs(self, overlay_reqs, prefer: Mapping[str, str] | None) -> None:
        tmp = self.tmp
        (tmp / "overlay.in").write_text("\n".join(self.resolving) + "\n")
        (tmp / "base.in").write_text("\n".join(base_requirements(self.req.base, overlay_reqs)) + "\n")
        if self.req.base.uv_overrides:
            (tmp / "base-overrides.txt").write_text("\n".join(self.req.base.uv_overrides) + "\n")
        if prefer:  # uv reads an existing output file as preferences
            (tmp / "requirements.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(prefer.items())))

    def resolve(self, reporter: Reporter) -> tuple[dict, subprocess.CompletedProcess]:
        """The resolution, and the pylock run started alongside it.  An unsatisfiable overlay
        raises :class:`Unsatisfiable` with every base pin that must move."""
        # The wheel URLs come from a second uv run in pylock format, offline from uv's cache.  It
        # starts alongside the resolution (a warm cache answers it at once); it is run again after
        # the resolution when it could not answer or saw other versions (cold or stale cache).
        p1 = self.uv.start(self.sources, self.tmp / "requirements.txt", **self.common)
        p2 = self.uv.start(self.sources, self.tmp / "pylock.toml", **self.pylock_args)
        try:  # the lock header's uv version, asked (and remembered) while both runs work
            self.uv.version()
        except (ExternalToolError, OSError):
            pass  # asked again where the header needs it, and reported there as before
        r1, r2 = self.uv.wait(p1), self.uv.wait(p2)
        if r1.returncode != 0:
            if is_resolution_failure(r1.stderr):
                self.unsatisfiable(r1.stderr, reporter)
            raise uv_failure(r1.stderr, f"uv pip compile (exit {r1.returncode})")
        return parse_uv_requirements((self.tmp / "requirements.txt").read_text()), r2

    def unsatisfiable(self, stderr: str, reporter: Reporter) -> None:
        base = self.req.base
        msg, details = explain_unsatisfiable(stderr, base, self.resolving)
        reporter.step("finding every base pin that must move (one pass)")
        moves = find_pin_moves(stderr, base, self.resolving, self.attempt)
        extra_msg, extra_details = format_pin_moves(moves, base)
        exc = Unsatisfiable(msg + extra_msg, details=details + extra_details)
        exc.pin_moves = moves
        raise exc

    def attempt(self, extra: list[str]) -> tuple[bool, str, dict]:
        """Does the overlay resolve with ``extra`` requirements (base pins moved)?"""
        tmp, resolving = self.tmp, self.resolving
        (tmp / "try-overlay.in").write_text("\n".join(resolving + extra) + "\n")
        (tmp / "try-base.in").write_text(
            "\n".join(base_requirements(self.req.base, parse_overlay(resolving + extra))) + "\n"
        )
        r = self.uv.compile(
            [tmp / "try-overlay.in"], tmp / "try.txt", **{**self.common, "constraints": [tmp / "try-base.in"]}
        )
        if r.returncode == 0:
            return True, "", parse_uv_requirements((tmp / "try.txt").read_text())
        if not is_resolution_failure(r.stderr):
            raise uv_failure(r.stderr, f"uv pip compile (exit {r.returncode})")
        return False, r.stderr, {}

    def wheels(self, resolved: dict, r2: subprocess.CompletedProcess, reporter: Reporter) -> dict:
        """The wheels of the resolution, from the pylock run; run again, pinned to the resolution,
        when it could not answer offline or saw other versions."""
        tmp = self.tmp
        wheels = parse_pylock((tmp / "pylock.toml").read_text(), tmp) if r2.returncode == 0 else {}
        if _agrees(resolved, wheels):
            return wheels
        # again, constrained to exactly the resolution just made (so both runs agree)
        reporter.step("collecting wheel URLs and hashes for the base's platform (uv, from cache)")
        (tmp / "pylock.toml").unlink(missing_ok=True)
        pinned = {**self.pylock_args, "constraints": [tmp / "base.in", tmp / "requirements.txt"]}
        r2 = self.uv.compile(self.sources, tmp / "pylock.toml", **pinned)
        if r2.returncode != 0:  # cache incomplete: same resolution online
            r2 = self.uv.compile(self.sources, tmp / "pylock.toml", **{**pinned, "offline": False})
        if r2.returncode != 0:
            raise uv_failure(r2.stderr, "uv pip compile --format pylock.toml")
        wheels = parse_pylock((tmp / "pylock.toml").read_text(), tmp)
        if not _agrees(resolved, wheels):
            raise ExternalToolError("uv's two runs on the same inputs resolved different versions; retry the lock.")
        return wheels


def _scan_wheels(req: LockRequest, entries: list[LockEntry], chosen: dict, reporter: Reporter) -> dict[str, list[str]]:
    """Each entry's binary facts and requirements, read from its wheel (binary wheels are
    downloaded and scanned); the requirements of each, by canonical name."""
    requires: dict[str, list[str]] = {}
    # An exact-coupled binary (torch, nvidia-*, ...) that is not allowed is rejected by name: its
    # files cannot change the verdict, so it is not downloaded (torch and its CUDA wheels are GBs).
    allowed = {canonical_name(k) for k in req.allow}
    by_name_only = {
        e.key
        for e in entries
        if is_exact_coupled(e.name) and e.key not in allowed and not is_pure_wheel(chosen[e.key].filename)
    }
    binaries = [e for e in entries if not is_pure_wheel(chosen[e.key].filename) and e.key not in by_name_only]
    for e in entries:
        cand = chosen[e.key]
        if e.key in by_name_only:
            e.facts, requires[e.key] = pure_facts(cand.filename), []
            e.facts.binary = True  # not scanned: unknown extension count / glibc
            continue
        if not is_pure_wheel(cand.filename) and not _facts_cache_path(cand.sha256).exists():
            reporter.step(
                f"downloading + scanning binary wheel {cand.filename} ({binaries.index(e) + 1}/{len(binaries)})"
            )
        e.facts, requires[e.key] = wheel_facts(cand)
    return requires


def header_vllm(req: LockRequest) -> str:
    """The ``vllm:`` a lock of ``req`` names (pure): the base's vllm, else the overlay's ``vllm==X``
    (the lock then holds X), else ``-`` — never a vllm that is neither in the base nor in the lock."""
    d = req.base.get("vllm")
    if d is not None:
        return d.version
    for raw in req.overlay:
        r = Requirement(raw)
        pins = [s.version for s in r.specifier if s.operator == "=="]
        if canonical_name(r.name) == "vllm" and len(pins) == 1 and "*" not in pins[0]:
            return pins[0]
    return "-"


def lock_header(req: LockRequest, uv_version: str) -> dict[str, str]:
    """Pure: the header a lock of ``req`` carries (every input it records, and their hash)."""
    base = req.base
    header = {
        "build-image-lock": "1",
        "tool": f"build-image {__version__} (uv {uv_version})",
        "vllm": header_vllm(req),
        "base-ref": base.image_ref or "-",
        "base-digest": base.image_digest or "-",
        "base-manifest-sha256": req.manifest_sha256,
        "python": base.python_version,
        "platform": base.platform,
        "inputs-sha256": inputs_sha256(req, uv_version),
    }
    if req.exclude_newer:
        header["exclude-newer"] = req.exclude_newer
    if req.no_index or req.find_links:
        header["index"] = " ".join(
            (["--no-index"] if req.no_index else []) + [f"--find-links {redact_url(f)}" for f in req.find_links]
        )
    return header


# header fields that are inputs (``entries`` is derived; ``build-image-lock`` is the format)
_HEADER_INPUTS = (
    "vllm",
    "base-ref",
    "base-digest",
    "base-manifest-sha256",
    "python",
    "platform",
    "tool",
    "exclude-newer",
    "index",
)


def header_mismatches(have: Mapping[str, str], want: Mapping[str, str]) -> list[str]:
    """Pure: ``key: lock says X, inputs say Y`` for every recorded input that differs."""
    out = []
    for key in _HEADER_INPUTS:
        a, b = have.get(key), want.get(key)
        if (a or None) != (b or None):
            out.append(f"{key}: the lock says {a or '(absent)'}, the inputs say {b or '(absent)'}")
    return out


def ray_header(req: LockRequest, entries: list[LockEntry], base: BaseManifest) -> dict[str, str]:
    """``ray`` / ``serve-backend`` header lines: which ray the lock holds and why (pure)."""
    e = next((e for e in entries if e.key == "ray"), None)
    version = e.version if e is not None else (base.get("ray").version if base.get("ray") is not None else None)
    if version is None:
        return {}
    if req.default_ray and req.ray is not None:
        return {"ray": f"{version} ({req.ray.reason})", "serve-backend": req.ray.backend}
    named = [r for r in req.overlay if canonical_name(Requirement(r).name) == "ray"]
    where = f"named in the overlay ({', '.join(named)})" if named else "from the base"
    if req.ray is not None:  # the named ray's llm pin, looked up by the caller
        return {"ray": f"{version} ({where}; {req.ray.reason})", "serve-backend": req.ray.backend}
    return {"ray": f"{version} ({where})", "serve-backend": "auto"}


def is_up_to_date(
    lock_path: Path, req: LockRequest, existing: LockFile | None, uv: Uv | None = None
) -> tuple[bool, str]:
    """(fresh?, why) comparing every input the lock's header records (and their hash,
    ``inputs-sha256``) with the request's — no resolution.  A header edited by hand
    (``vllm: 0.25.0`` under the hash of a 0.26.0 request) is stale, not up to date.
    ``existing``: the lock read at ``lock_path`` (None: there is none)."""
    if existing is None:
        return False, f"{lock_path} does not exist"
    uv = uv or Uv()
    want_header = lock_header(req, uv.version())
    fields = header_mismatches(existing.header, want_header)
    same_lists = (
        existing.overlay == recorded_overlay(req)
        and {canonical_name(k): v for k, v in req.allow.items()} == existing.allow_abi_change
    )
    if existing.header.get("inputs-sha256") == want_header["inputs-sha256"] and not fields and same_lists:
        return True, "inputs unchanged"
    reasons = list(fields)
    if existing.header.get("base-manifest-sha256") != req.manifest_sha256 and not any(
        r.startswith("base-manifest-sha256") for r in reasons
    ):
        reasons.append("the base manifest changed")
    if existing.overlay != recorded_overlay(req):
        reasons.append(f"the overlay changed ({', '.join(existing.overlay)} -> {', '.join(recorded_overlay(req))})")
    if {canonical_name(k): v for k, v in req.allow.items()} != existing.allow_abi_change:
        reasons.append("the allowed ABI changes changed")
    if req.default_ray and "serve-backend" not in existing.header:
        reasons.append("the default ray is now chosen per vLLM release (the newest whose ray[llm] pins its vllm)")
    return False, "; ".join(reasons) or "index flags or exclude-newer changed"


# =========================================================================== the stage, end to end


@dataclass
class LockOutcome:
    """What :func:`run` did: ``status`` is ``up-to-date`` (nothing resolved) or ``written``."""

    status: str
    path: Path
    pylock: Path  # the PEP 751 file of the lock: its twin, or the lock itself when it is a pylock.toml
    result: LockResult | None = None
    unused_allow: list[str] = field(default_factory=list)
    kept: LockFile | None = None  # up-to-date: the lock on disk, as read (once) by the freshness check
    kept_text: str | None = None  # ... and its text, as a build context carries it (None for a pylock.toml)


def check_wheel_sources(find_links: Iterable[str], no_index: bool) -> None:
    """Before uv runs: every local ``--find-links`` folder exists (a missing one is bad input naming it, not
    a uv failure), and ``--no-index`` has at least one ``--find-links`` (else nothing could be found, and the
    resolver would blame a base pin)."""
    find_links = list(find_links)
    for f in find_links:
        if "://" in f:
            continue
        p = Path(f)
        if not p.exists():
            raise BadInput(
                f"--find-links {f}: no such folder (or file).",
                hint="name a folder of wheels (or a flat HTML index), or drop the flag.",
            )
    if no_index and not find_links:
        raise BadInput(
            "--no-index without --find-links: with the package index off and no wheel folder given, "
            "uv has nowhere to find any package.",
            hint="add --find-links DIR (a folder of wheels), or drop --no-index.",
        )


_UV_UNREACHABLE = re.compile(
    r"Failed to read `--find-links` URL: (\S+)|Failed to fetch: (\S+)|"
    r"error sending request for url \((\S+)\)|dns error|tcp connect error|"
    r"Connection refused|operation timed out|Network is unreachable"
)
_UV_MISSING_INPUT = re.compile(r"Failed to read `--find-links` (?:directory|file): (.+)")


def uv_failure(stderr: str, what: str = "uv pip compile"):
    """Pure: the typed error of a failed uv run, by cause — a missing ``--find-links`` path is BadInput (2), an
    unreachable wheel source IntegrityError (7, as an unreachable index), anything else ExternalToolError (12)."""
    text = trim_derivation(stderr)
    m = _UV_MISSING_INPUT.search(stderr)
    if m:
        return BadInput(f"--find-links {m.group(1).strip()}: uv cannot read it ({text.splitlines()[-1].strip()}).")
    m = _UV_UNREACHABLE.search(stderr)
    if m:
        url = next((g for g in m.groups() if g), None) if m.groups() else None
        where = f" {url.rstrip(')')}" if url else ""
        return IntegrityError(
            f"a wheel source{where} is not reachable ({what}):\n{text}",
            hint="check the --find-links / index URL and the network, then run again.",
        )
    return ExternalToolError(f"{what} failed:\n{text}")


def request_for(
    *,
    vllm: str,
    base: ResolvedBase,
    with_: Iterable[str],
    default_overlay: bool,
    vllm_given: bool = True,
    allow: Mapping[str, str] | None = None,
    find_links: Iterable[str] = (),
    no_index: bool = False,
    exclude_newer: str | None = None,
    where: str = "--with",
    lockstep: Iterable[Family] = (),
) -> LockRequest:
    """The :class:`LockRequest` for ``--vllm X`` on ``base`` (pure but for resolving find-links paths).

    The overlay is the default (``ray[serve]``, its version chosen per release) plus ``with_``; on a base
    without vllm, ``--vllm X`` (``vllm_given``: a flag or the spec named it) adds ``vllm==X`` (the resolver
    and the gate then judge it like any overlay requirement); a base shipping another vllm is exit 2
    (:func:`builder.resolve.baseref.vllm_on_base`)."""
    check_wheel_sources(find_links, no_index)
    with_ = list(with_)
    overlay = ([DEFAULT_RAY] if default_overlay else []) + [
        w for w in with_ if not (default_overlay and w == DEFAULT_RAY)
    ]
    reqs = parse_overlay(overlay, where=where)
    check_overlay_against_vllm(reqs, vllm)
    add = vllm_on_base(base, vllm) if (vllm_given or base.vllm is not None) else None
    if add and not any(canonical_name(r.name) == "vllm" for r in reqs):
        overlay.append(add)
    if not overlay:
        raise BadInput("the overlay is empty: --no-default-overlay needs at least one --with REQ.")
    named = [w for w in with_ if w != DEFAULT_RAY]
    names_ray = any(canonical_name(r.name) == "ray" for r in parse_overlay(named, where=where)) if named else False
    return LockRequest(
        vllm=vllm,
        base=base.manifest,
        base_bytes=base.data,
        overlay=overlay,
        allow=dict(allow or {}),
        find_links=[f if "://" in f else str(Path(f).resolve()) for f in find_links],
        no_index=no_index,
        exclude_newer=exclude_newer,
        default_ray=default_overlay and not names_ray,
        lockstep=tuple(lockstep),
    )


def _other_base(on_disk: lockfile.Output, req: LockRequest) -> str | None:
    """The base-ref of the lock on disk when it names another base than ``req``'s."""
    if on_disk.lock is None:
        return None  # a damaged lock is replaced
    have = on_disk.lock.header.get("base-ref", "-")
    want = req.base.image_ref or "-"
    return have if have != want else None


def run(
    req: LockRequest,
    lock_path: Path,
    *,
    check: bool = False,
    upgrade: bool = False,
    force: bool = False,
    uv: Uv | None = None,
    index=None,
    reporter: Reporter = SILENT,
) -> LockOutcome:
    """Freshness, preferences, ray choice, resolution, gate and the atomic write, in that order.

    * ``check``: :class:`StaleLock` (exit 5) when the lock is stale, nothing written;
    * a lock up to date with its inputs is kept unless ``upgrade``;
    * a re-lock prefers the previous lock's pins (moves as little as possible) unless ``upgrade``;
    * a lock whose header names another base is never replaced without ``force`` (exit 2);
    * a gate violation is :class:`AbiRejected` (exit 3) carrying ``.gate``; nothing is written.
    """
    uv = uv or Uv()
    want = from_uv_platform(req.base.platform, where="the base manifest's platform")
    read = check or not (upgrade and force)  # the lock there is read once, if at all
    on_disk: lockfile.Output = lockfile.open_output(
        lock_path, want, check=check, force=force, read=read, reporter=reporter
    )
    lock_path = on_disk.path
    if check or (not upgrade and lock_path.exists()):
        kept = _kept_if_fresh(req, on_disk, check, uv, reporter)
        if kept is not None:
            return kept
    other = _other_base(on_disk, req) if on_disk.found and not force else None
    if other is not None:
        raise BadInput(
            f"{lock_path} was made on another base ({other}); a lock on {req.base.image_ref or 'this base'} "
            "does not replace it.",
            hint="write this lock elsewhere with -o FILE, or pass --force to replace it.",
        )
    prefer = _previous_pins(on_disk) if not upgrade and on_disk.found else None
    tags = target_tags(req.base.python_version, req.base.python_abi, req.base.platform)
    if req.default_ray and req.ray is None:
        _choose_default_ray(req, index, tags, reporter)
    elif not req.default_ray and any(canonical_name(Requirement(r).name) == "ray" for r in req.overlay):
        pass  # the named ray's backend is looked up after the resolution
    result = _lock_with_fitting_ray(req, uv, reporter, prefer)
    locked_ray = result.lock.by_name().get("ray")
    if not req.default_ray and locked_ray is not None:
        _named_ray_backend(req, result, locked_ray.version, index, tags)
    gate = result.gate
    if not gate.ok:
        _reject(req, gate, lock_path)
    on_disk.write(result.lock)  # with its PEP 751 twin beside it
    used = {canonical_name(f.name) for f in gate.allowed}
    unused = sorted(k for k in result.lock.allow_abi_change if k not in used)
    return LockOutcome(status="written", path=lock_path, pylock=on_disk.twin, result=result, unused_allow=unused)


def _kept_if_fresh(
    req: LockRequest, on_disk: lockfile.Output, check: bool, uv: Uv, reporter: Reporter
) -> LockOutcome | None:
    """The lock on disk, kept when it is up to date with its inputs; with ``check``, a stale
    one is :class:`StaleLock`.  None: it is to be (re)written."""
    lock_path = on_disk.path
    try:
        if on_disk.error is not None:
            raise on_disk.error
        fresh, why = is_up_to_date(lock_path, req, on_disk.lock, uv)
    except BadInput as exc:  # a damaged lock on disk is stale; a new lock replaces it
        if check:
            raise StaleLock(f"{lock_path} is not a readable lock: {exc.message}") from None
        fresh, why = False, exc.message
    if fresh and on_disk.found:
        on_disk.keep(check, reporter)  # its PEP 751 twin: missing or different is stale too
        return LockOutcome(
            status="up-to-date", path=lock_path, pylock=on_disk.twin, kept=on_disk.lock, kept_text=on_disk.verbatim
        )
    if check:
        raise StaleLock(
            f"{lock_path} is stale: {why}.", hint="run `build-image lock` (without --check) to regenerate it."
        )
    return None


def _previous_pins(on_disk: lockfile.Output) -> dict[str, str] | None:
    """The previous lock's pins, preferred by a re-lock (None when it cannot be read)."""
    return {e.name: e.version for e in on_disk.lock.entries} if on_disk.lock is not None else None


def _choose_default_ray(req: LockRequest, index, tags: list[Tag], reporter: Reporter) -> None:
    """The default overlay's ray: the one whose ray[llm] pins this vllm (from the index)."""
    from datetime import datetime as _dt

    index = index or ix.for_request(req.find_links, req.no_index)
    vllm = req.base.get("vllm").version if req.base.get("vllm") is not None else req.vllm
    reporter.step(f"choosing ray for vllm {vllm} (ray[llm] pins, from the index)")
    cutoff = (
        ix.parse_time(req.exclude_newer)
        if req.exclude_newer and "T" in req.exclude_newer
        else (_dt.fromisoformat(req.exclude_newer + "T00:00:00+00:00") if req.exclude_newer else None)
    )
    req.ray = choose(vllm, ray_releases(index, vllm, tags, cutoff))


def _lock_with_fitting_ray(
    req: LockRequest, uv: Uv, reporter: Reporter, prefer: Mapping[str, str] | None
) -> LockResult:
    """The lock; when the default ray does not fit on the base as it is, the lock with the
    newest ray that does (the default lock never moves base pins for ray)."""
    try:
        return lock(req, uv, reporter=reporter, prefer=prefer)
    except Unsatisfiable as exc:
        # the ray whose ray[llm] pins this vllm does not fit on the base as it is: the default lock never
        # moves base pins for it; the newest ray that fits, the fallback backend, and how to get the other
        if not (req.default_ray and req.ray is not None and req.ray.requirement):
            raise

        moves = getattr(exc, "pin_moves", None)
        moved = ", ".join(f"{n} {o} -> {v}" for n, o, v in moves.moves) if moves and moves.resolves else ""
        line = f"--with '{req.ray.requirement}'" + (f" {moves.with_line}" if moved else "")
        why = f"moving base pins ({moved})" if moved else "changes the base cannot take"
        reporter.step(f"{req.ray.requirement} does not fit on the base; locking the newest ray that does")
        req.ray = RayChoice(
            requirement=None,
            version=None,
            backend=BACKEND_FALLBACK,
            reason=f"{req.ray.reason.split(':')[0]} but needs {why}; newest ray that fits instead, the Serve app "
            f"starts `vllm serve` (its vllm-server fallback); for ray.serve.llm: {line}",
        )
        return lock(req, uv, reporter=reporter, prefer=prefer)


def _named_ray_backend(req: LockRequest, result: LockResult, ray_version: str, index, tags: list[Tag]) -> None:
    """The Serve backend of a ray the overlay names, looked up once it is resolved; the header
    says "serve-backend: auto" when the index cannot tell."""
    try:
        req.ray = backend_for(
            index or ix.for_request(req.find_links, req.no_index),
            ray_version,
            result.lock.header["vllm"] if result.lock.header["vllm"] != "-" else None,
            tags,
        )
        result.lock.header.update(ray_header(req, result.lock.entries, req.base))
    except (IntegrityError, IndexError):
        pass  # the header says "serve-backend: auto"


def _reject(req: LockRequest, gate: GateResult, lock_path: Path) -> None:
    n = len(gate.violations)
    exc = AbiRejected(
        f"{n} violation{'s' if n != 1 else ''} on top of base {req.base.image_ref or '-'} "
        f"(vllm {req.vllm}); nothing was written to {lock_path}.",
        details=format_rejection(gate),
    )
    exc.gate = gate
    raise exc
