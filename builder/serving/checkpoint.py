"""Checkpoint readiness: is a downloaded safetensors checkpoint complete and intact?

Two passes over a checkpoint directory, neither of which reads tensor data twice:

* **Structural** (:func:`inspect_checkpoint`, well under a second for any size):
  every ``*.safetensors`` header is read (8-byte little-endian length + that
  many bytes of JSON, per the safetensors format) and validated the way the
  ``safetensors`` library validates it before loading (known dtype, offsets
  starting at 0, contiguous, non-overlapping, each tensor's span equal to
  shape × dtype size, and the file size equal to the header's end), so a
  truncated download is caught by its size alone.  Then the index is matched
  against the headers (every shard present, every tensor where the weight map
  says, none claimed twice), shapes are matched against ``config.json`` where
  that is checkable, and leftovers of an interrupted download are looked for.
  No tensor data is read.

* **Content** (:func:`builder.serving.checkpoint_content.verify_content`): the sha256 of every shard, against a
  sums file or against what a Hugging Face cache records (blobs named by their
  LFS sha256; ``--local-dir`` downloads keep the sha256 in
  ``.cache/huggingface/download/*.metadata``).  Files are hashed in parallel
  by :class:`Sha256Hasher` (the one place file contents are read); a digest
  cache keyed by (real path, size, mtime, inode) means re-verifying after a
  resumed download only re-hashes what changed.

The decisions (header validation, index/config checks, sums parsing, the
verdict) are pure functions over bytes, dicts and file listings; the I/O is in
:func:`read_header`, :func:`scan_directory`, :class:`HashCache` and
:class:`Sha256Hasher`.

Headers are parsed here rather than by the ``safetensors`` package: its
``safe_open`` needs numpy or torch just to open a file, maps the whole file,
and reports problems as one generic message without the tensor or the byte
offsets, while the format itself is an 8-byte length and a JSON object.  The
test suite checks that this parser and the ``safetensors`` library accept and
reject the same files.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat as statmod
import time
from collections import Counter
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple

from builder.errors import BadInput
from builder.serving.modelconfig import text_config
from builder.validate import load_json, read_bounded_text

#: Element size in bits of every dtype the safetensors format defines (the
#: ``Dtype`` enum of safetensors 0.8: 22 variants).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
#: Dtypes whose shape is the logical shape (not bit-packed integers): the ones
#: whose shapes can be compared with config.json.
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64", "F8_E5M2", "F8_E4M3", "F8_E4M3FNUZ", "F8_E5M2FNUZ"}

#: safetensors refuses headers larger than this (``MAX_HEADER_SIZE``).
MAX_HEADER_BYTES = 100_000_000

INDEX_NAME = "model.safetensors.index.json"
SCHEMA = "build-image/checkpoint-verify/v1"

#: Names an interrupted download leaves behind (huggingface_hub: ``*.incomplete``
#: in ``blobs/`` or ``.cache/huggingface/download/``; curl/wget/aria2/browsers:
#: ``*.part``, ``*.partial``, ``*.aria2``, ``*.crdownload``, ``*.tmp`` next to the file).
LEFTOVER_SUFFIXES = (".incomplete", ".part", ".partial", ".aria2", ".crdownload", ".download")


# --------------------------------------------------------------------------- data


class TensorInfo(NamedTuple):
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # data_offsets, relative to the end of the header
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass
class ShardHeader:
    """A parsed and validated safetensors header."""

    file: str
    size: int
    header_len: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_bytes: int  # where the last tensor ends (the data is contiguous from 0)

    @property
    def expected_size(self) -> int:
        return 8 + self.header_len + self.data_bytes


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the checkpoint: the file it is about and what."""

    file: str
    message: str
    severity: str = "error"  # error (not ready) | warning

    def to_dict(self) -> dict[str, str]:
        return {"file": self.file, "message": self.message, "severity": self.severity}


class HeaderError(ValueError):
    """A safetensors header that the format (and the safetensors library) rejects."""


@dataclass
class FileEntry:
    """One regular file of the checkpoint directory, after following symlinks."""

    name: str  # relative to the checkpoint directory
    path: Path  # as listed (may be a symlink)
    real: Path  # the resolved file
    size: int
    mtime_ns: int
    ino: int
    dev: int
    link_target: str | None = None  # the symlink's target, as written


@dataclass
class Inventory:
    """What :func:`scan_directory` found: files, leftovers and unreadable entries."""

    root: Path
    files: dict[str, FileEntry]
    problems: list[Problem]
    leftovers: list[str]
    notes: list[str] = field(default_factory=list)
    hub_repo: Path | None = None  # the ``models--*`` folder when the shards are hub-cache symlinks


# --------------------------------------------------------------------------- headers (pure)


