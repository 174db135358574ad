"""Fixtures: small wheels built by the tests.

``build_wheelhouse(dest)`` writes, deterministically and offline (gcc + zipfile,
fixed timestamps), these wheels into one find-links folder ``dest``:

=========================  ===================================  ==================================================
wheel                      requires                             what it is for
=========================  ===================================  ==================================================
numpy 1.26.4 (py3-none-any) -                                   fake numpy 1.x: pure files ``numpy/core/_multiarray_umath.py``
numpy 2.1.0 (py3-none-any)  -                                   fake numpy 2.x: ``numpy/_core/_multiarray_umath.py`` (+ ``numpy/core`` shim)
fakearrow 14.0.2 (cp312,    numpy>=1.16.6                       REAL gcc-built ``fakearrow/lib.cpython-312-x86_64-linux-gnu.so``
  manylinux_2_17_x86_64)                                        whose bytes contain only ``numpy.core._multiarray_umath`` (built against numpy 1.x)
fakearrow 17.0.0 (cp312)    numpy>=1.21                         same .so built "against numpy 2": contains ``numpy._core._multiarray_umath``
                                                                (and the 1.x name, as numpy 2 headers do)
numpy2user 1.0.0 (pure)     numpy>=2                            an overlay package that forces numpy 2
purepkg 1.0.0 (pure)        -                                   a plain pure-python package
newglibc 1.0.0 (cp312,      -                                   REAL .so whose ``.gnu.version_r`` needs ``GLIBC_2.99`` (linked against a stub
  manylinux_2_17 — a lie)                                       ``libc.so.6`` built with a version script); the tag claims 2.17, the ELF says 2.99
oldabi 1.0.0 (cp39-cp39)    -                                   only a cp39 wheel (``_oldabi.cpython-39-x86_64-linux-gnu.so``): wrong Python ABI for 3.12
stableabi 1.0.0 (cp38-abi3) -                                   an ``.abi3.so`` extension (python_abi ``abi3``)
=========================  ===================================  ==================================================

The extensions are real ELF shared objects produced by the host gcc/ld; they
are not importable by CPython (no Python.h is needed) — they exist to be
*scanned*.  All ordinary ones need only old glibc symbol versions (``GLIBC_2.2.5``).

Fixtures (session scope):
  ``wheelhouse``            -> Path of the find-links folder.
  ``make_site_packages``    -> callable ``(dest, names, python_version="3.12") -> Path``:
                               installs requirement strings from the wheelhouse into
                               ``dest`` with ``uv pip install --target`` (offline).
  ``fixture_wheel``         -> callable ``(name, version) -> Path`` of the built wheel file.

Outside pytest: ``build_wheelhouse(Path)`` and ``install_into(dest, names, wheelhouse)``.
"""  # noqa: E501 - verbatim table

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

ZIP_DATE = (1980, 1, 1, 0, 0, 0)
UV = str(Path(sys.executable).with_name("uv"))
PLATFORM_TAG = "manylinux_2_17_x86_64"

# --------------------------------------------------------------------------- C sources

_EXT_C = r"""
#include <string.h>
#include <stdio.h>
/* what numpy's _import_array() embeds: the name of the C-API module it imports
   (exported const arrays: the linker keeps the bytes verbatim in .rodata) */
%(modules)s
const char fake_marker[] = "%(name)s";
int %(init)s(void) {
    /* call real glibc functions so the ELF gets a version-needed section */
    char buf[64];
    snprintf(buf, sizeof buf, "%%s", fake_marker);
    return (int)strlen(buf) + (int)sizeof(numpy_api_0);
}
"""

_STUB_LIBC_C = "int fancy_new_glibc_fn(void) { return 42; }\n"
_STUB_LIBC_MAP = "GLIBC_2.99 { global: fancy_new_glibc_fn; local: *; };\n"
_NEWGLIBC_C = "extern int fancy_new_glibc_fn(void);\nint PyInit__newglibc(void) { return fancy_new_glibc_fn(); }\n"


