"""Sharded safetensors checkpoints written by the ``safetensors`` library itself
(no torch, no numpy: ``safetensors.serialize`` over raw buffers), for the
checkpoint-readiness tests."""

from __future__ import annotations

import ctypes
import json
import math
import os
from pathlib import Path

import safetensors

#: safetensors' header dtype -> (TensorSpec dtype name, bits)
DTYPES = {
    "BF16": ("bfloat16", 16),
    "F16": ("float16", 16),
    "F32": ("float32", 32),
    "U8": ("uint8", 8),
    "I32": ("int32", 32),
    "F8_E4M3": ("float8_e4m3fn", 8),
    "I64": ("int64", 64),
}


def shard_bytes(tensors: dict[str, tuple[str, list[int]]], *, seed: int = 0, metadata: dict | None = None) -> bytes:
    """One safetensors file's bytes: ``{name: (dtype, shape)}``, deterministic pseudo-random data."""
    specs, keep = {}, []
    for i, (name, (dtype, shape)) in enumerate(sorted(tensors.items())):
        st_name, bits = DTYPES[dtype]
        n = math.prod(shape) * bits // 8
        data = (bytes([(seed * 31 + i * 7 + j) % 251 for j in range(min(n, 251))]) * (n // 251 + 1))[:n]
        buf = ctypes.create_string_buffer(data, max(n, 1))
        keep.append(buf)
        specs[name] = safetensors.TensorSpec(dtype=st_name, shape=shape, data_ptr=ctypes.addressof(buf), data_len=n)
    return bytes(safetensors.serialize(specs, metadata=metadata or {"format": "pt"}))


def write_checkpoint(
    d: Path, shards: dict[str, dict[str, tuple[str, list[int]]]], config: dict | None = None, *, index: bool = True
) -> Path:
    """A checkpoint directory: the shards, model.safetensors.index.json, config.json."""
    d.mkdir(parents=True, exist_ok=True)
    wm: dict[str, str] = {}
    total = 0
    for i, (fname, tensors) in enumerate(shards.items()):
        (d / fname).write_bytes(shard_bytes(tensors, seed=i))
        for name, (dtype, shape) in tensors.items():
            wm[name] = fname
            total += math.prod(shape) * DTYPES[dtype][1] // 8
    if index:
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": wm}, indent=1)
        )
    if config is not None:
        (d / "config.json").write_text(json.dumps(config, indent=1))
    return d


VOCAB, HIDDEN, LAYERS, PLE_DIM = 128, 32, 2, 8
CONFIG = {
    "architectures": ["Gemma4ForCausalLM"],
    "model_type": "gemma4_text",
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": PLE_DIM,
    "torch_dtype": "bfloat16",
    "intermediate_size": 64,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


def sharded(d: Path, *, ple_name: str = "model.language_model.embed_tokens_per_layer.shard_.weight") -> Path:
    """Three shards: embeddings + layer 0, layer 1 + head, and the PLE table alone (the big one)."""
    shards = {
        "model-00001-of-00003.safetensors": {
            "model.language_model.embed_tokens.weight": ("BF16", [VOCAB, HIDDEN]),
            "model.language_model.layers.0.mlp.up_proj.weight": ("BF16", [64, HIDDEN]),
            "model.language_model.layers.0.input_layernorm.weight": ("F32", [HIDDEN]),
        },
        "model-00002-of-00003.safetensors": {
            "model.language_model.layers.1.mlp.up_proj.weight": ("F8_E4M3", [64, HIDDEN]),
            "model.language_model.layers.1.mlp.up_proj.weight_scale": ("F32", [1]),
            "lm_head.weight": ("BF16", [VOCAB, HIDDEN]),
        },
        "model-00003-of-00003.safetensors": {
            ple_name: ("BF16", [VOCAB, LAYERS * PLE_DIM]),
        },
    }
    return write_checkpoint(d, shards, CONFIG)


def sha256sum_file(d: Path, names: list[str] | None = None) -> Path:
    """A sums file in sha256sum's format beside the checkpoint."""
    import hashlib

    names = names or sorted(p.name for p in d.glob("*.safetensors"))
    lines = [f"{hashlib.sha256((d / n).read_bytes()).hexdigest()}  {n}" for n in names]
    out = d.parent / f"{d.name}.sha256"
    out.write_text("\n".join(lines) + "\n")
    return out


def set_mtime_like(path: Path, other: os.stat_result) -> None:
    os.utime(path, ns=(other.st_atime_ns, other.st_mtime_ns))
