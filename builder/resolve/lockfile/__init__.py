"""The lock file, one concept behind one door: what ``requirements.lock`` and its PEP 751 twin
``pylock.toml`` hold (:class:`LockFile`), and the only code that reads, checks, writes and sweeps them on
disk.  The formats are pure data, in this folder: ``requirements`` (the ``requirements.lock`` text:
:class:`LockFile` / :class:`LockEntry` / :class:`WheelRef`, :func:`format_lock`, the lock's platform) and
``pylock`` (PEP 751: any ``pylock.toml`` read and its wheels selected, and the lock as its twin:
:func:`to_pylock`, :func:`format_pylock`, :func:`parse_pylock_lock`).

This module is the door:

* read: :func:`parse_lock` (the format by the file's name), :func:`load_lock`, :func:`read_lock_file`
  (for another command: the text too, another platform's lock refused);
* check and sweep: :func:`writing` around a lock run (a ``-o pylock.toml`` refused, one writer at a time),
  then :func:`open_output` (the output rules checked, a killed write's leftovers swept (:func:`sweep`), the
  lock there read once) and the :class:`Output` it returns;
* write with its twin: :meth:`Output.keep` (the twin of a lock kept as it is, checked or rewritten) and
  :meth:`Output.write` (the lock and its twin, each atomically); the twin's place (:func:`twin_path`) and
  whether it still pins what the lock pins (:func:`twin_problem`, :func:`same_pins`);
* :func:`write_context_copies`: the lock and its twin as a build context carries them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from builder.credentials import redact_text
from builder.errors import BadInput, StaleLock
from builder.events import SILENT, Reporter
from builder.platforms import Platform
from builder.resolve.lockfile.pylock import (
    PYLOCK_NAME,
    WheelCandidate,
    format_pylock,
    is_pylock_path,
    parse_pylock_lock,
    to_pylock,
)
from builder.resolve.lockfile.requirements import (
    LockEntry,
    LockFile,
    WheelRef,
    format_lock,
    header_platform,
    lock_platform,
    parse_requirements,
    refuse_other_platform,
)
from builder.util import (
    atomic_write_text,
    output_lock,
    refuse_foreign,
    sweep_write_leftovers,
    through_link,
    write_target,
)
from builder.validate import read_bounded_text

LOCK_NAME = "requirements.lock"

__all__ = [
    "LOCK_NAME",
    "PYLOCK_NAME",
    "LockEntry",
    "LockFile",
    "Output",
    "WheelCandidate",
    "WheelRef",
    "format_lock",
    "format_pylock",
    "header_platform",
    "is_pylock_path",
    "load_lock",
    "lock_platform",
    "open_output",
    "parse_lock",
    "parse_pylock_lock",
    "read_lock_file",
    "refuse_foreign_outputs",
    "refuse_other_platform",
    "same_pins",
    "sweep",
    "to_pylock",
    "twin_path",
    "write_context_copies",
    "writing",
]

# =========================================================================== reading


def parse_lock(text: str, path: str = "<lock>", *, strict: bool = True) -> LockFile:
    """A lock's text, in the format its file name says: a ``pylock.toml`` (PEP 751, the twin
    ``build-image lock`` writes) by :func:`~builder.resolve.lockfile.pylock.parse_pylock_lock`, any other by
    :func:`~builder.resolve.lockfile.requirements.parse_requirements` (``strict``: see there)."""
    if is_pylock_path(path):
        return parse_pylock_lock(text, path)
    return parse_requirements(text, path, strict=strict)


def load_lock(path: str | Path) -> LockFile:
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise BadInput(f"lock {p} does not exist.", hint="create it with `build-image lock`.")
    return parse_lock(read_bounded_text(p, "lock"), str(p))


def read_lock_file(lock_path: Path, platform: Platform, *, doing: str) -> tuple[LockFile, str | None]:
    """The lock on disk, read once: (lock, text; None for a pylock.toml, which the context
    does not carry verbatim).  A lock made for another platform than ``platform`` is refused, naming both
    (:func:`builder.resolve.lockfile.refuse_other_platform`; ``doing``: what the lock is read for)."""
    if not (Path(lock_path).exists() or Path(lock_path).is_symlink()):
        raise BadInput(f"lock {lock_path} does not exist.", hint="create it with `build-image lock`.")
    text = read_bounded_text(lock_path, "lock")  # a FIFO, a device, a directory: exit 2, never a hang
    lock = parse_lock(text, str(lock_path))
    refuse_other_platform(lock, platform, lock_path, doing=doing)
    return lock, (None if is_pylock_path(lock_path) else text)


# =========================================================================== the twin


def twin_path(lock_path: str | Path) -> Path:
    """The PEP 751 file written beside a lock: ``pylock.toml`` beside ``requirements.lock``,
    ``pylock.<stem>.toml`` beside any other ``<stem>.lock`` (two locks in one folder never share one)."""
    p = Path(lock_path)
    if p.name == LOCK_NAME:
        return p.with_name(PYLOCK_NAME)
    stem = p.name[: -len(".lock")] if p.name.endswith(".lock") else p.name
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in stem) or "lock"
    return p.with_name(f"pylock.{stem}.toml")


def write_pylock(path: str | Path, lock: LockFile) -> None:
    """The twin of ``lock`` at ``path``, written atomically."""
    atomic_write_text(path, format_pylock(lock))


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


# =========================================================================== the lock stage's output


@contextlib.contextmanager
def writing(lock_path: str | Path, check: bool) -> Iterator[None]:
    """Around a lock run at ``lock_path``: ``-o pylock.toml`` names the derived file and is refused except for
    ``--check``; a second writer of the same lock waits, then sees the first's lock (``--check`` writes nothing)."""
    p = Path(lock_path)
    if not check and is_pylock_path(p):
        raise BadInput(
            f"-o {p}: name the requirements.lock; `lock` writes its PEP 751 twin "
            f"({twin_path(p).name}) beside it. `lock --check` accepts either file."
        )
    with contextlib.nullcontext() if check else output_lock(p):
        yield


