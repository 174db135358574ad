"""Hostile inputs and outputs, class by class (docs/faults.md, "Hostile inputs and outputs").

Each case asserts the exit code, that the message names the cause, that nothing the user had was
lost or changed, and that nothing half-written remains.  No case may reach exit 70.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import main
from builder.errors import BadInput

from .conftest import BUILD_IMAGE, ROOT, cli, render_args, tiny_context

DEEP = 5000  # levels of nesting: far past the interpreter's recursion limit


def _known() -> list[str]:
    from builder.spec import supported_vllm_versions

    return supported_vllm_versions()


def _snapshot(d: Path) -> dict[str, str]:
    """Every file under ``d`` (relative path -> sha256; a symlink -> its target), for "nothing changed"."""
    out = {}
    for p in sorted(d.rglob("*")):
        rel = str(p.relative_to(d))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def _no_bug(r: subprocess.CompletedProcess) -> None:
    assert r.returncode != 70 and "This is a bug" not in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.fixture
def env(tmp_path):
    return {"BUILD_IMAGE_CACHE": str(tmp_path / "cache")}


# ============================================================== 1. releases (--vllm, --to, spec 'vllm')
@pytest.mark.parametrize("value", ["0.35.0", "9.9.9"])
def test_pipeline_with_a_release_without_base_manifest_is_exit_2_naming_the_known_ones(tmp_path, env, value):
    out = tmp_path / "ctx"
    r = cli(["--vllm", value, "-o", str(out)], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2, r.stderr
    assert "no base manifest" in r.stderr and ", ".join(_known()) in r.stderr
    assert "patch port" not in r.stderr and f"patches/vllm/{value}" not in r.stderr
    assert f"build-image upgrade --to {value} -o ." in r.stderr  # the one command that adds the release
    assert not out.exists() and not _leftovers(tmp_path, "ctx")


@pytest.mark.parametrize("value", ["latest", "../../../etc", "0.26.0/../../x", "0.26.0; rm -rf /"])
def test_pipeline_with_a_word_or_a_path_for_vllm_is_exit_2_and_suggests_no_path(tmp_path, env, value):
    out = tmp_path / "ctx"
    r = cli(["--vllm", value, "-o", str(out)], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2, r.stderr
    assert "is not a version" in r.stderr and repr(value) in r.stderr
    assert "patch port" not in r.stderr and "patches/vllm/" not in r.stderr
    assert not out.exists()


def test_a_spec_naming_an_unknown_release_is_exit_2_naming_the_spec(tmp_path, env):
    spec = tmp_path / "build-image.toml"
    spec.write_text('vllm = "nightly"\n')
    r = cli(["--spec", str(spec), "-o", str(tmp_path / "ctx")], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2 and str(spec) in r.stderr and "'nightly'" in r.stderr, r.stderr


def test_upgrade_to_a_word_is_exit_2(env):
    r = cli(["upgrade", "--to", "latest", "--from", "0.26.0"], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2 and "--to 'latest' is not a version" in r.stderr, r.stderr


def test_patch_check_with_a_path_for_vllm_reads_nothing_outside_the_series_tree(tmp_path, env):
    evil = tmp_path / "evil"
    shutil.copytree(ROOT / "tests" / "data" / "standin" / "patches", evil)
    rel = os.path.relpath(evil, ROOT / "patches" / "vllm")
    r = cli(["patch", "check", "--vllm", rel], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2 and "is not a version" in r.stderr and "series" not in r.stdout, r.stdout + r.stderr


def test_check_release_suggests_nothing_built_from_the_raw_value():
    from builder.validate import check_release

    with pytest.raises(BadInput) as exc:
        check_release("../../x", ["0.26.0", "0.27.0"])
    text = exc.value.render()
    assert "known: 0.26.0, 0.27.0" in text and "vllm-openai-v../../x" not in text


# ============================================================== 2. deep nesting in every structured read
def _deep_json() -> str:
    return "[" * DEEP + "]" * DEEP


def test_a_spec_nested_thousands_deep_is_exit_2(tmp_path, env):
    spec = tmp_path / "deep.toml"
    spec.write_text("with = " + "[" * DEEP + "]" * DEEP + "\n")
    r = cli(["lock", "--spec", str(spec), "-o", str(tmp_path / "r.lock")], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2 and "nests deeper than" in r.stderr and str(spec) in r.stderr, r.stderr
    assert not (tmp_path / "r.lock").exists()


def test_a_base_manifest_nested_deep_is_exit_2(tmp_path, env):
    m = tmp_path / "base.json"
    m.write_text('{"schema": ' + _deep_json() + "}")
    r = cli(["lock", "--base", str(m), "-o", str(tmp_path / "r.lock")], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2 and f"base manifest {m} nests deeper" in r.stderr, r.stderr


def test_a_model_config_nested_deep_is_exit_2_in_plan(tmp_path, env):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"num_hidden_layers": 2, "x": ' + _deep_json() + "}")
    r = cli(["plan", "--model", str(model), "--gpu-memory", "80GiB", "--weights-bytes", "1GiB"], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2 and "nests deeper" in r.stderr and "config.json" in r.stderr, r.stderr


def _safetensors(path: Path, header: bytes) -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def test_a_safetensors_header_nested_deep_is_a_named_problem_not_a_crash(tmp_path, env):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"num_hidden_layers": 1, "hidden_size": 8, "num_attention_heads": 1}')
    _safetensors(model / "model.safetensors", ('{"t": ' + _deep_json() + "}").encode())
    r = cli(["checkpoint", "verify", str(model)], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 1 and "NOT READY" in r.stdout and "nests deeper" in r.stdout, r.stdout + r.stderr


def test_a_checkpoint_index_nested_deep_is_a_named_problem(tmp_path, env):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"num_hidden_layers": 1}')
    (model / "model.safetensors.index.json").write_text('{"weight_map": ' + _deep_json() + "}")
    r = cli(["checkpoint", "verify", str(model)], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 1 and "nests deeper" in r.stdout, r.stdout + r.stderr


def test_a_pylock_nested_deep_is_refused_by_render(tmp_path, env):
    tiny_context(tmp_path)
    pylock = tmp_path / "pylock.toml"
    pylock.write_text('lock-version = "1.0"\nx = ' + "[" * DEEP + "]" * DEEP + "\n")
    out = tmp_path / "ctx2"
    r = cli(
        [
            "render",
            "--vllm",
            "0.26.0",
            "--base",
            str(tmp_path / "base.json"),
            "--lock",
            str(pylock),
            "--no-patches",
            "-o",
            str(out),
        ],
        env=env,
        timeout=120,
    )
    _no_bug(r)
    assert r.returncode == 2 and "nests deeper" in r.stderr, r.stderr
    assert not out.exists()


def test_nesting_depth_counts_iteratively_and_bounds_every_loader():
    from builder.validate import MAX_DEPTH, load_json, load_toml, nesting_depth

    assert nesting_depth({"a": [1, {"b": []}]}) == 4 and nesting_depth([]) == 1 and nesting_depth(5) == 0
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert nesting_depth(load_json(ok, "x")) == MAX_DEPTH
    with pytest.raises(BadInput, match="nests deeper than 64"):
        load_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "x")
    with pytest.raises(BadInput, match="doc.toml nests deeper"):
        load_toml("a = " + "[" * DEEP + "]" * DEEP, "doc.toml")


# ============================================================== 3. values: timestamps, numbers, environment
@pytest.mark.parametrize(
    "value, why",
    [
        ("yesterday-ish", "is not a date"),
        ("2026-01-01T25:00:00Z", "not a real date"),
        ("2026-02-30", "not a real date"),
        ("2026-13-01T00:00:00+02:00", "not a real"),
    ],
)
def test_exclude_newer_flag_is_checked_before_any_work(tmp_path, env, value, why):
    out = tmp_path / "r.lock"
    r = cli(["lock", "--exclude-newer", value, "-o", str(out)], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2 and "--exclude-newer" in r.stderr and why in r.stderr, r.stderr
    assert not out.exists()


def test_exclude_newer_in_the_spec_is_bad_input_not_a_stale_lock(tmp_path, env):
    spec = tmp_path / "s.toml"
    spec.write_text('exclude-newer = "last tuesday"\n')
    r = cli(["lock", "--spec", str(spec), "--check"], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2 and f"spec {spec}: 'exclude-newer'" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "value, why",
    [("nan", "finite"), ("-5", "at least 0"), ("inf", "finite"), ("1e12", "at most"), ("soon", "not a number")],
)
def test_lock_timeout_environment_is_validated(tmp_path, env, value, why):
    tiny_context(tmp_path)
    out = tmp_path / "ctx2"
    r = cli(render_args(tmp_path, out), env={**env, "BUILD_IMAGE_LOCK_TIMEOUT": value}, timeout=120)
    _no_bug(r)
    assert r.returncode == 2 and "BUILD_IMAGE_LOCK_TIMEOUT" in r.stderr and why in r.stderr, r.stderr
    assert not out.exists() and not _leftovers(tmp_path, "ctx2")


def _llama(**over) -> dict:
    return {
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
        **over,
    }


@pytest.mark.parametrize(
    "field, value, why",
    [
        ("num_hidden_layers", 1_000_000_000, "at most"),
        ("max_position_embeddings", -1, ">= 1"),
        ("global_head_dim", -128, ">= 1"),
        ("num_attention_heads", "32", "'32'"),
        ("hidden_size", float("nan"), "finite"),
        ("vocab_size", 1e30, "at most"),
        ("num_key_value_heads", 2.5, "whole number"),
    ],
)
def test_plan_names_the_config_field_that_is_out_of_range(tmp_path, env, field, value, why):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(_llama(**{field: value})))
    t0 = time.monotonic()
    r = cli(["plan", "--model", str(model), "--gpu-memory", "80GiB", "--weights-bytes", "1GiB"], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"field '{field}'" in r.stderr and why in r.stderr and "--max-model-len" not in r.stderr, r.stderr
    assert "FITS" not in r.stdout and time.monotonic() - t0 < 60


def test_spec_serving_numbers_are_finite_and_in_range(tmp_path, env):
    for body, why in (
        ("[serving]\ngpu_memory_utilization = nan\n", "finite"),
        ("[serving]\nmax_num_seqs = -3\n", ">= 1"),
        ("[serving]\ngpus = 100000000\n", "at most"),
    ):
        spec = tmp_path / "s.toml"
        spec.write_text(body)
        r = cli(["lock", "--spec", str(spec), "--check"], env=env, timeout=120)
        _no_bug(r)
        assert r.returncode == 2 and "serving." in r.stderr and why in r.stderr, (body, r.stderr)


# ============================================================== 4. outputs: the output rule
def test_lock_does_not_replace_a_file_that_is_not_a_lock(tmp_path, env):
    readme = tmp_path / "README.md"
    readme.write_text("# my notes\n")
    r = cli(["lock", "-o", str(readme)], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2 and "is not a lock written by build-image" in r.stderr and "--force" in r.stderr
    assert readme.read_text() == "# my notes\n" and not _leftovers(tmp_path, "README.md")


def test_lock_refuses_a_fifo_and_a_device_node(tmp_path, env):
    fifo = tmp_path / "r.lock"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    r = cli(["lock", "-o", str(fifo)], env=env, timeout=60)
    _no_bug(r)
    assert r.returncode == 2 and "a FIFO" in r.stderr and time.monotonic() - t0 < 30, r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    dev = tmp_path / "null-copy"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        return  # not root: the FIFO case stands for both
    r = cli(["lock", "-o", str(dev)], env=env, timeout=60)
    assert r.returncode == 2 and "a character device" in r.stderr, r.stderr
    assert stat.S_ISCHR(os.lstat(dev).st_mode)


def test_base_snapshot_does_not_replace_a_file_that_is_not_a_manifest(tmp_path, env):
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": true}\n')
    sp = tmp_path / "sp"
    sp.mkdir()
    r = cli(
        ["base", "snapshot", "--site-packages", str(sp), "--glibc", "2.35", "--python", "3.12", "-o", str(notes)],
        env=env,
        timeout=120,
    )
    _no_bug(r)
    assert r.returncode == 2 and "is not a base manifest written by build-image" in r.stderr, r.stderr
    assert notes.read_text() == '{"mine": true}\n' and not _leftovers(tmp_path, "notes.json")


def test_atomic_write_goes_through_a_symlink_and_keeps_it(tmp_path):
    from builder.util import atomic_write_text

    real = tmp_path / "locks" / "requirements.lock"
    real.parent.mkdir()
    real.write_text("old\n")
    link = tmp_path / "r.lock"
    link.symlink_to(real)
    atomic_write_text(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == str(real) and real.read_text() == "new\n"
    assert not _leftovers(real.parent, "requirements.lock") and not _leftovers(tmp_path, "r.lock")


def test_a_lock_written_through_a_symlink_updates_the_lock_it_points_to(offline, tmp_path, env):
    real = tmp_path / "real" / "requirements.lock"
    r = cli(offline("--with", "stableabi", "-o", str(real)), env=env)
    assert r.returncode == 0, r.stderr
    link = tmp_path / "link.lock"
    link.symlink_to(real)
    before = real.read_text()
    r = cli(offline("--with", "purepkg", "-o", str(link)), env=env)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and real.read_text() != before and "purepkg" in real.read_text()
    from builder.resolve.lockfile import twin_path

    assert "purepkg" in twin_path(real).read_text() and not twin_path(link).exists()  # the twin beside the lock


def test_atomic_write_on_a_full_disk_is_exit_2_and_keeps_the_old_file(tmp_path, monkeypatch):
    from builder import util

    target = tmp_path / "out.txt"
    target.write_text("previous\n")

    def full(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(util.os, "fsync", full)
    with pytest.raises(BadInput) as exc:
        util.atomic_write_text(target, "new\n")
    assert f"cannot write {target}" in exc.value.message and "ENOSPC" in exc.value.message
    assert target.read_text() == "previous\n" and not _leftovers(tmp_path, "out.txt")


def test_render_keeps_files_a_user_added_by_refusing(tmp_path, env):
    ctx, _plan = tiny_context(tmp_path)
    (ctx / "NOTES.md").write_text("mine\n")
    (ctx / "data").mkdir()
    (ctx / "data" / "x.bin").write_bytes(b"\0" * 10)
    before = _snapshot(ctx)
    r = cli(render_args(tmp_path, ctx), env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2 and "NOTES.md" in r.stderr and "data/" in r.stderr and "render did not write" in r.stderr
    assert _snapshot(ctx) == before and not _leftovers(tmp_path, "ctx")


def test_render_into_a_symlinked_context_writes_through_and_leaves_nothing(tmp_path, env):
    ctx, _plan = tiny_context(tmp_path)
    link = tmp_path / "ctx-link"
    link.symlink_to(ctx)
    r = cli(render_args(tmp_path, link), env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == str(ctx) and (ctx / "Dockerfile").is_file()
    assert not _leftovers(tmp_path, "ctx") and not _leftovers(tmp_path, "ctx-link")


def test_render_sweeps_what_an_interrupted_render_left(tmp_path, env):
    ctx, _plan = tiny_context(tmp_path)
    for name in (".ctx.k2j4h5g6.tmp", ".ctx.old-999999"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "Dockerfile").write_text("stale")
    keep = tmp_path / ".ctx-other.abc.tmp"
    keep.mkdir()  # another output's: not this render's to remove
    r = cli(render_args(tmp_path, ctx), env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert _leftovers(tmp_path, "ctx") == [] and keep.is_dir()


@contextlib.contextmanager
def _tmpfs(path: Path, size: str):
    path.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


@pytest.mark.slow
def test_render_on_a_full_file_system_is_exit_2_and_the_old_context_survives(tmp_path, env):
    tiny_context(tmp_path)
    with _tmpfs(tmp_path / "small", "512k") as small:
        out = small / "ctx"
        r = cli(render_args(tmp_path, out), env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        before = _snapshot(out)
        with open(small / "filler", "wb", buffering=0) as fh, contextlib.suppress(OSError):
            while True:  # fill the file system to the last block
                fh.write(b"\0" * 4096)
        r = cli(render_args(tmp_path, out), env=env, timeout=120)
        _no_bug(r)
        assert r.returncode == 2 and "cannot write" in r.stderr and str(out) in r.stderr, r.stderr
        assert _snapshot(out) == before and not _leftovers(small, "ctx")
        (small / "filler").unlink()


def test_patch_port_output_equal_to_the_series_is_refused_before_writing(tmp_path, env):
    series = tmp_path / "series"
    shutil.copytree(ROOT / "tests" / "data" / "standin" / "patches", series)
    before = _snapshot(series)
    for out in (series, tmp_path / "via-link"):
        if out != series:
            out.symlink_to(series)
        r = cli(
            [
                "patch",
                "port",
                "--from",
                _series_version(series),
                "--to",
                "9.0.0",
                "--series",
                str(series),
                "-o",
                str(out),
                "--from-wheel",
                str(series),
                "--to-wheel",
                str(series),
            ],
            env=env,
            timeout=120,
        )
        _no_bug(r)
        assert r.returncode == 2 and "is the series being ported" in r.stderr, r.stderr
        assert _snapshot(series) == before


def _series_version(series: Path) -> str:
    import re

    for p in series.glob("*.patch"):
        m = re.search(r"^Applies-To:\s*\S+==(\S+)", p.read_text(), re.M)
        if m:
            return m.group(1)
    return "0.26.0"


# ============================================================== 5. signals
def _slow_render_inputs(tmp_path: Path) -> list[str]:
    """render inputs whose one wheel is a 768 MiB sparse file: hashing and copying it keeps the render
    busy long enough to be interrupted while its temp context exists."""
    from builder.resolve.lockfile import load_lock

    tiny_context(tmp_path)
    lock = load_lock(tmp_path / "requirements.lock")
    big = tmp_path / "wheels-src" / "six-1.0-py3-none-any.whl"
    with open(big, "wb") as fh:
        fh.truncate(768 << 20)
    h = hashlib.sha256()
    with open(big, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            h.update(block)
    e = lock.entries[0]
    e.hashes = [h.hexdigest()]
    e.wheel = type(e.wheel)(url=big.as_uri(), sha256=h.hexdigest())
    (tmp_path / "requirements.lock").write_text(lock.format(), encoding="utf-8")
    return render_args(tmp_path, tmp_path / "ctx")


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_render_exits_with_the_shells_code_and_leaves_the_old_context(tmp_path, env, sig, code):
    args = _slow_render_inputs(tmp_path)
    ctx = tmp_path / "ctx"
    before = _snapshot(ctx)
    p = subprocess.Popen(
        [BUILD_IMAGE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, **env)
    )
    deadline = time.monotonic() + 300
    while (
        time.monotonic() < deadline
        and p.poll() is None
        and not [n for n in _leftovers(tmp_path, "ctx") if n.endswith(".tmp")]
    ):
        time.sleep(0.01)
    assert p.poll() is None, p.communicate()
    p.send_signal(sig)
    _out, err = p.communicate(timeout=120)
    assert p.returncode == code, err
    assert "Aborted!" not in err and ("interrupted" in err or "terminated" in err), err
    assert _leftovers(tmp_path, "ctx") == [] and _snapshot(ctx) == before


def test_an_interrupt_right_after_a_temp_is_created_leaves_nothing(tmp_path, monkeypatch):
    """The signal lands in the instant after the temp file or folder exists (mkdir/open returned), before
    any later statement: the writer still removes it (the name is chosen before the temp is created)."""
    from builder.image import render
    from builder.util import atomic_write_bytes

    ctx, plan = tiny_context(tmp_path)
    before = _snapshot(ctx)
    real_mkdir, real_open = Path.mkdir, os.open

    def mkdir_then_interrupt(self, *a, **kw):
        real_mkdir(self, *a, **kw)
        if self.name.endswith(".tmp"):
            raise KeyboardInterrupt

    def open_then_interrupt(path, flags, *a, **kw):
        fd = real_open(path, flags, *a, **kw)
        if str(path).endswith(".tmp"):
            os.close(fd)
            raise KeyboardInterrupt
        return fd

    with monkeypatch.context() as m:
        m.setattr(Path, "mkdir", mkdir_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            render.write_context(ctx, plan, wheels={p.name: p for p in (tmp_path / "wheels-src").iterdir()})
    assert _leftovers(tmp_path, "ctx") == [] and _snapshot(ctx) == before
    target = tmp_path / "out.lock"
    target.write_text("old\n")
    with monkeypatch.context() as m:
        m.setattr(os, "open", open_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            atomic_write_bytes(target, b"new\n")
    assert _leftovers(tmp_path, "out.lock") == [] and target.read_text() == "old\n"


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_waiting_for_the_output_exits_with_the_shells_code(tmp_path, env, sig, code):
    from builder.util import output_lock

    tiny_context(tmp_path)
    out = tmp_path / "ctx2"
    with output_lock(out):
        p = subprocess.Popen(
            [BUILD_IMAGE, *render_args(tmp_path, out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, **env),
        )
        first = p.stderr.readline()
        assert "another build-image run is writing" in first, first
        p.send_signal(sig)
        _out, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    assert "Aborted!" not in err and not out.exists() and not _leftovers(tmp_path, "ctx2")
    scratch = tmp_path / "cache" / "tmp"
    assert not scratch.exists() or not any(scratch.iterdir())  # its scratch space went with it


# ============================================================== 6. bounded reads of files the user names
def test_checkpoint_sha256_from_a_device_or_fifo_is_refused_at_once(tmp_path, env):
    model = tmp_path / "model"
    model.mkdir()
    fifo = tmp_path / "sums"
    os.mkfifo(fifo)
    for src, kind in (("/dev/zero", "a character device"), (str(fifo), "a FIFO")):
        t0 = time.monotonic()
        r = cli(["checkpoint", "verify", str(model), "--sha256", src], env=env, timeout=60)
        _no_bug(r)
        assert r.returncode == 2 and f"--sha256 {src}: {kind}" in r.stderr, r.stderr
        assert time.monotonic() - t0 < 30


def test_diff_textconv_and_lock_arguments_are_read_bounded(tmp_path, env):
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    for args in (
        ["diff", "--textconv", "/dev/zero"],
        ["diff", "--textconv", str(fifo)],
        ["diff", "/dev/zero", str(ROOT / "lockfiles" / "vllm-0.26.0" / "requirements.lock")],
    ):
        t0 = time.monotonic()
        r = cli(args, env=env, timeout=60)
        _no_bug(r)
        assert r.returncode == 2 and "not a regular file" in r.stderr, (args, r.stderr)
        assert time.monotonic() - t0 < 30


def test_a_spec_that_is_huge_or_a_device_is_refused(tmp_path, env):
    huge = tmp_path / "huge.toml"
    with open(huge, "wb") as fh:
        fh.truncate(200 << 20)  # sparse: costs no disk
    for spec, why in ((huge, "bytes, more than"), (Path("/dev/zero"), "a character device")):
        r = cli(["lock", "--spec", str(spec), "--check"], env=env, timeout=60)
        _no_bug(r)
        assert r.returncode == 2 and str(spec) in r.stderr and why in r.stderr, r.stderr


# ============================================================== 7. environment
@pytest.mark.parametrize("how", ["file", "dev-null"])
def test_commands_that_need_no_cache_run_with_an_unusable_one(tmp_path, how):
    if how == "file":
        bad = tmp_path / "cache-file"
        bad.write_text("not a directory")
        env = {"BUILD_IMAGE_CACHE": str(bad)}
    else:
        env = {"BUILD_IMAGE_CACHE": "", "XDG_CACHE_HOME": "/dev/null"}
    lock = str(ROOT / "lockfiles" / "vllm-0.26.0" / "requirements.lock")
    r = cli(["diff", lock, lock], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 0, r.stderr
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"num_hidden_layers": 1}')
    r = cli(["checkpoint", "verify", str(model)], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 1 and "NOT READY" in r.stdout, r.stderr  # a verdict, not a crash
    if how == "file":
        assert bad.read_text() == "not a directory"


def test_a_command_that_needs_the_cache_names_it(tmp_path):
    tiny_context(tmp_path)
    bad = tmp_path / "cache-file"
    bad.write_text("x")
    out = tmp_path / "ctx2"
    r = cli(render_args(tmp_path, out), env={"BUILD_IMAGE_CACHE": str(bad)}, timeout=120)
    _no_bug(r)
    assert r.returncode == 2 and f"the build-image cache {bad} cannot be used" in r.stderr, r.stderr
    assert "BUILD_IMAGE_CACHE" in r.stderr and not out.exists() and bad.read_text() == "x"


def test_a_read_only_cache_is_named_by_commands_that_need_it_and_ignored_by_others(tmp_path):
    tiny_context(tmp_path)
    with _tmpfs(tmp_path / "ro", "64k") as ro:
        if subprocess.run(["mount", "-o", "remount,ro", str(ro)], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        env = {"BUILD_IMAGE_CACHE": str(ro / "cache")}
        out = tmp_path / "ctx2"
        r = cli(render_args(tmp_path, out), env=env, timeout=120)
        _no_bug(r)
        assert r.returncode == 2 and f"the build-image cache {ro / 'cache'} cannot be used" in r.stderr, r.stderr
        assert "Read-only file system" in r.stderr and not out.exists()
        lock = str(ROOT / "lockfiles" / "vllm-0.26.0" / "requirements.lock")
        r = cli(["diff", lock, lock], env=env, timeout=120)
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("cli_path", ["/bin/false", "/bin/true"])
def test_a_docker_cli_that_says_nothing_is_exit_12_naming_it(tmp_path, env, cli_path):
    ctx, _plan = tiny_context(tmp_path)
    r = cli(["build", str(ctx)], env={**env, "BUILD_IMAGE_DOCKER": cli_path}, timeout=120)
    _no_bug(r)
    assert r.returncode == 12 and cli_path in r.stderr and "BUILD_IMAGE_DOCKER" in r.stderr, r.stderr
    assert "start dockerd" not in r.stderr


# ============================================================== 8. uv failures classified by cause
def test_missing_find_links_folder_is_exit_2(tmp_path, env):
    out = tmp_path / "r.lock"
    for extra in (["--find-links", str(tmp_path / "nope")], ["--find-links", str(tmp_path / "nope"), "--no-index"]):
        r = cli(["lock", *extra, "-o", str(out)], env=env, timeout=120)
        _no_bug(r)
        assert r.returncode == 2 and f"--find-links {tmp_path / 'nope'}: no such folder" in r.stderr, r.stderr
    assert not out.exists()


def test_no_index_without_find_links_is_exit_2_saying_so(tmp_path, env):
    spec = tmp_path / "s.toml"
    spec.write_text("no-index = true\n")
    for args in (["lock", "--no-index"], ["lock", "--spec", str(spec)]):
        r = cli([*args, "-o", str(tmp_path / "r.lock")], env=env, timeout=120)
        _no_bug(r)
        assert r.returncode == 2 and "--no-index without --find-links" in r.stderr, r.stderr
        assert "pinned by the base" not in r.stderr


def test_unreachable_find_links_url_is_exit_7(np1_base, tmp_path, env):
    from .conftest import free_port

    url = f"http://127.0.0.1:{free_port()}/"
    out = tmp_path / "r.lock"
    r = cli(
        [
            "lock",
            "--base",
            str(np1_base),
            "--no-default-overlay",
            "--with",
            "purepkg",
            "--no-index",
            "--find-links",
            url,
            "-o",
            str(out),
        ],
        env=env,
        timeout=300,
    )
    _no_bug(r)
    assert r.returncode == 7 and url in r.stderr and "not reachable" in r.stderr, r.stderr
    assert not out.exists()


def test_uv_failure_classification_is_by_cause():
    from builder.errors import ExternalToolError, IntegrityError
    from builder.resolve.lock import uv_failure

    missing = uv_failure("error: Failed to read `--find-links` directory: /x\n  cause: No such file or directory")
    assert isinstance(missing, BadInput) and "/x" in missing.message
    down = uv_failure("error: Failed to fetch: https://wheels.example/simple/six/\n  cause: dns error")
    assert isinstance(down, IntegrityError) and "https://wheels.example/simple/six/" in down.message
    other = uv_failure("error: something else entirely")
    assert type(other) is ExternalToolError


# ============================================================== 9. pylock duplicates
def _dup_pylock(tmp_path: Path) -> Path:
    """The pylock twin of tiny_context's lock with its first ``[[packages]]`` entry listed twice."""
    import tomli_w
    import tomllib

    from builder.resolve.lockfile import format_pylock, load_lock

    doc = tomllib.loads(format_pylock(load_lock(tmp_path / "requirements.lock")))
    doc["packages"].append(doc["packages"][0])
    p = tmp_path / "pylock.toml"
    p.write_text(tomli_w.dumps(doc))
    return p


