"""Fast tests of probes and `patch port` on small synthetic package trees (one per status)."""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder import events
from builder.cli import main
from builder.errors import BadInput, ExternalToolError, PatchFailed
from builder.patching import port as PO
from builder.patching import probe as PR
from builder.patching import series as P
from tests.fx_wheels import write_wheel

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
PATCHED_A = A_MOD.replace("    c = b - 3\n", "    c = b - 4\n", 1)  # only f's line: the first occurrence

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
    r = CliRunner().invoke(
        main, ["patch", "check", "--series", str(series.dir), "--wheel", str(a), "--probe", "--json"]
    )
    assert r.exit_code == 0, r.output
    (p,) = json.loads(r.stdout)["patches"]
    assert p["status"] == "applied" and p["probe"]["needed"] is True and p["probe"]["works"] is True


def _checks(*oks: bool) -> list[dict]:
    return [{"name": n, "ok": ok} for n, ok in zip("abcde", oks)]


def test_probe_output_evidence_is_the_tail_of_both_streams():
    """Up to the last 3000 characters of stdout, then of stderr on a line of their own."""
    out, err = "A" * 10 + "B" * 3000, "C" * 10 + "D" * 3000
    assert PR.parse_output(out, 1, err).output == "exit 1, no PROBE-RESULT line\n" + "B" * 3000 + "\n" + "D" * 3000
    assert PR.parse_output("  just this  \n", 2).output == "exit 2, no PROBE-RESULT line\njust this"
    line = 'PROBE-RESULT {"checks": [{"name": "x", "ok": true}]}'
    ok = PR.parse_output(f"{line}\n", 0, "a warning\n")
    # stdout as printed (its last newline kept), a newline, then stderr; stripped at both ends
    assert (ok.status, ok.checks, ok.output) == (PR.PASS, [{"name": "x", "ok": True}], f"{line}\n" + "\na warning")


def test_probe_output_only_the_last_result_line_counts_and_ok_must_be_true():
    first = 'PROBE-RESULT {"checks": [{"name": "a", "ok": false}]}'
    last = 'PROBE-RESULT {"checks": [{"name": "b", "ok": true}]}'
    run = PR.parse_output(f"{first}\n{last}\n", 0)
    assert (run.status, run.checks) == (PR.PASS, [{"name": "b", "ok": True}])
    assert PR.parse_output(f"  {last}", 0).status == PR.ERROR  # the prefix starts the line
    assert PR.parse_output('PROBE-RESULT {"checks": [{"name": "x", "ok": 1}]}', 0).status == PR.FAIL
    none = PR.parse_output('PROBE-RESULT {"checks": []}', 0)
    assert (none.status, none.checks, none.output) == (
        PR.ERROR,
        [],
        'the probe ran no check\nPROBE-RESULT {"checks": []}',
    )


@pytest.mark.parametrize("doc", ['{"checks": {}}', '{"checks": [{"name": "x"}]}', '{"checks": ["ok"]}'])
def test_probe_output_checks_must_be_a_list_of_dicts_with_ok(doc):
    stdout = f"PROBE-RESULT {doc}"
    run = PR.parse_output(stdout, 0)
    assert (run.status, run.output) == (
        PR.ERROR,
        f"malformed PROBE-RESULT line (checks must be a list of {{name, ok, detail}})\n{stdout}",
    )


@pytest.mark.parametrize("doc", ['{"results": []}', "[1]", '{"checks": ['])
def test_probe_output_unreadable_result_line_is_an_error(doc):
    stdout = f"PROBE-RESULT {doc}"
    run = PR.parse_output(stdout, 0)
    assert run.status == PR.ERROR and run.checks == []
    assert run.output.startswith("malformed PROBE-RESULT line (") and run.output.endswith(f")\n{stdout}")


def test_probe_summary_names_at_most_three_failing_checks():
    assert PR.ProbeRun(PR.PASS, _checks(True, True)).summary() == "2 check(s) pass"
    assert PR.ProbeRun(PR.FAIL, _checks(False, False, False)).summary() == "3 of 3 check(s) fail: a; b; c"
    assert (
        PR.ProbeRun(PR.FAIL, _checks(True, False, False, False, False)).summary()
        == "4 of 5 check(s) fail: b; c; d; +1 more"
    )
    assert PR.ProbeRun(PR.FAIL, [{"name": "n" * 130, "ok": False}]).summary() == "1 of 1 check(s) fail: " + "n" * 120
    # an error names the last line of its evidence, cut to 300 characters
    tb = "exit 1, no PROBE-RESULT line\nTraceback (most recent call last):\nImportError: no toy\n\n"
    assert PR.ProbeRun(PR.ERROR, output=tb).summary() == "error: ImportError: no toy"
    assert PR.ProbeRun(PR.ERROR, output="x" * 400).summary() == "error: " + "x" * 300
    assert PR.ProbeRun(PR.ERROR, output=" \n ").summary() == "error: no output"


def test_probe_json_keeps_the_output_of_errors_only():
    passed = PR.ProbeRun(PR.PASS, _checks(True), output="noise", seconds=1.23456)
    assert passed.to_dict() == {"status": "pass", "checks": [{"name": "a", "ok": True}], "seconds": 1.23}
    err = PR.ProbeRun(PR.ERROR, output="E" * 500 + "F" * 2000, seconds=2)
    assert err.to_dict() == {"status": "error", "checks": [], "seconds": 2, "output": "F" * 2000}
    failed = PR.ProbeRun(PR.FAIL, _checks(False))
    one = PR.PatchProbe("0001-f.patch", "0001-f.probe.py", failed, None)
    assert one.to_dict() == {
        "patch": "0001-f.patch",
        "probe": "0001-f.probe.py",
        "needed": True,
        "works": None,
        "unpatched": {"status": "fail", "checks": [{"name": "a", "ok": False}], "seconds": 0.0},
        "patched": None,
    }
    both = PR.PatchProbe("0001-f.patch", "0001-f.probe.py", err, passed).to_dict()
    assert (both["needed"], both["works"], both["patched"]) == (None, True, passed.to_dict())
    assert PR.PatchProbe("p", "q", passed, failed).works is False
    assert PR.PatchProbe("p", "q", passed, err).works is None  # an error is no evidence


def test_probe_path_is_a_file_beside_the_patch(a_series, tmp_path):
    series, _ = a_series
    (patch,) = series.patches
    assert PR.probe_path(series.dir, patch) == series.dir / "0001-f.probe.py"
    (tmp_path / "outside.probe.py").write_text(PROBE)
    (series.dir / "sub").mkdir()
    (series.dir / "sub" / "x.probe.py").write_text(PROBE)
    for name in ("../outside.probe.py", "sub/x.probe.py", "0002-missing.probe.py"):
        patch.headers[PR.PROBE_FIELD] = name
        with pytest.raises(BadInput) as e:
            PR.probe_path(series.dir, patch)
        assert e.value.message == (
            f"patch {series.dir / '0001-f.patch'}: its probe {name!r} is not a file in {series.dir}."
        )
    patch.headers[PR.PROBE_FIELD] = "   "
    with pytest.raises(BadInput, match="no 'Probe:' header naming its probe"):
        PR.probe_path(series.dir, patch)


def test_probe_env_requirements_one_a_line_comments_dropped(tmp_path):
    assert PR.env_requirements(tmp_path) is None
    f = tmp_path / "probe-env.txt"
    f.write_text("# CPU interpreter for the probes\n\ntorch >= 2.1  # cpu # wheel\n  numpy==1.26.4\n", encoding="utf-8")
    assert PR.env_requirements(tmp_path) == ["torch >= 2.1", "numpy==1.26.4"]
    f.write_text("# nothing yet\n\n")
    with pytest.raises(BadInput) as e:
        PR.env_requirements(tmp_path)
    assert e.value.message == f"{f}: lists no requirement."


ENV_PROBE = '''import json, os, sys
keys = ["PYTHONPATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_LOGGING_LEVEL", "PYTHONNOUSERSITE",
        "VLLM_PLUGINS", "PYTHONMPROBE", "MPROBE_KEPT"]
print("PROBE-RESULT " + json.dumps({"checks": [
    {"name": "env", "ok": True, "detail": {k: os.environ.get(k) for k in keys}},
    {"name": "cwd", "ok": True, "detail": os.getcwd()}]}))
print("probe stderr", file=sys.stderr)
'''


