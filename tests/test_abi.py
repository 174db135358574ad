"""Unit tests of the pure ABI gate rules (builder/resolve/abi.py): no I/O, hand-made data."""

from __future__ import annotations

import dataclasses

import pytest

from builder.errors import BadInput
from builder.resolve import abi
from builder.resolve.lockfile import LockEntry
from builder.resolve.manifest import BaseManifest, DistFacts, Distribution, target_environment


def facts(binary=False, ext=0, np1=0, np2=0, glibc=None, pyabi="none") -> DistFacts:
    return DistFacts(binary=binary, extensions=ext, numpy_abi={"1": np1, "2": np2}, glibc=glibc, python_abi=pyabi)


def manifest(
    dists: dict[str, tuple[str, DistFacts]], cuda: str | None = "13.0", glibc="2.35", python_version="3.12"
) -> BaseManifest:
    return BaseManifest(
        image_ref="vllm/vllm-openai:v0.26.0",
        image_digest=None,
        os=None,
        glibc=glibc,
        python_version=python_version,
        python_abi="cp" + python_version.replace(".", ""),
        site_packages=None,
        cuda=cuda,
        platform="x86_64-manylinux_2_35",
        provenance_kind="reconstructed",
        provenance_method="test",
        distributions={n: Distribution(n, v, f) for n, (v, f) in dists.items()},
    )


def entry(name, version, f=None, via=("-r overlay",), base_version=None) -> LockEntry:
    return LockEntry(
        name=name, version=version, hashes=["0" * 64], via=list(via), facts=f or facts(), base_version=base_version
    )


BASE = manifest(
    {
        "vllm": ("0.26.0", facts(True, 40, 0, 0, "2.31", "abi3")),
        "torch": ("2.11.0", facts(True, 30, 0, 1, "2.28", "cp312")),
        "numpy": ("1.26.4", facts(True, 20, 0, 0, "2.17", "cp312")),
        "pyarrow": ("14.0.2", facts(True, 5, 1, 0, "2.17", "cp312")),
        "transformers": ("5.14.1", facts()),
        "nvidia-nccl-cu13": ("2.28.9", facts(True, 1, 0, 0, "2.17", "none")),
    }
)


# ------------------------------------------------------------------ name rules


@pytest.mark.parametrize(
    "name,expected",
    [
        ("torch", True),
        ("TorchVision", True),
        ("torchaudio", True),
        ("triton", True),
        ("vllm", True),
        ("xformers", True),
        ("flashinfer-python", True),
        ("flashinfer_cubin", True),
        ("nvidia-cublas-cu12", True),
        ("nvidia_nccl_cu13", True),
        ("cuda-python", True),
        ("cuda-bindings", True),
        ("numpy", False),
        ("torchmetrics", False),
        ("transformers", False),
        ("pycuda", False),
        ("ray", False),
    ],
)
def test_is_exact_coupled(name, expected):
    assert abi.is_exact_coupled(name) is expected


@pytest.mark.parametrize(
    "name,version,expected",
    [
        ("nvidia-cublas-cu12", "12.8.4.1", "cu12"),
        ("nvidia-nccl-cu13", "2.28.9", "cu13"),
        ("cupy-cuda12x", "13.6.0", "cu12"),
        ("cupy-cuda11x", "13.6.0", "cu11"),
        ("jax-cuda12-plugin", "0.7.0", "cu12"),
        ("torch", "2.9.0+cu126", "cu12"),
        ("torch", "2.11.0+cu130", "cu13"),
        ("torchvision", "0.20.0+cu118", "cu11"),
        ("torch", "1.7.1+cu101", "cu10"),  # three digits: the first two are the major
        ("torch", "1.2.0+cu92", "cu9"),  # two digits not starting with 1: the first is the major
        ("torch", "2.9.0+CU126", "cu12"),  # local labels compare case-insensitively
        ("torch", "2.11.0", None),
        ("torch", "2.11.0+cpu", None),
        ("numpy", "2.3.5", None),
        ("cuda-python", "13.0.0", None),
        ("accuracy", "1.0", None),
    ],
)
def test_cuda_variant(name, version, expected):
    assert abi.cuda_variant(name, version) == expected


def test_base_cuda_variant_sources():
    assert abi.base_cuda_variant(BASE) == "cu13"
    no_field = manifest({"torch": ("2.9.0+cu126", facts())}, cuda=None)
    assert abi.base_cuda_variant(no_field) == "cu12"
    by_libs = manifest(
        {"nvidia-cublas-cu12": ("1", facts()), "nvidia-nccl-cu12": ("1", facts()), "nvidia-x-cu13": ("1", facts())},
        cuda=None,
    )
    assert abi.base_cuda_variant(by_libs) == "cu12"
    assert abi.base_cuda_variant(manifest({"numpy": ("1", facts())}, cuda=None)) is None


def test_base_cuda_variant_order_of_sources():
    cu13_libs = {"nvidia-cublas-cu13": ("1", facts()), "nvidia-nccl-cu13": ("1", facts())}
    # the manifest's cuda field wins; its major is the part before the first dot
    assert abi.base_cuda_variant(manifest(cu13_libs, cuda="12.8")) == "cu12"
    assert abi.base_cuda_variant(manifest({}, cuda=" 12.8.1 ")) == "cu12"
    # without it, torch's local version wins over the majority of the other distributions
    with_torch = manifest({**cu13_libs, "torch": ("2.9.0+cu126", facts())}, cuda=None)
    assert abi.base_cuda_variant(with_torch) == "cu12"
    # the majority counts local version labels too, and the most common variant wins
    # even where it sorts after the others (cu13 x2 against cu12 x1)
    assert abi.base_cuda_variant(manifest({"torchaudio": ("2.9.0+cu126", facts())}, cuda=None)) == "cu12"
    majority = manifest(
        {"nvidia-cublas-cu12": ("1", facts()), "cupy-cuda13x": ("1", facts()), "torchaudio": ("2.9.0+cu130", facts())},
        cuda=None,
    )
    assert abi.base_cuda_variant(majority) == "cu13"


