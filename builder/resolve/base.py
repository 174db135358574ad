"""Base manifest stage: read what a base already holds, with binary facts.

Three layers, each usable on its own:

* the **binary scanner** — :func:`scan_files`, :func:`scan_wheel`,
  :func:`scan_site_packages` — reads facts from files (ELF version-needed
  sections through pyelftools, numpy C-API module strings, extension suffixes,
  wheel tags), never from package names;
* the **snapshot** — :func:`snapshot_site_packages` and :func:`snapshot_image` —
  turns a site-packages directory or a local container image into a
  :class:`builder.resolve.manifest.BaseManifest`;
* a tiny **docker-CLI adapter** (:func:`_docker`) through which every engine
  call goes; it never pulls.

Facts per distribution (see :class:`builder.resolve.manifest.DistFacts`):

``binary``      the distribution ships at least one ELF file;
``extensions``  number of ELF shared objects (``*.so`` / ``*.so.N``);
``numpy_abi``   per shared object, which numpy C-API generation it imports:
                bytes contain ``numpy._core._multiarray_umath`` -> ``"2"``
                (numpy>=2 headers; they also carry the 1.x name as a fallback),
                only ``numpy.core._multiarray_umath`` -> ``"1"``.  numpy's own
                files are never counted;
``glibc``       highest ``GLIBC_x.y`` in the ELF ``.gnu.version_r`` sections,
                compared as versions (``2.9 < 2.17``);
``python_abi``  the wheel's ABI tag (``cp312``, ``abi3``), unless its extension
                modules contradict it or it says ``none``: then the module
                suffixes (``.cpython-312-...so`` -> ``cp312``; several versions ->
                ``cp311.cp312``, any one suffices; ``.abi3.so`` -> ``abi3``).
"""

from __future__ import annotations

import mmap
import os
import re
import shutil
import stat
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath
from typing import IO

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection
from packaging.version import Version

from builder import __version__, values
from builder import engine as engine_adapter
from builder.errors import BadInput, EngineUnavailable, ExternalToolError
from builder.resolve.floor import checker, consistency_tool, native_digest
from builder.resolve.manifest import BaseManifest, DistFacts, Distribution, parse_manifest
from builder.util import atomic_write_text, cache_dir, canonical_name, sha256_bytes
from builder.validate import read_bounded

ELF_MAGIC = b"\x7fELF"
NUMPY2_MARKER = b"numpy._core._multiarray_umath"
NUMPY1_MARKER = b"numpy.core._multiarray_umath"

_SO_NAME = re.compile(r"\.so(\.\d+)*$")
_GLIBC_VER = re.compile(r"^GLIBC_(\d+(?:\.\d+)+)$")
_CPYTHON_SUFFIX = re.compile(r"\.cpython-(\d)(\d+)[a-z]*-[^.]*\.so$")
_ABI3_SUFFIX = re.compile(r"\.abi3\.so$")
# Files that are never ELF: skip even opening them (site-packages hold ~10^5 files).
_TEXT_SUFFIXES = frozenset(
    ".py .pyc .pyi .pyx .pxd .txt .md .rst .json .toml .yaml .yml .cfg .ini .h .hpp .cuh .cu "
    ".c .cc .cpp .typed .html .js .css .csv .jinja .j2 .pem .lock .sh .bat .ps1 .svg .png .jpg".split()
)


# --------------------------------------------------------------------------- ELF facts


@dataclass
class _FileFacts:
    is_elf: bool = False
    is_shared_object: bool = False
    glibc: Version | None = None
    numpy_gen: str | None = None  # "1" | "2" | None


def _numpy_generation(buf) -> str | None:
    """``buf`` supports ``.find`` (bytes or mmap)."""
    if buf.find(NUMPY2_MARKER) != -1:
        return "2"
    if buf.find(NUMPY1_MARKER) != -1:
        return "1"
    return None


def _elf_glibc(stream: IO[bytes]) -> Version | None:
    """Highest GLIBC_x.y named in the ELF version-needed sections (None if none)."""
    best: Version | None = None
    elf = ELFFile(stream)
    for section in elf.iter_sections():
        if not isinstance(section, GNUVerNeedSection):
            continue
        for _verneed, aux_iter in section.iter_versions():
            for aux in aux_iter:
                m = _GLIBC_VER.match(aux.name)
                if not m:
                    continue
                v = Version(m.group(1))
                if best is None or v > best:
                    best = v
    return best


_SHT_GNU_VERNEED = 0x6FFFFFFE
_RODATA = (b".rodata", b".lrodata")


class _NotParsed(Exception):
    """The fast reader met a layout it does not handle; pyelftools reads the file instead."""