def parse_header(prefix: bytes, file_size: int, name: str, *, check_size: bool = True) -> ShardHeader:
    """Validate a safetensors header from the file's first ``8 + N`` bytes.

    ``prefix`` holds at least the 8-byte length field and, when the file is
    long enough, the N header bytes that follow.  Raises :class:`HeaderError`
    with a one-sentence reason (the caller adds the file name).  With
    ``check_size=False`` a file shorter or longer than its header says is
    accepted (the header of a download still in progress is already whole).
    """
    n, text = _header_text(prefix, file_size)
    doc = _header_json(text, n)
    meta = doc.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise HeaderError("__metadata__ must map names to strings")
    tensors = {tname: _tensor_info(tname, info) for tname, info in doc.items()}
    hdr = ShardHeader(name, file_size, n, tensors, dict(meta), _data_end(tensors))
    if check_size and (why := size_problem(hdr)):
        raise HeaderError(why)
    return hdr


def _header_text(prefix: bytes, file_size: int) -> tuple[int, str]:
    """The header's length field and its text."""
    if file_size < 8 or len(prefix) < 8:
        raise HeaderError(
            f"the file is {file_size} bytes, shorter than the 8-byte header length field (truncated or empty)"
        )
    n = int.from_bytes(prefix[:8], "little")
    if n > MAX_HEADER_BYTES:
        raise HeaderError(
            f"the header length field says {n} bytes, more than safetensors' {MAX_HEADER_BYTES}-byte limit: "
            "the first 8 bytes are not a safetensors length (not a safetensors file, or a corrupt start)"
        )
    if 8 + n > file_size:
        raise HeaderError(
            f"the header length field says {n} bytes but only {file_size - 8} bytes follow it: "
            "the file is truncated inside its header, or is not a safetensors file"
        )
    raw = prefix[8 : 8 + n]
    if len(raw) < n:
        raise HeaderError(f"could read only {len(raw)} of the {n} header bytes")
    try:
        return n, raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(f"the {n}-byte header is not UTF-8 ({exc.reason} at byte {8 + exc.start})") from None