@dataclass(frozen=True)
class Output:
    """The lock at ``-o`` (a symlink followed: the lock it points to, and its twin beside it) as a lock run
    finds it.  ``found``: a file was there and was read, once: ``lock`` parsed, or ``error`` saying why it
    cannot be (a damaged lock is stale and replaced)."""

    path: Path
    found: bool = False
    lock: LockFile | None = None
    text: str | None = None
    error: BadInput | None = None

    @property
    def twin(self) -> Path:
        """The PEP 751 file of this lock: the twin beside it, or the file itself when it is a pylock.toml."""
        return self.path if is_pylock_path(self.path) else twin_path(self.path)

    @property
    def verbatim(self) -> str | None:
        """The text as read, which a build context carries as is (None for a pylock.toml)."""
        return None if is_pylock_path(self.path) else self.text

    def keep(self, check: bool, reporter: Reporter = SILENT) -> None:
        """The twin of the lock kept as it is: with ``check``, :class:`~builder.errors.StaleLock` (exit 5) when it
        is missing, invalid or pins anything else; otherwise it is rewritten from the lock (no resolution)."""
        if is_pylock_path(self.path):
            return
        lock = self.lock or load_lock(self.path)
        problem = twin_problem(self.path, lock)
        if problem is None:
            return
        if check:
            raise StaleLock(
                f"{self.path} is up to date but {problem}.",
                hint="run `build-image lock` (without --check): it rewrites the pylock file from the lock.",
            )
        write_pylock(twin_path(self.path), lock)
        reporter.step(f"rewrote {twin_path(self.path)} from {self.path} ({problem})")

    def write(self, lock: LockFile) -> None:
        """The lock and its PEP 751 twin beside it, each written atomically."""
        try:
            atomic_write_text(self.path, lock.format())
            write_pylock(twin_path(self.path), lock)
        except OSError as exc:  # the lock on disk (if any) is untouched: the write is atomic
            raise BadInput(f"cannot write the lock {self.path}: {exc.strerror or exc}.") from None


