"""Credentials in URLs: kept out of every file, label, log and JSON document; found at use time.

Pure part: :func:`redact_url` removes the userinfo (``user:password@``) and the values of
token-like query parameters (``token``, ``access_token``, ``X-Amz-Signature``, ...) from a URL;
:func:`redact_text` does it for every URL in a text.  What build-image writes (the lock's
``# index:`` line and wheel URLs, the context's ``requirements.lock``, messages, ``--json``)
goes through them, so a lock records where its files come from without the secret needed to
fetch them.

Use time (:func:`auth_header`): like uv, the credential for a URL comes from the URL itself
when a flag carried one (kept in memory only, :func:`remember`, so every later fetch from the
same scheme://host:port in this process authenticates too), else from netrc (``$NETRC``, else
``~/.netrc``), else from the ``keyring`` package when it is installed.
"""

from __future__ import annotations

import base64
import os
import re
import urllib.parse
from pathlib import Path

MASK = "****"
_TOKEN_PARAM = re.compile(
    r"^(?:.*token.*|.*secret.*|.*passw(?:or)?d.*|pwd|auth|authorization|.*api[-_]?key.*|key|sig|signature|"
    r"x-amz-(?:signature|credential|security-token)|x-goog-(?:signature|credential)|se?ssion(?:id)?|credential)$",
    re.I,
)
# an environment variable whose value is a secret, by its name (HF_TOKEN, AWS_SECRET_ACCESS_KEY, API_KEY, ...)
_SECRET_ENV = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|(?:^|_)KEYS?(?:$|_)", re.I)
ENV_MASK = "<redacted>"


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Pure: an environment as a report shows it, sorted by name, a value whose name reads as a secret
    :data:`ENV_MASK`, so a token given to an engine reaches no report, attestation or log."""
    return {k: (ENV_MASK if _SECRET_ENV.search(k) else v) for k, v in sorted(env.items())}


_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>`]+")
_remembered: dict[str, tuple[str, str]] = {}


def _port(parts: urllib.parse.SplitResult) -> str:
    """The port as written (``parts.port`` raises on one that is not a number; the URL is still told apart)."""
    try:
        return str(parts.port or "")
    except ValueError:
        return parts.netloc.rsplit("@", 1)[-1].rpartition(":")[2]


def _origin(parts: urllib.parse.SplitResult) -> str:
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}:{_port(parts)}"


def redact_url(url: str) -> str:
    """Pure: ``url`` without userinfo (``****@``) and with token-like query values masked."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url
    if not parts.scheme or not parts.netloc and not parts.query:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        if any(_TOKEN_PARAM.match(k) for k, _ in pairs):
            query = "&".join(
                f"{urllib.parse.quote(k, safe='-_.~')}="
                + (MASK if _TOKEN_PARAM.match(k) else urllib.parse.quote(v, safe="-_.~/:"))
                for k, v in pairs
            )
    if netloc == parts.netloc and query == parts.query:
        return url
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


