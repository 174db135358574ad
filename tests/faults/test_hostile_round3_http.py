"""Hostile inputs, third round: what a registry, an index or a file server answers (docs/faults.md).

Class 1: a credential never follows a redirect to another scheme://host:port (a blob GET redirected to a
storage host is fetched anonymously, as a pre-signed URL is); redirects to other schemes, from https to http
and past the hop bound are refused.  Class 11: a registry answer is bounded in size (a 3 GiB answer is exit
10 at once) and in time (one byte every few seconds is cut off at the deadline).  The sites are loopback
servers (tests/fx_http.py): the registry on 127.0.0.1, the storage host on 127.0.0.2."""

from __future__ import annotations

import base64
import hashlib
import json
import time

import pytest

from builder import credentials, fetch
from builder.errors import IntegrityError, RegistryError
from builder.image import registry, retag
from builder.resolve.index import SimpleIndex
from tests.fx_http import Site

from .conftest import cli

SECRET = "r3dir-s3cret-PW"
BASIC = base64.b64encode(f"ci-bot:{SECRET}".encode()).decode()
CONFIG = json.dumps({"config": {"Env": ["A=1"], "Cmd": ["serve"]}}).encode()
CONFIG_DIGEST = "sha256:" + hashlib.sha256(CONFIG).hexdigest()


@pytest.fixture
def sites():
    reg, store = Site("127.0.0.1"), Site("127.0.0.2")
    store.routes["/store/blob"] = lambda h: h.reply(200, CONFIG)
    reg.routes["/store/blob"] = lambda h: h.reply(200, CONFIG)  # the same file at the origin, for `localhost`
    yield reg, store
    reg.close()
    store.close()


@pytest.fixture
def docker_login(tmp_path, monkeypatch):
    """``docker login`` for a registry address: Basic credentials in $DOCKER_CONFIG/config.json."""

    def login(addr: str) -> None:
        cfg = tmp_path / "docker-config"
        cfg.mkdir(exist_ok=True)
        (cfg / "config.json").write_text(json.dumps({"auths": {addr: {"auth": BASIC}}}))
        monkeypatch.setenv("DOCKER_CONFIG", str(cfg))

    return login


def _authorized(h, scheme: str) -> bool:
    return (h.headers.get("Authorization") or "").startswith(scheme)


def _basic_registry(reg: Site, location: str, code: int = 307) -> None:
    """A registry asking for Basic credentials, redirecting the config blob to ``location``."""

    def blob(h):
        if not _authorized(h, "Basic"):
            return h.reply(401, b"{}", {"WWW-Authenticate": 'Basic realm="registry"'})
        h.redirect(location, code)

    reg.routes[f"/v2/team/vllm/blobs/{CONFIG_DIGEST}"] = blob


def _manifest() -> retag.Manifest:
    doc = {
        "schemaVersion": 2,
        "mediaType": retag.OCI_MANIFEST,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": CONFIG_DIGEST,
            "size": len(CONFIG),
        },
        "layers": [],
    }
    body = json.dumps(doc).encode()
    return retag.Manifest(digest="sha256:" + hashlib.sha256(body).hexdigest(), media_type=retag.OCI_MANIFEST, body=body)


def _no_secret_at(site: Site) -> None:
    assert site.auth_seen() == []
    for _m, path, headers, body in site.seen:
        text = path + json.dumps(headers) + body.decode("latin-1")
        assert SECRET not in text and BASIC not in text


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_blob_redirected_to_a_storage_host_is_fetched_without_the_credential(sites, docker_login, code):
    reg, store = sites
    docker_login(reg.addr)
    _basic_registry(reg, f"{store.base}/store/blob?X-Amz-Signature=abc&X-Amz-Expires=60", code)
    client = registry.RegistryClient(reg.addr)
    got = retag.container_config(client, "team/vllm", _manifest())
    assert got["Env"] == ["A=1"] and got["digest"] == CONFIG_DIGEST  # the download worked anonymously
    assert reg.auth_seen() == [f"Basic {BASIC}"]  # the registry got it, once, after its challenge
    assert len(store.seen) == 1
    _no_secret_at(store)