def test_probe_runner_isolates_the_probe(tmp_path, monkeypatch):
    """PYTHONPATH is the tree under test; the caller's VLLM_* and PYTHON* settings do not leak in;
    hubs offline; the probe runs in a scratch directory of its own."""
    for k, v in {"VLLM_PLUGINS": "x", "VLLM_LOGGING_LEVEL": "DEBUG", "PYTHONMPROBE": "1", "MPROBE_KEPT": "yes"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    Path("env.probe.py").write_text(ENV_PROBE)
    tree = tmp_path / "tree"
    tree.mkdir()
    run = PR.ProbeRunner().run(Path("env.probe.py"), tree)  # relative to the caller's directory
    assert run.status == PR.PASS, run.output
    env, cwd = run.checks[0]["detail"], Path(run.checks[1]["detail"])
    assert env == {
        "PYTHONPATH": str(tree),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_LOGGING_LEVEL": "INFO",
        "PYTHONNOUSERSITE": "1",
        "VLLM_PLUGINS": None,
        "PYTHONMPROBE": None,
        "MPROBE_KEPT": "yes",
    }
    assert cwd.parent == Path(tempfile.gettempdir()).resolve() and cwd.name.startswith("build-image-probe-")
    assert not cwd.exists()
    assert run.output.endswith("\nprobe stderr") and 0 < run.seconds < 60


def test_probe_runner_crash_timeout_and_missing_interpreter(tmp_path):
    crash = tmp_path / "crash.probe.py"
    crash.write_text("import sys\nprint('partial')\nsys.exit(3)\n")
    run = PR.ProbeRunner().run(crash, tmp_path)
    assert (run.status, run.output) == (PR.ERROR, "exit 3, no PROBE-RESULT line\npartial")
    slow = tmp_path / "slow.probe.py"
    slow.write_text("import time\ntime.sleep(10)\n")
    run = PR.ProbeRunner(timeout=1).run(slow, tmp_path)
    assert (run.status, run.output) == (PR.ERROR, "timed out after 1 s") and 1 <= run.seconds < 9
    with pytest.raises(ExternalToolError, match=f"cannot run the probe interpreter {tmp_path / 'no-python'}: "):
        PR.ProbeRunner(str(tmp_path / "no-python")).run(crash, tmp_path)


# ------------------------------------------------------------------ probe interpreter and trees (isolated cache)
@pytest.fixture(scope="module")
def probe_wheels(tmp_path_factory) -> Path:
    wh = tmp_path_factory.mktemp("probe-wheels")
    write_wheel(wh, "probedep", "1.0", "py3-none-any", {"probedep/__init__.py": "X = 7\n"})
    write_wheel(wh, "probeaux", "2.0", "py3-none-any", {"probeaux/__init__.py": "Y = 8\n"})
    return wh


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty build-image cache; uv offline with a cache of its own: only find-links resolve."""
    c = tmp_path / "cache"
    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(c))
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    return c


def _imports(python: str) -> str:
    r = subprocess.run(
        [python, "-c", "import sys, probedep, probeaux; print(probedep.X, probeaux.Y, sys.version_info[:2])"],
        capture_output=True,
        text=True,
    )
    return r.stdout.strip()


def test_probe_env_is_built_once_per_content_and_rebuilt_when_incomplete(cache, probe_wheels, tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))  # explicit find-links win over the default
    reqs = ["probedep==1.0", "probeaux"]
    key = hashlib.sha256(b"probedep==1.0\nprobeaux").hexdigest()[:12]  # the requirement lines
    venv = cache / "probe-env" / f"venv-{key}"
    py = PR.cpu_env(reqs, find_links=[str(probe_wheels)])
    want = f"7 8 {sys.version_info[:2]}"  # this interpreter's Python
    assert py == str(venv / "bin" / "python") and _imports(py) == want and (venv / ".complete").is_file()
    (venv / "kept").touch()
    assert PR.cpu_env(reqs, find_links=[]) == py and (venv / "kept").exists()  # cached: nothing installed
    (venv / ".complete").unlink()  # an interrupted build is built again
    assert PR.cpu_env(reqs, find_links=[str(probe_wheels)]) == py
    assert not (venv / "kept").exists() and (venv / ".complete").is_file() and _imports(py) == want
    (venv / "bin" / "python").unlink()  # marker but no interpreter: built again
    assert PR.cpu_env(reqs, find_links=[str(probe_wheels)]) == py and _imports(py) == want


def test_a_failed_probe_env_install_raises_and_leaves_no_venv(cache, probe_wheels, monkeypatch):
    reqs = ["probedep==1.0", "probeaux", "nosuchpkg", "fourth"]
    with pytest.raises(ExternalToolError) as e:
        PR.cpu_env(reqs, find_links=[str(probe_wheels)])
    head, _, uv_says = e.value.message.partition(" ...): ")
    assert head == "cannot build the probe environment (probedep==1.0, probeaux, nosuchpkg," and "not found" in uv_says
    assert list((cache / "probe-env").iterdir()) == []
    # uv's reason comes last: the message keeps the last 1500 characters of its output
    from builder.resolve.uv import Uv

    err = "".join(f"uv line {i:04d}\n" for i in range(300)) + "\n"
    monkeypatch.setattr(Uv, "pip_install", lambda self, *a, **k: subprocess.CompletedProcess([], 2, "", err))
    with pytest.raises(ExternalToolError) as e:
        PR.cpu_env(reqs[:1], find_links=[])
    assert e.value.message == "cannot build the probe environment (probedep==1.0, ...): " + err.strip()[-1500:]
    assert list((cache / "probe-env").iterdir()) == []


def test_a_series_probe_env_gives_the_probes_interpreter(cache, probe_wheels, tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", str(probe_wheels))  # the default find-links
    d = tmp_path / "series"
    d.mkdir()
    (d / "probe-env.txt").write_text("probedep==1.0  # the probes' one dependency\n")
    runner = PR.runner_for(d)
    assert runner.python == str(
        cache / "probe-env" / f"venv-{hashlib.sha256(b'probedep==1.0').hexdigest()[:12]}" / "bin" / "python"
    )
    (d / "dep.probe.py").write_text(
        'import json, probedep\n'
        'print("PROBE-RESULT " + json.dumps({"checks": [{"name": "X", "ok": '
        'probedep.X == 7}]}))\n'
    )
    assert runner.run(d / "dep.probe.py", tmp_path).status == PR.PASS
    assert PR.runner_for(d, python="/given/python").python == "/given/python"
    (d / "probe-env.txt").unlink()
    assert PR.runner_for(d).python == sys.executable


def test_default_find_links(monkeypatch):
    real_is_dir = Path.is_dir

    def links(env: str | None, opt_wheels: bool) -> list[str]:
        with monkeypatch.context() as m:
            if env is None:
                m.delenv("PIP_FIND_LINKS", raising=False)
            else:
                m.setenv("PIP_FIND_LINKS", env)
            m.setattr(Path, "is_dir", lambda p: opt_wheels if str(p) == "/opt/wheels" else real_is_dir(p))
            return PR.default_find_links()

    assert links(" /a  /b ", True) == ["/a", "/b"]
    assert links(None, True) == links("  ", True) == ["/opt/wheels"]
    assert links(None, False) == []


def _toy_wheel(dest: Path) -> Path:
    return write_wheel(
        dest,
        "toy",
        "1.0",
        "cp312-cp312-manylinux_2_17_x86_64",
        {
            "toy/__init__.py": "",
            "toy/mod.py": A_MOD,
            "toy/_ext.cpython-312-x86_64-linux-gnu.so": b"\x7fELF",
            "toyish/x.py": "",
            "other/y.py": "",
        },
    )


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_unpatched_tree_from_a_wheel_is_extracted_once_and_rebuilt_when_incomplete(cache, tmp_path, monkeypatch):
    whl = _toy_wheel(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmp"))  # extracted beside the entry
    tree = PR.unpatched_tree(whl, "toy")
    assert tree == cache / "probe-trees" / hashlib.sha256(whl.read_bytes()).hexdigest()[:32]
    dist = "toy-1.0.dist-info"
    want = {".complete", "toy/__init__.py", "toy/mod.py", f"{dist}/METADATA", f"{dist}/WHEEL", f"{dist}/RECORD"}
    assert _files(tree) == want  # the package without .so files, and its metadata
    assert [p.name for p in tree.parent.iterdir()] == [tree.name]  # no extraction left beside it
    (tree / "toy" / "mod.py").write_text("edited")
    assert PR.unpatched_tree(whl, "toy") == tree and (tree / "toy" / "mod.py").read_text() == "edited"  # cached
    (tree / ".complete").unlink()  # an interrupted extraction is redone
    (tree / "stray.py").touch()
    assert PR.unpatched_tree(whl, "toy") == tree
    assert _files(tree) == want and (tree / "toy" / "mod.py").read_text() == A_MOD


def test_a_failed_extraction_leaves_nothing_in_the_cache(cache, tmp_path, monkeypatch):
    whl = _toy_wheel(tmp_path)

    def full(self, *a, **k):
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr(zipfile.ZipFile, "extractall", full)
        with pytest.raises(OSError, match="disk full"):
            PR.unpatched_tree(whl, "toy")
    assert list((cache / "probe-trees").iterdir()) == []
    assert (PR.unpatched_tree(whl, "toy") / ".complete").is_file()


def test_unpatched_tree_from_a_directory_or_bad_input(tmp_path):
    (tmp_path / "site" / "vllm").mkdir(parents=True)
    assert PR.unpatched_tree(tmp_path / "site") == tmp_path / "site"  # vllm by default, used in place
    with pytest.raises(BadInput) as e:
        PR.unpatched_tree(tmp_path / "site", "toy")
    assert e.value.message == f"{tmp_path / 'site'} holds no toy/ package to probe."
    (tmp_path / "notes.txt").write_text("not a wheel")
    for src in (tmp_path / "notes.txt", tmp_path / "missing.whl"):
        with pytest.raises(BadInput) as e:
            PR.unpatched_tree(src, "toy")
        assert e.value.message == f"probe source {src} is neither a wheel nor a directory."


def test_patched_tree_links_unchanged_files_and_drops_stale_bytecode(tmp_path, monkeypatch):
    base = tree(tmp_path / "base", A_MOD)
    (base / "toy" / "other.py").write_text("Z = 1\n")
    pycache = base / "toy" / "__pycache__"
    pycache.mkdir()
    for pyc in ("mod.cpython-312.pyc", "mod.cpython-312.opt-1.pyc", "other.cpython-312.pyc", "model.cpython-312.pyc"):
        (pycache / pyc).write_bytes(b"pyc")
    files = {"toy/mod.py": PATCHED_A.encode(), "toy/new/extra.py": b"NEW = 1\n"}
    dest = PR.patched_tree(base, files, tmp_path / "patched")
    assert dest == tmp_path / "patched"
    assert (dest / "toy" / "mod.py").read_text() == PATCHED_A and (base / "toy" / "mod.py").read_text() == A_MOD
    assert (dest / "toy" / "new" / "extra.py").read_bytes() == b"NEW = 1\n"
    assert (dest / "toy" / "other.py").stat().st_ino == (base / "toy" / "other.py").stat().st_ino  # hard link
    assert sorted(p.name for p in (dest / "toy" / "__pycache__").iterdir()) == [
        "model.cpython-312.pyc",
        "other.cpython-312.pyc",
    ]
    assert len(list(pycache.iterdir())) == 4  # the unpatched tree keeps its bytecode
    # where hard links are refused (another filesystem), unchanged files are copied
    monkeypatch.setattr(os, "link", lambda s, d: (_ for _ in ()).throw(OSError(18, "cross-device link")))
    copy = PR.patched_tree(base, {"toy/mod.py": PATCHED_A.encode()}, tmp_path / "copied")
    other = copy / "toy" / "other.py"
    assert other.read_text() == "Z = 1\n" and other.stat().st_ino != (base / "toy" / "other.py").stat().st_ino


def test_series_files_are_the_patched_targets_or_patch_failed(tmp_path, a_series):
    series, a = a_series
    assert PR.series_files(series, a) == {"toy/mod.py": PATCHED_A.encode()}
    b = tree(tmp_path / "b", A_MOD.replace("    c = b - 3\n", "    c = b - 5\n", 1))
    with pytest.raises(PatchFailed) as e:
        PR.series_files(series, b)
    assert e.value.message == f"1 of 1 patch(es) of series {series.dir} do not apply to {b}: 0001-f.patch."


def test_probe_series_runs_each_probe_on_the_shipped_and_the_patched_tree(a_series):
    series, a = a_series
    trees, said = [], events.Recorder()

    class Recording(PR.ProbeRunner):
        def run(self, probe, tree):
            trees.append(Path(tree))
            return super().run(probe, tree)

    (res,) = PR.probe_series(series, a, runner=Recording(), reporter=said)
    assert said.lines == ["probe 0001-f.probe.py: unpatched and patched"]
    assert (res.patch, res.probe, res.needed, res.works) == ("0001-f.patch", "0001-f.probe.py", True, True)
    (patched,) = [t for t in trees if t != a]
    assert len(trees) == 2 and a in trees
    # the patched copy's path (seen in a probe's traceback) says what it is; it is removed afterwards
    assert patched.name == "tree" and patched.parent.name.startswith("build-image-patched-")
    assert not patched.exists()


# ------------------------------------------------------------------ port: one test per status
def test_applies_regenerates_offsets(tmp_path, a_series):
    b_mod = A_MOD.replace('"""toy module."""\n', '"""toy module."""\n\nVERSION = 2\nEXTRA = 1\n')
    rep = port_to(tmp_path, a_series, b_mod, out="out")
    (pp,) = rep.patches
    assert pp.status == PO.APPLIES and not rep.needs_review
    assert pp.probe_unpatched.status == PR.FAIL and pp.probe_ported.status == PR.PASS
    ported = P.load_series(tmp_path / "out", "2.0")  # Applies-To toy==2.0
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
    assert len(where) == 1 and PO.scopes(b_mod)[where[0]] == "g"  # the only exact match is in g
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
    b_mod = A_MOD.replace("    return e\n", "    return e + 100\n", 1)  # outside the hunk's context
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
    args = [
        "patch",
        "port",
        "--from",
        "1.0",
        "--to",
        "2.0",
        "--series",
        str(series.dir),
        "--from-wheel",
        str(a),
        "--to-wheel",
        str(b),
    ]
    r = CliRunner().invoke(main, [*args, "--json"])
    assert r.exit_code == 1, r.output  # merged: needs review
    doc = json.loads(r.stdout)
    assert doc["merge"] == "merge3" and [p["status"] for p in doc["patches"]] == ["merged"]
    assert not (tmp_path / "out").exists()  # nothing written without -o
    r = CliRunner().invoke(main, [*args, "--format", "markdown"])
    assert "| `0001-f.patch` | **merged** |" in r.stdout
    r = CliRunner().invoke(
        main,
        [
            "patch",
            "port",
            "--from",
            "1.0",
            "--to",
            "2.0",
            "--series",
            str(series.dir),
            "--from-wheel",
            str(a),
            "--to-wheel",
            str(tmp_path / "nothing"),
        ],
    )
    assert r.exit_code == 2


# ------------------------------------------------------------------ scopes and changed lines (pure)
def test_scopes_name_the_innermost_def_or_class_of_every_line():
    src = (
        "import os\n"  # 1  module level
        "@dec\n"  # 2  a decorator belongs to what it decorates
        "class C:\n"  # 3
        "    x = 1\n"  # 4
        "    if x:\n"  # 5  an if inside the class: still C
        "        def m(self):\n"  # 6  nested below the if: C.m
        "            return 1\n"  # 7
        "    async def n(self):\n"  # 8
        "        pass\n"  # 9
        "y = 2\n"  # 10
        "def last():\n"  # 11 a def on the file's last lines
        "    return y\n"
    )  # 12
    # 12 newline-terminated lines: 13 entries (the 13th is the empty line after the last newline)
    assert PO.scopes(src) == [
        "<module>",
        "C",
        "C",
        "C",
        "C",
        "C.m",
        "C.m",
        "C.n",
        "C.n",
        "<module>",
        "last",
        "last",
        "<module>",
    ]
    assert PO.scopes("def f():\n    return 1") == ["f", "f"]  # no final newline: 2 lines, 2 entries
    assert PO.scopes("def (:\n") is None


def test_changed_lines_number_removed_lines_in_old_and_added_lines_in_new():
    old = ["a\n", "b\n", "c\n", "d\n", "e\n"]
    new = ["a\n", "B\n", "c\n", "e\n", "f\n"]  # b replaced (line 2), d deleted (old line 4), f inserted (new line 5)
    assert PO.changed_lines(old, new) == ([(2, "b\n"), (4, "d\n")], [(2, "B\n"), (5, "f\n")])
    assert PO.changed_lines(old, old) == ([], [])


def test_changed_lines_of_a_long_file_with_repeated_lines_are_only_the_changed_one():
    # 40 functions of 7 lines (280 lines): the body lines each occur 40-120 times, so a matcher that
    # treats popular lines as junk would report the whole tail after the change as replaced
    old = "".join(f"def f{i}(x):\n    x += 1\n    x += 1\n    x += 1\n    return x\n\n\n" for i in range(40))
    new = old.replace("def f39(x):\n    x += 1\n    x += 1\n", "def f39(x):\n    x += 1\n    x += 2\n")
    line = 39 * 7 + 3  # f39 starts at line 274; its second body line is 276
    assert PO.changed_lines(old.splitlines(True), new.splitlines(True)) == (
        [(line, "    x += 1\n")],
        [(line, "    x += 2\n")],
    )


# ------------------------------------------------------------------ placement (pure)
F_LINE = "    c = b - 3\n"
G_ADDED = A_MOD.replace("def g(x):\n" + BODY, "def g(x):\n" + BODY.replace(F_LINE, F_LINE + "    c = b - 4\n"))


def test_placement_checks_removed_and_added_lines_separately():
    # B removes f's line as A does, but adds the new line in g
    b_new = G_ADDED.replace(F_LINE, "", 1)
    assert PO.placement(A_MOD, PATCHED_A, A_MOD, b_new) == ["a added line lands in g, in A it is in f: 'c = b - 4'"]
    # B removes nothing and adds the line in g: both comparisons fail, both are reported
    assert PO.placement(A_MOD, PATCHED_A, A_MOD, G_ADDED) == [
        "the removed lines differ from A's (1 in A, 0 in B)",
        "a added line lands in g, in A it is in f: 'c = b - 4'",
    ]


def test_placement_at_the_edges_of_a_function():
    # A changes f's def line and its last line; B (3 lines further down) gets the same change
    a_new = A_MOD.replace("def f(x):\n", "def f(x, y=0):\n").replace("    return e\n", "    return e + y\n", 1)
    top = "import os\nimport re\n\n"
    assert PO.placement(A_MOD, a_new, top + A_MOD, top + a_new) == []


def test_placement_shows_a_long_line_cut_at_80_characters():
    a_old = "def f():\n    x = 1\n\n\ndef g():\n    x = 1\n"
    long = "    x = '" + "y" * 100 + "'\n"
    a_new = a_old.replace("    x = 1\n", long, 1)
    b_new = a_old.replace("def g():\n    x = 1\n", "def g():\n" + long)  # g's line instead
    shown = long.strip()[:80]
    assert len(shown) == 80
    assert PO.placement(a_old, a_new, a_old, b_new) == [
        f"a removed line lands in g, in A it is in f: {'x = 1'!r}",
        f"a added line lands in g, in A it is in f: {shown!r}",
    ]


def test_placement_refuses_an_original_that_does_not_parse():
    assert PO.placement("def (:\n", PATCHED_A, A_MOD, PATCHED_A) == ["an original file does not parse as Python"]
    assert PO.placement(A_MOD, PATCHED_A, "def (:\n", PATCHED_A) == ["an original file does not parse as Python"]


# ------------------------------------------------------------------ hunks on B (pure)
def hunk(start: int, old: list[str], new: list[str]) -> P.Hunk:
    return P.Hunk(start, len(old), start, len(new), tuple(old), tuple(new), "")


def test_exact_apply_finds_each_block_at_any_offset_in_order():
    lines = ["x = 1\n", "y = 2\n", "z = 3\n", "w = 4\n"]
    # the first block starts on B's first line, the second right where the first ends
    two = (hunk(1, ["x = 1\n"], ["x = 10\n"]), hunk(2, ["y = 2\n", "z = 3\n"], ["y = 20\n"]))
    assert PO.exact_apply(lines, two) == ["x = 10\n", "y = 20\n", "w = 4\n"]
    assert PO.exact_apply(["# B\n", *lines], two) == ["# B\n", "x = 10\n", "y = 20\n", "w = 4\n"]
    assert PO.exact_apply(lines, (hunk(1, ["x = 2\n"], ["x = 3\n"]),)) is None  # no fuzz
    assert PO.exact_apply(lines, (hunk(4, ["w = 4\n"], ["w = 5\n"]), hunk(1, ["x = 1\n"], []))) is None  # order
    assert PO.exact_apply(lines, (hunk(3, [], ["v = 0\n"]),)) is None  # a pure insertion has no context
    assert PO.exact_apply(["x = 1\n", "x = 1\n"], (hunk(1, ["x = 1\n"], ["x = 2\n"]),)) is None  # ambiguous


def test_exact_apply_takes_the_occurrence_in_the_scope_the_hunk_has_in_a():
    a = "def f(x):\n    return x\n\n\ndef g(x):\n    return x\n"  # g's return is line 6, the last
    b = "import os\n\n" + a  # both 2 lines further down in B
    last = (hunk(6, ["    return x\n"], ["    return x + 1\n"]),)
    assert PO.exact_apply(b.splitlines(True), last, PO.scopes(a)) == (
        "import os\n\ndef f(x):\n    return x\n\n\ndef g(x):\n    return x + 1\n"
    ).splitlines(True)
    assert PO.exact_apply(b.splitlines(True), last) is None  # without A's scopes the block is ambiguous

    two = "class A:\n    def run(self):\n        return 1\n\n\nclass B:\n    def run(self):\n        return 1\n"
    on_def = (hunk(7, ["    def run(self):\n"], ["    def run(self, x=0):\n"]),)  # B.run's def line
    assert PO.exact_apply(two.splitlines(True), on_def, PO.scopes(two)) == two.replace(
        "class B:\n    def run(self):\n", "class B:\n    def run(self, x=0):\n"
    ).splitlines(True)

    first = 'X = 1\ndef f():\n    return """\nX = 1\n"""\n'  # line 1 at module level, line 4 inside f
    on_first = (hunk(1, ["X = 1\n"], ["X = 2\n"]),)
    assert PO.exact_apply(first.splitlines(True), on_first, PO.scopes(first)) == (
        'X = 2\ndef f():\n    return """\nX = 1\n"""\n'
    ).splitlines(True)


def test_exact_apply_on_a_file_that_does_not_parse():
    # B's file no longer parses (new syntax, a template): a unique block still applies, an ambiguous one does not
    a = "def f():\n    y = 1\n"
    broken = ["def f(:\n", "    y = 1\n"]
    assert PO.exact_apply(broken, (hunk(2, ["    y = 1\n"], ["    y = 2\n"]),), PO.scopes(a)) == [
        "def f(:\n",
        "    y = 2\n",
    ]
    assert PO.exact_apply(broken + ["    y = 1\n"], (hunk(2, ["    y = 1\n"], ["    y = 2\n"]),), PO.scopes(a)) is None


def test_three_way_reports_each_conflict_with_both_line_ranges_and_all_three_versions():
    base = ["a\n", "b\n", "c\n", "d\n", "e\n"]
    ours = ["a\n", "b\n", "C1\n", "D1\n", "e\n"]  # A's patch rewrites lines 3-4
    theirs = ["x\n", "a\n", "b\n", "C2\n", "D2\n", "e\n"]  # B added a line on top and rewrote them too: 4-5
    assert PO.three_way(base, ours, theirs) == (
        None,
        [
            "conflict at B's lines 4-5 (A's original lines 3-4):\n"
            "<<<<<<< patched A\nC1\nD1\n"
            "||||||| A original\nc\nd\n"
            "=======\nC2\nD2\n"
            ">>>>>>> B original\n"
        ],
    )
    # B's new first line and A's change do not touch: they merge
    assert PO.three_way(base, ours, ["x\n", *base]) == (["x\n", "a\n", "b\n", "C1\n", "D1\n", "e\n"], [])


def test_unified_marks_a_missing_final_newline_on_both_sides():
    text = PO.unified("toy/x.py", "a\nb", "a\nc")
    assert text == (
        "--- a/toy/x.py\n+++ b/toy/x.py\n@@ -1,2 +1,2 @@\n a\n-b\n"
        "\\ No newline at end of file\n+c\n\\ No newline at end of file\n"
    )
    (f,) = P.parse_patch(HEADER.format(v="2.0") + text, "x.patch", "toy").files
    assert P._apply_hunks(["a\n", "b"], f.hunks) == (["a\n", "c"], "")  # the series reader reads it back


def test_header_text_wraps_long_values_at_88_columns():
    words = ["a" * 9] * 8
    line1 = "Why: " + " ".join(words)  # 5 + 8 * 9 + 7 = 84 columns
    assert len(line1) == 84
    # "bb-cccc" would make line 1 92 columns: it moves down whole (its hyphen is no break point,
    # though "bb-" alone would fit in 88)
    line2 = " " + " ".join(["bb-cccc", *(["d" * 9] * 7), "d" * 8])  # 1 + 7 + 63 + 8 + 8 spaces
    assert len(line2) == 87  # + " e" would be 89 columns: one too many
    url = "https://example.org/" + "x" * 80  # longer than a line: kept whole on its own line
    value = " ".join([*words, "bb-cccc", *(["d" * 9] * 7), "d" * 8, "e", url])
    assert PO.header_text({"Subject": "s", "Why": value, "Empty": ""}) == (
        "Subject: s\n" + line1 + "\n" + line2 + "\n" + " e\n" + " " + url + "\n" + "Empty:\n\n"
    )


# ------------------------------------------------------------------ the port's verdicts and details
# where B changes f near the hunk, its exact context is left only in g's identical body (refused there)
IN_G = (
    "toy/mod.py: the exact context matches, but in another place: "
    "a removed line lands in g, in A it is in f: 'c = b - 3'; a added line lands in g, in A it is in "
    "f: 'c = b - 4'"
)


def test_applies_reports_every_field(tmp_path, a_series):
    b_mod = "import os\n" + A_MOD
    said = events.Recorder()
    rep = PO.port(a_series[0], a_series[1], tree(tmp_path / "b", b_mod), "2.0", out_dir=tmp_path / "out", reporter=said)
    assert said.lines == ["0001-f.patch: probe on toy 2.0 as shipped and on the ported tree"]
    (pp,) = rep.patches
    assert pp.detail == ["toy/mod.py: every hunk's context found exactly in 2.0."]
    doc = json.loads(PO.render(rep, "json"))
    assert {k: v for k, v in doc.items() if k != "patches"} == {
        "package": "toy",
        "from": "1.0",
        "to": "2.0",
        "merge": "merge3",
        "out_dir": str(tmp_path / "out"),
        "needs_review": False,
    }
    (p,) = doc["patches"]
    assert {k: v for k, v in p.items() if not k.startswith("probe_")} == {
        "patch": "0001-f.patch",
        "subject": "f subtracts four",
        "status": "applies",
        "detail": pp.detail,
        "files": ["toy/mod.py"],
        "probe": "0001-f.probe.py",
    }
    assert (p["probe_unpatched"]["status"], p["probe_ported"]["status"]) == ("fail", "pass")
    assert PO.render(rep, "json").startswith('{\n  "package": "toy",\n  "from": "1.0",\n')  # indented by 2
    assert PO.render(rep).endswith(f"\nseries written to {tmp_path / 'out'}\n")  # text by default
    assert (tmp_path / "out" / "series").read_text() == (
        "# toy 2.0, ported from 1.0 by build-image patch port\n0001-f.patch\n"
    )
    text = (tmp_path / "out" / "0001-f.patch").read_text()
    assert "\nApplies-To: toy==2.0\n" in text
    assert "\nPorted-From: toy==1.0: applies (no fuzz; offsets regenerated)\n\n--- a/toy/mod.py\n" in text


def test_merged_says_so_in_its_header_and_detail(tmp_path, a_series):
    b_mod = A_MOD.replace("    a = x + 1\n", "    a = x + 1  # B\n", 1)
    rep = port_to(tmp_path, a_series, b_mod, out="out")
    (pp,) = rep.patches
    assert pp.status == PO.MERGED
    assert pp.detail == [IN_G, "toy/mod.py: three-way merge (A's original as the ancestor) succeeded; review it."]
    ported = P.load_series(tmp_path / "out", "2.0").patches[0]
    assert ported.headers["Ported-From"] == (
        "toy==1.0: merged (three-way merge with the old release's original as the ancestor; needs review)"
    )


def test_upstream_puts_the_retirement_first(tmp_path, a_series):
    rep = port_to(tmp_path, a_series, PATCHED_A)
    (pp,) = rep.patches
    assert pp.status == PO.UPSTREAM and len(pp.detail) > 1
    assert pp.detail[0] == "toy 2.0 unpatched passes the probe 0001-f.probe.py: propose retiring the patch."
    assert pp.to_dict()["probe_ported"] is None and pp.to_dict()["probe_unpatched"]["status"] == "pass"


def test_conflict_runs_only_the_unpatched_probe(tmp_path, a_series):
    b_mod = A_MOD.replace("    c = b - 3\n", "    c = b - 3  # B changed this line\n", 1)
    said = events.Recorder()
    series, a = a_series
    rep = PO.port(series, a, tree(tmp_path / "b", b_mod), "2.0", reporter=said)
    (pp,) = rep.patches
    assert said.lines == ["0001-f.patch: probe on toy 2.0 as shipped"]
    assert pp.status == PO.CONFLICT and pp.probe_ported is None and pp.probe_unpatched.status == PR.FAIL
    assert pp.detail == [
        IN_G,
        "toy/mod.py: 1 region(s) did not merge:",
        "conflict at B's lines 8-8 (A's original lines 8-8):\n<<<<<<< patched A\n    c = b - 4\n"
        "||||||| A original\n    c = b - 3\n=======\n    c = b - 3  # B changed this line\n>>>>>>> B original\n",
    ]


def test_exact_context_in_the_wrong_function_names_every_misplaced_line(tmp_path, a_series):
    b_mod = A_MOD.replace("    p = b + 0\n", "    p = b + 0  # B\n", 1)  # the context now matches only in g
    (pp,) = port_to(tmp_path, a_series, b_mod).patches
    assert pp.status == PO.CONFLICT
    assert pp.detail[0] == IN_G


@pytest.mark.parametrize(
    "probe_header, shown", [("", "no Probe: header"), ("Probe: 0001-f.probe.py\n", "0001-f.probe.py")]
)
def test_no_probe_no_port(tmp_path, a_series, probe_header, shown):
    series, a = a_series
    p = series.dir / "0001-f.patch"
    p.write_text(p.read_text().replace("Probe: 0001-f.probe.py\n", probe_header))
    (series.dir / "0001-f.probe.py").unlink()  # named but missing, or not named at all
    series = P.load_series(series.dir, "1.0")
    rep = PO.port(series, a, tree(tmp_path / "b", "import os\n" + A_MOD), "2.0", out_dir=tmp_path / "out")
    (pp,) = rep.patches
    assert pp.status == PO.CONFLICT and pp.probe_unpatched is None
    assert pp.detail[-1] == f"no probe to run ({shown}): a port is never accepted without its probe passing."
    assert not (tmp_path / "out" / "0001-f.probe.py").exists()
    assert (tmp_path / "out" / "0001-f.patch.conflict").read_text().splitlines()[-1] == pp.detail[-1]


def test_patch_that_does_not_fit_its_own_release_is_bad_input(tmp_path, a_series):
    series, _ = a_series
    other_a = tree(tmp_path / "a2", A_MOD.replace("    c = b - 3\n", "    c = b - 7\n", 1))
    with pytest.raises(PO.BadInput, match=r"0001-f.patch does not apply to its own release: hunk #1 does not match"):
        PO.port_series(series, other_a, tree(tmp_path / "b", A_MOD), "2.0", probes=False)
    empty = tmp_path / "a3"
    (empty / "toy").mkdir(parents=True)
    with pytest.raises(PO.BadInput, match=r"a3: toy/mod.py \(a target of series .*series-1.0\) does not exist"):
        PO.port_series(series, empty, tree(tmp_path / "b2", A_MOD), "2.0", probes=False)


# ------------------------------------------------------------------ patches of two files; series of two patches
OTHER = '"""other."""\n\n\ndef h(x):\n    y = x\n    z = y\n    w = z\n    return w\n'
PATCHED_OTHER = OTHER.replace("    z = y\n", "    z = y + 1\n")
PROBE2 = PROBE.replace('import toy.mod as m\n', 'import toy.mod as m\nimport toy.other as o\n').replace(
    'checks = [', 'checks = [{"name": "h(1) == 2", "ok": o.h(1) == 2},\n          '
)


@pytest.fixture
def two_files(tmp_path) -> tuple[P.Series, Path]:
    a = tree(tmp_path / "a", A_MOD)
    (a / "toy" / "other.py").write_text(OTHER)
    d = tmp_path / "series-1.0"
    d.mkdir()
    (d / "0001-f.patch").write_text(
        HEADER.format(v="1.0") + diff("toy/mod.py", A_MOD, PATCHED_A) + diff("toy/other.py", OTHER, PATCHED_OTHER)
    )
    (d / "0001-f.probe.py").write_text(PROBE2)
    (d / "series").write_text("0001-f.patch\n")
    return P.load_series(d, "1.0"), a


def port_two(tmp_path, two_files, b_mod: str | None, b_other: str = OTHER, out: str | None = None):
    series, a = two_files
    b = tmp_path / "b"
    (b / "toy").mkdir(parents=True)
    (b / "toy" / "__init__.py").write_text("")
    if b_mod is not None:
        (b / "toy" / "mod.py").write_text(b_mod)
    (b / "toy" / "other.py").write_text(b_other)
    return PO.port(series, a, b, "2.0", out_dir=tmp_path / out if out else None)


OTHER_OK = "toy/other.py: every hunk's context found exactly in 2.0."


def test_two_files_that_apply_are_one_ported_patch(tmp_path, two_files):
    rep = port_two(tmp_path, two_files, "import os\n" + A_MOD, "import os\n" + OTHER, out="out")
    (pp,) = rep.patches
    assert pp.status == PO.APPLIES and sorted(pp.files) == ["toy/mod.py", "toy/other.py"]
    ported = P.load_series(tmp_path / "out", "2.0")
    assert [f.relpath for f in ported.patches[0].files] == ["toy/mod.py", "toy/other.py"]
    assert [r.status for r in P.check(ported, tmp_path / "b")] == ["applied"]


def test_every_file_of_a_patch_is_reported_when_an_earlier_one_fails(tmp_path, two_files):
    # the first file is missing in B
    (pp,) = port_two(tmp_path / "1", two_files, None).patches
    assert pp.status == PO.CONFLICT and pp.probe_ported is None
    assert pp.detail == ["toy/mod.py: no such file in toy 2.0.", OTHER_OK]
    # the first file's change conflicts with B's
    b_mod = A_MOD.replace("    c = b - 3\n", "    c = b - 3  # B\n", 1)
    (pp,) = port_two(tmp_path / "2", two_files, b_mod).patches
    assert pp.status == PO.CONFLICT and pp.probe_ported is None
    assert pp.detail[1] == "toy/mod.py: 1 region(s) did not merge:" and pp.detail[3:] == [OTHER_OK]
    # B renamed the function: the first file merges, but into another function
    b_mod = A_MOD.replace("def f(x):\n", "def f2(x):\n")
    (pp,) = port_two(tmp_path / "3", two_files, b_mod).patches
    assert pp.status == PO.CONFLICT and pp.probe_ported is None
    assert pp.detail == [
        "toy/mod.py: the merge puts the change elsewhere: "
        "a removed line lands in f2, in A it is in f: 'c = b - 3'; "
        "a added line lands in f2, in A it is in f: 'c = b - 4'",
        OTHER_OK,
    ]


PATCHED_A2 = PATCHED_A.replace("    d = c * c\n", "    d = c * c + 1\n", 1)  # next to the first patch's line
PROBE_2 = PROBE.replace('"f(1) == 2 (patched)", "ok": m.f(1) == 2', '"f(1) == 3 (both)", "ok": m.f(1) == 3')


class Recording(PR.ProbeRunner):
    """Runs probes and records (probe, tree, toy/mod.py as the probe saw it)."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, Path, str]] = []

    def run(self, probe, tree):
        self.seen.append((Path(probe).name, Path(tree), (Path(tree) / "toy" / "mod.py").read_text()))
        return super().run(probe, tree)


def test_a_series_ports_in_order_each_patch_on_top_of_the_earlier_ones(tmp_path, a_series):
    series, a = a_series
    d = series.dir
    (d / "0002-f.patch").write_text(
        HEADER.format(v="1.0").replace("0001-f.probe.py", "0002-f.probe.py") + diff("toy/mod.py", PATCHED_A, PATCHED_A2)
    )
    (d / "0002-f.probe.py").write_text(PROBE_2)
    (d / "series").write_text("0001-f.patch\n0002-f.patch\n")
    series = P.load_series(d, "1.0")
    top = "import os\n"
    b = tree(tmp_path / "b", top + A_MOD)
    runner = Recording()
    rep = PO.port_series(series, a, b, "2.0", runner_b=runner)
    assert [p.status for p in rep.patches] == [PO.APPLIES, PO.APPLIES]
    assert (rep.package, rep.from_version, rep.to_version) == ("toy", "1.0", "2.0")
    # patch 1: B as shipped (the tree itself, no copy) and B + patch 1;
    # patch 2: B + patch 1 (its unpatched tree) and B + both
    assert sorted((name, text) for name, _, text in runner.seen) == sorted(
        [
            ("0001-f.probe.py", top + A_MOD),
            ("0001-f.probe.py", top + PATCHED_A),
            ("0002-f.probe.py", top + PATCHED_A),
            ("0002-f.probe.py", top + PATCHED_A2),
        ]
    )
    assert [t for name, t, text in runner.seen if text == top + A_MOD] == [b]
    assert (b / "toy" / "mod.py").read_text() == top + A_MOD  # B itself is never modified
    PO.write_series(rep, series, tmp_path / "out", b_originals=PO.b_originals(series, b), wheel=None)
    ported = P.load_series(tmp_path / "out", "2.0")
    assert [r.status for r in P.check(ported, b)] == ["applied", "applied"]


def test_port_leaves_no_temporary_files(tmp_path, a_series, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    (pp,) = port_to(tmp_path, a_series, "import os\n" + A_MOD).patches
    assert pp.status == PO.APPLIES and pp.probe_ported.status == PR.PASS  # a ported tree was made and probed
    assert list(tmp.iterdir()) == []


# ------------------------------------------------------------------ writing B's series
def wheel(path: Path, mod: str) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("toy/__init__.py", "")
        z.writestr("toy/mod.py", mod)
    return path


def test_port_from_a_wheel_records_the_wheel(tmp_path, a_series, monkeypatch):
    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path / "cache"))
    series, a = a_series
    whl = wheel(tmp_path / "toy-2.0-py3-none-any.whl", "import os\n" + A_MOD)
    rep = PO.port(series, a, whl, "2.0", out_dir=tmp_path / "out")
    assert [p.status for p in rep.patches] == [PO.APPLIES] and rep.out_dir == str(tmp_path / "out")
    assert (tmp_path / "out" / "wheel.sha256").read_text() == (
        f"{hashlib.sha256(whl.read_bytes()).hexdigest()}  toy-2.0-py3-none-any.whl\n"
    )
    ported = P.load_series(tmp_path / "out", "2.0")
    assert (ported.wheel_filename, ported.originals) == (
        "toy-2.0-py3-none-any.whl",
        {"toy/mod.py": hashlib.sha256(("import os\n" + A_MOD).encode()).hexdigest()},
    )