def _unique_pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose names are unique (``object_pairs_hook``)."""
    out = dict(items)
    if len(out) != len(items):
        seen: set[str] = set()
        for k, _ in items:
            if k in seen:
                raise HeaderError(f"the header names {k!r} twice")
            seen.add(k)
    return out


def _header_json(text: str, n: int) -> dict[str, Any]:
    try:
        doc = load_json(text, f"the {n}-byte header", error=HeaderError)
        # A name given twice collapses into one dict entry: fewer tensors than "data_offsets"
        # keys betrays it; only then is the header parsed again, slowly, to name the duplicate.
        if isinstance(doc, dict) and text.count('"data_offsets"') != len(doc) - ("__metadata__" in doc):
            doc = load_json(text, f"the {n}-byte header", error=HeaderError, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as exc:
        raise HeaderError(f"the {n}-byte header is not valid JSON: {exc.msg} at byte {8 + exc.pos}") from None
    if not isinstance(doc, dict):
        raise HeaderError(f"the header is a JSON {type(doc).__name__}, not an object")
    return doc


def _numel(shape: Any) -> int:
    """The number of elements of a shape; -1 when it is not a list of non-negative integers."""
    if type(shape) is not list:
        return -1
    numel = 1
    for dim in shape:  # type() is int: a JSON true/false is not a dimension
        if type(dim) is not int or dim < 0:
            return -1
        numel *= dim
    return numel


def _tensor_info(tname: str, info: Any) -> TensorInfo:
    """One tensor's entry: a known dtype, a shape, and data offsets that span exactly its bytes."""
    if not isinstance(info, dict):
        raise HeaderError(f"tensor {tname!r}: entry is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str):
        raise HeaderError(f"tensor {tname!r}: 'dtype' is missing or not a string")
    if dtype not in DTYPE_BITS:
        raise HeaderError(f"tensor {tname!r}: unknown dtype {dtype!r} (safetensors knows {', '.join(DTYPE_BITS)})")
    numel = _numel(shape)
    if numel < 0:
        raise HeaderError(f"tensor {tname!r}: 'shape' must be a list of non-negative integers, got {shape!r}")
    if (
        type(offsets) is not list
        or len(offsets) != 2
        or type(offsets[0]) is not int
        or type(offsets[1]) is not int
        or offsets[0] < 0
    ):
        raise HeaderError(
            f"tensor {tname!r}: 'data_offsets' must be [begin, end] non-negative integers, got {offsets!r}"
        )
    start, end = offsets
    if end < start:
        raise HeaderError(f"tensor {tname!r}: data_offsets [{start}, {end}] end before they begin")
    bits = numel * DTYPE_BITS[dtype]
    if bits % 8:
        raise HeaderError(f"tensor {tname!r}: {shape} x {dtype} is {bits} bits, not a whole number of bytes")
    if bits // 8 != end - start:
        raise HeaderError(
            f"tensor {tname!r}: shape {shape} x {dtype} needs {bits // 8} bytes but data_offsets "
            f"[{start}, {end}] span {end - start}"
        )
    return TensorInfo(tname, dtype, tuple(shape), start, end)


def _data_end(tensors: dict[str, TensorInfo]) -> int:
    """Where the last tensor ends; the tensors must tile the data from 0 without gaps or overlaps."""
    pos, prev = 0, None
    for t in sorted(tensors.values(), key=itemgetter(3, 4)):
        if t.start < pos:
            raise HeaderError(
                f"tensors {prev.name!r} [{prev.start}, {prev.end}) and {t.name!r} [{t.start}, {t.end}) overlap"
            )
        if t.start > pos:
            after = f"after {prev.name!r} (ends at {pos})" if prev else "at the start of the data"
            raise HeaderError(f"{t.start - pos} bytes {after} belong to no tensor: safetensors data must be contiguous")
        pos, prev = t.end, t
    return pos


def size_problem(hdr: ShardHeader) -> str | None:
    """Why the file's size disagrees with its header's end, or None when it agrees."""
    want, size = hdr.expected_size, hdr.size
    if size < want:
        missing = want - size
        return (
            f"truncated: the file is {size} bytes but its header says {want} "
            f"(8 + {hdr.header_len} header + {hdr.data_bytes} data); {missing} bytes ({100 * missing / want:.1f}%) "
            "are missing: the download did not finish"
        )
    if size > want:
        return (
            f"the file is {size} bytes, {size - want} more than its header accounts for "
            f"({want}): trailing bytes that are no tensor's (a different or appended-to file)"
        )
    return None


def read_header(path: str | os.PathLike, name: str | None = None, *, check_size: bool = True) -> ShardHeader:
    """Read only the length field and the header of ``path`` (never tensor data)."""
    path = Path(path)
    name = name or path.name
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            prefix = fh.read(8)
            if len(prefix) == 8:
                n = int.from_bytes(prefix, "little")
                if n <= MAX_HEADER_BYTES and 8 + n <= size:
                    prefix += fh.read(n)
    except OSError as exc:
        raise HeaderError(f"cannot be read: {exc.strerror or exc}") from None
    return parse_header(prefix, size, name, check_size=check_size)


# --------------------------------------------------------------------------- directory scan (I/O)


def _hub_repo_of(real: Path) -> Path | None:
    """``.../models--org--name`` when ``real`` is ``.../models--org--name/blobs/<hash>``."""
    if real.parent.name == "blobs" and (real.parent.parent / "snapshots").is_dir():
        return real.parent.parent
    return None


def _lock_is_held(path: Path) -> bool:
    """True when another process holds an flock on ``path`` (huggingface_hub's FileLock)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def scan_directory(root: str | os.PathLike) -> Inventory:
    """List the checkpoint's top-level files (following symlinks) and any download leftovers."""
    root = Path(root)
    try:
        st = root.stat()
    except FileNotFoundError:
        raise BadInput(f"checkpoint directory {root} does not exist.") from None
    except OSError as exc:
        raise BadInput(f"checkpoint directory {root}: {exc.strerror or exc}.") from None
    if not statmod.S_ISDIR(st.st_mode):
        raise BadInput(
            f"{root} is not a directory: give the checkpoint directory (the one holding config.json and the "
            "*.safetensors files)."
        )
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise BadInput(f"checkpoint directory {root} cannot be listed: {exc.strerror or exc}.") from None
    files: dict[str, FileEntry] = {}
    problems: list[Problem] = []
    leftovers: list[str] = []
    notes: list[str] = []
    hub_repo: Path | None = None
    for e in entries:
        p = Path(e.path)
        target = None
        if e.is_symlink():
            try:
                target = os.readlink(p)
            except OSError:
                target = "?"
        try:
            s = p.stat()  # follows symlinks
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                problems.append(Problem(e.name, f"symlink loop: {e.name} -> {target} never reaches a file"))
            elif exc.errno == errno.ENOENT and target is not None:
                problems.append(Problem(e.name, f"dangling symlink: {e.name} -> {target} points at nothing"))
            else:
                problems.append(Problem(e.name, f"cannot be read: {exc.strerror or exc}"))
            continue
        if e.name.endswith(LEFTOVER_SUFFIXES):
            leftovers.append(e.name)
            continue
        if statmod.S_ISDIR(s.st_mode):
            continue
        if not statmod.S_ISREG(s.st_mode):
            if e.name.endswith((".safetensors", ".json")):
                problems.append(Problem(e.name, "is not a regular file (a fifo, socket or device)"))
            continue
        real = Path(os.path.realpath(p))
        if not os.access(p, os.R_OK):
            problems.append(Problem(e.name, "cannot be read: permission denied"))
            continue
        files[e.name] = FileEntry(e.name, p, real, s.st_size, s.st_mtime_ns, s.st_ino, s.st_dev, target)
        if target is not None and e.name.endswith(".safetensors"):
            hub_repo = hub_repo or _hub_repo_of(real)
    if hub_repo is not None:
        notes.append(
            f"the shards are links into the Hugging Face cache {hub_repo}: "
            f"--hf-cache {hub_repo} checks each against its LFS sha256"
        )
    _download_leftovers(root, hub_repo, leftovers, notes)
    return Inventory(root, files, problems, leftovers, notes, hub_repo)


def _download_leftovers(root: Path, hub_repo: Path | None, leftovers: list[str], notes: list[str]) -> None:
    """What a download tool left beside the checkpoint: partial files and held locks of
    ``huggingface_hub --local-dir`` and, for shards linked into the hub cache, of that repository."""
    # huggingface_hub --local-dir bookkeeping
    local_meta = root / ".cache" / "huggingface" / "download"
    if local_meta.is_dir():
        for p in sorted(local_meta.rglob("*")):
            rel = f".cache/huggingface/download/{p.relative_to(local_meta)}"
            if p.name.endswith(".incomplete"):
                leftovers.append(rel)
            elif p.name.endswith(".lock") and _lock_is_held(p):
                leftovers.append(f"{rel} (held: a download is running)")
    # hub cache: partial blobs and held locks of this repository
    if hub_repo is not None:
        for p in sorted((hub_repo / "blobs").glob("*.incomplete")):
            leftovers.append(str(p))
        locks = hub_repo.parent / ".locks" / hub_repo.name
        if locks.is_dir():
            held = [p for p in sorted(locks.glob("*.lock")) if _lock_is_held(p)]
            leftovers.extend(f"{p} (held: a download is running)" for p in held)
            if not held and any(locks.glob("*.lock")):
                notes.append(f"{locks}: lock files left by finished downloads (none held): ignored")


# --------------------------------------------------------------------------- config shapes (pure)

_EMBED_RE = re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings|tok_embeddings)\.weight$")
_HEAD_RE = re.compile(r"(^|\.)lm_head\.weight$")
_PLE_RE = re.compile(r"(^|\.)embed_tokens_per_layer(\.shard_\d*)?\.weight$")
_NOT_TEXT_RE = re.compile(r"vision|visual|audio|image|mm_projector|multi_modal")
_SHAPE_SUFFIXES = (
    "embed_tokens.weight",
    "wte.weight",
    "word_embeddings.weight",
    "tok_embeddings.weight",
    "lm_head.weight",
)