def test_render_refuses_a_pylock_with_a_duplicated_package(tmp_path, env):
    tiny_context(tmp_path, names=("six",))
    pylock = _dup_pylock(tmp_path)
    out = tmp_path / "ctx2"
    r = cli(
        [
            "render",
            "--vllm",
            "0.26.0",
            "--base",
            str(tmp_path / "base.json"),
            "--lock",
            str(pylock),
            "--no-patches",
            "-o",
            str(out),
        ],
        env=env,
        timeout=120,
    )
    _no_bug(r)
    assert r.returncode == 2 and "duplicate package 'six'" in r.stderr, r.stderr
    assert not out.exists() and not _leftovers(tmp_path, "ctx2")


def test_parse_pylock_lock_refuses_duplicates_whatever_the_spelling(tmp_path):
    from builder.resolve.lockfile import parse_pylock_lock

    tiny_context(tmp_path, names=("six",))
    text = _dup_pylock(tmp_path).read_text()
    with pytest.raises(BadInput, match=r"duplicate package 'six' \(packages\[1\], first at packages\[0\]\)"):
        parse_pylock_lock(text, "p.toml")


def test_lock_check_of_a_duplicated_pylock_is_stale(offline, tmp_path, env):
    out = tmp_path / "r.lock"
    r = cli(offline("--with", "stableabi", "-o", str(out)), env=env)
    assert r.returncode == 0, r.stderr
    import tomli_w
    import tomllib

    from builder.resolve.lockfile import twin_path

    twin = twin_path(out)
    doc = tomllib.loads(twin.read_text())
    doc["packages"].append(doc["packages"][0])
    twin.write_text(tomli_w.dumps(doc))
    r = cli(offline("--with", "stableabi", "-o", str(out), "--check"), env=env)
    _no_bug(r)
    assert r.returncode == 5 and "duplicate package" in r.stderr, r.stderr
    r = cli(offline("--with", "stableabi", "-o", str(twin), "--check"), env=env)
    assert r.returncode == 5 and "duplicate package" in r.stderr, r.stderr


