"""PEP 751 ``pylock.toml``, with ``packaging.pylock``: any such file read, its wheels selected, and the
lock as its PEP 751 twin.  Pure data: no file is read or written here (:mod:`builder.resolve.lockfile`).

* :func:`read` validates a text (the ``pylock.toml`` uv writes for a resolution: every file
  of every package); :func:`candidates` lists each package's wheels and :func:`select_wheel`
  picks the one an installer would install on the base (``packaging.pylock``'s own wheel
  selection for the base's marker environment, :func:`target_environment`, and tags);
* :func:`dumps` writes a :class:`Pylock` as TOML, optionally with each wheel given by
  ``path`` into a folder (a build context's offline copy);
* the lock as PEP 751 (the twin ``build-image lock`` writes beside ``requirements.lock``):
  :func:`to_pylock` / :func:`format_pylock` write it, one wheel per package, with the header and each
  entry's ``# via`` / ``# facts:`` / extra ``--hash`` lines in ``[tool.build-image]`` tables, so
  :func:`parse_pylock_lock` reads it back into the same :class:`LockFile` (``render``, ``diff`` and
  ``lock --check`` accept either file).
"""

from __future__ import annotations

import re
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

from builder import values
from builder.credentials import redact_text
from builder.errors import BadInput
from builder.resolve.lockfile.requirements import REQUIRED_HEADER, LockEntry, LockFile, WheelRef, header_platform
from builder.resolve.manifest import DistFacts, check_facts
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
    "to_pylock",
    "format_pylock",
    "parse_pylock_lock",
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


# =========================================================================== the lock as PEP 751


def _facts_table(f: DistFacts) -> dict:
    return {
        "binary": f.binary,
        "extensions": f.extensions,
        "numpy-abi": [f.numpy_abi.get("1", 0), f.numpy_abi.get("2", 0)],
        "glibc": f.glibc or "",
        "python-abi": f.python_abi or "none",
    }


def _facts_from(t: object, where: str) -> DistFacts:
    """A pylock package's ``[tool.build-image.facts]`` table: each field of the type :func:`_facts_table` writes
    (a float, an ``inf``, a string where a count goes is refused, never rounded), then :func:`check_facts`."""
    counts = t.get("numpy-abi", [0, 0]) if isinstance(t, Mapping) else None
    shapes = isinstance(t, Mapping) and (
        isinstance(t.get("binary", False), bool)
        and _is_count(t.get("extensions", 0))
        and isinstance(counts, list)
        and len(counts) == 2
        and all(_is_count(n) for n in counts)
        and isinstance(t.get("glibc", ""), str)
        and isinstance(t.get("python-abi", "none"), str)
    )
    if not shapes:
        raise BadInput(f"{where}: malformed [tool.build-image.facts] table {t!r:.300}.")
    facts = DistFacts(
        binary=t.get("binary", False),
        extensions=t.get("extensions", 0),
        numpy_abi={"1": counts[0], "2": counts[1]},
        glibc=t.get("glibc") or None,
        python_abi=t.get("python-abi", "none"),
    )
    return check_facts(facts, where)


def _is_count(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool)


def to_pylock(lock: LockFile) -> Pylock:
    """The PEP 751 twin of a :class:`LockFile` (one wheel per package)."""
    h = lock.header
    python = h.get("python", "")
    env_marker = _environment(h)
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
        packages.append(
            Package(
                name=canonicalize_name(e.name),
                version=Version(e.version),
                wheels=[
                    PackageWheel(
                        name=e.wheel.filename, url=e.wheel.url.split("#")[0], hashes={"sha256": e.wheel.sha256}
                    )
                ],
                tool={TOOL: extra},
            )
        )
    header = {k: v for k, v in h.items() if k != "entries"}
    tool = {
        "header": header,
        "overlay": list(lock.overlay),
        "allow-abi-change": dict(sorted(lock.allow_abi_change.items())),
    }
    doc = Pylock(
        lock_version=Version("1.0"),
        created_by=CREATED_BY,
        requires_python=SpecifierSet(f"=={python}.*") if python else None,
        environments=[Marker(env_marker)] if python else None,
        packages=packages,
        tool={TOOL: tool},
    )
    doc.validate()
    return doc


def _environment(header: Mapping[str, str]) -> str:
    """The PEP 751 ``environments`` marker of a lock's header: its python and its platform's machine."""
    python, platform = header.get("python", ""), header.get("platform", "")
    arch = platform.split("-", 1)[0] if platform else ""
    return f"python_version == '{python}' and sys_platform == 'linux'" + (
        f" and platform_machine == '{arch}'" if arch else ""
    )