def _cfg_int(cfg: dict, key: str) -> int | None:
    v = cfg.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def is_ple_tensor(name: str) -> bool:
    """The per-layer-embedding table (Gemma 3n/4), under any of the names checkpoints use:
    ``embed_tokens_per_layer.weight``, with an empty shard index ``.shard_.weight``, or
    numbered row blocks ``.shard_0.weight`` ..., with or without a model prefix."""
    return bool(_PLE_RE.search(name))


def check_shapes(config: dict, tensors: dict[str, TensorInfo]) -> tuple[list[Problem], list[str]]:
    """Shapes that vLLM's loader will insist on, checked against ``config.json``.

    Returns (problems, notes).  Checked: the token embeddings and the LM head are
    [vocab_size, hidden_size]; the PLE table (all its blocks together) is
    [vocab_size_per_layer_input, num_hidden_layers × hidden_size_per_layer_input];
    an untied model has an LM head.
    """
    cfg, _ = text_config(config)  # a malformed nesting: the top level's shapes are checked
    problems: list[Problem] = []
    notes: list[str] = []
    vocab, hidden = _cfg_int(cfg, "vocab_size"), _cfg_int(cfg, "hidden_size")
    cands = [t for n, t in tensors.items() if n.endswith(_SHAPE_SUFFIXES) and not _NOT_TEXT_RE.search(n)]
    embeds = [t for t in cands if _EMBED_RE.search(t.name)]
    heads = [t for t in cands if _HEAD_RE.search(t.name)]
    checked = 0
    for t in embeds + heads:
        if t.dtype not in FLOAT_DTYPES or len(t.shape) != 2:
            notes.append(
                f"{t.name}: {t.dtype} {list(t.shape)} is packed/quantized: shape not compared with config.json"
            )
            continue
        want = (vocab, hidden)
        for axis, (got, exp, key) in enumerate(zip(t.shape, want, ("vocab_size", "hidden_size"))):
            if exp is not None and got != exp:
                problems.append(
                    Problem(
                        "config.json",
                        (
                            f"tensor {t.name} has shape {list(t.shape)} but config.json says {key} = {exp} "
                            f"(dimension {axis}): vLLM's loader refuses the mismatch"
                        ),
                    )
                )
        checked += 1
    if not embeds:
        notes.append("no token-embedding tensor found: vocabulary/hidden size not checked")
    if cfg.get("tie_word_embeddings") is False and embeds and not heads:
        problems.append(
            Problem("config.json", "tie_word_embeddings is false but no checkpoint tensor is an lm_head.weight")
        )
    checked += _check_ple(cfg, tensors, problems)
    if checked == 0 and embeds:
        notes.append("no shape was checkable against config.json")
    return problems, notes


