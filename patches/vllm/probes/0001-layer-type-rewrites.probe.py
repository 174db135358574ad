"""Probe for 0001-layer-type-rewrites.patch, run through vLLM's own config parser on CPU.

Configs declaring `qwen_sparse_attention` at given layer indices parse with
vllm.transformers_utils.config.HFConfigParser; exactly those indices become
`full_attention`, every other entry is unchanged, and one warning names the indices
and the mapping.  VLLM_LAYER_TYPE_REWRITES: "{}" turns the rewrite off, bad JSON is a
ValueError naming the variable.  Prints one PROBE-RESULT line (builder/probe.py).
"""
import json
import logging
import os
from pathlib import Path

# imported here, outside every check: a module that does not import is a probe error, not evidence
from vllm.transformers_utils.config import HFConfigParser

checks = []


def check(name, ok, detail=""):
    checks.append({"name": name, "ok": bool(ok), "detail": str(detail)[:600]})


class Grab(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, rec):
        if rec.levelno >= logging.WARNING:
            self.records.append(rec.getMessage())


def write(name, doc):
    d = Path(name)
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(doc))
    return str(d.resolve())


def parse(model, env=None):
    grab = Grab()
    log = logging.getLogger("vllm.transformers_utils.config")
    log.addHandler(grab)
    if env is None:
        os.environ.pop("VLLM_LAYER_TYPE_REWRITES", None)
    else:
        os.environ["VLLM_LAYER_TYPE_REWRITES"] = env
    try:
        _, cfg = HFConfigParser().parse(model, trust_remote_code=False)
        lt = getattr(cfg.get_text_config(), "layer_types", None)
        return {"layer_types": list(lt) if lt is not None else None,
                "warnings": [w for w in grab.records if "layer_types" in w]}
    except Exception as e:  # the probe reports what vLLM's code did, errors included
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        log.removeHandler(grab)
        os.environ.pop("VLLM_LAYER_TYPE_REWRITES", None)


DECLARED = ["linear_attention", "qwen_sparse_attention", "linear_attention", "qwen_sparse_attention",
            "linear_attention", "linear_attention", "linear_attention", "qwen_sparse_attention"]
IDX = [i for i, t in enumerate(DECLARED) if t == "qwen_sparse_attention"]


def qwen_next(layer_types):
    return {"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"],
            "num_hidden_layers": len(layer_types), "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "layer_types": layer_types}


declared = write("declared", qwen_next(DECLARED))
plain = write("plain", qwen_next(["linear_attention", "full_attention"]))
nested = write("nested", {
    "model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
    "text_config": {"model_type": "qwen3_5_text", "num_hidden_layers": 4, "hidden_size": 64, "head_dim": 16,
                    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                    "vocab_size": 128,
                    "layer_types": ["linear_attention", "qwen_sparse_attention", "linear_attention",
                                    "full_attention"]}})

# "{}" first: before any rewrite widened transformers' allowed types in this process
off = parse(declared, "{}")
lt = off.get("layer_types")
check("env '{}' turns the rewrite off", "error" in off or all(lt[i] != "full_attention" for i in IDX), off)

got = parse(declared)
want = ["full_attention" if i in IDX else t for i, t in enumerate(DECLARED)]
lt = got.get("layer_types")
check("declared qwen_sparse_attention parses", "error" not in got, got.get("error", ""))
check("exactly the declared indices become full_attention",
      lt is not None and [lt[i] for i in IDX] == ["full_attention"] * len(IDX)
      and all(lt[i] == DECLARED[i] for i in range(len(DECLARED)) if i not in IDX), lt)
w = got.get("warnings") or []
check("one warning naming the indices and the mapping",
      len(w) == 1 and str(IDX) in w[0] and "'qwen_sparse_attention': 'full_attention'" in w[0], w)

mapped = parse(declared, '{"qwen_sparse_attention": "sliding_attention"}')
check("VLLM_LAYER_TYPE_REWRITES replaces the map",
      mapped.get("layer_types") == ["sliding_attention" if i in IDX else t for i, t in enumerate(DECLARED)], mapped)
bad = parse(declared, "{not json")
check("bad VLLM_LAYER_TYPE_REWRITES is a ValueError naming it",
      "VLLM_LAYER_TYPE_REWRITES" in bad.get("error", "") and bad["error"].startswith("ValueError"), bad)
p = parse(plain)
check("a config declaring no mapped type is untouched",
      p == {"layer_types": ["linear_attention", "full_attention"], "warnings": []}, p)
n = parse(nested)
check("a nested text_config is rewritten",
      n.get("layer_types") == ["linear_attention", "full_attention", "linear_attention", "full_attention"]
      and len(n.get("warnings") or []) == 1 and "[1]" in n["warnings"][0], n)
print("PROBE-RESULT " + json.dumps({"checks": checks}))
