"""A lock edited by hand in a pull request is diffed (exit 1, flagged dangerous, what moved shown);
a file that is not a lock stays exit 2."""

from __future__ import annotations

import json
import re

import pytest

from .conftest import ROOT, cli

DATA = ROOT / "tests" / "data" / "diff"
BASE = str(DATA / "base.json")


def _edits(text: str) -> dict[str, tuple[str, str]]:
    """name -> (edited text, words the finding must contain)."""
    wheel_line = next(ln for ln in text.splitlines() if ln.startswith("    # wheel:") and "click-" in ln)
    return {
        # a version bumped by hand: the wheel line still names the old file
        "version-bump": (text.replace("click==8.1.7", "click==8.1.8"), "names the wheel click-8.1.7"),
        # an entry whose wheel line was deleted
        "no-wheel-line": (text.replace(wheel_line + "\n", ""), "has no '# wheel:' line"),
        # an entries: count that no longer matches (a package dropped by hand)
        "entries-count": (re.sub(r"click==8\.1\.7 \\\n(    .*\n)+", "", text), "the header says 'entries: "),
    }


@pytest.mark.parametrize("case", ["version-bump", "no-wheel-line", "entries-count"])
def test_a_hand_edited_new_lock_is_diffed_and_flagged(tmp_path, case):
    old = DATA / "g5_minor" / "old.lock"
    before = old.read_bytes()
    text, words = _edits(old.read_text())[case]
    new = tmp_path / "requirements.lock"
    new.write_text(text)
    r = cli(["diff", "--base-manifest", BASE, str(old), str(new)])
    assert r.returncode == 1, r.stdout + r.stderr
    assert "not produced by `build-image lock`" in r.stdout and words in r.stdout, r.stdout
    assert f"{new}" in r.stdout
    if case == "version-bump":
        assert re.search(r"click\s+8\.1\.7 → 8\.1\.8", r.stdout), r.stdout  # what moved is shown
    if case == "entries-count":
        assert "click" in r.stdout  # the dropped package is listed as removed
    doc = json.loads(cli(["diff", "--base-manifest", BASE, "--format", "json", str(old), str(new)]).stdout)
    assert doc["dangerous"] is True and doc["exit_code"] == 1
    assert any(words in h for h in doc["locks"][0]["hand_edited"])
    assert old.read_bytes() == before and new.read_text() == text  # diff changes nothing


def test_not_a_lock_is_still_bad_input(tmp_path):
    junk = tmp_path / "requirements.lock"
    junk.write_text("requests==2.32.3\n")
    r = cli(["diff", str(DATA / "g5_minor" / "old.lock"), str(junk)])
    assert r.returncode == 2 and "not a build-image lock" in r.stderr


def test_check_and_render_still_refuse_a_hand_edited_lock(tmp_path):
    from builder.errors import BadInput
    from builder.resolve.lockfile import load_lock

    text, _ = _edits((DATA / "g5_minor" / "old.lock").read_text())["no-wheel-line"]
    p = tmp_path / "requirements.lock"
    p.write_text(text)
    with pytest.raises(BadInput, match="no '# wheel:' line"):
        load_lock(p)