def test_a_bearer_token_stays_with_the_registry_and_the_login_with_its_realm(sites, docker_login):
    reg, store = sites
    docker_login(reg.addr)

    def token(h):
        if not _authorized(h, "Basic"):
            return h.reply(401, b"{}")
        h.reply(200, json.dumps({"token": "tok-PRIVATE-1"}).encode(), {"Content-Type": "application/json"})

    def blob(h):
        if h.headers.get("Authorization") != "Bearer tok-PRIVATE-1":
            challenge = f'Bearer realm="{reg.base}/token",service="registry",scope="repository:team/vllm:pull"'
            return h.reply(401, b"{}", {"WWW-Authenticate": challenge})
        h.redirect(f"{store.base}/store/blob?sig=1")

    reg.routes["/token"] = token
    reg.routes[f"/v2/team/vllm/blobs/{CONFIG_DIGEST}"] = blob
    got = retag.container_config(registry.RegistryClient(reg.addr), "team/vllm", _manifest())
    assert got["Cmd"] == ["serve"]
    assert f"Basic {BASIC}" in reg.auth_seen() and "Bearer tok-PRIVATE-1" in reg.auth_seen()
    _no_secret_at(store)
    assert all("tok-PRIVATE-1" not in json.dumps(h) for _m, _p, h, _b in store.seen)


def test_another_port_or_another_name_of_the_same_machine_is_another_host(sites, docker_login):
    reg, store = sites
    other = Site("127.0.0.1")  # the same address, another port
    other.routes["/store/blob"] = lambda h: h.reply(200, CONFIG)
    try:
        for target, where in ((f"{other.base}/store/blob", other), (f"http://localhost:{reg.port}/store/blob", reg)):
            docker_login(reg.addr)
            _basic_registry(reg, target)
            retag.container_config(registry.RegistryClient(reg.addr), "team/vllm", _manifest())
            fetched = [h for _m, p, h, _b in where.seen if p == "/store/blob"]
            assert len(fetched) == 1 and not any(k.lower() == "authorization" for k in fetched[0])
        _no_secret_at(other)
    finally:
        other.close()


def test_a_redirect_within_the_registry_keeps_the_credential(sites, docker_login):
    reg, _store = sites
    docker_login(reg.addr)
    _basic_registry(reg, "/v2/team/vllm/moved/config")

    def moved(h):
        if not _authorized(h, "Basic"):
            return h.reply(401, b"{}", {"WWW-Authenticate": 'Basic realm="registry"'})
        h.reply(200, CONFIG)

    reg.routes["/v2/team/vllm/moved/config"] = moved
    retag.container_config(registry.RegistryClient(reg.addr), "team/vllm", _manifest())
    assert [p for _m, p, h, _b in reg.seen if "Authorization" in h][-1] == "/v2/team/vllm/moved/config"


@pytest.mark.parametrize(
    "location, says",
    [
        ("file:///etc/passwd", "file URL"),
        ("ftp://127.0.0.2/blob", "ftp URL"),
        ("http://ci-bot:pw@127.0.0.2/store/blob", "user:password"),
        ("/v2/team/vllm/loop", "more than 10 redirects"),
    ],
)
def test_a_redirect_the_policy_refuses_is_a_registry_error(sites, docker_login, location, says):
    reg, store = sites
    docker_login(reg.addr)
    _basic_registry(reg, location)
    reg.routes["/v2/team/vllm/loop"] = lambda h: h.redirect("/v2/team/vllm/loop")
    with pytest.raises(RegistryError) as err:
        retag.container_config(registry.RegistryClient(reg.addr), "team/vllm", _manifest())
    assert says in err.value.message and err.value.exit_code == 10
    assert "pw@" not in err.value.message
    assert store.seen == []


def test_a_download_and_an_index_keep_their_credential_at_home(sites, tmp_path, monkeypatch):
    reg, store = sites
    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(credentials, "_remembered", {})
    wheel = b"PK-not-really-a-wheel"
    store.routes["/files/x-1.0-py3-none-any.whl"] = lambda h: h.reply(200, wheel)
    listing = {"files": [{"filename": "x-1.0-py3-none-any.whl", "url": "x.whl", "hashes": {"sha256": "0" * 64}}]}
    store.routes["/simple/x/"] = lambda h: h.reply(200, json.dumps(listing).encode())

    def home(h):  # the index and file server: Basic auth, then off to the storage host
        if not _authorized(h, "Basic"):
            return h.reply(401, b"", {"WWW-Authenticate": 'Basic realm="index"'})
        h.redirect(f"{store.base}{h.path}", 302)

    reg.routes["/files/x-1.0-py3-none-any.whl"] = reg.routes["/simple/x/"] = home
    files = SimpleIndex(f"http://ci-bot:{SECRET}@{reg.addr}/simple").files("x")  # remembers the credential
    assert [f.filename for f in files] == ["x-1.0-py3-none-any.whl"]
    got = fetch.fetch(f"{reg.base}/files/x-1.0-py3-none-any.whl", hashlib.sha256(wheel).hexdigest())
    assert got.read_bytes() == wheel
    assert len(reg.auth_seen()) == 2
    _no_secret_at(store)


# --------------------------------------------------------------------------- class 11: size and time
GIB3 = 3 << 30