def test_without_probes_nothing_is_extracted_or_run(tmp_path, a_series, monkeypatch):
    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path / "cache"))
    series, a = a_series
    whl = wheel(tmp_path / "toy-2.0-py3-none-any.whl", "import os\n" + A_MOD)
    rep = PO.port_series(series, a, whl, "2.0", runner_b=Recording(), probes=False)
    (pp,) = rep.patches
    assert pp.status == PO.CONFLICT and (pp.probe_unpatched, pp.probe_ported) == (None, None)
    assert pp.detail[-1].startswith("no probe to run (0001-f.probe.py)")
    assert not (tmp_path / "cache" / "probe-trees").exists()


def test_write_series_files(tmp_path, a_series):
    series, a = a_series
    (series.dir / "probe-env.txt").write_text("torch==2.11.0\n")
    b = tree(tmp_path / "b", A_MOD.replace("    c = b - 3\n", "    c = b - 3  # B\n", 1))
    rep = PO.port_series(series, a, b, "2.0", probes=False)  # a conflict
    out = tmp_path / "deep" / "er" / "out"  # parents are made
    PO.write_series(rep, series, out, b_originals=PO.b_originals(series, b), wheel=None)
    (pp,) = rep.patches
    conflict = (out / "0001-f.patch.conflict").read_text()
    # the report's detail, one entry after another on its own lines
    assert conflict == (
        IN_G + "\ntoy/mod.py: 1 region(s) did not merge:\n"
        "conflict at B's lines 8-8 (A's original lines 8-8):\n<<<<<<< patched A\n    c = b - 4\n"
        "||||||| A original\n    c = b - 3\n=======\n    c = b - 3  # B\n>>>>>>> B original\n\n"
    )
    assert (out / "series").read_text() == (
        "# toy 2.0, ported from 1.0 by build-image patch port\n"
        "# 0001-f.patch  conflict: see 0001-f.patch.conflict, finish by hand, then list it here\n"
    )
    assert (out / "probe-env.txt").read_text() == "torch==2.11.0\n"  # the probes' environment comes along
    assert (out / "0001-f.probe.py").read_text() == PROBE
    assert not (out / "wheel.sha256").exists()
    # a second run into the same folder keeps a probe-env.txt already there (edited for B)
    (out / "probe-env.txt").write_text("torch==2.12.0\n")
    whl = wheel(tmp_path / "toy-2.0-py3-none-any.whl", A_MOD)
    PO.write_series(rep, series, out, b_originals=PO.b_originals(series, b), wheel=whl)
    assert (out / "probe-env.txt").read_text() == "torch==2.12.0\n"
    assert (out / "wheel.sha256").read_text() == f"{hashlib.sha256(whl.read_bytes()).hexdigest()}  {whl.name}\n"