# ============================================================== 10. credentials in every form
@pytest.mark.parametrize(
    "args",
    [
        ["push", "{ctx}", "--tag", "ci-bot:PW-s3cr3t@127.0.0.1:1/serving/vllm"],
        ["base", "snapshot", "--image", "ci-bot:PW-s3cr3t@127.0.0.1:1/repo:tag", "-o", "{tmp}/b.json"],
        ["lock", "--base", "https:/ci-bot:PW-s3cr3t@host.invalid/m.json", "-o", "{tmp}/r.lock"],
        ["lock", "--base", "https://ci-bot:PW-s3cr3t@host.invalid/m.json", "-o", "{tmp}/r.lock", "--json"],
    ],
)
def test_no_form_of_a_credential_is_printed(tmp_path, env, args):
    ctx, _plan = tiny_context(tmp_path)
    args = [a.format(ctx=ctx, tmp=tmp_path) for a in args]
    r = cli(args, env={**env, "DOCKER_HOST": f"unix://{tmp_path}/none.sock"}, timeout=120)
    _no_bug(r)
    text = r.stdout + r.stderr
    assert r.returncode != 0
    assert "PW-s3cr3t" not in text and "ci-bot:" not in text, text
    assert not any("PW-s3cr3t" in p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file())


def test_redact_text_covers_collapsed_and_scheme_less_forms_but_not_digests():
    from builder.credentials import redact_text

    assert redact_text("see https:/u:pw@h/x") == "see https:/****@h/x"
    assert redact_text("tag u:pw@reg.io:5000/r:t") == "tag ****@reg.io:5000/r:t"
    digest = "vllm/vllm-openai:v0.26.0@sha256:" + "0" * 64
    assert redact_text(digest) == digest and redact_text("ubuntu:22.04@sha256:" + "1" * 64).endswith("1" * 64)
    assert redact_text("mail a@b.org") == "mail a@b.org"


