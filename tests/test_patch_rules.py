"""The rules of builder/patching/series.py one by one, pinned on tiny trees: the no-fuzz rule (a hunk
applies only where its old lines are byte-for-byte in the file at the line it names, and a
zero-context hunk (``diff -U0``) inserts exactly after the line it names), the series folder
and patch header format, what a file diff may name, and what each refusal names."""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder.errors import BadInput, PatchFailed
from builder.patching import series as P
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


@pytest.mark.parametrize(
    "context_line",
    [
        "line 8   \n",  # trailing blanks on a context line
        "line 8\t\n",  # a trailing tab
        "line 8\r\n",  # CRLF on one line
    ],
)
def test_whitespace_in_context_is_not_fuzzed_away(tmp_path, context_line):
    patched = with_line(ORIG, 10, "line ten\n")
    s = series_for(tmp_path, ORIG, patched, n=3)  # context: lines 7-9 and 11-13
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


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A patches root holding series for 0.9.0, 0.10.0 and 0.28.0 (and a dir that is not a series)."""
    root = tmp_path / "patches"
    for v in ("0.9.0", "0.10.0", "0.28.0"):
        (root / "vllm" / v).mkdir(parents=True)
        (root / "vllm" / v / "series").write_text("")
    (root / "vllm" / "0.27.0").mkdir()  # no series file: not a series
    monkeypatch.setattr(P, "patches_root", lambda: root)
    return root


def test_series_dir_for_lists_what_is_available(shipped):
    assert P.series_dir_for("0.10.0") == shipped / "vllm" / "0.10.0"
    with pytest.raises(
        BadInput,
        match=r"^no patch series for vllm 0\.27\.0 \(looked for .*/vllm/0\.27\.0/series\); "
        r"series available: 0\.10\.0, 0\.28\.0, 0\.9\.0\.$",
    ) as ei:
        P.series_dir_for("0.27.0")
    assert ei.value.hint.startswith("pass --series DIR for a series elsewhere")
    with pytest.raises(BadInput, match=r"series available: none\."):
        P.series_dir_for("0.27.0", package="other")


@pytest.mark.parametrize(
    "wanted, port_from",
    [
        ("0.29.0", "0.28.0"),  # the newest release below the wanted one (by version, not by name: 0.10 > 0.9)
        ("0.11.0", "0.10.0"),
        ("0.9.5", "0.9.0"),
        ("0.1.0", "0.28.0"),  # nothing older: the newest there is
        ("0.28", "0.10.0"),  # strictly older: 0.28.0 is this release (port refuses equal versions)
    ],
)
def test_require_series_names_the_series_to_port_from(shipped, wanted, port_from):
    assert P.require_series("0.28.0") == shipped / "vllm" / "0.28.0"
    with pytest.raises(
        PatchFailed,
        match=rf"^no patch series for vllm {re.escape(wanted)} yet .*Port the series of "
        rf"{re.escape(port_from)}: `build-image patch port --from "
        rf"{re.escape(port_from)} "
        rf"--to {re.escape(wanted)} -o patches/vllm/{re.escape(wanted)}` "
        r"\(review what it reports, docs/patches\.md\)\.$",
    ) as ei:
        P.require_series(wanted)
    assert ei.value.hint == (
        "or pass --series DIR for a series elsewhere, or --no-patches to build knowingly without patches."
    )


def test_require_series_passes_the_package_on(shipped):
    (shipped / "other" / "1.0").mkdir(parents=True)
    (shipped / "other" / "1.0" / "series").write_text("")
    assert P.require_series("1.0", package="other") == shipped / "other" / "1.0"
    with pytest.raises(
        PatchFailed,
        match=r"^no patch series for other 1\.1 yet .*Port the series of 1\.0: "
        r"`build-image patch port --from 1\.0 --to 1\.1 -o patches/other/1\.1`",
    ):
        P.require_series("1.1", package="other")


def test_require_series_counts_a_name_that_is_no_version_as_the_oldest(shipped):
    # a folder named "main" sorts as version 0: below every release, so 0.28.0 is still the newest below 0.29.0
    (shipped / "vllm" / "main").mkdir()
    (shipped / "vllm" / "main" / "series").write_text("")
    with pytest.raises(PatchFailed, match=r"Port the series of 0\.28\.0: `build-image patch port --from 0\.28\.0 "):
        P.require_series("0.29.0")
    # a wanted name that is no version is refused as bad input: no port command is built from it
    with pytest.raises(BadInput, match=r"--vllm 'nightly' is not a version \(like 0\.26\.0\)"):
        P.require_series("nightly")


def test_require_series_without_any_series(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "patches_root", lambda: tmp_path)
    with pytest.raises(PatchFailed, match=r"Port the series of <A>: `build-image patch port --from <A> --to 0\.30\.0"):
        P.require_series("0.30.0")


def series_of(tmp_path: Path, patches: dict[str, dict[str, tuple[str, str]]]) -> P.Series:
    """patches: name -> {relpath: (old text, new text)}, in series order."""
    d = tmp_path / "series"
    d.mkdir()
    sums = {}
    for name, files in patches.items():
        diff = "".join(
            "".join(difflib.unified_diff(o.splitlines(True), n.splitlines(True), f"a/{rel}", f"b/{rel}"))
            for rel, (o, n) in files.items()
        )
        (d / name).write_text(HEADER.replace("Subject: t", f"Subject: {name} subject") + diff)
        for rel, (o, _) in files.items():
            sums.setdefault(rel, sha256_bytes(o.encode()))
    (d / "series").write_text("".join(f"{n}\n" for n in patches))
    (d / P.ORIG_SUMS).write_text(P.format_sums(sums))
    return P.load_series(d, "0.26.0")


B = ORIG.replace("line", "row")


def two_file_tree(tmp_path: Path, a: str = ORIG, b: str = B) -> Path:
    root = tree_with(tmp_path, a)
    (root / "vllm" / "b.py").write_text(b)
    return root


def test_a_half_applied_patch_is_refused_naming_each_file(tmp_path):
    a2, b2 = with_line(ORIG, 10, "line ten\n"), with_line(B, 5, "row five\n")
    s = series_of(tmp_path, {"0001-two.patch": {"vllm/a.py": (ORIG, a2), "vllm/b.py": (B, b2)}})
    (r,) = P.check(s, two_file_tree(tmp_path / "fresh"))
    assert r.to_dict() == {
        "patch": "0001-two.patch",
        "subject": "0001-two.patch subject",
        "status": "applied",
        "files": ["vllm/a.py", "vllm/b.py"],
        "detail": "",
    }
    (r,) = P.check(s, two_file_tree(tmp_path / "done", a2, b2))
    assert (r.status, r.detail) == ("already-applied", "")
    (r,) = P.check(s, two_file_tree(tmp_path / "half", a2, B), raise_on_failure=False)
    assert r.status == "does-not-apply"
    assert r.detail == (
        "partly applied already (vllm/a.py: already-applied, vllm/b.py: applied); refusing a half-patched tree."
    )
    assert r.to_dict() == {
        "patch": "0001-two.patch",
        "subject": "0001-two.patch subject",
        "status": "does-not-apply",
        "files": ["vllm/a.py", "vllm/b.py"],
        "detail": r.detail,
    }


def test_a_missing_target_file_does_not_apply_and_later_patches_still_run(tmp_path):
    s = series_of(
        tmp_path,
        {
            "0001-b.patch": {"vllm/b.py": (B, with_line(B, 5, "row five\n"))},
            "0002-a.patch": {"vllm/a.py": (ORIG, with_line(ORIG, 10, "line ten\n"))},
        },
    )
    tree = tree_with(tmp_path, ORIG)  # holds a.py only
    res = P.check(s, tree, raise_on_failure=False)
    assert [(r.name, r.status) for r in res] == [("0001-b.patch", "does-not-apply"), ("0002-a.patch", "applied")]
    assert res[0].detail == f"vllm/b.py: no such file in {tree}."
    with pytest.raises(
        PatchFailed,
        match=rf"^1 of 2 patch\(es\) of series {re.escape(str(s.dir))} do not apply to "
        rf"{re.escape(str(tree))}: 0001-b\.patch\.$",
    ) as ei:
        P.check(s, tree)
    assert ei.value.hint == "port the patch to this vllm (exact context, no fuzz/offset) or remove it from the series."
    assert ei.value.details == f"--- 0001-b.patch: vllm/b.py: no such file in {tree}."
    assert [r.status for r in ei.value.results] == ["does-not-apply", "applied"]


def test_a_target_that_is_not_utf8_is_refused(tmp_path):
    s = series_for(tmp_path, ORIG, with_line(ORIG, 10, "line ten\n"), n=3)
    tree = tree_with(tmp_path, ORIG.encode() + b"\xff\xfe\n")
    with pytest.raises(PatchFailed, match=rf"^{re.escape(str(tree))}: vllm/a\.py is not UTF-8 text; refused\.$"):
        P.check(s, tree)


def test_an_offset_match_at_the_very_end_of_the_file_is_reported(tmp_path):
    # the hunk's old lines (last 4 lines of the original) sit 2 lines lower: reported as an offset
    s = series_for(tmp_path, ORIG, with_line(ORIG, 20, "line twenty\n"), n=3)
    (r,) = P.check(s, tree_with(tmp_path, "# one\n# two\n" + ORIG), raise_on_failure=False)
    assert r.status == "does-not-apply"
    assert "matches exactly at line(s) 19 (offset +2): offsets are refused" in r.detail


def test_already_applied_is_found_at_the_patched_line_numbers(tmp_path):
    # hunk 1 inserts 3 lines, so hunk 2 sits 3 lines lower in the patched file than in the original
    new = with_line(with_line(ORIG, 3, "line 3\nextra a\nextra b\nextra c\n"), 17, "line seventeen\n")
    s = series_for(tmp_path, ORIG, new, n=1)
    hunks = s.patches[0].files[0].hunks
    assert len(hunks) == 2 and hunks[1].target_start == hunks[1].source_start + 3
    (r,) = P.check(s, tree_with(tmp_path, new))
    assert r.status == "already-applied"


def test_apply_site_packages_reports_both_sums_keeps_the_mode_and_lists_them(tmp_path):
    new = with_line(ORIG, 10, "line ten\n")
    s = series_for(tmp_path, ORIG, new, n=3)
    tree = tree_with(tmp_path, ORIG)
    target = tree / "vllm" / "a.py"
    target.chmod(0o640)
    (f,) = P.apply_site_packages(s, tree)
    assert (f.relpath, f.original_sha256, f.patched_sha256) == (
        "vllm/a.py",
        sha256_bytes(ORIG.encode()),
        sha256_bytes(new.encode()),
    )
    assert target.read_text() == new and (target.stat().st_mode & 0o777) == 0o640
    assert P.sha256_list([f]) == f"{sha256_bytes(new.encode())}  vllm/a.py\n"
    assert P.sha256_list([f], "original") == f"{sha256_bytes(ORIG.encode())}  vllm/a.py\n"
    (again,) = P.apply_site_packages(s, tree)  # patched by this very series: left as is
    assert (again.original_sha256, again.patched_sha256) == (f.original_sha256, f.patched_sha256)
    assert target.read_text() == new


def test_apply_site_packages_refusals_are_named(tmp_path):
    s = series_for(tmp_path, ORIG, with_line(ORIG, 10, "line ten\n"), n=3)
    with pytest.raises(BadInput, match=rf"^--site-packages {re.escape(str(tmp_path / 'nope'))}: not a directory\.$"):
        P.apply_site_packages(s, tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        PatchFailed,
        match=rf"^{re.escape(str(empty))}: target file\(s\) missing: vllm/a\.py; "
        r"is vllm installed there\?$",
    ):
        P.apply_site_packages(s, empty)
    (s.dir / P.ORIG_SUMS).write_text("")
    bare = P.load_series(s.dir, "0.26.0")
    with pytest.raises(
        PatchFailed,
        match=rf"^series {re.escape(str(s.dir))} records no original sha256 for vllm/a\.py; "
        r"in-place patching needs them to refuse a different base\.$",
    ) as ei:
        P.apply_site_packages(bare, tree_with(tmp_path, ORIG))
    assert ei.value.hint == (
        f"generate {P.ORIG_SUMS} with `build-image patch sums --series {s.dir} --wheel <the wheel>`."
    )


def test_apply_site_packages_puts_every_original_back_when_a_write_fails(tmp_path, monkeypatch):
    a2, b2 = with_line(ORIG, 10, "line ten\n"), with_line(B, 5, "row five\n")
    s = series_of(tmp_path, {"0001-two.patch": {"vllm/a.py": (ORIG, a2), "vllm/b.py": (B, b2)}})
    tree = two_file_tree(tmp_path)
    real, calls = P.atomic_write_bytes, []

    def failing_second(path, data, *mode):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(path, data, *mode)

    monkeypatch.setattr(P, "atomic_write_bytes", failing_second)
    with pytest.raises(OSError, match="disk full"):
        P.apply_site_packages(s, tree)
    assert (tree / "vllm" / "a.py").read_text() == ORIG and (tree / "vllm" / "b.py").read_text() == B
    assert calls[2] == tree / "vllm" / "a.py"  # the rollback rewrote the one already written


def test_a_source_that_is_neither_a_wheel_nor_a_directory(tmp_path):
    s = series_for(tmp_path, ORIG, with_line(ORIG, 10, "line ten\n"), n=3)
    (tmp_path / "plain.txt").write_text("not a zip")
    with pytest.raises(
        BadInput,
        match=rf"^patch source {re.escape(str(tmp_path / 'plain.txt'))} is neither a wheel "
        r"\(zip\) nor a directory\.$",
    ):
        P.check(s, tmp_path / "plain.txt")


def test_apply_to_dir_lists_each_file_that_differs_from_the_originals(tmp_path):
    s = series_for(tmp_path, ORIG, with_line(ORIG, 10, "line ten\n"), n=3)
    tree = tree_with(tmp_path, with_line(ORIG, 1, "line one\n"))
    with pytest.raises(PatchFailed, match="refusing to patch") as ei:
        P.apply_to_dir(s, tree, tmp_path / "out")
    assert "vllm/a.py" in ei.value.details and not (tmp_path / "out" / "vllm" / "a.py").exists()


# ---------------------------------------------------------------- the diff format, line by line


def series_text(tmp_path: Path, diff: str) -> P.Series:
    d = tmp_path / "series"
    d.mkdir(exist_ok=True)
    (d / "0001-t.patch").write_text(HEADER + diff)
    (d / "series").write_text("0001-t.patch\n")
    return P.load_series(d, "0.26.0")


NONL = "\\ No newline at end of file\n"
HUNK = "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1,3 +1,3 @@\n"


@pytest.mark.parametrize(
    "old, body, new",
    [
        ("a\nb\nc", " a\n b\n-c\n" + NONL + "+C\n" + NONL, "a\nb\nC"),  # last line changed, still no newline
        ("a\nb\nc", " a\n b\n-c\n" + NONL + "+c\n", "a\nb\nc\n"),  # a newline added at the end
        ("a\nb\nc\n", " a\n b\n-c\n+c\n" + NONL, "a\nb\nc"),  # the final newline removed
        ("a\nb\nc", " a\n-b\n+B\n c\n" + NONL, "a\nB\nc"),  # unchanged last line without newline
        # the marker takes away the newline only: trailing blanks and letters of that last line stay
        ("a\nb\nc  ", " a\n-b\n+B\n c  \n" + NONL, "a\nB\nc  "),
        ("a\nb\nMAX", " a\n-b\n+B\n MAX\n" + NONL, "a\nB\nMAX"),
        ("a\nb\nc", " a\n b\n-c\n" + NONL + "+c X\n" + NONL, "a\nb\nc X"),
    ],
)
def test_no_newline_at_end_of_file_is_exact_both_ways(tmp_path, old, body, new):
    s = series_text(tmp_path, HUNK + body)
    out = tmp_path / "out"
    P.apply_to_dir(s, tree_with(tmp_path, old), out)
    assert (out / "vllm" / "a.py").read_bytes() == new.encode()
    (r,) = P.check(s, tree_with(tmp_path / "done", new))
    assert r.status == "already-applied"
    # the same lines with the other ending are another file: no fuzz on the final newline
    other = old[:-1] if old.endswith("\n") else old + "\n"
    (r,) = P.check(s, tree_with(tmp_path / "other", other), raise_on_failure=False)
    assert r.status == ("already-applied" if other == new else "does-not-apply")


@pytest.mark.parametrize(
    "line, why",
    [
        ("similarity index 90%", r"renames/copies are refused \('similarity index 90%'\)"),
        ("rename from vllm/a.py", r"renames/copies are refused \('rename from vllm/a\.py'\)"),
        ("rename to vllm/b.py", r"renames/copies are refused \('rename to vllm/b\.py'\)"),
        ("copy from vllm/a.py", r"renames/copies are refused \('copy from vllm/a\.py'\)"),
        ("copy to vllm/b.py", r"renames/copies are refused \('copy to vllm/b\.py'\)"),
        ("Rename From vllm/a.py", r"renames/copies are refused"),
        ("new file mode 100644", r"file creation/deletion/mode changes are refused \('new file mode 100644'\)"),
        ("deleted file mode 100644", r"file creation/deletion/mode changes are refused \('deleted file mode 100644'\)"),
        ("old mode 100644", r"file creation/deletion/mode changes are refused \('old mode 100644'\)"),
        ("new mode 100755", r"file creation/deletion/mode changes are refused \('new mode 100755'\)"),
        ("new file mode 120000", r"symlink in the diff refused \('new file mode 120000'\)"),
        ("GIT binary patch", r"binary diffs are refused"),
        ("Binary files a/vllm/x.so and b/vllm/x.so differ", r"binary diffs are refused"),
    ],
)
def test_every_git_extended_header_that_is_not_a_plain_edit_is_refused(tmp_path, line, why):
    diff = f"diff --git a/vllm/a.py b/vllm/a.py\n{line}\n" + HUNK + " a\n-b\n+B\n c\n"
    with pytest.raises(PatchFailed, match=rf"^patch 0001-t\.patch: {why}"):
        series_text(tmp_path, diff)


@pytest.mark.parametrize(
    "diff, exc, why",
    [
        ("@@ -1 +1 @@\n-x\n+y\n", BadInput, r"^patch 0001-t\.patch: holds no diff after its header\.$"),
        (
            "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1,3 +1,3 @@\n a\n",
            BadInput,
            r"^patch 0001-t\.patch: not a valid unified diff",
        ),
        (
            "--- a/vllm/a.py\n+++ b/vllm/../etc/x\n@@ -1 +1 @@\n-x\n+y\n",
            PatchFailed,
            r"^patch 0001-t\.patch: path 'b/vllm/\.\./etc/x' contains '\.\.' or a backslash; refused\.$",
        ),
        ("--- a/vllm\\a.py\n+++ b/vllm\\a.py\n@@ -1 +1 @@\n-x\n+y\n", PatchFailed, r"contains '\.\.' or a backslash"),
        (
            "--- a/other/a.py\n+++ b/other/a.py\n@@ -1 +1 @@\n-x\n+y\n",
            PatchFailed,
            r"^patch 0001-t\.patch: path 'a/other/a\.py' is outside the vllm/ package; refused\.$",
        ),
        ("--- a/vllm\n+++ b/vllm\n@@ -1 +1 @@\n-x\n+y\n", PatchFailed, r"path 'a/vllm' is outside the vllm/ package"),
        ("--- /vllm/a.py\n+++ /vllm/a.py\n@@ -1 +1 @@\n-x\n+y\n", PatchFailed, r"absolute path '/vllm/a\.py' refused"),
    ],
)
def test_malformed_or_escaping_diffs_are_refused(tmp_path, diff, exc, why):
    with pytest.raises(exc, match=why):
        series_text(tmp_path, diff)


def test_paths_with_timestamps_or_without_prefix_are_the_package_file(tmp_path):
    s = series_text(
        tmp_path,
        "--- vllm/a.py\t2026-01-01 00:00:00\n+++ vllm/a.py\t2026-01-02 00:00:00\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n",
    )
    assert s.targets == ["vllm/a.py"]
    out = tmp_path / "out"
    P.apply_to_dir(s, tree_with(tmp_path, "a\nb\nc\n"), out)
    assert (out / "vllm" / "a.py").read_text() == "a\nB\nc\n"


def test_recorded_sums_file_skips_comments_and_names_a_bad_line(tmp_path):
    s = series_for(tmp_path, ORIG, with_line(ORIG, 10, "line ten\n"), n=3)
    sha = sha256_bytes(ORIG.encode())
    (s.dir / P.ORIG_SUMS).write_text(f"# made by patch sums\n\n{sha} *vllm/a.py\n")
    assert P.load_series(s.dir, "0.26.0").originals == {"vllm/a.py": sha}
    (s.dir / P.ORIG_SUMS).write_text(f"# made by patch sums\n{sha}  vllm/a.py\nnot a sum line\n")
    with pytest.raises(
        BadInput,
        match=rf"^{re.escape(str(s.dir / P.ORIG_SUMS))}, line 3: expected '<sha256>  <path>' "
        r"\(sha256sum format\), got 'not a sum line'\.$",
    ):
        P.load_series(s.dir, "0.26.0")


# ---------------------------------------------------------------- the series folder and the patch header

EDIT = "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"


def write(d: Path, files: dict[str, str | bytes], series: str | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    (d / "series").write_text(series if series is not None else "".join(f"{n}\n" for n in files))
    return d


def test_header_fields_continue_on_indented_lines_and_free_text_is_allowed(tmp_path):
    text = (
        "Subject: fix the loader\nWhy: the checkpoint names\n  its table differently\n\tand twice\n"
        "Applies-To: vllm==0.26.0\nUpstream-Status: Pending\nRisk: low\n\n"
        "  an indented note after a blank line is not a continuation\nFree text before the diff.\n" + EDIT
    )
    (p,) = P.load_series(write(tmp_path / "s", {"0001.patch": text})).patches
    assert p.headers["Why"] == "the checkpoint names its table differently and twice"
    assert p.headers["Risk"] == "low" and p.subject == "fix the loader"
    assert [f.relpath for f in p.files] == ["vllm/a.py"]
    svn = HEADER + "Index: vllm/a.py\n===================================================================\n" + EDIT
    (p,) = P.load_series(write(tmp_path / "svn", {"0001.patch": svn})).patches
    # "Index:" starts the diff (svn's format): it is not one more header field
    assert p.headers == {
        "Subject": "t",
        "Why": "test",
        "Applies-To": "vllm==0.26.0",
        "Upstream-Status": "Inappropriate [test]",
        "Risk": "none",
    }
    assert [f.relpath for f in p.files] == ["vllm/a.py"]


def test_header_lines_are_fields_only_where_they_look_like_one(tmp_path):
    # an indented line continues the field above it, never free text nor the start of the file;
    # a field's value keeps everything but the line ending; "X-" fields are fields of their own
    text = (
        "  a note before any field\n"
        "Subject: read the shard index of model X\nX-Tracker: PR 1234\nWhy: test\n"
        "Applies-To: vllm==0.26.0\nUpstream-Status: Pending\r\nRisk: none\n"
        "Free text, then\n  an indented line after it\n" + EDIT
    )
    (p,) = P.load_series(write(tmp_path / "s", {"0001.patch": text})).patches
    assert p.headers == {
        "Subject": "read the shard index of model X",
        "X-Tracker": "PR 1234",
        "Why": "test",
        "Applies-To": "vllm==0.26.0",
        "Upstream-Status": "Pending",
        "Risk": "none",
    }


def test_a_header_field_left_empty_is_missing(tmp_path):
    text = HEADER.replace("Risk: none", "Risk:") + EDIT
    path = tmp_path / "s" / "0001.patch"
    with pytest.raises(
        BadInput,
        match=rf"^patch {re.escape(str(path))}: header field\(s\) Risk missing or empty "
        r"\(every patch starts with Subject, Why, Applies-To, "
        r"Upstream-Status, Risk\)\.$",
    ):
        P.load_series(write(tmp_path / "s", {"0001.patch": text}))
    with pytest.raises(
        BadInput,
        match=r"^patch 0002-x\.patch: header field\(s\) Why, Applies-To, Upstream-Status, Risk "
        r"missing or empty ",
    ):
        P.parse_patch("Subject: x\n\n" + EDIT, "0002-x.patch", "vllm")


def test_the_series_file_lists_names_with_comments(tmp_path):
    d = write(
        tmp_path / "s",
        {"0001.patch": HEADER + EDIT, "0002.patch": HEADER + EDIT.replace("B", "b2").replace("-b", "-B")},
        series="# the series\n0001.patch  # first # of two\n\n0002.patch\n",
    )
    s = P.load_series(d, "0.26.0")
    assert [p.name for p in s.patches] == ["0001.patch", "0002.patch"]
    assert (s.package, s.version) == ("vllm", "0.26.0")
    (d / P.WHEEL_SUM).write_text("ab" * 32 + "  vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl\n")
    s = P.load_series(d, "0.26.0")
    assert (s.wheel_filename, s.wheel_sha256) == ("vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl", "ab" * 32)


@pytest.mark.parametrize(
    "files, series, why",
    [
        (
            {"0001.patch": HEADER + EDIT},
            "sub/0001.patch\n",
            r"series: lists 'sub/0001\.patch', which is not a file in ",
        ),
        ({"0001.patch": HEADER + EDIT}, "0002.patch\n", r"series: lists '0002\.patch', which is not a file in "),
        ({"0001.patch": HEADER + EDIT}, "..\n", r"series: lists '\.\.', which is not a file in "),
        ({"0001.patch": HEADER + EDIT}, ".\n", r"series: lists '\.', which is not a file in "),
        ({"0001.patch": HEADER + EDIT}, "# nothing\n\n", r"series lists no patches\.$"),
        ({"0001.patch": (HEADER + EDIT).encode() + b"\xff"}, None, r"^patch .*0001\.patch is not UTF-8 text\.$"),
        (
            {"0001.patch": HEADER.replace("vllm==0.26.0", "vllm 0.26.0") + EDIT},
            None,
            r"0001\.patch: 'Applies-To' must read '<package>==<version>', got 'vllm 0\.26\.0'\.$",
        ),
        (
            {"0001.patch": HEADER + EDIT, "0002.patch": HEADER.replace("0.26.0", "0.27.0") + EDIT},
            None,
            r"mixes Applies-To values: 0001\.patch: vllm==0\.26\.0, 0002\.patch: vllm==0\.27\.0\.$",
        ),
    ],
)
def test_series_folder_problems_are_named(tmp_path, files, series, why):
    with pytest.raises(BadInput, match=why):
        P.load_series(write(tmp_path / "s", files, series))


def test_a_folder_without_a_series_file_is_not_a_series(tmp_path):
    with pytest.raises(
        BadInput, match=rf"^{re.escape(str(tmp_path))} is not a patch series: it has no 'series' file\.$"
    ):
        P.load_series(tmp_path)


def test_a_series_for_another_version_says_how_to_port_it(tmp_path):
    d = write(tmp_path / "s", {"0001.patch": HEADER + EDIT})
    with pytest.raises(
        BadInput,
        match=r"is for vllm==0\.26\.0 \(its patches' Applies-To\), not vllm==0\.27\.0; "
        r"a series is never applied to another version\.$",
    ) as ei:
        P.load_series(d, "0.27.0")
    assert ei.value.hint == "port the patches into patches/vllm/0.27.0/ and check them against that wheel."


def test_a_series_entry_must_be_a_file_of_the_series_folder_itself(tmp_path):
    d = write(tmp_path / "s", {"0001.patch": HEADER + EDIT}, series="sub/0001.patch\n")
    (d / "sub").mkdir()
    (d / "sub" / "0001.patch").write_text(HEADER + EDIT)  # a file, but one folder down
    with pytest.raises(
        BadInput,
        match=rf"^{re.escape(str(d / 'series'))}: lists 'sub/0001\.patch', which is not a "
        rf"file in {re.escape(str(d))}\.$",
    ):
        P.load_series(d)


def test_symlinks_in_the_series_folder_are_refused_naming_them(tmp_path):
    d = write(tmp_path / "s", {"0001.patch": HEADER + EDIT})
    elsewhere = tmp_path / "elsewhere.patch"
    elsewhere.write_text(HEADER + EDIT)
    (d / "0001.patch").unlink()
    (d / "0001.patch").symlink_to(elsewhere)
    with pytest.raises(
        PatchFailed,
        match=rf"^patch {re.escape(str(d / '0001.patch'))} is a symlink \(to "
        rf"{re.escape(str(elsewhere))}\); a series' patches must be regular files in "
        r"the series directory \(refused, like a symlink in a patch\)\.$",
    ):
        P.load_series(d)
    listing = tmp_path / "listing"
    listing.write_text("0001.patch\n")
    (d / "series").unlink()
    (d / "series").symlink_to(listing)
    with pytest.raises(
        PatchFailed,
        match=rf"^{re.escape(str(d / 'series'))} is a symlink; a series' files must be "
        rf"regular files in {re.escape(str(d))} \(refused, like a symlink in "
        r"a patch\)\.$",
    ):
        P.load_series(d)


# ---------------------------------------------------------------- what a file diff may name


@pytest.mark.parametrize(
    "spelled, relpath",
    [
        # the name runs to the end of the line (or to the tab before a timestamp), blanks included
        ("vllm/my file.py", "vllm/my file.py"),
        # empty and "." components name no folder
        ("vllm//a.py", "vllm/a.py"),
        ("vllm/./a.py", "vllm/a.py"),
    ],
)
def test_how_a_path_is_read(tmp_path, spelled, relpath):
    s = series_text(tmp_path, EDIT.replace("vllm/a.py", spelled))
    assert s.targets == [relpath]


@pytest.mark.parametrize(
    "diff, why",
    [
        # both header lines must spell the same path: the tool does not guess that two spellings are one file
        ("--- vllm/a.py\n+++ b/vllm/a.py\n", r"renames are refused \(vllm/a\.py -> b/vllm/a\.py\)\.$"),
        ("--- a/vllm/a.py\n+++ b/vllm/./a.py\n", r"renames are refused \(a/vllm/a\.py -> b/vllm/\./a\.py\)\.$"),
        ("--- a/vllm/a.py\n+++ b/vllm/b.py\n", r"renames are refused \(a/vllm/a\.py -> b/vllm/b\.py\)\.$"),
        # a symlink whose target changes: git marks it only by the mode on its index line
        (
            "diff --git a/vllm/l b/vllm/l\nindex 1234567..89abcde 120000\n--- a/vllm/l\n+++ b/vllm/l\n",
            r"binary or symlink diff for 'vllm/l' refused\.$",
        ),
    ],
)
def test_renamed_and_symlinked_files_are_refused(tmp_path, diff, why):
    with pytest.raises(PatchFailed, match=rf"^patch 0001-t\.patch: {why}"):
        series_text(tmp_path, diff + "@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n")


def test_one_file_named_twice_is_refused(tmp_path):
    with pytest.raises(
        BadInput,
        match=r"^patch 0001-t\.patch: names the same file twice; merge its hunks into one "
        r"file diff\.$",
    ):
        series_text(tmp_path, EDIT + EDIT.replace("-1,3 +1,3", "-5,3 +5,3"))


# ---------------------------------------------------------------- what a refusal names


def test_an_offset_report_lists_at_most_five_places(tmp_path):
    # the hunk replaces line 1 ("dup"); in the tree "dup" is on lines 2 to 8 instead
    old = "dup\n" + ORIG
    s = series_for(tmp_path, old, with_line(old, 1, "DUP\n"), n=0)
    (r,) = P.check(s, tree_with(tmp_path, "other\n" + "dup\n" * 7 + ORIG), raise_on_failure=False)
    assert r.detail.startswith(
        "vllm/a.py: hunk #1 does not match at line 1; it matches exactly at line(s) "
        "2, 3, 4, 5, 6 (offset +1): offsets are refused.\n"
    )


def failing_three(tmp_path: Path) -> tuple[P.Series, Path]:
    """A series of three one-file patches of which the first and the last do not apply to the tree."""
    c = ORIG.replace("line", "col")
    s = series_of(
        tmp_path,
        {
            "0001-b.patch": {"vllm/b.py": (B, with_line(B, 5, "row five\n"))},
            "0002-a.patch": {"vllm/a.py": (ORIG, with_line(ORIG, 10, "line ten\n"))},
            "0003-c.patch": {"vllm/c.py": (c, with_line(c, 3, "col three\n"))},
        },
    )
    return s, tree_with(tmp_path, ORIG)  # a.py only


def test_every_patch_that_does_not_apply_is_named(tmp_path):
    s, tree = failing_three(tmp_path)
    with pytest.raises(
        PatchFailed,
        match=rf"^2 of 3 patch\(es\) of series {re.escape(str(s.dir))} do not apply to "
        rf"{re.escape(str(tree))}: 0001-b\.patch, 0003-c\.patch\.$",
    ) as ei:
        P.check(s, tree)
    assert ei.value.details == (
        f"--- 0001-b.patch: vllm/b.py: no such file in {tree}.\n--- 0003-c.patch: vllm/c.py: no such file in {tree}."
    )
    out = tmp_path / "out"
    with pytest.raises(
        PatchFailed,
        match=rf"^2 of 3 patch\(es\) of series {re.escape(str(s.dir))} do not apply to "
        rf"{re.escape(str(tree))}: 0001-b\.patch, 0003-c\.patch\.$",
    ):
        P.apply_to_dir(s, tree, out)
    assert not out.exists()


def test_apply_to_dir_names_each_target_that_differs_from_the_originals(tmp_path):
    a2, b2 = with_line(ORIG, 10, "line ten\n"), with_line(B, 5, "row five\n")
    s = series_of(tmp_path, {"0001-two.patch": {"vllm/a.py": (ORIG, a2), "vllm/b.py": (B, b2)}})
    a, b = with_line(ORIG, 1, "line one\n"), with_line(B, 20, "row twenty\n")  # the patch still applies to both
    tree = two_file_tree(tmp_path, a, b)
    with pytest.raises(
        PatchFailed,
        match=rf"^{re.escape(str(tree))}: target files differ from the vllm 0\.26\.0 "
        r"originals; refusing to patch\.$",
    ) as ei:
        P.apply_to_dir(s, tree, tmp_path / "out")
    assert ei.value.details == (
        f"vllm/a.py: sha256 {sha256_bytes(a.encode())}, the series was made for {sha256_bytes(ORIG.encode())}\n"
        f"vllm/b.py: sha256 {sha256_bytes(b.encode())}, the series was made for {sha256_bytes(B.encode())}"
    )
    assert not (tmp_path / "out").exists()


def test_apply_site_packages_names_every_file_it_cannot_check(tmp_path):
    a2, b2 = with_line(ORIG, 10, "line ten\n"), with_line(B, 5, "row five\n")
    s = series_of(tmp_path, {"0001-two.patch": {"vllm/a.py": (ORIG, a2), "vllm/b.py": (B, b2)}})
    empty = tmp_path / "empty"
    (empty / "vllm").mkdir(parents=True)
    with pytest.raises(
        PatchFailed,
        match=rf"^{re.escape(str(empty))}: target file\(s\) missing: vllm/a\.py, vllm/b\.py; "
        r"is vllm installed there\?$",
    ):
        P.apply_site_packages(s, empty)
    (s.dir / P.ORIG_SUMS).write_text("")
    with pytest.raises(PatchFailed, match=r"records no original sha256 for vllm/a\.py, vllm/b\.py; "):
        P.apply_site_packages(P.load_series(s.dir, "0.26.0"), two_file_tree(tmp_path))


def test_apply_site_packages_refuses_another_base_naming_each_file(tmp_path):
    a2, b2 = with_line(ORIG, 10, "line ten\n"), with_line(B, 5, "row five\n")
    s = series_of(tmp_path, {"0001-two.patch": {"vllm/a.py": (ORIG, a2), "vllm/b.py": (B, b2)}})
    a, b = with_line(ORIG, 1, "line one\n"), with_line(B, 20, "row twenty\n")
    tree = two_file_tree(tmp_path, a, b)
    with pytest.raises(
        PatchFailed,
        match=rf"^{re.escape(str(tree))}: 2 target file\(s\) differ from the vllm 0\.26\.0 "
        r"wheel's originals; this is not the vllm the series was made for\. "
        r"Nothing was changed\.$",
    ) as ei:
        P.apply_site_packages(s, tree)
    assert ei.value.details == (
        f"vllm/a.py: sha256 {sha256_bytes(a.encode())}, the series was made for {sha256_bytes(ORIG.encode())}\n"
        f"vllm/b.py: sha256 {sha256_bytes(b.encode())}, the series was made for {sha256_bytes(B.encode())}"
    )
    assert (tree / "vllm" / "a.py").read_text() == a and (tree / "vllm" / "b.py").read_text() == b


def test_apply_site_packages_refuses_a_patched_tree_changed_elsewhere_naming_each_file(tmp_path):
    a2, b2 = with_line(ORIG, 10, "line ten\n"), with_line(B, 5, "row five\n")
    s = series_of(tmp_path, {"0001-two.patch": {"vllm/a.py": (ORIG, a2), "vllm/b.py": (B, b2)}})
    tree = two_file_tree(tmp_path, with_line(a2, 1, "line one\n"), with_line(b2, 20, "row twenty\n"))
    with pytest.raises(
        PatchFailed,
        match=rf"^{re.escape(str(tree))}: the series looks applied already, but reverting it "
        r"does not give the vllm 0\.26\.0 wheel's originals",
    ) as ei:
        P.apply_site_packages(s, tree)
    # reverting the patch gives the originals with the other change still in them
    a_back, b_back = with_line(ORIG, 1, "line one\n"), with_line(B, 20, "row twenty\n")
    assert ei.value.details == (
        f"vllm/a.py: sha256 {sha256_bytes(a_back.encode())}, the series was made for {sha256_bytes(ORIG.encode())}\n"
        f"vllm/b.py: sha256 {sha256_bytes(b_back.encode())}, the series was made for {sha256_bytes(B.encode())}"
    )


def test_apply_site_packages_refuses_a_tree_that_looks_patched_but_does_not_revert(tmp_path):
    # 0001 edits line 10 (hunk on lines 7-13); 0002, made on top of it, inserts a line after line 2.
    # The tree is the patched file without its line 7 ("line 6"): each patch finds its new lines where it names them,
    # yet undoing 0002 moves 0001's lines one up, so the series cannot be undone.
    a1 = with_line(ORIG, 10, "line ten\n")
    a2 = with_line(a1, 2, "line 2\nextra\n")
    s = series_of(tmp_path, {"0001-a.patch": {"vllm/a.py": (ORIG, a1)}, "0002-a.patch": {"vllm/a.py": (a1, a2)}})
    lines = a2.splitlines(True)
    tree = tree_with(tmp_path, "".join(lines[:6] + lines[7:]))
    assert [r.status for r in P.check(s, tree)] == ["already-applied", "already-applied"]
    with pytest.raises(
        PatchFailed,
        match=rf"^{re.escape(str(tree))}: the series looks applied already, but reverting it "
        r"does not give the vllm 0\.26\.0 wheel's originals: the files were changed "
        r"beyond this series\. Nothing was changed\.$",
    ) as ei:
        P.apply_site_packages(s, tree)
    assert ei.value.details == "the series does not revert"


def test_apply_site_packages_refuses_the_right_base_when_a_patch_does_not_apply(tmp_path):
    s = series_for(tmp_path, ORIG, with_line(ORIG, 10, "line ten\n"), n=3)
    base = with_line(ORIG, 9, "line nine\n")  # the series' recorded original, but not what it patches
    (s.dir / P.ORIG_SUMS).write_text(P.format_sums({"vllm/a.py": sha256_bytes(base.encode())}))
    s = P.load_series(s.dir, "0.26.0")
    tree = tree_with(tmp_path, base)
    with pytest.raises(
        PatchFailed,
        match=rf"^1 of 1 patch\(es\) of series {re.escape(str(s.dir))} do not apply to "
        rf"{re.escape(str(tree))}: 0001-t\.patch\.$",
    ):
        P.apply_site_packages(s, tree)
    assert (tree / "vllm" / "a.py").read_text() == base


# ---------------------------------------------------------------- sha256sums.orig


def test_original_sums_are_the_sha256_of_each_target_as_found(tmp_path):
    a2, b2 = with_line(ORIG, 10, "line ten\n"), with_line(B, 5, "row five\n")
    s = series_of(tmp_path, {"0001-two.patch": {"vllm/a.py": (ORIG, a2), "vllm/b.py": (B, b2)}})
    want = {"vllm/a.py": sha256_bytes(ORIG.encode()), "vllm/b.py": sha256_bytes(B.encode())}
    assert P.original_sums(s, two_file_tree(tmp_path)) == want
    wheel = tmp_path / "vllm-0.26.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/a.py", ORIG)
        z.writestr("vllm/b.py", B)
    assert P.original_sums(s, wheel) == want
    tree = tree_with(tmp_path / "one", ORIG)
    with pytest.raises(
        PatchFailed,
        match=rf"^{re.escape(str(tree))}: vllm/b\.py \(a target of the series\) does not "
        r"exist\.$",
    ):
        P.original_sums(s, tree)


def test_series_files_are_read_as_utf8_whatever_the_locale(tmp_path):
    # an ASCII locale with Python's UTF-8 mode off: a reader that used the locale's codec would fail here
    why = "the checkpoint’s table — renamed"
    sha = sha256_bytes(b"a\nb\nc\n")
    d = write(
        tmp_path / "s",
        {"0001.patch": HEADER.replace("Why: test", f"Why: {why}") + EDIT},
        series="# série\n0001.patch\n",
    )
    (d / P.ORIG_SUMS).write_text(f"# sommes d’origine\n{sha}  vllm/a.py\n", encoding="utf-8")
    s = P.load_series(d, "0.26.0")
    assert (s.patches[0].headers["Why"], s.originals) == (why, {"vllm/a.py": sha})
    code = (
        "import json, sys; from builder.patching import series as P; s = P.load_series(sys.argv[1], '0.26.0'); "
        "print(json.dumps([s.patches[0].headers['Why'], s.originals]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHON"))}
    env |= {
        "LC_ALL": "C",
        "PYTHONUTF8": "0",
        "PYTHONCOERCECLOCALE": "0",
        "PYTHONPATH": str(Path(P.__file__).parents[2]),
    }
    r = subprocess.run([sys.executable, "-c", code, str(d)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [why, {"vllm/a.py": sha}]


@pytest.mark.parametrize(
    "hunk",
    [
        "@@ -30,0 +31,1 @@\n+inserted\n",  # insert after line 30
        "@@ -21,0 +22,1 @@\n+inserted\n",  # insert after line 21: one past the last line
    ],
)
def test_a_zero_context_insertion_past_the_end_of_the_file_does_not_apply(tmp_path, hunk):
    # the file has 20 lines: there is no line 21 or 30 to insert after (appending is '@@ -20,0 +21 @@')
    s = series_text(tmp_path, "--- a/vllm/a.py\n+++ b/vllm/a.py\n" + hunk)
    start = int(hunk.split()[1].split(",")[0][1:])
    (r,) = P.check(s, tree_with(tmp_path, ORIG), raise_on_failure=False)
    assert r.status == "does-not-apply"
    assert r.detail == f"vllm/a.py: hunk #1 names line {start}, past the end of the file (20 lines).\n{hunk}"
    (tmp_path / "end").mkdir()
    appended = series_text(tmp_path / "end", "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -20,0 +21 @@\n+inserted\n")
    out = tmp_path / "out"
    P.apply_to_dir(appended, tree_with(tmp_path / "end", ORIG), out)
    assert (out / "vllm" / "a.py").read_text() == ORIG + "inserted\n"


def test_a_zero_context_deletion_past_the_end_of_the_file_is_not_already_applied(tmp_path):
    # deleting line 30 of a 20-line file: neither applicable nor "already applied" (it is undone past the end)
    s = series_text(tmp_path, "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -30 +29,0 @@\n-line 30\n")
    (r,) = P.check(s, tree_with(tmp_path, ORIG), raise_on_failure=False)
    assert (r.status, r.detail.splitlines()[0]) == (
        "does-not-apply",
        "vllm/a.py: hunk #1 does not match at line 30 (nor anywhere else: fuzz is refused).",
    )


def test_a_series_whose_later_patch_moves_an_earlier_ones_lines_is_found_applied(tmp_path):
    # 0001 edits line 10; 0002, made on top of it, inserts a line after line 2: in the fully patched
    # file 0001's new line is at line 11, not where 0001 names it, so patch by patch 0001 looks unapplied.
    a1 = with_line(ORIG, 10, "line ten\n")
    a2 = with_line(a1, 2, "line 2\nextra\n")
    s = series_of(tmp_path, {"0001-a.patch": {"vllm/a.py": (ORIG, a1)}, "0002-a.patch": {"vllm/a.py": (a1, a2)}})
    patched = tree_with(tmp_path, a2)
    assert [(r.name, r.subject, r.status, r.files, r.detail) for r in P.check(s, patched)] == [
        ("0001-a.patch", "0001-a.patch subject", "already-applied", ["vllm/a.py"], ""),
        ("0002-a.patch", "0002-a.patch subject", "already-applied", ["vllm/a.py"], ""),
    ]
    # in place: left as it is, reported with the original and the present sums
    done = P.apply_site_packages(s, patched)
    assert [(f.relpath, f.original_sha256, f.patched_sha256) for f in done] == [
        ("vllm/a.py", sha256_bytes(ORIG.encode()), sha256_bytes(a2.encode()))
    ]
    assert (patched / "vllm" / "a.py").read_text() == a2
    # the unpatched file still applies, to exactly a2
    (patched / "vllm" / "a.py").write_text(ORIG)
    assert [r.status for r in P.check(s, patched)] == ["applied", "applied"]
    P.apply_site_packages(s, patched)
    assert (patched / "vllm" / "a.py").read_text() == a2
    # a change elsewhere in the file is not the series' business (the recorded sums are); a change
    # to 0001's own line makes 0001 not apply, while 0002 still looks applied
    (patched / "vllm" / "a.py").write_text(with_line(a2, 20, "changed\n"))
    assert [r.status for r in P.check(s, patched)] == ["already-applied", "already-applied"]
    (patched / "vllm" / "a.py").write_text(with_line(a2, 11, "line TEN\n"))
    assert [r.status for r in P.check(s, patched, raise_on_failure=False)] == ["does-not-apply", "already-applied"]
