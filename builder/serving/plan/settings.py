"""What a plan reads besides the model: sizes and GPU presets, the release's facts (its default
utilization, the KV cache dtypes and load formats it accepts), dtype widths, the reserve's parts, and the
bounds of a model config's counts."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from builder.errors import BadInput
from builder.serving import release_facts as rf
from builder.spec import check_vllm_version
from builder.validate import number

GiB = 1 << 30
GB = 10**9

#: What ``torch.cuda.mem_get_info()`` reports as *total* (not the marketing number).
#: h200: 139.8 GiB as logged on the lent H200 (shared/gpu/README.md);
#: h100: 79.19 GiB for an H100 SXM 80GB.
GPU_PRESETS: dict[str, int] = {
    "h200": int(139.8 * GiB),
    "h100": int(79.19 * GiB),
}

#: vLLM 0.26.0's default ``gpu_memory_utilization`` (``vllm/config/cache.py``: ``Field(default=0.92)``).
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
DEFAULT_VLLM = "0.26.0"


@dataclass(frozen=True)
class ReleaseFacts:
    """What the plan takes from one vLLM release, read from its wheel's ``vllm/config/cache.py``:
    ``CacheConfig.gpu_memory_utilization``'s default and the ``CacheDType`` literal (the
    ``--kv-cache-dtype`` values the release accepts)."""

    vllm: str
    default_gpu_memory_utilization: float
    kv_cache_dtypes: tuple[str, ...]
    #: the ``LoadFormats`` literal of ``vllm/model_executor/model_loader/__init__.py`` (``--load-format`` values)
    load_formats: tuple[str, ...] = ()
    #: from 0.34.0: an unset ``gpu_memory_utilization`` is 1.0 with the extensible KV cache (CUDA's default,
    #: the cache sized from measured memory) and this value without it
    extensible_kv_cache: bool = False
    non_extensible_gpu_memory_utilization: float | None = None


def _load_release_facts() -> dict[str, ReleaseFacts]:
    """The generated ``lockfiles/release-facts.json`` (:mod:`builder.serving.release_facts`: read from
    each release's wheel; ``build-image upgrade --to X -o .`` adds X's entry)."""
    out = {}
    for v, e in rf.load().items():
        out[v] = ReleaseFacts(
            v,
            float(e["default_gpu_memory_utilization"]),
            tuple(e["kv_cache_dtypes"]),
            tuple(e.get("load_formats") or ()),
            bool(e.get("extensible_kv_cache")),
            e.get("non_extensible_gpu_memory_utilization"),
        )
    return out


#: One entry per shipped release (a test holds it to lockfiles/base/ and to each wheel in the download cache).
RELEASE_FACTS: dict[str, ReleaseFacts] = _load_release_facts()

# the planner's spellings -> vLLM's CacheDType values
_KV_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def release_facts(vllm: str | None) -> ReleaseFacts:
    """The facts of a shipped vLLM release (None: the default release); exit 2 naming the known
    ones for any other (a release the checkout has no base manifest for is not planned)."""
    vllm = vllm or DEFAULT_VLLM

    check_vllm_version(vllm)
    facts = RELEASE_FACTS.get(vllm)
    if facts is None:
        raise BadInput(
            f"plan: no release facts for vLLM {vllm} (known: {', '.join(RELEASE_FACTS)}) in "
            "lockfiles/release-facts.json.",
            hint=f"`build-image upgrade --to {vllm} -o .` writes them from the release's wheel.",
        )
    return facts


def unset_utilization_notes(facts: ReleaseFacts, given: float | None) -> list[str]:
    if given is not None or not facts.extensible_kv_cache:
        return []
    u = facts.default_gpu_memory_utilization
    return [
        f"vLLM {facts.vllm} leaves gpu_memory_utilization unset: {u} of the GPU with its extensible KV cache "
        f"(CUDA's default, sized from measured memory), {facts.non_extensible_gpu_memory_utilization} without "
        f"it; planned at {u}, which overstates the KV cache a little: on an H200 with vLLM 0.34.0 the plan "
        "was 1.5% above vLLM's logged KV tokens at this default (the extensible cache kept ~1.7 GiB free "
        "after warm-up), and within 0.2% at an explicit utilization; set gpu_memory_utilization to plan "
        "exactly"
    ]


def check_kv_cache_dtype(kv_cache_dtype: str, facts: ReleaseFacts) -> None:
    """vLLM refuses a ``--kv-cache-dtype`` outside its ``CacheDType`` at argument parsing."""
    name = _KV_DTYPE_ALIASES.get(kv_cache_dtype, kv_cache_dtype)
    if name == "float32" or name in facts.kv_cache_dtypes:
        return
    raise BadInput(
        f"kv_cache_dtype {kv_cache_dtype!r} (--kv-cache-dtype): vLLM {facts.vllm} does not accept it "
        f"(its CacheDType: {', '.join(facts.kv_cache_dtypes)})."
    )


def check_load_format(load_format: str, facts: ReleaseFacts, *, where: str = "--load-format") -> str:
    """vLLM lowercases ``--load-format`` and refuses one outside its ``LoadFormats``: the lowercased
    name, or :class:`BadInput` naming the formats that release accepts."""
    name = (load_format or "").strip().lower()
    if name in facts.load_formats:
        return name
    raise BadInput(
        f"load format {load_format!r} ({where}): vLLM {facts.vllm} does not accept it "
        f"(its LoadFormats: {', '.join(facts.load_formats)})."
    )


KV_CACHE_DTYPES = (
    "auto",
    "bf16",
    "bfloat16",
    "fp16",
    "float16",
    "half",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "nvfp4",
    "float32",
)

DTYPE_BYTES = {
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    # vLLM's dtype="auto" serves float32 checkpoints in bfloat16/float16.
    "float32": 2,
    "fp32": 2,
    "float": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "nvfp4": 1,  # uint8 storage; the head dim is packed (see head_bytes)
}


def head_bytes(head_dim: int, kv_dtype: str) -> int:
    """Bytes of one K (or V) head vector for one token (kv_cache_interface real_page_size_bytes)."""
    if kv_dtype == "nvfp4":  # fp4 data + one fp8 scale per 16 elements (nvfp4_kv_cache_full_dim)
        return head_dim // 2 + head_dim // 16
    return head_dim * DTYPE_BYTES[kv_dtype]


def modelopt_kv_dtype(cfg: dict) -> str | None:
    """What vLLM resolves kv_cache_dtype='auto' to for ModelOpt checkpoints
    (utils/torch_utils.py:get_kv_cache_quant_algo_string): fp8 or nvfp4 KV, else None."""
    q = cfg.get("quantization_config")
    if not isinstance(q, dict) or not str(q.get("quant_method", "")).startswith("modelopt"):
        return None
    inner = q.get("quantization", q) if isinstance(q.get("quantization", q), dict) else q
    algo = (
        inner.get("kv_cache_scheme")
        or q.get("kv_cache_scheme")
        or inner.get("kv_cache_quant_algo")
        or q.get("kv_cache_quant_algo")
    )
    if isinstance(algo, dict):
        if algo.get("dynamic") is False and algo.get("num_bits") == 8 and algo.get("type") == "float":
            return "fp8"
        if algo.get("num_bits") == 4 and algo.get("type") == "float":
            return "nvfp4"
        return None
    if isinstance(algo, str) and algo.lower() in ("fp8", "nvfp4"):
        return algo.lower()
    return None


FULL_TYPES = {"full_attention", "attention", "global", "global_attention", "full"}
SLIDING_TYPES = {"sliding_attention", "sliding_window", "sliding_window_attention", "local", "local_attention", "swa"}
CHUNKED_TYPES = {"chunked_attention", "chunked_local_attention"}
STATE_TYPES = {
    "linear_attention",
    "mamba",
    "mamba2",
    "gated_delta",
    "gated_deltanet",
    "gated_delta_net",
    "gdn",
    "ssm",
    "conv",
    "short_conv",
    "kda",
    "deltanet",
    "lightning_attention",
    "recurrent",
}

#: Default reserve components (per GPU).  See docs/plan.md for where they come from.
RESERVE_BASE_BYTES = int(0.30 * GiB)  # cuBLAS/cuBLASLt + attention-backend workspaces, allocator slack
RESERVE_COMM_BYTES = int(0.25 * GiB)  # NCCL buffers + custom all-reduce, only with tp*pp > 1
RESERVE_CUDAGRAPH_BYTES = int(0.50 * GiB)  # CUDA-graph pool estimate (0 with enforce_eager)
STARTUP_CONTEXT_BYTES = int(0.50 * GiB)  # CUDA context, outside the requested pool, must still be free
SAMPLER_BYTES_PER_LOGIT = 10  # bf16 logits + fp32 copy + fp32 probs (triton top-k/top-p, no full sort)


# --------------------------------------------------------------------------- parsing helpers

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*$")
_UNITS = {
    "": None,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def parse_size(value: str | int | float, *, what: str, bare_unit: int | None = None, presets: bool = True) -> int:
    """``"80GiB"`` / ``"80GB"`` / ``"h200"`` / ``123`` -> bytes.

    GB is 10**9, GiB is 2**30.  A bare number is multiplied by ``bare_unit``;
    with ``bare_unit=None`` a bare number is refused (ambiguous).  ``presets``:
    accept the GPU names of :data:`GPU_PRESETS` (a GPU's memory, not a checkpoint's size).
    """
    examples = "80GiB, 80GB, 141e9B" + (f", {', '.join(sorted(GPU_PRESETS))}" if presets else "")
    if isinstance(value, bool):
        raise BadInput(f"{what}: expected a size, got {value!r}.")
    if isinstance(value, (int, float)):
        if bare_unit is None:
            raise BadInput(f"{what}: {value!r} has no unit; write e.g. '80GiB' or '80GB' (GB = 10^9, GiB = 2^30).")
        if not math.isfinite(value) or value < 0:
            raise BadInput(f"{what}: {value!r} is not a size.")
        return int(value * bare_unit)
    text = str(value).strip()
    if presets and text.lower() in GPU_PRESETS:
        return GPU_PRESETS[text.lower()]
    m = _SIZE_RE.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise BadInput(f"{what}: cannot read {value!r} as a size (examples: {examples}).")
    number, unit = float(m.group(1)), _UNITS[m.group(2).lower()]
    if unit is None:
        if bare_unit is None:
            raise BadInput(f"{what}: {value!r} has no unit; write e.g. '80GiB' or '80GB' (GB = 10^9, GiB = 2^30).")
        unit = bare_unit
    if not math.isfinite(number * unit):  # "1e400GB"
        raise BadInput(f"{what}: {value!r} is not a finite size.")
    return int(number * unit)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def int_field(cfg: dict, key: str, where: str, default: Any = ..., minimum: int = 1) -> int:
    val = cfg.get(key, default)
    if val is ...:
        raise BadInput(f"{where}: required field '{key}' is missing.")
    # a null (the field's or, through ``default``, its other spelling's) is no integer either
    if isinstance(val, bool) or not isinstance(val, int) or val < minimum:
        raise BadInput(f"{where}: field '{key}' must be an integer >= {minimum}, got {val!r}.")
    return val


#: The model config's numeric fields the plan reads: (lowest, highest).  Each is a whole number (a
#: count or a size); the highest is far beyond any real model, so a value past it is a damaged or
#: hostile config, not a big model.
CONFIG_COUNTS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 10_000),
    "hidden_size": (1, 1 << 20),
    "num_attention_heads": (1, 1 << 16),
    "num_key_value_heads": (1, 1 << 16),
    "head_dim": (1, 1 << 16),
    "global_head_dim": (1, 1 << 16),
    "num_global_key_value_heads": (1, 1 << 16),
    "intermediate_size": (1, 1 << 24),
    "moe_intermediate_size": (1, 1 << 24),
    "num_experts_per_tok": (1, 1 << 16),
    "vocab_size": (1, 1 << 24),
    "max_position_embeddings": (1, 1 << 34),
    "sliding_window": (0, 1 << 34),
    "attention_chunk_size": (0, 1 << 34),
    "num_kv_shared_layers": (0, 10_000),
    "kv_lora_rank": (1, 1 << 16),
    "qk_rope_head_dim": (0, 1 << 16),
    "index_topk": (1, 1 << 34),
    "conv_kernel": (1, 1 << 16),
    "linear_conv_kernel_dim": (1, 1 << 16),
    "linear_key_head_dim": (1, 1 << 16),
    "linear_num_key_heads": (1, 1 << 16),
    "linear_num_value_heads": (1, 1 << 16),
    "linear_value_head_dim": (1, 1 << 16),
    "mamba_d_conv": (1, 1 << 16),
    "mamba_d_state": (1, 1 << 16),
    "mamba_head_dim": (1, 1 << 16),
    "mamba_n_groups": (1, 1 << 16),
    "mamba_n_heads": (1, 1 << 16),
    "mamba_num_heads": (1, 1 << 16),
    "n_groups": (1, 1 << 16),
    "ssm_state_size": (1, 1 << 16),
}


def check_config_numbers(cfg: dict, where: str) -> None:
    """Every numeric field of :data:`CONFIG_COUNTS` that the config sets (null: unset) is a whole number
    in its range (:func:`builder.validate.number`): BadInput naming the config field, before any arithmetic."""
    for key, (low, high) in CONFIG_COUNTS.items():
        val = cfg.get(key)
        if val is None or (key == "sliding_window" and val is False):
            continue
        number(val, f"{where}: field '{key}'", minimum=low, maximum=high, integral=True)