# ============================================================== 11. downgrades
@pytest.mark.parametrize(
    "args",
    [
        ["upgrade", "--from", "0.28.0", "--to", "0.27.0"],
        ["upgrade", "--from", "0.27.1", "--to", "0.27.0"],
        ["patch", "port", "--from", "0.27.0", "--to", "0.26.0"],
        ["patch", "port", "--from", "0.26.0", "--to", "0.26.0rc1"],
    ],
)
def test_a_downgrade_is_named_and_refused_without_allow_downgrade(tmp_path, env, args):
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = cli([*args, "-o", str(out)], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2 and "is a downgrade" in r.stderr and "--allow-downgrade" in r.stderr, r.stderr
    assert not out.exists() and time.monotonic() - t0 < 60  # refused before any download


def test_an_allowed_downgrade_says_so_in_every_report_format():
    from builder.commands import mark_direction

    assert mark_direction("report\n", "text", "downgrade", "0.28.0", "0.27.0").startswith("DOWNGRADE: vllm 0.28.0")
    assert mark_direction("r\n", "markdown", "downgrade", "0.28.0", "0.27.0").startswith("**DOWNGRADE")
    assert json.loads(mark_direction('{"a": 1}', "json", "downgrade", "0.28.0", "0.27.0"))["direction"] == "downgrade"
    assert mark_direction("report\n", "text", "upgrade", "0.27.0", "0.28.0") == "report\n"


# ============================================================== 12. messages
def _many_shards(model: Path, n: int) -> None:
    model.mkdir()
    (model / "config.json").write_text('{"num_hidden_layers": 1}')
    wm = {f"layer{i}.weight": f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(n)}
    for name in set(wm.values()):
        (model / name).write_bytes(b"xx")
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))


