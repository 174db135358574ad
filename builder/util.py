"""Small shared helpers: atomic writes, hashing, canonical names and versions."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from packaging.version import InvalidVersion, Version

from builder.errors import BadInput, OutputBusy
from builder.scratch import system_tmp


def atomic_write_bytes(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory + rename.

    A crash or an exception leaves either the old file or the new one, never half.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike, text: str, mode: int = 0o644) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


_DIGESTS: dict[tuple[int, int, int, int, int], str] = {}


def _stat_key(path: str | os.PathLike) -> tuple[int, int, int, int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file, computed at most once per process while the file is unchanged.

    Keyed by (device, inode, size, mtime, ctime): a write to the file, a truncation, a
    chmod or a replacement changes the key and the file is hashed again.  Every check of
    a downloaded or copied wheel goes through here, so a run hashes each wheel once."""
    key = _stat_key(path)
    got = _DIGESTS.get(key)
    if got is None:
        got = _DIGESTS[key] = sha256_file(path)
    return got


def remember_digest(path: str | os.PathLike, sha256: str) -> None:
    """Record ``sha256`` as the digest of ``path`` as it is now: for a file this process has
    just written from bytes whose hash it knows (a verified download renamed into place,
    an exact copy of a verified file)."""
    _DIGESTS[_stat_key(path)] = sha256


_CANON = re.compile(r"[-_.]+")


def canonical_name(name: str) -> str:
    """PEP 503 normalised distribution name (``Foo_Bar.baz`` -> ``foo-bar-baz``)."""
    return _CANON.sub("-", name).lower()


def same_version(a: str | None, b: str | None) -> bool:
    """One release however it is spelled (``2.0`` is ``2.0.0``, PEP 440); else the same string
    (None is only the same as None)."""
    if a is None or b is None:
        return a is b
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def project_root() -> Path:
    """The repository root (where ``patches/``, ``templates/``, ``lockfiles/`` live)."""
    return Path(__file__).resolve().parent.parent


def cache_dir(create: bool = True) -> Path:
    """Download cache; ``BUILD_IMAGE_CACHE`` overrides ``~/.cache/build-image``."""
    env = os.environ.get("BUILD_IMAGE_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "build-image"
    if create:
        base.mkdir(parents=True, exist_ok=True)
    return base


LOCK_TIMEOUT_ENV = "BUILD_IMAGE_LOCK_TIMEOUT"


def output_lock_path(path: str | os.PathLike) -> Path:
    """The lock file guarding writes to ``path``: outside the user's tree (nothing to commit or
    ignore), one per absolute output path and user; the kernel drops it when its holder dies."""
    target = os.path.abspath(os.fspath(path))
    d = Path(system_tmp()) / f"build-image-{os.getuid()}-locks"
    d.mkdir(mode=0o700, exist_ok=True)
    return d / f"{sha256_bytes(target.encode())[:32]}.lock"


@contextlib.contextmanager
def output_lock(path: str | os.PathLike, *, timeout: float | None = None) -> Iterator[None]:
    """Hold the exclusive write lock of an output (``filelock``): a second run writing the same
    file or directory says so on stderr and waits for the first (``BUILD_IMAGE_LOCK_TIMEOUT``
    seconds, default 1800); past that, :class:`builder.errors.OutputBusy`."""
    from filelock import FileLock, Timeout

    if timeout is None:
        raw = os.environ.get(LOCK_TIMEOUT_ENV, "1800")
        try:
            timeout = float(raw)
        except ValueError:
            raise BadInput(f"{LOCK_TIMEOUT_ENV}={raw!r} is not a number of seconds.") from None
    lock = FileLock(str(output_lock_path(path)))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        sys.stderr.write(f"waiting: another build-image run is writing {path}; this run continues when it is done "
                         f"(at most {timeout:g} s, {LOCK_TIMEOUT_ENV})\n")
        sys.stderr.flush()
        try:
            lock.acquire(timeout=timeout)
        except Timeout:
            raise OutputBusy(
                f"another build-image run has been writing {path} for more than {timeout:g} s; nothing was written.",
                hint=f"wait for it to finish (or raise {LOCK_TIMEOUT_ENV}); each run writes its output whole.",
            ) from None
    try:
        yield
    finally:
        lock.release()
