"""Small shared helpers: atomic writes, hashing, canonical names."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path


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


_CANON = re.compile(r"[-_.]+")


def canonical_name(name: str) -> str:
    """PEP 503 normalised distribution name (``Foo_Bar.baz`` -> ``foo-bar-baz``)."""
    return _CANON.sub("-", name).lower()


def project_root() -> Path:
    """The repository root (where ``patches/``, ``templates/``, ``lockfiles/`` live)."""
    return Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """Download cache; ``BUILD_IMAGE_CACHE`` overrides ``~/.cache/build-image``."""
    env = os.environ.get("BUILD_IMAGE_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "build-image"
    base.mkdir(parents=True, exist_ok=True)
    return base