@pytest.mark.parametrize(
    "need,have,expected",
    [
        ("2.38", "2.35", True),
        ("2.35", "2.35", False),
        ("2.17", "2.35", False),
        ("2.9", "2.17", False),  # versions, not strings: 2.9 < 2.17
        ("2.17", "2.9", True),
        (None, "2.35", False),
        ("2.2.5", "2.35", False),
        ("2.17", None, True),
        ("2.17", "", True),  # a base of unknown glibc runs no ELF needs
    ],
)
def test_glibc_too_new(need, have, expected):
    assert abi.glibc_too_new(need, have) is expected


@pytest.mark.parametrize(
    "tag,expected",
    [
        ("none", True),
        ("abi3", True),
        ("cp312", True),
        ("py3", True),
        ("cp39", False),
        ("cp313", False),
        ("cp312t", False),
        (None, True),
        # compressed tag sets (cp311.cp312): one compatible member suffices
        ("cp311.cp312", True),
        ("cp312,cp313", True),
        ("cp310.cp311", False),
        ("cp312t.cp313", False),
    ],
)
def test_python_abi_ok(tag, expected):
    assert abi.python_abi_ok(tag, "cp312") is expected


# ------------------------------------------------------------------ the gate


def rules(findings):
    return sorted((f.name, f.rule) for f in findings)


def test_clean_overlay_passes_without_findings():
    res = abi.evaluate(
        BASE,
        [entry("ray", "2.59.0", facts(True, 11, 0, 0, "2.17", "cp312")), entry("colorful", "0.5.8", via=["ray"])],
        {},
    )
    assert res.ok and not res.notices and not res.allowed


def test_exact_coupled_move_and_addition_rejected():
    res = abi.evaluate(
        BASE,
        [
            entry("torch", "2.12.0", facts(True, 30, 0, 1, "2.28", "cp312"), base_version="2.11.0"),
            entry("xformers", "0.0.33", facts(True, 3, 0, 0, "2.28", "cp312"), via=["torch"]),
        ],
        {},
    )
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
        entry(
            "numpy",
            "2.3.5",
            facts(True, 20, 0, 0, "2.17", "cp312"),
            via=["opencv-python-headless"],
            base_version="1.26.4",
        ),
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
    base = manifest(
        {
            "numpy": ("1.26.4", facts(True, 20, 0, 0, "2.17", "cp312")),
            "scipy": ("1.15.0", facts(True, 9, 0, 9, "2.17", "cp312")),
        }
    )  # built against numpy 2
    res = abi.evaluate(
        base, [entry("numpy", "2.3.5", facts(True, 20, 0, 0, "2.17", "cp312"), base_version="1.26.4")], {}
    )
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
    base = manifest(
        {
            "numpy": ("2.3.5", facts(True, 20, 0, 0, "2.17", "cp312")),
            "torch": ("2.11.0", facts(True, 30, 0, 1, "2.28", "cp312")),
        }
    )
    res = abi.evaluate(
        base, [entry("numpy", "1.26.4", facts(True, 20, 0, 0, "2.17", "cp312"), base_version="2.3.5")], {}
    )
    assert rules(res.violations) == [("numpy", "numpy-abi")]
    assert res.violations[0].evidence == ["torch 2.11.0: 1 extension built against numpy 2.x"]


def test_glibc_and_python_abi_rejected():
    res = abi.evaluate(
        BASE,
        [
            entry("newglibc", "1.0.0", facts(True, 1, 0, 0, "2.99", "cp312")),
            entry("oldabi", "1.0.0", facts(True, 1, 0, 0, "2.2.5", "cp39")),
            entry("stableabi", "1.0.0", facts(True, 1, 0, 0, "2.2.5", "abi3")),
        ],
        {},
    )
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
    up = abi.evaluate(
        BASE, [entry("pyarrow", "15.0.0", facts(True, 5, 0, 0, "2.17", "cp312"), base_version="14.0.2")], {}
    )
    assert rules(up.notices) == [("pyarrow", "binary-move")]
    assert "newer than what vllm 0.26.0 shipped with" in up.notices[0].message


def test_allow_moves_violation_to_allowed_with_reason():
    entries = [
        entry("torch", "2.12.0", facts(True, 30, 0, 1, "2.28", "cp312"), base_version="2.11.0"),
        entry("cupy-cuda12x", "13.6.0", facts(True, 10, 0, 2, "2.17", "cp312")),
    ]
    res = abi.evaluate(BASE, entries, {"Torch": "tested on H100 with the 2.12 kernels"})
    assert rules(res.allowed) == [("torch", "exact-coupled")]
    assert res.allowed[0].reason == "tested on H100 with the 2.12 kernels"
    assert rules(res.violations) == [("cupy-cuda12x", "cuda-variant")]  # only the named one is waived


