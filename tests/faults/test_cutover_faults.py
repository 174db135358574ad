"""The registry is killed (SIGKILL, by PID: this test's own registry, never the shared one) in the middle of
`build-image promote`, exactly when the tag moves: before the registry received the move, or after it stored
it but before its answer arrived.  Either way the tag is at the old or the new digest, never anything else,
and the history says which once the registry answers again.

A small HTTP proxy in front of the registry sees the request that moves the tag and kills the registry there.
"""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.faults.conftest import free_port
from tests.fx_cutover import attest, cli, need_skopeo, push_image, tag_digest, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.docker]


class KillingProxy:
    """Forwards to ``upstream``; the first ``PUT …/manifests/<tag>`` kills the registry ``when`` = before | after
    forwarding it, and the client gets no answer."""

    def __init__(self, upstream: str, tag: str, when: str, kill):
        self.port = free_port()
        self.armed = True
        self.killed = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                moving = self.command == "PUT" and self.path.endswith(f"/manifests/{tag}") and proxy.armed
                if moving and when == "before":
                    proxy.armed = False
                    kill()
                    proxy.killed.set()
                    self.close_connection = True
                    return
                conn = http.client.HTTPConnection(upstream, timeout=30)
                try:
                    hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                    conn.request(self.command, self.path, body=body, headers=hdrs)
                    resp = conn.getresponse()
                    data = resp.read()
                except OSError:
                    self.close_connection = True
                    return
                finally:
                    conn.close()
                if moving:  # stored by the registry; its answer never arrives
                    proxy.armed = False
                    kill()
                    proxy.killed.set()
                    self.close_connection = True
                    return
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v.replace(f"//{upstream}/", f"//{proxy.addr}/"))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_PATCH = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("when, settles_to", [("before", "not-moved"), ("after", "done")])
def test_registry_killed_mid_promote_leaves_the_tag_old_or_new_and_history_says_which(
    tmp_path, own_registry, when, settles_to
):
    need_skopeo()
    repo = "cutover/app"
    direct = f"{own_registry.addr}/{repo}"
    old = push_image(tmp_path, f"{direct}:prod", "old")
    new = push_image(tmp_path, f"{direct}:candidate", "new")
    attest(own_registry.addr, repo, new)
    spec = write_spec(tmp_path / "build-image.toml")
    hist = tmp_path / "history.json"
    proxy = KillingProxy(own_registry.addr, "prod", when, own_registry.kill)
    try:
        via = f"{proxy.addr}/{repo}"
        r = cli("promote", f"{via}@{new}", "--to", f"{via}:prod", "--spec", str(spec), "--history", str(hist))
        assert proxy.killed.is_set(), r.stderr
        assert r.returncode == 10, r.stderr
        assert f"registry {proxy.addr}" in r.stderr
        (e,) = json.loads(hist.read_text())["entries"]
        assert e["status"] == "unconfirmed" and e["from"] == old and e["to"] == new

        r = cli("history", f"{via}:prod", "--history", str(hist))  # the registry is still down
        assert r.returncode == 0 and "UNCONFIRMED" in r.stdout and "did not answer" in r.stdout, r.stdout + r.stderr

        own_registry.start()  # same storage, same port
        at = tag_digest(f"{direct}:prod")
        assert at == (new if when == "after" else old)
        r = cli("history", f"{via}:prod", "--history", str(hist), "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["tag_at"] == at
        (e,) = doc["entries"]
        assert e["status"] == settles_to and e["tag_at"] == at
        assert json.loads(hist.read_text())["entries"][0]["status"] == settles_to  # settled on disk too
        if when == "after":  # the move that landed is a promotion like any other: it can be rolled back
            r = cli("rollback", f"{via}:prod", "--history", str(hist))
            assert r.returncode == 0, r.stderr
            assert tag_digest(f"{direct}:prod") == old
    finally:
        proxy.close()
