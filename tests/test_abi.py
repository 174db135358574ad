"""Unit tests of the pure ABI gate rules (builder/abi.py): no I/O, hand-made data."""

from __future__ import annotations

import pytest

from builder import abi
from builder.lockfile import LockEntry
from builder.manifest import BaseManifest, DistFacts, Distribution


def facts(binary=False, ext=0, np1=0, np2=0, glibc=None, pyabi="none") -> DistFacts:
    return DistFacts(binary=binary, extensions=ext, numpy_abi={"1": np1, "2": np2}, glibc=glibc, python_abi=pyabi)


def manifest(dists: dict[str, tuple[str, DistFacts]], cuda: str | None = "13.0", glibc="2.35") -> BaseManifest:
    return BaseManifest(
        image_ref="vllm/vllm-openai:v0.26.0", image_digest=None, os=None, glibc=glibc,
        python_version="3.12", python_abi="cp312", site_packages=None, cuda=cuda,
        platform="x86_64-manylinux_2_35", provenance_kind="reconstructed", provenance_method="test",
        distributions={n: Distribution(n, v, f) for n, (v, f) in dists.items()},
    )


def entry(name, version, f=None, via=("-r overlay",), base_version=None) -> LockEntry:
    return LockEntry(name=name, version=version, hashes=["0" * 64], via=list(via), facts=f or facts(),
                     base_version=base_version)


BASE = manifest({
    "vllm": ("0.26.0", facts(True, 40, 0, 0, "2.31", "abi3")),
    "torch": ("2.11.0", facts(True, 30, 0, 1, "2.28", "cp312")),
    "numpy": ("1.26.4", facts(True, 20, 0, 0, "2.17", "cp312")),
    "pyarrow": ("14.0.2", facts(True, 5, 1, 0, "2.17", "cp312")),
    "transformers": ("5.14.1", facts()),
    "nvidia-nccl-cu13": ("2.28.9", facts(True, 1, 0, 0, "2.17", "none")),
})


# ------------------------------------------------------------------ name rules

@pytest.mark.parametrize("name,expected", [
    ("torch", True), ("TorchVision", True), ("torchaudio", True), ("triton", True), ("vllm", True),
    ("xformers", True), ("flashinfer-python", True), ("flashinfer_cubin", True),
    ("nvidia-cublas-cu12", True), ("nvidia_nccl_cu13", True), ("cuda-python", True), ("cuda-bindings", True),
    ("numpy", False), ("torchmetrics", False), ("transformers", False), ("pycuda", False), ("ray", False),
])
def test_is_exact_coupled(name, expected):
    assert abi.is_exact_coupled(name) is expected


@pytest.mark.parametrize("name,version,expected", [
    ("nvidia-cublas-cu12", "12.8.4.1", "cu12"),
    ("nvidia-nccl-cu13", "2.28.9", "cu13"),
    ("cupy-cuda12x", "13.6.0", "cu12"),
    ("cupy-cuda11x", "13.6.0", "cu11"),
    ("jax-cuda12-plugin", "0.7.0", "cu12"),
    ("torch", "2.9.0+cu126", "cu12"),
    ("torch", "2.11.0+cu130", "cu13"),
    ("torchvision", "0.20.0+cu118", "cu11"),
    ("torch", "2.11.0", None),
    ("torch", "2.11.0+cpu", None),
    ("numpy", "2.3.5", None),
    ("cuda-python", "13.0.0", None),
    ("accuracy", "1.0", None),
])
def test_cuda_variant(name, version, expected):
    assert abi.cuda_variant(name, version) == expected


def test_base_cuda_variant_sources():
    assert abi.base_cuda_variant(BASE) == "cu13"
    no_field = manifest({"torch": ("2.9.0+cu126", facts())}, cuda=None)
    assert abi.base_cuda_variant(no_field) == "cu12"
    by_libs = manifest({"nvidia-cublas-cu12": ("1", facts()), "nvidia-nccl-cu12": ("1", facts()),
                        "nvidia-x-cu13": ("1", facts())}, cuda=None)
    assert abi.base_cuda_variant(by_libs) == "cu12"
    assert abi.base_cuda_variant(manifest({"numpy": ("1", facts())}, cuda=None)) is None


@pytest.mark.parametrize("need,have,expected", [
    ("2.38", "2.35", True), ("2.35", "2.35", False), ("2.17", "2.35", False),
    ("2.9", "2.17", False),  # versions, not strings: 2.9 < 2.17
    ("2.17", "2.9", True), (None, "2.35", False), ("2.2.5", "2.35", False),
])
def test_glibc_too_new(need, have, expected):
    assert abi.glibc_too_new(need, have) is expected


