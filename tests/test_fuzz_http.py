"""Property-based tests of the HTTP policy's redirects (builder/httpclient.py; docs/faults.md, third round).

Generated redirect chains (hosts, ports, schemes, userinfo, relative locations, status codes, methods): a
credential-bearing header reaches a URL only while the chain has never left the origin's scheme://host:port;
nothing but http(s) is followed, never https -> http, never past the hop bound.  The pure step
(:func:`builder.httpclient.redirect_hop`) is checked on every chain, and the whole client
(:func:`builder.httpclient.open_url`) on chains through three real loopback sites.  The profiles of
tests/test_fuzz.py apply (``examples``)."""

from __future__ import annotations

import itertools
import urllib.parse
import urllib.request

import pytest
from hypothesis import given
from hypothesis import strategies as st

from builder import httpclient
from builder.errors import RegistryError
from tests.fx_http import Site
from tests.test_fuzz import examples

ORIGIN = "https://reg.example/v2/team/vllm/blobs/sha256:aa"
CREDENTIALED = {"Authorization": "Basic c2VjcmV0", "Cookie": "s=1", "X-Registry-Token": "t", "Private-Token": "p"}
PLAIN = {"Accept": "application/json", "User-agent": "build-image/0", "Range": "bytes=0-9"}

hosts = st.sampled_from(["reg.example", "REG.example", "cdn.example", "reg.example.evil", "127.0.0.1", "[::1]", ""])
ports = st.sampled_from(["", ":443", ":80", ":5000", ":0443", ":x"])
schemes = st.sampled_from(["https", "http", "HTTPS", "ftp", "file", "javascript", "data", ""])
userinfo = st.sampled_from(["", "u:pw@", "u@", ":@"])
paths = st.sampled_from(["/blob", "/v2/x?X-Amz-Signature=s", "", "/a b", "/%2e%2e/x"])
absolute = st.builds(lambda s, u, h, p, q: f"{s}://{u}{h}{p}{q}", schemes, userinfo, hosts, ports, paths)
relative = st.sampled_from(["/other", "next", "//cdn.example/x", "//reg.example/y", "?q=1", "#f", " ", ""])
locations = st.one_of(absolute, relative, st.text(max_size=30), st.none())
codes = st.sampled_from([301, 302, 303, 307, 308])
methods = st.sampled_from(["GET", "HEAD", "POST", "PUT"])


def _safe_origin(url: str) -> str | None:
    try:
        return httpclient.origin(url)
    except ValueError:
        return None


@examples(300)
@given(method=methods, chain=st.lists(st.tuples(codes, locations), max_size=14))
def test_fuzz_redirect_chains_keep_credentials_at_the_origin(method, chain):
    home = httpclient.origin(ORIGIN)
    url, headers, hops, left_home = ORIGIN, {**CREDENTIALED, **PLAIN}, 0, False
    for code, location in chain:
        try:
            hop = httpclient.redirect_hop(url, method, headers, code, location, credential_origin=home, hops=hops)
        except httpclient.RedirectRefused:
            break
        except httpclient._NotFollowed:
            assert method.upper() not in ("GET", "HEAD")
            break
        parts = urllib.parse.urlsplit(hop.url)
        assert parts.scheme.lower() in ("http", "https") and parts.hostname and "@" not in parts.netloc
        assert not (urllib.parse.urlsplit(url).scheme.lower() == "https" and parts.scheme.lower() == "http")
        left_home = left_home or _safe_origin(hop.url) != home
        secret = {k for k in hop.headers if k.lower() not in httpclient.SAFE_ACROSS_ORIGINS}
        # a credential iff the chain never left the origin (one that left and came back regains nothing)
        assert ("Authorization" in hop.headers) is (not left_home)
        assert not secret or not left_home
        assert set(PLAIN) <= set(hop.headers)  # what carries no credential still goes along
        url, method, headers, hops = hop.url, hop.method, hop.headers, hops + 1
        assert hops <= httpclient.MAX_REDIRECTS


@pytest.fixture(scope="module")
def three_sites():
    sites = [Site("127.0.0.1"), Site("127.0.0.2"), Site("127.0.0.1")]  # the origin, another host, another port
    yield sites
    for s in sites:
        s.close()


_run = itertools.count()


@examples(25)
@given(plan=st.lists(st.tuples(st.integers(0, 2), codes, st.booleans()), min_size=0, max_size=12))
def test_fuzz_redirect_chains_through_real_hosts(three_sites, plan):
    """Hop i lives on site plan[i][0] and redirects (code plan[i][1]; an absolute or a path-only Location)
    to hop i+1; the last hop answers 200.  The request starts at site 0 with credentials."""
    n = next(_run)
    for s in three_sites:
        s.routes.clear()
        s.seen.clear()
    where = [0] + [site for site, _c, _a in plan]

    def route(i):
        if i == len(where) - 1:
            return lambda h: h.reply(200, b"done")
        code, absolute = plan[i][1], plan[i][2]
        nxt = three_sites[where[i + 1]]
        path = f"/e{n}/h/{i + 1}"
        same = where[i + 1] == where[i]
        return lambda h: h.redirect(f"{nxt.base}{path}" if absolute or not same else path, code)

    for i, site in enumerate(where):
        three_sites[site].routes[f"/e{n}/h/{i}"] = route(i)
    origin = three_sites[0]
    req = urllib.request.Request(f"{origin.base}/e{n}/h/0", headers={**CREDENTIALED, **PLAIN})
    try:
        with httpclient.open_url(req, limit=1 << 10, timeout=5, deadline=20, error=RegistryError) as resp:
            assert resp.read() == b"done"
        assert len(plan) <= httpclient.MAX_REDIRECTS
    except RegistryError as exc:
        assert len(plan) > httpclient.MAX_REDIRECTS, exc.message
    home_prefix = list(itertools.takewhile(lambda s: s == 0, where))  # the hops before the chain first left
    for k, site in enumerate(three_sites):
        for _m, path, headers, _b in site.seen:
            hop = int(path.rsplit("/", 1)[1])
            has = {h.lower() for h in headers} & {c.lower() for c in CREDENTIALED}
            assert not has or (k == 0 and hop < len(home_prefix)), (k, path, has)
            if k == 0 and hop < len(home_prefix):
                assert len(has) == len(CREDENTIALED)
