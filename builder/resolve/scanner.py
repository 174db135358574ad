"""The binary scanner: facts read from files, never from package names — :func:`scan_files`,
:func:`scan_wheel`, :func:`scan_site_packages` (ELF version-needed sections through pyelftools, numpy
C-API module strings, extension suffixes, wheel tags).  The snapshot (``builder.resolve.base``) turns a
site-packages directory or a local image into a manifest with it.

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
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath
from typing import IO

from packaging.version import Version

from builder import values
from builder.errors import BadInput
from builder.events import PlainReporter, Reporter
from builder.resolve.elfsyms import TORCH_LIBRARY, elf_sections, pack_symbols, torch_symbols_in
from builder.resolve.fatbin import MAX_ARCHS, CudaFacts, cuda_facts_in
from builder.resolve.floor import native_digest
from builder.resolve.manifest import DistFacts, Distribution
from builder.util import canonical_name
from builder.validate import read_bounded

ELF_MAGIC = b"\x7fELF"
NUMPY2_MARKER = b"numpy._core._multiarray_umath"
NUMPY1_MARKER = b"numpy.core._multiarray_umath"

_SO_NAME = re.compile(r"\.so(\.\d+)*$")
# the grammar a manifest and a lock record (values.Glibc): a GLIBC_ name outside it is no glibc version
GLIBC_VER = re.compile(r"^GLIBC_([0-9]{1,4}(?:\.[0-9]{1,4}){1,2})$")
_CPYTHON_SUFFIX = re.compile(r"\.cpython-(\d)(\d+)[a-z]*-[^.]*\.so$")
_ABI3_SUFFIX = re.compile(r"\.abi3\.so$")
# Files that are never ELF: skip even opening them (site-packages hold ~10^5 files).
TEXT_SUFFIXES = frozenset(
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
    machine: str | None = None  # the ELF header's e_machine, as pyelftools names it (EM_X86_64, EM_AARCH64)
    torch_linked: bool = False  # links libtorch*/libc10* or leaves a torch-namespace symbol undefined
    torch_needs: list[str] | None = None  # the torch-namespace symbols it leaves undefined
    torch_exports: list[str] | None = None  # the torch-namespace symbols it exports (torch's own libraries)
    cuda: CudaFacts | None = None  # its fat binary's SASS/PTX architectures and CUDA runtime major


#: e_machine values of the architectures a wheel for a build-image platform may hold, by pyelftools' names
#: (elftools.elf.enums.ENUM_E_MACHINE); any other value is named by its number
_E_MACHINE = {
    62: "EM_X86_64",
    183: "EM_AARCH64",
    3: "EM_386",
    40: "EM_ARM",
    21: "EM_PPC64",
    22: "EM_S390",
    243: "EM_RISCV",
}


def _elf_machine(head: bytes) -> str | None:
    """The ``e_machine`` of an ELF header's first 20 bytes (None when too short)."""
    if len(head) < 20 or head[5] not in (1, 2):
        return None
    value = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    return _E_MACHINE.get(value, f"EM_{value}")


def _numpy_generation(buf) -> str | None:
    """``buf`` supports ``.find`` (bytes or mmap)."""
    if buf.find(NUMPY2_MARKER) != -1:
        return "2"
    if buf.find(NUMPY1_MARKER) != -1:
        return "1"
    return None