@pytest.mark.parametrize("tag,expected", [
    ("none", True), ("abi3", True), ("cp312", True), ("py3", True),
    ("cp39", False), ("cp313", False), ("cp312t", False), (None, True),
])
def test_python_abi_ok(tag, expected):
    assert abi.python_abi_ok(tag, "cp312") is expected


# ------------------------------------------------------------------ the gate

def rules(findings):
    return sorted((f.name, f.rule) for f in findings)


def test_clean_overlay_passes_without_findings():
    res = abi.evaluate(BASE, [entry("ray", "2.59.0", facts(True, 11, 0, 0, "2.17", "cp312")),
                              entry("colorful", "0.5.8", via=["ray"])], {})
    assert res.ok and not res.notices and not res.allowed


def test_exact_coupled_move_and_addition_rejected():
    res = abi.evaluate(BASE, [
        entry("torch", "2.12.0", facts(True, 30, 0, 1, "2.28", "cp312"), base_version="2.11.0"),
        entry("xformers", "0.0.33", facts(True, 3, 0, 0, "2.28", "cp312"), via=["torch"]),
    ], {})
    assert rules(res.violations) == [("torch", "exact-coupled"), ("xformers", "exact-coupled")]
    torch = next(f for f in res.violations if f.name == "torch")
    assert (torch.old, torch.new) == ("2.11.0", "2.12.0")
    assert "2.11.0 -> 2.12.0" in torch.message


def test_cuda_variant_mismatch_rejected_but_matching_variant_not():
    bad = abi.evaluate(BASE, [entry("cupy-cuda12x", "13.6.0", facts(True, 10, 0, 2, "2.17", "cp312"))], {})
    assert rules(bad.violations) == [("cupy-cuda12x", "cuda-variant")]
    assert "cu12" in bad.violations[0].evidence[0] and "cu13" in bad.violations[0].evidence[0]
    good = abi.evaluate(BASE, [entry("cupy-cuda13x", "13.6.0", facts(True, 10, 0, 2, "2.17", "cp312"))], {})
    assert good.ok


def test_numpy_major_move_rejected_with_binary_evidence_and_chain():
    entries = [
        entry("numpy", "2.3.5", facts(True, 20, 0, 0, "2.17", "cp312"), via=["opencv-python-headless"],
              base_version="1.26.4"),
        entry("opencv-python-headless", "4.13.0.90", facts(True, 3, 0, 3, "2.17", "abi3"), via=["vllm"]),
    ]
    res = abi.evaluate(BASE, entries, {}, requires={"opencv-python-headless": ["numpy>=2; python_version>='3.9'"]})
    assert rules(res.violations) == [("numpy", "numpy-abi")]
    v = res.violations[0]
    assert v.evidence == ["pyarrow 14.0.2: 1 extension built against numpy 1.x"]
    assert v.chain_text == "numpy 2.3.5 ← opencv-python-headless 4.13.0.90 (numpy>=2) ← vllm 0.26.0"
    text = abi.format_rejection(res)
    assert "pyarrow 14.0.2: 1 extension built against numpy 1.x" in text
    assert "--allow-abi-change numpy --reason" in text
    # the binary evidence is also a way out: move pyarrow to a release built against numpy 2
    assert "move pyarrow to a release built against numpy 2 (--with 'pyarrow>14.0.2';" in text


def test_numpy_move_allowed_when_no_extension_of_other_generation():
    base = manifest({"numpy": ("1.26.4", facts(True, 20, 0, 0, "2.17", "cp312")),
                     "scipy": ("1.15.0", facts(True, 9, 0, 9, "2.17", "cp312"))})  # built against numpy 2
    res = abi.evaluate(base, [entry("numpy", "2.3.5", facts(True, 20, 0, 0, "2.17", "cp312"),
                                    base_version="1.26.4")], {})
    assert res.ok
    assert rules(res.notices) == [("numpy", "binary-move")]


def test_evidence_counts_the_final_set_not_the_base():
    # pyarrow is upgraded in the same lock to a build against numpy 2: nothing left on 1.x.
    entries = [
        entry("numpy", "2.3.5", facts(True, 20, 0, 0, "2.17", "cp312"), base_version="1.26.4"),
        entry("pyarrow", "17.0.0", facts(True, 5, 0, 5, "2.17", "cp312"), base_version="14.0.2"),
    ]
    assert abi.evaluate(BASE, entries, {}).ok


def test_overlay_extension_built_against_numpy1_on_numpy2_base():
    base = manifest({"numpy": ("2.3.5", facts(True, 20, 0, 0, "2.17", "cp312"))})
    res = abi.evaluate(base, [entry("oldext", "1.0", facts(True, 2, 2, 0, "2.17", "cp312"))], {})
    assert rules(res.violations) == [("oldext", "numpy-abi")]
    assert res.violations[0].evidence == ["oldext 1.0: 2 extensions built against numpy 1.x"]


