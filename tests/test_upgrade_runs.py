"""The upgrade report's RUN lines of B's image build that are new or changed against A's, each with the
recipe reader's conclusion: the part of a release's build a reviewer must read."""

from __future__ import annotations

import pytest

from builder import upgrade as U
from builder.resolve import recipe as R
from builder.resolve import sdist
from builder.resolve.recipe.audit import changed_runs
from builder.resolve.recipe.derive import audit_derive
from tests.fx_sdist import files_with

SHA = "0" * 64
SCRIPT = "#!/bin/bash\nset -e\nuv pip install --system from-script==2.0\n"


def _bf(version: str, files: dict[str, str]) -> R.BuildFiles:
    return R.BuildFiles(version, R.SdistRef(f"vllm-{version}.tar.gz", SHA), files)


def _rows(version: str, files: dict[str, str]):
    return audit_derive(_bf(version, files), keep_going=True)[1]


A_LINES = "RUN mkdir -p /opt/a\nCOPY tools/inst.sh /tmp/inst.sh\nRUN bash /tmp/inst.sh"


def test_a_new_line_a_changed_script_and_a_refused_line_are_listed_and_a_moved_line_is_not():
    a = files_with(A_LINES, {"tools/inst.sh": SCRIPT})
    # B: the same lines one further down (moved), the script installs another version, a new line
    b = files_with(
        "RUN echo moved\n" + A_LINES + "\nRUN frobnicate --all",
        {"tools/inst.sh": SCRIPT.replace("2.0", "3.0")},
    )
    rows = changed_runs(_rows("0.98.0", a), _rows("0.99.0", b), "0.98.0", "0.99.0")
    texts = [" ".join(r.text.split()) for r in rows]
    assert "mkdir -p /opt/a" not in " ".join(texts)  # moved, same text and conclusion: not listed
    assert any("echo moved" in t for t in texts)  # new
    assert any("bash /tmp/inst.sh" in t for t in texts)  # its script changed what it installs
    inst = next(r for r in rows if "bash /tmp/inst.sh" in r.text)
    assert "from-script==3.0" in inst.conclusion
    refused = next(r for r in rows if "frobnicate" in r.text)
    assert refused.conclusion.startswith("refused")
    assert changed_runs(_rows("0.98.0", a), _rows("0.98.0", a), "0.98.0", "0.98.0") == []
    # without the versions, the vllm wheel's line differs between the two releases
    assert any("vllm==0.99.0" in r.conclusion for r in changed_runs(_rows("0.98.0", a), _rows("0.99.0", a)))


def test_the_report_lists_the_rows_or_says_why_they_were_not_compared(monkeypatch):
    a = files_with(A_LINES, {"tools/inst.sh": SCRIPT})
    b = files_with(A_LINES + "\nRUN frobnicate --all", {"tools/inst.sh": SCRIPT})
    loaded = {"0.98.0": _bf("0.98.0", a), "0.99.0": _bf("0.99.0", b)}
    monkeypatch.setattr(sdist, "load", lambda v, sha256=None, index=None: loaded[v])
    runs = U.run_changes("0.98.0", "0.99.0")
    assert [r.conclusion.split(":")[0] for r in runs.rows] == ["refused"] and runs.note == ""
    assert runs.to_dict()["changed"][0]["run"] == "RUN frobnicate --all".removeprefix("RUN ")

    rep = _report(runs)
    for fmt in ("text", "markdown"):
        out = U.render(rep, fmt)
        assert "RUN lines of the 0.99.0 image build new or changed since 0.98.0" in out and "frobnicate" in out
    assert U.render(rep, "json").count('"runs"') == 1

    def missing(v, sha256=None, index=None):
        raise sdist.BadInput(f"no sdist of vllm {v} on the index")

    monkeypatch.setattr(sdist, "load", missing)
    gone = U.run_changes("0.98.0", "0.99.0")
    assert gone.rows == [] and "no sdist of vllm 0.98.0" in gone.note
    assert "not compared: no sdist" in U.render(_report(gone), "text")
    offline = U.run_changes("0.98.0", "0.99.0", offline=True)
    assert "not compared: --no-index" in U.render(_report(offline), "markdown")


def _report(runs: U.RunChanges) -> U.UpgradeReport:
    from builder.patching import port as PO

    return U.UpgradeReport(
        "0.98.0",
        "0.99.0",
        "a.json",
        "b.json",
        "shipped",
        [],
        PO.PortReport("vllm", "0.98.0", "0.99.0", []),
        U.LockStep(status="written"),
        runs=runs,
    )


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_no_row_reads_as_none_not_as_nothing_said(fmt):
    out = U.render(_report(U.RunChanges([])), fmt)
    assert "none: every RUN line of the target chain reads as it did" in out
