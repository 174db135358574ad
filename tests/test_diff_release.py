"""`diff` across vLLM releases: the base move is its own group, on top, from the two base manifests."""

from __future__ import annotations

import copy
import json

from click.testing import CliRunner

from builder.cli import main
from builder.resolve.diff import base_move, diff_locks, to_document
from builder.resolve.lockfile import load_lock
from builder.resolve.manifest import Distribution, load_manifest
from builder.spec import default_base_manifest, default_lock_path, supported_vllm_versions


def _moved(m, **versions):
    m = copy.deepcopy(m)
    for name, v in versions.items():
        d = m.get(name)
        m.distributions[d.key] = Distribution(name=d.name, version=v, facts=d.facts)
    return m


def test_base_move_names_each_fact_that_moved_and_nothing_else():
    old = load_manifest(default_base_manifest("0.26.0"))
    new = _moved(old, torch="2.14.0", transformers="5.20.2", vllm="0.33.0")
    new.glibc, new.image_ref = "2.39", "vllm/vllm-openai:v0.33.0"
    got = {h.key: (h.old, h.new) for h in base_move(old, new)}
    assert got == {
        "image": ("vllm/vllm-openai:v0.26.0", "vllm/vllm-openai:v0.33.0"),
        "torch": ("2.11.0", "2.14.0"),
        "glibc": ("2.35", "2.39"),
        "transformers": ("5.14.1", "5.20.2"),
        "vllm": ("0.26.0", "0.33.0"),
    }
    assert base_move(old, copy.deepcopy(old)) == []


def test_the_base_move_group_comes_first_in_every_format():
    old_m = load_manifest(default_base_manifest("0.26.0"))
    new_m = _moved(old_m, torch="2.13.0", numpy="2.4.0")
    lock = load_lock(default_lock_path("0.26.0"))
    d = diff_locks(lock, lock, old_base=old_m, new_base=new_m, old_label="a", new_label="b")
    assert [h.key for h in d.base_move] == ["torch", "numpy"]
    doc = to_document(d)
    assert doc.sections[0].title.startswith("0. base move") and doc.sections[0].rows[0] == ["torch", "2.11.0", "2.13.0"]
    assert d.to_dict()["base_move"][0] == {"key": "torch", "old": "2.11.0", "new": "2.13.0"}
    same = diff_locks(lock, lock, old_base=old_m, new_base=old_m)
    assert "base_move" not in same.to_dict() and same.status == "unchanged"


def test_diff_of_two_shipped_release_locks_leads_with_the_base_move():
    releases = supported_vllm_versions()
    old, new = releases[0], releases[-1]
    assert old != new and default_lock_path(old).exists() and default_lock_path(new).exists()
    r = CliRunner().invoke(main, ["diff", str(default_lock_path(old)), str(default_lock_path(new)), "--format", "json"])
    assert r.exit_code in (0, 1), r.output
    doc = json.loads(r.stdout)
    moves = {m["key"]: (m["old"], m["new"]) for m in doc["locks"][0]["base_move"]}
    assert moves["vllm"] == (old, new) and "torch" in moves
    serve = [h for h in doc["locks"][0]["header"] if h["key"] == "serve-backend"]  # the Serve path changing is news
    assert serve == [{"key": "serve-backend", "old": "ray-serve-llm", "new": "vllm-server"}]
    text = CliRunner().invoke(main, ["diff", str(default_lock_path(old)), str(default_lock_path(new))]).output
    first_group = min(text.index(f"\n{g}. ") for g in range(1, 8) if f"\n{g}. " in text)
    assert text.index("\n0. base move") < first_group
