"""The ``torch-abi`` rule: torch symbols read from small built ELF files (a stand-in ``libc10.so`` and an
extension linking it), the compact set the manifest records, and the gate's three kinds of evidence."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builder.errors import BadInput
from builder.resolve import abi, elfsyms
from builder.resolve.manifest import parse_manifest
from builder.resolve.scanner import scan_files, scan_wheel
from tests.fx_wheels import write_wheel
from tests.test_abi import entry, facts, manifest

# a stand-in c10: free functions in namespace c10, named as g++ mangles them
_C10_V2 = 'void foo(void) __asm__("_ZN3c103fooEv");\nvoid foo(void) {}\n'
_C10_V1 = _C10_V2 + 'void baz(void) __asm__("_ZN3c103bazEv");\nvoid baz(void) {}\n'
_EXT = (
    'void foo(void) __asm__("_ZN3c103fooEv");\nvoid baz(void) __asm__("_ZN3c103bazEv");\n'
    "int PyInit__ext(void) { foo(); baz(); return 0; }\n"
)
_EXT_FOO = 'void foo(void) __asm__("_ZN3c103fooEv");\nint PyInit__ext(void) { foo(); return 0; }\n'


def _cc(work: Path, out: str, src: str, *libs: str) -> Path:
    (work / f"{out}.c").write_text(src)
    args = ["gcc", "-shared", "-fPIC", "-O0", "-o", out, f"{out}.c", *libs]
    subprocess.run(args, cwd=work, check=True, capture_output=True)
    return work / out


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """v1/ and v2/ stand-in ``libc10.so``; ``_ext.so`` linked against v1 needing foo and baz, ``_ext_foo.so``
    needing only foo."""
    work = tmp_path_factory.mktemp("c10")
    (work / "v1").mkdir()
    (work / "v2").mkdir()
    out = {"v1": _cc(work / "v1", "libc10.so", _C10_V1), "v2": _cc(work / "v2", "libc10.so", _C10_V2)}
    out["ext"] = _cc(work / "v1", "_ext.so", _EXT, "-L.", "-lc10")
    out["ext_foo"] = _cc(work / "v1", "_ext_foo.so", _EXT_FOO, "-L.", "-lc10")
    return out


def test_scan_reads_needs_of_an_extension_and_exports_of_libc10(built):
    ext = scan_files([built["ext"]])
    assert ext.torch_needs == {"_ext.so": ["_ZN3c103bazEv", "_ZN3c103fooEv"]}
    assert ext.torch_exports is None
    lib = scan_files([built["v2"]])
    assert lib.torch_needs == {}
    keys = elfsyms.unpack_symbols(lib.torch_exports, "test")
    assert keys == {elfsyms.symbol_key("_ZN3c103fooEv")}


def test_a_library_linking_c10_without_symbols_counts_as_linked(tmp_path, built):
    src = "int f(void) { return 1; }\n"
    lib = _cc(built["v1"].parent, "_only_linked.so", src, "-L.", "-Wl,--no-as-needed", "-lc10")
    assert scan_files([lib]).torch_needs == {"_only_linked.so": []}
    plain = _cc(tmp_path, "_plain.so", "int f(void) { return 1; }\n")
    assert scan_files([plain]).torch_needs == {}


#: the libraries torch 2.11's and 2.14's CUDA wheels ship in torch/lib, and older torch's split CUDA libraries
_TORCH_OWN = [
    "libtorch.so", "libtorch_cpu.so", "libtorch_cuda.so", "libtorch_cuda_linalg.so", "libtorch_global_deps.so",
    "libtorch_nvshmem.so", "libtorch_python.so", "libc10.so", "libc10_cuda.so", "libtorch_cuda_cu.so",
    "libtorch_cuda_cpp.so", "libtorch_hip.so", "libc10_hip.so",
]  # fmt: skip
#: libraries of other distributions (torchcodec 0.17, torchaudio, tvm-ffi's addon) and torch's non-torch helpers
_NOT_TORCH = [
    "libtorchcodec_core8.so", "libtorchcodec_custom_ops8.so", "libtorchcodec_pybind_ops.so", "libtorchaudio.so",
    "libtorchaudio.abi3.so", "libtorch_c_dlpack_addon_torch29-cuda.so", "libtorchbind_test.so", "libshm.so",
    "libcaffe2_nvrtc.so", "libc10d.so", "libtorch.so.bak",
]  # fmt: skip


@pytest.mark.parametrize("name,own", [(n, True) for n in _TORCH_OWN] + [(n, False) for n in _NOT_TORCH])
def test_torch_library_names_torch_own_libraries_only(name, own):
    assert bool(elfsyms.TORCH_LIBRARY.match(name)) is own


def test_a_library_named_like_torch_but_not_torch_records_no_exports(tmp_path):
    """torchcodec's ``libtorchcodec_core8.so`` defines c10 names (inline templates it instantiates): they are not
    torch's exports, and a distribution shipping it records none."""
    lib = _cc(tmp_path, "libtorchcodec_core8.so", _C10_V2)
    assert scan_files([lib]).torch_exports is None
    same = _cc(tmp_path, "libc10_cuda.so", _C10_V2)
    assert scan_files([same]).torch_exports is not None


