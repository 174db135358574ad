"""The PEP 751 twin of a lock: the ``pylock.toml`` ``build-image lock`` writes beside each
``requirements.lock``, pinning the same packages, versions and hashes.

Where it lives (:func:`twin_path`), whether it still is the lock's twin (:func:`twin_problem`,
compared by :func:`same_pins`), writing it (:func:`write_pylock`) and keeping it in step with an
up-to-date lock (:func:`sync_twin`).  The conversion itself is the lock file format's
(:func:`builder.resolve.lockfile.to_pylock`, :func:`~builder.resolve.lockfile.parse_pylock_lock`).
"""

from __future__ import annotations

from pathlib import Path

from builder.errors import BadInput, StaleLock
from builder.events import SILENT, Reporter
from builder.platforms import Platform
from builder.resolve.lockfile import (
    LockFile,
    format_pylock,
    load_lock,
    lock_platform,
    parse_lock,
    parse_pylock_lock,
    refuse_other_platform,
)
from builder.resolve.pylock import PYLOCK_NAME, is_pylock_path
from builder.util import atomic_write_text
from builder.validate import read_bounded_text


def twin_path(lock_path: str | Path) -> Path:
    """The PEP 751 file written beside a lock: ``pylock.toml`` beside ``requirements.lock``,
    ``pylock.<stem>.toml`` beside any other ``<stem>.lock`` (two locks in one folder never share one)."""
    p = Path(lock_path)
    if p.name == "requirements.lock":
        return p.with_name(PYLOCK_NAME)
    stem = p.name[: -len(".lock")] if p.name.endswith(".lock") else p.name
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in stem) or "lock"
    return p.with_name(f"pylock.{stem}.toml")


def write_pylock(path: str | Path, lock: LockFile, wheel_dir: str | None = None) -> None:
    atomic_write_text(path, format_pylock(lock, wheel_dir))


def pins(lock: LockFile) -> dict[str, tuple[str, str]]:
    """``{key: (version, wheel sha256)}`` of a lock: what gets installed."""
    return {e.key: (e.version, e.wheel.sha256 if e.wheel else "") for e in lock.entries}


def same_pins(a: LockFile, b: LockFile) -> list[str]:
    """Differences between two locks' installed sets (empty: the same)."""
    pa, pb = pins(a), pins(b)
    out = []
    for k in sorted(set(pa) | set(pb)):
        if pa.get(k) != pb.get(k):
            va = f"{pa[k][0]} ({pa[k][1][:12]})" if k in pa else "absent"
            vb = f"{pb[k][0]} ({pb[k][1][:12]})" if k in pb else "absent"
            out.append(f"{k}: {va} vs {vb}")
    return out


def twin_problem(lock_path: str | Path, lock: LockFile) -> str | None:
    """Why the ``pylock.toml`` beside ``lock_path`` is not the twin of ``lock`` (None: it is)."""
    twin = twin_path(lock_path)
    if not twin.is_file():
        return f"{twin} (its PEP 751 twin) does not exist"
    try:
        other = parse_pylock_lock(read_bounded_text(twin, "pylock"), str(twin))
    except (BadInput, OSError, UnicodeDecodeError) as exc:
        return f"{twin} is not readable: {getattr(exc, 'message', exc)}"
    diffs = same_pins(lock, other)
    if diffs:
        more = f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else ""
        return f"{twin} pins other packages than {Path(lock_path).name}: {'; '.join(diffs[:3])}{more}"
    if other.header.get("platform") != lock.header.get("platform"):
        return (
            f"{twin} was written for platform {other.header.get('platform')}, "
            f"{Path(lock_path).name} for {lock.header.get('platform')}"
        )
    if other.header.get("inputs-sha256") != lock.header.get("inputs-sha256"):
        return f"{twin} was written for other inputs (inputs-sha256 differs from {Path(lock_path).name}'s)"
    return None


def sync_twin(lock_path: str | Path, check: bool, reporter: Reporter = SILENT, *, lock: LockFile | None = None) -> None:
    """The twin of an up-to-date lock: with ``check``, :class:`~builder.errors.StaleLock` (exit 5) when it
    is missing, invalid or pins anything else; otherwise it is rewritten from the lock (no resolution).
    ``lock``: the lock at ``lock_path``, when the caller has read it already."""
    if is_pylock_path(lock_path):
        return
    lock = lock or load_lock(lock_path)
    problem = twin_problem(lock_path, lock)
    if problem is None:
        return
    if check:
        raise StaleLock(
            f"{lock_path} is up to date but {problem}.",
            hint="run `build-image lock` (without --check): it rewrites the pylock file from the lock.",
        )
    write_pylock(twin_path(lock_path), lock)
    reporter.step(f"rewrote {twin_path(lock_path)} from {lock_path} ({problem})")


def refuse_pylock_output(lock_path: str | Path, check: bool) -> None:
    """``-o pylock.toml`` names the derived file: refused except for ``--check``."""
    p = Path(lock_path)
    if not check and is_pylock_path(p):
        raise BadInput(
            f"-o {p}: name the requirements.lock; `lock` writes its PEP 751 twin "
            f"({twin_path(p).name}) beside it. `lock --check` accepts either file."
        )


def refuse_other_platform_files(lock_path: str | Path, want: Platform) -> None:
    """Before ``lock`` reads or writes ``lock_path`` for ``want``: the lock there and its PEP 751 twin, when they
    are build-image locks, were made for ``want`` — another platform's lock (or twin) is :class:`BadInput`
    naming both platforms, with ``--force`` and ``--check`` too, and nothing is written
    (:func:`builder.resolve.lockfile.refuse_other_platform`).  A file that is no readable lock is left to the
    output rules (a damaged lock is replaced, a foreign file refused)."""
    p = Path(lock_path)
    for f in (p, twin_path(p)) if not is_pylock_path(p) else (p,):
        lock = _readable_lock(f)
        if lock is not None:
            refuse_other_platform(lock, want, f, doing="the lock being written there")


def _readable_lock(f: Path) -> LockFile | None:
    """The lock (or pylock twin) at ``f`` with a known platform; None when there is none or it is damaged."""
    if not f.is_file():
        return None
    try:
        text = read_bounded_text(f, "lock")
        lock = parse_pylock_lock(text, str(f)) if is_pylock_path(f) else parse_lock(text, str(f), strict=False)
        lock_platform(lock, str(f))
    except (BadInput, OSError, UnicodeDecodeError):
        return None
    return lock
