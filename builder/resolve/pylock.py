"""PEP 751 ``pylock.toml``: read (uv's output, a lock's twin) and write, with ``packaging.pylock``.

Two uses:

* the lock stage reads the ``pylock.toml`` uv writes (every file of every package of the
  resolution) and picks, per package, the wheel an installer would install on the base
  (:func:`read`, :func:`candidates`, :func:`select_wheel`: ``packaging.pylock``'s own
  validation and wheel selection for the base's marker environment and tags);
* ``build-image lock`` writes ``pylock.toml`` beside ``requirements.lock``
  (:func:`format_pylock`): the same packages, versions and hashes, one wheel per package
  (the one the image installs), so ``uv pip install -r pylock.toml`` and
  ``pip install -r pylock.toml`` install exactly what the lock pins.  The lock's header and
  each entry's ``# via`` / ``# facts:`` / extra ``--hash`` lines go into ``[tool.build-image]``
  tables, so :func:`parse_pylock_lock` reads it back into the same :class:`LockFile`
  (``render``, ``diff`` and ``lock --check`` accept either file).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.pylock import (
    Package,
    PackageWheel,
    Pylock,
    PylockSelectError,
    PylockUnsupportedVersionError,
    PylockValidationError,
    is_valid_pylock_path,
)
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.errors import BadInput
from builder.resolve.manifest import DistFacts
from builder.util import atomic_write_text, canonical_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PYLOCK_NAME = "pylock.toml"
TOOL = "build-image"
CREATED_BY = "build-image"

__all__ = [
    "PYLOCK_NAME", "WheelCandidate", "read", "candidates", "target_environment", "select_wheel",
    "to_pylock", "format_pylock", "write_pylock", "parse_pylock_lock", "is_pylock_path", "twin_path", "same_pins",
    "twin_problem",
]


@dataclass
class WheelCandidate:
    filename: str
    url: str  # https://... or file:///abs/path
    sha256: str
    size: int | None = None


def is_pylock_path(path: str | Path) -> bool:
    """``pylock.toml`` or ``pylock.<name>.toml`` (PEP 751's file names)."""
    return is_valid_pylock_path(Path(path))


def twin_path(lock_path: str | Path) -> Path:
    """The PEP 751 file written beside a lock: ``pylock.toml`` beside ``requirements.lock``,
    ``pylock.<stem>.toml`` beside any other ``<stem>.lock`` (two locks in one folder never share one)."""
    p = Path(lock_path)
    if p.name == "requirements.lock":
        return p.with_name(PYLOCK_NAME)
    stem = p.name[: -len(".lock")] if p.name.endswith(".lock") else p.name
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in stem) or "lock"
    return p.with_name(f"pylock.{stem}.toml")


# =========================================================================== reading


def read(text: str, where: str = PYLOCK_NAME) -> Pylock:
    """A validated :class:`Pylock`; an unreadable or invalid file is :class:`BadInput` naming it."""
    from builder.validate import load_toml

    try:
        doc = load_toml(text, where)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{where} is not valid TOML ({exc}).") from None
    try:
        return Pylock.from_dict(doc)
    except PylockUnsupportedVersionError as exc:
        raise BadInput(f"{where}: {exc}; this tool reads pylock lock-version 1.x.") from None
    except PylockValidationError as exc:
        raise BadInput(f"{where} is not a valid PEP 751 lock: {exc}.") from None


def _wheel_url(w: PackageWheel, base_dir: Path | None) -> str | None:
    if w.url:
        return w.url
    if w.path:
        p = Path(w.path)
        if not p.is_absolute() and base_dir is not None:
            p = (base_dir / p).resolve()
        return p.as_uri()
    return None


def _candidate(w: PackageWheel, base_dir: Path | None) -> WheelCandidate | None:
    sha = (w.hashes or {}).get("sha256")
    url = _wheel_url(w, base_dir)
    if not sha or not url:
        return None
    return WheelCandidate(w.filename, url, sha, w.size)


def _display_name(pkg: Package) -> str:
    return ((pkg.tool or {}).get(TOOL) or {}).get("name") or str(pkg.name)