def test_probe_env_comes_from_the_output_then_the_shipped_b_series_then_a(tmp_path, a_series, monkeypatch):
    series, _ = a_series
    root = tmp_path / "patches"
    shipped = root / "toy" / "2.0"
    shipped.mkdir(parents=True)
    (shipped / "series").write_text("")
    monkeypatch.setattr(P, "patches_root", lambda: root)
    out = tmp_path / "out"
    out.mkdir()
    assert PO.probe_env_dir(series, "2.0", out) == series.dir  # nobody has one: A's series
    (shipped / "probe-env.txt").write_text("torch\n")
    assert PO.probe_env_dir(series, "2.0", None) == shipped  # B's shipped series
    assert PO.probe_env_dir(series, "2.0", out) == shipped
    (out / "probe-env.txt").write_text("torch\n")
    assert PO.probe_env_dir(series, "2.0", out) == out  # the output folder first
    assert PO.probe_env_dir(series, "3.0", None) == series.dir  # no series shipped for 3.0


def test_port_runs_the_probes_where_the_output_says(tmp_path, a_series, monkeypatch):
    seen = []

    def runner_for(series_dir, python=None):
        seen.append((series_dir, python))
        return PR.ProbeRunner(python)

    monkeypatch.setattr(PR, "runner_for", runner_for)
    out = tmp_path / "out"
    out.mkdir()
    (out / "probe-env.txt").write_text("torch\n")
    series, a = a_series
    PO.port(series, a, tree(tmp_path / "b", A_MOD), "2.0", out_dir=out, probe_python=sys.executable)
    assert seen == [(out, sys.executable)]
    # without an output folder: B's shipped series (found by B's version), whose probe-env.txt is B's
    shipped = tmp_path / "patches" / "toy" / "2.0"
    shipped.mkdir(parents=True)
    (shipped / "series").write_text("")
    (shipped / "probe-env.txt").write_text("torch\n")
    monkeypatch.setattr(P, "patches_root", lambda: tmp_path / "patches")
    PO.port(series, a, tree(tmp_path / "b2", A_MOD), "2.0", probe_python=sys.executable)
    assert seen[-1] == (shipped, sys.executable)


