"""Checkpoint readiness, the content pass (``checkpoint verify --sha256 FILE | --hf-cache DIR``): the
sha256 of every shard against a sums file or what a Hugging Face cache records (blobs named by their LFS
sha256; ``--local-dir`` downloads keep it in ``.cache/huggingface/download/*.metadata``; small files by
their git blob sha1).  :class:`Sha256Hasher` is the one place file contents are read (in parallel); the
:class:`HashCache`, keyed by (real path, size, mtime, inode), re-hashes only what a resumed download
changed.  The structural pass (headers, index, shapes, leftovers) is :mod:`builder.serving.checkpoint`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import stat as statmod
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.errors import BadInput
from builder.events import SILENT, Reporter
from builder.serving.checkpoint import FileEntry, Inventory, Problem
from builder.util import atomic_write_text, cache_dir
from builder.validate import load_json, read_bounded_text

# --------------------------------------------------------------------------- expected digests


def parse_sums(text: str, source: str) -> dict[str, str]:
    """``sha256sum`` output (``HEX  NAME`` / ``HEX *NAME``) or BSD tags
    (``SHA256 (NAME) = HEX``) -> {name: hex}.  Raises BadInput naming the line."""
    out: dict[str, str] = {}
    for no, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = re.match(r"^SHA256 \((.+)\) = ([0-9a-fA-F]{64})$", s) or None
        if m:
            name, digest = m.group(1), m.group(2)
        else:
            m = re.match(r"^\\?([0-9a-fA-F]{64}) [ *](.+)$", s)
            if not m:
                raise BadInput(f"{source}, line {no}: not a sha256 line ('HEX  NAME', as sha256sum writes): {s[:80]!r}")
            digest, name = m.group(1), m.group(2)
        name = name[2:] if name.startswith("./") else name
        if name in out and out[name] != digest.lower():
            raise BadInput(f"{source}, line {no}: {name} is listed twice with different sums.")
        out[name] = digest.lower()
    if not out:
        raise BadInput(f"{source}: no sha256 lines in it.")
    return out


def load_sums(path: str | os.PathLike) -> dict[str, str]:
    p = Path(path)
    return parse_sums(read_bounded_text(p, "--sha256"), str(p))


_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
#: Non-shard files (config, tokenizer) up to this size are checked in-process with --hf-cache.
SMALL_FILE_BYTES = 64 << 20


@dataclass(frozen=True)
class HfSource:
    """Where a Hugging Face download recorded each file's etag (see :func:`hf_source`)."""

    cache: Path
    real: Path
    local_meta: Path | None  # a --local-dir download's .cache/huggingface/download


def hf_source(inv: Inventory, cache: str | os.PathLike) -> HfSource:
    """``cache`` is the hub cache (``~/.cache/huggingface/hub``), one ``models--*`` folder
    of it, or the checkpoint directory itself when it was downloaded with ``--local-dir``."""
    cache = Path(cache)
    if not cache.is_dir():
        raise BadInput(f"--hf-cache {cache}: not a directory.")
    real = Path(os.path.realpath(cache))
    local_meta = inv.root / ".cache" / "huggingface" / "download"
    if real == Path(os.path.realpath(inv.root)):
        if not local_meta.is_dir():
            raise BadInput(
                f"--hf-cache {cache}: the checkpoint has no .cache/huggingface/download metadata "
                "(not a --local-dir download)."
            )
        return HfSource(cache, real, local_meta)
    if not (cache / "blobs").is_dir() and not any(cache.glob("models--*")):
        raise BadInput(
            f"--hf-cache {cache}: neither a Hugging Face hub cache (models--*/blobs, snapshots) nor the checkpoint "
            "directory itself (a --local-dir download)."
        )
    return HfSource(cache, real, None)