def _gcc(*args: str, cwd: Path) -> None:
    cmd = ["gcc", *args]
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"gcc failed: {' '.join(cmd)}\n{r.stderr}")


def _compile_ext(work: Path, out_name: str, init: str, modules: list[str], marker: str) -> bytes:
    src = work / f"{out_name}.c"
    decls = "\n".join(f'const char numpy_api_{i}[] = "{m}";' for i, m in enumerate(modules))
    src.write_text(_EXT_C % {"modules": decls, "name": marker, "init": init})
    out = work / out_name
    _gcc("-shared", "-fPIC", "-O0", "-g0", "-Wl,--build-id=none", "-o", str(out), str(src), cwd=work)
    return out.read_bytes()


def _compile_newglibc(work: Path) -> bytes:
    stub_dir = work / "stub"
    stub_dir.mkdir()
    (work / "stub.c").write_text(_STUB_LIBC_C)
    (work / "stub.map").write_text(_STUB_LIBC_MAP)
    _gcc(
        "-shared",
        "-fPIC",
        "-nostdlib",
        "-Wl,-soname,libc.so.6",
        "-Wl,--version-script=stub.map",
        "-o",
        str(stub_dir / "libc.so.6"),
        "stub.c",
        cwd=work,
    )
    (work / "newglibc.c").write_text(_NEWGLIBC_C)
    out = work / "_newglibc.so"
    _gcc(
        "-shared",
        "-fPIC",
        "-nostdlib",
        "-Wl,--build-id=none",
        "-o",
        str(out),
        "newglibc.c",
        str(stub_dir / "libc.so.6"),
        cwd=work,
    )
    return out.read_bytes()