def candidates(doc: Pylock, base_dir: Path | None = None) -> dict[str, tuple[str, str, list[WheelCandidate]]]:
    """``{key: (name, version, wheels)}``: every wheel with a sha256 (``path`` entries become
    ``file://`` URLs relative to ``base_dir``)."""
    out: dict[str, tuple[str, str, list[WheelCandidate]]] = {}
    for pkg in doc.packages:
        wheels = [c for c in (_candidate(w, base_dir) for w in pkg.wheels or ()) if c is not None]
        out[canonical_name(pkg.name)] = (_display_name(pkg), str(pkg.version or ""), wheels)
    return out


def target_environment(python_version: str, platform: str) -> dict[str, str]:
    """PEP 508 marker environment of the base (``3.12``, ``x86_64-manylinux_2_35``)."""
    arch = platform.split("-", 1)[0]
    full = python_version if python_version.count(".") >= 2 else f"{python_version}.0"
    return {
        "implementation_name": "cpython",
        "implementation_version": full,
        "os_name": "posix",
        "platform_machine": arch,
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": full,
        "platform_python_implementation": "CPython",
        "python_version": ".".join(python_version.split(".")[:2]),
        "sys_platform": "linux",
    }


def select_wheel(cands: Sequence[WheelCandidate], tags: Sequence[Tag], name: str = "x",
                 environment: Mapping[str, str] | None = None) -> WheelCandidate | None:
    """The candidate an installer picks for ``tags`` (most preferred first), by
    ``packaging.pylock``'s selection; None when no wheel is installable there."""
    wheels, by_name = [], {}
    for c in cands:
        try:
            w = PackageWheel(name=c.filename, url=c.url, hashes={"sha256": c.sha256})
            w.filename  # noqa: B018 - an unparsable file name cannot be ranked
        except (PylockValidationError, ValueError):
            continue
        by_name[c.filename] = c
        wheels.append(w)
    if not wheels:
        return None
    one = Pylock(lock_version=Version("1.0"), created_by=CREATED_BY,
                 packages=[Package(name=canonicalize_name(name, validate=False), wheels=wheels)])
    env = dict(environment) if environment else None
    try:
        for _pkg, dist in one.select(tags=list(tags), environment=env):
            return by_name.get(dist.filename)
    except PylockSelectError:
        return None
    except Exception:  # noqa: BLE001 - a wheel name packaging cannot parse: not installable
        return None
    return None


# =========================================================================== writing (a lock's twin)


def _facts_table(f: DistFacts) -> dict:
    return {"binary": f.binary, "extensions": f.extensions, "numpy-abi": [f.numpy_abi.get("1", 0), f.numpy_abi.get("2", 0)],
            "glibc": f.glibc or "", "python-abi": f.python_abi or "none"}


def _facts_from(t: Mapping, where: str) -> DistFacts:
    try:
        n1, n2 = t.get("numpy-abi", [0, 0])
        return DistFacts(binary=bool(t.get("binary", False)), extensions=int(t.get("extensions", 0)),
                         numpy_abi={"1": int(n1), "2": int(n2)}, glibc=t.get("glibc") or None,
                         python_abi=str(t.get("python-abi", "none")))
    except (TypeError, ValueError):
        raise BadInput(f"{where}: malformed [tool.build-image.facts] table {dict(t)!r}.") from None