def _recorded_etag(src: HfSource, entry: FileEntry) -> tuple[str | None, str | None]:
    """(etag, None) or (None, why not): a blob's name in the hub cache, or the etag line of a
    --local-dir download's metadata.  LFS files: the sha256 (64 hex); others: the git blob sha1."""
    if src.local_meta is not None:
        meta = src.local_meta / f"{entry.name}.metadata"
        try:
            lines = meta.read_text(encoding="utf-8").splitlines()
        except OSError:
            return None, f"the download metadata records nothing for it ({meta} is missing)"
        etag = lines[1].strip().strip('"').lower() if len(lines) > 1 else ""
        return (etag, None) if _HEX64.match(etag) or _HEX40.match(etag) else (None, f"{meta} records etag {etag!r}")
    try:
        entry.real.relative_to(src.real)
    except ValueError:
        return None, f"is not a file of the Hugging Face cache {src.cache} (resolves to {entry.real})"
    if entry.real.parent.name != "blobs" or not (_HEX64.match(entry.real.name) or _HEX40.match(entry.real.name)):
        return None, f"resolves to {entry.real}, not a blob named by its hash"
    return entry.real.name, None


def hf_expected(inv: Inventory, src: HfSource, names: Iterable[str]) -> tuple[dict[str, str], list[Problem]]:
    """What a Hugging Face download recorded as each shard's sha256 (shards are LFS files:
    hub blobs are named by their sha256; a --local-dir download's metadata holds it as the etag)."""
    expected: dict[str, str] = {}
    problems: list[Problem] = []
    for name in names:
        entry = inv.files.get(name)
        if entry is None:
            continue
        etag, why = _recorded_etag(src, entry)
        if etag is None:
            problems.append(Problem(name, why or "no etag"))
        elif not _HEX64.match(etag):
            problems.append(Problem(name, f"the download records {etag}, not an LFS sha256, for this shard"))
        else:
            expected[name] = etag
    return expected, problems


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a file's content (what the Hub names a non-LFS file's blob)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def check_hf_small_files(inv: Inventory, src: HfSource, skip: Iterable[str]) -> tuple[int, list[Problem]]:
    """The checkpoint's other files (config.json, tokenizer, ...) against the etags the download
    recorded: git blob sha1 for regular files, sha256 for LFS ones.  Files over
    :data:`SMALL_FILE_BYTES` and files with no record are left to the shard check."""
    skip = set(skip)
    checked, problems = 0, []
    for name, entry in sorted(inv.files.items()):
        if name in skip or name.endswith(".safetensors") or entry.size > SMALL_FILE_BYTES:
            continue
        etag, _ = _recorded_etag(src, entry)
        if etag is None:
            continue
        try:
            data = entry.path.read_bytes()
        except OSError as exc:
            problems.append(Problem(name, f"cannot be read: {exc.strerror or exc}"))
            continue
        got = hashlib.sha256(data).hexdigest() if len(etag) == 64 else git_blob_sha1(data)
        checked += 1
        if got != etag:
            kind = "sha256" if len(etag) == 64 else "git blob sha1"
            problems.append(Problem(name, f"{kind} {got} does not match {etag} recorded by the Hugging Face download"))
    return checked, problems


# --------------------------------------------------------------------------- hashing (the adapter)


class HashCache:
    """Digests of files already hashed, keyed by real path and (size, mtime_ns, inode, device).

    A file that is appended to, rewritten or replaced changes at least one of
    these, so it is hashed again; an unchanged file is not.  Stored as JSON under
    the user cache (never next to the checkpoint), written atomically under an
    flock so concurrent runs merge rather than overwrite each other.
    """

    VERSION = 1

    def __init__(self, path: str | os.PathLike | None = None):
        self.path: Path | None = Path(path) if path else self._default_path()
        self._entries: dict[str, dict[str, Any]] = self._read()
        self._new: dict[str, dict[str, Any]] = {}

    @staticmethod
    def _default_path() -> Path | None:
        """The cache file under the user cache; None when that cache cannot be used (a file, read-only,
        ``XDG_CACHE_HOME=/dev/null``): verification then keeps its digests in memory for this run only."""
        try:
            return cache_dir() / "checkpoint-sha256.json"
        except BadInput:
            return None

    def _read(self) -> dict[str, dict[str, Any]]:
        if self.path is None:
            return {}
        try:
            doc = load_json(self.path.read_text(encoding="utf-8"), str(self.path), error=ValueError)
        except (OSError, ValueError):
            return {}  # absent or damaged: start empty (it is only a cache)
        if not isinstance(doc, dict) or doc.get("version") != self.VERSION or not isinstance(doc.get("entries"), dict):
            return {}
        return doc["entries"]

    @staticmethod
    def _key(entry: FileEntry) -> dict[str, Any]:
        return {"size": entry.size, "mtime_ns": entry.mtime_ns, "ino": entry.ino, "dev": entry.dev}

    def forget_all(self) -> None:
        """Answer no lookups from disk (``--rehash``); new digests are still saved."""
        self._entries = {}

    def get(self, entry: FileEntry) -> str | None:
        rec = self._entries.get(str(entry.real))
        if not isinstance(rec, dict) or any(rec.get(k) != v for k, v in self._key(entry).items()):
            return None
        digest = rec.get("sha256")
        return digest if isinstance(digest, str) and _HEX64.match(digest) else None

    def put(self, entry: FileEntry, digest: str) -> None:
        rec = {**self._key(entry), "sha256": digest}
        self._entries[str(entry.real)] = rec
        self._new[str(entry.real)] = rec

    def save(self) -> None:
        if not self._new or self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                entries = self._read()
                entries.update(self._new)
                entries = {p: rec for p, rec in entries.items() if os.path.exists(p)}  # drop deleted files
                atomic_write_text(self.path, json.dumps({"version": self.VERSION, "entries": entries}, sort_keys=True))
        except OSError:
            pass  # a full or read-only cache keeps nothing: it is only a cache, the verdict stands
        self._new.clear()