# --------------------------------------------------------------------------- wheel writer


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def write_wheel(
    dest: Path,
    name: str,
    version: str,
    tag: str,
    files: dict[str, bytes | str],
    requires: list[str] = (),
    extras: list[str] = (),
) -> Path:
    """Write a minimal, valid wheel (METADATA, WHEEL, RECORD) deterministically."""
    py, abi, plat = tag.split("-")
    dist = f"{name.replace('-', '_')}-{version}"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Provides-Extra: {e}" for e in extras]
    meta += [f"Requires-Dist: {r}" for r in requires]
    members: dict[str, bytes] = {k: (v.encode() if isinstance(v, str) else v) for k, v in files.items()}
    members[f"{dist}.dist-info/METADATA"] = ("\n".join(meta) + "\n").encode()
    members[f"{dist}.dist-info/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: build-image-tests\n"
        f"Root-Is-Purelib: {'true' if plat == 'any' else 'false'}\nTag: {tag}\n"
    ).encode()
    record = [f"{p},sha256={_b64(hashlib.sha256(b).digest())},{len(b)}" for p, b in members.items()]
    record.append(f"{dist}.dist-info/RECORD,,")
    members[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    path = dest / f"{dist}-{py}-{abi}-{plat}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, data in members.items():
            info = zipfile.ZipInfo(arc, ZIP_DATE)
            info.external_attr = (0o755 if arc.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return path


def build_wheelhouse(dest: Path) -> Path:
    """Build every fixture wheel into ``dest`` (created) and return it."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fxwheels-") as t:
        work = Path(t)
        cp312 = f"cp312-cp312-{PLATFORM_TAG}"
        write_wheel(
            dest,
            "numpy",
            "1.26.4",
            "py3-none-any",
            {
                "numpy/__init__.py": "__version__ = '1.26.4'\nfrom .core import _multiarray_umath\n",
                "numpy/core/__init__.py": "",
                "numpy/core/_multiarray_umath.py": "API_GENERATION = 1\n",
            },
        )
        write_wheel(
            dest,
            "numpy",
            "2.1.0",
            "py3-none-any",
            {
                "numpy/__init__.py": "__version__ = '2.1.0'\nfrom ._core import _multiarray_umath\n",
                "numpy/_core/__init__.py": "",
                "numpy/_core/_multiarray_umath.py": "API_GENERATION = 2\n",
                "numpy/core/__init__.py": "from numpy._core import *  # 1.x compatibility shim\n",
            },
        )
        so1 = _compile_ext(work, "arrow1.so", "PyInit_lib", ["numpy.core._multiarray_umath"], "fakearrow-14")
        so2 = _compile_ext(
            work,
            "arrow2.so",
            "PyInit_lib",
            ["numpy._core._multiarray_umath", "numpy.core._multiarray_umath"],
            "fakearrow-17",
        )
        write_wheel(
            dest,
            "fakearrow",
            "14.0.2",
            cp312,
            {
                "fakearrow/__init__.py": "",
                "fakearrow/lib.cpython-312-x86_64-linux-gnu.so": so1,
            },
            requires=["numpy>=1.16.6"],
        )
        write_wheel(
            dest,
            "fakearrow",
            "17.0.0",
            cp312,
            {
                "fakearrow/__init__.py": "",
                "fakearrow/lib.cpython-312-x86_64-linux-gnu.so": so2,
            },
            requires=["numpy>=1.21"],
        )
        write_wheel(
            dest,
            "numpy2user",
            "1.0.0",
            "py3-none-any",
            {"numpy2user/__init__.py": "import numpy\n"},
            requires=["numpy>=2"],
        )
        write_wheel(dest, "purepkg", "1.0.0", "py3-none-any", {"purepkg/__init__.py": "X = 1\n"})
        write_wheel(
            dest,
            "newglibc",
            "1.0.0",
            cp312,
            {
                "newglibc/__init__.py": "",
                "newglibc/_newglibc.cpython-312-x86_64-linux-gnu.so": _compile_newglibc(work),
            },
        )
        write_wheel(
            dest,
            "oldabi",
            "1.0.0",
            f"cp39-cp39-{PLATFORM_TAG}",
            {
                "oldabi/__init__.py": "",
                "oldabi/_oldabi.cpython-39-x86_64-linux-gnu.so": _compile_ext(
                    work, "oldabi.so", "PyInit__oldabi", ["no numpy here"], "oldabi"
                ),
            },
        )
        write_wheel(
            dest,
            "stableabi",
            "1.0.0",
            f"cp38-abi3-{PLATFORM_TAG}",
            {
                "stableabi/__init__.py": "",
                "stableabi/_stable.abi3.so": _compile_ext(
                    work, "stable.so", "PyInit__stable", ["no numpy here"], "stableabi"
                ),
            },
        )
    return dest


def install_into(
    dest: Path,
    names: list[str],
    wheelhouse: Path,
    python_version: str = "3.12",
    platform: str = "x86_64-manylinux_2_35",
) -> Path:
    """``uv pip install --target dest`` of requirement strings, offline, from ``wheelhouse``.

    ``--link-mode copy``: tests may edit installed files; hardlinks would corrupt uv's cache.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        UV,
        "pip",
        "install",
        "--quiet",
        "--link-mode",
        "copy",
        "--target",
        str(dest),
        "--no-index",
        "--find-links",
        str(wheelhouse),
        "--python-version",
        python_version,
        "--python-platform",
        platform,
        "--no-build",
        *names,
    ]
    env = {**os.environ, "UV_NO_CONFIG": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"uv pip install failed: {' '.join(cmd)}\n{r.stderr}")
    return dest


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the fixture wheels")
    return build_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture(scope="session")
def make_site_packages(wheelhouse):
    def _make(dest: Path, names: list[str], python_version: str = "3.12") -> Path:
        return install_into(dest, names, wheelhouse, python_version)

    return _make


@pytest.fixture(scope="session")
def fixture_wheel(wheelhouse):
    def _get(name: str, version: str) -> Path:
        hits = sorted(wheelhouse.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
        if not hits:
            raise LookupError(f"no fixture wheel {name} {version} in {wheelhouse}")
        return hits[0]

    return _get
