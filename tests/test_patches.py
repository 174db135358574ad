"""Fast tests of the patch series machinery on small synthetic trees and wheels."""

from __future__ import annotations

import difflib
import http.server
import json
import os
import re
import threading
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder import fetch as F
from builder.cli import main
from builder.errors import BadInput, IntegrityError, PatchFailed
from builder.events import SILENT
from builder.patching import series as P
from builder.util import sha256_bytes, sha256_file

ORIG = "".join(f"line {i}\n" for i in range(1, 41))
HEADER = """Subject: {subject}
Why: test
Applies-To: {applies}
Upstream-Status: Inappropriate [test]
Risk: none

"""


def make_diff(rel: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}", n=3))


def edit(text: str, lineno: int, new_line: str) -> str:
    lines = text.splitlines(True)
    lines[lineno - 1] = new_line
    return "".join(lines)


def write_series(d: Path, patches: dict[str, str], applies: str = "vllm==0.26.0") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for name, diff in patches.items():
        (d / name).write_text(HEADER.format(subject=name, applies=applies) + diff)
    (d / "series").write_text("".join(f"{n}\n" for n in patches))
    return d


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "site"
    (root / "vllm" / "sub").mkdir(parents=True)
    (root / "vllm" / "a.py").write_text(ORIG)
    (root / "vllm" / "sub" / "b.py").write_text(ORIG.replace("line", "row"))
    return root


@pytest.fixture
def series(tmp_path, tree) -> P.Series:
    a = ORIG
    b = ORIG.replace("line", "row")
    d = write_series(
        tmp_path / "series",
        {
            "0001-a.patch": make_diff("vllm/a.py", a, edit(a, 10, "line ten (patched)\n")),
            "0002-b.patch": make_diff("vllm/sub/b.py", b, edit(edit(b, 5, "row five\n"), 30, "row thirty\n")),
        },
    )
    sums = {"vllm/a.py": sha256_bytes(a.encode()), "vllm/sub/b.py": sha256_bytes(b.encode())}
    (d / P.ORIG_SUMS).write_text(P.format_sums(sums))
    return P.load_series(d, "0.26.0")


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ loading
def test_load_series_reads_headers_and_targets(series):
    assert [p.name for p in series.patches] == ["0001-a.patch", "0002-b.patch"]
    assert series.package == "vllm" and series.version == "0.26.0"
    assert series.targets == ["vllm/a.py", "vllm/sub/b.py"]
    assert series.patches[0].headers["Risk"] == "none"


def test_wrong_applies_to_refused(tmp_path):
    d = write_series(
        tmp_path / "s", {"0001.patch": make_diff("vllm/a.py", ORIG, edit(ORIG, 2, "x\n"))}, applies="vllm==0.25.1"
    )
    with pytest.raises(BadInput, match=r"vllm==0\.25\.1.*not vllm==0\.26\.0"):
        P.load_series(d, "0.26.0")
    assert P.load_series(d).version == "0.25.1"


