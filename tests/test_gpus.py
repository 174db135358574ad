"""CUDA architectures: the fat binary parser (hand-made containers, a built ELF with a ``.nv_fatbin`` section, a
real wheel), the GPU table, coverage, the driver floor, and `plan --gpu-model` refusing an uncovered GPU."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from builder.cli import main
from builder.errors import BadInput, VerdictFailure
from builder.resolve import fatbin
from builder.resolve.manifest import load_manifest, parse_manifest
from builder.resolve.scanner import scan_files
from builder.serving import gpus
from tests.test_abi import facts, manifest


def entry(kind: int, arch: int, payload: bytes = b"\0" * 16, head: int = 64, size: int | None = None) -> bytes:
    """One fat binary entry: the header of ``fatbin.py``'s docstring, padded to ``head`` bytes, and its payload."""
    size = len(payload) if size is None else size
    hdr = struct.pack("<HHIQIIHHI", kind, 0x0101, head, size, 0, 0, 0, 0, arch)
    return hdr + b"\0" * (head - len(hdr)) + payload


def container(*entries: bytes, size: int | None = None) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, len(body) if size is None else size) + body


BLOB = container(entry(fatbin.KIND_ELF, 90), entry(fatbin.KIND_ELF, 100), entry(fatbin.KIND_PTX, 120))


def test_the_parser_reads_sass_and_ptx_of_every_container_and_skips_padding():
    got = fatbin.parse_fatbin(BLOB + b"\0" * 8 + container(entry(fatbin.KIND_ELF, 80)), "x.so")
    assert got.sass == {80, 90, 100} and got.ptx == {120}


@pytest.mark.parametrize(
    "blob,match",
    [
        (container(entry(fatbin.KIND_ELF, 90), size=1 << 40), "claiming 16"),
        (container(entry(fatbin.KIND_ELF, 90, size=1 << 33)), "entry at byte 16"),
        (container(entry(fatbin.KIND_ELF, 90, head=8)), "entry at byte 16"),
        (BLOB[:-5], r"claiming 16\+240 bytes past its end \(251\)"),
        (b"\x7fELF" + BLOB, "0x464c457f"),
    ],
)
def test_a_fatbin_that_lies_about_its_sizes_is_bad_input_naming_the_file(blob, match):
    with pytest.raises(BadInput, match=match) as exc:
        fatbin.parse_fatbin(blob, "lib/_k.so")
    assert exc.value.message.startswith("lib/_k.so: its .nv_fatbin section")


def test_the_number_of_entries_is_bounded(monkeypatch):
    monkeypatch.setattr(fatbin, "MAX_ENTRIES", 2)
    with pytest.raises(BadInput, match="more than 2 entries"):
        fatbin.parse_fatbin(BLOB, "x.so")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_end_in_facts_or_bad_input(tail):
    try:
        fatbin.parse_fatbin(BLOB[:16] + tail, "x.so")
    except BadInput:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=400))
def test_any_bytes_searched_end_in_facts_or_bad_input(head, tail):
    """Other data around a found header (the search outside ``.nv_fatbin``): facts, or BadInput naming the
    section, never another error or a read past the range."""
    blob = head + fatbin._NEEDLE + tail
    try:
        fatbin.scan_fatbins(blob, "x.so", ".rodata", 0, len(blob), fatbin.CudaFacts())
    except BadInput as exc:
        assert exc.message.startswith("x.so: its .rodata section")


@pytest.fixture(scope="module")
def cuda_so(tmp_path_factory) -> Path:
    """A shared object linking a stand-in ``libcudart.so.13`` whose ``.nv_fatbin`` section holds :data:`BLOB`."""
    work = tmp_path_factory.mktemp("fatbin")
    (work / "rt.c").write_text("int cudaFree(void *p) { return 0; }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcudart.so.13", "-o", "libcudart.so.13", "rt.c"],
        cwd=work,
        check=True,
    )
    (work / "libcudart.so").symlink_to("libcudart.so.13")
    data = ", ".join(str(b) for b in BLOB)
    (work / "k.c").write_text(
        f'__attribute__((section(".nv_fatbin"), used)) const unsigned char fatbin[] = {{{data}}};\n'
        "int cudaFree(void *p);\nint run(void) { return cudaFree(0); }\n"
    )
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", "_k.so", "k.c", "-L.", "-lcudart"], cwd=work, check=True)
    return work / "_k.so"


