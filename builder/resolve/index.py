"""Package-index adapter: file listings, upload times and core metadata of releases.

The one place that asks a package index about a project (uv does the resolving;
this answers the questions uv has no command for: "which upload time does the
vllm 0.27.0 wheel have", "what does ray 2.58.1's ``llm`` extra require").

Two sources, one interface (:class:`IndexFile` rows):

* :class:`SimpleIndex` — the PEP 691 JSON simple API (``https://pypi.org/simple``
  unless ``UV_DEFAULT_INDEX`` / ``UV_INDEX_URL`` / ``PIP_INDEX_URL`` name another).
  Listings are cached for :data:`LISTING_TTL_S` under ``cache_dir()/index`` (a
  stale listing is used when the index cannot be reached).  A wheel's METADATA is
  read from its PEP 658 ``.metadata`` file when the index serves one (sha256-verified
  against the listing), else from the wheel itself through HTTP range requests (the
  zip's central directory and the one METADATA member, as pip and uv read metadata
  lazily); either way cached by the wheel's sha256.
* :class:`FindLinks` — wheels in local folders (``--find-links``): the upload time is
  the file's modification time, the metadata is read from the file.

Only what the index reports is used: no date is typed by hand anywhere.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import re
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from email.parser import HeaderParser
from functools import cached_property
from pathlib import Path
from typing import Protocol

from packaging.utils import parse_wheel_filename
from packaging.version import Version

from builder import __version__, credentials, httpclient, values
from builder.errors import IntegrityError
from builder.util import atomic_write_text, cache_dir, canonical_name, sha256_bytes, sha256_file
from builder.validate import load_json

DEFAULT_INDEX = "https://pypi.org/simple"
LISTING_TTL_S = 900
_ACCEPT = "application/vnd.pypi.simple.v1+json"
_METADATA_RE = re.compile(r"^[^/]+\.dist-info/METADATA$")
# An absolute http(s) URL that urljoin returns unchanged: a host (and port), a path, and nothing
# urlsplit would rewrite (no userinfo, brackets, params, query, fragment, space or non-ASCII).
_PLAIN_URL_RE = re.compile(r"https?://[A-Za-z0-9.-]+(?::[0-9]+)?(?:/[A-Za-z0-9._~%!$&'()*+,=:@/-]*)?")


@dataclass(frozen=True)
class IndexFile:
    """One distribution file of a project as an index lists it."""

    filename: str
    url: str
    sha256: str
    upload_time: datetime | None
    yanked: bool = False
    requires_python: str | None = None
    metadata_sha256: str | None = None  # PEP 658/714: the index serves url + ".metadata"

    @cached_property
    def _wheel(self):
        """The wheel's name parsed once (a listing of ray holds ~2000 files, each asked for its version
        and its tags); None for a file that is not a wheel or whose name does not parse."""
        if not self.filename.endswith(".whl"):
            return None
        try:
            return parse_wheel_filename(self.filename)
        except ValueError:  # InvalidWheelFilename, InvalidVersion, a part past int()'s digit limit
            return None

    @property
    def version(self) -> Version | None:
        return self._wheel[1] if self._wheel is not None else None

    @property
    def tags(self):
        if self._wheel is None:  # not a wheel: parse_wheel_filename's own error, as before
            return parse_wheel_filename(self.filename)[3]
        return self._wheel[3]


class Index(Protocol):
    def files(self, project: str) -> list[IndexFile]: ...

    def metadata(self, f: IndexFile) -> str: ...


def index_url() -> str:
    """The Python index: the first of ``UV_DEFAULT_INDEX``, ``UV_INDEX_URL``, ``PIP_INDEX_URL`` that is set, as an
    http(s)/file URL (:class:`builder.values.Url`: BadInput naming the variable for any other text), else PyPI."""
    for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if os.environ.get(var):
            return str(values.Url(os.environ[var], f"environment variable {var}")).rstrip("/")
    return DEFAULT_INDEX


def parse_time(text: str | None) -> datetime | None:
    """ISO-8601 (``2026-10-21T00:43:25.281368Z``) -> aware UTC datetime."""
    if not text:
        return None
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def format_time(dt: datetime) -> str:
    """The form uv's ``--exclude-newer`` takes (RFC 3339, UTC, second precision)."""
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_listing(doc: dict, base_url: str) -> list[IndexFile]:
    """PEP 691 project document -> files (pure)."""
    out = []
    for f in doc.get("files", []):
        sha = (f.get("hashes") or {}).get("sha256")
        if not sha:
            continue
        meta = f.get("core-metadata", f.get("data-dist-info-metadata"))
        meta_sha = meta.get("sha256") if isinstance(meta, dict) else None
        url = f["url"]
        if not _PLAIN_URL_RE.fullmatch(url):  # PyPI lists absolute URLs: joined only when it must be
            url = urllib.request.urljoin(base_url + "/", url)
        out.append(
            IndexFile(
                filename=f["filename"],
                url=url,
                sha256=sha,
                upload_time=parse_time(f.get("upload-time")),
                yanked=bool(f.get("yanked")),
                requires_python=f.get("requires-python"),
                metadata_sha256=meta_sha,
            )
        )
    return out


