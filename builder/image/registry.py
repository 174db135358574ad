"""Registry v2 HTTP client: just enough to read manifest digests (no pushing).

``build-image push`` uses it before a push (does the tag already point at a
different image? -> TagConflict) and after (is the registry's manifest digest the
one the engine pushed? -> RegistryError otherwise).

Plain HTTP for loopback registries (``127.0.0.1``, ``localhost``, ``[::1]``), HTTPS
for everything else.  Credentials are only read, on a 401 challenge, from the
engine's own store (``$DOCKER_CONFIG/config.json``: its ``auths`` entry, base64
``user:password``, or the ``credHelpers``/``credsStore`` helper ``docker login``
used); they are sent in an Authorization header and never logged, printed or
written anywhere.

Every request goes through :func:`builder.httpclient.open_url`: the credential goes only to the registry's
own scheme://host:port (a blob GET the registry redirects to a storage host or a CDN is fetched without it),
each answer is bounded in size (:data:`~builder.httpclient.JSON_LIMIT` for manifests, indexes, tokens and
error documents; a blob read by the descriptor's size, :func:`blob_limit`) and in time (:data:`DEADLINE_S`
for the whole answer, :data:`TIMEOUT_S` for each read).  A refusal is :class:`RegistryError` (exit 10).
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from builder import httpclient
from builder.errors import BadInput, RegistryError
from builder.validate import load_json, read_bounded
from builder.values import RefParts, parse_ref

MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
    ]
)
#: the longest a blob build-image reads into memory may be (image configs, attestation statements)
MAX_BLOB = 64 << 20
TIMEOUT_S = 10.0  # each read
DEADLINE_S = 120.0  # the whole answer (a registry trickling one byte at a time is cut off here)
_LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?$")


def _docker_config_auth(registry: str) -> str | None:
    """Basic credentials for ``registry`` from the engine's config (never logged)."""
    cfg = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
    try:  # the bounded reader: a FIFO, a huge or deeply nested file is no usable config
        doc = load_json(read_bounded(cfg, "docker config"), str(cfg))
    except (BadInput, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    auths, helpers = doc.get("auths"), doc.get("credHelpers")
    for key, entry in (auths if isinstance(auths, dict) else {}).items():
        host = re.sub(r"^https?://", "", key).split("/")[0]
        if host in (registry, _HUB_AUTH_HOSTS.get(registry)) and isinstance(entry, dict) and entry.get("auth"):
            return entry["auth"]
    # `docker login` with a credential helper (credHelpers per registry, else credsStore) keeps
    # only an empty `auths` entry; the secret is in the helper, asked the way the engine asks it.
    helper = (helpers if isinstance(helpers, dict) else {}).get(registry) or doc.get("credsStore")
    if isinstance(helper, str) and re.fullmatch(r"[A-Za-z0-9._-]+", helper):
        return _helper_auth(helper, "https://index.docker.io/v1/" if registry == "docker.io" else registry)
    return None


_HUB_AUTH_HOSTS = {"docker.io": "index.docker.io"}


def _helper_auth(helper: str, server: str) -> str | None:
    """base64 ``user:secret`` from ``docker-credential-<helper> get``; None when it has nothing."""
    import base64
    import shutil
    import subprocess

    exe = shutil.which(f"docker-credential-{helper}")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "get"], input=server, capture_output=True, text=True, timeout=30)
        doc = load_json(proc.stdout, "the credential helper's answer") if proc.returncode == 0 else {}
    except (OSError, ValueError, BadInput, subprocess.SubprocessError):
        return None  # never echo the helper's output: it may hold the secret
    if not isinstance(doc, dict):
        return None
    user, secret = doc.get("Username"), doc.get("Secret")
    if not (isinstance(user, str) and isinstance(secret, str) and secret) or user == "<token>":
        return None  # identity tokens (OAuth refresh) are not basic credentials
    return base64.b64encode(f"{user}:{secret}".encode()).decode()