def test_a_built_cuda_library_gives_its_architectures_and_runtime(cuda_so):
    f = scan_files([cuda_so])
    assert (f.cuda_sass, f.cuda_ptx, f.cuda_runtime) == ([90, 100], [120], 13)
    m = manifest({"vllm": ("0.34.0", f)})
    back = parse_manifest(m.to_json()).get("vllm").facts
    assert (back.cuda_sass, back.cuda_ptx, back.cuda_runtime) == ([90, 100], [120], 13)


def test_a_lying_fatbin_inside_an_elf_is_bad_input_naming_it(tmp_path, cuda_so):
    data = bytearray(cuda_so.read_bytes())
    at = data.find(struct.pack("<I", fatbin.FATBIN_MAGIC))
    struct.pack_into("<Q", data, at + 8, 1 << 40)
    bad = tmp_path / "_liar.so"
    bad.write_bytes(bytes(data))
    with pytest.raises(BadInput, match=r"_liar\.so: its \.nv_fatbin section has a container"):
        scan_files([bad])


def _so(work: Path, name: str, decl: str) -> Path:
    """A shared object built from ``decl`` (C declarations of the data it holds)."""
    (work / f"{name}.c").write_text(decl + "int run(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-o", name, f"{name}.c"], cwd=work, check=True)
    return work / name


def _bytes(blob: bytes) -> str:
    return ", ".join(str(b) for b in blob)


#: other data on both sides of the containers, as in a library's .rodata
_AROUND = 'const char before[] = "header text";\n'


@pytest.mark.parametrize(
    "decl",
    [
        # .rodata (cuSPARSE): two containers among other constants, one 8-byte aligned after odd data
        _AROUND + "const unsigned char k[] = {{{blob}, 7, 7, 7, {two}}};\nconst int after = 3;\n",
        # a section of its own (cuBLASLt's .cask_resource), data around the containers
        '__attribute__((section(".cask_resource"), used)) const unsigned char k[] = {{1, 2, 3, {blob}, 9, {two}}};\n',
        # a writable one (libcufft's .ldata holds ~24,000)
        '__attribute__((section(".ldata"), used)) unsigned char k[] = {{{blob}, {two}, 0, 0}};\n',
    ],
    ids=["rodata", "custom", "ldata"],
)
def test_containers_outside_nv_fatbin_are_read_from_any_allocated_section(tmp_path, decl):
    two = container(entry(fatbin.KIND_ELF, 75), entry(fatbin.KIND_PTX, 86))
    lib = _so(tmp_path, "libcufft.so.12", decl.format(blob=_bytes(BLOB), two=_bytes(two)))
    f = scan_files([lib])
    assert (f.cuda_sass, f.cuda_ptx) == ([75, 90, 100], [86, 120])


def test_a_container_in_a_section_not_loaded_is_not_read(tmp_path):
    lib = _so(tmp_path, "_k.so", "")
    note = tmp_path / "blob.bin"
    note.write_bytes(BLOB)
    subprocess.run(["objcopy", "--add-section", f".note.kept={note}", str(lib)], check=True)
    assert fatbin.FATBIN_MAGIC.to_bytes(4, "little") in lib.read_bytes()
    assert scan_files([lib]).cuda_sass == []


def test_the_header_bytes_in_code_are_not_read(tmp_path):
    """Instructions may hold the header's bytes as an operand (cuDNN's libcudnn_engines_tensor_ir.so.9 does,
    followed by bytes that read as a size of terabytes): executable sections are not searched."""
    liar = container(entry(fatbin.KIND_ELF, 90), size=1 << 40)
    code = ",".join(f"{b:#04x}" for b in liar)
    lib = _so(tmp_path, "_code.so", f'__asm__(".section .text.k,\\"ax\\",@progbits\\n.byte {code}\\n.previous");\n')
    assert struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, 1 << 40) in lib.read_bytes()
    assert scan_files([lib]).cuda_sass == []


def test_a_lying_container_in_rodata_is_bad_input_naming_file_and_section(tmp_path):
    liar = container(entry(fatbin.KIND_ELF, 90), size=1 << 40)
    lib = _so(tmp_path, "_liar.so", _AROUND + f"const unsigned char k[] = {{{_bytes(liar)}}};\n")
    with pytest.raises(BadInput, match=r"_liar\.so: its \.rodata section has a container at byte \d+ claiming 16"):
        scan_files([lib])