def test_checkpoint_verify_with_10000_broken_shards_prints_a_bounded_report_once(tmp_path, env):
    model = tmp_path / "model"
    _many_shards(model, 10_000)
    r = cli(["checkpoint", "verify", str(model)], env=env, timeout=300)
    _no_bug(r)
    assert r.returncode == 1
    assert len(r.stdout) < 20_000 and max(len(ln) for ln in r.stdout.splitlines()) < 1000, len(r.stdout)
    import re

    more = re.search(r"… and (\d+) more error\(s\)", r.stdout)
    assert more and int(more.group(1)) >= 9980, r.stdout
    total = re.search(r"NOT READY: (\d+) problem\(s\), listed above", r.stderr)
    assert len(r.stderr.splitlines()) == 1 and total and int(total.group(1)) >= 10_000 and len(r.stderr) < 1000


def test_checkpoint_verify_json_still_lists_every_problem(tmp_path, env):
    model = tmp_path / "model"
    _many_shards(model, 300)
    r = cli(["checkpoint", "verify", str(model), "--json"], env=env, timeout=300)
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert len(doc["errors"]) >= 300


@pytest.mark.parametrize("extra", [["--image", "127.0.0.1:5000/x:y"], ["--allow-tag"]])
def test_kuberay_only_flags_without_kuberay_are_exit_2(tmp_path, env, extra):
    tiny_context(tmp_path)
    out = tmp_path / "ctx2"
    r = cli([*render_args(tmp_path, out), *extra], env=env, timeout=120)
    _no_bug(r)
    assert r.returncode == 2 and extra[0] in r.stderr and "--kuberay" in r.stderr, r.stderr
    assert not out.exists()


def test_runner_sees_the_same_exit_codes_in_process(tmp_path, monkeypatch):
    """In process (CliRunner) a KeyboardInterrupt is 130 and a Terminated 143 too, never click's "Aborted!"."""
    import builder.commands.diff as d
    from builder.signals import Terminated

    for exc, code in ((KeyboardInterrupt, 130), (Terminated, 143)):

        def boom(*_a, _exc=exc, **_k):
            raise _exc()

        monkeypatch.setattr(d, "_textconv", boom)
        res = CliRunner().invoke(main, ["diff", "--textconv", str(tmp_path / "x")])
        assert res.exit_code == code and "Aborted!" not in res.output
