"""The loopback Ray head's start: a `ray` stand-in that exits on Ray's raylet registration timeout
is started again once; any other exit, or a second timeout, is BadInput with the log's tail."""

from __future__ import annotations

import sys
import textwrap

import pytest

from builder.errors import BadInput
from builder.events import Recorder
from builder.serving.smoke import rayhead

FAKE_RAY = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    count = Path(sys.argv[1])
    n = int(count.read_text()) + 1 if count.exists() else 1
    count.write_text(str(n))
    mode = sys.argv[2]
    if mode == "crash" or (mode == "timeout-then-up" and n == 1) or mode == "always-timeout":
        if mode == "crash":
            print("ModuleNotFoundError: No module named 'ray'", flush=True)
        else:
            print("Exception: The current node timed out during startup. This could happen because some "
                  "of the raylet failed to startup or the GCS has become overloaded.", flush=True)
        sys.exit(1)
    print("Ray runtime started.", flush=True)
    time.sleep(60)
""")


def _ray(tmp_path, mode: str) -> tuple[list[str], object]:
    script = tmp_path / "fake_ray.py"
    script.write_text(FAKE_RAY)
    count = tmp_path / "starts"
    return [sys.executable, str(script), str(count), mode], count


def test_a_head_that_times_out_registering_is_started_again(tmp_path):
    ray, count = _ray(tmp_path, "timeout-then-up")
    said: list[str] = []
    head = rayhead.start_head({}, timeout=30, ray=ray, reporter=Recorder(said))
    try:
        assert count.read_text() == "2" and head.proc.alive()
        assert any("registration timeout" in m for m in said), said
    finally:
        head.stop(grace=2)
    assert not head.proc.alive()


@pytest.mark.parametrize("mode, starts", [("always-timeout", "2"), ("crash", "1")])
def test_a_second_timeout_or_another_exit_is_bad_input_with_the_log(tmp_path, mode, starts):
    ray, count = _ray(tmp_path, mode)
    with pytest.raises(BadInput) as e:
        rayhead.start_head({}, timeout=30, ray=ray)
    assert count.read_text() == starts  # a crash is not retried
    assert "exited with 1" in str(e.value)
    assert ("timed out during startup" if mode == "always-timeout" else "No module named") in str(e.value)