def test_chain_prefers_the_parent_that_excludes_the_base_version():
    final = {"numpy": ("numpy", "2.1.0"), "numpy2user": ("numpy2user", "1.0.0"), "fakearrow": ("fakearrow", "14.0.2")}
    via = {"numpy": ["-r overlay", "fakearrow", "numpy2user"], "numpy2user": ["-r overlay"]}
    requires = {"fakearrow": ["numpy>=1.16.6"], "numpy2user": ["numpy>=2"]}
    chain = abi.build_chain(
        "numpy", final, via, requires, overlay=["numpy2user", "numpy"], base_versions={"numpy": "1.26.4"}
    )
    assert chain == ["numpy 2.1.0", "numpy2user 1.0.0 (numpy>=2)", "overlay (numpy2user)"]
    # the overlay itself is the culprit when it asks for the new major
    chain2 = abi.build_chain(
        "numpy",
        final,
        {"numpy": ["-r overlay", "fakearrow"]},
        requires,
        overlay=["numpy>=2"],
        base_versions={"numpy": "1.26.4"},
    )
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


# ------------------------------------------------------------------ version helpers


@pytest.mark.parametrize(
    "version,major",
    [
        ("2.3.5", "2"),
        ("1.26.4", "1"),
        ("v2.0", "2"),  # PEP 440 allows a leading v
        ("1!2.0", "2"),  # the epoch is not the major
        ("2.x-custom", "2"),
        ("10_build", "10"),  # not PEP 440: the leading digits
        ("dev", None),
        ("", None),
        (None, None),
    ],
)
def test_major_of_a_version(version, major):
    assert abi._major(version) == major


def test_numpy_evidence_counts_a_missing_generation_as_zero():
    assert abi.numpy_evidence("x", "1.0", DistFacts(numpy_abi={}), "1") == "x 1.0: 0 extensions built against numpy 1.x"
    assert abi.numpy_evidence("x", "1.0", facts(np2=3), "2") == "x 1.0: 3 extensions built against numpy 2.x"


def test_target_environment_reads_the_bases_python_and_platform():
    # PEP 508 marker variables of the base interpreter (platform_release/version unknown: empty)
    assert target_environment("3.11", "aarch64-manylinux_2_28") == {
        "python_version": "3.11",
        "python_full_version": "3.11.0",
        "implementation_version": "3.11.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "aarch64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_version": "",
    }
    assert target_environment("3.12.4", "x86_64-manylinux_2_35")["python_version"] == "3.12"
    assert target_environment("3.12.4", "x86_64-manylinux_2_35")["python_full_version"] == "3.12.4"
    assert abi.DEFAULT_TARGET == target_environment("3.12", "x86_64-manylinux_2_35")


def test_the_gate_reads_chains_on_the_bases_platform():
    # opencv asks for another numpy per machine: the chain names the requirement that holds on the base's platform
    entries = [
        entry("numpy", "2.1.0", facts(True, 20, 0, 0, "2.17", "cp312"), via=["opencv"], base_version="1.26.4"),
        entry("opencv", "4.13", facts()),
    ]
    requires = {"opencv": ["numpy>=2; platform_machine == 'x86_64'", "numpy>=1.22; platform_machine == 'aarch64'"]}
    for platform, want in (("aarch64-manylinux_2_28", "numpy>=1.22"), ("x86_64-manylinux_2_35", "numpy>=2")):
        res = abi.evaluate(dataclasses.replace(BASE, platform=platform), entries, {}, requires=requires)
        chains = {tuple(f.chain) for f in res.violations + res.notices if f.name == "numpy"}
        assert chains == {("numpy 2.1.0", f"opencv 4.13 ({want})", "overlay (opencv)")}, platform


# ------------------------------------------------------------------ chains


def test_chain_requirement_is_the_one_whose_marker_holds_on_the_target():
    final = {"numpy": ("numpy", "2.1.0"), "opencv": ("opencv", "4.13")}
    via = {"numpy": ["opencv"]}
    requires = {
        "opencv": [
            "numpy (((",  # unparsable: skipped, the rest still read
            "numpy<1; sys_platform == 'win32'",  # marker false on Linux: skipped
            "numpy>=2; python_version >= '3.12'",
            "numpy>=1.21; python_version < '3.12'",
        ]
    }
    # the default target is CPython 3.12 on Linux (whatever interpreter runs the tool)
    assert abi.build_chain("numpy", final, via, requires) == ["numpy 2.1.0", "opencv 4.13 (numpy>=2)"]
    on_310 = abi.build_chain("numpy", final, via, requires, env=target_environment("3.10", "x86_64-manylinux_2_35"))
    assert on_310 == ["numpy 2.1.0", "opencv 4.13 (numpy>=1.21)"]
    # the overlay's own requirement is read on the target too
    overlay = ["numpy>=2; python_version >= '3.11'", "numpy>=1.21; python_version < '3.11'"]
    assert abi.build_chain(
        "numpy",
        final,
        {"numpy": ["-r overlay"]},
        overlay=overlay,
        base_versions={"numpy": "1.26.4"},
        env=target_environment("3.10", "x86_64-manylinux_2_35"),
    ) == ["numpy 2.1.0", "overlay (numpy>=1.21)"]
    # extras are kept, sorted; a requirement without a specifier names no version
    assert (
        abi.build_chain("numpy", final, via, {"opencv": ["numpy[typing,dev]>=2"]})[1]
        == "opencv 4.13 (numpy[dev,typing]>=2)"
    )
    assert abi.build_chain("numpy", final, via, {"opencv": ["numpy"]})[1] == "opencv 4.13"