# ``https:/user:PW@host``: a URL whose ``//`` a path normalisation collapsed to ``/``
_COLLAPSED = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*:/)(?!/)([^\s'\"<>`/@]+)@")
# ``user:PW@host[:port]/repo``: an image reference (or a scheme-less URL) carrying userinfo; the host is
# followed by a path, a space or the end (``repo:tag@sha256:…`` is a digest, not a credential)
_BARE_USERINFO = re.compile(
    r"(?<![\w/.@:-])([^\s'\"<>`/@:]+:[^\s'\"<>`/@]+)@"
    r"(?!sha256:|sha512:)([A-Za-z0-9][A-Za-z0-9.-]*(?::\d+)?)(?=[/\s'\"<>`,;)]|$)"
)


# userinfo right after any ``scheme://``, wherever it stands (``https://a/xhttps://user:PW@h``)
_AFTER_SCHEME = re.compile(r"(://)(?!\*\*\*\*@)[^\s'\"<>`/@]+@(?!sha256:|sha512:)")
# ``https://user:PW`` cut before its ``@`` (a message quoting at most N characters of a value): after the
# colon comes no port (a port is digits), so it is the start of a userinfo
_CUT_USERINFO = re.compile(
    r"(://)([^\s'\"<>`/@:\[\]]+):(?!\d*(?:[/?#\s'\"<>`,;)\]]|\.(?:\s|$)|$))[^\s'\"<>`/@]*(?=[\s'\"<>`,;)\]]|\.(?:\s|$)|…|$)"
)
# ``... rd@host/x``: the start of a userinfo cut off by a truncation mark (a parser's error snippet)
_CUT_BEFORE = re.compile(r"(\.\.\.|…)(\s*)[^\s'\"<>`/@]+@(?!sha256:|sha512:)(?=[A-Za-z0-9])")


def redact_text(text: str) -> str:
    """Pure: every URL in ``text`` passed through :func:`redact_url`, whatever its form: with a scheme
    (``https://user:PW@host``), with its ``//`` collapsed (``https:/user:PW@host``), or without a scheme
    (``user:PW@host/repo``, as an image reference or a ``--tag`` carries it)."""
    if not text or ("://" not in text and "@" not in text):
        return text

    def one(m: re.Match) -> str:
        url = m.group(0)
        core = url.rstrip(".,:;)]}")  # sentence punctuation after a URL is not part of it
        return redact_url(core) + url[len(core) :]

    text = _URL.sub(one, text) if "://" in text else text
    if "://" in text and "@" in text:  # a URL glued to another one's path (no space between): its userinfo too
        text = _AFTER_SCHEME.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    if "@" in text:
        text = _COLLAPSED.sub(lambda m: f"{m.group(1)}{MASK}@", text)
        text = _BARE_USERINFO.sub(lambda m: f"{MASK}@{m.group(2)}", text)
        if "..." in text or "…" in text:
            text = _CUT_BEFORE.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}@", text)
    if "://" in text:
        text = _CUT_USERINFO.sub(lambda m: f"{m.group(1)}{MASK}", text)
    return text


def redact_value(value):
    """Pure: ``value`` (a JSON-able document: dicts, lists, tuples, strings, numbers) with every string in
    it, keys included, passed through :func:`redact_text`; the one rule every ``--json`` document and
    report build-image writes goes through (``builder.report.render_json``)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {redact_text(k) if isinstance(k, str) else k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v) for v in value]
    return value


def credential_fields(doc, where: str = "") -> list[str]:
    """Pure: the dotted paths of the strings in ``doc`` (a JSON-able document) that carry a credential
    (:func:`redact_text` would change them), walked iteratively; [] for a clean document."""
    found, todo = [], [(where, doc)]
    while todo:
        path, v = todo.pop()
        if isinstance(v, str):
            if redact_text(v) != v:
                found.append(path or "(the document)")
        elif isinstance(v, dict):
            todo += [(f"{path}.{k}" if path else str(k), x) for k, x in v.items()]
        elif isinstance(v, (list, tuple)):
            todo += [(f"{path}[{i}]", x) for i, x in enumerate(v)]
    return sorted(found)


def has_credentials(url: str) -> bool:
    return redact_url(url) != url


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """Pure: (url without userinfo, (user, password) or None), by the URL's parsed structure: the userinfo is
    everything before the netloc's last ``@`` (a password may hold ``@``, ``:`` or nothing; ``user:PW@host``
    without a port is a credential, never a port).  A URL urllib cannot split is returned whole, without one."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url, None
    if "@" not in parts.netloc:
        return url, None
    info, host = parts.netloc.rsplit("@", 1)
    user, sep, password = info.partition(":")
    cred = (urllib.parse.unquote(user), urllib.parse.unquote(password) if sep else "")
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment)), cred


def request(url: str, *, headers: dict[str, str] | None = None, method: str | None = None):
    """A ``urllib`` request for ``url`` without its userinfo, with the Basic ``Authorization`` header for the
    credential :func:`auth_header` finds (the URL's own, memory, netrc, keyring).  urllib would read a
    ``user:PW@host`` left in the URL as ``host:port`` (``InvalidURL: nonnumeric port``) and print the password;
    every request build-image sends to an index or a file server is made here."""
    import urllib.request

    bare, auth = auth_header(url)
    return urllib.request.Request(bare, headers={**(headers or {}), **auth}, method=method)


def remember(url: str) -> None:
    """Keep the userinfo of ``url`` (a --find-links / index flag) in memory for its origin."""
    if "://" not in url:
        return
    bare, cred = split_userinfo(url)
    if cred is not None:
        _remembered[_origin(urllib.parse.urlsplit(bare))] = cred


def _netrc(host: str) -> tuple[str, str] | None:
    import netrc

    path = os.environ.get("NETRC") or str(Path.home() / ".netrc")
    if not os.path.isfile(path):
        return None
    try:
        found = netrc.netrc(path).authenticators(host)
    except (netrc.NetrcParseError, OSError):
        return None
    if not found:
        return None
    login, _account, password = found
    return login or "", password or ""


def _keyring(url: str, user: str | None) -> tuple[str, str] | None:
    try:
        import keyring  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        cred = keyring.get_credential(url, user)
    except Exception:  # noqa: BLE001 - a broken keyring backend is "no credential"
        return None
    return (cred.username, cred.password) if cred is not None else None


def credential_for(url: str) -> tuple[str, tuple[str, str] | None]:
    """(url without userinfo, (user, password) or None) from the URL, memory, netrc, keyring."""
    bare, cred = split_userinfo(url)
    if cred is not None:
        return bare, cred
    try:
        parts = urllib.parse.urlsplit(bare)
        parts.hostname  # noqa: B018 - a bracketed host urllib cannot read: no credential to look up
    except ValueError:
        return bare, None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return bare, None
    cred = _remembered.get(_origin(parts)) or _netrc(parts.hostname) or _keyring(bare, None)
    return bare, cred


def auth_header(url: str) -> tuple[str, dict[str, str]]:
    """(url to request, headers) with an ``Authorization: Basic`` header when a credential is known."""
    bare, cred = credential_for(url)
    if cred is None:
        return bare, {}
    token = base64.b64encode(f"{cred[0]}:{cred[1]}".encode()).decode()
    return bare, {"Authorization": f"Basic {token}"}