def _check_ple(cfg: dict, tensors: dict[str, TensorInfo], problems: list[Problem]) -> int:
    """The per-layer-embedding table against ``cfg`` (see :func:`check_shapes`): stored once, 2-D
    blocks of one width, num_hidden_layers x hidden_size_per_layer_input wide, vocab_size_per_layer_input
    rows; a config that declares one and no table.  Returns how many shapes were checked (0 or 1)."""
    ple = [t for n, t in tensors.items() if "embed_tokens_per_layer" in n and is_ple_tensor(n)]
    if ple:
        rows = sum(t.shape[0] for t in ple if t.shape)
        cols = {t.shape[1] for t in ple if len(t.shape) == 2}
        plain = [t.name for t in ple if not re.search(r"\.shard_\d*\.weight$", t.name)]
        empty = [t.name for t in ple if t.name.endswith(".shard_.weight")]
        if len(plain) + len(empty) > 1 or ((plain or empty) and len(ple) > len(plain) + len(empty)):
            problems.append(
                Problem(
                    "config.json",
                    f"the per-layer-embedding table is stored more than once: {', '.join(sorted(t.name for t in ple))}",
                )
            )
        n_layers, per_layer = _cfg_int(cfg, "num_hidden_layers"), _cfg_int(cfg, "hidden_size_per_layer_input")
        v_ple = _cfg_int(cfg, "vocab_size_per_layer_input")
        if len(cols) != 1 or any(len(t.shape) != 2 for t in ple):
            problems.append(
                Problem(
                    "config.json",
                    f"per-layer-embedding blocks are not all 2-D with one width: {[list(t.shape) for t in ple]}",
                )
            )
        else:
            width = cols.pop()
            if n_layers and per_layer and width != n_layers * per_layer:
                problems.append(
                    Problem(
                        "config.json",
                        (
                            f"per-layer-embedding table is {rows} x {width} but config.json needs width "
                            "num_hidden_layers x "
                            f"hidden_size_per_layer_input = {n_layers} x {per_layer} = {n_layers * per_layer}"
                        ),
                    )
                )
            if v_ple and rows != v_ple:
                problems.append(
                    Problem(
                        "config.json",
                        (
                            f"per-layer-embedding table has {rows} rows ({len(ple)} block(s)) but config.json says "
                            f"vocab_size_per_layer_input = {v_ple}"
                        ),
                    )
                )
            return 1
    elif _cfg_int(cfg, "hidden_size_per_layer_input"):
        problems.append(
            Problem(
                "config.json",
                (
                    "config.json declares per-layer embeddings (hidden_size_per_layer_input) but no tensor is an "
                    "embed_tokens_per_layer table (plain, .shard_ or numbered .shard_N name)"
                ),
            )
        )
    return 0


# --------------------------------------------------------------------------- index (pure)


def check_index(
    index: dict | None, index_name: str | None, headers: dict[str, ShardHeader], present: set[str]
) -> tuple[list[Problem], list[str]]:
    """Index ↔ files.  Returns (problems, loaded shard names: what vLLM would read)."""
    problems: list[Problem] = []
    owners: dict[str, list[str]] = {}
    for fname, hdr in headers.items():
        for t in hdr.tensors:
            owners.setdefault(t, []).append(fname)
    if index is None:
        loaded = sorted(n for n in present if n.endswith(".safetensors"))
    else:
        wm = index.get("weight_map")
        if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
            return [Problem(index_name, "'weight_map' is missing or does not map tensor names to file names")], []
        named = set(wm.values())
        loaded = sorted(named)
        per_shard = Counter(wm.values())
        for shard in loaded:
            if shard not in present:
                n = per_shard[shard]
                problems.append(
                    Problem(shard, f"missing: {index_name} names it for {n} tensor(s) but the file is not there")
                )
        for tname, shard in wm.items():
            if shard not in headers:
                continue  # missing or unreadable shard: already reported
            if tname not in headers[shard].tensors:
                where = [f for f in owners.get(tname, []) if f != shard]
                also = f"; it is in {', '.join(where)}" if where else ""
                problems.append(
                    Problem(
                        shard, f"tensor {tname!r}: {index_name} puts it in {shard}, whose header does not have it{also}"
                    )
                )
        for fname in sorted(present):
            if fname.endswith(".safetensors") and fname not in named:
                problems.append(
                    Problem(fname, f"not in {index_name}: vLLM will not load it (a stray or renamed shard?)", "warning")
                )
        for fname in loaded:
            hdr = headers.get(fname)
            if hdr is None:
                continue
            stray = sorted(t for t in hdr.tensors if t not in wm)
            if stray:
                more = f" and {len(stray) - 3} more" if len(stray) > 3 else ""
                problems.append(
                    Problem(
                        fname,
                        f"{len(stray)} tensor(s) the weight map does not list: {', '.join(stray[:3])}{more}",
                        "warning",
                    )
                )
    loaded_set = set(loaded)
    for tname, files in sorted((k, v) for k, v in owners.items() if len(v) > 1):
        in_loaded = [f for f in files if f in loaded_set]
        if len(in_loaded) > 1:
            problems.append(Problem(in_loaded[1], f"tensor {tname!r} is claimed twice: in {' and '.join(in_loaded)}"))
    return problems, loaded


