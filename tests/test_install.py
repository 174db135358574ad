"""A wheel install is a complete tool: every module of the package is in the wheel, the
templates, patch series and default base manifests and locks ship as package data (found
through importlib.resources), and every command runs from a directory outside the checkout.

The wheel is built from a copy of the source (which is deleted before anything runs), installed
into a fresh virtual environment, and used from an empty directory: ``--help`` of every command
and subcommand, ``render --vllm 0.26.0``, and ``smoke`` against tests/fake_openai_server.py.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tests.fx_cache import real_vllm_wheel

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).parent / "uv"

# one xdist worker: the tests share one install (a module fixture)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("install")]


class Installed:
    def __init__(self, venv: Path, elsewhere: Path, env: dict[str, str]):
        self.venv, self.elsewhere, self.env = venv, elsewhere, env

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.venv / "bin" / "build-image"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            cwd=self.elsewhere,
            timeout=timeout,
        )

    def python(self, code: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.venv / "bin" / "python"), "-c", code],
            env=self.env,
            capture_output=True,
            text=True,
            cwd=self.elsewhere,
            timeout=120,
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    """`uv build --wheel` of a copy of the source, `uv pip install` of that wheel (not -e) into a
    fresh venv; the copy is deleted, and commands run from an empty directory."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    src.mkdir()
    for name in ("builder", "templates", "patches", "lockfiles"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    dist = tmp / "dist"
    r = subprocess.run(
        [str(UV), "build", "-q", "--wheel", "--out-dir", str(dist), str(src)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    wheels = sorted(dist.glob("build_image-*.whl"))
    assert len(wheels) == 1, wheels
    shutil.rmtree(src)  # nothing may be read from the source tree any more
    venv = tmp / "venv"
    r = subprocess.run(
        [str(UV), "venv", "-q", "--python", sys.executable, str(venv)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [str(UV), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(wheels[0])],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return Installed(venv, elsewhere, env)


def _source_modules() -> list[str]:
    out = []
    for path in sorted((ROOT / "builder").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        if rel.parts[1:2] == ("data",) and rel.parts != ("builder", "data", "__init__"):
            continue  # the data folders (templates' and series' .py files are not modules)
        out.append(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
    return out


def _command_lines() -> list[list[str]]:
    """Every command and subcommand of the CLI, as argument lists (``[]`` is the tool itself)."""
    from builder.cli import main

    ctx = click.Context(main)
    lines: list[list[str]] = [[]]
    for name in main.list_commands(ctx):
        cmd = main.get_command(ctx, name)
        lines.append([name])
        if isinstance(cmd, click.Group):
            lines += [[name, sub] for sub in cmd.list_commands(click.Context(cmd))]
    return lines


def test_the_wheel_holds_every_module_and_the_data(installed):
    r = installed.python(
        "import builder.data as d, importlib, json, sys\n"
        f"mods = {_source_modules()!r}\n"
        "for m in mods: importlib.import_module(m)\n"
        "print(json.dumps([str(d.path()), sorted(set(sys.modules) & set(mods)) == sorted(mods)]))"
    )
    assert r.returncode == 0, r.stderr
    data, all_imported = json.loads(r.stdout)
    assert all_imported
    assert data.startswith(str(installed.venv)) and not Path(data).is_symlink()
    for rel in ("templates/Dockerfile.j2", "lockfiles/base/recipes.toml", "lockfiles/vllm-0.26.0/requirements.lock"):
        assert (Path(data) / rel).is_file(), rel


def test_every_command_answers_help(installed):
    lines = _command_lines()
    assert ["smoke"] in lines and ["base", "snapshot"] in lines and ["checkpoint", "verify"] in lines
    for args in lines:
        r = installed.run(*args, "--help")
        assert r.returncode == 0 and "Usage:" in r.stdout, (args, r.stdout + r.stderr)


@pytest.fixture(scope="module")
def wheel_0_26() -> Path:
    """render patches vllm 0.26.0: its wheel in the download cache before the installed tool
    looks for it there (fetched under a lock another xdist worker may hold)."""
    return real_vllm_wheel("0.26.0")


@pytest.mark.usefixtures("wheel_0_26")
def test_render_runs_from_any_directory(installed):
    """`build-image render --vllm 0.26.0`: the Dockerfile, the serve app and the patched files
    come from the installed package."""
    r = installed.run("render", "--vllm", "0.26.0", "-o", "ctx", timeout=1200)
    assert r.returncode == 0, r.stdout + r.stderr
    ctx = installed.elsewhere / "ctx"
    dockerfile = (ctx / "Dockerfile").read_text()
    assert dockerfile.startswith("# syntax=") or "FROM " in dockerfile
    assert (ctx / "app" / "build_image_serve_app.py").read_bytes() == (
        ROOT / "templates" / "serve" / "build_image_serve_app.py"
    ).read_bytes()
    assert (ctx / "requirements.lock").read_bytes() == (
        ROOT / "lockfiles" / "vllm-0.26.0" / "requirements.lock"
    ).read_bytes()
    assert (ctx / "patches" / "patched.sha256").read_text().strip()  # the 0.26.0 series was applied
    assert not (installed.elsewhere / "lockfiles").exists()


def test_smoke_runs_against_the_fake_server(installed):
    """`build-image smoke` of the installed tool boots the fake OpenAI server (copied outside the
    checkout) and gives a PASS verdict; a failing server is a FAIL (exit 1)."""
    fake = installed.elsewhere / "fake_openai_server.py"
    shutil.copy2(ROOT / "tests" / "fake_openai_server.py", fake)
    model = installed.elsewhere / "model"
    model.mkdir(exist_ok=True)
    cmd = " ".join([shlex.quote(sys.executable), shlex.quote(str(fake)), "--port", "{port}"])
    args = ["smoke", "--model", str(model), "--rounds", "1", "--concurrency", "2", "--max-tokens", "4", "--json"]
    ok = installed.run(*args, "--server-cmd", cmd)
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["verdict"] == "PASS" and doc["schema"] == "build-image/smoke-report/v1"
    assert doc["rounds"][0]["ok"] == 2
    bad = installed.run(*args, "--server-cmd", cmd + " --fail-500-at 2")
    assert bad.returncode == 1 and json.loads(bad.stdout)["verdict"] == "FAIL"
