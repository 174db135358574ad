"""Probe for 0002-ple-empty-shard-names.patch, run through vLLM's own gemma4 loaders on CPU.

Drives Gemma4ForCausalLM.load_weights (and the Gemma4Model.load_weights it calls) and
Gemma4ForConditionalGeneration.load_weights (gemma4_mm, through its hf_to_vllm_mapper)
on a small parameter tree shaped like Gemma4Model's per-layer-embedding (PLE) table.
The table must load, equal to the reference, under the long, mid and short names with
an empty shard index (`.shard_`), without it, and as numbered row blocks; each load logs
one line naming the checkpoint tensor(s); a missing shard and a wrong shape are errors.
Prints one PROBE-RESULT line (builder/probe.py).
"""
import importlib.machinery
import json
import logging
import sys
import types

import torch
from torch import nn

checks = []


def check(name, ok, detail=""):
    checks.append({"name": name, "ok": bool(ok), "detail": str(detail)[:600]})


class Grab(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, rec):
        self.records.append(rec.getMessage())


def stub_torchvision():
    """transformers' Gemma4 image processor imports torchvision, which does not load on torch+cpu here;
    the loaders under test never use it."""
    if "torchvision" in sys.modules:
        return

    class _Meta(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Meta(name, (), {})

    class _Stub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Meta(name, (), {})

    for n in ("torchvision", "torchvision.transforms", "torchvision.transforms.v2",
              "torchvision.transforms.v2.functional", "torchvision.transforms.functional", "torchvision.io"):
        stub = _Stub(n)
        stub.__spec__ = importlib.machinery.ModuleSpec(n, None)
        stub.__path__ = []
        sys.modules[n] = stub


import vllm.model_executor.models.gemma4 as g4  # noqa: E402

V, L, D = 6, 2, 3
cfg = types.SimpleNamespace(tie_word_embeddings=False, attention_k_eq_v=False, layer_types=["full_attention"] * L,
                            num_experts=None, hidden_size_per_layer_input=D, vocab_size_per_layer_input=V,
                            vocab_size=V, num_hidden_layers=L, enable_moe_block=False)
TABLE = torch.arange(1, V * L * D + 1, dtype=torch.float32).reshape(V, L * D)


class Text(nn.Module):  # the parameter tree Gemma4Model exposes for PLE, loaded by its own load_weights
    load_weights = g4.Gemma4Model.load_weights

    def __init__(self):
        super().__init__()
        self.config = cfg
        if hasattr(g4, "_gemma4_layer_weights_mapper"):  # releases whose Gemma4Model builds its mapper
            self.hf_to_vllm_mapper = g4._gemma4_layer_weights_mapper(cfg)
        self.embed_tokens_per_layer = nn.Module()
        self.embed_tokens_per_layer.weight = nn.Parameter(torch.zeros(V, L * D), requires_grad=False)


class CausalLM(nn.Module):  # loaded by Gemma4ForCausalLM.load_weights (vLLM's own code)
    load_weights = g4.Gemma4ForCausalLM.load_weights
    hf_to_vllm_mapper = getattr(g4.Gemma4ForCausalLM, "hf_to_vllm_mapper", None)

    def __init__(self):
        super().__init__()
        self.config = cfg
        self.model = Text()


def load(names, rows=None, mm=False):
    weights = [(n, TABLE[a:b].clone()) for n, (a, b) in zip(names, rows or [(0, V)] * len(names))]
    grab = Grab()
    log = logging.getLogger(g4.__name__)
    log.addHandler(grab)
    log.setLevel(logging.INFO)
    if mm:  # imported outside the try: a module that does not import is a probe error, not evidence
        stub_torchvision()
        import vllm.model_executor.models.gemma4_mm as g4mm
    try:
        if mm:
            class MM(nn.Module):
                hf_to_vllm_mapper = g4mm.Gemma4ForConditionalGeneration.hf_to_vllm_mapper
                load_weights = g4mm.Gemma4ForConditionalGeneration.load_weights

                def __init__(self):
                    super().__init__()
                    self.config = types.SimpleNamespace(text_config=cfg)
                    self.audio_tower = None
                    self.language_model = CausalLM()

            m = MM()
            loaded = m.load_weights(weights)
            w = m.language_model.model.embed_tokens_per_layer.weight
        else:
            m = CausalLM()
            loaded = m.load_weights(weights)
            w = m.model.embed_tokens_per_layer.weight
        return {"loaded": sorted(loaded or []), "equal": bool(torch.equal(w, TABLE)),
                "logs": [r for r in grab.records if "per-layer embedding" in r]}
    except Exception as e:  # the probe reports what vLLM's code did, errors included
        return {"error": f"{type(e).__name__}: {e}", "logs": grab.records}
    finally:
        log.removeHandler(grab)


PLE = "embed_tokens_per_layer"
EMPTY = [f"model.language_model.{PLE}.shard_.weight", f"model.{PLE}.shard_.weight", f"{PLE}.shard_.weight"]
PLAIN = [f"model.language_model.{PLE}.weight", f"{PLE}.weight"]

for mm in (False, True):
    path = "gemma4_mm" if mm else "gemma4"
    for n in EMPTY + PLAIN:
        r = load([n], mm=mm)
        check(f"{path}: table under {n} loads equal to the reference", r.get("equal") is True, r)
        if n in EMPTY:
            logs = r.get("logs") or []
            check(f"{path}: one log line names {n}", len(logs) == 1 and repr(n) in logs[0], logs)
    r = load([f"model.language_model.{PLE}.shard_{i}.weight" for i in (2, 0, 1)], [(4, 6), (0, 2), (2, 4)], mm=mm)
    check(f"{path}: numbered shards concatenate in index order", r.get("equal") is True, r)
    check(f"{path}: one log line names the shards", len(r.get("logs") or []) == 1
          and f"{PLE}.shard_0.weight" in r["logs"][0], r.get("logs"))
    r = load([f"{PLE}.shard_{i}.weight" for i in (0, 1)], [(0, 3), (3, 6)], mm=mm)
    check(f"{path}: short numbered shards load", r.get("equal") is True, r)
    r = load([f"model.{PLE}.shard_{i}.weight" for i in (0, 2)], [(0, 3), (3, 6)], mm=mm)
    check(f"{path}: a missing shard is an error naming it", "shard(s) [1] missing" in r.get("error", ""), r)
    r = load([f"{PLE}.shard_.weight"], [(0, 5)], mm=mm)
    check(f"{path}: a wrong table shape is an error", "has shape (5, 6), expected (6, 6)" in r.get("error", ""), r)
print("PROBE-RESULT " + json.dumps({"checks": checks}))
