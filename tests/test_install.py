"""A non-editable install is a complete tool: templates, patch series and the default
base manifests and locks ship as package data, found through importlib.resources."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).parent / "uv"


@pytest.mark.slow
def test_a_non_editable_install_renders_from_any_directory(tmp_path):
    """`uv pip install SRC` (not -e) into a fresh venv, the source copied elsewhere and then
    deleted, and `build-image render --vllm 0.26.0` run from an empty directory: the
    Dockerfile, the serve app and the patched files come from the installed package."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("builder", "templates", "patches", "lockfiles"):
        shutil.copytree(ROOT / name, src / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    r = subprocess.run([str(UV), "venv", "-q", "--python", sys.executable, str(venv)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(UV), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(src)],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    shutil.rmtree(src)  # nothing may be read from the source tree any more
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import builder.data as d; print(d.path())"],
                          env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert site.returncode == 0, site.stderr
    assert str(venv) in site.stdout and not Path(site.stdout.strip()).is_symlink()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = subprocess.run([str(venv / "bin" / "build-image"), "render", "--vllm", "0.26.0", "-o", "ctx"],
                       env=env, capture_output=True, text=True, cwd=elsewhere, timeout=1200)
    assert r.returncode == 0, r.stdout + r.stderr
    ctx = elsewhere / "ctx"
    dockerfile = (ctx / "Dockerfile").read_text()
    assert dockerfile.startswith("# syntax=") or "FROM " in dockerfile
    assert (ctx / "app" / "build_image_serve_app.py").read_bytes() == \
        (ROOT / "templates" / "serve" / "build_image_serve_app.py").read_bytes()
    assert (ctx / "requirements.lock").read_bytes() == \
        (ROOT / "lockfiles" / "vllm-0.26.0" / "requirements.lock").read_bytes()
    assert (ctx / "patches" / "patched.sha256").read_text().strip()  # the 0.26.0 series was applied
    assert not (elsewhere / "lockfiles").exists()
