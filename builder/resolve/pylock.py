"""PEP 751 ``pylock.toml``: read, select and write, with ``packaging.pylock``.  Nothing here
knows the lock file format (:mod:`builder.resolve.lockfile` converts between the two).

* :func:`read` validates a file (the ``pylock.toml`` uv writes for a resolution: every file
  of every package); :func:`candidates` lists each package's wheels and :func:`select_wheel`
  picks the one an installer would install on the base (``packaging.pylock``'s own wheel
  selection for the base's marker environment, :func:`target_environment`, and tags);
* :func:`dumps` writes a :class:`Pylock` as TOML, optionally with each wheel given by
  ``path`` into a folder (a build context's offline copy).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.pylock import (
    Package,
    PackageWheel,
    Pylock,
    PylockSelectError,
    PylockUnsupportedVersionError,
    PylockValidationError,
    is_valid_pylock_path,
)
from packaging.tags import Tag
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.errors import BadInput
from builder.util import canonical_name
from builder.validate import load_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PYLOCK_NAME = "pylock.toml"
TOOL = "build-image"
CREATED_BY = "build-image"

__all__ = [
    "PYLOCK_NAME",
    "TOOL",
    "CREATED_BY",
    "WheelCandidate",
    "read",
    "candidates",
    "wheel_url",
    "select_wheel",
    "dumps",
    "is_pylock_path",
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


# =========================================================================== reading


def read(text: str, where: str = PYLOCK_NAME) -> Pylock:
    """A validated :class:`Pylock`; an unreadable or invalid file is :class:`BadInput` naming it."""
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


def refuse_duplicates(packages: Sequence[Package], path: str) -> None:
    """A build-image pylock lists each package once (as requirements.lock does): a second
    ``[[packages]]`` of the same (canonical) name is BadInput naming both positions."""
    seen: dict[str, int] = {}
    for i, pkg in enumerate(packages):
        key = canonical_name(str(pkg.name))
        if key in seen:
            raise BadInput(
                f"{path}: duplicate package '{pkg.name}' (packages[{i}], first at packages[{seen[key]}]); "
                "the file is hand-edited.",
                hint="regenerate it with `build-image lock`.",
            )
        seen[key] = i


def wheel_url(w: PackageWheel, base_dir: Path | None) -> str | None:
    """The wheel's ``url``, or its ``path`` as a ``file://`` URL (relative to ``base_dir``)."""
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
    url = wheel_url(w, base_dir)
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


def select_wheel(
    cands: Sequence[WheelCandidate], tags: Sequence[Tag], name: str = "x", environment: Mapping[str, str] | None = None
) -> WheelCandidate | None:
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
    one = Pylock(
        lock_version=Version("1.0"),
        created_by=CREATED_BY,
        packages=[Package(name=canonicalize_name(name, validate=False), wheels=wheels)],
    )
    env = dict(environment) if environment else None
    try:
        for _pkg, dist in one.select(tags=list(tags), environment=env):
            return by_name.get(dist.filename)
    except PylockSelectError:
        return None
    except Exception:  # noqa: BLE001 - a wheel name packaging cannot parse: not installable
        return None
    return None


# =========================================================================== writing


def dumps(doc: Pylock, wheel_dir: str | None = None) -> str:
    """TOML text of ``doc``.  ``wheel_dir`` (relative to the pylock file, e.g. ``wheels``): each
    wheel is given by ``path`` into that folder instead of its URL."""
    import tomli_w  # the TOML writer (tomllib only reads)

    d = doc.to_dict()
    if wheel_dir is not None:
        for pkg in d["packages"]:
            for w in pkg.get("wheels", []):
                w.pop("url", None)
                w["path"] = f"{wheel_dir.rstrip('/')}/{w['name']}"
    return tomli_w.dumps(d)
