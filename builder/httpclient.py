"""The one HTTP policy: every request build-image sends to a registry, a package index or a file server.

Pure part, :func:`redirect_hop`: what follows a redirect answer.  Credentials (``Authorization`` and every other
header but ``Accept``, ``Accept-Encoding``, ``User-Agent`` and ``Range``) go only to the scheme://host:port
the request was made for, as Docker and containerd do: a registry redirecting a blob GET to a storage host or
CDN (a pre-signed URL that needs no credential) gets the blob fetched anonymously, and a chain that leaves the
origin never regains them.  A redirect to anything but http(s), from https to http, carrying a
``user:password@``, without a usable ``Location`` or past :data:`MAX_REDIRECTS` hops is refused.

Adapter, :func:`open_url`: the request through that policy, its answer bounded in size (``limit``: a
``Content-Length`` above it is refused before a byte of the body is read, and no more than the limit plus its
framing is ever read from the socket) and in time (``deadline``: the whole exchange, headers and body, not
only each read: a server sending one byte every few seconds is cut off at the deadline).  Each refusal is
the caller's typed error (``error``: :class:`~builder.errors.RegistryError` for a registry,
:class:`~builder.errors.IntegrityError` for an index or a download), never an internal error.
"""

from __future__ import annotations

import functools
import http.client
import io
import string
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from builder.credentials import redact_url
from builder.errors import BuildImageError, IntegrityError