def metadata_field(text: str, name: str) -> list[str]:
    return list(HeaderParser().parsestr(text, headersonly=True).get_all(name) or [])


def _wheel_metadata_from_zip(zf: zipfile.ZipFile, where: str) -> str:
    names = [n for n in zf.namelist() if _METADATA_RE.match(n)]
    if not names:
        raise IntegrityError(f"{where}: the wheel has no .dist-info/METADATA.")
    return zf.read(names[0]).decode("utf-8", "replace")


class _RangeReader(io.RawIOBase):
    """A seekable read-only view of a remote file through HTTP range requests
    (blocks of 256 KiB, kept in memory): enough for :mod:`zipfile` to read the
    central directory and one member."""

    BLOCK = 1 << 18

    def __init__(self, url: str, size: int, opener):
        self.url, self.size, self._open = url, size, opener
        self.pos = 0
        self.blocks: dict[int, bytes] = {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, off: int, whence: int = 0) -> int:
        self.pos = off if whence == 0 else (self.pos + off if whence == 1 else self.size + off)
        return self.pos

    def _block(self, i: int) -> bytes:
        if i not in self.blocks:
            lo, hi = i * self.BLOCK, min(self.size, (i + 1) * self.BLOCK) - 1
            req = credentials.request(
                self.url, headers={"Range": f"bytes={lo}-{hi}", "User-Agent": f"build-image/{__version__}"}
            )
            with self._open(req) as r:
                data = r.read()
                if getattr(r, "status", 206) != 206 or len(data) != hi - lo + 1:
                    raise IntegrityError(f"{self.url}: the server does not answer range requests.")
            self.blocks[i] = data
        return self.blocks[i]

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = self.size - self.pos
        n = max(0, min(n, self.size - self.pos))
        out = bytearray()
        while n > 0:
            i, off = divmod(self.pos, self.BLOCK)
            chunk = self._block(i)[off : off + n]
            out += chunk
            self.pos += len(chunk)
            n -= len(chunk)
        return bytes(out)

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


#: an index answer (a listing, a .metadata file, a range of a wheel): the size and the time it may take
ANSWER_LIMIT = 64 << 20
DEADLINE_S = 300.0


def _urlopen(req, timeout: float = 60):
    """Every index request, through the HTTP policy (``builder/httpclient.py``): the credential only to the
    index's own host, the answer bounded in size and time (IntegrityError otherwise)."""
    return httpclient.open_url(req, limit=ANSWER_LIMIT, timeout=timeout, deadline=DEADLINE_S, error=IntegrityError)


