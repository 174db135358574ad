"""The plan as text, and the refusal that carries it (exit 1)."""

from __future__ import annotations

from builder.errors import VerdictFailure
from builder.serving.plan.budget import Plan
from builder.serving.plan.settings import GB, GiB

# --------------------------------------------------------------------------- rendering


def _fmt(n: float) -> str:
    """Bytes in both units, GB (10^9) and GiB (2^30)."""
    if abs(n) >= 10**8:
        return f"{n / GB:.2f} GB ({n / GiB:.2f} GiB)"
    if abs(n) >= 10**5:
        return f"{n / 10**6:.1f} MB ({n / (1 << 20):.1f} MiB)"
    return f"{n:,.0f} B"


def render_text(plan: Plan) -> str:
    p = plan
    lines = [
        f"verdict: {'FITS' if p.fits else 'DOES NOT FIT'}"
        + ("" if p.boots else " (vLLM would fail at boot)")
        + f" — vLLM {p.vllm}",
        f"layout: {p.gpus} GPU(s), tp={p.tp} pp={p.pp} ({p.replicas} replica(s)); layers: "
        + ", ".join(f"{v} {k}" for k, v in p.layers.items()),
        f"per GPU: {p.gpu_memory_utilization} × {_fmt(p.gpu_memory_bytes)} = {_fmt(p.requested_bytes)} requested",
        f"  − weights {_fmt(p.weights_per_gpu)}"
        + (f" (after {p.cpu_offload_bytes / GiB:.1f} GiB CPU offload)" if p.cpu_offload_bytes else ""),
        f"  − reserve {_fmt(p.reserve_bytes)} [{p.reserve_source}: "
        + ", ".join(f"{k} {v / GiB:.2f} GiB" for k, v in p.reserve_breakdown.items())
        + "]",
        f"  = available for KV cache {_fmt(p.available_kv_bytes)}",
        f"KV per token: {p.kv_bytes_per_token_per_gpu:,} B per GPU, {p.kv_bytes_per_token_node:,} B across the "
        f"{p.tp * p.pp} GPUs of a replica ({p.kv_cache_dtype}, block {p.block_size})",
    ]
    if p.per_sequence_fixed_bytes:
        lines.append(
            f"  + per sequence, window/state layers: {_fmt(p.per_sequence_fixed_bytes)} per GPU "
            "(independent of context)"
        )
    lines += [
        f"one {p.max_model_len:,}-token sequence: {_fmt(p.needed_one_seq_bytes)} per GPU",
        f"predicted vLLM log: GPU KV cache size: {p.kv_tokens_per_gpu:,} tokens; "
        f"Maximum concurrency for {p.max_model_len:,} tokens per request: {max(p.max_concurrency, 0):.2f}x",
    ]
    if p.max_num_seqs is not None:
        lines.append(
            f"{p.max_num_seqs} × {p.max_model_len:,} tokens: {_fmt(p.needed_requested_bytes or 0)} per GPU; "
            f"headroom {_fmt(p.headroom_bytes)}"
        )
    else:
        lines.append(f"headroom after one full-length sequence: {_fmt(p.headroom_bytes)}")
    lines += [
        "max context, one sequence: "
        + (f"{p.max_context_one_seq:,} tokens" if p.max_context_one_seq is not None else "not limited by KV memory"),
        f"max concurrent sequences at {p.max_model_len:,} tokens: {p.max_seqs_at_context}",
    ]
    if p.max_context_at_num_seqs is not None:
        lines.append(f"max context at {p.max_num_seqs} sequences: {p.max_context_at_num_seqs:,} tokens")
    lines.append(
        "lowest gpu_memory_utilization that fits: " + (f"{p.min_utilization}" if p.min_utilization else "none ≤ 1.0")
    )
    for r in p.reasons:
        lines.append(f"why: {r}")
    for s in p.suggestions:
        lines.append(f"try: {s['text']}")
    for n in p.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def refuse_unless_fits(plan: Plan, *, show_plan: bool = True) -> None:
    """Raise :class:`VerdictFailure` (exit 1) with the plan's numbers and suggestions
    when ``plan.fits`` is false.  For the pipeline / smoke step: call it before
    booting the engine so an impossible configuration costs zero GPU time."""
    if plan.fits:
        return
    raise VerdictFailure(
        "the serving settings do not fit: " + "; ".join(plan.reasons or ["see the plan"]) + ".",
        hint="; ".join(s["text"] for s in plan.suggestions) or None,
        details=render_text(plan) if show_plan else None,
    )
