#!/usr/bin/env python3
"""A synthetic Qwen3 checkpoint of about 21.8 GB (bf16, random weights), written on the GPU host.

    coldstart_ckpt.py OUT_DIR [--layers 32]

Qwen3-14B's layer shape (hidden 5120, 40 heads, 8 KV heads x 128, intermediate 17408) with 32 layers and
an untied 32,000-word vocabulary; the weights are drawn on the GPU (normal, std 0.02) and written as ~5 GB
safetensors shards with an index, plus config.json and the word-level tokenizer of tests/checkpoints.py.
Nothing is downloaded; the checkpoint is never uploaded (issue 28: generated on the device's disk).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, HEADS, KV, HD, INTER, VOCAB = 5120, 40, 8, 128, 17408, 32000
SHARD_BYTES = 5 * 10**9
DEV = os.environ.get("CKPT_DEVICE", "cuda")  # cpu: for a try-out without a GPU


def tensors(layers: int):
    yield "model.embed_tokens.weight", (VOCAB, HIDDEN)
    for i in range(layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (HIDDEN,)
        yield p + "post_attention_layernorm.weight", (HIDDEN,)
        yield p + "self_attn.q_proj.weight", (HEADS * HD, HIDDEN)
        yield p + "self_attn.k_proj.weight", (KV * HD, HIDDEN)
        yield p + "self_attn.v_proj.weight", (KV * HD, HIDDEN)
        yield p + "self_attn.o_proj.weight", (HIDDEN, HEADS * HD)
        yield p + "self_attn.q_norm.weight", (HD,)
        yield p + "self_attn.k_norm.weight", (HD,)
        yield p + "mlp.gate_proj.weight", (INTER, HIDDEN)
        yield p + "mlp.up_proj.weight", (INTER, HIDDEN)
        yield p + "mlp.down_proj.weight", (HIDDEN, INTER)
    yield "model.norm.weight", (HIDDEN,)
    yield "lm_head.weight", (VOCAB, HIDDEN)


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    layers = int(argv[argv.index("--layers") + 1]) if "--layers" in argv else 32
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.checkpoints import write_tokenizer

    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV,
        "head_dim": HD,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    write_tokenizer(out, VOCAB)
    t0 = time.monotonic()
    g = torch.Generator(device=DEV).manual_seed(0)
    shard: dict[str, torch.Tensor] = {}
    size, n, weight_map, total = 0, 0, {}, 0
    names: list[tuple[str, dict]] = []

    def flush() -> None:
        nonlocal shard, size, n
        if shard:
            name = f"model-{n:05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            names.append((name, dict.fromkeys(shard, name)))
            shard, size, n = {}, 0, n + 1

    for key, shape in tensors(layers):
        if len(shape) == 1:
            t = torch.ones(shape, dtype=torch.bfloat16)
        else:
            t = torch.empty(shape, dtype=torch.bfloat16, device=DEV).normal_(0.0, 0.02, generator=g).cpu()
        nbytes = t.numel() * 2
        if size and size + nbytes > SHARD_BYTES:
            flush()
        shard[key] = t
        size += nbytes
        total += nbytes
    flush()
    files = len(names)
    for i, (name, m) in enumerate(names):  # rename to the usual model-0000i-of-0000n form
        final = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        (out / name).rename(out / final)
        weight_map.update(dict.fromkeys(m, final))
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    on_disk = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(
        json.dumps(
            {
                "dir": str(out),
                "layers": layers,
                "tensor_bytes": total,
                "safetensors_bytes": on_disk,
                "files": files,
                "write_s": round(time.monotonic() - t0, 1),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
