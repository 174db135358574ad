"""The preflight memory plan (:mod:`builder.serving.plan`) for a smoke run: zero GPU
time for a configuration that cannot fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from builder.errors import BadInput, CheckpointNotReady
from builder.events import Reporter
from builder.serving import plan as planmod
from builder.serving.checkpoint import inspect_checkpoint, safetensors_expected
from builder.serving.smoke.config import SmokeConfig
from builder.serving.smoke.gpu import nvidia_smi_memory


def _extra_value(extra: list[str], flag: str) -> str | None:
    """The value of ``flag`` among the extra `vllm serve` arguments (``--flag V`` or ``--flag=V``)."""
    for i, a in enumerate(extra):
        if a == flag and i + 1 < len(extra):
            return extra[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def checkpoint_ready(cfg: SmokeConfig, reporter: Reporter) -> dict[str, Any] | None:
    """The structural pass of `build-image checkpoint verify` (headers, index, shapes,
    download leftovers; no hashing, well under a second): a checkpoint that is not
    ready raises :class:`CheckpointNotReady` before any server or GPU work.

    Returns a summary, or None when the check does not apply (``--skip-checkpoint-check``,
    a model that is not a directory, no safetensors files and no index naming any).
    """
    if not cfg.checkpoint_check:
        reporter.step("checkpoint check skipped (--skip-checkpoint-check)")
        return None
    model_dir = Path(cfg.model)
    if not model_dir.is_dir() or not safetensors_expected(model_dir):
        reporter.step("checkpoint check skipped: no safetensors checkpoint in the model directory")
        return None
    rep = inspect_checkpoint(model_dir)
    if not rep.ready():
        problems = "\n".join(f"  {p.file}: {p.message}" for p in rep.errors)
        raise CheckpointNotReady(
            f"{model_dir} is not ready to load ({len(rep.errors)} problem(s)); no server was started.",
            hint=f"build-image checkpoint verify {model_dir} (add --sha256 SUMS or --hf-cache DIR to check "
            "the bytes too)",
            details=problems,
        )
    summary = {
        "ready": True,
        "shards": len(rep.shards),
        "weight_bytes": rep.weight_bytes,
        "ple_bytes": rep.ple_bytes,
        "warnings": [p.to_dict() for p in rep.warnings],
        "structural_seconds": rep.structural_seconds,
    }
    reporter.step(
        f"checkpoint READY (structure): {len(rep.shards)} shard(s), {rep.weight_bytes / 1e9:.2f} GB of "
        f"weights, {len(rep.warnings)} warning(s), {rep.structural_seconds * 1000:.0f} ms"
    )
    return summary


def preflight_plan(cfg: SmokeConfig, reporter: Reporter) -> dict[str, Any] | None:
    """Plan the serving settings before booting (:func:`builder.serving.plan.make_plan`).

    Returns the plan as a dict (``fits``, ``summary`` and the planner's fields),
    or None when it cannot be planned (no config.json, no GPU memory figure).
    """
    model_dir = Path(cfg.model)
    if not (model_dir / "config.json").is_file():
        reporter.step("plan skipped: no config.json in the model directory")
        return None
    gpu_mem = cfg.gpu_memory_bytes
    if gpu_mem is None:
        smi = nvidia_smi_memory()
        if smi and smi["gpus"]:
            gpu_mem = smi["memory_total_mib"] // smi["gpus"] * (1 << 20)
    if gpu_mem is None:
        reporter.step("plan skipped: GPU memory unknown (no nvidia-smi; pass --gpu-memory)")
        return None
    extra = list(cfg.extra_args)
    kwargs: dict[str, Any] = {}
    if "--enforce-eager" in extra:
        kwargs["enforce_eager"] = True
    mnbt = _extra_value(extra, "--max-num-batched-tokens")
    if mnbt is not None and mnbt.isdigit():
        kwargs["max_num_batched_tokens"] = int(mnbt)
    # A fixed KV size (--kv-cache-memory-bytes, also abbreviated as --kv-cache-memory) or block
    # count replaces the utilization arithmetic: the plan would predict, and refuse, the wrong pool.
    if cfg.kv_cache_dtype and cfg.vllm:
        # a dtype the release itself refuses is bad input, not a plan to skip
        planmod.check_kv_cache_dtype(cfg.kv_cache_dtype, planmod.release_facts(cfg.vllm))
    if cfg.kv_cache_dtype and cfg.kv_cache_dtype not in planmod.KV_CACHE_DTYPES:
        # vLLM knows more KV dtypes (fp8_inc, fp8_ds_mla, turboquant_*, ...) than the planner models
        reporter.step(f"plan skipped: the planner does not model --kv-cache-dtype {cfg.kv_cache_dtype}")
        return None
    fixed = [a for a in extra if a.split("=", 1)[0].startswith(("--kv-cache-memory", "--num-gpu-blocks-override"))]
    if fixed:
        reporter.step(
            f"plan skipped: {fixed[0].split('=', 1)[0]} fixes the KV cache size; the plan models gpu_memory_utilization"
        )
        return None
    try:
        config, _ = planmod.load_config(model_dir)
        weights = planmod.checkpoint_bytes(model_dir)
        if weights is None:
            reporter.step("plan skipped: no safetensors files to size the weights")
            return None
        plan = planmod.make_plan(
            config,
            weights_bytes=int(weights),
            gpus=cfg.gpus or cfg.tp * cfg.pp,
            gpu_memory_bytes=int(gpu_mem),
            tp=cfg.tp,
            pp=cfg.pp,
            cpu_offload_gb=cfg.cpu_offload_gb or 0,
            # unset: the release's own default, which is what `vllm serve` will use
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            vllm=cfg.vllm,
            max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            kv_cache_dtype=cfg.kv_cache_dtype or "auto",
            where=str(model_dir / "config.json"),
            **kwargs,
        )
    except BadInput:
        raise
    except Exception as exc:  # noqa: BLE001 - the planner is advisory for the smoke test
        reporter.step(f"plan skipped: {type(exc).__name__}: {exc}")
        return None
    d = plan.to_dict()
    fits = bool(plan.fits)
    d["fits"] = fits
    d["summary"] = (
        f"{'fits' if fits else 'DOES NOT FIT'}: predicted KV cache {plan.kv_tokens_per_gpu:,} tokens per GPU, "
        f"max concurrency {plan.max_concurrency:.2f}x at max_model_len {plan.max_model_len:,}"
        + ("" if fits else " — " + "; ".join(getattr(plan, "reasons", []) or []))
        + ("" if fits or not plan.suggestions else "; try: " + "; ".join(x["text"] for x in plan.suggestions))
    )
    return d
