"""Loopback HTTP sites for the HTTP policy's tests: a registry-like origin on 127.0.0.1 and a storage host on
127.0.0.2 (another address of the loopback interface, so another host to a client), each recording every
request it is sent, headers included, and answering by a table of path -> handler."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

Route = Callable[["_Handler"], None]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    site: Site

    def log_message(self, *_a):  # quiet
        pass

    def _any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = urlsplit(self.path).path
        self.site.seen.append((self.command, self.path, dict(self.headers), body))
        route = self.site.routes.get(path)
        if route is None:
            return self.reply(404, b'{"errors": []}')
        try:
            route(self)
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = _any

    def reply(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        hdrs = {"Content-Length": str(len(body)), **(headers or {})}
        for k, v in hdrs.items():
            self.send_header(k, v)
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def redirect(self, location: str, code: int = 307) -> None:
        self.reply(code, b"", {"Location": location})

    def trickle(self, head: bytes, every: float, total: int = 200) -> None:
        """``head`` at once, then one byte every ``every`` seconds (the client must give up first)."""
        self.wfile.write(head)
        self.wfile.flush()
        for _ in range(total):
            time.sleep(every)
            self.wfile.write(b" ")
            self.wfile.flush()

    def endless(self, declared: int | None, chunk: int = 1 << 16, most: int = 64 << 20) -> None:
        """200 with ``declared`` as Content-Length (None: chunked) and zeros until the client hangs up."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if declared is None:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(declared))
        self.send_header("Connection", "close")
        self.end_headers()
        block = b"0" * chunk
        for _ in range(most // chunk):
            if declared is None:
                self.wfile.write(f"{chunk:x}\r\n".encode() + block + b"\r\n")
            else:
                self.wfile.write(block)


class Site:
    """A loopback HTTP server on ``host`` (a free port): ``routes`` by path, ``seen`` what it was sent."""

    def __init__(self, host: str = "127.0.0.1"):
        self.routes: dict[str, Route] = {}
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        handler = type("Handler", (_Handler,), {"site": self})
        self.httpd = ThreadingHTTPServer((host, 0), handler)
        self.httpd.daemon_threads = True
        self.host, self.port = host, self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def base(self) -> str:
        return f"http://{self.addr}"

    def auth_seen(self) -> list[str]:
        """The Authorization headers this site was sent (any case of the name)."""
        return [v for _m, _p, h, _b in self.seen for k, v in h.items() if k.lower() == "authorization"]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