def to_pylock(lock) -> Pylock:
    """The PEP 751 twin of a :class:`~builder.resolve.lockfile.LockFile` (one wheel per package)."""
    h = lock.header
    python, platform = h.get("python", ""), h.get("platform", "")
    arch = platform.split("-", 1)[0] if platform else ""
    env_marker = f"python_version == '{python}' and sys_platform == 'linux'" + (
        f" and platform_machine == '{arch}'" if arch else "")
    packages = []
    for e in sorted(lock.entries, key=lambda e: e.key):
        if e.wheel is None:
            raise BadInput(f"lock: {e.name}=={e.version} has no '# wheel:' line; pylock.toml needs its wheel.")
        extra: dict = {"facts": _facts_table(e.facts)}
        others = sorted(set(e.hashes) - {e.wheel.sha256})
        if others:  # the lock's other files (other platforms): requirements.lock's --hash lines
            extra["other-hashes"] = others
        if e.name != str(canonicalize_name(e.name)):
            extra["name"] = e.name
        if e.via:
            extra["via"] = list(e.via)
        if e.base_version:
            extra["base-version"] = e.base_version
        packages.append(Package(
            name=canonicalize_name(e.name), version=Version(e.version),
            wheels=[PackageWheel(name=e.wheel.filename, url=e.wheel.url.split("#")[0], hashes={"sha256": e.wheel.sha256})],
            tool={TOOL: extra},
        ))
    header = {k: v for k, v in h.items() if k != "entries"}
    tool = {"header": header, "overlay": list(lock.overlay),
            "allow-abi-change": dict(sorted(lock.allow_abi_change.items()))}
    doc = Pylock(lock_version=Version("1.0"), created_by=CREATED_BY,
                 requires_python=SpecifierSet(f"=={python}.*") if python else None,
                 environments=[Marker(env_marker)] if python else None,
                 packages=packages, tool={TOOL: tool})
    doc.validate()
    return doc


def format_pylock(lock, wheel_dir: str | None = None) -> str:
    """TOML text of the twin.  ``wheel_dir`` (relative to the pylock file, e.g. ``wheels``): each
    wheel is given by ``path`` into that folder instead of its URL (a build context's offline copy)."""
    import tomli_w  # the TOML writer (tomllib only reads)

    d = to_pylock(lock).to_dict()
    if wheel_dir is not None:
        for pkg in d["packages"]:
            for w in pkg.get("wheels", []):
                w.pop("url", None)
                w["path"] = f"{wheel_dir.rstrip('/')}/{w['name']}"
    head = ("# Generated by build-image from requirements.lock; do not edit by hand. Regenerate with "
            "`build-image lock`.\n# PEP 751 lock: `uv pip install -r pylock.toml` / `pip install -r pylock.toml`.\n")
    return head + tomli_w.dumps(d)


def write_pylock(path: str | Path, lock, wheel_dir: str | None = None) -> None:
    atomic_write_text(path, format_pylock(lock, wheel_dir))


# =========================================================================== reading a twin back


def refuse_duplicates(packages: Sequence[Package], path: str) -> None:
    """A build-image pylock lists each package once (as requirements.lock does): a second
    ``[[packages]]`` of the same (canonical) name is BadInput naming both positions."""
    seen: dict[str, int] = {}
    for i, pkg in enumerate(packages):
        key = canonical_name(str(pkg.name))
        if key in seen:
            raise BadInput(f"{path}: duplicate package '{pkg.name}' (packages[{i}], first at packages[{seen[key]}]); "
                           "the file is hand-edited.", hint="regenerate it with `build-image lock`.")
        seen[key] = i


def parse_pylock_lock(text: str, path: str = PYLOCK_NAME):
    """A :class:`~builder.resolve.lockfile.LockFile` from a ``pylock.toml`` written by build-image."""
    from builder.resolve.lockfile import REQUIRED_HEADER, LockEntry, LockFile, WheelRef

    doc = read(text, path)
    tool = (doc.tool or {}).get(TOOL)
    if not isinstance(tool, Mapping) or not isinstance(tool.get("header"), Mapping):
        raise BadInput(
            f"{path} is a PEP 751 lock but not one build-image wrote (no [tool.build-image.header] table); "
            "build-image reads the pylock.toml that `build-image lock` writes beside requirements.lock.",
        )
    header = {str(k): str(v) for k, v in tool["header"].items()}
    missing = [k for k in REQUIRED_HEADER if k not in header]
    if missing:
        raise BadInput(f"{path}: [tool.build-image.header] lacks {', '.join(missing)}; the file is hand-edited.")
    refuse_duplicates(doc.packages, path)
    entries = []
    for i, pkg in enumerate(doc.packages):
        where = f"{path}, packages[{i}] ({pkg.name})"
        extra = (pkg.tool or {}).get(TOOL) or {}
        wheels = list(pkg.wheels or ())
        if len(wheels) != 1 or pkg.version is None:
            raise BadInput(f"{where}: a build-image pylock has exactly one wheel and a version per package.")
        w = wheels[0]
        sha = (w.hashes or {}).get("sha256")
        url = _wheel_url(w, Path(path).parent)
        if not sha or not url:
            raise BadInput(f"{where}: the wheel has no sha256 or no url/path.")
        hashes = sorted(set(extra.get("other-hashes") or []) | {sha})
        entries.append(LockEntry(
            name=str(extra.get("name") or pkg.name), version=str(pkg.version), hashes=hashes,
            via=[str(v) for v in extra.get("via", [])], wheel=WheelRef(url=url, sha256=sha),
            facts=_facts_from(extra.get("facts") or {}, where), base_version=extra.get("base-version") or None,
            line=i + 1,
        ))
    header["entries"] = str(len(entries))
    return LockFile(header=header, overlay=[str(o) for o in tool.get("overlay", [])],
                    allow_abi_change={canonical_name(k): str(v) for k, v in (tool.get("allow-abi-change") or {}).items()},
                    entries=entries)


