"""Smaller faults: ray-check's verdicts, output that is not a terminal, SOURCE_DATE_EPOCH at build
time, a symlinked patch in a series directory."""

from __future__ import annotations

import subprocess
import sys

from builder.resolve.lockfile import LockEntry, LockFile, WheelRef
from builder.serving.raycheck import CheckResult, NodeReport, compare, render_text


def _node(name: str, numpy: str) -> NodeReport:
    return NodeReport(
        node=name,
        image="img",
        python="3.12.3",
        packages={"numpy": numpy, "ray": "2.58.1"},
        image_id="sha256:" + "a" * 64,
    )


def _lock(numpy: str) -> LockFile:
    h = "b" * 64
    return LockFile(
        header={"python": "3.12"},
        overlay=[],
        allow_abi_change={},
        entries=[
            LockEntry(
                name="numpy", version=numpy, hashes=[h], wheel=WheelRef(url=f"https://x/numpy-{numpy}.whl", sha256=h)
            )
        ],
    )


def test_ray_check_nodes_agreeing_but_not_with_the_lock_is_its_own_verdict():
    nodes = [_node("head", "1.26.4"), _node("worker-1", "1.26.4")]
    res = CheckResult(image="img", nodes=nodes, findings=compare(nodes, _lock("2.1.0")))
    assert res.mismatch == "lock" and "agree with each other, not with the lock" in render_text(res)
    assert '"mismatch": "lock"' in res.to_json()
    nodes = [_node("head", "1.26.4"), _node("worker-1", "2.1.0")]
    res = CheckResult(image="img", nodes=nodes, findings=compare(nodes, _lock("2.1.0")))
    assert res.mismatch == "nodes" and "the nodes disagree" in render_text(res)
    assert CheckResult(image="img", nodes=nodes[:1], findings=compare(nodes[:1], _lock("1.26.4"))).mismatch is None


def test_progress_on_a_pipe_is_not_wrapped_at_80_columns():
    line = (
        "push: 127.0.0.1:5000/serving/vllm:vllm0.26.0-0123456789ab "
        + "nvidia_cudnn_cu12-9.10.2.21-py3-none-manylinux_2_27_x86_64.whl"
    )
    code = f"from builder.commands import stderr_console; stderr_console().print({line!r}, markup=False)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr.rstrip("\n") == line


def test_a_symlinked_patch_in_a_series_is_refused(tmp_path):
    import shutil

    from .conftest import ROOT, cli

    src = ROOT / "tests" / "data" / "standin" / "patches"
    series = tmp_path / "series"
    shutil.copytree(src, series)
    first = next(
        ln.split("#")[0].strip() for ln in (series / "series").read_text().splitlines() if ln.split("#")[0].strip()
    )
    outside = tmp_path / "elsewhere.patch"
    outside.write_bytes((series / first).read_bytes())
    (series / first).unlink()
    (series / first).symlink_to(outside)
    r = cli(["patch", "check", "--series", str(series), "--vllm", "0.26.0", "--wheel", str(outside)])
    assert r.returncode == 6, r.stdout + r.stderr
    assert f"patch {series / first} is a symlink" in r.stderr


def test_source_date_epoch_at_build_time_is_not_silently_ignored(tmp_path):
    from .conftest import cli, tiny_context

    ctx, _plan = tiny_context(tmp_path)  # rendered with epoch 0
    dead = {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock", "BUILD_IMAGE_CACHE": str(tmp_path / "c")}
    r = cli(["build", str(ctx)], env={**dead, "SOURCE_DATE_EPOCH": "1700000000"})
    assert r.returncode == 8  # the engine is down; the note comes before
    assert "SOURCE_DATE_EPOCH=1700000000 (2023-11-14T22:13:20Z) is ignored by build" in r.stderr
    assert "created=1970-01-01T00:00:00Z" in r.stderr
    r = cli(["build", str(ctx)], env={**dead, "SOURCE_DATE_EPOCH": "0"})
    assert "SOURCE_DATE_EPOCH" not in r.stderr
