"""kill -9 of `build-image lock` at several points: the previous lock and its `--check` verdict
survive, no helper outlives it, and its scratch space (under the cache) is swept by the next run."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from builder.scratch import process_tag

from .conftest import BUILD_IMAGE, cli


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _gone(pid: int, timeout: float = 10) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def _wait_for(cond, timeout: float = 60, step: float = 0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(step)
    return None


@pytest.mark.parametrize("point", ["scratch-made", "uv-running", "scanning-wheel"])
def test_kill9_during_lock(offline, tmp_path, point):
    cache = tmp_path / "cache"
    out = tmp_path / "r.lock"
    r = cli(offline("--with", "stableabi", "-o", str(out)), env={"BUILD_IMAGE_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    # a planted stale download (dead owner) and an untagged one: the next run sweeps both
    stale_dir = cache / "downloads" / ("0" * 64)
    stale_dir.mkdir(parents=True)
    (stale_dir / ".x-1.0-py3-none-any.whl.999999-1.abcd1234.part").write_bytes(b"half")
    untagged = stale_dir / ".x-1.0-py3-none-any.whl.abcd1234.part"
    untagged.write_bytes(b"half")
    os.utime(untagged, (time.time() - 2 * 3600,) * 2)  # untagged: swept only once idle for an hour
    mine = stale_dir / f".x-1.0-py3-none-any.whl.{process_tag()}.abcd1234.part"  # a live owner: kept
    mine.write_bytes(b"in progress")

    # a changed input (must resolve again); a fresh cache for the scan point (the wheel is fetched again)
    run_cache = tmp_path / "cache2" if point == "scanning-wheel" else cache
    proc = subprocess.Popen(
        [BUILD_IMAGE, *offline("--with", "stableabi", "--with", "purepkg", "-o", str(out))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, BUILD_IMAGE_CACHE=str(run_cache)),
    )
    helpers: list[int] = []
    if point == "scratch-made":
        assert _wait_for(lambda: list((run_cache / "tmp").glob(f"{proc.pid}-*")))
    elif point == "uv-running":
        helpers = (
            _wait_for(
                lambda: [c for c in _children(proc.pid) if _comm(c) == "uv" and " compile " in _cmdline(c)], step=0.005
            )
            or []
        )
        assert helpers, "uv never ran"
        assert list((run_cache / "tmp").glob(f"{proc.pid}-*/bi-lock-*"))  # its scratch is under the cache
    else:
        for line in proc.stderr:
            if "downloading + scanning binary wheel" in line:
                break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()
    for h in helpers:
        assert _gone(h), f"uv helper {h} outlived its killed parent"
    # the previous lock (and its twin) are untouched, no temp file beside them, --check still right
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    r = cli(offline("--with", "stableabi", "-o", str(out), "--check"), env={"BUILD_IMAGE_CACHE": str(run_cache)})
    assert r.returncode == 0 and "up to date" in r.stdout, r.stdout + r.stderr
    # that run swept the killed one's scratch space and the dead .part files
    assert not list((run_cache / "tmp").glob(f"{proc.pid}-*"))
    r = cli(offline("--with", "stableabi", "-o", str(out), "--check"), env={"BUILD_IMAGE_CACHE": str(cache)})
    assert sorted(p.name for p in stale_dir.iterdir()) == [mine.name]
    assert not [p for p in (run_cache / "tmp").iterdir()] if (run_cache / "tmp").is_dir() else True
