"""Fast tests of probes and `patch port` on small synthetic package trees (one per status)."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder import patches as P
from builder import port as PO
from builder import probe as PR
from builder.cli import main

BODY = """    a = x + 1
    b = a * 2
    p = b + 0
    c = b - 3
    d = c * c
    e = d + a
    q = e + 0
    return e
"""
A_MOD = f'''"""toy module."""


def f(x):
{BODY}

def g(x):
{BODY}'''
PATCHED_A = A_MOD.replace("    c = b - 3\n", "    c = b - 4\n", 1)   # only f's line: the first occurrence

# f(1) unpatched: a=2 b=4 c=1 d=1 e=3; patched: c=0 d=0 e=2.  g stays 3.
PROBE = '''import json
import toy.mod as m
checks = [{"name": "f(1) == 2 (patched)", "ok": m.f(1) == 2, "detail": m.f(1)},
          {"name": "g(1) == 3 (untouched)", "ok": m.g(1) == 3, "detail": m.g(1)}]
print("PROBE-RESULT " + json.dumps({"checks": checks}))
'''
HEADER = """Subject: f subtracts four
Why: test
Applies-To: toy=={v}
Upstream-Status: Inappropriate [test]
Risk: none
Probe: 0001-f.probe.py

"""


def diff(rel: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}", n=3))


def tree(root: Path, mod: str) -> Path:
    (root / "toy").mkdir(parents=True)
    (root / "toy" / "__init__.py").write_text("")
    (root / "toy" / "mod.py").write_text(mod)
    return root


@pytest.fixture
def a_series(tmp_path) -> tuple[P.Series, Path]:
    a = tree(tmp_path / "a", A_MOD)
    d = tmp_path / "series-1.0"
    d.mkdir()
    (d / "0001-f.patch").write_text(HEADER.format(v="1.0") + diff("toy/mod.py", A_MOD, PATCHED_A))
    (d / "0001-f.probe.py").write_text(PROBE)
    (d / "series").write_text("0001-f.patch\n")
    return P.load_series(d, "1.0"), a


def port_to(tmp_path, a_series, b_mod: str, out: str | None = None) -> PO.PortReport:
    series, a = a_series
    b = tree(tmp_path / "b", b_mod)
    return PO.port(series, a, b, "2.0", out_dir=tmp_path / out if out else None)


# ------------------------------------------------------------------ probes
def test_probe_output_contract():
    ok = PR.parse_output('noise\nPROBE-RESULT {"checks": [{"name": "x", "ok": true}]}\n', 0)
    assert ok.status == PR.PASS
    bad = PR.parse_output('PROBE-RESULT {"checks": [{"name": "x", "ok": true}, {"name": "y", "ok": false}]}', 0)
    assert bad.status == PR.FAIL and bad.summary().startswith("1 of 2 check(s) fail: y")
    assert PR.parse_output("Traceback ...\nImportError: no toy", 1).status == PR.ERROR  # a crash is no evidence
    assert PR.parse_output('PROBE-RESULT {"checks": []}', 0).status == PR.ERROR
    assert PR.parse_output('PROBE-RESULT {"checks": [{"name": "x", "ok": "yes"}]}', 0).status == PR.FAIL


def test_probe_series_needed_and_works(a_series):
    series, a = a_series
    (res,) = PR.probe_series(series, a)
    assert (res.needed, res.works) == (True, True)
    assert res.unpatched.failed_checks[0]["name"] == "f(1) == 2 (patched)"
    assert (a / "toy" / "mod.py").read_text() == A_MOD  # the source tree is never modified


def test_patch_without_probe_header_is_bad_input(a_series, tmp_path):
    series, a = a_series
    p = series.dir / "0001-f.patch"
    p.write_text(p.read_text().replace("Probe: 0001-f.probe.py\n", ""))
    r = CliRunner().invoke(main, ["patch", "check", "--series", str(series.dir), "--wheel", str(a), "--probe"])
    assert r.exit_code == 2 and "no 'Probe:' header" in r.output


def test_cli_check_probe_reports_needed_and_works(a_series):
    series, a = a_series
    r = CliRunner().invoke(main, ["patch", "check", "--series", str(series.dir), "--wheel", str(a), "--probe", "--json"])
    assert r.exit_code == 0, r.output
    (p,) = json.loads(r.stdout)["patches"]
    assert p["status"] == "applied" and p["probe"]["needed"] is True and p["probe"]["works"] is True


# ------------------------------------------------------------------ port: one test per status
def test_applies_regenerates_offsets(tmp_path, a_series):
    b_mod = A_MOD.replace('"""toy module."""\n', '"""toy module."""\n\nVERSION = 2\nEXTRA = 1\n')
    rep = port_to(tmp_path, a_series, b_mod, out="out")
    (pp,) = rep.patches
    assert pp.status == PO.APPLIES and not rep.needs_review
    assert pp.probe_unpatched.status == PR.FAIL and pp.probe_ported.status == PR.PASS
    ported = P.load_series(tmp_path / "out", "2.0")   # Applies-To toy==2.0
    old_start = a_series[0].patches[0].files[0].hunks[0].source_start
    assert ported.patches[0].files[0].hunks[0].source_start == old_start + 3  # the three inserted lines
    assert "Ported-From: toy==1.0: applies" in (tmp_path / "out" / "0001-f.patch").read_text()
    assert [r.status for r in P.check(ported, tmp_path / "b")] == ["applied"]  # no offset left
    assert (tmp_path / "out" / "0001-f.probe.py").read_text() == PROBE
    assert ported.originals == {"toy/mod.py": P.sha256_bytes(b_mod.encode())}


def test_merged_when_context_changed_nearby(tmp_path, a_series):
    b_mod = A_MOD.replace("    a = x + 1\n", "    a = x + 1  # B\n", 1)  # f's context line, 3 above the change
    rep = port_to(tmp_path, a_series, b_mod, out="out")
    (pp,) = rep.patches
    assert pp.status == PO.MERGED and rep.needs_review
    assert P.check(P.load_series(tmp_path / "out", "2.0"), tmp_path / "b")[0].status == "applied"
    assert "merged: review" in (tmp_path / "out" / "series").read_text()


def test_conflict_shows_the_region(tmp_path, a_series):
    b_mod = A_MOD.replace("    c = b - 3\n", "    c = b - 3  # B changed this line\n", 1)
    rep = port_to(tmp_path, a_series, b_mod, out="out")
    (pp,) = rep.patches
    assert pp.status == PO.CONFLICT and pp.text is None
    shown = "\n".join(pp.detail)
    assert "<<<<<<< patched A\n    c = b - 4\n" in shown and "=======\n    c = b - 3  # B changed this line\n" in shown
    assert (tmp_path / "out" / "0001-f.patch.conflict").is_file()
    assert not (tmp_path / "out" / "0001-f.patch").exists()


def test_context_that_exactly_matches_only_in_another_function_is_not_accepted(tmp_path, a_series):
    # B edits f's line just above the change: the hunk's exact context now occurs only in g,
    # where an offset/fuzz search would apply it
    b_mod = A_MOD.replace("    p = b + 0\n", "    p = b + 0  # B\n", 1)
    series, _ = a_series
    hunk = series.patches[0].files[0].hunks[0]
    b_lines = b_mod.splitlines(True)
    where = P._find(b_lines, hunk.old)
    assert len(where) == 1 and PO.scopes(b_mod)[where[0]] == "g"   # the only exact match is in g
    rep = port_to(tmp_path, a_series, b_mod)
    (pp,) = rep.patches
    assert pp.status == PO.CONFLICT
    assert any("lands in g, in A it is in f" in d for d in pp.detail), pp.detail


def test_upstream_fix_is_retired_with_the_probe_as_evidence(tmp_path, a_series):
    b_mod = PATCHED_A.replace('"""toy module."""\n', '"""toy module, fixed upstream."""\n')
    rep = port_to(tmp_path, a_series, b_mod, out="out")
    (pp,) = rep.patches
    assert pp.status == PO.UPSTREAM and not rep.needs_review
    assert pp.probe_unpatched.status == PR.PASS and pp.probe_ported is None
    assert "retired" in (tmp_path / "out" / "series").read_text()
    assert "probe passes unpatched" in PO.render(rep, "markdown")


def test_hunks_land_but_probe_fails_is_a_conflict(tmp_path, a_series):
    b_mod = A_MOD.replace("    return e\n", "    return e + 100\n", 1)   # outside the hunk's context
    rep = port_to(tmp_path, a_series, b_mod)
    (pp,) = rep.patches
    assert pp.status == PO.CONFLICT and pp.probe_ported.status == PR.FAIL
    assert any("does not pass on the ported tree" in d for d in pp.detail)


def test_placement_compares_enclosing_scopes():
    a_new = PATCHED_A
    b_old = A_MOD
    b_wrong = A_MOD[::-1][::-1].replace("def g(x):\n" + BODY, "def g(x):\n" + BODY.replace("c = b - 3", "c = b - 4"))
    assert PO.placement(A_MOD, a_new, b_old, a_new) == []
    assert "lands in g, in A it is in f" in PO.placement(A_MOD, a_new, b_old, b_wrong)[0]
    assert PO.placement(A_MOD, a_new, b_old, "def (:\n") == ["the ported file does not parse as Python"]


def test_cli_port_json_and_exit_codes(tmp_path, a_series):
    series, a = a_series
    b = tree(tmp_path / "b", A_MOD.replace("    a = x + 1\n", "    a = x + 1  # B\n", 1))
    args = ["patch", "port", "--from", "1.0", "--to", "2.0", "--series", str(series.dir),
            "--from-wheel", str(a), "--to-wheel", str(b)]
    r = CliRunner().invoke(main, [*args, "--json"])
    assert r.exit_code == 1, r.output  # merged: needs review
    doc = json.loads(r.stdout)
    assert doc["merge"] == "merge3" and [p["status"] for p in doc["patches"]] == ["merged"]
    assert not (tmp_path / "out").exists()  # nothing written without -o
    r = CliRunner().invoke(main, [*args, "--format", "markdown"])
    assert "| `0001-f.patch` | **merged** |" in r.stdout
    r = CliRunner().invoke(main, ["patch", "port", "--from", "1.0", "--to", "2.0", "--series", str(series.dir),
                                  "--from-wheel", str(a), "--to-wheel", str(tmp_path / "nothing")])
    assert r.exit_code == 2