@given(st.sets(st.text(alphabet="abcdefgh_Z0123456789", min_size=1, max_size=30), max_size=200))
def test_packed_set_holds_exactly_the_keys(names):
    packed = elfsyms.pack_symbols(names)
    assert elfsyms.unpack_symbols(packed, "x") == {elfsyms.symbol_key(n) for n in names}


@pytest.mark.parametrize("text", ["v2:AAAA", "v1:!!!!", "v1:" + "QUJD", ""])
def test_unpack_refuses_what_pack_did_not_write(text):
    with pytest.raises(BadInput, match="not a packed symbol set"):
        elfsyms.unpack_symbols(text, "base manifest x")


def _base(exports: str | None, torch="2.14.0"):
    f = facts(True, 3, 0, 1, "2.28", "cp312")
    f.torch_exports = exports
    return manifest({"torch": (torch, f), "vllm": ("0.34.0", facts(True, 1, 0, 0, "2.28", "abi3"))})


def _linked(needs: dict[str, list[str]]):
    f = facts(True, 1, 0, 0, "2.17", "cp312")
    f.torch_needs = needs
    return f


def test_gate_rejects_an_extension_needing_a_symbol_torch_does_not_export(built):
    base = _base(scan_files([built["v2"]]).torch_exports)
    ext = entry("lmcache", "0.3.0", scan_files([built["ext"]]))
    result = abi.evaluate(base, [ext], demangle=elfsyms.demangle)
    [fd] = result.violations
    assert fd.rule == abi.TORCH_ABI
    assert "_ext.so" in fd.message and "c10::baz()" in fd.message and "2.14.0" in fd.message
    assert "c10::foo()" not in fd.message
    assert any("made for the base's torch" in w for w in abi.ways_out(fd))
    asked = abi.evaluate(base, [ext], requires={"lmcache": ["torch>=2.10,<2.12"]})
    assert "another torch than the base's (it requires torch<2.12,>=2.10)" in asked.violations[0].message
    pinned = abi.evaluate(base, [ext], requires={"lmcache": ["torch==2.11.0"]})
    assert "was built for torch 2.11.0:" in pinned.violations[0].message
    ok = abi.evaluate(base, [entry("lmcache", "0.3.0", scan_files([built["ext_foo"]]))])
    assert ok.ok and not ok.notices


def test_gate_reads_pins_and_tags_when_the_manifest_records_no_exports():
    base = _base(None)
    needs = _linked({"_C.so": ["_ZN3c103fooEv"]})
    other = abi.evaluate(base, [entry("lmcache", "0.3.0", needs)], requires={"lmcache": ["torch==2.10.0"]})
    assert [f.rule for f in other.violations] == [abi.TORCH_ABI]
    assert "torch 2.10.0" in other.violations[0].message
    tagged = abi.evaluate(base, [entry("lmcache", "0.3.0+pt213", needs)])
    assert [f.rule for f in tagged.violations] == [abi.TORCH_ABI]
    same = abi.evaluate(base, [entry("lmcache", "0.3.0+cu130torch2.14", needs)])
    assert same.ok and not same.notices
    unknown = abi.evaluate(base, [entry("lmcache", "0.3.0", needs)], requires={"lmcache": ["torch>=2.8"]})
    assert unknown.ok and [f.rule for f in unknown.notices] == [abi.TORCH_ABI_UNVERIFIED]


def test_gate_leaves_unlinked_unmoved_and_torch_family_alone(built):
    base = _base(scan_files([built["v2"]]).torch_exports)
    bad = scan_files([built["ext"]])
    assert abi.evaluate(base, [entry("numpy", "2.3.0", facts(True, 3, 0, 0, "2.17", "cp312"))]).ok
    stay = abi.evaluate(base, [entry("vllm", "0.34.0", bad)])
    assert not any(f.rule == abi.TORCH_ABI for f in stay.violations)
    no_torch = manifest({"vllm": ("0.34.0", facts())})
    assert not any(f.rule == abi.TORCH_ABI for f in abi.evaluate(no_torch, [entry("lmcache", "0.3", bad)]).violations)