def test_a_3_gib_manifest_is_refused_before_its_body_is_read(sites):
    reg, _ = sites
    reg.routes["/v2/team/vllm/manifests/prod"] = lambda h: h.endless(GIB3)
    t0 = time.monotonic()
    with pytest.raises(RegistryError) as err:
        registry.RegistryClient(reg.addr).manifest("team/vllm", "prod")
    assert "larger than" in err.value.message and str(GIB3) in err.value.message
    assert time.monotonic() - t0 < 5


def test_an_endless_chunked_answer_stops_at_the_limit(sites):
    reg, _ = sites
    reg.routes["/v2/team/vllm/manifests/prod"] = lambda h: h.endless(None)
    with pytest.raises(RegistryError, match="larger than the 4194304 bytes"):
        registry.RegistryClient(reg.addr).manifest("team/vllm", "prod")


def test_a_blob_longer_than_its_descriptor_is_refused(sites):
    reg, _ = sites
    reg.routes[f"/v2/team/vllm/blobs/{CONFIG_DIGEST}"] = lambda h: h.reply(200, CONFIG + b" " * 5000)
    with pytest.raises(RegistryError, match=f"larger than the {len(CONFIG)} bytes"):
        retag.container_config(registry.RegistryClient(reg.addr), "team/vllm", _manifest())


@pytest.mark.parametrize("size", [-1, "12", None, registry.MAX_BLOB + 1, True])
def test_a_descriptor_size_outside_its_range_is_a_registry_error(size):
    with pytest.raises(RegistryError, match="whole number"):
        registry.blob_limit({"digest": CONFIG_DIGEST, "size": size}, "the config", "r.example")


@pytest.mark.parametrize("where, every", [("headers", 0.4), ("body", 0.4), ("body", 3.0)])
def test_one_byte_every_few_seconds_meets_the_deadline(sites, where, every):
    """0.4 s: every read gets its byte, the deadline is met between reads; 3 s: the read waiting for the next
    byte is cut to what is left of the deadline (its own timeout, 10 s, would let every byte through)."""
    reg, _ = sites
    if where == "headers":
        route = lambda h: h.trickle(b"HTTP/1.1 200 OK\r\nX-Slow: ", every=every)  # noqa: E731
    else:
        route = lambda h: h.trickle(  # noqa: E731
            b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n{", every=every
        )
    reg.routes["/v2/team/vllm/manifests/prod"] = route
    t0 = time.monotonic()
    with pytest.raises(RegistryError, match="did not finish within 1.5 s"):
        registry.RegistryClient(reg.addr, timeout=10, deadline=1.5).manifest("team/vllm", "prod")
    assert time.monotonic() - t0 < 4  # each read got its byte within the read timeout: the deadline cut it


def test_an_index_answer_has_a_deadline_too(sites, monkeypatch, tmp_path):
    reg, _ = sites
    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path / "cache"))
    reg.routes["/simple/x/"] = lambda h: h.trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 9999\r\n\r\n{", every=0.3)
    import builder.resolve.index as ix

    monkeypatch.setattr(ix, "DEADLINE_S", 1.0)
    with pytest.raises(IntegrityError, match="did not finish within 1 s"):
        SimpleIndex(f"{reg.base}/simple").files("x")


def test_promote_against_a_registry_answering_3_gib_is_exit_10(sites, tmp_path):
    from tests.fx_cutover import write_spec

    reg, _ = sites
    digest = "sha256:" + "ab" * 32
    reg.routes["/v2/"] = lambda h: h.reply(200, b"{}")
    reg.routes[f"/v2/team/vllm/manifests/{digest}"] = lambda h: h.endless(GIB3)
    spec = write_spec(tmp_path / "build-image.toml")
    r = cli(
        ["promote", f"{reg.addr}/team/vllm@{digest}", "--to", f"{reg.addr}/team/vllm:prod", "--spec", str(spec)],
        env={"XDG_STATE_HOME": str(tmp_path / "state")},
        timeout=60,
    )
    assert r.returncode == 10, r.stderr
    assert "larger than the 4194304 bytes allowed" in r.stderr and "Traceback" not in r.stderr


def _raw(data: bytes):
    return lambda h: (h.wfile.write(data), h.wfile.flush())


@pytest.mark.parametrize(
    "answer",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(150)) + b"\r\n",
        b"HTTP/1.1 200 OK\r\nX-Long: " + b"y" * 70000 + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{}\r\n",
    ],
    ids=["not-http", "150-headers", "long-header", "cut-short", "bad-chunk"],
)
def test_an_answer_that_is_not_http_is_a_registry_error(sites, answer):
    reg, _ = sites
    reg.routes["/v2/team/vllm/manifests/prod"] = _raw(answer)
    with pytest.raises(RegistryError) as err:
        registry.RegistryClient(reg.addr).manifest("team/vllm", "prod")
    assert err.value.exit_code == 10 and "registry 127.0.0.1" in err.value.message
