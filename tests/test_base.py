"""Base manifest stage: binary scanner, snapshot command, shipped manifest."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.base import platform_for, python_abi_from_tags, scan_files, scan_site_packages, scan_wheel
from builder.cli import main
from builder.errors import BadInput
from builder.manifest import load_manifest
from tests.fx_wheels import write_wheel

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "lockfiles" / "base" / "vllm-openai-v0.26.0.json"


def _gcc_so(tmp: Path, name: str, src: str, *extra: str) -> Path:
    c = tmp / f"{name}.c"
    c.write_text(src)
    out = tmp / name
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-o", str(out), str(c), *extra], check=True, capture_output=True)
    return out


# --------------------------------------------------------------------------- scanner on fixture wheels


def test_numpy1_built_extension_is_counted_as_generation_1(fixture_wheel):
    name, version, facts = scan_wheel(fixture_wheel("fakearrow", "14.0.2"))
    assert (name, version) == ("fakearrow", "14.0.2")
    assert facts.binary and facts.extensions == 1
    assert facts.numpy_abi == {"1": 1, "2": 0}
    assert facts.numpy_generations == {"1"}
    assert facts.python_abi == "cp312"


def test_numpy2_built_extension_is_generation_2_even_with_the_1x_fallback_string(fixture_wheel):
    _, _, facts = scan_wheel(fixture_wheel("fakearrow", "17.0.0"))
    assert facts.numpy_abi == {"1": 0, "2": 1}


def test_glibc_comes_from_the_elf_not_the_wheel_tag(fixture_wheel):
    whl = fixture_wheel("newglibc", "1.0.0")
    assert "manylinux_2_17" in whl.name  # the tag lies
    _, _, facts = scan_wheel(whl)
    assert facts.glibc == "2.99"


def test_pure_wheels_have_no_binary_facts(fixture_wheel):
    for name, version in [("purepkg", "1.0.0"), ("numpy2user", "1.0.0"), ("numpy", "2.1.0")]:
        _, _, facts = scan_wheel(fixture_wheel(name, version))
        assert not facts.binary and facts.extensions == 0 and facts.glibc is None
        assert facts.python_abi == "none"


def test_python_abi_from_wheel_tags(fixture_wheel):
    assert scan_wheel(fixture_wheel("oldabi", "1.0.0"))[2].python_abi == "cp39"
    assert scan_wheel(fixture_wheel("stableabi", "1.0.0"))[2].python_abi == "abi3"
    assert python_abi_from_tags(["cp312-cp312-manylinux_2_17_x86_64", "cp312-cp312-manylinux2014_x86_64"]) == "cp312"
    assert python_abi_from_tags(["py3-none-manylinux_2_17_x86_64"]) == "none"
    assert python_abi_from_tags([]) is None


def test_numpy_own_extensions_are_not_counted_as_built_against_numpy(tmp_path):
    so = _gcc_so(tmp_path, "_multiarray_umath.so",
                 'const char m[] = "numpy._core._multiarray_umath"; int f(void){return sizeof m;}\n')
    assert scan_files([so], is_numpy=True).numpy_abi == {"1": 0, "2": 0}
    assert scan_files([so], is_numpy=False).numpy_abi == {"1": 0, "2": 1}


def test_glibc_versions_compare_as_versions_not_strings(tmp_path):
    # memcpy is GLIBC_2.14 on x86_64; printf is GLIBC_2.2.5.  As strings "2.2.5" > "2.14".
    a = _gcc_so(tmp_path, "a.so", '#include <stdio.h>\nint f(void){return printf("x");}\n')
    b = _gcc_so(tmp_path, "b.so", "#include <string.h>\nvoid *f(void*d,const void*s,size_t n){return memcpy(d,s,n);}\n")
    assert scan_files([a]).glibc == "2.2.5"
    assert scan_files([b]).glibc == "2.14"
    assert scan_files([a, b]).glibc == "2.14"
    assert scan_files([b, a]).glibc == "2.14"


def test_suffix_gives_python_abi_without_wheel_tags(tmp_path):
    so = _gcc_so(tmp_path, "m.cpython-312-x86_64-linux-gnu.so", "int f(void){return 1;}\n")
    facts = scan_files([so])
    assert facts.python_abi == "cp312" and facts.extensions == 1 and facts.binary


def test_non_elf_so_and_missing_files_are_not_binary(tmp_path):
    fake = tmp_path / "not_really.so"
    fake.write_bytes(b"#!/bin/sh\necho numpy.core._multiarray_umath\n")
    facts = scan_files([fake, tmp_path / "missing.so"])
    assert not facts.binary and facts.extensions == 0 and facts.numpy_abi == {"1": 0, "2": 0}


def test_executables_are_binary_but_not_extensions(tmp_path):
    c = tmp_path / "tool.c"
    c.write_text("int main(void){return 0;}\n")
    exe = tmp_path / "tool"
    subprocess.run(["gcc", "-o", str(exe), str(c)], check=True)
    facts = scan_files([exe])
    assert facts.binary and facts.extensions == 0 and facts.glibc is not None


def test_scan_wheel_rejects_a_non_zip(tmp_path):
    bad = tmp_path / "broken-1.0-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(BadInput, match="broken-1.0"):
        scan_wheel(bad)


def test_scan_wheel_uses_metadata_name_over_file_name(tmp_path):
    whl = write_wheel(tmp_path, "Real_Name", "2.0", "py3-none-any", {"real_name/__init__.py": ""})
    renamed = whl.rename(tmp_path / "other-9.9-py3-none-any.whl")
    assert scan_wheel(renamed)[:2] == ("Real_Name", "2.0")


def test_scan_site_packages_reads_every_dist_info(tmp_path, make_site_packages):
    sp = make_site_packages(tmp_path / "sp", ["fakearrow==14.0.2", "numpy==1.26.4", "purepkg", "newglibc", "stableabi"])
    dists = scan_site_packages(sp)
    assert set(dists) == {"fakearrow", "numpy", "purepkg", "newglibc", "stableabi"}
    assert dists["fakearrow"].version == "14.0.2"
    assert dists["fakearrow"].facts.numpy_abi == {"1": 1, "2": 0}
    assert dists["numpy"].version == "1.26.4" and not dists["numpy"].facts.binary
    assert dists["newglibc"].facts.glibc == "2.99"
    assert dists["stableabi"].facts.python_abi == "abi3"
    assert dists["purepkg"].facts.python_abi == "none"


def test_scan_site_packages_missing_dir(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        scan_site_packages(tmp_path / "nope")


def test_platform_for():
    assert platform_for("2.35") == "x86_64-manylinux_2_35"