def open_output(
    lock_path: str | Path, want: Platform, *, check: bool, force: bool, read: bool, reporter: Reporter = SILENT
) -> Output:
    """The lock run's output at ``lock_path``, before anything is resolved: a directory is refused; the lock
    there and its twin, when they are another platform's (``want``), are refused with ``--force`` and
    ``--check`` too; unless ``check``, a file build-image did not write is not replaced without ``force``
    (:func:`refuse_foreign_outputs`) and a killed write's leftovers are swept (:func:`sweep`).  ``read``: the
    lock there is read, once (:attr:`Output.found`)."""
    path = through_link(lock_path)  # a symlinked -o: the lock it points to (and its twin beside it) is written
    if path.is_dir():
        raise BadInput(f"lock path {path} is a directory; -o/--output (or the spec's 'lock') names the lock file.")
    _refuse_other_platform_files(path, want)
    if not check:
        refuse_foreign_outputs(path, force)
        sweep(path, reporter)
    if not read or (not path.exists() and not path.is_symlink()):
        return Output(path)
    try:
        text = read_bounded_text(path, "lock")
        return Output(path, found=True, lock=parse_lock(text, str(path)), text=text)
    except BadInput as exc:
        return Output(path, found=True, error=exc)


def refuse_foreign_outputs(lock_path: Path, force: bool) -> None:
    """The output rule for ``lock``: an existing ``-o`` file or pylock twin that build-image did not write
    (a README, a hand-made file: no "# Generated by build-image" first line) is not replaced without
    ``--force``; a device node or FIFO never is (:func:`builder.util.write_target`)."""
    for p in (lock_path, twin_path(lock_path)):
        write_target(p)
        refuse_foreign(p, "lock", force=force)


def sweep(lock_path: Path, reporter: Reporter = SILENT) -> None:
    """The temp files a killed write of the lock or its twin left beside them (owner gone), removed on every
    run that may write them, even one that keeps the lock as it is (:func:`builder.util.sweep_write_leftovers`)."""
    swept = [p.name for x in (lock_path, twin_path(lock_path)) for p in sweep_write_leftovers(x)]
    if swept:
        reporter.step(
            f"removed {len(swept)} temp file(s) a killed earlier write left beside {lock_path.name} "
            f"(their owner is gone): {', '.join(sorted(swept))}"
        )


def _refuse_other_platform_files(lock_path: Path, want: Platform) -> None:
    """Before ``lock`` reads or writes ``lock_path`` for ``want``: the lock there and its PEP 751 twin, when they
    are build-image locks, were made for ``want`` — another platform's lock (or twin) is :class:`BadInput`
    naming both platforms, with ``--force`` and ``--check`` too, and nothing is written
    (:func:`builder.resolve.lockfile.refuse_other_platform`).  A file that is no readable lock is left to the
    output rules (a damaged lock is replaced, a foreign file refused)."""
    for f in (lock_path, twin_path(lock_path)) if not is_pylock_path(lock_path) else (lock_path,):
        lock = _readable_lock(f)
        if lock is not None:
            refuse_other_platform(lock, want, f, doing="the lock being written there")


def _readable_lock(f: Path) -> LockFile | None:
    """The lock (or pylock twin) at ``f`` with a known platform; None when there is none or it is damaged."""
    if not f.is_file():
        return None
    try:
        text = read_bounded_text(f, "lock")
        lock = parse_pylock_lock(text, str(f)) if is_pylock_path(f) else parse_requirements(text, str(f), strict=False)
        lock_platform(lock, str(f))
    except (BadInput, OSError, UnicodeDecodeError):
        return None
    return lock


# =========================================================================== a build context's copies


def write_context_copies(folder: Path, lock: LockFile, text: str | None) -> tuple[str, str]:
    """The lock as a build context carries it, in ``folder``: ``requirements.lock`` (``text`` as read, verbatim
    but for a credential; else the lock's own text) and its PEP 751 twin with each wheel by path into
    ``wheels/``.  Returns (the lock's text as it reads back from the file, the twin's text)."""
    (folder / LOCK_NAME).write_text(redact_text(text) if text is not None else lock.format(), encoding="utf-8")
    pylock_text = format_pylock(lock, wheel_dir="wheels")
    (folder / PYLOCK_NAME).write_text(pylock_text, encoding="utf-8")
    return (folder / LOCK_NAME).read_text(encoding="utf-8"), pylock_text
