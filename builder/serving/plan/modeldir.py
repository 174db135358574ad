"""A plan for a model directory: its ``config.json`` and the weight bytes from its safetensors headers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builder.errors import BadInput
from builder.serving.checkpoint import weight_size
from builder.serving.plan.budget import Plan, make_plan
from builder.serving.plan.settings import parse_size
from builder.validate import load_json, read_bounded_text

# --------------------------------------------------------------------------- reading a model directory


def load_config(path: str | Path) -> tuple[dict, Path]:
    """``path`` is a model directory or a config.json; returns (config, model_dir)."""
    p = Path(path)
    cfg_path = p / "config.json" if p.is_dir() else p
    if not cfg_path.is_file():
        raise BadInput(f"model config {cfg_path} does not exist (give a model directory or its config.json).")
    try:
        config = load_json(read_bounded_text(cfg_path, "model config"), f"model config {cfg_path}")
    except json.JSONDecodeError as exc:
        raise BadInput(f"model config {cfg_path} is not valid JSON: {exc}.") from None
    if not isinstance(config, dict):
        raise BadInput(f"model config {cfg_path} must hold a JSON object.")
    return config, cfg_path.parent


def checkpoint_bytes(model_dir: str | Path) -> int | None:
    """Exact weight bytes from the safetensors headers (see :func:`builder.serving.checkpoint.weight_size`);
    ``None`` when the directory has no safetensors files."""
    ws = weight_size(model_dir)
    return None if ws is None else ws.bytes


def plan_from_model_dir(
    path: str | Path, serving: Any, *, weights_bytes: int | None = None, reserve_bytes: int | None = None, **kwargs: Any
) -> Plan:
    """Plan for a model directory (or config.json) and a :class:`builder.spec.Serving`.

    ``serving.gpu_memory`` is a size string ("80GiB", "80GB", "h200"); weights
    come from ``weights_bytes`` or the checkpoint's index/safetensors files.
    Extra keyword arguments go to :func:`make_plan` (e.g. ``enforce_eager``).
    """
    config, model_dir = load_config(path)
    size_notes: list[str] = []
    if weights_bytes is None:
        ws = weight_size(model_dir)
        if ws is None:
            raise BadInput(
                f"cannot tell the weights size of {path}: no *.safetensors files next to config.json; "
                "pass --weights-bytes."
            )
        weights_bytes = ws.bytes
        size_notes = [f"weights: {ws.bytes} bytes from the {ws.source}", *ws.notes]
    if not serving.gpu_memory:
        raise BadInput("no GPU memory size: pass --gpu-memory (e.g. 80GiB, 80GB, h200) or set serving.gpu_memory.")
    gpu_bytes = parse_size(serving.gpu_memory, what="--gpu-memory (serving.gpu_memory)")
    plan = make_plan(
        config,
        weights_bytes=int(weights_bytes),
        gpus=serving.gpus,
        gpu_memory_bytes=gpu_bytes,
        tp=serving.tp,
        pp=serving.pp,
        gpu_memory_utilization=serving.gpu_memory_utilization,
        max_model_len=serving.max_model_len,
        max_num_seqs=serving.max_num_seqs,
        kv_cache_dtype=serving.kv_cache_dtype,
        cpu_offload_gb=serving.cpu_offload_gb,
        reserve_bytes=reserve_bytes,
        where=str(Path(path)),
        **kwargs,
    )
    plan.notes.extend(size_notes)
    return plan