def test_missing_header_field_named(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    (d / "0001.patch").write_text(
        "Subject: x\nApplies-To: vllm==0.26.0\n\n" + make_diff("vllm/a.py", ORIG, edit(ORIG, 2, "x\n"))
    )
    (d / "series").write_text("0001.patch\n")
    with pytest.raises(BadInput, match="Why, Upstream-Status, Risk"):
        P.load_series(d)


def test_series_dir_for_unknown_version_lists_available():
    with pytest.raises(BadInput, match=r"0\.0\.1.*available: .*0\.26\.0"):
        P.series_dir_for("0.0.1")
    assert P.series_dir_for("0.26.0").name == "0.26.0"


@pytest.mark.parametrize(
    "path,msg",
    [
        ("tests/a.py", "outside the vllm/ package"),
        ("/etc/passwd", "absolute path"),
        ("vllm/../setup.py", r"'\.\.'"),
    ],
)
def test_forbidden_paths_refused(tmp_path, path, msg):
    diff = f"--- a/{path}\n+++ b/{path}\n@@ -1,1 +1,1 @@\n-x\n+y\n"
    if path.startswith("/"):
        diff = f"--- {path}\n+++ {path}\n@@ -1,1 +1,1 @@\n-x\n+y\n"
    d = write_series(tmp_path / "s", {"0001.patch": diff})
    with pytest.raises(PatchFailed, match=msg):
        P.load_series(d)


@pytest.mark.parametrize(
    "diff,msg",
    [
        (
            "diff --git a/vllm/a.py b/vllm/b.py\nsimilarity index 90%\nrename from vllm/a.py\nrename to vllm/b.py\n",
            "renames",
        ),
        (
            "diff --git a/vllm/l b/vllm/l\nnew file mode 120000\n--- /dev/null\n+++ b/vllm/l\n@@ -0,0 +1 @@\n+/etc\n",
            "symlink",
        ),
        ("diff --git a/vllm/x.so b/vllm/x.so\nBinary files a/vllm/x.so and b/vllm/x.so differ\n", "binary"),
        (
            "--- /dev/null\n+++ b/vllm/new.py\n@@ -0,0 +1 @@\n+x\n",
            r"creates or deletes a file \('/dev/null'\); a series may only modify existing files\.$",
        ),
        ("--- a/vllm/a.py\n+++ b/vllm/b.py\n@@ -1 +1 @@\n-x\n+y\n", "renames"),
    ],
)
def test_renames_symlinks_binary_new_files_refused(tmp_path, diff, msg):
    d = write_series(tmp_path / "s", {"0001.patch": diff})
    with pytest.raises(PatchFailed, match=msg):
        P.load_series(d)


# ------------------------------------------------------------------ check
def test_applies_cleanly_then_already_applied(series, tree, tmp_path):
    res = P.check(series, tree)
    assert [r.status for r in res] == ["applied", "applied"]
    out = tmp_path / "out"
    done = P.apply_to_dir(series, tree, out)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "vllm/a.py",
        "vllm/sub/b.py",
    ]
    assert (out / "vllm/a.py").read_text() == edit(ORIG, 10, "line ten (patched)\n")
    for f in done:
        assert f.original_sha256 == sha256_file(tree / f.relpath)
        assert f.patched_sha256 == sha256_file(out / f.relpath)
    assert [r.status for r in P.check(series, out)] == ["already-applied", "already-applied"]


def test_does_not_apply_shows_failing_hunk(series, tree):
    (tree / "vllm/sub/b.py").write_text(edit(ORIG.replace("line", "row"), 31, "row 31 changed\n"))
    res = P.check(series, tree, raise_on_failure=False)
    assert [r.status for r in res] == ["applied", "does-not-apply"]
    assert "vllm/sub/b.py: hunk #2" in res[1].detail and "+row thirty" in res[1].detail
    assert "fuzz is refused" in res[1].detail
    with pytest.raises(PatchFailed) as ei:
        P.check(series, tree)
    assert "0002-b.patch" in ei.value.message and "+row thirty" in ei.value.details


def test_offset_refused(series, tree):
    (tree / "vllm/a.py").write_text("# new first line\n# and another\n" + ORIG)
    res = P.check(series, tree, raise_on_failure=False)
    assert res[0].status == "does-not-apply"
    assert "matches exactly at line(s) 9 (offset +2): offsets are refused" in res[0].detail


def test_fuzz_refused(series, tree):
    # a context line (not a changed one) differs: GNU patch's default fuzz would accept this
    (tree / "vllm/a.py").write_text(edit(ORIG, 8, "line 8 edited\n"))
    res = P.check(series, tree, raise_on_failure=False)
    assert res[0].status == "does-not-apply" and "fuzz is refused" in res[0].detail


def test_check_on_a_wheel(series, tree, tmp_path):
    whl = tmp_path / "vllm-0.26.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for p in tree.rglob("*.py"):
            z.write(p, p.relative_to(tree).as_posix())
    assert [r.status for r in P.check(series, whl)] == ["applied", "applied"]
    out = tmp_path / "o"
    P.apply_to_dir(series, whl, out)
    assert (out / "vllm/sub/b.py").read_text().splitlines()[29] == "row thirty"


def test_symlink_in_tree_refused(series, tree, tmp_path):
    real = tmp_path / "elsewhere"
    real.mkdir()
    (real / "b.py").write_text(ORIG.replace("line", "row"))
    for f in (tree / "vllm/sub").iterdir():
        f.unlink()
    (tree / "vllm/sub").rmdir()
    (tree / "vllm/sub").symlink_to(real)
    with pytest.raises(
        PatchFailed,
        match=rf"^{re.escape(str(tree))}: vllm/sub is a symlink; patching through "
        r"symlinks is refused\.$",
    ):
        P.check(series, tree)