class HashInterrupted(Exception):
    """:meth:`Sha256Hasher.stop` was called while a file was being hashed."""


class Sha256Hasher:
    """sha256 of whole files, several at a time (hashlib releases the GIL while it
    hashes and while the file is read, so threads use every core).  Ctrl-C stops
    every worker within one block, not at the end of a 100 GB file."""

    def __init__(self, jobs: int = 1, block: int = 4 << 20):
        if jobs < 1:
            raise BadInput(f"--jobs must be >= 1, got {jobs}.")
        self.jobs = jobs
        self.block = block
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def hash_file(self, path: str | os.PathLike, count: Callable[[int], None] | None = None) -> str:
        """The file's sha256; ``count`` is handed each block's length as it is read."""
        h = hashlib.sha256()
        buf = bytearray(self.block)
        view = memoryview(buf)
        with open(path, "rb", buffering=0) as fh:
            try:
                os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            except (AttributeError, OSError):
                pass
            while True:
                if self._stop.is_set():
                    raise HashInterrupted(str(path))
                n = fh.readinto(buf)
                if not n:
                    break
                h.update(view[:n])
                if count:
                    count(n)
        return h.hexdigest()

    def hash_many(
        self,
        entries: list[FileEntry],
        *,
        reporter: Reporter = SILENT,
        done: Callable[[FileEntry, str | None, str | None], None] | None = None,
    ) -> dict[str, str | Exception]:
        """{name: hex digest or the OSError}; largest files first so the pool stays busy.
        ``done`` is called as each file finishes (from the worker thread).  The bytes hashed so far, of
        all the files together, are one ``sha256`` transfer on ``reporter``."""
        order = sorted(entries, key=lambda e: -e.size)
        if not order:
            return {}
        total, hashed, lock = sum(e.size for e in order), [0], threading.Lock()

        def count(n: int) -> None:  # from the worker threads: one event at a time
            with lock:
                hashed[0] += n
                if hashed[0] < total:  # the end (a file grown while hashed too) is the one below
                    reporter.transfer("sha256", hashed[0], total)

        try:
            return self._hash_all(order, count, done)
        finally:
            with lock:
                reporter.transfer("sha256", total, total)

    def _hash_all(
        self,
        order: list[FileEntry],
        count: Callable[[int], None],
        done: Callable[[FileEntry, str | None, str | None], None] | None,
    ) -> dict[str, str | Exception]:
        results: dict[str, str | Exception] = {}

        def one(e: FileEntry) -> None:
            try:
                results[e.name] = self.hash_file(e.path, count)
                if done:
                    done(e, results[e.name], None)
            except OSError as exc:
                results[e.name] = exc
                if done:
                    done(e, None, exc.strerror or str(exc))

        if self.jobs == 1 or len(order) <= 1:
            for e in order:
                one(e)
            return results
        pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="sha256")
        futures = [pool.submit(one, e) for e in order]
        try:
            pending = set(futures)
            while pending:  # a timeout keeps the main thread able to take Ctrl-C
                finished, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
                for f in finished:
                    f.result()
        except BaseException:
            self.stop()
            for f in futures:
                f.cancel()
            raise
        finally:
            pool.shutdown(wait=True)
        return results


