"""The last three gaps of issue 25 (docs/faults.md, "Hostile inputs and outputs"), each closed by one rule:

* **redaction of what succeeds**: every ``--json`` document and report goes through one writer
  (``builder/report.py: render_json / emit_json / emit_text``) that redacts every string in it, and every
  generated file text (lock, pylock twin, Dockerfile, SBOM, provenance, base manifest) is redacted by its
  generator; a manifest or a base image reference carrying a credential is refused where it enters;
* **upgrade -o**: the output rule of ``lock`` and ``render`` (``builder/upgrade.py: check_outputs``) before
  any work: never replace a report, lock or manifest build-image did not write without ``--force``;
  links written through; special files refused;
* **SIGKILL leftovers**: an atomic write's temp file carries its owner (``.NAME.<pid>-<start>.<random>.tmp``);
  the next write of that file, and every ``lock`` run, sweeps the ones whose owner is gone
  (``builder/util.py: sweep_write_leftovers``).

Each case asserts the exit code, that the message names the cause, that nothing the user had was lost
and that nothing half-written remains.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.scratch import process_tag

from .conftest import ROOT, cli, render_args, tiny_context

SECRET = "PW-s3cr3t"


def _no_bug(r: subprocess.CompletedProcess) -> None:
    assert r.returncode != 70 and "This is a bug" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file() and not p.is_symlink()}


def _no_secret(*texts: str) -> None:
    for t in texts:
        assert SECRET not in t and "tok3n" not in t, t[:2000]


def _temps(d: Path) -> list[str]:
    return sorted(p.name for p in d.rglob(".*.tmp"))


@pytest.fixture
def env(tmp_path):
    return {"BUILD_IMAGE_CACHE": str(tmp_path / "cache")}


# ============================================================== A. redaction of successful output and files
#: ``json.dumps`` / ``json.dump`` outside the one writer: internal hashing, caches, wire protocols
_JSON_ALLOWED = {
    "builder/report.py": 1,  # the one writer itself
    "builder/resolve/lock.py": 3,  # inputs-sha256 (hashed), the facts cache (x2)
    "builder/image/sbom.py": 1,  # the serial number's seed (hashed)
    "builder/resolve/reconstruct.py": 1,  # the replay record's key (hashed; it holds the index options)
    "builder/image/referrers.py": 5,  # OCI descriptors, the .att manifest and its config pushed (digests)
    "builder/image/materialize.py": 5,  # the Dockerfile's ENV/ENTRYPOINT/CMD quoting (x4), the lacks label (redacted)
    "builder/serving/admission.py": 2,  # scalars quoted in the admission policies (digests, numbers, GPU names)
    "builder/signing.py": 1,  # the DSSE envelope's canonical bytes (pushed by digest)
    "builder/image/multiplatform.py": 1,  # the OCI image index pushed to the registry (its digest)
    "builder/serving/smoke/client.py": 2,  # request bodies to the server under test
    "builder/serving/smoke/equivalence.py": 1,  # canonical bytes for a digest (the reference: render_json)
    "builder/serving/smoke/serve.py": 1,  # the serve app's --args
    "builder/serving/smoke/report.py": 1,  # a plan excerpt inside the text report (emit_text redacts it)
    "builder/serving/raycheck.py": 2,  # the in-container probe's arguments
    "builder/serving/checkpoint_content.py": 1,  # the digest cache
    "builder/serving/attestation.py": 1,  # the statement's canonical bytes (redacted; pushed by digest)
    "builder/serving/history.py": 1,  # the history's canonical bytes (hashed)
    "builder/serving/kuberay.py": 1,  # the serve config's canonical bytes (hashed into an annotation)
}


def _json_writes(path: Path) -> int:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return sum(
        1
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("dumps", "dump")
        and getattr(n.func.value, "id", None) == "json"
    )


def test_every_json_document_goes_through_the_one_redacting_writer():
    found = {
        str(p.relative_to(ROOT)): n
        for p in sorted((ROOT / "builder").rglob("*.py"))
        if "/data/" not in str(p) and (n := _json_writes(p))
    }
    assert found == _JSON_ALLOWED, "a JSON document made outside builder/report.py: render_json is not redacted"
    commands = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "builder" / "commands").glob("*.py")
        if "sys.stdout.write(json" in p.read_text() or "click.echo(json" in p.read_text()
    ]
    assert commands == []


def test_the_writer_redacts_every_form_in_values_keys_and_stringified_objects():
    from builder.report import render_json

    doc = {
        "url": f"https://ci-bot:{SECRET}@h.example/simple/",
        "collapsed": f"https:/ci-bot:{SECRET}@h.example/x",
        "bare": [f"ci-bot:{SECRET}@reg.example:5000/repo"],
        "query": "https://s3.example/w.whl?token=tok3n&v=1",
        f"https://k:{SECRET}@key.example/": 1,
        "path": Path(f"/x/https:/u:{SECRET}@h/y"),
        "digest": "vllm/vllm-openai:v0.26.0@sha256:" + "0" * 64,
        "n": 3,
        "mail": "a@b.org",
    }
    text = render_json(doc, stringify=True)
    _no_secret(text)
    got = json.loads(text)
    assert got["url"] == "https://****@h.example/simple/" and got["bare"] == ["****@reg.example:5000/repo"]
    assert got["query"] == "https://s3.example/w.whl?token=****&v=1" and got["n"] == 3 and got["mail"] == "a@b.org"
    assert got["digest"] == doc["digest"]


def _snapshot_args(sp: Path, out: Path, *extra: str) -> list[str]:
    return [
        "base",
        "snapshot",
        "--site-packages",
        str(sp),
        "--python",
        "3.12",
        "--glibc",
        "2.35",
        "--cuda",
        "13.0",
        "-o",
        str(out),
        *extra,
    ]


@pytest.fixture
def site_packages(tmp_path) -> Path:
    sp = tmp_path / "sp"
    (sp / "six-1.0.dist-info").mkdir(parents=True)
    (sp / "six-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: six\nVersion: 1.0\n")
    return sp


def test_base_snapshot_json_and_manifest_carry_no_credential_from_the_method(tmp_path, env, site_packages):
    out = tmp_path / "m.json"
    method = f"rsync from https://ci-bot:{SECRET}@files.example/sp?token=tok3n"
    r = cli(
        _snapshot_args(site_packages, out, "--image-ref", "reg.example/vllm:1", "--method", method, "--json"),
        env=env,
        timeout=120,
    )
    _no_bug(r)
    assert r.returncode == 0, r.stderr
    _no_secret(r.stdout, r.stderr, out.read_text())
    assert json.loads(r.stdout)["image"]["ref"] == "reg.example/vllm:1"
    assert "https://****@files.example/sp?token=****" in out.read_text()
    assert _temps(tmp_path) == []
    # the manifest written is read back as one (nothing in it is refused)
    r = cli(_snapshot_args(site_packages, out, "--image-ref", "reg.example/vllm:1", "--json"), env=env, timeout=120)
    assert r.returncode == 0, r.stderr


def test_a_credential_in_the_base_image_reference_is_refused_and_the_old_manifest_kept(tmp_path, env, site_packages):
    out = tmp_path / "m.json"
    r = cli(_snapshot_args(site_packages, out, "--image-ref", "reg.example/vllm:1"), env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    before = out.read_bytes()
    r = cli(
        _snapshot_args(site_packages, out, "--image-ref", f"ci-bot:{SECRET}@reg.example/vllm:1", "--json"),
        env=env,
        timeout=120,
    )
    _no_bug(r)
    assert r.returncode == 2, r.stderr
    assert "carries a credential" in r.stderr and "docker login" in r.stderr
    _no_secret(r.stdout, r.stderr)
    assert out.read_bytes() == before and _temps(tmp_path) == []


def test_render_refuses_a_manifest_carrying_a_credential_naming_the_field(tmp_path, env):
    ctx, _plan = tiny_context(tmp_path)
    before = _files(ctx)
    doc = json.loads((tmp_path / "base.json").read_text())
    doc["provenance"]["method"] = f"docker run https://ci-bot:{SECRET}@reg.example/x"
    (tmp_path / "base.json").write_text(json.dumps(doc, indent=2) + "\n")
    r = cli(render_args(tmp_path, ctx) + ["--json"], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2, r.stderr
    assert "provenance.method carries a credential" in r.stderr
    _no_secret(r.stdout, r.stderr)
    assert _files(ctx) == before and not [p for p in tmp_path.iterdir() if p.name.startswith(".ctx.")]


def test_a_context_rendered_from_credentialed_values_holds_none(tmp_path):
    """Every generated text of a context (Dockerfile, requirements.lock, pylock.toml, SBOM, provenance,
    the manifest copy) is redacted by its generator, whatever field carried the credential."""
    from builder.image.render import write_context
    from builder.resolve.lockfile import LockEntry, WheelRef

    ctx, plan = tiny_context(tmp_path)
    e = plan.lock.entries[0]
    plan.lock.entries[0] = LockEntry(
        name=e.name,
        version=e.version,
        hashes=e.hashes,
        wheel=WheelRef(url=f"https://ci-bot:{SECRET}@h.example/{e.wheel.filename}", sha256=e.wheel.sha256),
    )
    plan.lock.header["index"] = f"--find-links https://ci-bot:{SECRET}@h.example/"
    plan.lock.overlay[:] = [f"six @ https://ci-bot:{SECRET}@h.example/six.whl?token=tok3n"]
    plan.base.provenance_method = f"docker run https:/ci-bot:{SECRET}@h.example/x"
    wheels = {e.wheel.filename: tmp_path / "wheels-src" / e.wheel.filename}
    write_context(ctx, plan, wheels=wheels)
    for p in ctx.rglob("*"):
        if p.is_file():
            _no_secret(p.read_text(errors="replace"))
    assert "# index: --find-links https://****@h.example/" in (ctx / "requirements.lock").read_text()
    from builder.image.render import verify_context

    verify_context(ctx)  # the redacted texts are what the sums and the provenance describe


# ============================================================== B. upgrade -o: the output rule
def _upgrade(out: Path, *extra: str, fmt: str = "markdown") -> list[str]:
    return ["upgrade", "--from", "0.26.0", "--to", "0.27.0", "--format", fmt, "-o", str(out), *extra]


@pytest.mark.parametrize("fmt, ext", [("markdown", "md"), ("json", "json"), ("text", "txt")])
def test_upgrade_does_not_replace_a_report_build_image_did_not_write(tmp_path, env, fmt, ext):
    out = tmp_path / "pr"
    out.mkdir()
    report = out / f"upgrade-0.26.0-0.27.0.{ext}"
    report.write_text("# my notes on this upgrade\nkeep me\n")
    r = cli(_upgrade(out, fmt=fmt), env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2, r.stderr
    assert str(report) in r.stderr and "not an upgrade report written by build-image" in r.stderr
    assert "--force" in r.stderr
    assert report.read_text() == "# my notes on this upgrade\nkeep me\n"
    assert sorted(p.name for p in out.iterdir()) == [report.name]  # no work was done, nothing else written


def test_upgrade_does_not_replace_a_lock_under_dir_that_is_not_a_lock(tmp_path, env):
    out = tmp_path / "pr"
    lock = out / "lockfiles" / "vllm-0.27.0" / "requirements.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("numpy==2.0  # pinned by hand\n")
    r = cli(_upgrade(out), env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2 and str(lock) in r.stderr and "not a lock written by build-image" in r.stderr, r.stderr
    assert lock.read_text() == "numpy==2.0  # pinned by hand\n"
    assert not (out / "patches").exists() and not list(out.glob("upgrade-*"))


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_upgrade_refuses_a_special_file_as_its_report_even_with_force(tmp_path, env, kind):
    out = tmp_path / "pr"
    out.mkdir()
    report = out / "upgrade-0.26.0-0.27.0.md"
    if kind == "fifo":
        os.mkfifo(report)
    else:
        report.mkdir()
        (report / "keep").write_text("x")
    t0 = time.monotonic()
    r = cli(_upgrade(out, "--force"), env=env, timeout=60)
    _no_bug(r)
    assert r.returncode == 2, r.stderr
    assert ("FIFO" in r.stderr or "named pipe" in r.stderr) if kind == "fifo" else "directory" in r.stderr
    assert time.monotonic() - t0 < 30  # refused at once, never opened
    assert report.is_fifo() if kind == "fifo" else (report / "keep").read_text() == "x"


def _hand_series(d: Path) -> dict[str, bytes]:
    d.mkdir(parents=True)
    (d / "series").write_text("0001-mine.patch\n")
    (d / "0001-mine.patch").write_text("--- a/vllm/x.py\n+++ b/vllm/x.py\n")
    return _files(d)


@pytest.mark.parametrize("command", ["upgrade", "patch port"])
def test_a_series_folder_made_by_hand_is_not_ported_into(tmp_path, env, command):
    if command == "upgrade":
        out = tmp_path / "pr"
        series = out / "patches" / "vllm" / "0.27.0"
        args = _upgrade(out)
    else:
        out = series = tmp_path / "0.27.0"
        args = ["patch", "port", "--from", "0.26.0", "--to", "0.27.0", "-o", str(out)]
    before = _hand_series(series)
    r = cli(args, env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2, r.stderr
    assert str(series) in r.stderr and "not a series ported by build-image" in r.stderr and "--force" in r.stderr
    assert _files(series) == before and _files(out) == {
        str(series.relative_to(out) / k) if out != series else k: v for k, v in before.items()
    }


from tests.test_upgrade import A_MOD, _args, tree  # noqa: E402 - its fixtures (bases, release): conftest


def _b_tree(tmp_path: Path) -> Path:
    return tree(tmp_path / "b-tree", A_MOD.replace('"""toy module."""\n', '"""toy module."""\n\nV = 2\n'))


def test_upgrade_writes_through_a_symlinked_report_and_replaces_its_own(bases, release, tmp_path, wheelhouse):
    from click.testing import CliRunner

    from builder.cli import main

    out = tmp_path / "pr"
    out.mkdir()
    real = tmp_path / "reports" / "upgrade.md"
    real.parent.mkdir()
    real.write_text("## build-image upgrade: vLLM 1.0 -> 2.0\n(an earlier report)\n")
    link = out / "upgrade-1.0-2.0.md"
    link.symlink_to(real)
    # a leftover of a killed report write (dead owner) beside the file the link points to
    dead = real.parent / ".upgrade.md.999999-1.abcd1234.tmp"
    dead.write_text("half")
    args = _args(
        bases,
        release,
        _b_tree(tmp_path),
        "--find-links",
        str(wheelhouse),
        "--with",
        "numpy2user==1.0.0",
        "--format",
        "markdown",
        "-o",
        str(out),
    )
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and os.readlink(link) == str(real)  # the link kept, its target replaced
    assert real.read_text() == r.stdout and "(an earlier report)" not in real.read_text()
    assert not dead.exists() and _temps(tmp_path) == []
    # its own report (and lock) are replaced by the next run without --force
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert real.read_text() == r.stdout
    # a foreign report is replaced with --force only
    real.write_text("hand notes\n")
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "not an upgrade report" in r.output and real.read_text() == "hand notes\n"
    r = CliRunner().invoke(main, [*args, "--force"])
    assert r.exit_code == 0, r.output
    assert real.read_text() == r.stdout


def test_upgrade_json_with_a_password_in_find_links_writes_it_nowhere(
    bases, release, tmp_path, auth_wheel_server, monkeypatch
):
    """Every file `upgrade -o` writes (report, lock, twin, series) and its --json report on stdout."""
    from click.testing import CliRunner

    from builder.cli import main

    srv = auth_wheel_server
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    out = tmp_path / "pr"
    r = CliRunner().invoke(
        main,
        _args(
            bases,
            release,
            _b_tree(tmp_path),
            "--find-links",
            srv.url,
            "--with",
            "numpy2user==1.0.0",
            "--format",
            "json",
            "-o",
            str(out),
        ),
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "build-image/upgrade-report/v1" and doc["lock"]["status"] == "written"
    files = {p: p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()}
    assert out / "upgrade-1.0-2.0.json" in files and out / "lockfiles" / "vllm-2.0" / "requirements.lock" in files
    for where in (*files.values(), r.output):
        assert srv.password not in where and f"{srv.user}:" not in where, where[:2000]
    assert f"http://****@127.0.0.1:{srv.port}/" in files[out / "lockfiles" / "vllm-2.0" / "requirements.lock"]
    assert _temps(tmp_path) == []


# ============================================================== C. SIGKILL leftovers beside a lock
_KILLED_WRITE = """
import os, sys, time
from builder import util
real = os.fsync
def stall(fd):
    print("writing", flush=True)
    time.sleep(600)
