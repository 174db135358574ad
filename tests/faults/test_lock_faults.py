"""Faults around `build-image lock`: a hand-edited header, kill -9 mid-lock, concurrent writers,
credentials in index URLs."""

from __future__ import annotations

import pytest

from .conftest import cli

PRIVATE_CACHE = None  # the download cache of this module's tests (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.mark.parametrize(
    "field, edited", [("vllm", "0.25.0"), ("python", "3.11"), ("base-digest", "sha256:" + "e" * 64)]
)
def test_check_compares_every_input_the_header_records(offline, tmp_path, field, edited):
    """A header saying vllm 0.25.0 under the inputs-sha256 of a 0.26.0 request is stale (render
    refuses the same file), not "up to date"."""
    out = tmp_path / "r.lock"
    r = cli(offline("--with", "stableabi", "-o", str(out)))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith(f"# {field}: "))
    out.write_text(text.replace(line, f"# {field}: {edited}"))
    before = out.read_bytes()
    r = cli(offline("--with", "stableabi", "-o", str(out), "--check"))
    assert r.returncode == 5, r.stdout + r.stderr
    assert f"{field}: the lock says {edited}" in r.stderr
    assert out.read_bytes() == before  # --check writes nothing
