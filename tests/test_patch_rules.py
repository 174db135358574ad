"""The no-fuzz rule of builder/patches.py, pinned on tiny trees: a hunk applies only where
its old lines are byte-for-byte in the file at the line it names, and a zero-context hunk
(``diff -U0``) inserts exactly after the line it names."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from builder import patches as P
from builder.util import sha256_bytes

ORIG = "".join(f"line {i}\n" for i in range(1, 21))
HEADER = "Subject: t\nWhy: test\nApplies-To: vllm==0.26.0\nUpstream-Status: Inappropriate [test]\nRisk: none\n\n"


def series_for(tmp_path: Path, old: str, new: str, n: int) -> P.Series:
    d = tmp_path / "series"
    d.mkdir()
    diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/vllm/a.py", "b/vllm/a.py", n=n))
    (d / "0001-t.patch").write_text(HEADER + diff)
    (d / "series").write_text("0001-t.patch\n")
    (d / P.ORIG_SUMS).write_text(P.format_sums({"vllm/a.py": sha256_bytes(old.encode())}))
    return P.load_series(d, "0.26.0")


def tree_with(tmp_path: Path, text: str | bytes) -> Path:
    root = tmp_path / "site"
    (root / "vllm").mkdir(parents=True)
    data = text.encode() if isinstance(text, str) else text
    (root / "vllm" / "a.py").write_bytes(data)
    return root


def with_line(text: str, lineno: int, new: str) -> str:
    lines = text.splitlines(True)
    lines[lineno - 1] = new
    return "".join(lines)


@pytest.mark.parametrize("context_line", [
    "line 8   \n",      # trailing blanks on a context line
    "line 8\t\n",       # a trailing tab
    "line 8\r\n",       # CRLF on one line
])
def test_whitespace_in_context_is_not_fuzzed_away(tmp_path, context_line):
    patched = with_line(ORIG, 10, "line ten\n")
    s = series_for(tmp_path, ORIG, patched, n=3)           # context: lines 7-9 and 11-13
    ok = tree_with(tmp_path / "ok", ORIG)
    assert [r.status for r in P.check(s, ok)] == ["applied"]
    bad = tree_with(tmp_path / "bad", with_line(ORIG, 8, context_line))
    (r,) = P.check(s, bad, raise_on_failure=False)
    assert r.status == "does-not-apply" and "fuzz is refused" in r.detail


def test_whitespace_in_a_removed_line_is_not_fuzzed_away(tmp_path):
    s = series_for(tmp_path, ORIG, with_line(ORIG, 10, "line ten\n"), n=3)
    (r,) = P.check(s, tree_with(tmp_path / "t", with_line(ORIG, 10, "line 10 \n")), raise_on_failure=False)
    assert r.status == "does-not-apply"


@pytest.mark.parametrize("after", [0, 1, 2, 12, 20])
def test_zero_context_insertion_lands_after_the_named_line(tmp_path, after):
    # '@@ -N,0 +N+1 @@' means: insert after line N of the original (N = 0: before line 1)
    lines = ORIG.splitlines(True)
    want = "".join(lines[:after] + ["inserted\n"] + lines[after:])
    s = series_for(tmp_path, ORIG, want, n=0)
    (h,) = s.patches[0].files[0].hunks
    assert (h.source_start, h.source_length) == (after, 0)
    out = tmp_path / "out"
    P.apply_to_dir(s, tree_with(tmp_path, ORIG), out)
    assert (out / "vllm" / "a.py").read_text() == want


def test_zero_context_replacement_and_deletion(tmp_path):
    lines = ORIG.splitlines(True)
    want = "".join(lines[:4] + ["five\n", "five and a half\n"] + lines[5:14] + lines[15:])
    s = series_for(tmp_path, ORIG, want, n=0)
    out = tmp_path / "out"
    P.apply_to_dir(s, tree_with(tmp_path, ORIG), out)
    assert (out / "vllm" / "a.py").read_text() == want
