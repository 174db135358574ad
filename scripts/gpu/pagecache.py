#!/usr/bin/env python3
"""Page-cache state of a checkpoint's files: how much is resident (mincore), evict it, or read it.

    pagecache.py resident DIR        # {"resident_bytes": ..., "bytes": ..., "fraction": ...}
    pagecache.py evict DIR           # fsync + posix_fadvise(DONTNEED) per file, then resident
    pagecache.py read DIR            # read every file once (warms the cache); prints GB/s

Standard library only (ctypes mmap + mincore), for the GPU host of issue 28's cold-start runs.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
PAGE = os.sysconf("SC_PAGE_SIZE")


def files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.is_file())


def resident(path: Path) -> int:
    size = path.stat().st_size
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            n = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * n)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            return sum(b & 1 for b in vec) * PAGE
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def state(d: Path) -> dict:
    total = sum(p.stat().st_size for p in files(d))
    res = min(total, sum(resident(p) for p in files(d)))
    return {"bytes": total, "resident_bytes": res, "fraction": round(res / total, 4) if total else None}


def evict(d: Path) -> None:
    for p in files(d):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read(d: Path) -> dict:
    t0, n = time.monotonic(), 0
    for p in files(d):
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(16 << 20):
                n += len(chunk)
    dt = time.monotonic() - t0
    return {
        "read_bytes": n,
        "read_s": round(dt, 2),
        "GBps": round(n / dt / 1e9, 3),
        "GiBps": round(n / dt / (1 << 30), 3),
    }


def main(argv: list[str]) -> int:
    verb, d = argv[0], Path(argv[1])
    out: dict = {}
    if verb == "evict":
        evict(d)
    elif verb == "read":
        out.update(read(d))
    out.update(state(d))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