def _elf_glibc(stream: IO[bytes]) -> Version | None:
    """Highest GLIBC_x.y named in the ELF version-needed sections (None if none)."""
    # why: pyelftools costs tens of ms to import; only a layout the fast reader does not handle needs it,
    # and `lock --check` or an up-to-date re-lock never reads an ELF file
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    best: Version | None = None
    elf = ELFFile(stream)
    for section in elf.iter_sections():
        if not isinstance(section, GNUVerNeedSection):
            continue
        for _verneed, aux_iter in section.iter_versions():
            for aux in aux_iter:
                m = GLIBC_VER.match(aux.name)
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
            (shoff,) = struct.unpack_from(e + "Q", mm, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", mm, 0x3A)
            sh_fmt, sh_size = e + "IIQQQQIIQQ", 64
        else:
            (shoff,) = struct.unpack_from(e + "I", mm, 0x20)
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
            return mm[start : mm.find(b"\0", start)]

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
                    m = GLIBC_VER.match(mm[start : mm.find(b"\0", start)].decode("ascii", "replace"))
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
    except (struct.error, IndexError, ValueError, OverflowError) as exc:  # Overflow: an offset past ssize_t
        raise _NotParsed from exc


def _scan_elf_file(path, *, want_numpy: bool) -> _FileFacts:
    with open(path, "rb") as fh:
        if fh.read(4) != ELF_MAGIC:
            return _FileFacts()
        facts = _FileFacts(is_elf=True, is_shared_object=bool(_SO_NAME.search(os.path.basename(path))))
        facts.machine = _elf_machine(ELF_MAGIC + fh.read(16))
        want = want_numpy and facts.is_shared_object
        size = os.fstat(fh.fileno()).st_size
        if facts.is_shared_object and size:
            _extra_facts(fh, path, facts)
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


def _extra_facts(fh, path, facts: _FileFacts) -> None:
    """A shared object's torch symbols (:func:`builder.resolve.elfsyms.torch_symbols`; exports only for torch's
    own libraries, :data:`builder.resolve.elfsyms.TORCH_LIBRARY`) and its fat binary's architectures
    (:func:`builder.resolve.fatbin.cuda_facts`), from one read of its section headers."""
    name, where = os.path.basename(path), os.fspath(path)
    with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        elf, secs = elf_sections(mm, where)
        linked, needs, exports = torch_symbols_in(elf, secs, mm, where, exports=bool(TORCH_LIBRARY.match(name)))
        facts.cuda = cuda_facts_in(elf, secs, mm, where)
    facts.torch_linked = linked
    facts.torch_needs = needs if linked else None
    facts.torch_exports = exports or None


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


def might_be_elf(name: str) -> bool:
    dot = name.rfind(".")
    return dot <= 0 or name[dot:].lower() not in TEXT_SUFFIXES


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
    exports: set[str] = set()
    cuda, cuda_file = CudaFacts(), None
    for p in paths:
        p = os.fspath(p)
        name = os.path.basename(p)
        if not might_be_elf(name):
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
        if ff.machine:
            facts.machines[ff.machine] = facts.machines.get(ff.machine, 0) + 1
        if ff.is_shared_object:
            facts.extensions += 1
            so_names.append(name)
        if ff.numpy_gen:
            facts.numpy_abi[ff.numpy_gen] += 1
        if ff.glibc is not None and (best_glibc is None or ff.glibc > best_glibc):
            best_glibc = ff.glibc
        if ff.torch_linked:
            facts.torch_needs[name] = sorted(set(facts.torch_needs.get(name, [])) | set(ff.torch_needs or ()))
        exports.update(ff.torch_exports or ())
        if ff.cuda is not None:
            cuda_file = p
            cuda.sass |= ff.cuda.sass
            cuda.ptx |= ff.cuda.ptx
            cuda.runtime = max(filter(None, (cuda.runtime, ff.cuda.runtime)), default=None)
    facts.torch_exports = pack_symbols(exports) if exports else None
    if max(len(cuda.sass), len(cuda.ptx)) > MAX_ARCHS:  # the manifest reader's bound, kept by its writer
        raise BadInput(
            f"{cuda_file}: with its distribution's other CUDA binaries it names {len(cuda.sass)} SASS and "
            f"{len(cuda.ptx)} PTX architectures, more "
            f"than the {MAX_ARCHS} a base manifest records; the files are damaged or not what they claim."
        )
    facts.cuda_sass, facts.cuda_ptx, facts.cuda_runtime = sorted(cuda.sass), sorted(cuda.ptx), cuda.runtime
    facts.glibc = str(best_glibc) if best_glibc is not None else None
    facts.python_abi = _decide_python_abi(
        python_abi_from_tags(wheel_tags) if wheel_tags is not None else None,
        _python_abi_from_suffixes(so_names),
    )
    return facts


# --------------------------------------------------------------------------- wheels


_WHEEL_NAME = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?"
    r"-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)


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
                raise BadInput(
                    f"wheel {path}: no .dist-info/METADATA with Name and Version, and the file name is not "
                    "a wheel name."
                )
            name, version = name or m["name"], version or m["version"]
        if not tags and m:
            tags = [f"{py}-{m['abi']}-{m['plat']}" for py in m["py"].split(".")]
        extracted: list[Path] = []
        members: list[str] = []
        for idx, info in enumerate(infos):
            if info.is_dir() or not might_be_elf(info.filename):
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
            members.append(info.filename)
        try:
            facts = scan_files(extracted, is_numpy=canonical_name(name) == "numpy", wheel_tags=tags)
        except BadInput as exc:  # name the wheel and its member, not the scratch copy
            msg = exc.message
            for dst, member in zip(extracted, members, strict=True):
                msg = msg.replace(os.fspath(dst), f"{path.name}: {member}")
            raise BadInput(msg) from None
    return name, version, facts


# --------------------------------------------------------------------------- site-packages


#: the longest RECORD / installed-files.txt line the scanner reads (a real one is a path, a hash and a size);
#: a longer line is named in a warning and skipped
MAX_LIST_LINE = 4096
#: the largest METADATA, PKG-INFO, WHEEL, RECORD or installed-files.txt the scanner reads
MAX_DIST_FILE = 16 << 20


#: where a scan without a reporter tells its warnings: stderr, ``warning: ...`` (its steps are a terminal's only)
WARNINGS_ON_STDERR: Reporter = PlainReporter(steps=False)


def scan_root(site_packages: Path) -> Path:
    """The tree a scan may read files in: the installation prefix of ``<prefix>/lib/pythonX.Y/site-packages``
    (RECORD lists the console scripts and binaries in ``<prefix>/bin``, ``../../../bin/uv``), else the
    site-packages directory itself."""
    sp = Path(os.path.abspath(site_packages))
    if (
        sp.name in ("site-packages", "dist-packages")
        and re.fullmatch(r"python\d+(?:\.\d+)?", sp.parent.name)
        and sp.parent.parent.name in ("lib", "lib64")
    ):
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


def _listed_files(lines: Iterable[str], root: str, base: str, where: Path, reporter: Reporter) -> list[str]:
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
    for kind, text in (
        ("long", f"line(s) longer than {MAX_LIST_LINE} characters"),
        ("csv", "row(s) that are not CSV"),
        ("outside", f"path(s) outside {root}"),
        ("special", "entr(y/ies) that are a symlink, FIFO, device or directory, not a regular file"),
    ):
        if skipped[kind]:
            reporter.warning(
                f"{where}: {skipped[kind]} {text} skipped; the scan reads only regular files inside the tree",
                lead="warning: ",
            )
    return out


def _record_paths(dist_info: Path, root: Path | None = None, reporter: Reporter = WARNINGS_ON_STDERR) -> list[str]:
    """Files a ``.dist-info`` RECORD lists (CSV: quoted names may hold commas) that are regular files inside
    ``root`` (:func:`scan_root` of its site-packages by default)."""
    record = dist_info / "RECORD"
    if not record.is_file():
        return []
    root = Path(root) if root is not None else scan_root(dist_info.parent)
    text = _read_listing(record, f"{dist_info.name}: RECORD")
    return _listed_files(text.splitlines(), os.fspath(root), os.fspath(dist_info.parent), record, reporter)


_TOP_LEVEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _egg_info_paths(egg_info: Path, root: Path | None = None, reporter: Reporter = WARNINGS_ON_STDERR) -> list[str]:
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
        return _listed_files(text.splitlines(), os.fspath(root), os.fspath(egg_info), listed, reporter)
    top = egg_info / "top_level.txt"
    out: list[str] = []
    if not top.is_file():
        return out
    for mod in (m.strip() for m in _read_listing(top, f"{egg_info.name}: top_level.txt").splitlines()):
        if not mod:
            continue
        if not _TOP_LEVEL.fullmatch(mod) or len(mod) > 200:
            reporter.warning(f"{top}: {mod[:80]!r} is not a module name; skipped", lead="warning: ")
            continue
        pkg = sp / mod
        if pkg.is_dir() and not pkg.is_symlink():
            for dirpath, _dirs, files in os.walk(pkg, followlinks=False):
                out += [f for f, _why in (_confined(os.fspath(root), dirpath, n) for n in files) if f]
        out += [f for f, _why in (_confined(os.fspath(root), os.fspath(sp), p.name) for p in sp.glob(f"{mod}.*")) if f]
    return out


def iter_dist_infos(site_packages: Path) -> Iterator[Path]:
    """``*.dist-info`` directories, then ``*.egg-info`` (directories or PKG-INFO files)."""
    sp = Path(site_packages)
    yield from sorted(p for p in sp.glob("*.dist-info") if p.is_dir())
    yield from sorted(sp.glob("*.egg-info"))


def scan_site_packages(
    site_packages: Path,
    *,
    native_digests: bool = True,
    reporter: Reporter = WARNINGS_ON_STDERR,
) -> dict[str, Distribution]:
    """Every distribution under ``site_packages``: ``*.dist-info`` (name and version from
    METADATA, facts from the files its RECORD lists) and ``*.egg-info`` (PKG-INFO;
    files from installed-files.txt or top_level.txt).  Keyed by canonical name.

    Only regular files inside the scanned tree (:func:`scan_root`) are opened: a RECORD entry that is a FIFO,
    a device, a symlink or a path out of the tree (``../..``) is skipped, lines are bounded
    (:data:`MAX_LIST_LINE`), metadata files go through the bounded reader (an unreadable one is exit 2 naming
    it), and a name or version that is not PEP 508/440 leaves that distribution out with a warning naming it.

    Each distribution is a step on ``reporter`` (``scanning I/N NAME``), each file skipped a warning (default:
    the warnings on stderr, no steps: :data:`WARNINGS_ON_STDERR`).  ``native_digests=False``
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
            reporter.warning(f"{exc.message} The distribution is left out of the scan.", lead="warning: ")
            continue
        reporter.step(f"scanning {idx + 1}/{len(dist_infos)} {name}")
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
        files = _egg_info_paths(di, root, reporter) if egg else _record_paths(di, root, reporter)
        facts = scan_files(files, is_numpy=key == "numpy", wheel_tags=tags or None)
        if native_digests and facts.binary and not egg:
            facts.native_sha256 = _native_digest(di, reporter)
        dists[key] = Distribution(name=name, version=version, facts=facts)
    return dists


def _native_digest(dist_info: Path, reporter: Reporter = WARNINGS_ON_STDERR) -> str | None:
    """The digest of a distribution's ELF files the image's checks stage compares (``native_sha256``); None,
    with a warning, for a RECORD the checker cannot read as CSV (a row over csv's field limit)."""
    import csv

    try:
        return native_digest(dist_info)
    except (csv.Error, ValueError, OSError) as exc:
        reporter.warning(
            f"{dist_info}: RECORD cannot be read for the native digest ({exc}); none recorded", lead="warning: "
        )
        return None