def test_chain_culprit_is_a_parent_whose_requirement_excludes_the_base_version():
    final = {"numpy": ("numpy", "2.2.0"), "a": ("a", "1"), "b": ("b", "1")}
    # a has no requirement on numpy (it cannot be the culprit); b excludes the base's 1.26.4
    chain = abi.build_chain(
        "numpy", final, {"numpy": ["a", "b"]}, {"b": ["numpy>=2"]}, base_versions={"numpy": "1.26.4"}
    )
    assert chain == ["numpy 2.2.0", "b 1 (numpy>=2)"]
    # a base pre-release is judged as a version like any other: numpy<3 admits 2.1.0rc1
    chain = abi.build_chain(
        "numpy",
        final,
        {"numpy": ["a", "b"]},
        {"a": ["numpy<3"], "b": ["numpy>=2.2"]},
        base_versions={"numpy": "2.1.0rc1"},
    )
    assert chain == ["numpy 2.2.0", "b 1 (numpy>=2.2)"]
    # nobody excludes the base version: the first parent
    chain = abi.build_chain(
        "numpy", final, {"numpy": ["a", "b"]}, {"a": ["numpy<3"], "b": ["numpy>=1"]}, base_versions={"numpy": "1.26.4"}
    )
    assert chain == ["numpy 2.2.0", "a 1 (numpy<3)"]


def test_chain_ends_at_the_overlay_or_a_named_root():
    final = {"pillow": ("Pillow", "11.0"), "y": ("y", "1")}
    # only the overlay asks for it, without a specifier: the overlay, named by its display name
    assert abi.build_chain(
        "pillow", final, {"pillow": ["-r overlay"]}, overlay=["Pillow"], base_versions={"pillow": "10.0"}
    ) == ["Pillow 11.0", "overlay (Pillow)"]
    # a distribution new to the base that the overlay names: the overlay, not another parent
    assert abi.build_chain("pillow", final, {"pillow": ["-r overlay", "y"]}, overlay=["pillow>=11"]) == [
        "Pillow 11.0",
        "overlay (pillow>=11)",
    ]
    # a base version the overlay admits, and another parent: that parent
    assert abi.build_chain(
        "pillow", final, {"pillow": ["-r overlay", "y"]}, overlay=["pillow>=9"], base_versions={"pillow": "10.0"}
    ) == ["Pillow 11.0", "y 1"]
    # the base's own pins and other requirement files end the chain by name; -c lines are not parents
    assert abi.build_chain("pillow", final, {"pillow": ["-r base"]}) == ["Pillow 11.0", "base pin"]
    assert abi.build_chain("pillow", final, {"pillow": ["-c constraints", "-r extra"]}) == ["Pillow 11.0", "-r extra"]


def test_chain_of_names_outside_the_final_set_and_its_length():
    # names not in the final set are shown bare (no version)
    assert abi.build_chain("ghost", {}, {}) == ["ghost"]
    assert abi.build_chain("a", {"a": ("a", "1")}, {"a": ["b"], "b": ["c"]}) == ["a 1", "b", "c"]
    # a cycle that does not pass the start is cut too: a <- b <- c <- b
    assert abi.build_chain("a", {k: (k, "1") for k in "abc"}, {"a": ["b"], "b": ["c"], "c": ["b"]}) == [
        "a 1",
        "b 1",
        "c 1",
    ]
    # at most max_len links (default 8)
    names = [f"p{i}" for i in range(12)]
    via = {names[i]: [names[i + 1]] for i in range(11)}
    final = {n: (n, "1") for n in names}
    assert abi.build_chain("p0", final, via) == [f"p{i} 1" for i in range(8)]
    assert abi.build_chain("p0", final, via, max_len=3) == ["p0 1", "p1 1", "p2 1"]


# ------------------------------------------------------------------ the gate: decisions and findings


def test_vllm_on_a_base_without_the_exact_coupled_family_is_a_new_stack():
    ray_base = manifest(
        {
            "ray": ("2.59.0", facts(True, 11, 0, 0, "2.17", "cp312")),
            "numpy": ("2.3.5", facts(True, 20, 0, 0, "2.17", "cp312")),
        }
    )
    entries = [
        entry("vllm", "0.26.0", facts(True, 40, 0, 0, "2.31", "abi3")),
        entry("torch", "2.11.0", facts(True, 30, 0, 1, "2.28", "cp312"), via=["vllm"]),
    ]
    res = abi.evaluate(ray_base, entries, {}, vllm="0.26.0")
    assert res.ok and not res.allowed
    assert rules(res.notices) == [("torch", "new-vllm-stack"), ("vllm", "new-vllm-stack")]
    torch = next(f for f in res.notices if f.name == "torch")
    assert (torch.old, torch.new, torch.evidence, torch.chain) == (
        None,
        "2.11.0",
        [],
        ["torch 2.11.0", "vllm 0.26.0", "overlay (vllm)"],
    )
    assert torch.message.startswith("torch 2.11.0 is new on this base, which ships none of vllm's exact-coupled family")
    assert "installed with vllm 0.26.0 at the version its requirements pin" in torch.message
    # without vllm in the lock the family is coupled to nothing new: adding torch is a violation
    alone = abi.evaluate(ray_base, [entry("torch", "2.11.0", facts(True, 30, 0, 1, "2.28", "cp312"))], {})
    assert rules(alone.violations) == [("torch", "exact-coupled")]
    # on a base that ships the family, vllm in the lock does not make additions a new stack
    res = abi.evaluate(
        BASE,
        [
            entry("vllm", "0.27.0", facts(True, 40, 0, 0, "2.31", "abi3"), base_version="0.26.0"),
            entry("xformers", "0.0.33", facts(True, 3, 0, 0, "2.28", "cp312"), via=["vllm"]),
        ],
        {},
    )
    assert rules(res.violations) == [("vllm", "exact-coupled"), ("xformers", "exact-coupled")]
    xformers = next(f for f in res.violations if f.name == "xformers")
    assert "the lock adds xformers 0.0.33, which the base does not ship;" in xformers.message
    assert "vllm 0.26.0's compiled kernels" in xformers.message