# ------------------------------------------------------------------ rendering (pure)
def report_of_every_status() -> PO.PortReport:
    ok = PR.ProbeRun(PR.PASS, [{"name": "f(1) == 2", "ok": True}])
    bad = PR.ProbeRun(PR.FAIL, [{"name": "f(1) == 2", "ok": False}])
    piped = PR.ProbeRun(PR.FAIL, [{"name": "a|b", "ok": False}])
    region = (
        "conflict at B's lines 8-8 (A's original lines 8-8):\n<<<<<<< patched A\n    c = b - 4\n"
        "||||||| A original\n    c = b - 3\n=======\n    c = b - 3  # B\n>>>>>>> B original\n"
    )
    return PO.PortReport(
        "toy",
        "1.0",
        "2.0",
        [
            PO.PortedPatch(
                "0001-a.patch",
                "a fix",
                PO.APPLIES,
                ["toy/mod.py: every hunk's context found exactly in 2.0."],
                files={"toy/z.py": (b"", b""), "toy/a.py": (b"", b"")},
                probe_unpatched=bad,
                probe_ported=ok,
                probe="0001-a.probe.py",
            ),
            PO.PortedPatch(
                "0002-b.patch",
                "b fix",
                PO.MERGED,
                ["toy/mod.py: merged; review it."],
                probe_unpatched=bad,
                probe_ported=ok,
            ),
            PO.PortedPatch(
                "0003-c.patch",
                "c fix",
                PO.CONFLICT,
                ["toy/mod.py: 1 region(s) did not merge:", region],
                probe_unpatched=bad,
            ),
            PO.PortedPatch(
                "0004-d.patch",
                "d fix",
                PO.UPSTREAM,
                ["toy 2.0 unpatched passes: retire it.", "toy/mod.py: x"],
                probe_unpatched=ok,
            ),
            PO.PortedPatch(
                "0005-e.patch",
                "e fix",
                PO.CONFLICT,
                ["the probe does not pass on the ported tree."],
                probe_unpatched=piped,
                probe_ported=piped,
            ),
        ],
        out_dir="/srv/out",
    )


