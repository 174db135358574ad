"""The sweep of the download cache's ``.part`` files never deletes one another live process is
writing: a tagged one while its owner runs, an untagged one (an older build-image's) while it is
still being written."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from builder.scratch import UNTAGGED_PART_IDLE_S, process_tag, sweep


def _part(d: Path, name: str, age_s: float = 0) -> Path:
    p = d / name
    p.write_bytes(b"half")
    if age_s:
        os.utime(p, (time.time() - age_s,) * 2)
    return p


def test_a_live_untagged_download_survives_another_process_sweep(tmp_path):
    cache = tmp_path / "cache"
    d = cache / "downloads" / ("a" * 64)
    d.mkdir(parents=True)
    live_untagged = _part(d, ".torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl.k2j3h4g5.part")
    idle_untagged = _part(
        d, ".numpy-2.2.0-cp312-cp312-manylinux_2_28_x86_64.whl.q1w2e3r4.part", age_s=UNTAGGED_PART_IDLE_S + 60
    )
    live_tagged = _part(d, f".ray-2.58.1-cp312-cp312-manylinux2014_x86_64.whl.{process_tag()}.zz11xx22.part")
    # another live process (a sleeping child): its download is kept; once it exits, swept
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        other = _part(d, f".vllm-0.33.0-cp38-abi3-manylinux_2_31_x86_64.whl.{process_tag(child.pid)}.a1b2c3d4.part")
        dead = _part(d, ".x-1.0-py3-none-any.whl.999999-1.abcd1234.part")
        removed = sweep(cache)
        assert sorted(p.name for p in removed) == sorted([idle_untagged.name, dead.name])
        assert live_untagged.exists() and live_tagged.exists() and other.exists()
    finally:
        child.kill()
        child.wait()
    assert other in sweep(cache) and not other.exists()
    assert live_untagged.exists()  # still being written as far as anyone can tell
