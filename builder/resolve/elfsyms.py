"""Torch's C++ ABI as seen in ELF files: what an extension needs from torch, what torch exports.

An extension module built against torch links ``libtorch*.so`` / ``libc10*.so`` (``DT_NEEDED``) and
leaves the functions of torch's C++ namespaces (``at::``, ``c10::``, ``torch::``, ``caffe2::``)
undefined in its dynamic symbol table; torch's libraries define and export them.  A name the
extension needs that the base's torch does not export is the "undefined symbol" error at import.

* :func:`torch_symbols` reads one ELF file: (linked against torch?, undefined torch names, exported
  torch names).  Section headers come from pyelftools; the symbol table itself is read with
  ``struct`` over the mapped file (a torch library holds ~10^5 dynamic symbols), every size checked
  against the file and bounded (:data:`MAX_DYNSYM`, :data:`MAX_DYNSTR`): a table that lies about its
  size is :class:`~builder.errors.BadInput` naming the file, never a long read.
* :func:`pack_symbols` / :func:`unpack_symbols` / :func:`symbol_key`: the compact set the base
  manifest records (``torch_exports``): sorted 32-bit keys of the names, delta-encoded, zlib'd and
  base64'd, so the gate checks an added wheel without the image.
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct
import zlib
from collections.abc import Iterable

from builder.errors import BadInput

#: a mangled name in torch's C++ namespaces: ``_ZN2at...``, ``_ZNK3c10...``, ``_ZN5torch...``, typeinfo/vtables
#: ``_ZTIN3c10...`` and free functions ``_ZN6caffe2...``
TORCH_SYMBOL = re.compile(rb"_Z(?:T[ISV])?N[rVKO]*(?:2at|3c10|5torch|6caffe2)(?=\d|S|I)|aoti_torch_|torch_stable_")
#: a DT_NEEDED entry (or a file name) naming one of torch's own libraries, as torch's wheels ship them in
#: ``torch/lib``: libtorch.so, libtorch_{cpu,python,global_deps,nvshmem}.so, libtorch_cuda.so and
#: libtorch_cuda_{linalg,cpp,cu}.so, libtorch_{hip,xpu}.so, libc10.so, libc10_{cuda,hip,xpu}.so. Libraries
#: of other distributions whose names merely start so (torchcodec's ``libtorchcodec_core8.so``, torchaudio's
#: ``libtorchaudio.so``, ``libtorch_c_dlpack_addon_*.so``) are not torch's.
TORCH_LIBRARY = re.compile(
    r"^lib(?:torch(?:_(?:cpu|python|global_deps|nvshmem|hip|xpu|cuda(?:_linalg|_cpp|_cu)?))?|c10(?:_(?:cuda|hip|xpu))?)"
    r"\.so(?:\.\d+)*$"
)
#: the most dynamic symbols one file's table may hold (libtorch_cpu.so: ~2.5 * 10^5)
MAX_DYNSYM = 4_000_000
#: the most .dynamic entries read (a real library has a few dozen)
MAX_DYNAMIC = 1 << 16
#: the largest dynamic string table read
MAX_DYNSTR = 512 << 20
#: the longest symbol name read (a longer one is cut here: torch's longest mangled names are ~2 KB)
MAX_NAME = 16 << 10

_PRINTABLE = re.compile(rb"[\x21-\x7e]+")


def _bad(where: str, what: str) -> BadInput:
    return BadInput(
        f"{where}: {what}; the ELF file is damaged or not what it claims, so its torch symbols cannot be read."
    )


def _table(mm, sec, size_limit: int, where: str, what: str) -> tuple[int, int]:
    """(offset, size) of a section, checked against the file's size and ``size_limit``."""
    off, size = sec["sh_offset"], sec["sh_size"]
    if sec["sh_type"] == "SHT_NOBITS":
        return 0, 0
    if off + size > len(mm):
        raise _bad(where, f"its {what} claims bytes {off}..{off + size} beyond the end of the file ({len(mm)} bytes)")
    if size > size_limit:
        raise _bad(where, f"its {what} is {size} bytes, over the {size_limit}-byte limit the scanner reads")
    return off, size


def _section_headers(elf, mm, where: str) -> list:
    """The section headers, parsed with pyelftools' structures from the bytes they claim (bounded)."""
    head = elf.header
    num, size, off = head["e_shnum"], head["e_shentsize"], head["e_shoff"]
    if off == 0:
        return []
    if num == 0 or size != elf.structs.Elf_Shdr.sizeof():
        raise _bad(where, f"its section header table ({num} x {size} bytes) is not one the scanner reads")
    if num > 1 << 16:
        raise _bad(where, f"it claims {num} section headers")
    if off + num * size > len(mm):  # a cut file (the table is at its end): nothing to read, as for glibc
        return []
    return [elf.structs.Elf_Shdr.parse(mm[off + i * size : off + (i + 1) * size]) for i in range(num)]


