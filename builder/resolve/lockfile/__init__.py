"""The lock file, one concept behind one door: what ``requirements.lock`` and its PEP 751 twin
``pylock.toml`` hold (:class:`LockFile`), their two formats, and the only code that reads, checks, writes
and sweeps them on disk.

* ``requirements`` — the ``requirements.lock`` format: :class:`LockFile` / :class:`LockEntry` /
  :class:`WheelRef`, :func:`format_lock`, the lock's platform (:func:`lock_platform`,
  :func:`refuse_other_platform`); pure data;
* ``pylock`` — PEP 751: any ``pylock.toml`` read and its wheels selected (uv's, for a resolution), and the
  lock as its twin (:func:`to_pylock`, :func:`format_pylock`, :func:`parse_pylock_lock`); pure data;
* ``files`` — the lock on disk: read (:func:`parse_lock`, :func:`load_lock`, :func:`read_lock_file`), the lock
  stage's output (:func:`writing`, :func:`open_output` -> :class:`Output`: check, sweep, then
  :meth:`Output.keep` or :meth:`Output.write` with its twin), the twin (:func:`twin_path`, :func:`same_pins`)
  and a build context's copies (:func:`write_context_copies`).
"""

from builder.resolve.lockfile.files import (
    LOCK_NAME,
    Output,
    load_lock,
    open_output,
    parse_lock,
    read_lock_file,
    refuse_foreign_outputs,
    same_pins,
    twin_path,
    write_context_copies,
    writing,
)
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
    refuse_other_platform,
)

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
    "to_pylock",
    "twin_path",
    "write_context_copies",
    "writing",
]