def pins(lock) -> dict[str, tuple[str, str]]:
    """``{key: (version, wheel sha256)}`` of a lock: what gets installed."""
    return {e.key: (e.version, e.wheel.sha256 if e.wheel else "") for e in lock.entries}


def same_pins(a, b) -> list[str]:
    """Differences between two locks' installed sets (empty: the same)."""
    pa, pb = pins(a), pins(b)
    out = []
    for k in sorted(set(pa) | set(pb)):
        if pa.get(k) != pb.get(k):
            va = f"{pa[k][0]} ({pa[k][1][:12]})" if k in pa else "absent"
            vb = f"{pb[k][0]} ({pb[k][1][:12]})" if k in pb else "absent"
            out.append(f"{k}: {va} vs {vb}")
    return out



def twin_problem(lock_path: str | Path, lock) -> str | None:
    """Why the ``pylock.toml`` beside ``lock_path`` is not the twin of ``lock`` (None: it is)."""
    twin = twin_path(lock_path)
    if not twin.is_file():
        return f"{twin} (its PEP 751 twin) does not exist"
    try:
        from builder.validate import read_bounded_text

        other = parse_pylock_lock(read_bounded_text(twin, "pylock"), str(twin))
    except (BadInput, OSError, UnicodeDecodeError) as exc:
        return f"{twin} is not readable: {getattr(exc, 'message', exc)}"
    diffs = same_pins(lock, other)
    if diffs:
        more = f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else ""
        return f"{twin} pins other packages than {Path(lock_path).name}: {'; '.join(diffs[:3])}{more}"
    if other.header.get("inputs-sha256") != lock.header.get("inputs-sha256"):
        return f"{twin} was written for other inputs (inputs-sha256 differs from {Path(lock_path).name}'s)"
    return None


def sync_twin(lock_path: str | Path, check: bool, say=None) -> None:
    """The twin of an up-to-date lock: with ``check``, :class:`~builder.errors.StaleLock` (exit 5) when it
    is missing, invalid or pins anything else; otherwise it is rewritten from the lock (no resolution)."""
    from builder.errors import StaleLock
    from builder.resolve.lockfile import load_lock

    if is_pylock_path(lock_path):
        return
    lock = load_lock(lock_path)
    problem = twin_problem(lock_path, lock)
    if problem is None:
        return
    if check:
        raise StaleLock(f"{lock_path} is up to date but {problem}.",
                        hint="run `build-image lock` (without --check): it rewrites the pylock file from the lock.")
    write_pylock(twin_path(lock_path), lock)
    if say is not None:
        say(f"rewrote {twin_path(lock_path)} from {lock_path} ({problem})")


def refuse_pylock_output(lock_path: str | Path, check: bool) -> None:
    """``-o pylock.toml`` names the derived file: refused except for ``--check``."""
    p = Path(lock_path)
    if not check and is_pylock_path(p):
        raise BadInput(f"-o {p}: name the requirements.lock; `lock` writes its PEP 751 twin "
                       f"({twin_path(p.with_name('requirements.lock')).name}) beside it. "
                       "`lock --check` accepts either file.")
