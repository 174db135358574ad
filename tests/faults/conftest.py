"""Fixtures of the fault suite: a private registry that a test may kill, a tiny rendered context.

Every test here is marked ``faults`` (``pytest -m faults`` runs the battery alone); the ones that
need the engine are also ``slow`` and ``docker``.  A test that kills a registry kills only the one
:func:`own_registry` started, by its PID, on its own loopback port: never the shared one on
127.0.0.1:5000.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.fx_docker import missing

ROOT = Path(__file__).resolve().parents[2]
BUILD_IMAGE = str(Path(sys.executable).parent / "build-image")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)


def cli(args: list[str], *, env: dict | None = None, timeout: int = 600, **kw) -> subprocess.CompletedProcess:
    """``build-image ARGS`` as a subprocess (a fault needs a real process: signals, exit codes)."""
    return subprocess.run(
        [BUILD_IMAGE, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})), **kw
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 20) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            time.sleep(0.2)
    return False


@dataclass
class OwnRegistry:
    """A docker-registry process of this test only (``addr``: 127.0.0.1:<free port>)."""

    root: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> OwnRegistry:
        cfg = self.root / "registry.yml"
        cfg.write_text(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {self.root / 'data'}\n  delete:\n    enabled: true\nhttp:\n  addr: {self.addr}\n"
        )
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "registry.log", "ab"),
        )
        if not wait_http(f"http://{self.addr}/v2/"):
            self.kill()
            pytest.fail(
                f"own registry on {self.addr} did not start: {(self.root / 'registry.log').read_text()[-2000:]}"
            )
        return self

    def kill(self) -> None:
        """SIGKILL this registry (by its PID) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture
def own_registry(tmp_path):
    if shutil.which("docker-registry") is None:
        missing("docker-registry is not installed (scripts/services.sh install)")
    root = tmp_path / "own-registry"
    root.mkdir()
    reg = OwnRegistry(root).start()
    try:
        yield reg
    finally:
        reg.kill()


def tiny_context(tmp_path: Path, names=("six",), *, via_cache: bool = False) -> tuple[Path, object]:
    """A rendered context (real write_context) over small stand-in wheels; no engine needed.
    ``via_cache``: the wheels come from the download cache (builder.fetch), as render takes them."""
    from builder.image.render import RenderPlan, write_context
    from builder.resolve.lockfile import LockEntry, LockFile, WheelRef
    from builder.resolve.manifest import BaseManifest, DistFacts, Distribution

    src = tmp_path / "wheels-src"
    src.mkdir(parents=True, exist_ok=True)
    entries, wheels = [], {}
    for n in names:
        data = f"stand-in wheel {n}\n".encode()
        h = hashlib.sha256(data).hexdigest()
        fn = f"{n}-1.0-py3-none-any.whl"
        (src / fn).write_bytes(data)
        wheels[fn] = src / fn
        if via_cache:
            from builder.events import SILENT
            from builder.fetch import fetch

            wheels[fn] = fetch((src / fn).as_uri(), h, reporter=SILENT)
        entries.append(LockEntry(name=n, version="1.0", hashes=[h], wheel=WheelRef(url=(src / fn).as_uri(), sha256=h)))
    header = {
        "build-image-lock": "1",
        "tool": "t",
        "vllm": "0.26.0",
        "base-ref": "vllm/vllm-openai:v0.26.0",
        "base-digest": "sha256:" + "ab" * 32,
        "base-manifest-sha256": "0" * 64,
        "python": "3.12",
        "platform": "x86_64-manylinux_2_35",
        "inputs-sha256": "1" * 64,
    }
    lock = LockFile(header=header, overlay=list(names), allow_abi_change={}, entries=entries)
    base = BaseManifest(
        image_ref="vllm/vllm-openai:v0.26.0",
        image_digest="sha256:" + "ab" * 32,
        os="Ubuntu 22.04",
        glibc="2.35",
        python_version="3.12",
        python_abi="cp312",
        site_packages="/usr/local/lib/python3.12/dist-packages",
        cuda="13.0",
        platform="x86_64-manylinux_2_35",
        provenance_kind="read-from-image",
        provenance_method="test",
        distributions={
            "vllm": Distribution("vllm", "0.26.0"),
            "uv": Distribution("uv", "0.9.0"),
            "numpy": Distribution("numpy", "1.26.4", DistFacts(binary=True)),
        },
    )
    plan = RenderPlan(
        vllm="0.26.0", base=base, lock=lock, patched=[], patches=[], repo="127.0.0.1:5000/f/vllm", source_date_epoch=0
    )
    out = tmp_path / "ctx"
    write_context(out, plan, wheels=wheels)
    base.save(tmp_path / "base.json")
    (tmp_path / "requirements.lock").write_text(lock.format(), encoding="utf-8")
    return out, plan


def render_args(tmp_path: Path, out: Path) -> list[str]:
    """`build-image render` of :func:`tiny_context`'s inputs (base.json, requirements.lock) to ``out``."""
    return [
        "render",
        "--vllm",
        "0.26.0",
        "--base",
        str(tmp_path / "base.json"),
        "--lock",
        str(tmp_path / "requirements.lock"),
        "--no-patches",
        "-o",
        str(out),
    ]


# the offline lock fixtures (a numpy-1.x base snapshot + the fixture wheelhouse, real uv)
from tests.test_lock import np1_base, offline  # noqa: E402,F401

# the synthetic releases of tests/test_upgrade.py (two bases, a toy series)
from tests.test_upgrade import bases, release  # noqa: E402,F401


class AuthFileServer:
    """A loopback HTTP file server over ``root`` that answers only with Basic ``user:password``
    (a directory answers with a links page, as a find-links index does)."""

    def __init__(self, root: Path, user: str = "ci-bot", password: str = "s3cr3t-PASSWORD-42"):
        import base64
        import functools
        import http.server
        import threading

        self.user, self.password, self.hits = user, password, []
        want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):  # noqa: N802
                ok = self.headers.get("Authorization") == want
                server.hits.append((self.path, ok))
                if not ok:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="wheels"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                return super().do_GET()

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.user}:{self.password}@127.0.0.1:{self.port}/"

    @property
    def bare_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def auth_wheel_server(wheelhouse):
    srv = AuthFileServer(wheelhouse)
    try:
        yield srv
    finally:
        srv.close()
