"""One-pass conflict report: every base pin that must move, with the one --with line (offline).

The chain is transformers==5.23.0 -> tokenizers -> huggingface-hub in miniature: the overlay needs
depa>=2, and depa 2.0 needs depb>=2; the base pins depa 1.0 and depb 1.0."""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner

from builder.cli import main
from builder.resolve.lockfile import load_lock
from tests.fx_wheels import install_into, write_wheel

PRIVATE_CACHE = "bi-cache-moves"  # the download cache of this module's tests (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture(scope="module")
def house_and_base(tmp_path_factory):
    d = tmp_path_factory.mktemp("moves")
    h = d / "house"
    h.mkdir()
    for v in ("1.0.0", "2.0.0"):
        write_wheel(h, "depb", v, "py3-none-any", {"depb/__init__.py": ""})
        write_wheel(h, "depc", v, "py3-none-any", {"depc/__init__.py": ""})
    write_wheel(h, "depa", "1.0.0", "py3-none-any", {"depa/__init__.py": ""}, requires=["depb"])
    write_wheel(h, "depa", "2.0.0", "py3-none-any", {"depa/__init__.py": ""}, requires=["depb>=2", "depc>=2"])
    write_wheel(h, "wantsnew", "1.0.0", "py3-none-any", {"wantsnew/__init__.py": ""}, requires=["depa>=2"])
    sp = install_into(d / "sp", ["depa==1.0.0", "depb==1.0.0", "depc==1.0.0"], h)
    base = d / "base.json"
    r = CliRunner().invoke(
        main,
        ["base", "snapshot", "--site-packages", str(sp), "--python", "3.12", "--glibc", "2.35", "-o", str(base)],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    return h, base


def test_every_pin_that_must_move_is_found_in_one_run_with_one_with_line(house_and_base, tmp_path):
    house, base = house_and_base
    common = ["lock", "--base", str(base), "--no-default-overlay", "--no-index", "--find-links", str(house)]
    out = tmp_path / "l.lock"
    r = CliRunner().invoke(main, [*common, "--with", "wantsnew", "-o", str(out)], catch_exceptions=False)
    assert r.exit_code == 4, r.output
    text = r.output
    assert "every base pin that must move (found in one pass)" in text
    for line in ("depa 1.0.0 -> 2.0.0", "depb 1.0.0 -> 2.0.0", "depc 1.0.0 -> 2.0.0"):
        assert line in text, text
    assert not out.exists()
    line = next(ln for ln in text.splitlines() if ln.startswith("one line that moves them all"))
    withs = shlex.split(line.split(": ", 1)[1])
    assert withs.count("--with") == 3
    # the line it printed is the one that works: the next run writes the lock
    r = CliRunner().invoke(main, [*common, "--with", "wantsnew", *withs, "-o", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert {e.name: e.version for e in load_lock(out).entries if e.base_version} == {
        "depa": "2.0.0",
        "depb": "2.0.0",
        "depc": "2.0.0",
    }


def test_the_moves_are_in_the_json_document_too(house_and_base, tmp_path):
    import json

    house, base = house_and_base
    r = CliRunner().invoke(
        main,
        [
            "lock",
            "--base",
            str(base),
            "--no-default-overlay",
            "--no-index",
            "--find-links",
            str(house),
            "--with",
            "wantsnew",
            "-o",
            str(tmp_path / "l.lock"),
            "--json",
        ],
    )
    assert r.exit_code == 4
    doc = json.loads(r.stdout)
    assert doc["pin_moves"]["resolves"] is True
    assert {m["name"]: (m["base"], m["to"]) for m in doc["pin_moves"]["moves"]} == {
        "depa": ("1.0.0", "2.0.0"),
        "depb": ("1.0.0", "2.0.0"),
        "depc": ("1.0.0", "2.0.0"),
    }
