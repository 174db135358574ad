"""The uv adapter: the one place build-image runs uv (compile, pip install --target, pip check, version)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from builder.errors import ExternalToolError
from builder.resolve.explain import ANSI_RE
from builder.scratch import die_with_parent


class Uv:
    """Thin adapter over the uv CLI."""

    def __init__(self, binary: str | None = None):
        self.binary = binary or find_uv()
        self._version: str | None = None

    def version(self) -> str:
        if self._version is None:
            r = subprocess.run([self.binary, "--version"], capture_output=True, text=True)
            if r.returncode != 0:
                raise ExternalToolError(f"`{self.binary} --version` failed: {r.stderr.strip()}")
            self._version = r.stdout.split()[1] if len(r.stdout.split()) > 1 else r.stdout.strip()
        return self._version

    def compile_cmd(
        self,
        sources: list[Path],
        out: Path,
        *,
        python_version: str,
        platform: str,
        fmt: str = "requirements.txt",
        hashes: bool = False,
        find_links: Iterable[str] = (),
        no_index: bool = False,
        exclude_newer: str | None = None,
        offline: bool = False,
        constraints: Iterable[Path] = (),
        overrides: Iterable[Path] = (),
    ) -> list[str]:
        cmd = [
            self.binary,
            "pip",
            "compile",
            *map(str, sources),
            "-o",
            str(out),
            "--format",
            fmt,
            "--python-version",
            python_version,
            "--python-platform",
            platform,
            "--no-build",
            "--no-header",
            "--quiet",
            "--color",
            "never",
            # an interpreter only for uv's bookkeeping (the target is --python-version/--python-platform;
            # --no-build: nothing is ever built): never let uv look for, or download, a Python
            "--python",
            sys.executable,
        ]
        if hashes:
            cmd.append("--generate-hashes")
        for fl in find_links:
            cmd += ["--find-links", str(fl)]
        if no_index:
            cmd.append("--no-index")
        if exclude_newer:
            cmd += ["--exclude-newer", exclude_newer]
        if offline:
            cmd.append("--offline")
        for c in constraints:
            cmd += ["-c", str(c)]
        for o in overrides:
            cmd += ["--override", str(o)]
        return cmd

    # uv settings from the environment that change *what* resolves: they are not inputs of the lock
    # (not in inputs-sha256), so an ambient UV_RESOLUTION=lowest would write another lock that
    # `--check` still calls up to date.  The tool passes what it means on the command line.
    # Index URLs stay (mirrors, credentials): the wheel URLs in the lock show where files came from.
    IGNORED_ENV = (
        "UV_SYSTEM_PYTHON",
        "UV_RESOLUTION",
        "UV_PRERELEASE",
        "UV_CONSTRAINT",
        "UV_OVERRIDE",
        "UV_BUILD_CONSTRAINT",
        "UV_EXCLUDE_NEWER",
        "UV_INDEX_STRATEGY",
        "UV_TORCH_BACKEND",
        "UV_FIND_LINKS",
        "UV_NO_INDEX",
        "UV_NO_BINARY",
        "UV_NO_BINARY_PACKAGE",
        "UV_NO_BUILD",
        "UV_NO_BUILD_PACKAGE",
        "UV_ONLY_BINARY",
        "UV_NO_SOURCES",
        "UV_PYTHON",
        "UV_EXCLUDE",
    )

    @staticmethod
    def env() -> dict[str, str]:
        env = {**os.environ, "UV_NO_CONFIG": "1", "NO_COLOR": "1", "UV_PYTHON_DOWNLOADS": "never"}
        for var in Uv.IGNORED_ENV:
            env.pop(var, None)
        return env

    def start(self, sources: list[Path], out: Path, *, cwd: Path | None = None, **kw) -> subprocess.Popen:
        """Start ``uv pip compile`` (see :meth:`compile_cmd`); collect with :meth:`wait`."""
        try:
            return subprocess.Popen(
                self.compile_cmd(sources, out, **kw),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=cwd,
                env=self.env(),
                preexec_fn=die_with_parent,
            )
        except OSError as exc:
            raise ExternalToolError(f"cannot run uv ({self.binary}): {exc}.") from None

    @staticmethod
    def wait(proc: subprocess.Popen) -> subprocess.CompletedProcess:
        out, err = proc.communicate()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def compile(self, sources: list[Path], out: Path, *, cwd: Path | None = None, **kw) -> subprocess.CompletedProcess:
        return self.wait(self.start(sources, out, cwd=cwd, **kw))

    def venv(self, path: Path, *, python: str, relocatable: bool = False) -> None:
        """``uv venv`` at ``path`` for the interpreter ``python`` (never downloads one); ``relocatable``:
        one that works after its folder is renamed (its scripts find their interpreter by relative path)."""
        r = subprocess.run(
            [self.binary, "venv", "-q", *(["--relocatable"] if relocatable else []), "--python", python, str(path)],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=300,
            preexec_fn=die_with_parent,
        )
        if r.returncode != 0:
            raise ExternalToolError(f"`uv venv {path}` failed: {r.stderr.strip()[-1500:]}")

    def pip_install(
        self, python: Path | str, requirements: list[str], *, find_links: Iterable[str] = (), timeout: int = 1800
    ) -> subprocess.CompletedProcess:
        """``uv pip install`` of ``requirements`` into the environment of ``python``."""
        cmd = [self.binary, "pip", "install", "-q", "--python", str(python)]
        for fl in find_links:
            cmd += ["--find-links", str(fl)]
        return subprocess.run(
            [*cmd, *requirements],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            preexec_fn=die_with_parent,
        )

    def install_target(
        self,
        target: Path,
        requirements: list[str],
        *,
        python_version: str,
        platform: str,
        exclude_newer: str | None = None,
        find_links: Iterable[str] = (),
        no_index: bool = False,
        index_url: str | None = None,
    ) -> tuple[list[str], subprocess.CompletedProcess]:
        """``uv pip install --target`` of ``requirements`` for a described interpreter (never run):
        (the command, its result).  Files are hard links into uv's cache (a scratch tree, read only)."""
        cmd = [
            self.binary,
            "pip",
            "install",
            "--target",
            str(target),
            "--python-version",
            python_version,
            "--python-platform",
            platform,
            "--no-build",
            "--link-mode",
            "hardlink",
            "--color",
            "never",
            "--python",
            sys.executable,
        ]
        if exclude_newer:
            cmd += ["--exclude-newer", exclude_newer]
        if index_url:
            cmd += ["--index-url", index_url]
        for fl in find_links:
            cmd += ["--find-links", str(fl)]
        if no_index:
            cmd.append("--no-index")
        cmd += list(requirements)
        return cmd, self._completed(cmd)

    def _completed(self, cmd: list[str]) -> subprocess.CompletedProcess:
        """Run one uv command to completion, output captured as text."""
        try:
            return subprocess.run(cmd, capture_output=True, text=True, env=self.env())
        except OSError as exc:
            raise ExternalToolError(f"cannot run uv ({self.binary}): {exc}.") from None

    def cache_dir(self) -> str:
        """uv's cache directory (``uv cache dir``: ``UV_CACHE_DIR`` or its default)."""
        r = self._completed([self.binary, "cache", "dir", "--color", "never"])
        if r.returncode != 0:
            raise ExternalToolError(f"`{self.binary} cache dir` failed: {r.stderr.strip()[-400:]}")
        return r.stdout.strip()

    def pip_target(
        self, sub: str, target: Path, args: list[str], *, python_version: str | None = None, platform: str | None = None
    ) -> tuple[list[str], subprocess.CompletedProcess]:
        """``uv pip install|uninstall --target DIR ARGS`` for a described interpreter (never run): the
        replay of one install step of an image into one tree, each step seeing what earlier ones
        installed, as ``uv pip install --system`` does in the image."""
        cmd = [self.binary, "pip", sub, "--target", str(target), "--color", "never", "--python", sys.executable]
        if sub == "install":
            cmd += [
                "--python-version",
                python_version or "",
                "--python-platform",
                platform or "",
                "--no-build",
                "--link-mode",
                "hardlink",
            ]
        cmd += list(args)
        return cmd, self._completed(cmd)


def find_uv() -> str:
    """The uv binary of the pinned ``uv`` package (``uv.find_uv_bin()``), else the
    one next to this interpreter, else ``uv`` on PATH."""
    try:
        import uv  # type: ignore

        return uv.find_uv_bin()
    except Exception:  # noqa: BLE001 - the package may be absent in odd installs
        pass
    cand = Path(sys.executable).with_name("uv")
    if cand.exists():
        return str(cand)
    found = shutil.which("uv")
    if found:
        return found
    raise ExternalToolError("uv is not installed (pip install uv==0.13.9).")


def is_resolution_failure(stderr: str) -> bool:
    s = ANSI_RE.sub("", stderr)
    return "No solution found" in s or "unsatisfiable" in s.lower() or "requirements are unsatisfiable" in s
