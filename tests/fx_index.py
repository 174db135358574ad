"""Fixture: a package index on loopback (PEP 691 JSON simple API + PEP 658 metadata files).

``local_index(wheels)`` serves the given wheel (and sdist) files with made-up upload times, so
uv's ``--exclude-newer`` and the tool's index adapter see exactly what a real
index would report.  Only 127.0.0.1; the server thread stops with the fixture.

    with serve_index({path: datetime, ...}) as url:   # url = http://127.0.0.1:PORT/simple
        ...
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import zipfile
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from packaging.utils import parse_sdist_filename, parse_wheel_filename


def _parse(name: str):
    """(project, version) of a wheel or an sdist (``.tar.gz``) file name."""
    return parse_sdist_filename(name) if name.endswith(".tar.gz") else parse_wheel_filename(name)[:2]


def _metadata(path: Path) -> bytes:
    with zipfile.ZipFile(path) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name)


@contextlib.contextmanager
def serve_index(wheels: dict[Path, datetime], prefix: str = "simple"):
    files = {p.name: (p, t) for p, t in wheels.items()}
    projects: dict[str, list[str]] = {}
    for name in files:
        projects.setdefault(str(_parse(name)[0]), []).append(name)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def _send(self, body: bytes, ctype: str, status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            parts = [p for p in self.path.split("?")[0].split("/") if p]
            if len(parts) == 2 and parts[0] == prefix and parts[1] in projects:
                doc = {"meta": {"api-version": "1.1"}, "name": parts[1], "versions": [], "files": []}
                for fname in sorted(projects[parts[1]]):
                    p, t = files[fname]
                    data = p.read_bytes()
                    row = {
                        "filename": fname,
                        "url": f"../../files/{fname}",
                        "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
                        "upload-time": t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z"),
                        "size": len(data),
                        "yanked": False,
                    }
                    if fname.endswith(".whl"):
                        row["core-metadata"] = {"sha256": hashlib.sha256(_metadata(p)).hexdigest()}
                    doc["files"].append(row)
                    doc["versions"].append(str(_parse(fname)[1]))
                return self._send(json.dumps(doc).encode(), "application/vnd.pypi.simple.v1+json")
            if len(parts) == 2 and parts[0] == "files":
                name = parts[1]
                if name.endswith(".metadata") and name[:-9] in files:
                    return self._send(_metadata(files[name[:-9]][0]), "text/plain")
                if name in files:
                    return self._send(files[name][0].read_bytes(), "application/octet-stream")
            self._send(b"not found", "text/plain", 404)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{prefix}"
    finally:
        server.shutdown()
        server.server_close()