# --------------------------------------------------------------------------- the structural report


@dataclass
class Report:
    directory: str
    problems: list[Problem]
    shards: list[dict[str, Any]]
    index: str | None
    index_total_size: int | None
    weight_bytes: int
    file_bytes: int
    bytes_by_dtype: dict[str, int]
    ple_bytes: int
    ple_tensors: list[str]
    tensors: int
    leftovers: list[str]
    notes: list[str]
    structural_seconds: float
    headers_complete: bool = True  # every shard vLLM would load has a readable header
    content: dict[str, Any] = field(default_factory=lambda: {"checked": False})

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    def ready(self, *, strict: bool = False) -> bool:
        return not self.errors and not (strict and self.warnings)

    def to_dict(self, *, strict: bool = False) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "directory": self.directory,
            "ready": self.ready(strict=strict),
            "verdict": "READY" if self.ready(strict=strict) else "NOT READY",
            "errors": [p.to_dict() for p in self.errors],
            "warnings": [p.to_dict() for p in self.warnings],
            "shards": self.shards,
            "index": self.index,
            "index_total_size": self.index_total_size,
            "weight_bytes": self.weight_bytes,
            "file_bytes": self.file_bytes,
            "bytes_by_dtype": self.bytes_by_dtype,
            "ple_bytes": self.ple_bytes,
            "ple_tensors": self.ple_tensors,
            "tensors": self.tensors,
            "headers_complete": self.headers_complete,
            "leftovers": self.leftovers,
            "notes": self.notes,
            "structural_seconds": round(self.structural_seconds, 4),
            "content": self.content,
        }


def _load_json(entry: FileEntry | None, name: str, problems: list[Problem]) -> Any:
    if entry is None:
        return None
    try:
        return load_json(read_bounded_text(entry.path, name), name)
    except BadInput as exc:  # unreadable, not a regular file, too large, not UTF-8, nested too deep
        problems.append(Problem(name, exc.message.removeprefix(f"{name} {entry.path}: ").removeprefix(f"{name} ")))
    except json.JSONDecodeError as exc:
        where = f" (line {exc.lineno}, column {exc.colno}: {exc.msg})" if isinstance(exc, json.JSONDecodeError) else ""
        problems.append(Problem(name, f"is not valid JSON{where}"))
    return None


def inspect_checkpoint(root: str | os.PathLike, inventory: Inventory | None = None) -> Report:
    """The structural pass: headers, index, config shapes, leftovers.  Reads no tensor data."""
    t0 = time.perf_counter()
    inv = inventory or scan_directory(root)
    problems = list(inv.problems)
    notes = list(inv.notes)
    for name in inv.leftovers:
        problems.append(Problem(name, "left by an interrupted or running download: the checkpoint is not complete"))
    index_name, index = _read_index(inv, problems, notes)
    unreadable = {p.file for p in inv.problems}
    shard_names = sorted(n for n in inv.files if n.endswith(".safetensors"))
    if not shard_names and not unreadable:
        problems.append(Problem(str(inv.root), "no *.safetensors files: nothing vLLM's safetensors loader could load"))
    headers = _read_headers(inv, shard_names, problems)
    if index_name is not None and index is None:  # the index failed: every shard whose header reads is loaded
        loaded = [n for n in shard_names if n in headers]
    else:
        idx_problems, loaded = check_index(index, index_name, headers, set(inv.files) | unreadable)
        problems += idx_problems
    total_size = _index_total_size(index)
    tensors, by_dtype = _loaded_tensors(loaded, headers)
    weight_bytes = sum(by_dtype.values())
    if total_size is not None and not problems and total_size != weight_bytes:
        problems.append(
            Problem(
                index_name,
                (
                    f"metadata.total_size is {total_size} but the shards' tensors add up to {weight_bytes} bytes "
                    "(the index was written for other shards, or tied weights are counted differently)"
                ),
                "warning",
            )
        )
    _check_config(inv, tensors, unreadable, problems, notes)
    ple = sorted(n for n in tensors if "embed_tokens_per_layer" in n and is_ple_tensor(n))
    return Report(
        directory=str(inv.root),
        problems=problems,
        shards=_shard_rows(inv, shard_names, headers, loaded),
        index=index_name,
        index_total_size=total_size,
        weight_bytes=weight_bytes,
        file_bytes=sum(inv.files[n].size for n in shard_names),
        bytes_by_dtype=dict(sorted(by_dtype.items(), key=lambda kv: -kv[1])),
        ple_bytes=sum(tensors[n].nbytes for n in ple),
        ple_tensors=ple,
        tensors=len(tensors),
        leftovers=list(inv.leftovers),
        notes=notes,
        structural_seconds=time.perf_counter() - t0,
        headers_complete=bool(loaded) and all(n in headers for n in loaded),
    )


