"""Verified downloads: one sha256-checked cache for every file the builder fetches.

Adapter module (network + disk).  Public interface:

* :func:`fetch` ``(url, sha256, *, filename=None, reporter=None) -> Path`` — the
  cached, verified copy of ``url``.  Files live in
  ``builder.util.cache_dir()/downloads/<sha256>/<filename>``; a download is written
  to a temp file in that folder, hashed, and renamed into place only when its
  sha256 matches.  A cached file is re-hashed on the first call of a process (and
  whenever it changed since: :func:`builder.util.file_digest`): a partial or corrupt
  one (wrong size or hash) is deleted and fetched again.  Any failure raises
  :class:`builder.errors.IntegrityError`.
* :func:`vllm_wheel` ``(version, sha256=None) -> Path`` — the manylinux x86_64
  vllm wheel of ``version``, found through PyPI's JSON API and fetched with
  :func:`fetch`.  ``BUILD_IMAGE_VLLM_WHEEL=/path/to.whl`` overrides the download
  (still checked against ``sha256`` or PyPI's hash when either is known).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from builder import __version__
from builder.credentials import auth_header
from builder.errors import BadInput, IntegrityError
from builder.events import SILENT, Reporter, stderr_reporter
from builder.httpclient import open_url
from builder.scratch import process_tag
from builder.util import cache_dir, file_digest, remember_digest, sha256_file
from builder.validate import load_json

PYPI_JSON = os.environ.get("BUILD_IMAGE_PYPI_JSON", "https://pypi.org/pypi")
WHEEL_ENV = "BUILD_IMAGE_VLLM_WHEEL"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_PROGRESS_MIN_BYTES = 8 << 20  # show a bar for files above 8 MiB
_CHUNK = 1 << 20


def downloads_dir() -> Path:
    d = cache_dir() / "downloads"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _filename_of(url: str) -> str:
    name = url.split("#")[0].split("?")[0].rstrip("/").rsplit("/", 1)[-1]
    name = urllib.request.url2pathname(name)
    if not name or name in (".", "..") or "/" in name:
        raise BadInput(f"cannot derive a file name from URL {url!r}; pass filename=.")
    return name


def cached_path(sha256: str, filename: str) -> Path:
    """Where :func:`fetch` keeps the file with this hash (it may not exist yet)."""
    return downloads_dir() / sha256 / filename


def verified(path: Path, sha256: str) -> bool:
    try:
        return path.is_file() and file_digest(path) == sha256
    except OSError:
        return False


def fetch(url: str, sha256: str, *, filename: str | None = None, reporter: Reporter | None = None) -> Path:
    """Return a verified local copy of ``url`` whose sha256 is ``sha256`` (see module doc).  The bytes of
    a download over 8 MiB go to ``reporter`` as :meth:`~builder.events.Reporter.transfer` events
    (default: a bar on a terminal's stderr; :data:`builder.events.SILENT` for none)."""
    sha256 = (sha256 or "").lower().removeprefix("sha256:")
    if not _HEX64.match(sha256):
        raise IntegrityError(
            f"fetch {url}: expected sha256 is not 64 hex digits ({sha256!r:.80}); refusing an unverified download."
        )
    name = filename or _filename_of(url)
    dest = cached_path(sha256, name)
    if dest.exists():
        if verified(dest, sha256):
            return dest
        # partial / corrupt / tampered cache entry: drop it and fetch again
        dest.unlink(missing_ok=True)
    dest.parent.mkdir(parents=True, exist_ok=True)

    # named by this process (pid + start time): a run killed mid-download leaves a .part the next sweeps
    fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.{process_tag()}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            _download_to(url, out, name, reporter)
        got = sha256_file(tmp)
        if got != sha256:
            raise IntegrityError(
                f"download of {url} has sha256 {got}, expected {sha256}; the file was discarded.",
                hint="the server sent different bytes than pinned: check the pin (lock/series) or the mirror.",
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
        remember_digest(dest, got)  # the bytes just hashed: the cache check of this run does not hash them again
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _download_to(url: str, out, name: str, reporter: Reporter | None) -> None:
    if url.startswith("file://") or url.startswith("/"):
        src = urllib.request.url2pathname(url[len("file://") :]) if url.startswith("file://") else url
        try:  # non-blocking: a FIFO named by a lock or a find-links folder cannot hang the download
            with os.fdopen(os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as fh:
                if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                    raise IntegrityError(f"cannot read {url}: not a regular file; a wheel is one.")
                shutil.copyfileobj(fh, out, _CHUNK)
        except OSError as exc:
            raise IntegrityError(f"cannot read {url}: {exc}.") from None
        return

    target, auth = auth_header(url)  # credentials from the URL, the flags' URLs, netrc or keyring
    try:
        req = urllib.request.Request(target, headers={"User-Agent": f"build-image/{__version__}", **auth})
        # through the HTTP policy: the credential never follows a redirect to another host; the bytes are
        # streamed to disk and verified by their sha256 (no size limit, no deadline: each read times out)
        with open_url(req, limit=None, timeout=120, deadline=None, what=f"the download of {url}") as resp:
            total = int(resp.headers.get("Content-Length") or 0)
            got = _copy_with_progress(resp, out, total, name, reporter)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise IntegrityError(
                f"cannot fetch {url}: HTTP {exc.code} "
                f"({'no credential was found' if not auth else 'the credential was refused'}).",
                hint="build-image finds a credential for a URL without one in $NETRC or ~/.netrc (machine HOST login "
                "USER password SECRET), or the keyring package; locks never record it.",
            ) from None
        raise IntegrityError(f"cannot fetch {url}: HTTP {exc.code} {exc.reason}.") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise IntegrityError(f"cannot fetch {url}: {getattr(exc, 'reason', exc)}.") from None
    if total and got != total:
        raise IntegrityError(f"download of {url} stopped after {got} of {total} bytes.")


def _copy_with_progress(resp, out, total: int, name: str, reporter: Reporter | None) -> int:
    got = 0
    if total < _PROGRESS_MIN_BYTES:
        reporter = SILENT
    elif reporter is None:
        reporter = stderr_reporter()
    try:
        while block := resp.read(_CHUNK):
            out.write(block)
            got += len(block)
            reporter.transfer(f"fetch {name}", got, total)
    finally:
        reporter.transfer(f"fetch {name}", total, total)
    return got


# --------------------------------------------------------------------------- vllm wheel
#: a PyPI JSON document: the size and the time one answer may take
JSON_LIMIT = 64 << 20
JSON_DEADLINE_S = 300.0


def _get_json(url: str):
    req = urllib.request.Request(
        url, headers={"User-Agent": f"build-image/{__version__}", "Accept": "application/json"}
    )
    with open_url(req, limit=JSON_LIMIT, timeout=120, deadline=JSON_DEADLINE_S, what=f"the query {url}") as resp:
        doc = load_json(resp.read(), url, error=IntegrityError)  # nesting bounded
    if not isinstance(doc, dict):
        raise IntegrityError(f"{url} answered {type(doc).__name__}, not a JSON object.")
    return doc


def pypi_release_files(project: str, version: str) -> list[dict]:
    """The files of ``project==version`` on PyPI (file name, url, digests, packagetype).

    Asks the per-release JSON API (``/pypi/<p>/<v>/json``); where that answers 404
    (some mirrors only serve the per-project document) falls back to the project's
    ``releases[<v>]``.
    """
    url = f"{PYPI_JSON}/{project}/{version}/json"
    try:
        try:
            files = list(_get_json(url).get("urls") or [])
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
            files = None
        if files is None:
            url = f"{PYPI_JSON}/{project}/json"
            releases = _get_json(url).get("releases") or {}
            if version not in releases:
                raise BadInput(f"{project} {version} is not on PyPI (not among the releases listed by {url}).")
            files = list(releases[version] or [])
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise BadInput(f"{project} is not on PyPI ({url} answered 404).") from None
        raise IntegrityError(f"cannot query {url}: HTTP {exc.code}.") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise IntegrityError(f"cannot query {url}: {getattr(exc, 'reason', exc)}.") from None
    # mirrors may answer with relative file URLs: resolve them against the document's URL
    return [dict(f, url=urllib.parse.urljoin(url, f.get("url", ""))) for f in files]


def pick_manylinux_x86_64(files: list[dict]) -> dict | None:
    """Pure: the manylinux x86_64 wheel among a PyPI release's files (highest manylinux tag first)."""
    cands = [
        f
        for f in files
        if f.get("packagetype") == "bdist_wheel"
        and str(f.get("filename", "")).endswith(".whl")
        and "manylinux" in f["filename"]
        and "x86_64" in f["filename"]
    ]

    def glibc(f: dict) -> tuple[int, int]:
        m = re.search(r"manylinux_(\d+)_(\d+)_x86_64", f["filename"])
        return (int(m.group(1)), int(m.group(2))) if m else (2, 17)

    cands.sort(key=lambda f: (glibc(f), f["filename"]), reverse=True)
    return cands[0] if cands else None


def _find_cached_wheel(version: str, sha256: str) -> Path | None:
    folder = downloads_dir() / sha256
    for p in sorted(folder.glob(f"vllm-{version}-*.whl")) if folder.is_dir() else []:
        if verified(p, sha256):
            return p
    return None


def vllm_wheel(version: str, sha256: str | None = None, *, reporter: Reporter | None = None) -> Path:
    """The verified vllm ``version`` manylinux x86_64 wheel (see module doc).

    ``sha256``: the pinned hash (the patch series' ``wheel.sha256``); when given and a
    verified copy is cached, no network is used.  A PyPI hash that differs from the
    pin is an :class:`IntegrityError`.
    """
    sha256 = sha256.lower() if sha256 else None
    override = os.environ.get(WHEEL_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise BadInput(f"{WHEEL_ENV}={override}: no such file.")
        expected = sha256
        if expected is None:
            try:
                info = pick_manylinux_x86_64(pypi_release_files("vllm", version))
                expected = info["digests"]["sha256"] if info and info["filename"] == path.name else None
            except (IntegrityError, BadInput):
                expected = None  # offline and no pin: nothing to check against
        if expected is not None and sha256_file(path) != expected:
            raise IntegrityError(
                f"{WHEEL_ENV}={override}: sha256 differs from the pinned vllm {version} wheel ({expected})."
            )
        return path
    if sha256:
        hit = _find_cached_wheel(version, sha256)
        if hit is not None:
            return hit
    info = pick_manylinux_x86_64(pypi_release_files("vllm", version))
    if info is None:
        raise BadInput(f"vllm {version} has no manylinux x86_64 wheel on PyPI.")
    pypi_sha = info["digests"]["sha256"]
    if sha256 and pypi_sha != sha256:
        raise IntegrityError(
            f"PyPI's vllm {version} wheel {info['filename']} has sha256 {pypi_sha}, but the pin says {sha256}.",
        )
    return fetch(info["url"], pypi_sha, filename=info["filename"], reporter=reporter)