def test_vllm_named_in_messages_is_the_base_vllm_or_unknown():
    no_vllm = manifest({"transformers": ("5.14.1", facts())})
    res = abi.evaluate(no_vllm, [entry("transformers", "5.24.0", base_version="5.14.1")], {})
    assert "newer than what vllm ? shipped with (5.14.1)" in res.notices[0].message
    res = abi.evaluate(no_vllm, [entry("transformers", "5.24.0", base_version="5.14.1")], {}, vllm="0.33.0")
    assert "newer than what vllm 0.33.0 shipped with (5.14.1)" in res.notices[0].message


def test_binary_rules_report_the_base_version_of_a_moving_distribution():
    # pyarrow is in the base at 14.0.2; each binary rule names the move, not a new distribution
    bad = [
        entry("pyarrow", "15.0.0+cu126", facts(True, 5, 0, 5, "2.17", "cp312"), base_version="14.0.2"),
        entry("transformers", "5.24.0", facts(True, 1, 0, 0, "2.99", "cp39"), base_version="5.14.1"),
    ]
    res = abi.evaluate(BASE, bad, {})
    got = sorted((f.name, f.rule, f.old, f.new) for f in res.violations)
    assert got == [
        ("pyarrow", "cuda-variant", "14.0.2", "15.0.0+cu126"),
        ("transformers", "glibc", "5.14.1", "5.24.0"),
        ("transformers", "python-abi", "5.14.1", "5.24.0"),
    ]
    cuda = next(f for f in res.violations if f.rule == "cuda-variant")
    # the variant is read from the local version label too
    assert cuda.message == "pyarrow 15.0.0+cu126 is built for CUDA 12 but the base runs CUDA 13."
    assert cuda.evidence == ["pyarrow 15.0.0+cu126: variant cu12 (from its name/version); base: cu13 (cuda 13.0)"]
    pyabi = next(f for f in res.violations if f.rule == "python-abi")
    assert "built for Python ABI cp39, the base interpreter is cp312 (Python 3.12)" in pyabi.message
    # a base without a cuda field names only the variant it found
    no_field = manifest({"torch": ("2.11.0+cu130", facts())}, cuda=None)
    res = abi.evaluate(no_field, [entry("cupy-cuda12x", "13.6.0", facts(True, 10, 0, 2, "2.17", "cp312"))], {})
    assert res.violations[0].evidence == ["cupy-cuda12x 13.6.0: variant cu12 (from its name/version); base: cu13"]


def test_binary_move_notice_when_either_side_is_binary():
    # the base build is binary, the lock's is pure Python (or the other way round): a binary move
    down = abi.evaluate(BASE, [entry("pyarrow", "13.0.0", facts(), base_version="14.0.2")], {})
    assert down.ok
    (n,) = down.notices
    assert (n.name, n.rule, n.old, n.new, n.evidence, n.chain) == (
        "pyarrow",
        "binary-move",
        "14.0.2",
        "13.0.0",
        [],
        ["pyarrow 13.0.0", "overlay (pyarrow)"],
    )
    assert n.message == (
        "binary base distribution pyarrow moves 14.0.2 -> 13.0.0: older than what vllm 0.26.0 "
        "shipped with; passed the binary checks — test it with this vllm before shipping."
    )
    up = abi.evaluate(
        BASE, [entry("transformers", "5.24.0", facts(True, 1, 0, 0, "2.17", "cp312"), base_version="5.14.1")], {}
    )
    assert rules(up.notices) == [("transformers", "binary-move")]


def test_pure_python_move_notice_is_newer_or_older_by_version_order():
    # version order, not string order: 5.9.0 -> 5.10.0 is an upgrade
    base = manifest({"transformers": ("5.9.0", facts())})
    (n,) = abi.evaluate(base, [entry("transformers", "5.10.0", base_version="5.9.0")], {}, vllm="0.26.0").notices
    assert (n.rule, n.old, n.new, n.evidence, n.chain) == (
        "newer-than-base",
        "5.9.0",
        "5.10.0",
        [],
        ["transformers 5.10.0", "overlay (transformers)"],
    )
    (n,) = abi.evaluate(base, [entry("transformers", "5.8.2", base_version="5.9.0")], {}, vllm="0.26.0").notices
    assert n.rule == "older-than-base"
    assert n.message == (
        "transformers 5.8.2 is older than what vllm 0.26.0 shipped with (5.9.0); "
        "pure Python, allowed — test it with this vllm before shipping."
    )
    # a version that is not PEP 440 never reaches the gate: the manifest refuses it at its boundary
    with pytest.raises(BadInput, match="not a PEP 440 version"):
        manifest({"inhouse": ("build-b", facts())})


