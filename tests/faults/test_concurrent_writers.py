"""Two runs writing the same output: the second waits for the first (it says so), nothing is lost,
no run fails with an internal error."""

from __future__ import annotations

import os
import subprocess

from builder.image.render import verify_context
from builder.resolve.lockfile import load_lock

from .conftest import BUILD_IMAGE, render_args, tiny_context


def _start(args, env):
    return subprocess.Popen(
        [BUILD_IMAGE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, **env)
    )


def test_two_renders_to_the_same_output(tmp_path):
    from builder.util import output_lock

    env = {"BUILD_IMAGE_CACHE": str(tmp_path / "cache")}
    tiny_context(tmp_path, names=("six", "idna", "certifi"))
    out = tmp_path / "same-ctx"
    want = load_lock(tmp_path / "requirements.lock").lock_hash

    def both(hold: bool):
        first = ["", ""]
        if hold:  # both start while a third writer holds the output: both must wait, then go one by one
            with output_lock(out):
                procs = [_start(render_args(tmp_path, out), env) for _ in range(2)]
                first = [p.stderr.readline() for p in procs]  # the first thing each says: it waits
        else:
            procs = [_start(render_args(tmp_path, out), env) for _ in range(2)]
        results = [(p.wait(timeout=300), p.stdout.read(), f + p.stderr.read()) for p, f in zip(procs, first)]
        for rc, _out, err in results:
            assert rc == 0 and "internal error" not in err, err
        assert verify_context(out).lock_hash == want
        return results

    for _round in range(4):  # racing freely: never an internal error, always one whole context
        both(hold=False)
    results = both(hold=True)
    assert all("another build-image run is writing" in err for _rc, _o, err in results)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".same-ctx.")]  # no temp or old dirs left


def test_two_locks_to_the_same_output_lose_nothing(offline, tmp_path):
    env = {"BUILD_IMAGE_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "r.lock"
    a = _start(offline("--with", "stableabi", "-o", str(out)), env)
    b = _start(offline("--with", "purepkg", "-o", str(out)), env)
    ra, rb = [(p.wait(timeout=600), *p.communicate()) for p in (a, b)]
    assert ra[0] == 0 and rb[0] == 0, ra[2] + rb[2]
    waiter = [r for r in (ra, rb) if "another build-image run is writing" in r[2]]
    # both wrote, one after the other: the file on disk is the one the later run says it wrote
    assert all(r[1].startswith(f"wrote {out}") for r in (ra, rb)), (ra[1], rb[1])
    assert len(waiter) <= 1, (ra[2], rb[2])
    if waiter:  # they overlapped (the usual case): the one that waited wrote last, and its lock is on disk
        later = "stableabi" if waiter[0] is ra else "purepkg"
        assert load_lock(out).overlay == [later]
    # the same inputs twice: one writes, the other waits and finds it up to date (one resolution)
    c = _start(offline("--with", "stableabi", "-o", str(out), "--upgrade"), env)
    d = _start(offline("--with", "stableabi", "-o", str(out)), env)
    rc_, rd = [(p.wait(timeout=600), *p.communicate()) for p in (c, d)]
    assert rc_[0] == 0 and rd[0] == 0, rc_[2] + rd[2]
    assert load_lock(out).overlay == ["stableabi"]


def test_a_writer_held_too_long_is_reported_and_nothing_is_written(tmp_path):
    from builder.util import output_lock

    env = {"BUILD_IMAGE_CACHE": str(tmp_path / "cache"), "BUILD_IMAGE_LOCK_TIMEOUT": "1"}
    ctx, _plan = tiny_context(tmp_path)
    before = sorted((p.relative_to(ctx), p.read_bytes()) for p in ctx.rglob("*") if p.is_file())
    with output_lock(ctx):
        p = _start(render_args(tmp_path, ctx), env)
        rc, (_out, err) = p.wait(timeout=120), p.communicate()
    assert rc == 14, err
    assert f"another build-image run has been writing {ctx}" in err and "nothing was written" in err
    assert sorted((p.relative_to(ctx), p.read_bytes()) for p in ctx.rglob("*") if p.is_file()) == before
