"""Tiny synthetic checkpoints for the GPU smoke proof (and any test that needs one).

Random weights, a few MB, made with the model classes of the installed
transformers (the official image's version, 5.14.1, where it matters: the GPU
proof installs it next to vLLM 0.26.0), plus a word-level tokenizer built on
the spot (no download).  Torch and transformers are needed for the weights;
the tokenizer and config helpers need neither.

    python -m tests.checkpoints OUT_DIR [NAME ...]      # default: all

Checkpoints (each a directory under OUT_DIR):
  qwen3-a           Qwen3, 2 layers, hidden 256, 2 KV heads x 64      (plan ground truth, shape A)
  qwen3-b           Qwen3, 6 layers, hidden 512, 8 KV heads x 128     (plan ground truth, shape B; impossible config)
  qwen3-sparse      qwen3-a whose config.json declares `qwen_sparse_attention` in layers 1 and 3 of 4
  gemma4-ple-ref    Gemma 4 text (Gemma4ForCausalLM) with per-layer embeddings, table under the plain name
  gemma4-ple-long   ... table as `model.language_model.embed_tokens_per_layer.shard_.weight`
  gemma4-ple-mid    ... table as `model.embed_tokens_per_layer.shard_.weight`
  gemma4-ple-short  ... table as `embed_tokens_per_layer.shard_.weight`
  gemma4-ple-numbered ... table as 4 row blocks `model.language_model.embed_tokens_per_layer.shard_{0..3}.weight`
All gemma4-ple-* share the same random weights (same seed), so a greedy
generation from each must equal the reference's when the table is loaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>"]  # ids 0..3 (Gemma's pad=0, eos=1, bos=2)


def write_tokenizer(out: Path, vocab_size: int, model_max_length: int = 1 << 20) -> None:
    """A word-level tokenizer covering every id below ``vocab_size`` (so any
    generated id decodes), as tokenizer.json + tokenizer_config.json."""
    out.mkdir(parents=True, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for i in range(len(SPECIAL), vocab_size):
        vocab[f"w{i}"] = i
    added = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL)
    ]
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    (out / "tokenizer.json").write_text(json.dumps(tok))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "pad_token": "<pad>",
                "eos_token": "<eos>",
                "bos_token": "<bos>",
                "unk_token": "<unk>",
                "model_max_length": model_max_length,
                "clean_up_tokenization_spaces": False,
                # a plain template, so that smoke's /v1/chat/completions round runs on these checkpoints too
                "chat_template": CHAT_TEMPLATE,
            },
            indent=1,
        )
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps({"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>"}, indent=1)
    )


def _save_model(model_cls, config, out: Path, seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    model = model_cls(config).to(torch.bfloat16)
    with torch.no_grad():  # small weights: keeps the random model numerically tame
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
    model.save_pretrained(str(out), safe_serialization=True)


def qwen3_config(
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    vocab: int = 1024,
    max_pos: int = 32768,
):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        tie_word_embeddings=True,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
        dtype="bfloat16",
        architectures=["Qwen3ForCausalLM"],
    )


def make_qwen3(out: Path, *, seed: int = 0, declared_layer_types: list[str] | None = None, **shape) -> Path:
    from transformers import Qwen3ForCausalLM

    cfg = qwen3_config(**shape)
    _save_model(Qwen3ForCausalLM, cfg, out, seed)
    write_tokenizer(out, cfg.vocab_size)
    if declared_layer_types is not None:
        if len(declared_layer_types) != cfg.num_hidden_layers:
            raise ValueError("declared_layer_types must name every layer")
        p = out / "config.json"
        d = json.loads(p.read_text())
        d["layer_types"] = declared_layer_types
        p.write_text(json.dumps(d, indent=2))
    return out


def gemma4_text_config(*, vocab: int = 1024, max_pos: int = 8192):
    from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig

    return Gemma4TextConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        global_head_dim=64,
        max_position_embeddings=max_pos,
        sliding_window=128,
        layer_types=["sliding_attention", "full_attention"],
        vocab_size_per_layer_input=vocab,
        hidden_size_per_layer_input=16,
        num_kv_shared_layers=0,
        architectures=["Gemma4ForCausalLM"],
        dtype="bfloat16",
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )


PLE_VARIANTS = {
    "ref": None,
    "long": "model.language_model.embed_tokens_per_layer.shard_.weight",
    "mid": "model.embed_tokens_per_layer.shard_.weight",
    "short": "embed_tokens_per_layer.shard_.weight",
    "numbered": "model.language_model.embed_tokens_per_layer.shard_{i}.weight",
}


def make_gemma4_ple(out: Path, variant: str, *, seed: int = 7, shards: int = 4) -> Path:
    """Gemma 4 text model with its per-layer-embedding table renamed as ``variant``."""
    from safetensors.torch import load_file, save_file
    from transformers import Gemma4ForCausalLM

    if variant not in PLE_VARIANTS:
        raise ValueError(f"unknown PLE variant {variant!r}")
    cfg = gemma4_text_config()
    _save_model(Gemma4ForCausalLM, cfg, out, seed)
    write_tokenizer(out, cfg.vocab_size)
    files = sorted(out.glob("*.safetensors"))
    if len(files) != 1:
        raise RuntimeError(f"expected one safetensors file in {out}, found {len(files)}")
    tensors = load_file(str(files[0]))
    keys = [k for k in tensors if k.endswith("embed_tokens_per_layer.weight")]
    if len(keys) != 1:
        raise RuntimeError(f"no single PLE table among {sorted(tensors)[:8]}...")
    table = tensors.pop(keys[0])
    pattern = PLE_VARIANTS[variant]
    if pattern is None:
        tensors[keys[0]] = table
    elif "{i}" in pattern:
        for i, block in enumerate(table.chunk(shards, dim=0)):
            tensors[pattern.format(i=i)] = block.contiguous()
    else:
        tensors[pattern] = table
    save_file(tensors, str(files[0]), metadata={"format": "pt"})
    (out / "ple-variant.json").write_text(
        json.dumps(
            {
                "variant": variant,
                "original_name": keys[0],
                "stored_as": sorted(k for k in tensors if "per_layer" in k and "embed" in k),
                "shape": list(table.shape),
            },
            indent=1,
        )
    )
    return out


SHAPE_A = dict(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512)
SHAPE_B = dict(layers=6, hidden=512, heads=8, kv_heads=8, head_dim=128, intermediate=1024, max_pos=1 << 20)

BUILDERS = {
    "qwen3-a": lambda o: make_qwen3(o, seed=1, **SHAPE_A),
    "qwen3-b": lambda o: make_qwen3(o, seed=2, **SHAPE_B),
    # one KV head: fewer KV heads than any TP > 1 (vLLM replicates it on every rank)
    "qwen3-kv1": lambda o: make_qwen3(o, seed=4, **{**SHAPE_A, "kv_heads": 1}),
    "qwen3-sparse": lambda o: make_qwen3(
        o,
        seed=3,
        **{**SHAPE_A, "layers": 4},
        declared_layer_types=["full_attention", "qwen_sparse_attention", "full_attention", "qwen_sparse_attention"],
    ),
    # the same weights as qwen3-sparse (same seed and shape), every layer declared full_attention:
    # what the layer-type override turns qwen3-sparse into, for the output-equivalence gate
    "qwen3-sparse-full": lambda o: make_qwen3(
        o,
        seed=3,
        **{**SHAPE_A, "layers": 4},
        declared_layer_types=["full_attention"] * 4,
    ),
    "gemma4-ple-ref": lambda o: make_gemma4_ple(o, "ref"),
    "gemma4-ple-long": lambda o: make_gemma4_ple(o, "long"),
    "gemma4-ple-mid": lambda o: make_gemma4_ple(o, "mid"),
    "gemma4-ple-short": lambda o: make_gemma4_ple(o, "short"),
    "gemma4-ple-numbered": lambda o: make_gemma4_ple(o, "numbered"),
}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    root = Path(argv[0])
    names = argv[1:] or list(BUILDERS)
    for name in names:
        out = root / name
        BUILDERS[name](out)
        size = sum(f.stat().st_size for f in out.iterdir())
        print(f"{name}: {out} ({size / 1e6:.1f} MB)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
