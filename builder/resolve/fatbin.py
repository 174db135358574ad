"""The GPU architectures a CUDA binary carries: its fat binary's entry headers, read without ``cuobjdump``.

A CUDA library keeps its kernels in fat binary containers, each a 16-byte header (``fatbinary_section.h``:
magic ``0xBA55ED50``, version, header size, size of the entries that follow) and entries, each with its own
header::

    u16 kind            1 = PTX (JIT-compiled by the driver for its GPU), 2 = ELF cubin (SASS for one arch)
    u16 version
    u32 header_size     offset of the payload from the start of this entry
    u64 payload_size    the entry ends at header_size + payload_size
    u32 compressed_size
    u32 (unused here)
    u16 minor, major    (not read)
    u32 arch            compute capability x 10 + minor: 90 = sm_90, 100 = sm_100, 120 = sm_120

(the layout the open fat binary readers use: gpgpu-sim's and cricket's ``fatbin`` decoders). nvcc puts them
in the section ``.nv_fatbin``, read container after container (:func:`parse_fatbin`); NVIDIA's own libraries
also keep them in other allocated sections (libcufft.so: one container in ``.nv_fatbin``, ~24,000 in
``.ldata``; cuBLASLt: ``.cask_resource``; cuSPARSE: ``.rodata``), where they are found by their header
(magic, version 1, header size 16) with ``bytes.find`` over the mapped file (:func:`scan_fatbins`). Only
headers are read, never payloads; every size is checked against its section and bounded
(:data:`MAX_ENTRIES`, :data:`MAX_CONTAINERS`, :data:`MAX_SCAN`): a container or entry that lies about its
size is :class:`~builder.errors.BadInput` naming the file and the section.

:func:`cuda_facts` returns the SASS and PTX architectures and the CUDA runtime major the file links
(``libcudart.so.13`` in DT_NEEDED; None when it links none: a static runtime says nothing here).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from builder.errors import BadInput
from builder.resolve import elfsyms

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX = 1
KIND_ELF = 2
#: the most entries one file's fat binaries may hold (torch's libtorch_cuda.so: ~10^4)
MAX_ENTRIES = 1_000_000
#: the most containers one file may hold outside ``.nv_fatbin`` (libcufft.so: ~24,000)
MAX_CONTAINERS = 1_000_000
#: the most bytes of one file's sections searched for containers (overlapping sections count once)
MAX_SCAN = 4 << 30
#: the start of a container header as nvcc writes it: magic, version 1, header size 16
_NEEDLE = struct.pack("<IHH", FATBIN_MAGIC, 1, 16)
_SHF_ALLOC = 0x2
_SHF_EXECINSTR = 0x4
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHI")
# auditwheel renames: libcudart.faf08d9a.so.13; the major in ASCII digits, 1-999 (what a manifest records)
_CUDART = re.compile(r"^libcudart(?:[.-][0-9a-f]{8})?\.so\.([1-9][0-9]{0,2})(?:\.|$)")
#: the architectures (compute capability x 10) a fat binary entry may name, and how many distinct ones one
#: distribution may carry: the one rule of the scanner that writes ``cuda_sass``/``cuda_ptx`` and of the
#: manifest reader (:func:`builder.resolve.manifest._archs`)
ARCHS = range(10, 1000)
MAX_ARCHS = 256


@dataclass
class CudaFacts:
    """What one file's fat binaries hold: SASS and PTX architectures (``90`` = sm_90) and the CUDA runtime major."""

    sass: set[int] = field(default_factory=set)
    ptx: set[int] = field(default_factory=set)
    runtime: int | None = None
    seen: int = 0  # entries read (bounded by MAX_ENTRIES)
    containers: int = 0  # containers found outside .nv_fatbin (bounded by MAX_CONTAINERS)

    @property
    def empty(self) -> bool:
        return not self.sass and not self.ptx


def _bad(where: str, what: str, section: str = ".nv_fatbin") -> BadInput:
    return BadInput(f"{where}: its {section} section {what}; the CUDA binary is damaged or not what it claims.")


def _container(blob, pos: int, base: int, end: int, out: CudaFacts, where: str, section: str) -> int:
    """Read the container whose header starts at ``pos`` into ``out`` (bounded by ``end``, the end of its
    section; ``out.seen`` counts entries against :data:`MAX_ENTRIES`); returns where it ends."""
    _magic, _ver, head, size = _CONTAINER.unpack_from(blob, pos)
    if head < _CONTAINER.size or pos + head + size > end:
        raise _bad(
            where,
            f"has a container at byte {pos - base} claiming {head}+{size} bytes past its end ({end - base})",
            section,
        )
    epos, eend = pos + head, pos + head + size
    while epos + _ENTRY.size <= eend:
        kind, _v, ehead, payload, _c, _u, _minor, _major, arch = _ENTRY.unpack_from(blob, epos)
        if ehead < _ENTRY.size or epos + ehead + payload > eend:
            raise _bad(
                where,
                f"has an entry at byte {epos - base} claiming {ehead}+{payload} bytes past its container",
                section,
            )
        out.seen += 1
        if out.seen > MAX_ENTRIES:
            raise _bad(where, f"holds more than {MAX_ENTRIES} entries", section)
        if kind in (KIND_ELF, KIND_PTX) and arch not in ARCHS:
            raise _bad(where, f"has an entry at byte {epos - base} for architecture {arch}, which no GPU has", section)
        if kind == KIND_ELF:
            out.sass.add(arch)
        elif kind == KIND_PTX:
            out.ptx.add(arch)
        epos += ehead + payload
    return eend