def _read_index(inv: Inventory, problems: list[Problem], notes: list[str]) -> tuple[str | None, Any]:
    """The index's name (the standard one when there are several) and its JSON object (None when
    there is none, or it cannot be read)."""
    indexes = sorted(n for n in inv.files if n.endswith(".safetensors.index.json"))
    index_name = INDEX_NAME if INDEX_NAME in indexes else (indexes[0] if indexes else None)
    if len(indexes) > 1:
        notes.append(f"several indexes ({', '.join(indexes)}): using {index_name}")
    index = _load_json(inv.files.get(index_name) if index_name else None, index_name or "", problems)
    if index_name and index is not None and not isinstance(index, dict):
        problems.append(Problem(index_name, "is not a JSON object"))
        index = None
    return index_name, index


def _read_headers(inv: Inventory, shard_names: list[str], problems: list[Problem]) -> dict[str, ShardHeader]:
    headers: dict[str, ShardHeader] = {}
    for name in shard_names:
        try:
            headers[name] = hdr = read_header(inv.files[name].path, name, check_size=False)
        except HeaderError as exc:
            problems.append(Problem(name, str(exc)))
            continue
        if why := size_problem(hdr):  # the header itself is whole: keep it for the index checks and totals
            problems.append(Problem(name, why))
    return headers


def _index_total_size(index: Any) -> int | None:
    if isinstance(index, dict):
        meta = index.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("total_size"), int):
            return meta["total_size"]
    return None


def _loaded_tensors(loaded: list[str], headers: dict[str, ShardHeader]) -> tuple[dict[str, TensorInfo], dict[str, int]]:
    """The tensors of the loaded shards (the first shard naming one wins) and their bytes by dtype."""
    tensors: dict[str, TensorInfo] = {}
    by_dtype: dict[str, int] = {}
    for name in loaded:
        hdr = headers.get(name)
        if hdr is None:
            continue
        for t in hdr.tensors.values():
            if t.name in tensors:
                continue
            tensors[t.name] = t
            by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
    return tensors, by_dtype


def _check_config(
    inv: Inventory, tensors: dict[str, TensorInfo], unreadable: set[str], problems: list[Problem], notes: list[str]
) -> None:
    """config.json is there, is an object, and its shapes agree with the tensors."""
    config = _load_json(inv.files.get("config.json"), "config.json", problems)
    if "config.json" not in inv.files and "config.json" not in unreadable:
        problems.append(Problem("config.json", "missing: vLLM needs config.json next to the weights"))
    elif isinstance(config, dict) and tensors:
        shape_problems, shape_notes = check_shapes(config, tensors)
        problems += shape_problems
        notes += shape_notes
    elif config is not None and not isinstance(config, dict):
        problems.append(Problem("config.json", "is not a JSON object"))


def _shard_rows(
    inv: Inventory, shard_names: list[str], headers: dict[str, ShardHeader], loaded: list[str]
) -> list[dict[str, Any]]:
    return [
        {
            "file": n,
            "size": inv.files[n].size,
            "expected_size": headers[n].expected_size if n in headers else None,
            "tensors": len(headers[n].tensors) if n in headers else None,
            "header_ok": n in headers,
            "complete": n in headers and headers[n].size == headers[n].expected_size,
            "loaded": n in loaded,
        }
        for n in shard_names
    ]


def safetensors_expected(model_dir: str | os.PathLike) -> bool:
    """Whether ``model_dir`` is a safetensors checkpoint to check: it has ``*.safetensors``
    files, or an index whose weight map names some (all of them possibly still missing).
    A checkpoint in another format (``*.bin``, GGUF) is not judged here."""
    d = Path(model_dir)
    if any(d.glob("*.safetensors")):
        return True
    for idx in d.glob("*.safetensors.index.json"):
        try:
            wm = load_json(read_bounded_text(idx, "index"), str(idx)).get("weight_map")
        except (BadInput, ValueError, AttributeError):
            return True  # a broken index: let the check report it
        if isinstance(wm, dict) and wm:
            return True
    return False


@dataclass(frozen=True)
class WeightSize:
    bytes: int
    source: str
    notes: tuple[str, ...] = ()