MAX_REDIRECTS = 10
#: a registry's JSON answer (manifest, index, token, error document): the distribution's own manifest bound
JSON_LIMIT = 4 << 20
#: what the answer's framing (status line, headers, chunk sizes) may add to the body's limit on the socket
_FRAMING = 64 << 10
#: the headers that may follow a redirect to another origin: none of them carries a credential
SAFE_ACROSS_ORIGINS = frozenset({"accept", "accept-encoding", "user-agent", "range"})
_CONTENT_HEADERS = frozenset({"content-length", "content-type"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


class RedirectRefused(ValueError):
    """A redirect the policy does not follow (its reason is the message)."""


class _NotFollowed(Exception):
    """A redirect answer to a method that is not redirected (a PUT, a POST on 307/308): returned as it is."""


def origin(url: str) -> str:
    """Pure: ``scheme://host:port`` of ``url``, lower-cased, the default port filled in (ValueError for a URL
    urllib cannot split or a port that is not a number)."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or _DEFAULT_PORTS.get(scheme, "")
    return f"{scheme}://{(parts.hostname or '').lower()}:{port}"


@dataclass(frozen=True)
class Hop:
    """The request a redirect leads to: its URL, method and headers."""

    url: str
    method: str
    headers: dict[str, str]


def redirect_hop(
    url: str,
    method: str,
    headers: dict[str, str],
    code: int,
    location: str | None,
    *,
    credential_origin: str,
    hops: int,
) -> Hop:
    """Pure: the request that follows the answer ``code`` with ``location`` to ``method url`` (made with
    ``headers``, after ``hops`` redirects, for credentials given to ``credential_origin``); RedirectRefused
    for one the policy refuses (module doc)."""
    if hops >= MAX_REDIRECTS:
        raise RedirectRefused(f"more than {MAX_REDIRECTS} redirects")
    if not location or not location.strip():
        raise RedirectRefused(f"an HTTP {code} redirect without a Location")
    try:
        target = urllib.parse.urljoin(url, location.strip())
        target = urllib.parse.quote(target, encoding="iso-8859-1", safe=string.punctuation)
        parts = urllib.parse.urlsplit(target)
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:
        raise RedirectRefused(f"a redirect to an unreadable location ({location!r:.120})") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise RedirectRefused(f"a redirect to a {scheme or 'scheme-less'} URL (only http and https are followed)")
    if "@" in parts.netloc:
        raise RedirectRefused("a redirect carrying a user:password")
    if not parts.hostname:
        raise RedirectRefused("a redirect to a URL without a host")
    if urllib.parse.urlsplit(url).scheme.lower() == "https" and scheme == "http":
        raise RedirectRefused(f"a redirect from https to plain http ({redact_url(target)})")
    verb = method.upper()
    if (code == 303 and verb != "HEAD") or (code in (301, 302) and verb == "POST"):
        new_method = "GET"  # the body is not sent again, nor the headers that describe it
    elif verb in ("GET", "HEAD"):
        new_method = verb
    else:
        raise _NotFollowed
    kept = {k: v for k, v in headers.items() if new_method == verb or k.lower() not in _CONTENT_HEADERS}
    if origin(target) != credential_origin:
        kept = {k: v for k, v in kept.items() if k.lower() in SAFE_ACROSS_ORIGINS}
    return Hop(target, new_method, kept)


# --------------------------------------------------------------------------- adapter
class _Budget:
    """What one request (with its redirects) may take: ``limit`` bytes of body, ``deadline`` seconds in all."""

    def __init__(self, limit: int | None, deadline: float | None, error: type[BuildImageError], what: str):
        self.limit, self.deadline, self.error, self.what = limit, deadline, error, what
        self.end = time.monotonic() + deadline if deadline is not None else None

    def remaining(self) -> float | None:
        if self.end is None:
            return None
        left = self.end - time.monotonic()
        if left <= 0:
            raise self.late()
        return left

    def late(self) -> BuildImageError:
        return self.error(
            f"{self.what} did not finish within {self.deadline:g} s (the deadline of the whole answer, "
            "not of each read); the answer was abandoned."
        )

    def broken(self, exc: Exception) -> BuildImageError:
        return self.error(f"{self.what}: the answer is not well-formed HTTP or broke off ({type(exc).__name__}).")

    def too_large(self, size: int | None = None) -> BuildImageError:
        said = f" ({size} bytes)" if size is not None else ""
        return self.error(f"{self.what}: the answer{said} is larger than the {self.limit} bytes allowed; refused.")


class _Reader(io.RawIOBase):
    """The socket as http.client reads it: every read checks the deadline (the socket's timeout is cut to
    what is left of it) and the byte budget (the limit plus the framing)."""

    def __init__(self, sock, budget: _Budget):
        self._raw = sock.makefile("rb", buffering=0)
        self._sock, self._budget, self._timeout = sock, budget, sock.gettimeout()
        self._left = None if budget.limit is None else budget.limit + _FRAMING + budget.limit // 16

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        left = self._budget.remaining()
        if left is not None:
            self._sock.settimeout(left if self._timeout is None else min(self._timeout, left))
        view = memoryview(b)
        if self._left is not None:
            if self._left <= 0:
                raise self._budget.too_large()
            view = view[: self._left]
        try:
            n = self._raw.readinto(view)
        except TimeoutError:
            self._budget.remaining()  # the deadline passed: that error, not the read's timeout
            raise
        if n and self._left is not None:
            self._left -= n
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


class _SockView:
    def __init__(self, sock, budget: _Budget):
        self._sock, self._budget = sock, budget

    def makefile(self, *_a, **_kw):
        return io.BufferedReader(_Reader(self._sock, self._budget))


class _Response(http.client.HTTPResponse):
    """An answer whose body reads count against the limit exactly (the socket bound counts framing too)."""

    def __init__(self, sock, debuglevel=0, method=None, url=None, *, budget: _Budget):
        super().__init__(_SockView(sock, budget), debuglevel, method, url)
        self._budget, self._body = budget, 0

    def _counted(self, read, arg) -> bytes:
        try:
            data = read(arg)
        except http.client.HTTPException as exc:  # a body cut short, a chunk size that is not hex, ...
            if isinstance(exc, OSError):
                raise  # a dropped connection stays a connection error
            raise self._budget.broken(exc) from None
        self._body += len(data)
        if self._budget.limit is not None and self._body > self._budget.limit:
            raise self._budget.too_large()
        return data

    def read(self, amt=None):
        return self._counted(super().read, amt)

    def read1(self, n=-1):
        return self._counted(super().read1, n)


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, *a, budget: _Budget, **kw):
        super().__init__(*a, **kw)
        self.response_class = functools.partial(_Response, budget=budget)


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *a, budget: _Budget, **kw):
        super().__init__(*a, **kw)
        self.response_class = functools.partial(_Response, budget=budget)


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, budget: _Budget):
        super().__init__()
        self._budget = budget

    def http_open(self, req):
        return self.do_open(functools.partial(_HTTPConnection, budget=self._budget), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, budget: _Budget):
        super().__init__()
        self._budget = budget

    def https_open(self, req):
        return self.do_open(functools.partial(_HTTPSConnection, budget=self._budget), req, context=self._context)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirect step through :func:`redirect_hop` (the chain's origin and hop count ride on the request)."""

    def http_error_302(self, req, fp, code, msg, headers):
        hops = getattr(req, "_redirect_hops", 0)
        cred = getattr(req, "_credential_origin", None) or origin(req.full_url)
        try:
            hop = redirect_hop(
                req.full_url,
                req.get_method(),
                dict(req.headers),
                code,
                headers.get("Location") or headers.get("URI"),
                credential_origin=cred,
                hops=hops,
            )
        except _NotFollowed:
            raise urllib.error.HTTPError(req.full_url, code, msg, headers, fp) from None
        except RedirectRefused:
            fp.close()
            raise
        fp.close()  # the redirect's own body is never read
        new = urllib.request.Request(
            hop.url, headers=hop.headers, method=hop.method, origin_req_host=req.origin_req_host, unverifiable=True
        )
        new._redirect_hops, new._credential_origin = hops + 1, cred
        return self.parent.open(new, timeout=req.timeout)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def check_url(url: str, error: type[BuildImageError] = IntegrityError) -> None:
    """An http(s) URL with a host and without ``user:password@`` (a credential travels in a header, made by
    :func:`builder.credentials.request`, never in the request line); ``error`` otherwise."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018
    except ValueError:
        raise error(f"{url!r:.200} is not a usable URL.") from None
    if parts.scheme.lower() not in _DEFAULT_PORTS or not parts.hostname:
        raise error(f"{redact_url(url)}: only http and https URLs with a host are requested.")
    if "@" in parts.netloc:
        raise error(f"{redact_url(url)}: a user:password in a URL is sent as a header, never in the URL; refused.")


def open_url(
    req: urllib.request.Request,
    *,
    limit: int | None,
    timeout: float,
    deadline: float | None,
    error: type[BuildImageError] = IntegrityError,
    what: str | None = None,
) -> http.client.HTTPResponse:
    """The answer to ``req`` through the policy (module doc): redirects by :func:`redirect_hop`, the body at
    most ``limit`` bytes (None: unbounded, for a download streamed to disk and verified by its digest), each
    read at most ``timeout`` seconds, the whole exchange at most ``deadline`` seconds (None: no deadline).
    An HTTP error status is raised as urllib raises it (``urllib.error.HTTPError``, its body bounded the same
    way); a refused redirect, an answer too large or too slow is ``error`` naming ``what``."""
    what = what or f"{req.get_method()} {redact_url(req.full_url)}"
    check_url(req.full_url, error)
    budget = _Budget(limit, deadline, error, what)
    opener = urllib.request.build_opener(_HTTPHandler(budget), _HTTPSHandler(budget), _Redirects())
    try:
        resp = opener.open(req, timeout=timeout)
    except RedirectRefused as exc:
        raise error(f"{what}: {exc}; refused.") from None
    except http.client.HTTPException as exc:  # a status line or headers that are not HTTP, too many headers
        if isinstance(exc, OSError):
            raise  # the server hung up: a connection error, as the callers report it
        raise budget.broken(exc) from None
    if limit is not None and resp.length is not None and resp.length > limit:
        resp.close()
        raise budget.too_large(resp.length)
    return resp