os.fsync = stall
util.atomic_write_text(sys.argv[1], "half of a new lock\\n")
"""


def _killed_write(path: Path) -> Path:
    """A process SIGKILLed in the middle of an atomic write of ``path``: its temp file is left beside it."""
    before = set(path.parent.iterdir())
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITE, str(path)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    left = [p for p in set(path.parent.iterdir()) - before]
    assert len(left) == 1 and left[0].name.startswith(f".{path.name}.{proc.pid}-"), left
    return left[0]


def test_the_next_lock_run_sweeps_what_a_killed_write_left_beside_the_lock_and_twin(offline, tmp_path, env):
    out = tmp_path / "r.lock"
    r = cli(offline("--with", "purepkg", "-o", str(out)), env=env)
    assert r.returncode == 0, r.stderr
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    lock_left = _killed_write(out)
    from builder.resolve.lockfile import twin_path

    twin_left = _killed_write(twin_path(out))
    # the killed writes changed nothing the user had
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and not p.name.endswith(".tmp")} == before
    # --check writes nothing (and sweeps nothing); the next lock run, up to date, sweeps both
    r = cli(offline("--with", "purepkg", "-o", str(out), "--check"), env=env)
    assert r.returncode == 0 and lock_left.exists()
    r = cli(offline("--with", "purepkg", "-o", str(out)), env=env)
    _no_bug(r)
    assert r.returncode == 0 and "up to date" in r.stdout, r.stdout + r.stderr
    assert "removed 2 temp file(s) a killed earlier write left beside r.lock" in r.stderr, r.stderr
    assert not lock_left.exists() and not twin_left.exists() and _temps(tmp_path) == []
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_the_sweep_keeps_a_live_writer_and_everything_it_did_not_name(tmp_path):
    from builder.util import atomic_write_text, sweep_write_leftovers

    target = tmp_path / "requirements.lock"
    target.write_text("# Generated by build-image\n")
    live = tmp_path / f".requirements.lock.{process_tag()}.abcd1234.tmp"  # this process: alive
    dead = tmp_path / ".requirements.lock.999999-1.abcd1234.tmp"  # a gone owner
    old = tmp_path / ".requirements.lock.abcd1234.tmp"  # untagged, idle two hours
    fresh = tmp_path / ".requirements.lock.efgh5678.tmp"  # untagged, being written
    mine = tmp_path / ".requirements.lock.notes"  # not a name it writes
    other = tmp_path / ".other.lock.999999-1.abcd1234.tmp"  # another file's
    linked = tmp_path / ".requirements.lock.999998-1.abcd1234.tmp"  # a symlink: never followed
    folder = tmp_path / ".requirements.lock.999997-1.abcd1234.tmp.d"
    for p in (live, dead, old, fresh, mine, other):
        p.write_text("x")
    linked.symlink_to(mine)
    folder.mkdir()
    os.utime(old, (time.time() - 2 * 3600,) * 2)
    removed = sweep_write_leftovers(target)
    assert sorted(p.name for p in removed) == sorted([dead.name, old.name])
    assert all(p.exists() or p.is_symlink() for p in (live, fresh, mine, other, linked, folder))
    assert target.read_text() == "# Generated by build-image\n"
    # a write of the file sweeps, and its own temp file is gone after it
    dead.write_text("x")
    atomic_write_text(target, "# Generated by build-image\nnew\n")
    assert not dead.exists() and target.read_text().endswith("new\n")
    assert sorted(p.name for p in tmp_path.glob(".requirements.lock.*")) == sorted(
        [live.name, fresh.name, mine.name, linked.name, folder.name]
    )
