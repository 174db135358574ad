"""What the floor approximates is shown as approximated wherever a reviewer looks: a distribution the image
holds but its replayed manifest leaves out (lacks.unversioned: approximated, relaxed, off-index, built from
source) appears in the diff's base move, the upgrade report and `base list` with the version its recipe names
and the reason, never as removed (BaseManifest.held)."""

from __future__ import annotations

import copy
import json

import pytest

from builder.patching.port import PortReport
from builder.resolve.diff import base_move, diff_locks, to_document
from builder.resolve.lockfile import load_lock
from builder.resolve.manifest import Held, load_manifest
from builder.spec import default_base_manifest, default_lock_path
from builder.upgrade import LockStep, UpgradeReport, base_moves, render
from builder.util import canonical_name
from tests.conftest import run

REASON = "approximated: flashinfer-python==0.7.3 from https://download.pytorch.org/whl/cu130, not reachable from here"


def _left_out(m, name: str, reason: str):
    """``m`` with ``name`` dropped from the replayed distributions and listed as unversioned."""
    m = copy.deepcopy(m)
    m.distributions.pop(canonical_name(name), None)
    m.lacks = {**(m.lacks or {}), "unversioned": {**((m.lacks or {}).get("unversioned") or {}), name: reason}}
    return m


@pytest.mark.parametrize(
    "name, reason, version",
    [
        ("flashinfer-python", REASON, "0.7.3"),
        ("Flashinfer_Python", REASON, "0.7.3"),  # any spelling of the name
        ("runai-model-streamer", "off-index: runai-model-streamer[s3]==0.15.1 (x)", "0.15.1"),
        ("mooncake-transfer-engine", "off-index: mooncake-transfer-engine 0.3.10.post2 from a URL", "0.3.10.post2"),
        ("deep-ep", "source-build: DeepEP built from git (tools/x.sh)", None),
        ("nixl-cu13", "relaxed: replayed without it (--relax nixl-cu13)", None),
        ("flashinfer", REASON, None),  # another distribution's pin is not this one's version
    ],
)
def test_held_gives_the_version_the_reason_names_and_the_reason(name, reason, version):
    m = _left_out(load_manifest(default_base_manifest("0.33.0")), name, reason)
    h = m.held(name)
    assert h == Held(version, reason) and not h.replayed
    assert h.text() == f"{version or 'unversioned'} ({reason.split(':')[0]}, not replayed)"
    assert m.held("numpy") == Held(m.get("numpy").version) and m.held("no-such-dist") is None


def test_diff_of_the_shipped_0_33_and_0_34_locks_shows_flashinfer_approximated_not_removed():
    code, out = run("diff", str(default_lock_path("0.33.0")), str(default_lock_path("0.34.0")))
    assert code in (0, 1), out
    row = next(ln for ln in out.splitlines() if ln.strip().startswith("flashinfer "))
    assert "0.7.2.post1" in row and "0.7.3 (approximated, not replayed)" in row and "requirements/cuda.txt:13" in row
    assert not row.rstrip().endswith("-")
    code, out = run("diff", str(default_lock_path("0.33.0")), str(default_lock_path("0.34.0")), "--format", "json")
    moves = {m["key"]: m for m in json.loads(out)["locks"][0]["base_move"]}
    assert moves["flashinfer"]["new"] == "0.7.3 (approximated, not replayed)"
    assert moves["flashinfer"]["note"].startswith("new: approximated: flashinfer-python==0.7.3")


def test_a_base_move_lists_a_left_out_distribution_even_when_its_version_did_not_move():
    old = load_manifest(default_base_manifest("0.33.0"))
    v = old.get("flashinfer-python").version
    new = _left_out(old, "flashinfer-python", f"approximated: flashinfer-python=={v} from X, not reachable")
    moves = {h.key: h for h in base_move(old, new)}
    assert (moves["flashinfer"].old, moves["flashinfer"].new) == (v, f"{v} (approximated, not replayed)")
    assert base_move(old, copy.deepcopy(old)) == []  # nothing left out, nothing moved: no rows
    lock = load_lock(default_lock_path("0.33.0"))
    s = to_document(diff_locks(lock, lock, old_base=old, new_base=new)).sections[0]
    assert s.columns == ["", "old", "new", "not replayed because"] and s.rows[0][0] == "flashinfer"
    assert s.rows[0][3] == f"new: approximated: flashinfer-python=={v} from X, not reachable"


def test_the_upgrade_report_shows_the_recipe_s_version_and_why_it_is_not_replayed():
    a, b = load_manifest(default_base_manifest("0.33.0")), load_manifest(default_base_manifest("0.34.0"))
    moves = {m.what: m for m in base_moves(a, b)}
    fi = moves["flashinfer-python"]
    assert (fi.old, fi.new, fi.changed) == ("0.7.2.post1", "0.7.3 (approximated, not replayed)", True)
    assert fi.note.startswith("to: approximated: flashinfer-python==0.7.3") and fi.to_dict()["note"] == fi.note
    assert "note" not in moves["numpy"].to_dict()

    report = UpgradeReport(
        "0.33.0",
        "0.34.0",
        "a",
        "b",
        "shipped",
        list(moves.values()),
        PortReport("vllm", "0.33.0", "0.34.0", []),
        LockStep("written"),
    )
    text, md = render(report, "text"), render(report, "markdown")
    assert "0.7.3 (approximated, not replayed)" in text and "not replayed: to: approximated: flashinfer" in text
    assert "| 0.7.3 (approximated, not replayed) (to: approximated: flashinfer-python==0.7.3" in md
    shown = {m["what"]: m for m in json.loads(render(report, "json"))["base"]["moves"]}
    assert shown["flashinfer-python"]["note"] == fi.note and "note" not in shown["numpy"]


def test_base_list_shows_each_release_s_left_out_distributions_with_version_and_reason():
    code, out = run("base", "list", "--json")
    assert code == 0, out
    row = next(r for r in json.loads(out) if r["vllm"] == "0.34.0")
    assert row["flashinfer"] == "0.7.3 (approximated, not replayed)"
    assert row["not_replayed"]["flashinfer-python"]["version"] == "0.7.3"
    assert row["not_replayed"]["flashinfer-python"]["reason"].startswith("approximated: ")
    assert set(row["not_replayed"]) == set(row["unversioned"])
    code, out = run("base", "list")
    assert code == 0 and "in the image but not in its replayed floor" in out
    assert "  0.34.0  flashinfer-python 0.7.3: approximated: flashinfer-python==0.7.3" in out