class RegistryClient:
    def __init__(self, registry: str, *, timeout: float | None = None, deadline: float | None = None):
        self.registry = registry
        self.timeout = TIMEOUT_S if timeout is None else timeout
        self.deadline = DEADLINE_S if deadline is None else deadline
        host = "registry-1.docker.io" if registry == "docker.io" else registry
        scheme = "http" if _LOOPBACK.match(registry) else "https"
        self.base = f"{scheme}://{host}"
        self._auth_header: str | None = None

    def _open(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
        _retried: bool = False,
        *,
        limit: int = httpclient.JSON_LIMIT,
    ):
        hdrs = dict(headers or {})
        if self._auth_header:
            hdrs["Authorization"] = self._auth_header
        req = urllib.request.Request(self.base + path, method=method, headers=hdrs, data=data)
        try:
            return self._send(req, limit, f"registry {self.registry}: {method} {path}")
        except urllib.error.HTTPError as exc:
            # one (re-)authentication per request: a pull-scoped token is traded for a push-scoped one
            if exc.code == 401 and not _retried and self._authenticate(exc.headers.get("WWW-Authenticate", "")):
                exc.close()
                return self._open(method, path, headers, data, _retried=True, limit=limit)
            raise
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RegistryError(
                f"registry {self.registry} is unreachable ({reason}).",
                hint="is the registry running? (scripts/services.sh start runs one on 127.0.0.1:5000)",
            ) from None

    def _send(self, req: urllib.request.Request, limit: int, what: str):
        """One request through the HTTP policy (module doc)."""
        return httpclient.open_url(
            req, limit=limit, timeout=self.timeout, deadline=self.deadline, error=RegistryError, what=what
        )

    def _authenticate(self, challenge: str) -> bool:
        basic = _docker_config_auth(self.registry)
        if challenge.lower().startswith("basic"):
            if basic:
                self._auth_header = f"Basic {basic}"
                return True
            return False
        if challenge.lower().startswith("bearer"):
            params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
            realm = params.pop("realm", None)
            if not realm:
                return False
            url = realm + "?" + urllib.parse.urlencode(params)
            req = urllib.request.Request(url, headers={"Authorization": f"Basic {basic}"} if basic else {})
            try:  # the realm the registry names gets the credential; a redirect from it does not
                with self._send(req, httpclient.JSON_LIMIT, f"registry {self.registry}: the token service") as resp:
                    body = resp.read()
            except (OSError, ValueError):
                return False
            try:
                doc = registry_json(body, "the token answer", self.registry)
            except RegistryError:
                return False
            token = doc.get("token") or doc.get("access_token")
            if token:
                self._auth_header = f"Bearer {token}"
                return True
        return False

    def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
        *,
        limit: int = httpclient.JSON_LIMIT,
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of one request; an HTTP error status is returned, not raised.  The body is
        at most ``limit`` bytes (a blob's: :func:`blob_limit` of its descriptor), else RegistryError."""
        if path.startswith(("http://", "https://")):
            if not path.startswith(self.base + "/"):
                raise RegistryError(
                    f"registry {self.registry} redirected an upload to another host ({path.split('/')[2]})."
                )
            path = path[len(self.base) :]
        try:
            with self._open(method, path, headers, data, limit=limit) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers or {}), exc.read() if exc.fp else b""

    def ping(self) -> None:
        try:
            with self._open("GET", "/v2/"):
                return
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                return  # reachable; auth handled per request
            raise RegistryError(f"registry {self.registry} answered /v2/ with HTTP {exc.code}.") from None

    def manifest(self, repository: str, reference: str) -> tuple[str, dict] | None:
        """(digest, manifest document) for ``repository:reference``; None when it does not exist."""
        path = f"/v2/{repository}/manifests/{reference}"
        try:
            with self._open("GET", path, {"Accept": MANIFEST_TYPES}) as resp:
                body = resp.read()
                digest = resp.headers.get("Docker-Content-Digest")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            if exc.code in (401, 403):
                raise RegistryError(
                    f"registry {self.registry} refused to show {repository}:{reference} (HTTP {exc.code}).",
                    hint="log in with the engine (`docker login`); build-image reads only its credential store.",
                ) from None
            raise RegistryError(f"registry {self.registry}: GET {path} answered HTTP {exc.code}.") from None
        if not digest:
            import hashlib

            digest = "sha256:" + hashlib.sha256(body).hexdigest()
        doc = registry_json(body, f"the manifest of {repository}:{reference}", self.registry)
        return digest, doc

    def manifest_digest(self, repository: str, reference: str) -> str | None:
        got = self.manifest(repository, reference)
        return got[0] if got else None

    def config_digest(self, repository: str, reference: str) -> str | None:
        """The image config digest (= the engine's image ID) a tag points at, or None."""
        got = self.manifest(repository, reference)
        return config_of(got[1]) if got else None


def blob_limit(descriptor, what: str, registry: str) -> int:
    """Pure: how many bytes the blob ``descriptor`` (an OCI descriptor: ``digest``, ``size``) may be read
    with: its ``size``, a whole number from 0 to :data:`MAX_BLOB`; RegistryError naming ``what`` otherwise."""
    size = descriptor.get("size") if isinstance(descriptor, dict) else None
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_BLOB:
        raise RegistryError(
            f"registry {registry}: {what} gives the size {size!r:.40}; a blob read into memory is a whole number "
            f"of bytes from 0 to {MAX_BLOB}."
        )
    return size


def config_of(manifest: dict) -> str | None:
    """The image config digest (= the engine's image ID) of a single-image manifest; None for an index."""
    cfg = (manifest.get("config") or {}).get("digest")
    return cfg if isinstance(cfg, str) else None


def compressed_size(manifest: dict) -> int | None:
    """What a pull downloads of a single-image manifest: its layers' and config's ``size`` (compressed blobs);
    None for an index or a manifest without sizes."""
    layers = manifest.get("layers")
    if not isinstance(layers, list) or not layers:
        return None
    sizes = [x.get("size") for x in layers if isinstance(x, dict)]
    if len(sizes) != len(layers) or not all(isinstance(s, int) and s >= 0 for s in sizes):
        return None
    cfg = (manifest.get("config") or {}).get("size", 0)
    return sum(sizes) + (cfg if isinstance(cfg, int) and cfg >= 0 else 0)


def registry_json(body: bytes | str, what: str, registry: str) -> dict:
    """A registry's JSON answer as a dict, nesting bounded: anything else (not JSON, too deep, not an object)
    is :class:`RegistryError` naming the registry and what was asked (exit 10, never an internal error)."""
    try:
        doc = load_json(body, f"registry {registry}: {what}", error=RegistryError)
    except (ValueError, UnicodeDecodeError):
        raise RegistryError(f"registry {registry}: {what} is not JSON.") from None
    if not isinstance(doc, dict):
        raise RegistryError(f"registry {registry}: {what} is not a JSON object.")
    return doc


def client_for(ref: str) -> tuple[RegistryClient, RefParts]:
    r = parse_ref(ref)
    return RegistryClient(r.registry), r