REGION_LINES = [
    "conflict at B's lines 8-8 (A's original lines 8-8):",
    "<<<<<<< patched A",
    "    c = b - 4",
    "||||||| A original",
    "    c = b - 3",
    "=======",
    "    c = b - 3  # B",
    ">>>>>>> B original",
]


def test_render_text():
    # per patch: status (padded to 9) name subject; its detail indented by 6; the probe evidence where
    # a probe ran on the ported tree or retires the patch
    assert (
        PO.render(report_of_every_status(), "text")
        == "\n".join(
            [
                "toy patch series: 1.0 -> 2.0",
                "  applies   0001-a.patch  a fix",
                "      toy/mod.py: every hunk's context found exactly in 2.0.",
                "      probe on the ported tree: 1 check(s) pass",
                "  merged    0002-b.patch  b fix",
                "      toy/mod.py: merged; review it.",
                "      probe on the ported tree: 1 check(s) pass",
                "  conflict  0003-c.patch  c fix",
                "      toy/mod.py: 1 region(s) did not merge:",
                *["      " + ln for ln in REGION_LINES],
                "  upstream  0004-d.patch  d fix",
                "      toy 2.0 unpatched passes: retire it.",
                "      toy/mod.py: x",
                "      probe passes unpatched: 1 check(s) pass",
                "  conflict  0005-e.patch  e fix",
                "      the probe does not pass on the ported tree.",
                "      probe on the ported tree: 1 of 1 check(s) fail: a|b",
                "series written to /srv/out",
            ]
        )
        + "\n"
    )
    assert PO.render(report_of_every_status()) == PO.render(report_of_every_status(), "text")