def test_chains_use_the_base_versions_and_the_base_interpreter():
    # numpy is pulled by two parents; the one that excludes the base's 1.26.4 is the culprit
    entries = [
        entry(
            "numpy", "2.3.5", facts(True, 20, 0, 0, "2.17", "cp312"), via=["fakearrow", "opencv"], base_version="1.26.4"
        ),
        entry("fakearrow", "15.0.0", facts(True, 5, 0, 5, "2.17", "cp312"), via=["-r overlay"]),
        entry("opencv", "4.13", facts(True, 3, 0, 3, "2.17", "abi3"), via=["-r overlay"]),
    ]
    requires = {
        "fakearrow": ["numpy>=1.16"],
        "opencv": ["numpy>=2; python_version >= '3.11'", "numpy>=1.21; python_version < '3.11'"],
    }
    res = abi.evaluate(BASE, entries, {}, requires=requires, overlay=["opencv", "fakearrow"])
    (v,) = res.violations
    assert v.chain == ["numpy 2.3.5", "opencv 4.13 (numpy>=2)", "overlay (opencv)"]
    # on a Python 3.10 base opencv asks for numpy>=1.21: nobody excludes 1.26.4, the first parent is shown
    base310 = manifest({n: (d.version, d.facts) for n, d in BASE.distributions.items()}, python_version="3.10")
    res = abi.evaluate(base310, entries, {}, requires=requires, overlay=["opencv", "fakearrow"])
    v = next(f for f in res.violations if f.rule == "numpy-abi")
    assert v.chain == ["numpy 2.3.5", "fakearrow 15.0.0 (numpy>=1.16)", "overlay (fakearrow)"]


# ------------------------------------------------------------------ numpy evidence


def test_numpy_major_move_evidence_is_the_final_set_built_only_against_the_other_generation():
    base = manifest(
        {
            "numpy": ("1.26.4", facts(True, 20, 0, 0, "2.17", "cp312")),
            "pyarrow": ("14.0.2", facts(True, 5, 1, 0, "2.17", "cp312")),
            "halfext": ("1.0", DistFacts(binary=True, extensions=2, numpy_abi={"1": 2})),  # no count for 2.x
            "purelib": ("1.0", DistFacts(numpy_abi={})),  # no counts at all
            "dualext": ("1.0", facts(True, 2, 1, 1, "2.17", "cp312")),  # built against both: loads on 2.x
        }
    )
    # numpy's own extension modules are not evidence against numpy
    res = abi.evaluate(
        base, [entry("numpy", "2.3.5", facts(True, 20, 4, 0, "2.17", "cp312"), base_version="1.26.4")], {}
    )
    (v,) = res.violations
    assert (v.name, v.rule, v.old, v.new) == ("numpy", "numpy-abi", "1.26.4", "2.3.5")
    assert v.evidence == [
        "halfext 1.0: 2 extensions built against numpy 1.x",
        "pyarrow 14.0.2: 1 extension built against numpy 1.x",
    ]
    assert v.message == (
        "numpy would move 1.26.4 -> 2.3.5 (across a major version) while 2 distributions of "
        "the final set ship extensions built against numpy 1.x, which cannot be loaded by "
        "numpy 2.3.5."
    )


def test_numpy_major_downgrade_evidence_skips_distributions_built_against_both():
    base = manifest(
        {
            "numpy": ("2.3.5", facts(True, 20, 0, 0, "2.17", "cp312")),
            "torch": ("2.11.0", facts(True, 30, 0, 1, "2.28", "cp312")),
            "dualext": ("1.0", facts(True, 2, 1, 1, "2.17", "cp312")),
        }
    )
    res = abi.evaluate(
        base, [entry("numpy", "1.26.4", facts(True, 20, 0, 0, "2.17", "cp312"), base_version="2.3.5")], {}
    )
    (v,) = res.violations
    assert v.evidence == ["torch 2.11.0: 1 extension built against numpy 2.x"]
    assert "while 1 distribution of the final set ships extensions built against numpy 2.x" in v.message
    # numpy staying on 2.x: extensions of the base are not judged again
    assert abi.evaluate(
        base, [entry("numpy", "2.4.0", facts(True, 20, 0, 0, "2.17", "cp312"), base_version="2.3.5")], {}
    ).ok


def test_overlay_extensions_built_only_against_numpy1_on_a_numpy2_final_set():
    base = manifest(
        {
            "numpy": ("2.3.5", facts(True, 20, 0, 0, "2.17", "cp312")),
            "oldext": ("1.0", facts(True, 1, 0, 1, "2.17", "cp312")),
        }
    )
    entries = [
        entry("numpy", "2.4.0", facts(True, 20, 1, 0, "2.17", "cp312"), base_version="2.3.5"),  # its own modules
        entry("aext", "1.0", DistFacts(binary=True, extensions=1, numpy_abi={"1": 1})),  # no count for 2.x
        entry("bpure", "1.0", DistFacts(numpy_abi={})),
        entry("cdual", "1.0", facts(True, 3, 2, 1, "2.17", "cp312")),  # built against both: loads
        entry("oldext", "0.9", facts(True, 1, 1, 0, "2.17", "cp312"), base_version="1.0"),
        entry("zext", "3.0", facts(True, 4, 4, 0, "2.17", "cp312"), via=["oldext"]),
    ]
    res = abi.evaluate(base, entries, {})
    got = [(f.name, f.old, f.new) for f in res.violations if f.rule == "numpy-abi"]
    assert got == [("aext", None, "1.0"), ("oldext", "1.0", "0.9"), ("zext", None, "3.0")]
    old = next(f for f in res.violations if f.name == "oldext")
    assert old.message == "oldext 0.9 ships extensions built against numpy 1.x, the final set has numpy 2.4.0."
    assert old.evidence == ["oldext 0.9: 1 extension built against numpy 1.x"]
    assert old.chain == ["oldext 0.9", "overlay (oldext)"]
    # the ways out of an extension's finding do not offer a numpy-2 release list (that is numpy's finding)
    z = next(f for f in res.violations if f.name == "zext")
    assert abi.ways_out(z) == [
        "drop the overlay requirement that pulls it (oldext) or pin an older oldext with --with",
        "--allow-abi-change zext --reason TEXT (recorded in the lock header; you own the risk)",
    ]
    # a base without numpy: the lock's numpy is the final set's
    res = abi.evaluate(manifest({}), [entry("numpy", "2.3.5"), entry("aext", "1.0", facts(True, 1, 1, 0))], {})
    assert [(f.name, f.rule) for f in res.violations] == [("aext", "numpy-abi")]


