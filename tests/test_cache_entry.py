"""Cache entries built beside their final name and renamed into place: two builders sharing one
cache (two users, two CI jobs) never delete or read what the other is still building."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from builder.scratch import cache_entry, process_tag, sweep_cache_entries


def _slow_build(marker: str, delay: float):
    def build(d: Path) -> None:
        (d / "a").write_text(marker)
        time.sleep(delay)
        (d / "b").write_text(marker)

    return build


def _child(entry: str, marker: str, delay: float, out: str) -> None:
    got = cache_entry(Path(entry), _slow_build(marker, delay))
    time.sleep(0.3)  # still using the entry while the other builder finishes
    Path(out).write_text(f"{(got / 'a').read_text()} {(got / 'b').read_text()}")


def test_two_builders_at_once_both_get_a_complete_entry_and_neither_deletes_the_other(tmp_path):
    entry = tmp_path / "probe-env" / "venv-x"
    ctx = multiprocessing.get_context("fork")
    # the fast one finishes while the slow one is building: the slow one must not remove the finished entry
    slow = ctx.Process(target=_child, args=(str(entry), "slow", 1.0, str(tmp_path / "slow.out")))
    fast = ctx.Process(target=_child, args=(str(entry), "fast", 0.1, str(tmp_path / "fast.out")))
    slow.start()
    time.sleep(0.2)
    fast.start()
    fast.join(30)
    slow.join(30)
    assert fast.exitcode == 0 and slow.exitcode == 0
    # both read one complete entry: the first rename won, the second builder's copy was dropped
    assert (tmp_path / "fast.out").read_text() == "fast fast"
    assert (tmp_path / "slow.out").read_text() == "fast fast"
    assert sorted(p.name for p in entry.parent.iterdir()) == ["venv-x"]


def test_a_failed_build_leaves_nothing_and_an_incomplete_or_broken_entry_is_rebuilt(tmp_path):
    entry = tmp_path / "e"

    def boom(d: Path) -> None:
        (d / "half").write_text("x")
        raise RuntimeError("install failed")

    with pytest.raises(RuntimeError):
        cache_entry(entry, boom)
    assert list(tmp_path.iterdir()) == []
    entry.mkdir()
    (entry / "left-by-an-older-version").write_text("x")  # no completion mark
    assert cache_entry(entry, _slow_build("new", 0)) == entry
    assert sorted(p.name for p in entry.iterdir()) == [".complete", "a", "b"]
    # complete but broken by the caller's own test: set aside and built again
    assert (entry / "a").read_text() == "new"
    cache_entry(entry, _slow_build("again", 0), usable=lambda e: (e / "a").read_text() != "new")
    assert (entry / "a").read_text() == "again"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]


def test_the_sweep_removes_only_half_built_entries_of_dead_processes(tmp_path):
    dead = tmp_path / ".venv-a.building-999999999-1.abc"
    live = tmp_path / f".venv-a.building-{process_tag()}.def"
    for d in (dead, live, tmp_path / "venv-a", tmp_path / ".other"):
        d.mkdir()
    assert sweep_cache_entries(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "venv-a", ".other"])
    assert os.path.isdir(live)