def test_containers_and_bytes_searched_outside_nv_fatbin_are_bounded(tmp_path, monkeypatch):
    lib = _so(tmp_path, "_many.so", f"const unsigned char k[] = {{{_bytes(BLOB + BLOB + BLOB)}}};\n")
    assert scan_files([lib]).cuda_sass == [90, 100]
    monkeypatch.setattr(fatbin, "MAX_CONTAINERS", 2)
    with pytest.raises(BadInput, match=r"_many\.so: its \.rodata section brings the file over 2 fat binary"):
        scan_files([lib])
    monkeypatch.setattr(fatbin, "MAX_CONTAINERS", 10)
    monkeypatch.setattr(fatbin, "MAX_SCAN", 64)
    with pytest.raises(BadInput, match=r"_many\.so: its \S+ section brings the bytes to search .* over 64"):
        scan_files([lib])


def test_overlapping_sections_are_searched_once(monkeypatch):
    """A section table whose sections all claim the same bytes: each byte is searched once, however many
    sections name it."""
    calls = []
    real = fatbin.scan_fatbins
    monkeypatch.setattr(fatbin, "scan_fatbins", lambda *a: calls.append(a[3:5]) or real(*a))
    secs = [{"sh_type": "SHT_PROGBITS", "sh_flags": 2, "sh_size": 400, "sh_offset": 100}] * 1000
    monkeypatch.setattr(fatbin.elfsyms, "section_names", lambda *a: [".rodata"] * len(secs))
    monkeypatch.setattr(fatbin.elfsyms, "needed_of", lambda *a: [])
    data = b"\0" * 100 + BLOB + b"\0" * (400 - len(BLOB))
    got = fatbin.cuda_facts_in(object(), secs, data, "x.so")
    assert calls == [(100, 500)] and got.sass == {90, 100}


@pytest.mark.parametrize(
    "model,cc",
    [
        ("NVIDIA H100 80GB HBM3", 90),
        ("NVIDIA H200", 90),
        ("NVIDIA H20", 90),
        ("NVIDIA GB200", 100),
        ("NVIDIA B300 SXM6 AC", 103),
        ("NVIDIA A100-SXM4-80GB", 80),
        ("NVIDIA GeForce RTX 5090", 120),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 120),
        ("sm_121", 121),
        ("10.3", 103),
    ],
)
def test_capability_of(model, cc):
    assert gpus.capability_of(model).capability == cc


def test_an_unknown_gpu_is_refused_naming_the_table():
    with pytest.raises(BadInput, match="gpus.toml") as exc:
        gpus.capability_of("NVIDIA Quantum Q1")
    assert "sm_XY" in exc.value.hint


@pytest.mark.parametrize(
    "sass,ptx,cc,ok",
    [
        ([80], [], 86, True),
        ([80], [], 90, False),
        ([100], [], 103, True),
        ([103], [], 100, False),
        ([90], [], 100, False),
        ([], [90], 120, True),
        ([], [90], 89, False),
        ([120], [], 121, True),
    ],
)
def test_covers(sass, ptx, cc, ok):
    assert gpus.covers(sass, ptx, cc) is ok  # the rule fatbin.covers, as serving imports it


def _with_archs(sass, ptx=()):
    f = facts(True, 3, 0, 0, "2.28", "cp312")
    f.cuda_sass, f.cuda_ptx, f.cuda_runtime = list(sass), list(ptx), 13
    return f


BASE = manifest(
    {
        "torch": ("2.14.0", _with_archs([75, 80, 86, 89, 90, 100, 103, 120, 121])),
        "vllm": ("0.34.0", _with_archs([75, 80, 86, 89, 90, 100, 120], [80, 89, 90])),
        "deep-gemm": ("2.1.0", _with_archs([90, 100])),
    }
)


def test_check_requires_torch_and_vllm_and_notes_the_others():
    a100 = gpus.check(BASE, gpus.capability_of("NVIDIA A100-SXM4-80GB"))
    assert not a100.uncovered and a100.covered == ["torch 2.14.0", "vllm 0.34.0"]
    assert any("deep-gemm" in n for n in a100.notes)
    assert a100.floor == "580.65.06" and a100.cuda_major == 13
    v100 = gpus.check(BASE, gpus.capability_of("Tesla V100-SXM2-32GB"))
    assert [n for n, _, _ in v100.uncovered] == ["torch 2.14.0", "vllm 0.34.0"]
    with pytest.raises(VerdictFailure, match=r"torch 2\.14\.0 \(SASS sm_75"):
        gpus.refuse_uncovered(v100)