@pytest.mark.parametrize(
    "version,requires,claim",
    [
        ("0.3.0+pt214", [], "2.14"),
        ("0.3.0+cu130torch2.10", [], "2.10"),
        ("0.3.0", ["torch==2.9.1"], "2.9.1"),
        ("0.3.0", ["torch==2.9.1; platform_machine == 'ppc'"], None),
        ("0.3.0", ["torch>=2.9"], None),
        ("0.3.0+cu130", [], None),
    ],
)
def test_torch_claim(version, requires, claim):
    assert abi.torch_claim("x", version, requires) == claim


def test_manifest_round_trips_torch_exports_and_refuses_garbage(built):
    base = _base(scan_files([built["v2"]]).torch_exports)
    back = parse_manifest(base.to_json())
    assert back.get("torch").facts.torch_exports == base.get("torch").facts.torch_exports
    assert "torch_needs" not in base.to_json()
    bad = base.to_json().replace(base.get("torch").facts.torch_exports, "v1:$$$")
    with pytest.raises(BadInput, match="torch_exports"):
        parse_manifest(bad, "m.json")


def _dynsym_header_offset(data: bytes) -> int:
    """The file offset of the .dynsym section header of a 64-bit little-endian ELF."""
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    for i in range(shnum):
        if struct.unpack_from("<I", data, shoff + i * shentsize + 4)[0] == 11:  # SHT_DYNSYM
            return shoff + i * shentsize
    raise AssertionError("no .dynsym")


@pytest.mark.parametrize("size", [1 << 40, 1 << 33])
def test_a_symbol_table_that_lies_about_its_size_is_bad_input_naming_the_file(tmp_path, built, size):
    data = bytearray(built["ext"].read_bytes())
    struct.pack_into("<Q", data, _dynsym_header_offset(data) + 0x20, size)  # sh_size
    bad = tmp_path / "_liar.so"
    bad.write_bytes(bytes(data))
    with pytest.raises(BadInput, match=r"_liar\.so: its \.dynsym section claims bytes"):
        scan_files([bad])
    wheel = write_wheel(tmp_path, "liar", "1.0", "cp312-cp312-linux_x86_64", {"liar/_liar.so": bytes(data)})
    with pytest.raises(BadInput, match=r"liar-1\.0-cp312-cp312-linux_x86_64\.whl: liar/_liar\.so"):
        scan_wheel(wheel)


def test_millions_of_symbols_are_refused_not_read(tmp_path, built, monkeypatch):
    monkeypatch.setattr(elfsyms, "MAX_DYNSYM", 2)
    with pytest.raises(BadInput, match="over the"):
        scan_files([built["ext"]])


# ------------------------------------------------------------------ real wheels (PyPI)

_TV = "https://files.pythonhosted.org/packages"
TORCHVISION_028 = (
    f"{_TV}/93/e4/e9b2495d0d57b9f60d63c57d0a910410a81b4b073bf70917bef815291119/"
    "torchvision-0.28.0-cp312-cp312-manylinux_2_28_x86_64.whl",
    "028a3d481b37d785605620d7cdad897064c5a55bae2aa1f2658766333e291940",
)
TORCHVISION_0291 = (
    f"{_TV}/22/6f/78267c9791b5b883421fe4dbba6041f06b59c01d43dbe0f57b4497a74f59/"
    "torchvision-0.29.1-cp312-cp312-manylinux_2_28_x86_64.whl",
    "6c717bd68dddaebbd9525377a17a84e38a291a33a218f59fdb76e8bb41e61c99",
)
#: the one symbol torchvision 0.28.0's extensions need that torch 2.14's libc10_cuda.so no longer exports
#: (measured: docs/lock.md, the torch-abi evidence table)
GONE_IN_214 = "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb"