@dataclass
class ContentPlan:
    """Which files to hash against which digests (pure: from the inventory and the source)."""

    expected: dict[str, str]
    problems: list[Problem]
    source: str


def _nested_entry(root: Path, name: str) -> FileEntry | str:
    """A file a sums list names below the checkpoint directory (``original/x.safetensors``),
    or why it cannot be hashed."""
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        return "the name is not inside the checkpoint directory"
    p = root / rel
    try:
        st = p.stat()
    except FileNotFoundError:
        return "not in the checkpoint"
    except OSError as exc:
        return f"it cannot be read: {exc.strerror or exc}"
    if not statmod.S_ISREG(st.st_mode):
        return "it is not a regular file"
    return FileEntry(name, p, Path(os.path.realpath(p)), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def content_plan_from_sums(
    inv: Inventory, sums: dict[str, str], source: str, shard_names: Iterable[str]
) -> ContentPlan:
    problems: list[Problem] = []
    expected: dict[str, str] = {}
    for name, digest in sums.items():
        if name not in inv.files and not any(p.file == name for p in inv.problems):
            nested = _nested_entry(inv.root, name)
            if isinstance(nested, str):
                problems.append(Problem(name, f"listed in {source} but {nested}"))
                continue
            inv.files[name] = nested
        if name in inv.files:
            expected[name] = digest
    for name in shard_names:
        if name not in sums and name in inv.files:
            problems.append(Problem(name, f"{source} has no sha256 for this shard"))
    return ContentPlan(expected, problems, source)


def verify_content(
    inv: Inventory,
    plan: ContentPlan,
    *,
    hasher: Sha256Hasher,
    cache: HashCache | None,
    reporter: Reporter = SILENT,
    start: Callable[[int, int], None] | None = None,
    done: Callable[[FileEntry, str | None, str | None], None] | None = None,
) -> tuple[dict[str, Any], list[Problem]]:
    """Hash what the cache does not already know, compare every file with its expected sha256.

    The bytes hashed are a transfer on ``reporter``.  Returns (the report's ``content`` section, problems)."""
    problems = list(plan.problems)
    todo: list[FileEntry] = []
    digests: dict[str, str] = {}
    for name in sorted(plan.expected):
        e = inv.files[name]
        cached = cache.get(e) if cache else None
        if cached:
            digests[name] = cached
        else:
            todo.append(e)
    t0 = time.perf_counter()
    if start:
        start(len(todo), sum(e.size for e in todo))
    lock = threading.Lock()

    def finished(e: FileEntry, digest: str | None, err: str | None) -> None:
        if digest is not None and cache:
            with lock:  # kept even if the run is interrupted later
                cache.put(e, digest)
        if done:
            done(e, digest, err)

    try:
        results = hasher.hash_many(todo, reporter=reporter, done=finished)
    finally:
        if cache:
            cache.save()
    seconds = time.perf_counter() - t0
    for e in todo:
        r = results.get(e.name)
        if isinstance(r, str):
            digests[e.name] = r
        else:
            problems.append(Problem(e.name, f"cannot be read while hashing: {getattr(r, 'strerror', None) or r}"))
    for name, want in sorted(plan.expected.items()):
        got = digests.get(name)
        if got is not None and got != want:
            problems.append(
                Problem(name, f"sha256 {got} does not match {want} from {plan.source}: the file's content is wrong")
            )
    hashed_bytes = sum(e.size for e in todo)
    return {
        "checked": True,
        "source": plan.source,
        "files": len(plan.expected),
        "hashed_files": len(todo),
        "cached_files": len(plan.expected) - len(todo),
        "hashed_bytes": hashed_bytes,
        "seconds": round(seconds, 3),
        "jobs": hasher.jobs,
        "bytes_per_second": int(hashed_bytes / seconds) if seconds > 0 and hashed_bytes else None,
    }, problems