def test_driver_floor_by_cuda_major():
    assert gpus.driver_floor(12) == "525.60.13" and gpus.driver_floor(13) == "580.65.06"
    assert gpus.driver_floor(99) is None


def test_plan_refuses_an_uncovered_gpu_before_reading_the_model(tmp_path):
    m = tmp_path / "base.json"
    m.write_text(BASE.to_json())
    spec = tmp_path / "build-image.toml"
    spec.write_text(f'vllm = "0.34.0"\nbase = "{m}"\n[serving]\ngpu_model = "Tesla V100-SXM2-32GB"\n')
    r = CliRunner().invoke(main, ["plan", "--spec", str(spec), "--model", str(tmp_path / "missing")])
    assert r.exit_code == 1, r.output
    assert "torch 2.14.0" in r.output and "sm_70" in r.output and "no kernel image" in r.output
    r = CliRunner().invoke(main, ["plan", "--spec", str(spec), "--gpu-model", "NVIDIA Nope", "--model", "x"])
    assert r.exit_code == 2 and "gpus.toml" in r.output


def test_plan_states_the_driver_floor_and_the_covering_kernels(tmp_path):
    from tests.test_plan import _model_dir

    m = tmp_path / "base.json"
    m.write_text(BASE.to_json())
    d = _model_dir(tmp_path)
    args = ["plan", "--model", str(d), "--weights-bytes", "1GB", "--gpu-memory", "h200", "--tp", "1"]
    spec = tmp_path / "build-image.toml"
    spec.write_text(f'vllm = "0.34.0"\nbase = "{m}"\n')
    r = CliRunner().invoke(main, [*args, "--spec", str(spec), "--gpu-model", "NVIDIA H200", "--json"])
    doc = json.loads(r.output[: r.output.rindex("}") + 1])
    assert doc["gpu"]["driver_floor"] == "580.65.06" and doc["gpu"]["compute_capability"] == "9.0"
    assert doc["gpu"]["covered_by"] == ["deep-gemm 2.1.0", "torch 2.14.0", "vllm 0.34.0"]
    r = CliRunner().invoke(main, [*args, "--spec", str(spec)])
    assert "needs an NVIDIA driver >= 580.65.06" in r.output


def test_the_shipped_0_34_0_base_refuses_a_v100_and_runs_on_an_h200(tmp_path, monkeypatch):
    """The shipped linux/amd64 0.34.0 manifest records its kernels' architectures and CUDA runtime: `plan`
    refuses a V100 (sm_70) by torch and vllm before the model is read, and states the driver floor on an H200."""
    from tests.test_plan import _model_dir

    shipped = load_manifest(str(Path(__file__).resolve().parent.parent / "lockfiles/base/vllm-openai-v0.34.0.json"))
    for name in ("torch", "vllm"):
        f = shipped.get(name).facts
        assert f.cuda_runtime == 13 and 90 in f.cuda_sass and 70 not in f.cuda_sass + f.cuda_ptx, name
    h200 = gpus.check(shipped, gpus.capability_of("NVIDIA H200"))
    assert not h200.uncovered and {"torch 2.14.0", "vllm 0.34.0"} <= set(h200.covered)
    # cuFFT keeps all but one of its containers in .ldata: read there, it covers the H200 and no note is made
    assert 90 in shipped.get("nvidia-cufft").facts.cuda_sass and not h200.notes
    # torchcodec's libtorchcodec_*.so are not torch's libraries: only torch records torch's exports
    assert [n for n, d in shipped.distributions.items() if d.facts.torch_exports] == ["torch"]
    assert (h200.cuda_major, h200.floor) == (13, "580.65.06")
    monkeypatch.chdir(tmp_path)  # no spec here: plan reads the release's shipped manifest
    r = CliRunner().invoke(
        main, ["plan", "--vllm", "0.34.0", "--gpu-model", "Tesla V100-SXM2-32GB", "--model", "missing"]
    )
    assert r.exit_code == 1, r.output
    assert "sm_70" in r.output and "torch 2.14.0 (SASS" in r.output and "vllm 0.34.0 (SASS" in r.output
    d = _model_dir(tmp_path)
    args = ["plan", "--vllm", "0.34.0", "--model", str(d), "--weights-bytes", "1GB", "--gpu-memory", "h200"]
    r = CliRunner().invoke(main, [*args, "--tp", "1", "--gpu-model", "NVIDIA H200"])
    assert r.exit_code == 0, r.output
    assert "needs an NVIDIA driver >= 580.65.06" in r.output and "not checked" not in r.output