def test_symlink_in_wheel_refused(series, tmp_path):
    """A wheel (zip) entry stored as a symlink (mode 120777) for a target is refused, not read as text."""
    whl = tmp_path / "vllm-0.26.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("vllm/a.py", ORIG)
        link = zipfile.ZipInfo("vllm/sub/b.py")
        link.external_attr = 0o120777 << 16
        z.writestr(link, "../a.py")
    with pytest.raises(PatchFailed, match="vllm/sub/b.py is a symlink in the wheel"):
        P.check(series, whl)


def test_apply_to_dir_refuses_source_differing_from_recorded_originals(series, tree, tmp_path):
    # a change outside every hunk: the diff still applies, but this is not the wheel the series was made for
    (tree / "vllm/a.py").write_text(ORIG + "line 41\n")
    assert P.check(series, tree)[0].status == "applied"
    with pytest.raises(PatchFailed, match="differ from the vllm 0.26.0 originals"):
        P.apply_to_dir(series, tree, tmp_path / "o")
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ apply in place
def test_apply_site_packages_patches_in_place_and_is_idempotent(series, tree):
    done = P.apply_site_packages(series, tree)
    assert [f.relpath for f in done] == series.targets
    assert (tree / "vllm/a.py").read_text() == edit(ORIG, 10, "line ten (patched)\n")
    for f in done:
        assert sha256_file(tree / f.relpath) == f.patched_sha256
    again = P.apply_site_packages(series, tree)
    assert [(f.relpath, f.patched_sha256) for f in again] == [(f.relpath, f.patched_sha256) for f in done]


def test_apply_site_packages_refuses_different_original_nothing_changed(series, tree):
    (tree / "vllm/sub/b.py").write_text(ORIG.replace("line", "row") + "row 41\n")
    before = snapshot(tree)
    with pytest.raises(PatchFailed, match="Nothing was changed") as ei:
        P.apply_site_packages(series, tree)
    assert "vllm/sub/b.py" in ei.value.details
    assert snapshot(tree) == before  # vllm/a.py (whose original matched) untouched too


def test_apply_site_packages_refuses_a_patched_tree_changed_beyond_the_series(series, tree):
    """Every hunk reads as already applied, but a line outside the hunks was changed too: that is
    not "this series on the wheel's originals", so it is refused instead of reported as patched."""
    P.apply_site_packages(series, tree)
    a = tree / "vllm" / "a.py"
    a.write_text(edit(a.read_text(), 30, "line thirty, edited by hand\n"))
    before = snapshot(tree)
    assert [r.status for r in P.check(series, tree)] == ["already-applied", "already-applied"]
    with pytest.raises(PatchFailed, match="changed beyond this series") as ei:
        P.apply_site_packages(series, tree)
    assert "vllm/a.py" in ei.value.details and "vllm/sub/b.py" not in ei.value.details
    assert snapshot(tree) == before


def test_apply_site_packages_needs_recorded_originals(series, tree):
    (series.dir / P.ORIG_SUMS).unlink()
    with pytest.raises(PatchFailed, match="records no original sha256"):
        P.apply_site_packages(P.load_series(series.dir), tree)