def test_render_markdown():
    # a table (evidence: the probe, else the first line of the detail; no '|' or newline in a cell),
    # then each conflict's detail in a collapsed diff block
    assert (
        PO.render(report_of_every_status(), "markdown")
        == "\n".join(
            [
                "### toy patch series: 1.0 -> 2.0",
                "",
                "| patch | status | evidence |",
                "| --- | --- | --- |",
                "| `0001-a.patch` | **applies** | probe on the ported tree: 1 check(s) pass |",
                "| `0002-b.patch` | **merged** | probe on the ported tree: 1 check(s) pass |",
                "| `0003-c.patch` | **conflict** | toy/mod.py: 1 region(s) did not merge: |",
                "| `0004-d.patch` | **upstream** | probe passes unpatched: 1 check(s) pass |",
                "| `0005-e.patch` | **conflict** | probe on the ported tree: 1 of 1 check(s) fail: a b |",
                "",
                "<details><summary>0003-c.patch: what did not port</summary>",
                "",
                "```diff",
                "toy/mod.py: 1 region(s) did not merge:",
                *REGION_LINES,
                "```",
                "</details>",
                "",
                "<details><summary>0005-e.patch: what did not port</summary>",
                "",
                "```diff",
                "the probe does not pass on the ported tree.",
                "```",
                "</details>",
                "",
                "series written to /srv/out",
            ]
        )
        + "\n"
    )