def weight_size(model_dir: str | os.PathLike) -> WeightSize | None:
    """The checkpoint's weight bytes for the memory plan, from the safetensors headers.

    Exact (the sum of the tensors vLLM would load) whenever every shard's header
    is on disk, also while a download is still filling the shards (a header is
    whole before any tensor data arrives).  Shards absent altogether: the index's
    ``metadata.total_size``.  ``None`` when there are no safetensors files.
    A header that cannot be parsed or an index that is not JSON is bad input.
    """
    inv = scan_directory(model_dir)
    problems: list[Problem] = []
    indexes = sorted(n for n in inv.files if n.endswith(".safetensors.index.json"))
    index_name = INDEX_NAME if INDEX_NAME in indexes else (indexes[0] if indexes else None)
    index = _load_json(inv.files.get(index_name) if index_name else None, index_name or "", problems)
    if problems or (index_name and not isinstance(index, dict)):
        why = problems[0].message if problems else "is not a JSON object"
        raise BadInput(f"checkpoint index {Path(model_dir) / index_name} {why}.")
    wm = index.get("weight_map") if isinstance(index, dict) else None
    names = (
        sorted(set(wm.values())) if isinstance(wm, dict) else sorted(n for n in inv.files if n.endswith(".safetensors"))
    )
    meta = index.get("metadata") if isinstance(index, dict) else None
    size = meta.get("total_size") if isinstance(meta, dict) else None
    size = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
    if not names:
        return None if size is None else WeightSize(size, f"{index_name} metadata.total_size (it lists no shards)")
    present = [n for n in names if n in inv.files]
    seen: set[str] = set()
    total, on_disk, expected = 0, 0, 0
    for n in present:
        try:
            hdr = read_header(inv.files[n].path, n, check_size=False)
        except HeaderError as exc:
            raise BadInput(
                f"checkpoint shard {Path(model_dir) / n}: {exc}.", hint=f"build-image checkpoint verify {model_dir}"
            ) from None
        for t in hdr.tensors.values():
            if t.name not in seen:
                seen.add(t.name)
                total += t.nbytes
        on_disk += hdr.size
        expected += hdr.expected_size
    notes: list[str] = []
    missing = [n for n in names if n not in inv.files]
    if missing:
        if size is None:
            raise BadInput(
                f"checkpoint {model_dir}: shard(s) {', '.join(missing[:3])} missing and {index_name} has no "
                "metadata.total_size: the weight size is unknown; pass --weights-bytes."
            )
        notes.append(
            f"{len(missing)} shard(s) not on disk yet ({', '.join(missing[:3])}): weights sized from "
            f"{index_name} metadata.total_size"
        )
        return WeightSize(size, f"{index_name} metadata.total_size", tuple(notes))
    if on_disk != expected:
        notes.append(
            f"the checkpoint is not complete ({on_disk} of {expected} bytes on disk): sized from its headers; "
            f"`build-image checkpoint verify {model_dir}` says when it is ready"
        )
    return WeightSize(total, f"safetensors headers ({len(present)} shard(s), {len(seen)} tensors)", tuple(notes))


# --------------------------------------------------------------------------- text


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 10**7 else f"{n} B"


#: The text report lists at most this many errors and this many warnings, then "… and K more" (--json: all).
MAX_LISTED_PROBLEMS = 20


def bounded_lines(items: list[str], limit: int = MAX_LISTED_PROBLEMS, what: str = "problem(s)") -> list[str]:
    """Pure: the first ``limit`` of ``items``, then one line saying how many more there are (--json has them all)."""
    if len(items) <= limit:
        return list(items)
    return items[:limit] + [f"  … and {len(items) - limit} more {what} (--json lists every one)"]


def _short(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters; --json has it whole)"


def render_text(rep: Report, *, strict: bool = False) -> str:
    ready = rep.ready(strict=strict)
    lines = [f"{'READY' if ready else 'NOT READY'}: {rep.directory}"]
    lines += bounded_lines([f"  error   {p.file}: {_short(p.message)}" for p in rep.errors], what="error(s)")
    lines += bounded_lines([f"  warning {p.file}: {_short(p.message)}" for p in rep.warnings], what="warning(s)")
    loaded = sum(1 for s in rep.shards if s["loaded"])
    lines.append(
        f"  shards: {len(rep.shards)} ({loaded} "
        f"loaded{', index ' + rep.index if rep.index else ', no index'}), "
        f"{rep.tensors} tensors, files {_gb(rep.file_bytes)}"
    )
    what = "exact, from the headers" if rep.headers_complete else "only the shards whose header could be read"
    lines.append(f"  weight bytes ({what}): {rep.weight_bytes}  ({_gb(rep.weight_bytes)})")
    if rep.bytes_by_dtype:
        lines.append("  by dtype: " + ", ".join(f"{d} {_gb(b)}" for d, b in rep.bytes_by_dtype.items()))
    if rep.ple_tensors:
        lines.append(
            f"  per-layer-embedding table: {rep.ple_bytes} bytes ({_gb(rep.ple_bytes)}) in "
            f"{len(rep.ple_tensors)} tensor(s): what --cpu-offload-gb would have to move"
        )
    c = rep.content
    if c.get("checked"):
        rate = f", {c['bytes_per_second'] / 1e6:.0f} MB/s" if c.get("bytes_per_second") else ""
        lines.append(
            f"  content: sha256 of {c['files']} file(s) against {c['source']}: {c['hashed_files']} hashed "
            f"({_gb(c['hashed_bytes'])} in {c['seconds']:.1f} s{rate}, {c['jobs']} job(s)), "
            f"{c['cached_files']} unchanged since "
            "last verified (cache)"
        )
    elif c.get("skipped"):
        lines.append(f"  content: not hashed: {c['skipped']}")
    else:
        lines.append(
            "  content: not hashed (give --sha256 SUMS or --hf-cache DIR to prove the bytes, not just the sizes)"
        )
    for n in rep.notes:
        lines.append(f"  note: {n}")
    lines.append(f"  structural pass: {rep.structural_seconds * 1000:.0f} ms")
    return "\n".join(lines)