# ------------------------------------------------------------------ ways out and messages

ALLOW_X = "--allow-abi-change XlsxWriter --reason TEXT (recorded in the lock header; you own the risk)"


@pytest.mark.parametrize(
    "chain,first",
    [
        # pulled by nothing known: only the waiver
        (["XlsxWriter 3.2"], None),
        # the overlay asks for it directly: its requirement is named (or the name, when it has none)
        (["XlsxWriter 3.2", "overlay (XlsxWriter>=3)"], "drop or loosen the overlay requirement 'XlsxWriter>=3'"),
        (["XlsxWriter 3.2", "overlay"], "drop or loosen the overlay requirement 'XlsxWriter'"),
        # pulled through a parent that the overlay asks for: drop that, or pin an older first parent
        (
            ["XlsxWriter 3.2", "Xy 2 (xlsxwriter>=3)", "overlay (Xy)"],
            "drop the overlay requirement that pulls it (Xy) or pin an older Xy with --with",
        ),
        (
            ["XlsxWriter 3.2", "Xy 2 (xlsxwriter>=3)", "z 3 (xy>=2)", "overlay (z<4)"],
            "drop the overlay requirement that pulls it (z<4) or pin an older Xy with --with",
        ),
        # pulled by a parent not from the overlay: pin an older parent (named with its version)
        (
            ["XlsxWriter 3.2", "Xy 2 (xlsxwriter>=3)"],
            "pin an older version of the package that pulls it (Xy 2) with --with so it fits the base",
        ),
        (
            ["XlsxWriter 3.2", "Xy 2 (xlsxwriter>=3)", "vllm 0.26.0"],
            "pin an older version of the package that pulls it (Xy 2) with --with so it fits the base",
        ),
    ],
)
def test_ways_out_follow_the_shape_of_the_chain(chain, first):
    fd = abi.Finding("XlsxWriter", "glibc", None, "3.2", "needs a newer glibc", [], chain)
    assert abi.ways_out(fd) == ([first] if first else []) + [ALLOW_X]


def numpy_finding(n: int) -> abi.Finding:
    evidence = [f"ext{i} 1.{i}: 1 extension built against numpy 1.x" for i in range(n)]
    return abi.Finding("numpy", "numpy-abi", "1.26.4", "2.3.5", "m", evidence, ["numpy 2.3.5"])


def test_numpy2_way_out_names_at_most_four_distributions_of_the_evidence():
    four = abi.ways_out(numpy_finding(4))
    assert four[0] == (
        "move ext0, ext1, ext2, ext3 to a release built against numpy 2 (--with 'ext0>1.0' "
        "--with 'ext1>1.1' --with 'ext2>1.2' --with 'ext3>1.3'; the gate checks the new files)"
    )
    five = abi.ways_out(numpy_finding(5))
    assert five[0] == (
        "move ext0, ext1, ext2, ext3, ... to a release built against numpy 2 (--with 'ext0>1.0' "
        "--with 'ext1>1.1' --with 'ext2>1.2' --with 'ext3>1.3'; the gate checks the new files)"
    )
    assert five[1] == "--allow-abi-change numpy --reason TEXT (recorded in the lock header; you own the risk)"
    assert len(five) == 2


def test_format_finding_lines():
    fd = abi.Finding(
        "numpy",
        "numpy-abi",
        "1.26.4",
        "2.3.5",
        "it breaks.",
        ["ev one", "ev two"],
        ["numpy 2.3.5", "overlay (numpy>=2)"],
        reason="rebuilt next layer",
    )
    assert abi.format_finding(fd) == (
        "- [numpy-abi] numpy 1.26.4 -> 2.3.5: it breaks.\n"
        "    evidence: ev one\n"
        "    evidence: ev two\n"
        "    pulled by: numpy 2.3.5 ← overlay (numpy>=2)\n"
        "    allowed: rebuilt next layer"
    )
    # a chain of the distribution alone pulls nothing; no reason, no allowed line
    bare = abi.Finding("x", "glibc", None, "1.0", "old glibc.", [], ["x 1.0"])
    assert abi.format_finding(bare) == "- [glibc] x 1.0 (new, not in the base): old glibc."


def test_format_rejection_and_notices_text():
    a = abi.Finding("x", "glibc", None, "1.0", "needs glibc.", [], ["x 1.0", "overlay (x>=1)"])
    b = abi.Finding("y", "python-abi", "1.0", "2.0", "wrong abi.", [], ["y 2.0"])
    res = abi.GateResult(violations=[a, b])
    assert abi.format_rejection(res) == (
        "- [glibc] x 1.0 (new, not in the base): needs glibc.\n"
        "    pulled by: x 1.0 ← overlay (x>=1)\n"
        "    ways out: drop or loosen the overlay requirement 'x>=1'; or "
        "--allow-abi-change x --reason TEXT (recorded in the lock header; you own the risk)\n"
        "- [python-abi] y 1.0 -> 2.0: wrong abi.\n"
        "    ways out: --allow-abi-change y --reason TEXT (recorded in the lock header; you own the risk)"
    )
    n = abi.Finding("t", "newer-than-base", "1", "2", "newer.", [], ["t 2"])
    w = abi.Finding("torch", "exact-coupled", "2.11.0", "2.12.0", "coupled.", [], ["torch 2.12.0"], reason="tested")
    assert abi.format_notices(abi.GateResult(notices=[n], allowed=[w])) == (
        "- [newer-than-base] t 1 -> 2: newer.\n- [exact-coupled] torch 2.11.0 -> 2.12.0: coupled.\n    allowed: tested"
    )