def test_markdown_evidence_cell_is_one_line_of_at_most_400_characters():
    detail = "x|" * 300 + "\nsecond line"
    rep = PO.PortReport("toy", "1.0", "2.0", [PO.PortedPatch("0001-a.patch", "a", PO.CONFLICT, [detail])])
    row = PO.render(rep, "markdown").splitlines()[4]
    assert row == "| `0001-a.patch` | **conflict** | " + "x " * 200 + " |"


def test_report_as_json():
    rep = report_of_every_status()
    doc = json.loads(PO.render(rep, "json"))
    assert {k: v for k, v in doc.items() if k != "patches"} == {
        "package": "toy",
        "from": "1.0",
        "to": "2.0",
        "merge": "merge3",
        "out_dir": "/srv/out",
        "needs_review": True,
    }
    assert doc["patches"][0] == {
        "patch": "0001-a.patch",
        "subject": "a fix",
        "status": "applies",
        "detail": ["toy/mod.py: every hunk's context found exactly in 2.0."],
        "files": ["toy/a.py", "toy/z.py"],
        "probe": "0001-a.probe.py",
        "probe_unpatched": {"status": "fail", "checks": [{"name": "f(1) == 2", "ok": False}], "seconds": 0.0},
        "probe_ported": {"status": "pass", "checks": [{"name": "f(1) == 2", "ok": True}], "seconds": 0.0},
    }
    assert (doc["patches"][2]["probe_ported"], doc["patches"][2]["probe"]) == (None, None)
    # ASCII on the wire: a subject outside ASCII is escaped, and reads back the same
    rep.patches[0].subject = "Größe"
    text = PO.render(rep, "json")
    assert '"subject": "Gr\\u00f6\\u00dfe"' in text and json.loads(text)["patches"][0]["subject"] == "Größe"
    assert [p["status"] for p in doc["patches"]] == ["applies", "merged", "conflict", "upstream", "conflict"]
    no_probes = PO.PortedPatch("0006-f.patch", "f", PO.CONFLICT, ["x"]).to_dict()
    assert (no_probes["probe_unpatched"], no_probes["probe_ported"]) == (None, None)


def test_a_port_output_that_holds_a_hand_made_series_is_refused(tmp_path):
    import re

    out = tmp_path / "out"
    PO.refuse_foreign_series(out)  # absent: fine
    out.mkdir()
    PO.refuse_foreign_series(out)  # empty: fine
    (out / "series").write_text("# vllm 2.0, ported from 1.0 by build-image patch port\n0001-f.patch\n")
    PO.refuse_foreign_series(out)  # written by an earlier port: fine
    (out / "series").write_text("# vllm 2.0, ported from 1.0 by build-image patch port   \n")
    PO.refuse_foreign_series(out)  # trailing blanks on the mark line
    for first in (
        "0001-f.patch\n",
        "# my own series\n",
        "vllm 2.0 by build-image patch port\n",
        "\n# vllm 2.0, ported from 1.0 by build-image patch port\n",
    ):
        (out / "series").write_text(first)
        with pytest.raises(BadInput) as ei:
            PO.refuse_foreign_series(out)
        assert ei.value.message == (
            f"-o {out} holds files and is not a series ported by build-image (its series file does not open with "
            "'# … by build-image patch port'); porting into it would overwrite its patches. Nothing was written."
        )
        assert ei.value.hint == "port into a new folder, or pass --force to write B's series there anyway."
        PO.refuse_foreign_series(out, force=True)  # --force: written anyway
    (out / "series").unlink()
    (out / "0001-f.patch").write_text("x")  # files but no series file at all
    with pytest.raises(BadInput, match=re.escape(f"-o {out} holds files and is not a series ported")):
        PO.refuse_foreign_series(out)
    (out / "series").write_bytes(b"# \xff\xfe by build-image patch port\n")  # not UTF-8: read leniently
    PO.refuse_foreign_series(out)
    mark = " by build-image patch port"
    (out / "series").write_text("# " + "x" * (4096 - 2 - len(mark)) + mark + "\n")  # the mark ends at byte 4096
    PO.refuse_foreign_series(out)
    (out / "series").write_text("# " + "x" * (4097 - 2 - len(mark)) + mark + "\n")  # only the first 4 KiB read
    with pytest.raises(BadInput):
        PO.refuse_foreign_series(out)
    a_file = tmp_path / "file"
    a_file.write_text("")
    for force in (False, True):
        with pytest.raises(
            BadInput,
            match=rf"^-o {re.escape(str(a_file))} exists and is not a directory; a ported "
            r"series is a folder\.$",
        ):
            PO.refuse_foreign_series(a_file, force=force)
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(BadInput, match="exists and is not a directory"):
        PO.refuse_foreign_series(link)


# ------------------------------------------------------------------ shared probes
def _shared_layout(tmp_path, a_series) -> Path:
    """A's series moved into ``patches/toy/1.0/`` with its probe in the shared ``patches/toy/probes/``."""
    series, _ = a_series
    root = tmp_path / "patches" / "toy"
    (root / "probes").mkdir(parents=True)
    shutil.move(series.dir / "0001-f.probe.py", root / "probes" / "0001-f.probe.py")
    shutil.move(series.dir, root / "1.0")
    return root


def test_a_probe_is_found_in_the_shared_folder_unless_the_release_has_its_own(tmp_path, a_series):
    root = _shared_layout(tmp_path, a_series)
    series = P.load_series(root / "1.0", "1.0")
    (patch,) = series.patches
    assert PR.probe_path(series.dir, patch) == root / "probes" / "0001-f.probe.py"
    (res,) = PR.probe_series(series, a_series[1])  # run from the shared folder
    assert (res.needed, res.works) == (True, True)
    (series.dir / "0001-f.probe.py").write_text(PROBE.replace("== 2 (patched)", "== 2 (own copy)"))
    assert PR.probe_path(series.dir, patch) == series.dir / "0001-f.probe.py"  # the release's copy wins
    patch.headers[PR.PROBE_FIELD] = "0002-missing.probe.py"
    with pytest.raises(BadInput) as e:
        PR.probe_path(series.dir, patch)
    assert e.value.message == (
        f"patch {series.dir / '0001-f.patch'}: its probe '0002-missing.probe.py' is not a "
        f"file in {series.dir} (nor in {root / 'probes'})."
    )


def test_port_into_the_shared_layout_writes_no_copy_of_a_probe_that_fits(tmp_path, a_series):
    """`patch port -o patches/toy/2.0`: the shared probe passes on B, so B's series has no copy of it;
    a probe that is not the shared one (A's own copy) is written into B's series."""
    root = _shared_layout(tmp_path, a_series)
    series = P.load_series(root / "1.0", "1.0")
    b_mod = A_MOD.replace('"""toy module."""\n', '"""toy module."""\n\nVERSION = 2\n')
    b = tree(tmp_path / "b", b_mod)
    (root / "2.0").mkdir()
    (root / "2.0" / "0001-f.probe.py").write_text(PROBE)  # left by an earlier port: the shared one is used
    rep = PO.port(series, a_series[1], b, "2.0", out_dir=root / "2.0")
    assert rep.patches[0].status == PO.APPLIES and rep.patches[0].probe_ported.status == PR.PASS
    assert sorted(p.name for p in (root / "2.0").iterdir()) == ["0001-f.patch", "series", "sha256sums.orig"]
    ported = P.load_series(root / "2.0", "2.0")
    assert PR.probe_path(ported.dir, ported.patches[0]) == root / "probes" / "0001-f.probe.py"
    own = PROBE + "# differs from the shared probe\n"
    (series.dir / "0001-f.probe.py").write_text(own)
    PO.port(series, a_series[1], b, "2.0", out_dir=root / "2.0")
    assert (root / "2.0" / "0001-f.probe.py").read_text() == own
