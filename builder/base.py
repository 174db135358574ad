"""Base manifest stage: read what a base already holds, with binary facts.

Three layers, each usable on its own:

* the **binary scanner** — :func:`scan_files`, :func:`scan_wheel`,
  :func:`scan_site_packages` — reads facts from files (ELF version-needed
  sections through pyelftools, numpy C-API module strings, extension suffixes,
  wheel tags), never from package names;
* the **snapshot** — :func:`snapshot_site_packages` and :func:`snapshot_image` —
  turns a site-packages directory or a local container image into a
  :class:`builder.manifest.BaseManifest`;
* a tiny **docker-CLI adapter** (:func:`_docker`) through which every engine
  call goes; it never pulls.

Facts per distribution (see :class:`builder.manifest.DistFacts`):

``binary``      the distribution ships at least one ELF file;
``extensions``  number of ELF shared objects (``*.so`` / ``*.so.N``);
``numpy_abi``   per shared object, which numpy C-API generation it imports:
                bytes contain ``numpy._core._multiarray_umath`` -> ``"2"``
                (numpy>=2 headers; they also carry the 1.x name as a fallback),
                only ``numpy.core._multiarray_umath`` -> ``"1"``.  numpy's own
                files are never counted;
``glibc``       highest ``GLIBC_x.y`` in the ELF ``.gnu.version_r`` sections,
                compared as versions (``2.9 < 2.17``);
``python_abi``  the wheel's ABI tag (``cp312``, ``abi3``, ``none``), else the
                extension-module suffixes (``.cpython-312-...so``, ``.abi3.so``).
"""

from __future__ import annotations

import mmap
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath
from typing import IO, Callable, Iterable, Iterator

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection
from packaging.version import InvalidVersion, Version

from .errors import BadInput, EngineUnavailable, ExternalToolError
from .manifest import BaseManifest, DistFacts, Distribution
from .util import canonical_name

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


def _scan_elf_file(path: Path, *, want_numpy: bool) -> _FileFacts:
    with open(path, "rb") as fh:
        if fh.read(4) != ELF_MAGIC:
            return _FileFacts()
        facts = _FileFacts(is_elf=True, is_shared_object=bool(_SO_NAME.search(path.name)))
        try:
            fh.seek(0)
            facts.glibc = _elf_glibc(fh)
        except (ELFError, ValueError, KeyError, AssertionError) as exc:  # truncated/odd ELF: still binary
            facts.glibc = None
            _ = exc
        if want_numpy and facts.is_shared_object:
            size = os.fstat(fh.fileno()).st_size
            if size:
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
        return sorted(cp, key=lambda t: int(t[2:]))[-1] if len(cp) == 1 else ".".join(sorted(cp))
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


def _might_be_elf(name: str) -> bool:
    suffix = PurePosixPath(name).suffix.lower()
    return suffix not in _TEXT_SUFFIXES


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
        p = Path(p)
        if not _might_be_elf(p.name):
            continue
        try:
            if not p.is_file():
                continue
            ff = _scan_elf_file(p, want_numpy=not is_numpy)
        except OSError:
            continue
        if not ff.is_elf:
            continue
        facts.binary = True
        if ff.is_shared_object:
            facts.extensions += 1
            so_names.append(p.name)
        if ff.numpy_gen:
            facts.numpy_abi[ff.numpy_gen] += 1
        if ff.glibc is not None and (best_glibc is None or ff.glibc > best_glibc):
            best_glibc = ff.glibc
    facts.glibc = str(best_glibc) if best_glibc is not None else None
    tag_abi = python_abi_from_tags(wheel_tags) if wheel_tags is not None else None
    facts.python_abi = tag_abi or _python_abi_from_suffixes(so_names) or "none"
    return facts


# --------------------------------------------------------------------------- wheels


_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


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
                raise BadInput(f"wheel {path}: no .dist-info/METADATA with Name and Version, and the file name is not a wheel name.")
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


def _record_paths(dist_info: Path) -> list[Path]:
    record = dist_info / "RECORD"
    if not record.is_file():
        return []
    root = dist_info.parent
    out: list[Path] = []
    for line in record.read_text(encoding="utf-8", errors="replace").splitlines():
        rel = line.rsplit(",", 2)[0] if line.count(",") >= 2 else line.split(",")[0]
        rel = rel.strip().strip('"')
        if rel:
            out.append(root / rel)
    return out


def iter_dist_infos(site_packages: Path) -> Iterator[Path]:
    yield from sorted(p for p in Path(site_packages).glob("*.dist-info") if p.is_dir())


def scan_site_packages(
    site_packages: Path,
    *,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Distribution]:
    """Every ``*.dist-info`` under ``site_packages``: name and version from
    METADATA, facts from the files its RECORD lists.  Keyed by canonical name.

    ``progress(name, index, total)`` is called before each distribution.
    """
    site_packages = Path(site_packages)
    if not site_packages.is_dir():
        raise BadInput(f"site-packages directory {site_packages} does not exist or is not a directory.")
    dist_infos = list(iter_dist_infos(site_packages))
    dists: dict[str, Distribution] = {}
    for idx, di in enumerate(dist_infos):
        meta = di / "METADATA"
        if not meta.is_file():
            raise BadInput(f"{di}: no METADATA file; the site-packages directory looks damaged.")
        name, version = _parse_metadata(meta.read_text(encoding="utf-8", errors="replace"))
        if not name or not version:
            raise BadInput(f"{meta}: missing Name or Version header.")
        if progress:
            progress(name, idx, len(dist_infos))
        tags: list[str] = []
        wheel = di / "WHEEL"
        if wheel.is_file():
            tags = HeaderParser().parsestr(wheel.read_text(encoding="utf-8", errors="replace")).get_all("Tag") or []
        facts = scan_files(_record_paths(di), is_numpy=canonical_name(name) == "numpy", wheel_tags=tags or None)
        key = canonical_name(name)
        if key in dists:
            raise BadInput(
                f"{site_packages}: distribution {name} is installed twice "
                f"({dists[key].version} and {version}); the directory is inconsistent."
            )
        dists[key] = Distribution(name=name, version=version, facts=facts)
    return dists


# --------------------------------------------------------------------------- snapshot


def _check_xy(value: str, flag: str) -> str:
    if not re.fullmatch(r"\d+\.\d+", value or ""):
        raise BadInput(f"{flag} must look like X.Y (e.g. 3.12), got {value!r}.")
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
) -> BaseManifest:
    """A ``reconstructed`` manifest from a directory on this machine."""
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
    dists = scan_site_packages(site_packages, progress=progress)
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
        provenance_method=method or f"scanned the directory {site_packages} with build-image base snapshot --site-packages",
        distributions=dists,
    )
