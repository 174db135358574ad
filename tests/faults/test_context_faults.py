"""A rendered context is self-contained: damage to the download cache after render cannot reach it."""

from __future__ import annotations

import os

from .conftest import cli, tiny_context


def test_truncating_a_cached_wheel_after_render_leaves_the_context_intact(tmp_path, monkeypatch):
    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path / "cache"))
    ctx, plan = tiny_context(tmp_path, names=("six", "idna"), via_cache=True)
    from builder.fetch import cached_path

    for e in plan.lock.entries:
        cached = cached_path(e.wheel.sha256, e.wheel.filename)
        placed = ctx / "wheels" / e.wheel.filename
        assert cached.is_file()
        assert os.stat(cached).st_ino != os.stat(placed).st_ino and os.stat(placed).st_nlink == 1
        with open(cached, "r+b") as fh:  # in place: the inode stays, its bytes go
            fh.truncate(3)
    # build verifies the context before it asks the engine: an intact context reaches the (dead) engine
    env = {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock", "BUILD_IMAGE_CACHE": str(tmp_path / "cache")}
    r = cli(["build", str(ctx)], env=env)
    assert r.returncode == 8, r.stderr
    assert "does not match" not in r.stderr