def _cuda_entry(name, version, sass, ptx=(), runtime=13):
    from tests.test_abi import entry as lock_entry

    f = facts(True, 1, 0, 0, "2.28", "cp312")
    f.cuda_sass, f.cuda_ptx, f.cuda_runtime = list(sass), list(ptx), runtime
    return lock_entry(name, version, f)


def test_gate_rejects_an_added_cuda_binary_for_another_runtime_major():
    from builder.resolve import abi

    result = abi.evaluate(BASE, [_cuda_entry("sgl-kernel", "0.4.0", [90], runtime=12)])
    [fd] = result.violations
    assert fd.rule == abi.CUDA_ARCH and "libcudart.so.12" in fd.message and "CUDA 13" in fd.message


def test_gate_notes_the_gpus_an_added_cuda_binary_has_no_kernels_for():
    from builder.resolve import abi

    result = abi.evaluate(BASE, [_cuda_entry("sgl-kernel", "0.4.0", [90, 100], [120])])
    assert result.ok
    [fd] = [f for f in result.notices if f.rule == abi.CUDA_ARCH_GAP]
    assert (
        "no kernels for sm_75 sm_80 sm_86 sm_89, which" in fd.message
        and "sm_103" not in fd.message
        and "sm_121" not in fd.message
    )
    full = abi.evaluate(BASE, [_cuda_entry("sgl-kernel", "0.4.0", [75], [75])])
    assert not [f for f in full.notices if f.rule == abi.CUDA_ARCH_GAP]
    same = abi.evaluate(BASE, [_cuda_entry("deep-gemm", "2.1.0", [90], runtime=12)])
    assert same.ok and not same.notices


def test_a_2gb_shared_object_is_read_by_its_headers_only(tmp_path, cuda_so):
    """A CUDA library grown to 2 GiB (sparse: the file system holds only its first bytes): the fat binary and
    symbol readers map it and read headers and tables in place, so they take what the small file takes."""
    import mmap
    import os
    import time

    from builder.resolve import elfsyms

    big = tmp_path / "_big.so"
    big.write_bytes(cuda_so.read_bytes())
    os.truncate(big, 2 << 30)
    start = time.monotonic()
    with open(big, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        got = fatbin.cuda_facts(mm, str(big))
        linked, needs, _ = elfsyms.torch_symbols(mm, str(big), exports=True)
    assert (got.sass, got.ptx, got.runtime) == ({90, 100}, {120}, 13) and not linked and needs == []
    assert time.monotonic() - start < 2


def test_smoke_gpu_model_refuses_an_uncovered_gpu_before_anything_starts(tmp_path):
    """``smoke --vllm 0.34.0 --gpu-model``: the shipped base's kernels against the GPU before the checkpoint
    or a server is touched (a V100 is exit 1 naming torch; an H200 goes on, the driver floor said)."""
    from click.testing import CliRunner

    from builder.cli import main

    missing = str(tmp_path / "no-such-model")
    args = ["smoke", "--local", "--vllm", "0.34.0", "--model", missing]
    r = CliRunner().invoke(main, [*args, "--gpu-model", "Tesla V100-SXM2-32GB"])
    assert r.exit_code == 1, r.output
    assert "torch" in r.output and "sm_70" in r.output and "no-such-model" not in r.output
    r = CliRunner().invoke(main, [*args, "--gpu-model", "NVIDIA H200"])
    assert r.exit_code == 2 and "no-such-model" in r.output  # past the GPU check: the model is the problem
    assert "driver floor: the image's CUDA 13 needs an NVIDIA driver >= 580" in r.output
    r = CliRunner().invoke(main, [*args, "--gpu-model", "sm_"])
    assert r.exit_code == 2 and "--gpu-model" in r.output