def _check_pylock_platform(doc: Pylock, header: Mapping[str, str], path: str) -> None:
    """A pylock's ``[tool.build-image.header] platform`` is one build-image writes, and its ``environments``
    (what pip and uv install it on) are the ones that platform's lock gets: a twin whose header says one
    platform and whose environments say the other is hand-edited."""
    header_platform(header, path)
    want = [str(Marker(_environment(header)))]
    have = [str(m) for m in doc.environments or ()]
    if have != want:
        raise BadInput(
            f"{path}: 'environments' {have!r:.200} is not what its header's platform {header.get('platform')} "
            f"and python {header.get('python')} give ({want[0]}); the file is hand-edited.",
            hint="regenerate it with `build-image lock`.",
        )


def format_pylock(lock: LockFile, wheel_dir: str | None = None) -> str:
    """TOML text of the twin.  ``wheel_dir`` (relative to the pylock file, e.g. ``wheels``): each
    wheel is given by ``path`` into that folder instead of its URL (a build context's offline copy)."""
    head = (
        "# Generated by build-image from requirements.lock; do not edit by hand. Regenerate with "
        "`build-image lock`.\n# PEP 751 lock: `uv pip install -r pylock.toml` / `pip install -r pylock.toml`.\n"
    )
    return redact_text(head + dumps(to_pylock(lock), wheel_dir))  # the file rule, as format_lock


def parse_pylock_lock(text: str, path: str = PYLOCK_NAME) -> LockFile:
    """A :class:`LockFile` from a ``pylock.toml`` written by build-image."""
    doc = read(text, path)
    tool = (doc.tool or {}).get(TOOL)
    if not isinstance(tool, Mapping) or not isinstance(tool.get("header"), Mapping):
        raise BadInput(
            f"{path} is a PEP 751 lock but not one build-image wrote (no [tool.build-image.header] table); "
            "build-image reads the pylock.toml that `build-image lock` writes beside requirements.lock.",
        )
    header = {
        _header_key(k, path): values.Line(
            _scalar(v, f"{path}: [tool.build-image.header] {k}"), f"{path}: [tool.build-image.header] {k}"
        )
        for k, v in tool["header"].items()
    }
    missing = [k for k in REQUIRED_HEADER if k not in header]
    if missing:
        raise BadInput(f"{path}: [tool.build-image.header] lacks {', '.join(missing)}; the file is hand-edited.")
    _check_pylock_platform(doc, header, path)
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
        url = wheel_url(w, Path(path).parent)
        if not sha or not url:
            raise BadInput(f"{where}: the wheel has no sha256 or no url/path.")
        hashes = sorted(set(extra.get("other-hashes") or []) | {sha})
        base_version = extra.get("base-version") or None
        entries.append(
            LockEntry(
                name=values.DistName(extra.get("name") or str(pkg.name), f"{where}: name"),
                version=str(pkg.version),
                hashes=[_sha256_hex(h, where) for h in hashes],
                via=[values.Line(v, f"{where}: via") for v in _list(extra.get("via", []), f"{where}: via")],
                wheel=WheelRef(url=values.Url(url, f"{where}: the wheel's url"), sha256=_sha256_hex(sha, where)),
                facts=_facts_from(extra.get("facts") or {}, where),
                base_version=None if base_version is None else values.Version(base_version, f"{where}: base-version"),
                line=i + 1,
            )
        )
    header["entries"] = str(len(entries))
    allow = tool.get("allow-abi-change") or {}
    if not isinstance(allow, Mapping):
        raise BadInput(f"{path}: [tool.build-image.allow-abi-change] must be a table of name = reason.")
    return LockFile(
        header=header,
        overlay=[
            values.Line(o, f"{path}: [tool.build-image] overlay")
            for o in _list(tool.get("overlay", []), f"{path}: [tool.build-image] overlay")
        ],
        allow_abi_change={
            canonical_name(values.DistName(k, f"{path}: allow-abi-change")): values.Line(
                v, f"{path}: allow-abi-change.{k}"
            )
            for k, v in allow.items()
        },
        entries=entries,
    )


def _header_key(key: object, path: str) -> str:
    """A header key as the lock writes it (``# key: value``): lowercase letters, digits and '-'."""
    if not isinstance(key, str) or not re.fullmatch(r"[a-z0-9-]{1,64}", key):
        raise BadInput(
            f"{path}: [tool.build-image.header] key {key!r:.60} is not one build-image writes "
            "(lowercase letters, digits, '-')."
        )
    return key


def _scalar(value: object, where: str) -> str:
    """A header value: a string, or a number/boolean written as one (TOML types them; the lock holds text)."""
    if isinstance(value, (dict, list)):
        raise BadInput(f"{where} must be a string, got {type(value).__name__}.")
    return value if isinstance(value, str) else str(value)


def _list(value: object, where: str) -> list:
    if not isinstance(value, list):
        raise BadInput(f"{where} must be a list of strings, got {type(value).__name__}.")
    return value


def _sha256_hex(value: object, where: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{64}", value):
        raise BadInput(f"{where}: sha256 {value!r:.80} is not 64 lowercase hex digits.")
    return value