def test_numpy_downgrade_across_major_rejected_when_extensions_need_2():
    base = manifest({"numpy": ("2.3.5", facts(True, 20, 0, 0, "2.17", "cp312")),
                     "torch": ("2.11.0", facts(True, 30, 0, 1, "2.28", "cp312"))})
    res = abi.evaluate(base, [entry("numpy", "1.26.4", facts(True, 20, 0, 0, "2.17", "cp312"),
                                    base_version="2.3.5")], {})
    assert rules(res.violations) == [("numpy", "numpy-abi")]
    assert res.violations[0].evidence == ["torch 2.11.0: 1 extension built against numpy 2.x"]


def test_glibc_and_python_abi_rejected():
    res = abi.evaluate(BASE, [
        entry("newglibc", "1.0.0", facts(True, 1, 0, 0, "2.99", "cp312")),
        entry("oldabi", "1.0.0", facts(True, 1, 0, 0, "2.2.5", "cp39")),
        entry("stableabi", "1.0.0", facts(True, 1, 0, 0, "2.2.5", "abi3")),
    ], {})
    assert rules(res.violations) == [("newglibc", "glibc"), ("oldabi", "python-abi")]
    assert "GLIBC_2.99" in res.violations[0].message and "2.35" in res.violations[0].message


def test_pure_upgrade_allowed_but_flagged_newer_than_vllm_shipped():
    res = abi.evaluate(BASE, [entry("transformers", "5.24.0", base_version="5.14.1")], {})
    assert res.ok
    assert rules(res.notices) == [("transformers", "newer-than-base")]
    assert "newer than what vllm 0.26.0 shipped with (5.14.1)" in res.notices[0].message
    down = abi.evaluate(BASE, [entry("transformers", "5.0.0", base_version="5.14.1")], {})
    assert rules(down.notices) == [("transformers", "older-than-base")]
    # a binary base distribution that moves (and passes the binary rules) is flagged the same way
    up = abi.evaluate(BASE, [entry("pyarrow", "15.0.0", facts(True, 5, 0, 0, "2.17", "cp312"), base_version="14.0.2")], {})
    assert rules(up.notices) == [("pyarrow", "binary-move")]
    assert "newer than what vllm 0.26.0 shipped with" in up.notices[0].message


def test_allow_moves_violation_to_allowed_with_reason():
    entries = [entry("torch", "2.12.0", facts(True, 30, 0, 1, "2.28", "cp312"), base_version="2.11.0"),
               entry("cupy-cuda12x", "13.6.0", facts(True, 10, 0, 2, "2.17", "cp312"))]
    res = abi.evaluate(BASE, entries, {"Torch": "tested on H100 with the 2.12 kernels"})
    assert rules(res.allowed) == [("torch", "exact-coupled")]
    assert res.allowed[0].reason == "tested on H100 with the 2.12 kernels"
    assert rules(res.violations) == [("cupy-cuda12x", "cuda-variant")]  # only the named one is waived


def test_chain_prefers_the_parent_that_excludes_the_base_version():
    final = {"numpy": ("numpy", "2.1.0"), "numpy2user": ("numpy2user", "1.0.0"), "fakearrow": ("fakearrow", "14.0.2")}
    via = {"numpy": ["-r overlay", "fakearrow", "numpy2user"], "numpy2user": ["-r overlay"]}
    requires = {"fakearrow": ["numpy>=1.16.6"], "numpy2user": ["numpy>=2"]}
    chain = abi.build_chain("numpy", final, via, requires, overlay=["numpy2user", "numpy"],
                            base_versions={"numpy": "1.26.4"})
    assert chain == ["numpy 2.1.0", "numpy2user 1.0.0 (numpy>=2)", "overlay (numpy2user)"]
    # the overlay itself is the culprit when it asks for the new major
    chain2 = abi.build_chain("numpy", final, {"numpy": ["-r overlay", "fakearrow"]}, requires,
                             overlay=["numpy>=2"], base_versions={"numpy": "1.26.4"})
    assert chain2 == ["numpy 2.1.0", "overlay (numpy>=2)"]


def test_chain_cuts_cycles():
    final = {"a": ("a", "1"), "b": ("b", "1")}
    chain = abi.build_chain("a", final, {"a": ["b"], "b": ["a"]})
    assert chain == ["a 1", "b 1"]


def test_result_to_dict_is_json_shaped():
    res = abi.evaluate(BASE, [entry("newglibc", "1.0.0", facts(True, 1, 0, 0, "2.99", "cp312"))], {})
    d = res.to_dict()
    assert d["ok"] is False
    assert d["violations"][0]["rule"] == "glibc" and d["violations"][0]["new"] == "1.0.0"