def _needed(elf, mm, secs: list, where: str) -> list[str]:
    """The DT_NEEDED names of the dynamic section."""
    dyn = next((s for s in secs if s["sh_type"] == "SHT_DYNAMIC"), None)
    if dyn is None or dyn["sh_link"] >= len(secs):
        return []
    off, size = _table(mm, dyn, MAX_DYNAMIC * 16, where, ".dynamic section")
    str_off, str_size = _table(mm, secs[dyn["sh_link"]], MAX_DYNSTR, where, ".dynstr section")
    ent = elf.structs.Elf_Dyn.sizeof()
    out = []
    for i in range(size // ent):
        tag = elf.structs.Elf_Dyn.parse(mm[off + i * ent : off + (i + 1) * ent])
        if tag["d_tag"] == "DT_NULL":
            break
        if tag["d_tag"] == "DT_NEEDED" and tag["d_val"] < str_size:
            start = str_off + tag["d_val"]
            end = mm.find(b"\0", start, min(start + MAX_NAME, str_off + str_size))
            out.append(mm[start : end if end != -1 else start].decode("ascii", "replace"))
    return out


def _dynsyms(elf, mm, secs: list, where: str) -> tuple[list[bytes], list[bytes]]:
    """(undefined, defined-and-exported) torch-namespace names of the dynamic symbol table."""
    sec = next((s for s in secs if s["sh_type"] == "SHT_DYNSYM"), None)
    if sec is None:
        return [], []
    off, size = _table(mm, sec, MAX_DYNSYM * 24, where, ".dynsym section")
    entsize = 24 if elf.elfclass == 64 else 16
    if sec["sh_entsize"] not in (0, entsize):
        raise _bad(where, f"its .dynsym entries are {sec['sh_entsize']} bytes, not {entsize}")
    if sec["sh_link"] >= len(secs):
        raise _bad(where, f"its .dynsym names string table {sec['sh_link']}, which does not exist")
    str_off, str_size = _table(mm, secs[sec["sh_link"]], MAX_DYNSTR, where, ".dynstr section")
    e = "<" if elf.little_endian else ">"
    # (st_name, st_info, st_shndx) at fixed places of each entry
    fmt = e + ("IBxHxxxxxxxxxxxxxxxx" if entsize == 24 else "IxxxxxxxxBxH")
    undefined: list[bytes] = []
    exported: list[bytes] = []
    str_end = str_off + str_size
    # read in place (the mapped file, no copy of a table that may be hundreds of MB); the views are released
    # whatever happens, so the map can close
    with memoryview(mm) as whole, whole[off : off + size - size % entsize] as table:
        for name_off, info, shndx in struct.iter_unpack(fmt, table):
            if not name_off or name_off >= str_size or (info >> 4) not in (1, 2):  # GLOBAL / WEAK only
                continue
            start = str_off + name_off
            if not TORCH_SYMBOL.match(mm, start, str_end):
                continue
            end = mm.find(b"\0", start, min(start + MAX_NAME, str_end))
            name = mm[start : end if end != -1 else min(start + MAX_NAME, str_end)]
            if _PRINTABLE.fullmatch(name):  # a name reaches messages: nothing else is a real symbol
                (undefined if shndx == 0 else exported).append(name)
    return undefined, exported


def elf_sections(mm, where: str) -> tuple[object | None, list]:
    """(pyelftools' ELFFile, section headers) of the ELF image in ``mm`` (bytes or mmap); (None, []) when
    pyelftools cannot read its ELF header (no facts, as for glibc). Bounds as :func:`torch_symbols`."""
    # why: pyelftools costs tens of ms to import, and `lock --check` or an up-to-date re-lock reads no ELF file
    import io

    from elftools.common.exceptions import ELFError
    from elftools.construct import ConstructError
    from elftools.elf.elffile import ELFFile

    try:
        elf = ELFFile(io.BytesIO(mm) if isinstance(mm, bytes) else _MapStream(mm))
    except (ELFError, ConstructError, struct.error, ValueError):
        return None, []
    try:
        return elf, _section_headers(elf, mm, where)
    except (ELFError, ConstructError, struct.error, ValueError, IndexError, KeyError, OverflowError) as exc:
        raise _bad(where, f"its headers cannot be read ({exc})") from None


def section_names(elf, mm, secs: list, where: str) -> list[str]:
    """The name of each section (``.nv_fatbin``), read from the section name string table."""
    idx = elf.header["e_shstrndx"]
    if not secs or idx >= len(secs):
        return [""] * len(secs)
    off, size = _table(mm, secs[idx], MAX_DYNSTR, where, "section name table")
    names = []
    for sec in secs:
        start = off + sec["sh_name"]
        end = mm.find(b"\0", start, min(start + 256, off + size)) if sec["sh_name"] < size else -1
        names.append(mm[start:end].decode("ascii", "replace") if end != -1 else "")
    return names


def section_range(mm, sec, size_limit: int, where: str, what: str) -> tuple[int, int]:
    """(offset, size) of a section, checked against the file's size and ``size_limit``."""
    return _table(mm, sec, size_limit, where, what)


def needed_of(elf, mm, secs: list, where: str) -> list[str]:
    """The DT_NEEDED names of the dynamic section."""
    return _needed(elf, mm, secs, where)


def torch_symbols(mm, where: str, *, exports: bool) -> tuple[bool, list[str], list[str]]:
    """(linked against torch, undefined torch names, exported torch names) of the ELF image in ``mm``
    (a ``bytes`` or ``mmap``; ``where`` names the file in errors).  ``exports``: also collect the names
    it defines (only torch's own libraries need it).  A file cut before its section header table (or
    whose ELF header pyelftools cannot read) yields nothing, as the glibc fact does; tables whose sizes
    point past the file or over the bounds, or that pyelftools cannot parse, are BadInput naming ``where``."""
    elf, secs = elf_sections(mm, where)
    return torch_symbols_in(elf, secs, mm, where, exports=exports)


def torch_symbols_in(elf, secs: list, mm, where: str, *, exports: bool) -> tuple[bool, list[str], list[str]]:
    """:func:`torch_symbols` of a file whose sections :func:`elf_sections` read."""
    from elftools.common.exceptions import ELFError
    from elftools.construct import ConstructError

    if elf is None:
        return False, [], []
    try:
        needed = _needed(elf, mm, secs, where)
        undefined, exported = _dynsyms(elf, mm, secs, where)
    except (ELFError, ConstructError, struct.error, ValueError, IndexError, KeyError, OverflowError) as exc:
        raise _bad(where, f"its headers cannot be read ({exc})") from None
    linked = any(TORCH_LIBRARY.match(n) for n in needed) or bool(undefined)
    dec = [n.decode("ascii") for n in sorted(set(undefined))]
    exp = [n.decode("ascii") for n in sorted(set(exported))] if exports else []
    return linked, dec, exp


class _MapStream:
    """A read-only file-like view of an mmap for pyelftools (which seeks and reads)."""

    def __init__(self, mm) -> None:
        self._mm, self._pos = mm, 0

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else (self._pos + pos if whence == 1 else len(self._mm) + pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = len(self._mm) if n is None or n < 0 else min(len(self._mm), self._pos + n)
        out = self._mm[self._pos : end]
        self._pos = max(self._pos, end)
        return out


def demangle(names: list[str]) -> list[str]:
    """``names`` as C++ (``c++filt``, when on PATH: a few names, five seconds at most); as given otherwise."""
    import shutil
    import subprocess

    tool = shutil.which("c++filt")
    if not tool or not names:
        return list(names)
    try:
        done = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return list(names)
    out = done.stdout.splitlines()
    return out if done.returncode == 0 and len(out) == len(names) else list(names)


# --------------------------------------------------------------------------- the compact set

PACK_PREFIX = "v1:"


def symbol_key(name: str) -> int:
    """The 32-bit key of a symbol name in the compact set."""
    return int.from_bytes(hashlib.blake2b(name.encode("ascii", "replace"), digest_size=4).digest(), "big")


def pack_symbols(names: Iterable[str]) -> str:
    """``v1:`` + base64(zlib(sorted unique keys as LEB128 deltas))."""
    keys = sorted({symbol_key(n) for n in names})
    out = bytearray()
    prev = 0
    for k in keys:
        d, prev = k - prev, k
        while True:
            b = d & 0x7F
            d >>= 7
            out.append(b | (0x80 if d else 0))
            if not d:
                break
    return PACK_PREFIX + base64.b64encode(zlib.compress(bytes(out), 9)).decode("ascii")


def unpack_symbols(text: str, where: str) -> frozenset[int]:
    """The keys of :func:`pack_symbols`' text; anything else is BadInput naming ``where``."""
    try:
        if not text.startswith(PACK_PREFIX):
            raise ValueError("no v1: prefix")
        d = zlib.decompressobj()
        raw = d.decompress(base64.b64decode(text[len(PACK_PREFIX) :], validate=True), 64 << 20)
        if d.unconsumed_tail:
            raise ValueError("over 64 MiB")
    except (ValueError, zlib.error) as exc:
        raise BadInput(f"{where}: not a packed symbol set ({exc}); regenerate the manifest.") from None
    keys, cur, shift, acc = set(), 0, 0, 0
    for b in raw:
        acc |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            cur += acc
            keys.add(cur)
            acc, shift = 0, 0
    return frozenset(keys)