def test_result_to_dict_has_every_field():
    v = abi.Finding("x", "glibc", "0.9", "1.0", "msg", ["ev"], ["x 1.0", "overlay"])
    w = abi.Finding("torch", "exact-coupled", "2.11.0", "2.12.0", "coupled", [], ["torch 2.12.0"], reason="tested")
    n = abi.Finding("t", "newer-than-base", "1", "2", "newer", [], [])
    assert abi.GateResult(violations=[v], notices=[n], allowed=[w]).to_dict() == {
        "ok": False,
        "violations": [
            {
                "name": "x",
                "rule": "glibc",
                "old": "0.9",
                "new": "1.0",
                "message": "msg",
                "evidence": ["ev"],
                "chain": ["x 1.0", "overlay"],
                "reason": None,
            }
        ],
        "notices": [
            {
                "name": "t",
                "rule": "newer-than-base",
                "old": "1",
                "new": "2",
                "message": "newer",
                "evidence": [],
                "chain": [],
                "reason": None,
            }
        ],
        "allowed": [
            {
                "name": "torch",
                "rule": "exact-coupled",
                "old": "2.11.0",
                "new": "2.12.0",
                "message": "coupled",
                "evidence": [],
                "chain": ["torch 2.12.0"],
                "reason": "tested",
            }
        ],
    }
    assert abi.GateResult(notices=[n]).to_dict()["ok"] is True


def test_one_release_spelled_two_ways_is_no_move():
    # PEP 440: 2.11 is 2.11.0 and 14.0.2.0 is 14.0.2 -- the same release as the base's, so no
    # exact-coupled move and no binary-move notice; 2.11.1 is a move.
    same = abi.evaluate(
        BASE,
        [
            entry("torch", "2.11", facts(True, 30, 0, 1, "2.28", "cp312"), base_version="2.11.0"),
            entry("pyarrow", "14.0.2.0", facts(True, 5, 1, 0, "2.17", "cp312"), base_version="14.0.2"),
        ],
        {},
    )
    assert same.ok and not same.notices and not same.allowed
    moved = abi.evaluate(
        BASE,
        [
            entry("torch", "2.11.1", facts(True, 30, 0, 1, "2.28", "cp312"), base_version="2.11.0"),
            entry("pyarrow", "14.0.3", facts(True, 5, 1, 0, "2.17", "cp312"), base_version="14.0.2"),
        ],
        {},
    )
    assert rules(moved.violations) == [("torch", "exact-coupled")]
    assert [(f.name, f.rule) for f in moved.notices] == [("pyarrow", abi.BINARY_MOVE)]


# ------------------------------------------------------------------ what the image holds but the manifest cannot
# version


def test_a_lock_pinning_a_name_the_base_cannot_version_is_a_conflict_with_the_reason():
    import dataclasses

    base = dataclasses.replace(
        BASE,
        lacks={
            "unversioned": {
                "mooncake_transfer_engine": "off-index: mooncake-transfer-engine 0.3.10.post2 from a URL off the index "
                "(vllm-0.26.0.tar.gz docker/Dockerfile:1029)"
            }
        },
    )
    res = abi.evaluate(base, [entry("mooncake-transfer-engine", "0.3.12.post1", via=("-r overlay", "lmcache"))], {})
    assert not res.ok and [f.rule for f in res.violations] == [abi.UNVERSIONED_IN_BASE]
    fd = res.violations[0]
    assert fd.old is None and fd.message == (
        "the lock pins mooncake-transfer-engine 0.3.12.post1, but the image already holds its own "
        "mooncake-transfer-engine, which the base manifest cannot version; installing this one on top would "
        "replace the image's build: a conflict with the base."
    )
    assert fd.evidence == [
        "mooncake-transfer-engine: off-index: mooncake-transfer-engine 0.3.10.post2 from a URL off "
        "the index (vllm-0.26.0.tar.gz docker/Dockerfile:1029)"
    ]
    assert abi.UNVERSIONED_IN_BASE in abi.VIOLATION_RULES
    allowed = abi.evaluate(
        base,
        [entry("mooncake-transfer-engine", "0.3.12.post1")],
        {"mooncake-transfer-engine": "replace the image's wheel on purpose"},
    )
    assert allowed.ok and [f.rule for f in allowed.allowed] == [abi.UNVERSIONED_IN_BASE]
    assert abi.evaluate(BASE, [entry("mooncake-transfer-engine", "0.3.12.post1")], {}).ok  # nothing known: no verdict
    # a name the manifest also versions is judged by that version: the same version on top is no finding
    both = dataclasses.replace(BASE, lacks={"unversioned": {"transformers": "also listed by hand"}})
    same = abi.evaluate(both, [entry("transformers", "5.14.1", base_version="5.14.1")], {})
    assert same.ok and abi.UNVERSIONED_IN_BASE not in [f.rule for f in same.violations + same.allowed + same.notices]
