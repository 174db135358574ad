"""Base manifest stage: binary scanner, snapshot command, shipped manifest."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import main
from builder.errors import BadInput
from builder.resolve.base import platform_for
from builder.resolve.manifest import load_manifest
from builder.resolve.scanner import python_abi_from_tags, scan_files, scan_site_packages, scan_wheel
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
    so = _gcc_so(
        tmp_path,
        "_multiarray_umath.so",
        'const char m[] = "numpy._core._multiarray_umath"; int f(void){return sizeof m;}\n',
    )
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


# --------------------------------------------------------------------------- snapshot command


def _snap(*args: str):
    return CliRunner().invoke(main, ["base", "snapshot", *args], catch_exceptions=False)


def test_snapshot_site_packages_writes_a_reconstructed_manifest(tmp_path, make_site_packages):
    sp = make_site_packages(
        tmp_path / "lib" / "python3.12" / "dist-packages", ["fakearrow==14.0.2", "numpy==1.26.4", "purepkg"]
    )
    out = tmp_path / "m.json"
    r = _snap(
        "--site-packages",
        str(sp),
        "--glibc",
        "2.35",
        "--cuda",
        "13.0",
        "--method",
        "made by a test",
        "-o",
        str(out),
        "--json",
    )
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert summary["distributions"] == 3 and summary["numpy_1x_built"] == ["fakearrow"]
    m = load_manifest(out)
    assert m.python_version == "3.12"  # read from the lib/python3.12 path
    assert m.python_abi == "cp312" and m.glibc == "2.35" and m.cuda == "13.0"
    assert m.platform == "x86_64-manylinux_2_35"
    assert (m.provenance_kind, m.provenance_method) == ("reconstructed", "made by a test")
    assert m.get("FakeArrow").facts.numpy_abi == {"1": 1, "2": 0}
    assert m.get("numpy").version == "1.26.4"


@pytest.mark.parametrize(
    "args, needle",
    [
        ([], "exactly one of"),
        (["--image", "x:1", "--site-packages", "."], "exactly one of"),
        (["--site-packages", "."], "--glibc X.Y is required"),
        (["--site-packages", ".", "--glibc", "2.35", "--python", "3"], "--python must look like X.Y"),
        (["--site-packages", ".", "--glibc", "2.35.1", "--python", "3.12"], "--glibc must look like X.Y (e.g. 2.35)"),
        (
            ["--site-packages", ".", "--glibc", "2.35", "--python", "3.12", "--cuda", "13"],
            "--cuda must look like X.Y (e.g. 13.0)",
        ),
        (["--site-packages", "/nonexistent/dir", "--glibc", "2.35", "--python", "3.12"], "does not exist"),
        (["--site-packages", "tests", "--glibc", "2.35", "--python", "3.12"], "holds no installed distribution"),
        (["--image", "x:1", "--method", "m"], "only apply to --site-packages"),
    ],
)
def test_snapshot_bad_input_exits_2_and_writes_nothing(tmp_path, args, needle):
    out = tmp_path / "m.json"
    r = CliRunner().invoke(main, ["base", "snapshot", *args, "-o", str(out)])
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert not out.exists()


def test_snapshot_does_not_replace_a_good_manifest_on_failure(tmp_path, make_site_packages):
    sp = make_site_packages(tmp_path / "sp", ["purepkg"])
    out = tmp_path / "m.json"
    assert _snap("--site-packages", str(sp), "--glibc", "2.35", "--python", "3.12", "-o", str(out)).exit_code == 0
    before = out.read_bytes()
    (sp / "purepkg-1.0.0.dist-info" / "METADATA").write_text("Name: purepkg\n")  # Version lost
    r = CliRunner().invoke(
        main, ["base", "snapshot", "--site-packages", str(sp), "--glibc", "2.35", "--python", "3.12", "-o", str(out)]
    )
    assert r.exit_code == 2 and "missing Name or Version" in r.output
    assert out.read_bytes() == before


# --------------------------------------------------------------------------- the shipped manifest


def test_shipped_manifest_is_the_vllm_0_26_0_floor():
    m = load_manifest(SHIPPED)
    assert m.image_ref == "vllm/vllm-openai:v0.26.0" and m.image_digest is None
    assert (m.python_version, m.python_abi, m.glibc, m.cuda) == ("3.12", "cp312", "2.35", "13.0")
    assert m.platform == "x86_64-manylinux_2_35"
    assert m.site_packages == "/usr/local/lib/python3.12/dist-packages"
    assert m.provenance_kind == "reconstructed"
    sdist_sha = "23e9fa19d7e20ce7dcc1c074d41503e2116d23f19e688f5d5ea91b741f958502"
    for needle in (
        "uv pip install --target",
        "--exclude-newer 2026-07-25",
        "not scanned",
        f"vllm-0.26.0.tar.gz (sha256 {sdist_sha})",
    ):
        assert needle in m.provenance_method
    assert "unverified" not in m.provenance_method
    assert m.provenance_recipe["sdist"] == {"filename": "vllm-0.26.0.tar.gz", "sha256": sdist_sha}
    steps = m.provenance_recipe["steps"]
    assert [s["action"] for s in steps] == [
        "install",
        "install",
        "skip",
        "install",
        "install",
        "skip",
        "install",
        "install",
        "skip",
    ]
    assert steps[6]["moved"]["numpy"] == "2.3.5 -> 2.2.6"  # the kv-connectors step moves the earlier pin
    assert m.get("vllm").version == "0.26.0"
    assert m.get("torch").version == "2.11.0"
    assert m.get("numpy").version == "2.2.6"
    assert set(m.unversioned) == {"flashinfer-jit-cache", "flashinfer-cubin", "deep-ep", "mooncake-transfer-engine"}
    assert m.get("mooncake-transfer-engine") is None  # the image's comes from a URL: the index's is left out
    assert m.uv_overrides is None  # no NCCL_VERSION override before 0.27.0
    # binary facts were read: torch ships extensions built against numpy 2, needs a glibc <= the base's
    torch = m.get("torch").facts
    assert torch.binary and torch.extensions > 0 and torch.numpy_abi["2"] >= 1 and torch.python_abi == "cp312"
    from packaging.version import Version

    for d in m.distributions.values():
        if d.facts.glibc:
            assert Version(d.facts.glibc) <= Version(m.glibc), d
    assert not m.get("numpy").facts.numpy_abi["1"] and not m.get("numpy").facts.numpy_abi["2"]


# --------------------------------------------------------------------------- --image (docker)

from tests.fx_docker import DOCKER, missing  # noqa: E402 - the CLI the tool itself runs


def _docker(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def tiny_images(tmp_path_factory, make_site_packages):
    """Two images made with `docker import`: one with a Debian-style python3.12 layout, one without python."""
    import os
    import tarfile

    if _docker("info").returncode != 0:
        missing("no Docker engine")
    tmp = tmp_path_factory.mktemp("tinyimg")
    sp = make_site_packages(tmp / "sp", ["fakearrow==14.0.2", "numpy==1.26.4", "newglibc", "purepkg"])
    libc = Path(os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6"))
    tags = {"py": "build-image-test/tiny-python:1", "nopy": "build-image-test/tiny-nopython:1"}

    def add_bytes(tar, name, data: bytes, mode=0o644):
        import io

        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), mode
        tar.addfile(info, io.BytesIO(data))

    def make(tag: str, with_python: bool):
        path = tmp / f"{tag.split('/')[-1].replace(':', '_')}.tar"
        with tarfile.open(path, "w") as tar:
            add_bytes(tar, "etc/os-release", b'PRETTY_NAME="Tiny Test Linux 1.0"\nNAME="Tiny"\n')
            tar.add(libc, arcname=f"lib/x86_64-linux-gnu/{libc.name}")
            if libc.name != "libc.so.6":
                link = tarfile.TarInfo("lib/x86_64-linux-gnu/libc.so.6")
                link.type, link.linkname = tarfile.SYMTYPE, libc.name
                tar.addfile(link)
            if with_python:
                add_bytes(tar, "usr/bin/python3.12", b"\x7fELF not really", 0o755)
                link = tarfile.TarInfo("usr/bin/python3")
                link.type, link.linkname = tarfile.SYMTYPE, "/usr/bin/python3.12"
                tar.addfile(link)
                tar.add(sp, arcname="usr/lib/python3/dist-packages")
        r = _docker(
            "import", "-c", "ENV CUDA_VERSION=12.9.1", "-c", "ENV PATH=/usr/local/bin:/usr/bin:/bin", str(path), tag
        )
        assert r.returncode == 0, r.stderr

    make(tags["py"], True)
    make(tags["nopy"], False)
    yield tags
    for tag in tags.values():
        _docker("rmi", "-f", tag)


def _containers_of(tag: str) -> list[str]:
    return _docker("ps", "-aq", "--filter", f"ancestor={tag}").stdout.split()


@pytest.mark.slow
@pytest.mark.docker
def test_snapshot_image_reads_a_local_image(tmp_path, tiny_images):
    import os

    tag = tiny_images["py"]
    out = tmp_path / "m.json"
    r = _snap("--image", tag, "-o", str(out), "--json")
    assert r.exit_code == 0, r.output
    m = load_manifest(out)
    assert m.provenance_kind == "read-from-image" and m.image_ref == tag
    assert m.image_digest is None  # imported, never pushed: no registry digest
    assert m.os == "Tiny Test Linux 1.0"
    assert m.python_version == "3.12" and m.site_packages == "/usr/lib/python3/dist-packages"
    host_glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[-1]
    assert m.glibc == host_glibc and m.platform == platform_for(host_glibc)
    assert m.cuda == "12.9"
    assert set(m.distributions) == {"fakearrow", "numpy", "newglibc", "purepkg"}
    assert m.get("fakearrow").facts.numpy_abi == {"1": 1, "2": 0}
    assert m.get("newglibc").facts.glibc == "2.99"
    assert _containers_of(tag) == []  # the helper container was removed


@pytest.mark.slow
@pytest.mark.docker
def test_snapshot_image_without_python_is_bad_input(tmp_path, tiny_images):
    tag = tiny_images["nopy"]
    out = tmp_path / "m.json"
    r = CliRunner().invoke(main, ["base", "snapshot", "--image", tag, "-o", str(out)])
    assert r.exit_code == 2 and "no Python interpreter" in r.output
    assert not out.exists()
    assert _containers_of(tag) == []


@pytest.mark.slow
@pytest.mark.docker
def test_snapshot_image_never_pulls(tmp_path):
    if _docker("info").returncode != 0:
        missing("no Docker engine")
    out = tmp_path / "m.json"
    r = CliRunner().invoke(main, ["base", "snapshot", "--image", "build-image-test/absent:never", "-o", str(out)])
    assert r.exit_code == 2 and "never pulls" in r.output
    assert not out.exists()


def test_scan_site_packages_reads_debian_style_egg_info(tmp_path):
    sp = tmp_path / "dist-packages"
    (sp / "debpkg").mkdir(parents=True)
    (sp / "debpkg" / "__init__.py").write_text("")
    _gcc_so(
        sp / "debpkg",
        "_speed.cpython-312-x86_64-linux-gnu.so",
        'const char m[] = "numpy.core._multiarray_umath"; int f(void){return sizeof m;}\n',
    )
    egg = sp / "debpkg-3.1.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: debpkg\nVersion: 3.1\n")
    (egg / "top_level.txt").write_text("debpkg\n")
    (sp / "single_file-0.5.egg-info").write_text("Metadata-Version: 1.1\nName: single-file\nVersion: 0.5\n")
    dists = scan_site_packages(sp)
    assert dists["debpkg"].version == "3.1"
    assert dists["debpkg"].facts.extensions == 1 and dists["debpkg"].facts.numpy_abi == {"1": 1, "2": 0}
    assert dists["debpkg"].facts.python_abi == "cp312"
    assert dists["single-file"].version == "0.5" and not dists["single-file"].facts.binary


def test_truncated_elf_is_binary_without_glibc(tmp_path):
    so = _gcc_so(tmp_path, "t.so", '#include <stdio.h>\nint f(void){return printf("x");}\n')
    cut = tmp_path / "cut.so"
    cut.write_bytes(so.read_bytes()[:200])
    facts = scan_files([cut])
    assert facts.binary and facts.extensions == 1 and facts.glibc is None


@pytest.mark.slow
@pytest.mark.docker
def test_snapshot_image_records_the_registry_digest(tmp_path, tiny_images):
    if subprocess.run(["curl", "-sf", "http://127.0.0.1:5000/v2/"], capture_output=True).returncode != 0:
        missing("no local registry on 127.0.0.1:5000")
    ref = "127.0.0.1:5000/build-image-test/tiny-python:digest"
    assert _docker("tag", tiny_images["py"], ref).returncode == 0
    try:
        push = _docker("push", ref)
        assert push.returncode == 0, push.stderr
        import re

        pushed = re.findall(r"digest: (sha256:[0-9a-f]{64})", push.stdout)
        out = tmp_path / "m.json"
        assert _snap("--image", ref, "-o", str(out)).exit_code == 0
        m = load_manifest(out)
        assert m.image_digest == pushed[0] and m.image_digest.startswith("sha256:")
        assert m.pinned_ref == f"{ref}@{pushed[0]}"  # name:tag@digest: the digest decides
    finally:
        _docker("rmi", ref)


def _tree(tmp: Path, links: dict[str, str], files: list[str], dirs: list[str]):
    from builder.resolve.base import _ImageTree

    for f in files:
        (tmp / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp / f).write_text("include-system-site-packages = false\n" if f.endswith("pyvenv.cfg") else "")
    for d in dirs:
        (tmp / d).mkdir(parents=True, exist_ok=True)
    entries = set(links) | set(files) | set(dirs)
    return _ImageTree(root=tmp, links=links, entries=entries)


def test_image_python_follows_path_and_symlinks_into_a_venv(tmp_path):
    from builder.resolve.base import _python_candidates, _site_dirs

    tree = _tree(
        tmp_path,
        links={
            "opt/venv/bin/python3": "python",
            "opt/venv/bin/python": "/usr/bin/python3.12",
            "usr/bin/python3": "/etc/alternatives/python3",
            "etc/alternatives/python3": "/usr/bin/python3.10",
        },
        files=["usr/bin/python3.12", "usr/bin/python3.10", "opt/venv/pyvenv.cfg"],
        dirs=[
            "opt/venv/lib/python3.12/site-packages",
            "usr/local/lib/python3.12/dist-packages",
            "usr/lib/python3/dist-packages",
        ],
    )
    cands = _python_candidates(tree, "/opt/venv/bin:/usr/local/bin:/usr/bin")
    assert cands == [("3.12", "opt/venv/bin/python3"), ("3.10", "usr/bin/python3")]
    # a venv without system site-packages sees only its own directory
    assert _site_dirs(tree, "3.12", "opt/venv/bin/python3") == ["opt/venv/lib/python3.12/site-packages"]
    (tmp_path / "opt/venv/pyvenv.cfg").write_text("include-system-site-packages = true\n")
    assert _site_dirs(tree, "3.12", "opt/venv/bin/python3") == [
        "opt/venv/lib/python3.12/site-packages",
        "usr/local/lib/python3.12/dist-packages",
        "usr/lib/python3/dist-packages",
    ]
    # a system interpreter: Debian sys.path order
    assert _site_dirs(tree, "3.12", "usr/bin/python3") == [
        "usr/local/lib/python3.12/dist-packages",
        "usr/lib/python3/dist-packages",
    ]


def test_extension_suffix_beats_a_none_wheel_tag(tmp_path):
    so = _gcc_so(tmp_path, "m.cpython-39-x86_64-linux-gnu.so", "int f(void){return 1;}\n")
    assert scan_files([so], wheel_tags=["py3-none-manylinux_2_17_x86_64"]).python_abi == "cp39"
    stable = _gcc_so(tmp_path, "s.abi3.so", "int f(void){return 1;}\n")
    assert scan_files([stable], wheel_tags=["cp312-cp312-manylinux_2_17_x86_64"]).python_abi == "cp312"
    assert scan_files([stable], wheel_tags=["py3-none-any"]).python_abi == "abi3"
    # a cp312-tagged wheel whose only module is for 3.9: the module is the evidence
    assert scan_files([so], wheel_tags=["cp312-cp312-manylinux_2_17_x86_64"]).python_abi == "cp39"
    # an abi3 wheel carrying per-version modules too (vllm's deep_gemm) stays abi3
    so312 = _gcc_so(tmp_path, "m.cpython-312-x86_64-linux-gnu.so", "int f(void){return 1;}\n")
    assert scan_files([so, so312], wheel_tags=["cp38-abi3-manylinux_2_28_x86_64"]).python_abi == "abi3"
    assert scan_files([so, so312]).python_abi == "cp39.cp312"


def test_snapshot_to_an_unwritable_path_is_bad_input_not_a_traceback(tmp_path, make_site_packages):
    sp = make_site_packages(tmp_path / "sp", ["purepkg==1.0.0"])
    out = tmp_path / "no-such-dir-parent-is-a-file"
    out.write_text("x")
    res = CliRunner().invoke(
        main,
        [
            "base",
            "snapshot",
            "--site-packages",
            str(sp),
            "--python",
            "3.12",
            "--glibc",
            "2.35",
            "-o",
            str(out / "base.json"),
        ],
    )
    assert res.exit_code == 2, res.output
    assert "cannot write" in res.output and str(out / "base.json") in res.output
    assert out.read_text() == "x"


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (
            lambda d: d["distributions"]["numpy"].__setitem__("numpy_abi", "x"),
            "'distributions.numpy.numpy_abi' should be dict",
        ),
        (
            lambda d: d["distributions"]["numpy"].__setitem__("numpy_abi", {"1": "2"}),
            "'distributions.numpy.numpy_abi.1' should be int",
        ),
        (
            lambda d: d["distributions"]["numpy"].__setitem__("extensions", "3"),
            "'distributions.numpy.extensions' should be int",
        ),
        (lambda d: d["python"].__setitem__("version", "3"), "'python.version' must look like 3.12"),
        (lambda d: d.__setitem__("platform", "linux"), "'platform': 'linux' is not <machine>-manylinux"),
        (lambda d: d["distributions"]["numpy"].__setitem__("name", "pandas"), "'distributions.numpy' holds 'pandas'"),
        (
            lambda d: d["distributions"].__setitem__("NumPy", dict(d["distributions"]["numpy"])),
            "'numpy' is listed twice",
        ),
    ],
)
def test_malformed_manifest_fields_are_bad_input_naming_the_field(tmp_path, mutate, needle):
    """Not a traceback (numpy_abi of the wrong type), nor a misleading 'unsatisfiable' from uv
    (python.version '3'), nor a pin under another package's key."""
    from builder.resolve.manifest import load_manifest as load
    from builder.util import project_root

    d = json.loads((project_root() / "lockfiles" / "base" / "vllm-openai-v0.26.0.json").read_text())
    mutate(d)
    p = tmp_path / "m.json"
    p.write_text(json.dumps(d))
    with pytest.raises(BadInput) as ei:
        load(p)
    assert needle in ei.value.message and str(p) in ei.value.message


def test_fast_elf_reader_agrees_with_pyelftools_on_every_fixture_extension(wheelhouse, tmp_path):
    """The section-header reader (glibc from .gnu.version_r, numpy names in .rodata only) must give
    what pyelftools plus a whole-file search give, on real gcc-built objects (GLIBC_2.99 one included)."""
    import mmap

    from builder.resolve import scanner as B

    seen = 0
    for whl in sorted(wheelhouse.glob("*.whl")):
        with zipfile.ZipFile(whl) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".so"):
                    continue
                p = tmp_path / f"{seen}-{Path(info.filename).name}"
                p.write_bytes(zf.read(info))
                seen += 1
                with open(p, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                    fast = B._elf_fast(mm, want_numpy=True)
                    fh.seek(0)
                    ref = (B._elf_glibc(fh), B._numpy_generation(mm))
                assert fast == ref, (whl.name, info.filename)
    assert seen >= 5
    # the scanner itself: facts from the fast path, equal to the wheel scan's
    _, _, facts = B.scan_wheel(next(wheelhouse.glob("newglibc-*.whl")))
    assert facts.glibc == "2.99"
