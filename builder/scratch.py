"""Scratch space that a killed run cannot leave behind, and children that die with their parent.

Every command runs with its temporary files in one directory of its own under the cache,
``<cache>/tmp/<pid>-<start time>/`` (``tempfile``'s default directory and ``TMPDIR`` for the
helpers it starts point there), removed when the command ends.  A run killed with SIGKILL
cannot remove it, so each command first sweeps the directories — and the download cache's
``.part`` files — whose process is gone (a ``.part`` without an owner in its name, from an
older build-image, only once nobody has written it for an hour: its writer may still be running)
(the PID is not running, or runs a newer process: the start time tells them apart).  Helpers (uv,
the docker CLI) get ``PR_SET_PDEATHSIG``: the kernel kills them when the build-image process dies,
so none is re-parented to init.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

_TAG = re.compile(r"(\d+)-(\d+)")


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def process_tag(pid: int | None = None) -> str:
    """``<pid>-<start time>``: names scratch owned by one process (a reused PID has another start time)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{_start_time(pid) or 0}"


def owner_alive(tag: str) -> bool:
    m = _TAG.fullmatch(tag)
    if not m:
        return False
    start = _start_time(int(m.group(1)))
    return start is not None and (start == m.group(2) or m.group(2) == "0")


_SYSTEM_TMP_ENV = "BUILD_IMAGE_SYSTEM_TMPDIR"


def system_tmp() -> str:
    """The system's temp directory, as it was before :func:`scratch` pointed ``TMPDIR`` at a
    private one (locks shared between runs live there)."""
    return os.environ.get(_SYSTEM_TMP_ENV) or tempfile.gettempdir()


def scratch_home(cache: Path) -> Path:
    """Where :func:`scratch` keeps a command's temp files: under ``cache`` when it is (or can become) a
    writable directory, else a per-user folder in the system temp dir, so a command that needs no cache
    (``diff``, ``checkpoint verify``) runs with a cache path that is a file, read-only or under /dev/null."""
    probe = cache
    try:
        while not probe.exists() and probe.parent != probe:
            probe = probe.parent
        usable = probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)
    except OSError:  # a name the file system refuses (ENAMETOOLONG): no cache there either
        usable = False
    if usable:
        return cache
    return Path(tempfile.gettempdir()) / f"build-image-{os.getuid()}-scratch"


def scratch_root(cache: Path) -> Path:
    return cache / "tmp"


def sweep(cache: Path) -> list[Path]:
    """Remove scratch directories and ``.part`` downloads whose owning process is gone."""
    removed: list[Path] = []
    now = time.time()
    root = scratch_root(cache)
    for d in root.iterdir() if root.is_dir() else []:
        if not owner_alive(d.name):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    for folder in ("probe-env", "probe-trees"):
        removed += sweep_cache_entries(cache / folder)
    downloads = cache / "downloads"
    for part in downloads.glob("*/.*.part") if downloads.is_dir() else []:
        m = re.search(r"\.(\d+-\d+)\.[^.]*\.part$", part.name)
        if m is not None:
            if owner_alive(m.group(1)):
                continue
        elif not _idle(part, now):
            # untagged: written by an older build-image (no owner in the name), perhaps still running
            # and writing it; only one nobody has written for UNTAGGED_PART_IDLE_S is abandoned
            continue
        part.unlink(missing_ok=True)
        removed.append(part)
    return removed


#: An untagged ``.part`` download untouched this long is abandoned (a live download writes it every
#: second or so; a stalled one times out after 120 s of silence).
UNTAGGED_PART_IDLE_S = 3600


def _idle(path: Path, now: float) -> bool:
    try:
        return now - path.stat().st_mtime > UNTAGGED_PART_IDLE_S
    except OSError:
        return False  # gone already


@contextlib.contextmanager
def scratch(cache: Path) -> Iterator[Path]:
    """Sweep, then run with a private scratch directory as the temp dir; remove it afterwards."""
    os.environ.setdefault(_SYSTEM_TMP_ENV, tempfile.gettempdir())
    sweep(cache)
    d = scratch_root(cache) / process_tag()
    made = [p for p in (cache, scratch_root(cache)) if not p.exists()]  # removed again when left empty
    d.mkdir(parents=True, exist_ok=True)
    saved_dir, saved_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = str(d)
    os.environ["TMPDIR"] = str(d)
    try:
        yield d
    finally:
        tempfile.tempdir = saved_dir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(d, ignore_errors=True)
        for p in reversed(made):
            with contextlib.suppress(OSError):
                p.rmdir()  # only when empty: a run that wrote nothing leaves nothing


#: The folder a cache entry is built in, beside its final name: ``.<name>.building-<pid>-<start>.<random>``.
_BUILDING = re.compile(r"\.(?P<name>.+)\.building-(?P<tag>\d+-\d+)\..+")


def cache_entry(entry: Path, build: Callable[[Path], None], usable: Callable[[Path], bool] = Path.is_dir) -> Path:
    """``entry``, a cached folder, built once: by ``build(folder)`` in a folder of this process's own
    beside it, marked complete and renamed into place.  Nothing ever deletes a complete entry, so two
    processes (two users or CI jobs sharing one cache) may build it at once: the first rename wins and
    the other's copy is dropped, and a reader never sees a folder another process is still filling.  A
    folder at ``entry`` without the mark (left by an older build-image that built in place) is renamed
    aside before it is removed, as is a complete one that ``usable`` says is broken."""
    if (entry / ".complete").is_file():
        if usable(entry):
            return entry
        _set_aside(entry)
    entry.parent.mkdir(parents=True, exist_ok=True)
    # one of its own for each call, threads of one process included
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.building-{process_tag()}.", dir=entry.parent))
    try:
        build(tmp)
        (tmp / ".complete").touch()
        _rename_into_place(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after the rename; dropped when another won
    return entry


def _rename_into_place(tmp: Path, entry: Path) -> None:
    for _ in range(3):
        try:
            os.rename(tmp, entry)
            return
        except OSError:
            if (entry / ".complete").is_file():
                return  # another process finished first: its entry is the same content
            _set_aside(entry)
    os.rename(tmp, entry)


def _set_aside(entry: Path) -> None:
    stale = entry.parent / f".{entry.name}.stale-{process_tag()}"
    with contextlib.suppress(OSError):
        os.rename(entry, stale)
    shutil.rmtree(stale, ignore_errors=True)


def sweep_cache_entries(folder: Path) -> list[Path]:
    """Remove the half-built cache entries in ``folder`` whose building process is gone."""
    removed = []
    for d in folder.iterdir() if folder.is_dir() else []:
        m = _BUILDING.fullmatch(d.name)
        if m is not None and not owner_alive(m.group("tag")):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for helpers: SIGKILL this child when its parent dies (Linux; no-op elsewhere)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
