"""The GPU architectures a CUDA binary carries: its fat binary's entry headers, read without ``cuobjdump``.

A CUDA library keeps its kernels in the ELF section ``.nv_fatbin``: one or more fat binary containers,
each a 16-byte header (``fatbinary_section.h``: magic ``0xBA55ED50``, version, header size, size of the
entries that follow) and entries, each with its own header::

    u16 kind            1 = PTX (JIT-compiled by the driver for its GPU), 2 = ELF cubin (SASS for one arch)
    u16 version
    u32 header_size     offset of the payload from the start of this entry
    u64 payload_size    the entry ends at header_size + payload_size
    u32 compressed_size
    u32 (unused here)
    u16 minor, major    (not read)
    u32 arch            compute capability x 10 + minor: 90 = sm_90, 100 = sm_100, 120 = sm_120

(the layout the open fat binary readers use: gpgpu-sim's and cricket's ``fatbin`` decoders). Only headers
are read, never payloads; every size is checked against the section and bounded
(:data:`MAX_ENTRIES`): a container or entry that lies about its size is
:class:`~builder.errors.BadInput` naming the file.

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

    @property
    def empty(self) -> bool:
        return not self.sass and not self.ptx


def _bad(where: str, what: str) -> BadInput:
    return BadInput(f"{where}: its .nv_fatbin section {what}; the CUDA binary is damaged or not what it claims.")


def parse_fatbin(blob, where: str, start: int = 0, end: int | None = None) -> CudaFacts:
    """The architectures of the fat binary containers in ``blob[start:end]`` (a section's bytes, read in place:
    ``blob`` may be an mmap). Padding between containers (zeros) is skipped; anything else that is not a
    container header is BadInput. Positions in messages count from ``start``."""
    out = CudaFacts()
    base = start
    pos, end, seen = start, len(blob) if end is None else end, 0
    while pos + _CONTAINER.size <= end:
        magic, _ver, head, size = _CONTAINER.unpack_from(blob, pos)
        if magic == 0:  # alignment padding between containers
            pos += 8
            continue
        if magic != FATBIN_MAGIC:
            raise _bad(
                where, f"holds {magic:#010x} at byte {pos - base} where a fat binary header (0xba55ed50) belongs"
            )
        if head < _CONTAINER.size or pos + head + size > end:
            raise _bad(
                where, f"has a container at byte {pos - base} claiming {head}+{size} bytes past its end ({end - base})"
            )
        epos, eend = pos + head, pos + head + size
        while epos + _ENTRY.size <= eend:
            kind, _v, ehead, payload, _c, _u, _minor, _major, arch = _ENTRY.unpack_from(blob, epos)
            if ehead < _ENTRY.size or epos + ehead + payload > eend:
                raise _bad(
                    where, f"has an entry at byte {epos - base} claiming {ehead}+{payload} bytes past its container"
                )
            seen += 1
            if seen > MAX_ENTRIES:
                raise _bad(where, f"holds more than {MAX_ENTRIES} entries")
            if kind in (KIND_ELF, KIND_PTX) and arch not in ARCHS:
                raise _bad(where, f"has an entry at byte {epos - base} for architecture {arch}, which no GPU has")
            if kind == KIND_ELF:
                out.sass.add(arch)
            elif kind == KIND_PTX:
                out.ptx.add(arch)
            epos += ehead + payload
        pos = eend
    return out


def cuda_facts(mm, where: str) -> CudaFacts:
    """The fat binary facts of the ELF image in ``mm`` (bytes or mmap): its ``.nv_fatbin`` section and its
    ``libcudart.so.N``. Nothing for a file without section headers."""
    elf, secs = elfsyms.elf_sections(mm, where)
    return cuda_facts_in(elf, secs, mm, where)


def cuda_facts_in(elf, secs: list, mm, where: str) -> CudaFacts:
    """:func:`cuda_facts` of a file whose sections :func:`builder.resolve.elfsyms.elf_sections` read."""
    out = CudaFacts()
    if elf is None:
        return out
    names = elfsyms.section_names(elf, mm, secs, where)
    for sec, name in zip(secs, names, strict=True):
        if name == ".nv_fatbin" and sec["sh_type"] != "SHT_NOBITS":
            off, size = elfsyms.section_range(mm, sec, len(mm), where, ".nv_fatbin section")
            got = parse_fatbin(mm, where, off, off + size)
            out.sass |= got.sass
            out.ptx |= got.ptx
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
