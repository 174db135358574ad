"""`build-image plan [--vllm X]`: preflight memory plan for a shipped vLLM release (no GPU touched).

Exit 0: fits.  Exit 1: does not fit (the plan is printed first).  Exit 2: bad input.
"""

from __future__ import annotations

import json
import math

import click

from builder.errors import BadInput
from builder.serving.plan import GiB, parse_size, plan_from_model_dir, refuse_unless_fits, render_text
from builder.spec import load_spec


@click.command("plan")
@click.option("--vllm", "vllm", default=None, help="vLLM release to plan for (any shipped one; default: the spec's vllm, else 0.26.0): its default gpu_memory_utilization and accepted --kv-cache-dtype values.")
@click.option("--model", "model", default=None, help="Model directory or its config.json (default: spec serving.model).")
@click.option("--spec", "spec_file", default=None, type=click.Path(dir_okay=False), help="Spec file (default ./build-image.toml if present); flags win over its [serving] table.")
@click.option("--weights-bytes", default=None, help="Checkpoint size (bytes, or with a unit: 600GB). Default: the exact tensor bytes from the safetensors headers (the index's metadata.total_size while shards are still missing).")
@click.option("--gpus", type=int, default=None, help="GPUs (default tp × pp).")
@click.option("--gpu-memory", default=None, help="Per-GPU memory as CUDA reports it: 80GiB, 80GB (10^9), or a preset: h100, h200.")
@click.option("--tp", type=int, default=None, help="Tensor-parallel size.")
@click.option("--pp", type=int, default=None, help="Pipeline-parallel size.")
@click.option("--gpu-memory-utilization", type=float, default=None, help="vLLM gpu_memory_utilization, in (0, 1].")
@click.option("--max-model-len", type=int, default=None, help="Context length (default: the model's max_position_embeddings).")
@click.option("--max-num-seqs", type=int, default=None, help="Concurrent full-length sequences that must fit.")
@click.option("--kv-cache-dtype", type=click.Choice(["auto", "bf16", "bfloat16", "fp16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4"]), default=None, help="KV cache dtype (auto = the model's torch_dtype, or the ModelOpt checkpoint's KV quantization).")
@click.option("--cpu-offload-gb", type=float, default=None, help="vLLM cpu_offload_gb (GiB of weights per GPU kept in host memory).")
@click.option("--reserve-gib", type=float, default=None, help="Per-GPU reserve for activations, CUDA graphs and workspace (GiB); default: estimated, see docs/plan.md.")
@click.option("--max-num-batched-tokens", type=int, default=None, help="Tokens per forward step (drives the activation estimate; vLLM server default 8192 on >=70 GiB GPUs).")
@click.option("--enforce-eager", is_flag=True, default=False, help="No CUDA graphs (drops the CUDA-graph part of the reserve).")
@click.option("--json", "as_json", is_flag=True, default=False, help="Machine-readable plan on stdout.")
def command(vllm, model, spec_file, weights_bytes, gpus, gpu_memory, tp, pp, gpu_memory_utilization, max_model_len,
            max_num_seqs, kv_cache_dtype, cpu_offload_gb, reserve_gib, max_num_batched_tokens, enforce_eager, as_json):
    """Predict vLLM's KV cache before paying for the weights load: fits / does not fit."""
    spec = load_spec(spec_file).with_flags(
        vllm=vllm, model=model, gpus=gpus, gpu_memory=gpu_memory, tp=tp, pp=pp,
        gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
        max_num_seqs=max_num_seqs, kv_cache_dtype=kv_cache_dtype, cpu_offload_gb=cpu_offload_gb,
    )
    serving = spec.serving
    if not serving.model:
        raise BadInput("no model: pass --model DIR_OR_CONFIG_JSON or set serving.model in the spec.")
    wb = None if weights_bytes is None else parse_size(weights_bytes, what="--weights-bytes", bare_unit=1, presets=False)
    if reserve_gib is not None and not (math.isfinite(reserve_gib) and reserve_gib >= 0):
        raise BadInput(f"--reserve-gib must be a finite number >= 0, got {reserve_gib}.")
    reserve = None if reserve_gib is None else int(reserve_gib * GiB)
    if max_num_batched_tokens is not None and max_num_batched_tokens < 1:
        raise BadInput(f"--max-num-batched-tokens must be >= 1, got {max_num_batched_tokens}.")
    plan = plan_from_model_dir(
        serving.model, serving, weights_bytes=wb, reserve_bytes=reserve,
        max_num_batched_tokens=max_num_batched_tokens, enforce_eager=enforce_eager, vllm=spec.vllm,
    )
    if as_json:
        click.echo(json.dumps(plan.to_dict(), indent=2, sort_keys=True))
    else:
        click.echo(render_text(plan))
    refuse_unless_fits(plan, show_plan=False)  # the plan is already on stdout
