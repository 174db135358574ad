"""Preflight memory plan: will vLLM 0.26.0's KV cache fit, before any GPU is paid for.

Pure arithmetic: a model ``config.json`` (a dict) plus serving settings in,
a :class:`Plan` out.  No torch, no GPU, no subprocess.  The only I/O lives in
:func:`plan_from_model_dir` (reads ``config.json`` and the safetensors headers for the exact weight bytes).

What is mirrored from vLLM 0.26.0 (read from the wheel; see docs/plan.md):

* ``vllm/v1/worker/utils.py:request_memory`` — requested = ceil(total × util).
* ``vllm/v1/worker/gpu_worker.py:determine_available_memory`` — available KV
  memory = requested − weights − peak activation − non-torch increase −
  CUDA-graph estimate (the latter on by default since v0.21).
* ``vllm/v1/kv_cache_interface.py`` — page sizes: full attention
  ``block × kv_heads × (head + head_v) × dtype``; MLA ``block × 1 × (kv_lora_rank
  + qk_rope_head_dim) × dtype`` (one latent, not split by TP); sliding window
  ``cdiv(min(window − 1 + in_flight, max_len), block) + 1`` blocks per request;
  Mamba/GDN state: one (padded) page per request.
* ``vllm/v1/core/kv_cache_utils.py`` — grouping of hybrid models into
  equally-sized groups sharing one pool, ``num_blocks = avail // page //
  group_size``, the boot check (one max-length request must fit) and the logged
  "GPU KV cache size: N tokens" = int(max_concurrency × max_model_len).
* ``vllm/platforms/interface.py:_align_hybrid_block_size`` — attention block
  size raised so an attention page is ≥ the Mamba/GDN state page.
* ``vllm/distributed/utils.py:get_pp_indices`` — layer split across PP stages.

The plan by job, each a module of this package (the names below are its doors):

* :mod:`.settings` — what a plan reads besides the model: sizes and GPU presets, the release's facts
  (``builder.serving.release_facts``) as the plan checks them, dtype widths, the reserve's parts;
* :mod:`.shape` — the model's shape from its ``config.json``: each layer's kind and KV bytes per token;
* :mod:`.layout` — vLLM's KV allocator across the layers and pipeline stages: pages, groups, the pool;
* :mod:`.budget` — the memory budget per GPU and the verdict (:func:`make_plan`), the comparison with a boot log;
* :mod:`.modeldir` — a plan for a model directory (config and safetensors headers);
* :mod:`.text` — the plan as text, and the refusal that carries it.
"""

from builder.serving.plan.budget import Plan, compare_with_log, make_plan
from builder.serving.plan.layout import pp_partition
from builder.serving.plan.modeldir import checkpoint_bytes, load_config, plan_from_model_dir
from builder.serving.plan.settings import (
    DEFAULT_VLLM,
    GB,
    GPU_PRESETS,
    KV_CACHE_DTYPES,
    RELEASE_FACTS,
    VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
    GiB,
    ReleaseFacts,
    check_config_numbers,
    check_kv_cache_dtype,
    check_load_format,
    parse_size,
    release_facts,
)
from builder.serving.plan.shape import LayerKV, ModelShape, describe_model
from builder.serving.plan.text import refuse_unless_fits, render_text

__all__ = [
    "DEFAULT_VLLM",
    "GB",
    "GPU_PRESETS",
    "KV_CACHE_DTYPES",
    "RELEASE_FACTS",
    "VLLM_DEFAULT_GPU_MEMORY_UTILIZATION",
    "GiB",
    "LayerKV",
    "ModelShape",
    "Plan",
    "ReleaseFacts",
    "check_config_numbers",
    "check_kv_cache_dtype",
    "check_load_format",
    "compare_with_log",
    "checkpoint_bytes",
    "describe_model",
    "load_config",
    "make_plan",
    "parse_size",
    "plan_from_model_dir",
    "pp_partition",
    "refuse_unless_fits",
    "release_facts",
    "render_text",
]