def _elf_fast(mm, *, want_numpy: bool) -> tuple[Version | None, str | None]:
    """(highest GLIBC_x.y in ``.gnu.version_r``, numpy C-API generation) of an ELF image in ``mm``.

    Reads only the section headers, the version-needed section and its string table, and searches
    the numpy module names only inside the read-only data sections (``.rodata*``, where the string
    literals of numpy's ``_import_array`` live) — not through code or CUDA fat binaries, which are
    most of a large library's bytes.  Raises :class:`_NotParsed` on anything unexpected."""
    import struct

    try:
        cls, data = mm[4], mm[5]
        if cls not in (1, 2) or data not in (1, 2):
            raise _NotParsed
        e = "<" if data == 1 else ">"
        if cls == 2:
            shoff, = struct.unpack_from(e + "Q", mm, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", mm, 0x3A)
            sh_fmt, sh_size = e + "IIQQQQIIQQ", 64
        else:
            shoff, = struct.unpack_from(e + "I", mm, 0x20)
            shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", mm, 0x2E)
            sh_fmt, sh_size = e + "IIIIIIIIII", 40
        if shoff == 0:  # no section headers: search the whole file, no glibc fact
            return None, (_numpy_generation(mm) if want_numpy else None)
        if shentsize != sh_size:
            raise _NotParsed
        first = struct.unpack_from(sh_fmt, mm, shoff)
        if shnum == 0:
            shnum = first[5]
        if shstrndx == 0xFFFF:
            shstrndx = first[6]
        secs = [struct.unpack_from(sh_fmt, mm, shoff + i * sh_size) for i in range(shnum)]
        names_off = secs[shstrndx][4]

        def sec_name(sec) -> bytes:
            start = names_off + sec[0]
            return mm[start:mm.find(b"\0", start)]

        best: Version | None = None
        for sec in secs:
            if sec[1] != _SHT_GNU_VERNEED:
                continue
            str_off = secs[sec[6]][4]
            off, count = sec[4], sec[7]
            for _ in range(count):
                _ver, cnt, _file, aux, nxt = struct.unpack_from(e + "HHIII", mm, off)
                a = off + aux
                for _ in range(cnt):
                    _hash, _flags, _other, name, anext = struct.unpack_from(e + "IHHII", mm, a)
                    start = str_off + name
                    m = _GLIBC_VER.match(mm[start:mm.find(b"\0", start)].decode("ascii", "replace"))
                    if m:
                        v = Version(m.group(1))
                        if best is None or v > best:
                            best = v
                    if not anext:
                        break
                    a += anext
                if not nxt:
                    break
                off += nxt
        gen = None
        if want_numpy:
            ranges = [(sec[4], sec[4] + sec[5]) for sec in secs if sec[1] != 8 and sec_name(sec).startswith(_RODATA)]
            if not ranges:  # unusual layout: the whole file
                gen = _numpy_generation(mm)
            elif any(mm.find(NUMPY2_MARKER, lo, hi) != -1 for lo, hi in ranges):
                gen = "2"
            elif any(mm.find(NUMPY1_MARKER, lo, hi) != -1 for lo, hi in ranges):
                gen = "1"
        return best, gen
    except (struct.error, IndexError, ValueError) as exc:
        raise _NotParsed from exc


def _scan_elf_file(path, *, want_numpy: bool) -> _FileFacts:
    with open(path, "rb") as fh:
        if fh.read(4) != ELF_MAGIC:
            return _FileFacts()
        facts = _FileFacts(is_elf=True, is_shared_object=bool(_SO_NAME.search(os.path.basename(path))))
        want = want_numpy and facts.is_shared_object
        size = os.fstat(fh.fileno()).st_size
        try:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                facts.glibc, facts.numpy_gen = _elf_fast(mm, want_numpy=want)
            return facts
        except (_NotParsed, ValueError, OSError):
            pass
        try:  # the reference reader, for layouts the fast one does not handle
            fh.seek(0)
            facts.glibc = _elf_glibc(fh)
        # noqa: BLE001 - truncated/odd ELF (pyelftools raises several kinds): still binary, no glibc fact
        except Exception:
            facts.glibc = None
        if want and size:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                facts.numpy_gen = _numpy_generation(mm)
    return facts


def _python_abi_from_suffixes(names: Iterable[str]) -> str | None:
    cp: set[str] = set()
    abi3 = False
    for n in names:
        m = _CPYTHON_SUFFIX.search(n)
        if m:
            cp.add(f"cp{m.group(1)}{m.group(2)}")
        elif _ABI3_SUFFIX.search(n):
            abi3 = True
    if cp:
        return ".".join(sorted(cp, key=lambda t: int(t[2:])))
    return "abi3" if abi3 else None


def python_abi_from_tags(tags: Iterable[str]) -> str | None:
    """ABI from wheel tags (``cp312-cp312-manylinux_2_17_x86_64`` -> ``cp312``).

    Compressed tag sets (``cp312.cp313``) and several ``Tag:`` lines are merged;
    ``none`` only when nothing more specific is present.
    """
    abis: set[str] = set()
    for tag in tags:
        parts = tag.strip().split("-")
        if len(parts) != 3:
            continue
        abis.update(a for a in parts[1].split(".") if a)
    specific = sorted(a for a in abis if a != "none")
    if specific:
        return ".".join(specific)
    return "none" if abis else None


def _decide_python_abi(tag_abi: str | None, suffix_abi: str | None) -> str:
    """The wheel tag's ABI, unless the extension modules contradict it.

    ``suffix_abi``: ``cpXY[.cpZW...]`` (version-specific modules: the wheel loads on
    any of them), ``abi3`` or None.  A specific tag stands when no version-specific
    module exists, when it is ``abi3`` (such wheels may add per-version modules),
    or when the modules include its version; a ``none``/absent tag or a tag the
    modules contradict (tag cp312, only a ``.cpython-39`` module) yields the modules'
    set.  ``none`` when there is no evidence at all.
    """
    suffix_cp = {t for t in (suffix_abi or "").split(".") if t.startswith("cp")}
    if tag_abi and tag_abi != "none":
        tag_cp = {t for t in tag_abi.split(".") if t.startswith("cp")}
        if not suffix_cp or "abi3" in tag_abi.split(".") or tag_cp & suffix_cp:
            return tag_abi
    return suffix_abi or tag_abi or "none"


def _might_be_elf(name: str) -> bool:
    dot = name.rfind(".")
    return dot <= 0 or name[dot:].lower() not in _TEXT_SUFFIXES


def scan_files(
    paths: Iterable[Path],
    *,
    is_numpy: bool = False,
    wheel_tags: Iterable[str] | None = None,
) -> DistFacts:
    """Binary facts of one distribution from its files on disk.

    ``is_numpy``: the files are numpy's own (its extensions are not counted as
    built against a numpy generation).  ``wheel_tags``: the ``Tag:`` values of
    its WHEEL file, the preferred source of the Python ABI.
    """
    facts = DistFacts()
    best_glibc: Version | None = None
    so_names: list[str] = []
    for p in paths:
        p = os.fspath(p)
        name = os.path.basename(p)
        if not _might_be_elf(name):
            continue
        try:
            ff = _scan_elf_file(p, want_numpy=not is_numpy)
        except (IsADirectoryError, FileNotFoundError, PermissionError):
            continue
        except OSError:
            continue
        if not ff.is_elf:
            continue
        facts.binary = True
        if ff.is_shared_object:
            facts.extensions += 1
            so_names.append(name)
        if ff.numpy_gen:
            facts.numpy_abi[ff.numpy_gen] += 1
        if ff.glibc is not None and (best_glibc is None or ff.glibc > best_glibc):
            best_glibc = ff.glibc
    facts.glibc = str(best_glibc) if best_glibc is not None else None
    facts.python_abi = _decide_python_abi(
        python_abi_from_tags(wheel_tags) if wheel_tags is not None else None,
        _python_abi_from_suffixes(so_names),
    )
    return facts


# --------------------------------------------------------------------------- wheels


_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?"
                         r"-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


def _parse_metadata(text: str) -> tuple[str | None, str | None]:
    msg = HeaderParser().parsestr(text, headersonly=True)
    return msg.get("Name"), msg.get("Version")


def scan_wheel(path: Path) -> tuple[str, str, DistFacts]:
    """``(name, version, facts)`` of a ``.whl`` file, read without installing.

    Members that may be ELF are streamed into a private temp dir (never all in
    memory: torch's libraries are GB-sized) and scanned there.
    """
    path = Path(path)
    m = _WHEEL_NAME.match(path.name)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise BadInput(f"wheel {path} cannot be read as a zip archive: {exc}.") from None
    with zf, tempfile.TemporaryDirectory(prefix="bi-wheel-") as tmp:
        infos = zf.infolist()
        dist_info = [i for i in infos if re.match(r"^[^/]+\.dist-info/(METADATA|WHEEL)$", i.filename)]
        name = version = None
        tags: list[str] = []
        for i in dist_info:
            text = zf.read(i).decode("utf-8", "replace")
            if i.filename.endswith("/METADATA"):
                name, version = _parse_metadata(text)
            else:
                tags = [v for v in HeaderParser().parsestr(text).get_all("Tag") or []]
        if not name or not version:
            if not m:
                raise BadInput(f"wheel {path}: no .dist-info/METADATA with Name and Version, and the file name is not "
                               "a wheel name.")
            name, version = name or m["name"], version or m["version"]
        if not tags and m:
            tags = [f"{py}-{m['abi']}-{m['plat']}" for py in m["py"].split(".")]
        extracted: list[Path] = []
        for idx, info in enumerate(infos):
            if info.is_dir() or not _might_be_elf(info.filename):
                continue
            with zf.open(info) as src:
                head = src.read(4)
                if head != ELF_MAGIC:
                    continue
                # keep the basename (suffix decides shared-object / ABI facts)
                dst = Path(tmp) / f"{idx}" / PurePosixPath(info.filename).name
                dst.parent.mkdir()
                with open(dst, "wb") as out:
                    out.write(head)
                    shutil.copyfileobj(src, out, 1 << 20)
            extracted.append(dst)
        facts = scan_files(extracted, is_numpy=canonical_name(name) == "numpy", wheel_tags=tags)
    return name, version, facts


# --------------------------------------------------------------------------- site-packages


#: the longest RECORD / installed-files.txt line the scanner reads (a real one is a path, a hash and a size);
#: a longer line is named in a warning and skipped
MAX_LIST_LINE = 4096
#: the largest METADATA, PKG-INFO, WHEEL, RECORD or installed-files.txt the scanner reads
MAX_DIST_FILE = 16 << 20


def _warn_stderr(message: str) -> None:
    import sys

    sys.stderr.write(f"warning: {message}\n")


def scan_root(site_packages: Path) -> Path:
    """The tree a scan may read files in: the installation prefix of ``<prefix>/lib/pythonX.Y/site-packages``
    (RECORD lists the console scripts and binaries in ``<prefix>/bin``, ``../../../bin/uv``), else the
    site-packages directory itself."""
    sp = Path(os.path.abspath(site_packages))
    if (sp.name in ("site-packages", "dist-packages") and re.fullmatch(r"python\d+(?:\.\d+)?", sp.parent.name)
            and sp.parent.parent.name in ("lib", "lib64")):
        return sp.parent.parent.parent
    return sp


def _read_listing(path: Path, what: str) -> str:
    """A file of a distribution's metadata, through the bounded reader: a FIFO, device, directory or a file
    over :data:`MAX_DIST_FILE` is BadInput naming it, an unreadable one too (never a hang or a crash)."""
    data = read_bounded(path, what, max_bytes=MAX_DIST_FILE)
    return data.decode("utf-8", errors="replace")


def _confined(root: str, base: str, rel: str) -> tuple[str | None, str | None]:
    """(``base/rel`` normalised, None) when it stays inside ``root`` and is a regular file there; else (None,
    why): ``"outside"`` (out of the tree), ``"special"`` (a symlink, FIFO, device or directory: never opened),
    or None (not there: a ``.pyc`` never compiled).  Never follows a link, never opens anything."""
    full = os.path.normpath(os.path.join(os.path.abspath(base), rel))
    if not full.startswith(root.rstrip(os.sep) + os.sep):
        return None, "outside"
    try:
        st = os.lstat(full)
    except (OSError, ValueError):  # ValueError: a NUL in the name
        return None, None
    return (full, None) if stat.S_ISREG(st.st_mode) else (None, "special")


def _listed_files(lines: Iterable[str], root: str, base: str, where: Path, warn: Callable[[str], None]) -> list[str]:
    """The regular files inside ``root`` that ``lines`` (RECORD rows or installed-files.txt lines, relative to
    ``base``) name; lines over :data:`MAX_LIST_LINE`, rows that are not CSV, paths out of the tree and entries
    that are not regular files are left out, each kind named in one warning with its count."""
    import csv

    out: list[str] = []
    skipped = {"long": 0, "csv": 0, "outside": 0, "special": 0}
    for line in lines:
        if len(line) > MAX_LIST_LINE:
            skipped["long"] += 1
            continue
        try:
            row = next(csv.reader([line]), None)
        except csv.Error:
            skipped["csv"] += 1
            continue
        if not row or not row[0]:
            continue
        full, why = _confined(root, base, row[0])
        if full is not None:
            out.append(full)
        elif why is not None:
            skipped[why] += 1
    for kind, text in (("long", f"line(s) longer than {MAX_LIST_LINE} characters"),
                       ("csv", "row(s) that are not CSV"), ("outside", f"path(s) outside {root}"),
                       ("special", "entr(y/ies) that are a symlink, FIFO, device or directory, not a regular file")):
        if skipped[kind]:
            warn(f"{where}: {skipped[kind]} {text} skipped; the scan reads only regular files inside the tree")
    return out


def _record_paths(dist_info: Path, root: Path | None = None, warn: Callable[[str], None] = _warn_stderr) -> list[str]:
    """Files a ``.dist-info`` RECORD lists (CSV: quoted names may hold commas) that are regular files inside
    ``root`` (:func:`scan_root` of its site-packages by default)."""
    record = dist_info / "RECORD"
    if not record.is_file():
        return []
    root = Path(root) if root is not None else scan_root(dist_info.parent)
    text = _read_listing(record, f"{dist_info.name}: RECORD")
    return _listed_files(text.splitlines(), os.fspath(root), os.fspath(dist_info.parent), record, warn)


_TOP_LEVEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _egg_info_paths(egg_info: Path, root: Path | None = None, warn: Callable[[str], None] = _warn_stderr) -> list[str]:
    """Files of a ``.egg-info`` (Debian packages, legacy installs): ``installed-files.txt``
    when present, else everything under its ``top_level.txt`` packages/modules (a name that is not a Python
    identifier, ``/`` or ``..`` say, is skipped with a warning; symlinked folders are not followed)."""
    sp = egg_info.parent
    root = Path(root) if root is not None else scan_root(sp)
    if not egg_info.is_dir():
        return []
    listed = egg_info / "installed-files.txt"
    if listed.is_file():
        text = _read_listing(listed, f"{egg_info.name}: installed-files.txt")
        return _listed_files(text.splitlines(), os.fspath(root), os.fspath(egg_info), listed, warn)
    top = egg_info / "top_level.txt"
    out: list[str] = []
    if not top.is_file():
        return out
    for mod in (m.strip() for m in _read_listing(top, f"{egg_info.name}: top_level.txt").splitlines()):
        if not mod:
            continue
        if not _TOP_LEVEL.fullmatch(mod) or len(mod) > 200:
            warn(f"{top}: {mod[:80]!r} is not a module name; skipped")
            continue
        pkg = sp / mod
        if pkg.is_dir() and not pkg.is_symlink():
            for dirpath, _dirs, files in os.walk(pkg, followlinks=False):
                out += [f for f, _why in (_confined(os.fspath(root), dirpath, n) for n in files) if f]
        out += [f for f, _why in (_confined(os.fspath(root), os.fspath(sp), p.name) for p in sp.glob(f"{mod}.*"))
                if f]
    return out


def iter_dist_infos(site_packages: Path) -> Iterator[Path]:
    """``*.dist-info`` directories, then ``*.egg-info`` (directories or PKG-INFO files)."""
    sp = Path(site_packages)
    yield from sorted(p for p in sp.glob("*.dist-info") if p.is_dir())
    yield from sorted(sp.glob("*.egg-info"))


def scan_site_packages(
    site_packages: Path,
    *,
    progress: Callable[[str, int, int], None] | None = None,
    native_digests: bool = True,
    warn: Callable[[str], None] = _warn_stderr,
) -> dict[str, Distribution]:
    """Every distribution under ``site_packages``: ``*.dist-info`` (name and version from
    METADATA, facts from the files its RECORD lists) and ``*.egg-info`` (PKG-INFO;
    files from installed-files.txt or top_level.txt).  Keyed by canonical name.

    Only regular files inside the scanned tree (:func:`scan_root`) are opened: a RECORD entry that is a FIFO,
    a device, a symlink or a path out of the tree (``../..``) is skipped, lines are bounded
    (:data:`MAX_LIST_LINE`), metadata files go through the bounded reader (an unreadable one is exit 2 naming
    it), and a name or version that is not PEP 508/440 leaves that distribution out with a ``warn`` naming it.

    ``progress(name, index, total)`` is called before each distribution.  ``native_digests=False``
    records no ``native_sha256``: for a tree whose files stand in for the image's (a replay from
    the index), a digest of them would be a claim about files the image does not hold.
    """
    site_packages = Path(site_packages)
    if not site_packages.is_dir():
        raise BadInput(f"site-packages directory {site_packages} does not exist or is not a directory.")
    root = scan_root(site_packages)
    dist_infos = list(iter_dist_infos(site_packages))
    dists: dict[str, Distribution] = {}
    for idx, di in enumerate(dist_infos):
        egg = di.suffix == ".egg-info"
        meta = (di / "PKG-INFO" if di.is_dir() else di) if egg else di / "METADATA"
        if not (meta.exists() or meta.is_symlink()):
            raise BadInput(f"{di}: no {meta.name} file; the site-packages directory looks damaged.")
        name, version = _parse_metadata(_read_listing(meta, f"{di.name}: {meta.name}"))
        if not name or not version:
            raise BadInput(f"{meta}: missing Name or Version header.")
        try:  # PEP 503/508 name, PEP 440 version: anything else never reaches the manifest, a lock or a hint
            name, version = values.DistName(name, f"{meta}: Name"), values.Version(version, f"{meta}: Version")
        except BadInput as exc:
            warn(f"{exc.message} The distribution is left out of the scan.")
            continue
        if progress:
            progress(name, idx, len(dist_infos))
        key = canonical_name(name)
        if key in dists:
            if egg:  # a dist-info of the same name wins (newer installer metadata)
                continue
            raise BadInput(
                f"{site_packages}: distribution {name} is installed twice "
                f"({dists[key].version} and {version}); the directory is inconsistent."
            )
        tags: list[str] = []
        wheel = di / "WHEEL"
        if not egg and wheel.is_file():
            tags = HeaderParser().parsestr(_read_listing(wheel, f"{di.name}: WHEEL")).get_all("Tag") or []
        files = _egg_info_paths(di, root, warn) if egg else _record_paths(di, root, warn)
        facts = scan_files(files, is_numpy=key == "numpy", wheel_tags=tags or None)
        if native_digests and facts.binary and not egg:
            facts.native_sha256 = _native_digest(di, warn)
        dists[key] = Distribution(name=name, version=version, facts=facts)
    return dists


def _native_digest(dist_info: Path, warn: Callable[[str], None] = _warn_stderr) -> str | None:
    """The digest of a distribution's ELF files the image's checks stage compares (``native_sha256``); None,
    with a warning, for a RECORD the checker cannot read as CSV (a row over csv's field limit)."""
    import csv

    try:
        return native_digest(dist_info)
    except (csv.Error, ValueError, OSError) as exc:
        warn(f"{dist_info}: RECORD cannot be read for the native digest ({exc}); none recorded")
        return None


# --------------------------------------------------------------------------- snapshot


_XY_EXAMPLE = {"--python": "3.12", "--glibc": "2.35", "--cuda": "13.0"}


def _check_xy(value: str, flag: str) -> str:
    if not re.fullmatch(r"\d+\.\d+", value or ""):
        raise BadInput(f"{flag} must look like X.Y (e.g. {_XY_EXAMPLE.get(flag, '3.12')}), got {value!r}.")
    return value


def platform_for(glibc: str, arch: str = "x86_64") -> str:
    """uv's ``--python-platform`` for a glibc: ``2.35`` -> ``x86_64-manylinux_2_35``."""
    return f"{arch}-manylinux_{glibc.replace('.', '_')}"


def _guess_python_version(site_packages: Path) -> str | None:
    for part in reversed(site_packages.resolve().parts):
        m = re.fullmatch(r"python(\d+\.\d+)", part)
        if m:
            return m.group(1)
    return None


def snapshot_site_packages(
    site_packages: Path,
    *,
    python: str | None,
    glibc: str,
    cuda: str | None = None,
    platform: str | None = None,
    image_ref: str | None = None,
    os_name: str | None = None,
    site_packages_label: str | None = None,
    method: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    native_digests: bool = True,
) -> BaseManifest:
    """A ``reconstructed`` manifest from a directory on this machine (``native_digests``: see
    :func:`scan_site_packages`)."""
    site_packages = Path(site_packages)
    python = python or _guess_python_version(site_packages)
    if not python:
        raise BadInput(
            f"cannot tell the Python version of {site_packages} from its path; pass --python X.Y."
        )
    _check_xy(python, "--python")
    _check_xy(glibc, "--glibc")
    if cuda is not None:
        _check_xy(cuda, "--cuda")
    dists = scan_site_packages(site_packages, progress=progress, native_digests=native_digests)
    if not dists:  # an empty floor would pin nothing: almost always the wrong directory
        raise BadInput(
            f"site-packages directory {site_packages} holds no installed distribution (no *.dist-info or "
            "*.egg-info); point --site-packages at the site-packages/dist-packages directory itself.",
        )
    return BaseManifest(
        image_ref=image_ref,
        image_digest=None,
        os=os_name,
        glibc=glibc,
        python_version=python,
        python_abi="cp" + python.replace(".", ""),
        site_packages=site_packages_label or str(site_packages),
        cuda=cuda,
        platform=platform or platform_for(glibc),
        provenance_kind="reconstructed",
        provenance_method=method or f"scanned the directory {site_packages} with build-image base snapshot "
                                    "--site-packages",
        distributions=dists,
    )


# --------------------------------------------------------------------------- the engine (builder/engine.py)


def _engine_error(args: list[str], stderr: str) -> Exception:
    if engine_adapter.engine_unreachable(stderr):  # the one classifier of the CLI's own connection errors
        return EngineUnavailable(
            f"the Docker engine did not answer `docker {args[0]}`: "
            f"{stderr.strip().splitlines()[-1] if stderr.strip() else 'no reply'}.",
            hint="start dockerd (or set DOCKER_HOST) and retry.",
        )
    return ExternalToolError(f"`docker {' '.join(args)}` failed: {stderr.strip()[-800:] or 'no message'}.")


def _docker(args: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    """One engine command through :mod:`builder.engine`, output captured.  Never pulls:
    callers pass ``--pull=never``."""
    proc = engine_adapter.get_engine().cli(args, timeout=1800)
    if check and proc.returncode != 0:
        raise _engine_error(args, proc.stderr)
    return proc


def _docker_stream(args: list[str]) -> subprocess.Popen:
    return engine_adapter.get_engine().popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# --------------------------------------------------------------------------- image reading

_LIBC_NAME = re.compile(r"^libc(-\d+(\.\d+)+)?\.so(\.6)?$")
_LIB_DIRS = ("lib/", "lib64/", "usr/lib/", "usr/lib64/")
_PY_LIB = re.compile(r"^(?P<prefix>(?:.*/)?)lib/python(?P<ver>\d+\.\d+)/(?:site|dist)-packages/")
_PY_DEB_SHARED = "usr/lib/python3/dist-packages/"
_PY_BIN = re.compile(r"^python(\d+\.\d+)$")
_GLIBC_RELEASE = re.compile(rb"release version (\d+\.\d+)")


def _norm(name: str) -> str:
    name = name.lstrip("./")
    while name.startswith("/"):
        name = name[1:]
    return name


def _is_metadata(name: str) -> bool:
    """Files the snapshot reads as text: distribution metadata and system facts."""
    parent, _, base = name.rpartition("/")
    return (
        parent.endswith((".dist-info", ".egg-info"))
        or base.endswith(".egg-info")
        or base in ("os-release", "pyvenv.cfg")
        or _LIBC_NAME.match(base) is not None
    )


def _wanted(name: str) -> bool:
    if name in ("etc/os-release", "usr/lib/os-release") or name.endswith("/pyvenv.cfg"):
        return True
    if name.startswith(_PY_DEB_SHARED) or _PY_LIB.match(name):
        return True
    base = name.rsplit("/", 1)[-1]
    return _LIBC_NAME.match(base) is not None and name.startswith(_LIB_DIRS)


@dataclass
class _ImageTree:
    root: Path
    links: dict[str, str]          # symlink path -> target (as stored)
    entries: set[str]              # every path in the image (names only)

    def resolve(self, path: str, depth: int = 0) -> str:
        """Follow symlinks (absolute or relative) inside the image."""
        path = _norm(path)
        if depth > 40:
            return path
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            head = "/".join(parts[:i])
            if head in self.links:
                target = self.links[head]
                base = "" if target.startswith("/") else "/".join(parts[: i - 1])
                joined = os.path.normpath(os.path.join("/", base, target)).lstrip("/")
                rest = "/".join(parts[i:])
                return self.resolve(f"{joined}/{rest}" if rest else joined, depth + 1)
        return path


def _read_image_tree(cid: str, dest: Path, progress: Callable[[int], None] | None) -> _ImageTree:
    """Stream ``docker export`` and keep only what the manifest needs."""
    import tarfile

    proc = _docker_stream(["export", cid])
    links: dict[str, str] = {}
    entries: set[str] = set()
    seen = 0
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                name = _norm(member.name)
                entries.add(name)
                seen += member.size
                if progress:
                    progress(seen)
                if member.issym():
                    links[name] = member.linkname
                    continue
                if not _wanted(name):
                    continue
                if member.isfile():
                    src = tar.extractfile(member)
                    if src is None:
                        continue
                    # Only metadata and ELF files are ever read: skip writing the rest
                    # (file creation dominates the cost on slow disks).
                    head = b""
                    if not _is_metadata(name):
                        if not _might_be_elf(name):
                            continue
                        head = src.read(4)
                        if head != ELF_MAGIC:
                            continue
                    target = dest / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with open(target, "wb") as out:
                        out.write(head)
                        shutil.copyfileobj(src, out, 1 << 20)
                elif member.islnk():
                    src_path = dest / _norm(member.linkname)
                    if src_path.is_file():
                        target = dest / name
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(src_path, target)
    except tarfile.TarError as exc:
        proc.kill()
        raise ExternalToolError(f"`docker export {cid}` produced an unreadable stream: {exc}.") from None
    finally:
        if proc.stdout:
            proc.stdout.close()
        err = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
        rc = proc.wait()
    if rc != 0:
        raise _engine_error(["export", cid], err)
    return _ImageTree(root=dest, links=links, entries=entries)


def _read_os_release(tree: _ImageTree) -> str | None:
    for cand in ("etc/os-release", "usr/lib/os-release"):
        p = tree.root / tree.resolve(cand)
        if p.is_file():
            fields = {}
            for line in p.read_text(errors="replace").splitlines():
                if "=" in line:
                    k, v = line.split("=", 1)
                    fields[k.strip()] = v.strip().strip('"')
            return (fields.get("PRETTY_NAME") or " ".join(filter(None, [fields.get("NAME"), fields.get("VERSION")]))
                    or None)
    return None


def glibc_of_libc(path: Path) -> str | None:
    """glibc release of a ``libc.so.6``: its banner string, else its highest GLIBC_x.y version definition."""
    data = path.read_bytes()
    m = _GLIBC_RELEASE.search(data)
    if m:
        return m.group(1).decode()
    best: Version | None = None
    from elftools.elf.gnuversions import GNUVerDefSection

    with open(path, "rb") as fh:
        try:
            for section in ELFFile(fh).iter_sections():
                if isinstance(section, GNUVerDefSection):
                    for _vd, aux_iter in section.iter_versions():
                        for aux in aux_iter:
                            mm = _GLIBC_VER.match(aux.name)
                            if mm and (best is None or Version(mm.group(1)) > best):
                                best = Version(mm.group(1))
        except ELFError:
            return None
    return str(best) if best else None


def _image_glibc(tree: _ImageTree) -> str | None:
    for d in ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "usr/lib64", "lib", "usr/lib",
              "lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu"):
        p = tree.root / tree.resolve(f"{d}/libc.so.6")
        if p.is_file():
            return glibc_of_libc(p)
    return None


def _python_candidates(tree: _ImageTree, env_path: str) -> list[tuple[str, str]]:
    """``(version, interpreter path)`` for each ``python3`` on the image's PATH, in PATH order."""
    found: list[tuple[str, str]] = []
    for d in [d for d in env_path.split(":") if d]:
        for exe in ("python3", "python"):
            p = _norm(f"{d}/{exe}")
            if p not in tree.entries:
                continue
            real = tree.resolve(p)
            m = _PY_BIN.match(real.rsplit("/", 1)[-1])
            if m:
                found.append((m.group(1), p))
                break  # python3 before python, one per directory
    return found


def _site_dirs(tree: _ImageTree, version: str, interpreter: str | None) -> list[str]:
    """Existing site directories that interpreter ``version`` puts on sys.path, in order."""
    order: list[str] = []
    prefix = _norm(interpreter.rsplit("/bin/", 1)[0]) if interpreter and "/bin/" in interpreter else ""
    if prefix and prefix not in ("usr", "usr/local"):
        # a venv or a self-contained prefix (/opt/venv, /opt/conda)
        order += [f"{prefix}/lib/python{version}/site-packages", f"{prefix}/lib/python{version}/dist-packages"]
        cfg = tree.root / tree.resolve(f"{prefix}/pyvenv.cfg")
        if cfg.is_file():
            text = cfg.read_text(errors="replace").lower().replace(" ", "")
            if "include-system-site-packages=true" not in text:
                order = order[:2]
                return [d for d in (tree.resolve(_norm(o)) for o in order) if (tree.root / d).is_dir()]
    # Debian/Ubuntu system or deadsnakes python, python.org builds under /usr/local: sys.path order
    order += [
        f"usr/local/lib/python{version}/dist-packages",
        f"usr/local/lib/python{version}/site-packages",
        "usr/lib/python3/dist-packages",
        f"usr/lib/python{version}/dist-packages",
        f"usr/lib/python{version}/site-packages",
    ]
    out: list[str] = []
    for d in order:
        d = _norm(d)
        real = tree.resolve(d)
        if real not in out and (tree.root / real).is_dir():
            out.append(real)
    return out


def _versions_from_lib_dirs(tree: _ImageTree) -> list[str]:
    vers = set()
    for e in tree.entries:
        m = _PY_LIB.match(e + "/") if not e.endswith("/") else _PY_LIB.match(e)
        if m:
            vers.add(m.group("ver"))
    return sorted(vers, key=Version)


def _repo_of(ref: str) -> str:
    """Repository part of an image reference, Docker Hub defaults folded
    (``docker.io/library/ubuntu:22.04`` and ``ubuntu@sha256:..`` -> ``ubuntu``)."""
    name = ref.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    if name.startswith("library/") and name.count("/") == 1:
        name = name[len("library/"):]
    return name


repo_of = _repo_of  # the public name: the pipeline matches an image's RepoDigests by repository


def snapshot_image(
    ref: str,
    *,
    python: str | None = None,
    glibc: str | None = None,
    cuda: str | None = None,
    platform: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    export_progress: Callable[[int], None] | None = None,
) -> BaseManifest:
    """A ``read-from-image`` manifest of a LOCAL image (never pulled)."""
    if python is not None:
        _check_xy(python, "--python")
    if glibc is not None:
        _check_xy(glibc, "--glibc")
    if cuda is not None:
        _check_xy(cuda, "--cuda")
    info = _inspect_local_image(ref)
    env = {}
    for kv in (info.get("Config") or {}).get("Env") or []:
        k, _, v = kv.partition("=")
        env[k] = v
    created = _docker(["create", "--pull=never", "--network=none", ref, "build-image-snapshot-never-started"])
    cid = created.stdout.strip().splitlines()[-1]
    tmp = tempfile.mkdtemp(prefix="bi-image-")
    try:
        scan = _scan_image_tree(ref, cid, Path(tmp), env, python, progress, export_progress)
    finally:
        _docker(["rm", "-f", cid], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    if glibc is None:
        glibc = scan.glibc
    if glibc is None:
        raise BadInput(f"image {ref!r}: no libc.so.6 found to read the glibc version from (musl or unusual layout?).",
                       hint="pass --glibc X.Y explicitly.")
    if cuda is None:
        cuda = _image_cuda(env, scan.dists)
    method = (
        f"read from the local image {ref} (image id {info.get('Id')}) through the Docker engine: "
        f"`docker create` + streamed `docker export`; scanned {', '.join('/' + d for d in scan.dirs)} "
        f"({sum(scan.counts.values())} dist-info), glibc from /lib libc.so.6, OS from /etc/os-release"
        + (", CUDA from the image's CUDA_VERSION" if env.get("CUDA_VERSION") else "")
        + "."
    )
    return BaseManifest(
        image_ref=ref,
        image_digest=_local_image_digest(ref, info),
        os=scan.os_name,
        glibc=glibc,
        python_version=scan.python,
        python_abi="cp" + scan.python.replace(".", ""),
        site_packages="/" + max(scan.dirs, key=lambda d: scan.counts[d]),
        cuda=cuda,
        platform=platform or platform_for(glibc),
        provenance_kind="read-from-image",
        provenance_method=method,
        distributions=scan.dists,
        consistency=image_consistency(ref, scan.dists, scan.interpreter),
    )


def _inspect_local_image(ref: str) -> dict:
    """``docker image inspect`` of an image the engine holds; one it does not is BadInput."""
    import json as _json

    insp = _docker(["image", "inspect", ref], check=False)
    if insp.returncode != 0:
        err = insp.stderr.lower()
        if "no such image" in err or "no such object" in err:
            raise BadInput(
                f"image {ref!r} is not in the local engine; build-image never pulls implicitly.",
                hint=f"pull or load it first (`docker pull {ref}` / `docker load`), or snapshot a directory "
                     "with --site-packages.",
            )
        raise _engine_error(["image", "inspect", ref], insp.stderr)
    return _json.loads(insp.stdout)[0]


def _local_image_digest(ref: str, info: dict) -> str | None:
    """The digest the reference names, else the image's repo digest in the reference's repository."""
    if "@sha256:" in ref:
        return ref.split("@", 1)[1]
    repo = _repo_of(ref)
    for rd in info.get("RepoDigests") or []:
        if _repo_of(rd) == repo:
            return rd.split("@", 1)[1]
    return None


@dataclass
class _TreeScan:
    """What an image's file tree says: its Python, site-packages and distributions, glibc, OS."""

    python: str
    interpreter: str | None  # the python3 found on the image's PATH, as a path in the image
    dirs: list[str]
    dists: dict[str, Distribution]
    counts: dict[str, int]  # site-packages directory -> dist-info found there
    glibc: str | None
    os_name: str | None


def _scan_image_tree(ref: str, cid: str, tmp: Path, env: dict[str, str], python: str | None,
                     progress: Callable[[str, int, int], None] | None,
                     export_progress: Callable[[int], None] | None) -> _TreeScan:
    """Export the created container's file tree into ``tmp`` and read it."""
    tree = _read_image_tree(cid, tmp, export_progress)
    cands = _python_candidates(tree, env.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"))
    interpreter = None
    if python is None:
        if cands:
            python, interpreter = cands[0]
        else:
            lib_vers = _versions_from_lib_dirs(tree)
            if len(lib_vers) == 1:
                python = lib_vers[0]
    else:
        interpreter = next((p for v, p in cands if v == python), None)
    if not python:
        raise BadInput(
            f"image {ref!r} has no Python interpreter that build-image can identify "
            "(no python3 on its PATH, no lib/pythonX.Y/site-packages).",
            hint="is this really a Python image? pass --python X.Y if the layout is unusual.",
        )
    dirs = _site_dirs(tree, python, interpreter)
    if not dirs:
        raise BadInput(f"image {ref!r}: no site-packages directory for Python {python} found.")
    dists: dict[str, Distribution] = {}
    counts: dict[str, int] = {}
    for d in dirs:
        found = scan_site_packages(tmp / d, progress=progress)
        counts[d] = len(found)
        for k, v in found.items():
            dists.setdefault(k, v)  # first on sys.path wins, as at import time
    return _TreeScan(python=python, interpreter=interpreter, dirs=dirs, dists=dists, counts=counts,
                     glibc=_image_glibc(tree), os_name=_read_os_release(tree))


def _image_cuda(env: dict[str, str], dists: dict[str, Distribution]) -> str | None:
    """The image's CUDA X.Y: its CUDA_VERSION, else the CUDA runtime distribution's version."""
    m = re.match(r"^(\d+)\.(\d+)", env.get("CUDA_VERSION", ""))
    if m:
        return f"{m.group(1)}.{m.group(2)}"
    for key in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"):
        if key in dists:
            mv = re.match(r"^(\d+)\.(\d+)", dists[key].version)
            return f"{mv.group(1)}.{mv.group(2)}" if mv else None
    return None


def image_consistency(ref: str, dists: dict[str, Distribution], interpreter: str | None) -> dict | None:
    """The base's own dependency problems: ``pip check`` (``uv pip check`` on a base with uv and
    no pip) run in a throw-away container of the LOCAL image (``--pull=never --network=none``).
    None when the image has neither tool (the checks stage then refuses the base, naming it)."""
    tool = consistency_tool(dists)
    if tool not in dists:
        return None
    py = "/" + _norm(interpreter) if interpreter else "python3"
    argv = ([py, "-m", "uv", "pip", "check", "--python", py] if tool == "uv"
            else [py, "-m", "pip", "check", "--disable-pip-version-check", "--no-input"])
    proc = _docker(["run", "--rm", "--pull=never", "--network=none", "--entrypoint", argv[0], ref, *argv[1:]],
                   check=False)
    out = proc.stdout + proc.stderr
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not checker().problems(proc.stdout)):
        raise ExternalToolError(f"`{' '.join(argv)}` in the image {ref} failed ({proc.returncode}): "
                                f"{out.strip()[-600:] or 'no output'}.")
    return {"tool": tool, "problems": checker().problems(proc.stdout)}


# --------------------------------------------------------------------------- snapshots cached by image


def _snapshot_cache_path(ref: str, image_id: str) -> Path:
    key = sha256_bytes(f"{__version__}\n{image_id}\n{ref}".encode())[:32]
    return cache_dir() / "snapshots" / f"{key}.json"


def snapshot_cached(ref: str, *, image_id: str) -> tuple[BaseManifest, bool]:
    """(manifest, reused) of a LOCAL image: the snapshot made earlier of the same image ID under
    the same reference (by this tool version), else a new :func:`snapshot_image`, kept for next time."""
    path = _snapshot_cache_path(ref, image_id)
    if path.is_file():
        try:
            return parse_manifest(path.read_text(encoding="utf-8"), str(path)), True
        except (BadInput, OSError, UnicodeDecodeError):
            pass  # a damaged cache entry is made again
    manifest = snapshot_image(ref)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, manifest.to_json())
    return manifest, False