class SimpleIndex:
    """PEP 691 JSON simple API (see module doc)."""

    def __init__(self, url: str | None = None, opener=None):
        url = (url or index_url()).rstrip("/")
        credentials.remember(url)  # in memory: every request to this origin authenticates with it
        self.url = credentials.split_userinfo(url)[0]  # never in a request line, a cache name or a message
        self._open = opener or _urlopen

    def _cache(self, project: str) -> Path:
        return cache_dir() / "index" / f"{sha256_bytes(self.url.encode())[:12]}-{canonical_name(project)}.json"

    def files(self, project: str) -> list[IndexFile]:
        url = f"{self.url}/{canonical_name(project)}/"
        cpath = self._cache(project)
        doc = None
        if cpath.exists() and time.time() - cpath.stat().st_mtime < LISTING_TTL_S:
            try:
                doc = json.loads(cpath.read_text())
            except ValueError:
                doc = None
        if doc is None:
            req = credentials.request(url, headers={"Accept": _ACCEPT, "User-Agent": f"build-image/{__version__}"})
            try:
                with self._open(req) as r:
                    raw = r.read()
                doc = load_json(raw, f"the index listing {url}", error=IntegrityError)  # depth-bounded
                atomic_write_text(cpath, raw.decode("utf-8"))
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise IntegrityError(f"cannot read the index listing {url}: {exc}.") from None
                return []  # the index has no such project: it lists no files
            except (OSError, ValueError, http.client.HTTPException) as exc:
                if cpath.exists():  # a stale listing beats none (offline); it only lacks newer uploads
                    doc = json.loads(cpath.read_text())
                else:
                    raise IntegrityError(
                        f"cannot read the index listing {url}: {exc}.",
                        hint="the index must answer the PEP 691 JSON API "
                        f"(Accept: {_ACCEPT}); set UV_DEFAULT_INDEX for a mirror.",
                    ) from None
        return parse_listing(doc, url)

    def metadata(self, f: IndexFile) -> str:
        cpath = cache_dir() / "metadata" / f"{f.sha256}.METADATA"
        if cpath.exists():
            return cpath.read_text()
        if f.metadata_sha256:
            req = credentials.request(f.url + ".metadata", headers={"User-Agent": f"build-image/{__version__}"})
            try:
                with self._open(req) as r:
                    data = r.read()
            except (OSError, http.client.HTTPException) as exc:
                raise IntegrityError(f"cannot fetch {f.url}.metadata: {exc}.") from None
            if sha256_bytes(data) != f.metadata_sha256:
                raise IntegrityError(f"{f.url}.metadata: sha256 does not match the index listing; refused.")
            text = data.decode("utf-8", "replace")
        else:
            text = self._metadata_by_range(f)
        atomic_write_text(cpath, text)
        return text

    def _metadata_by_range(self, f: IndexFile) -> str:
        head = credentials.request(f.url, method="HEAD", headers={"User-Agent": f"build-image/{__version__}"})
        try:
            with self._open(head) as r:
                size = int(r.headers.get("Content-Length") or 0)
            if not size:
                raise IntegrityError(f"{f.url}: the server reports no size; its metadata cannot be read lazily.")
            with zipfile.ZipFile(_RangeReader(f.url, size, self._open)) as zf:
                text = _wheel_metadata_from_zip(zf, f.url)
        except (OSError, zipfile.BadZipFile) as exc:
            raise IntegrityError(f"cannot read the metadata of {f.url}: {exc}.") from None
        got = metadata_field(text, "Name")
        if not got or canonical_name(got[0]) != canonical_name(parse_wheel_filename(f.filename)[0]):
            raise IntegrityError(f"{f.url}: its METADATA names {got[:1]}, not the wheel's project; refused.")
        return text


class FindLinks:
    """Wheels in local folders: upload time = file modification time."""

    def __init__(self, dirs: Iterable[str | Path]):
        self.dirs = [Path(d) for d in dirs if "://" not in str(d)]

    def files(self, project: str) -> list[IndexFile]:
        want = canonical_name(project)
        out = []
        for d in self.dirs:
            for p in sorted(d.glob("*.whl")) if d.is_dir() else []:
                try:
                    name = parse_wheel_filename(p.name)[0]
                except ValueError:  # InvalidWheelFilename, InvalidVersion, a part past int()'s digit limit
                    continue
                if name != want:
                    continue
                out.append(
                    IndexFile(
                        filename=p.name,
                        url=p.resolve().as_uri(),
                        sha256=sha256_file(p),
                        upload_time=datetime.fromtimestamp(p.stat().st_mtime, tz=timezone.utc),
                    )
                )
        return out

    def metadata(self, f: IndexFile) -> str:
        path = Path(urllib.request.url2pathname(f.url[len("file://") :]))
        try:
            with zipfile.ZipFile(path) as zf:
                return _wheel_metadata_from_zip(zf, str(path))
        except (OSError, zipfile.BadZipFile) as exc:
            raise IntegrityError(f"cannot read the metadata of {path}: {exc}.") from None


class Chain:
    """Several sources as one: files of all (local folders first), metadata from the one that listed it."""

    def __init__(self, sources: Iterable[Index]):
        self.sources = list(sources)
        self._owner: dict[str, Index] = {}

    def files(self, project: str) -> list[IndexFile]:
        out: list[IndexFile] = []
        for s in self.sources:
            for f in s.files(project):
                self._owner.setdefault(f.url, s)
                out.append(f)
        return out

    def metadata(self, f: IndexFile) -> str:
        return self._owner[f.url].metadata(f)


_REACHABLE: dict[str, bool] = {}


def reachable(url: str, timeout: float = 5.0) -> bool:
    """Whether an index answers from this machine (adapter: one GET of its root, remembered for the
    process; any HTTP answer counts, a refused or unresolvable host, a timeout or a malformed URL do not)."""
    key = url.rstrip("/")
    if key not in _REACHABLE:
        req = urllib.request.Request(key + "/", headers={"User-Agent": f"build-image/{__version__}"})
        try:
            with _urlopen(req, timeout=timeout):
                ok = True
        except urllib.error.HTTPError:
            ok = True  # the host answered
        except Exception:  # noqa: BLE001 - any other failure means: not reachable from here
            ok = False
        _REACHABLE[key] = ok
    return _REACHABLE[key]


def for_request(find_links: Iterable[str], no_index: bool) -> Index:
    """The sources a lock with these index flags resolves from."""
    sources: list[Index] = [FindLinks(find_links)]
    if not no_index:
        sources.append(SimpleIndex())
    return Chain(sources)