@pytest.mark.slow
def test_real_torchvision_wheels_torch_symbols_and_the_gate():
    """torchvision 0.28.0 (torch 2.13's C++ ABI) and 0.29.1 (torch's stable C ABI), read from PyPI: the gate
    rejects 0.28.0 on a torch whose exports lack the one symbol torch 2.14 dropped, naming the file and the
    demangled symbol; 0.29.1 passes on the same exports."""
    from builder.fetch import fetch

    _, _, old = scan_wheel(fetch(*TORCHVISION_028))
    _, _, new = scan_wheel(fetch(*TORCHVISION_0291))
    assert set(old.torch_needs) == {"_C.so", "image.so"} and GONE_IN_214 in old.torch_needs["_C.so"]
    assert set(new.torch_needs) == {"_C_stable.so", "image_stable.so"}
    assert all(s.startswith("aoti_torch_") or s.startswith("torch_") for s in new.torch_needs["_C_stable.so"])
    assert {80, 90, 100, 120} <= set(old.cuda_sass) and old.cuda_runtime == 13
    # the exports of a torch holding everything both wheels need but the dropped symbol
    needed = {s for f in (old, new) for syms in f.torch_needs.values() for s in syms} - {GONE_IN_214}
    base = _base(elfsyms.pack_symbols(needed))
    # (torchvision itself is exact-coupled, rejected by name: the same files under another name)
    bad = abi.evaluate(base, [entry("vision-ops", "0.28.0", old)], demangle=elfsyms.demangle)
    [fd] = [f for f in bad.violations if f.rule == abi.TORCH_ABI]
    assert "_C.so" in fd.message and "c10::cuda::c10_cuda_check_implementation(int" in fd.message
    ok = abi.evaluate(base, [entry("vision-ops", "0.29.1", new)])
    assert not [f for f in ok.violations if f.rule == abi.TORCH_ABI]


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_a_damaged_elf_is_facts_or_bad_input_never_a_crash(tmp_path_factory, built, data):
    """Bytes of a real extension overwritten anywhere (most often in its section headers, where the sizes live):
    the scan returns facts or refuses with BadInput naming the file: no other exception, no hang."""
    blob = bytearray(built["ext"].read_bytes())
    (shoff,) = struct.unpack_from("<Q", blob, 0x28)
    for _ in range(data.draw(st.integers(1, 6))):
        lo = data.draw(st.sampled_from([0, shoff, shoff]))
        at = data.draw(st.integers(lo, len(blob) - 8))
        blob[at : at + 8] = data.draw(st.binary(min_size=8, max_size=8))
    path = tmp_path_factory.mktemp("fuzz") / "_ext.so"
    path.write_bytes(bytes(blob))
    try:
        scan_files([path])
    except BadInput as exc:
        assert "_ext.so" in exc.message


def test_a_section_header_offset_past_any_file_is_no_crash(tmp_path, built):
    """e_shoff = 2^64 - 1 (past ssize_t): the glibc reader and the torch/CUDA reader both give up on the
    headers; the file still counts as binary."""
    blob = bytearray(built["ext"].read_bytes())
    struct.pack_into("<Q", blob, 0x28, (1 << 64) - 1)
    path = tmp_path / "_far.so"
    path.write_bytes(bytes(blob))
    f = scan_files([path])
    assert f.binary and f.glibc is None and f.torch_needs == {}


# ------------------------------------------------------------------ end to end: base snapshot, then lock


@pytest.mark.usefixtures("private_cache")
def test_lock_rejects_an_extension_built_for_another_torch_end_to_end(tmp_path, built):
    """`base snapshot` of a site-packages holding a stand-in torch (its libc10.so exports foo only) records
    torch_exports; `lock` of a connector whose extension needs c10::baz() is exit 3 naming the file and the
    demangled symbol, nothing written; its release needing only foo locks."""
    from builder.resolve.manifest import load_manifest
    from tests.conftest import run
    from tests.fx_wheels import install_into

    house = tmp_path / "house"
    house.mkdir()
    tag = "cp312-cp312-manylinux_2_17_x86_64"
    write_wheel(
        house, "torch", "2.14.0", tag, {"torch/__init__.py": "", "torch/lib/libc10.so": built["v2"].read_bytes()}
    )
    for version, ext in (("0.3.0", "ext"), ("0.2.0", "ext_foo")):
        files = {"kvconnector/__init__.py": "", "kvconnector/_ext.so": built[ext].read_bytes()}
        write_wheel(house, "kvconnector", version, tag, files, requires=["torch"])
    sp = install_into(tmp_path / "site-packages", ["torch==2.14.0"], house)
    base = tmp_path / "base.json"
    code, text = run(
        "base", "snapshot", "--site-packages", str(sp), "--python", "3.12", "--glibc", "2.35", "-o", str(base)
    )
    assert code == 0, text
    assert load_manifest(base).get("torch").facts.torch_exports
    common = ["lock", "--base", str(base), "--no-default-overlay", "--no-index", "--find-links", str(house)]
    out = tmp_path / "r.lock"
    code, text = run(*common, "--with", "kvconnector==0.3.0", "-o", str(out))
    assert code == 3, text
    assert "[torch-abi] kvconnector 0.3.0" in text and "_ext.so" in text and "c10::baz()" in text
    assert not out.exists()
    code, text = run(*common, "--with", "kvconnector==0.2.0", "-o", str(out))
    assert code == 0, text