# ------------------------------------------------------------------ CLI
def test_cli_check_json_and_exit_codes(series, tree):
    r = CliRunner().invoke(main, ["patch", "check", "--series", str(series.dir), "--wheel", str(tree), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["ok"] and [p["status"] for p in doc["patches"]] == ["applied", "applied"]
    (tree / "vllm/a.py").write_text("x\n" + ORIG)
    r = CliRunner().invoke(main, ["patch", "check", "--series", str(series.dir), "--wheel", str(tree)])
    assert r.exit_code == PatchFailed.exit_code
    assert "does-not-apply" in r.output and "offset +1" in r.output
    r = CliRunner().invoke(
        main, ["patch", "check", "--series", str(series.dir), "--vllm", "0.25.0", "--wheel", str(tree)]
    )
    assert r.exit_code == BadInput.exit_code and "not vllm==0.25.0" in r.output


def test_cli_apply_prints_sha256sum_lines(series, tree):
    r = CliRunner().invoke(main, ["patch", "apply", "--series", str(series.dir), "--site-packages", str(tree)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines == [f"{sha256_file(tree / rel)}  {rel}" for rel in sorted(series.targets)]


# ------------------------------------------------------------------ fetch
class _Server:
    def __init__(self, root: Path):
        self.hits: list[str] = []
        hits = self.hits

        class H(http.server.SimpleHTTPRequestHandler):
            def __init__(s, *a, **k):
                super().__init__(*a, directory=str(root), **k)

            def do_GET(s):
                hits.append(s.path)
                return super().do_GET()

            def log_message(s, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    s = _Server(root)
    s.root = root
    yield s
    s.httpd.shutdown()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_fetch_verifies_caches_and_refetches_corrupt(server, cache):
    data = os.urandom(200_000)
    (server.root / "thing-1.0.whl").write_bytes(data)
    sha = sha256_bytes(data)
    p = F.fetch(f"{server.url}/thing-1.0.whl", sha, reporter=SILENT)
    assert p.read_bytes() == data and p.is_relative_to(cache / "downloads")
    assert F.fetch(f"{server.url}/thing-1.0.whl", sha) == p and len(server.hits) == 1  # cache hit
    with open(p, "r+b") as fh:  # a partial file left by an interrupted copy
        fh.truncate(1000)
    assert F.fetch(f"{server.url}/thing-1.0.whl", sha).read_bytes() == data and len(server.hits) == 2
    p.write_bytes(b"x" * len(data))  # same size, wrong bytes
    assert F.fetch(f"{server.url}/thing-1.0.whl", sha).read_bytes() == data and len(server.hits) == 3


def test_fetch_wrong_hash_is_integrity_error_and_leaves_nothing(server, cache):
    (server.root / "f.bin").write_bytes(b"hello")
    with pytest.raises(IntegrityError, match="expected " + "0" * 64):
        F.fetch(f"{server.url}/f.bin", "0" * 64)
    assert [p for p in (cache / "downloads").rglob("*") if p.is_file()] == []
    with pytest.raises(IntegrityError, match="cannot fetch"):
        F.fetch(f"{server.url}/missing.bin", sha256_bytes(b"hello"))


def test_vllm_wheel_via_pypi_json_fallback_and_override(server, cache, monkeypatch, tmp_path):
    data = b"PK-not-really-a-wheel" * 100
    sha = sha256_bytes(data)
    name = "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    (server.root / "files").mkdir()
    (server.root / "files" / name).write_bytes(data)
    (server.root / "vllm").mkdir()
    files = [
        {
            "filename": "vllm-9.9.9.tar.gz",
            "packagetype": "sdist",
            "url": "../files/x.tgz",
            "digests": {"sha256": "1" * 64},
        },
        {
            "filename": name.replace("x86_64", "aarch64"),
            "packagetype": "bdist_wheel",
            "url": "../files/a.whl",
            "digests": {"sha256": "2" * 64},
        },
        {"filename": name, "packagetype": "bdist_wheel", "url": f"../files/{name}", "digests": {"sha256": sha}},
    ]
    # no per-version document (404): the project document's releases are used; relative URLs resolved
    (server.root / "vllm" / "json").write_text(json.dumps({"releases": {"9.9.9": files}}))
    monkeypatch.setattr(F, "PYPI_JSON", server.url)
    p = F.vllm_wheel("9.9.9", reporter=SILENT)
    assert p.name == name and p.read_bytes() == data
    server.hits.clear()
    assert F.vllm_wheel("9.9.9", sha) == p and server.hits == []  # pinned + cached: offline
    with pytest.raises(IntegrityError, match="pin says"):
        F.vllm_wheel("9.9.9", "3" * 64)
    with pytest.raises(BadInput, match="9.9.8 is not on PyPI"):
        F.vllm_wheel("9.9.8")
    local = tmp_path / name
    local.write_bytes(data)
    monkeypatch.setenv(F.WHEEL_ENV, str(local))
    assert F.vllm_wheel("9.9.9") == local
    local.write_bytes(data + b"!")
    with pytest.raises(IntegrityError, match="differs from the pinned"):
        F.vllm_wheel("9.9.9")
