"""The ``lockstep`` rule: the shipped table (with its sources), a spec's ``[[lockstep]]`` entries, and the gate's
verdicts on families that do or do not move together."""

from __future__ import annotations

import pytest

from builder.errors import BadInput
from builder.resolve import abi, lockstep
from builder.resolve.lock import LockRequest, inputs_sha256
from builder.spec import parse_spec
from tests.test_abi import entry, facts, manifest

FI = ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")


def test_the_shipped_table_names_the_flashinfer_trio_with_its_source():
    [fam] = [f for f in lockstep.shipped() if f.name == "flashinfer"]
    assert fam.kind == "same-version" and set(fam.members) == set(FI)
    assert "_check_cubin_version" in fam.source
    assert all(f.source.strip() for f in lockstep.shipped())


def _base(**dists):
    return manifest({"vllm": ("0.34.0", facts()), **{k: (v, facts()) for k, v in dists.items()}})


def _rules(result, name):
    return [f.rule for f in result.violations if f.name == name]


def test_a_member_moved_alone_is_rejected_naming_it_and_the_others():
    base = _base(**{"flashinfer-python": "0.6.13", "flashinfer-cubin": "0.6.13"})
    result = abi.evaluate(base, [entry("flashinfer-cubin", "0.6.14", base_version="0.6.13")])
    [fd] = [f for f in result.violations if f.rule == abi.LOCKSTEP]
    assert fd.name == "flashinfer-cubin"
    assert "moves flashinfer-cubin to 0.6.14" in fd.message
    assert "flashinfer-python 0.6.13 (the base)" in fd.message
    assert any("_check_cubin_version" in ev for ev in fd.evidence)
    assert any("move the other members" in w for w in abi.ways_out(fd))


def test_members_moved_together_pass_and_a_local_suffix_is_ignored():
    base = _base(**{"flashinfer-python": "0.6.13", "flashinfer-cubin": "0.6.13"})
    moved = [
        entry("flashinfer-python", "0.6.14", base_version="0.6.13"),
        entry("flashinfer-cubin", "0.6.14", base_version="0.6.13"),
        entry("flashinfer-jit-cache", "0.6.14+cu130"),
    ]
    assert not any(f.rule == abi.LOCKSTEP for f in abi.evaluate(base, moved).violations)


def test_a_base_that_is_already_out_of_step_is_not_the_locks_doing():
    base = _base(**{"flashinfer-python": "0.6.13", "flashinfer-cubin": "0.6.12"})
    assert not any(f.rule == abi.LOCKSTEP for f in abi.evaluate(base, [entry("rich", "14.0.0")]).violations)


def test_a_requires_entry_from_the_spec():
    spec = parse_spec(
        '[[lockstep]]\nname = "lmcache-vllm"\nkind = "requires"\nwhen = "lmcache>=0.3.10"\n'
        'needs = "vllm>=0.35"\nsource = "the connector\'s compatibility table"\n',
        "build-image.toml",
    )
    fams = lockstep.all_families(lockstep.parse_families(spec.lockstep, "spec"))
    base = _base()
    bad = abi.evaluate(base, [entry("lmcache", "0.3.10")], lockstep=fams)
    [fd] = [f for f in bad.violations if f.rule == abi.LOCKSTEP]
    assert fd.name == "lmcache" and "vllm>=0.35" in fd.message and "vllm 0.34.0" in fd.message
    assert "compatibility table" in fd.evidence[0]
    assert abi.evaluate(base, [entry("lmcache", "0.3.9")], lockstep=fams).ok
    assert abi.evaluate(base, [entry("rich", "14.0.0")], lockstep=fams).ok


@pytest.mark.parametrize(
    "row,match",
    [
        ({"name": "x", "kind": "same-version", "members": ["a", "b"]}, "source"),
        ({"name": "x", "kind": "same-version", "members": ["a"], "source": "s"}, "two or more"),
        ({"name": "x", "kind": "loose", "members": ["a", "b"], "source": "s"}, "kind"),
        ({"name": "x", "kind": "requires", "when": "a>=1", "needs": "b @ http://x", "source": "s"}, "no URL"),
        ({"name": "x", "kind": "requires", "when": "a>=1", "source": "s"}, "'when' and 'needs'"),
        ({"name": "x", "kind": "requires", "when": "a>=1", "needs": "b", "source": "s", "typo": 1}, "unknown key"),
        ({"name": "x", "kind": "same-version", "members": ["a", "b;rm"], "source": "s"}, "members"),
        ({"name": "x\n", "kind": "same-version", "members": ["a", "b"], "source": "s"}, "name"),
    ],
)
def test_an_entry_that_is_not_a_rule_is_refused_naming_it(row, match):
    with pytest.raises(BadInput, match=match) as exc:
        lockstep.parse_families([row], "spec b.toml 'lockstep'")
    assert "spec b.toml 'lockstep'[0]" in exc.value.message


def test_the_spec_families_are_an_input_of_the_lock_only_when_given():
    base = _base()
    plain = LockRequest(vllm="0.34.0", base=base, base_bytes=b"{}", overlay=["rich"])
    fam = lockstep.parse_families([{"name": "x", "kind": "same-version", "members": ["a", "b"], "source": "s"}], "spec")
    with_fam = LockRequest(vllm="0.34.0", base=base, base_bytes=b"{}", overlay=["rich"], lockstep=fam)
    assert inputs_sha256(plain, "0.9") != inputs_sha256(with_fam, "0.9")