def parse_fatbin(blob, where: str, start: int = 0, end: int | None = None, out: CudaFacts | None = None) -> CudaFacts:
    """The architectures of the fat binary containers in ``blob[start:end]`` (a ``.nv_fatbin`` section's bytes,
    read in place: ``blob`` may be an mmap), added to ``out`` when given. Padding between containers (zeros) is
    skipped; anything else that is not a container header is BadInput. Positions in messages count from
    ``start``."""
    out = CudaFacts() if out is None else out
    pos, end = start, len(blob) if end is None else end
    while pos + _CONTAINER.size <= end:
        magic = _CONTAINER.unpack_from(blob, pos)[0]
        if magic == 0:  # alignment padding between containers
            pos += 8
            continue
        if magic != FATBIN_MAGIC:
            raise _bad(
                where, f"holds {magic:#010x} at byte {pos - start} where a fat binary header (0xba55ed50) belongs"
            )
        pos = _container(blob, pos, start, end, out, where, ".nv_fatbin")
    return out


def scan_fatbins(blob, where: str, section: str, start: int, end: int, out: CudaFacts) -> CudaFacts:
    """Add the containers found in ``blob[start:end]`` (a section other than ``.nv_fatbin``, holding other data
    too) to ``out``: each header found by ``bytes.find`` is read and the search goes on after its container.
    More than :data:`MAX_CONTAINERS` in one file is BadInput, as is a header that lies about its sizes."""
    pos = blob.find(_NEEDLE, start, end)
    while pos != -1 and pos + _CONTAINER.size <= end:
        out.containers += 1
        if out.containers > MAX_CONTAINERS:
            raise _bad(where, f"brings the file over {MAX_CONTAINERS} fat binary containers", section)
        pos = blob.find(_NEEDLE, _container(blob, pos, start, end, out, where, section), end)
    return out


def cuda_facts(mm, where: str) -> CudaFacts:
    """The fat binary facts of the ELF image in ``mm`` (bytes or mmap): the containers of its allocated
    sections and its ``libcudart.so.N``. Nothing for a file without section headers."""
    elf, secs = elfsyms.elf_sections(mm, where)
    return cuda_facts_in(elf, secs, mm, where)


def cuda_facts_in(elf, secs: list, mm, where: str) -> CudaFacts:
    """:func:`cuda_facts` of a file whose sections :func:`builder.resolve.elfsyms.elf_sections` read: every
    data section loaded with the file that has bytes in it (``SHF_ALLOC``, not ``SHF_EXECINSTR``, not
    ``SHT_NOBITS``) and ``.nv_fatbin`` are read, ``.nv_fatbin`` container after container and the others by
    search (code is not: cuDNN's instructions hold the header's bytes as an operand). A byte range shared by
    several sections is searched once (a lying section table cannot multiply the work), and more than
    :data:`MAX_SCAN` bytes to search is BadInput naming the file."""
    out = CudaFacts()
    if elf is None:
        return out
    names = elfsyms.section_names(elf, mm, secs, where)
    others = []  # (offset, end, name) of the sections searched
    for sec, name in zip(secs, names, strict=True):
        if sec["sh_type"] == "SHT_NOBITS" or not sec["sh_size"]:
            continue
        if name != ".nv_fatbin" and (sec["sh_flags"] & (_SHF_ALLOC | _SHF_EXECINSTR)) != _SHF_ALLOC:
            continue  # not loaded, or code (whose instructions may hold the magic as an operand)
        off, size = elfsyms.section_range(mm, sec, len(mm), where, f"{name or 'unnamed'} section")
        if name == ".nv_fatbin":
            parse_fatbin(mm, where, off, off + size, out)
        else:
            others.append((off, off + size, name or "unnamed"))
    reach = total = 0  # searched up to; bytes searched
    for off, end, name in sorted(others):
        lo = max(off, reach)
        if lo >= end:
            continue
        total += end - lo
        if total > MAX_SCAN:
            raise _bad(where, f"brings the bytes to search for fat binaries over {MAX_SCAN}", name)
        scan_fatbins(mm, where, name, lo, end, out)
        reach = end
    for lib in elfsyms.needed_of(elf, mm, secs, where):
        m = _CUDART.match(lib)
        if m:
            out.runtime = int(m.group(1))
    return out


def covers(sass, ptx, arch: int) -> bool:
    """Can kernels with these SASS and PTX architectures run on a GPU of compute capability ``arch`` (x 10)?
    SASS for ``sm_XY`` runs on GPUs of major X and minor >= Y; PTX for ``compute_XY`` is compiled by the
    driver for any GPU >= XY."""
    major, minor = divmod(arch, 10)
    return any(s // 10 == major and s % 10 <= minor for s in sass) or any(p <= arch for p in ptx)


def arch_name(arch: int) -> str:
    """``90`` -> ``sm_90``."""
    return f"sm_{arch}"
