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
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builder.errors import BadInput, VerdictFailure
from builder.serving import release_facts as rf
from builder.serving.checkpoint import weight_size
from builder.serving.modelconfig import text_config
from builder.serving.vllm_log import parse_vllm_kv_log
from builder.spec import check_vllm_version
from builder.validate import load_json, number, read_bounded_text

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


def _unset_utilization_notes(facts: ReleaseFacts, given: float | None) -> list[str]:
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

_DTYPE_BYTES = {
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
    "nvfp4": 1,  # uint8 storage; the head dim is packed (see _head_bytes)
}


def _head_bytes(head_dim: int, kv_dtype: str) -> int:
    """Bytes of one K (or V) head vector for one token (kv_cache_interface real_page_size_bytes)."""
    if kv_dtype == "nvfp4":  # fp4 data + one fp8 scale per 16 elements (nvfp4_kv_cache_full_dim)
        return head_dim // 2 + head_dim // 16
    return head_dim * _DTYPE_BYTES[kv_dtype]


def _modelopt_kv_dtype(cfg: dict) -> str | None:
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


_FULL_TYPES = {"full_attention", "attention", "global", "global_attention", "full"}
_SLIDING_TYPES = {"sliding_attention", "sliding_window", "sliding_window_attention", "local", "local_attention", "swa"}
_CHUNKED_TYPES = {"chunked_attention", "chunked_local_attention"}
_STATE_TYPES = {
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


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _int_field(cfg: dict, key: str, where: str, default: Any = ..., minimum: int = 1) -> int:
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


# --------------------------------------------------------------------------- model shape


@dataclass(frozen=True)
class LayerKV:
    """What one decoder layer keeps per GPU (after TP split)."""

    index: int
    kind: str  # full | mla | sliding | chunked | state | shared | none
    bytes_per_token: int = 0  # K+V (or latent) bytes per token on one GPU
    window: int | None = None
    state_bytes: int = 0  # recurrent state per sequence on one GPU (state layers)


@dataclass
class ModelShape:
    layers: list[LayerKV]
    dtype_bytes: int
    kv_dtype: str
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int | None
    mla: bool
    notes: list[str] = field(default_factory=list)


def _text_config(config: dict, where: str) -> dict:
    if not isinstance(config, dict):
        raise BadInput(f"{where}: the model config must be a JSON object.")
    text, problem = text_config(config)
    if problem:
        raise BadInput(f"{where}: {problem}.")
    return text


def _model_dtype(cfg: dict) -> tuple[str, int]:
    name = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    name = str(name).replace("torch.", "").lower()
    if name not in _DTYPE_BYTES:
        raise BadInput(f"model config: unsupported torch_dtype {name!r}.")
    return name, _DTYPE_BYTES[name]


def _layer_types(cfg: dict, n_layers: int, where: str) -> list[str]:
    lt = cfg.get("layer_types")
    if lt is not None:
        if not isinstance(lt, list) or not all(isinstance(t, str) for t in lt):
            raise BadInput(f"{where}: 'layer_types' must be a list of strings.")
        if len(lt) != n_layers:
            raise BadInput(f"{where}: 'layer_types' has {len(lt)} entries but num_hidden_layers is {n_layers}.")
        return [t.lower() for t in lt]
    interval = cfg.get("full_attention_interval")  # Qwen3-Next / Qwen3.5: every N-th layer is full attention
    if (
        isinstance(interval, int)
        and not isinstance(interval, bool)
        and interval > 0
        and "linear_num_value_heads" in cfg
    ):
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", True) is not False:
        if str(cfg.get("model_type", "")).startswith("gemma2"):  # Gemma 2 alternates, even layers windowed
            return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
        pattern = cfg.get("sliding_window_pattern")
        if isinstance(pattern, int) and pattern > 0:  # Gemma 2/3: every pattern-th layer is global
            return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)]
        return ["sliding_attention"] * n_layers  # Mistral-style: every layer windowed
    return ["full_attention"] * n_layers


def _state_bytes(cfg: dict, tp: int, dtype_bytes: int, where: str) -> tuple[int, str | None]:
    """Recurrent state bytes per sequence per layer on one GPU (vLLM MambaStateShapeCalculator)."""
    ssm_name = cfg.get("mamba_ssm_dtype") or cfg.get("mamba_ssm_cache_dtype")
    ssm_bytes = 4 if str(ssm_name).replace("torch.", "") in ("float32", "fp32") else dtype_bytes
    if "linear_num_value_heads" in cfg:  # gated delta net (Qwen3-Next, Qwen3.5)
        nk = _int_field(cfg, "linear_num_key_heads", where)
        nv = _int_field(cfg, "linear_num_value_heads", where)
        dk = _int_field(cfg, "linear_key_head_dim", where)
        dv = _int_field(cfg, "linear_value_head_dim", where)
        kernel = _int_field(cfg, "linear_conv_kernel_dim", where, 4)
        conv_dim = dk * nk * 2 + dv * nv
        if conv_dim % tp or nv % tp:
            raise BadInput(f"{where}: linear-attention heads ({nk} key, {nv} value) cannot be split across tp={tp}.")
        conv = conv_dim // tp * (kernel - 1) * dtype_bytes
        temporal = nv // tp * dv * dk * ssm_bytes
        return conv + temporal, None
    if "mamba_n_heads" in cfg or "mamba_num_heads" in cfg:  # Mamba2 (NemotronH, Bamba, ...)
        heads = cfg.get("mamba_n_heads", cfg.get("mamba_num_heads"))
        head_dim = _int_field(cfg, "mamba_head_dim", where)
        state = _int_field(cfg, "ssm_state_size", where, cfg.get("mamba_d_state", 128))
        groups = _int_field(cfg, "n_groups", where, cfg.get("mamba_n_groups", 1))
        kernel = _int_field(cfg, "conv_kernel", where, cfg.get("mamba_d_conv", 4))
        inter = heads * head_dim
        if groups % tp:
            groups = groups + (tp - groups % tp)
        if ssm_name is None and str(cfg.get("model_type", "")).startswith("nemotron_h"):
            ssm_bytes = 4
        conv = (inter + 2 * groups * state) // tp * (kernel - 1) * dtype_bytes
        temporal = heads // tp * head_dim * state * ssm_bytes
        return conv + temporal, None
    return 0, "state layers present but their state shape is unknown for this config: counted as 0 bytes"


def describe_model(
    config: dict, *, tp: int = 1, kv_cache_dtype: str = "auto", where: str = "model config", vllm: str = DEFAULT_VLLM
) -> ModelShape:
    """Per-layer KV footprint on one GPU, as vLLM ``vllm`` would build its KV specs (the notes and errors
    name that release)."""
    cfg = _text_config(config, where)
    check_config_numbers(cfg, where)
    n_layers = _int_field(cfg, "num_hidden_layers", where)
    hidden = _int_field(cfg, "hidden_size", where)
    n_heads = _int_field(cfg, "num_attention_heads", where)
    n_kv = _int_field(cfg, "num_key_value_heads", where, n_heads)
    head_dim = _head_dim(cfg, hidden, n_heads, where)
    dtype_name, dtype_bytes = _model_dtype(cfg)
    kv_name, auto_note = _kv_dtype(cfg, kv_cache_dtype, dtype_name)
    kv_bytes = _DTYPE_BYTES[kv_name]
    mla = cfg.get("kv_lora_rank") is not None
    notes: list[str] = [auto_note] if auto_note else []
    _check_tp(n_heads, n_kv, tp, mla, where, notes)
    types = _layer_types(cfg, n_layers, where)
    shared_from = n_layers - int(cfg.get("num_kv_shared_layers") or 0)
    attn = _Attention(
        cfg=cfg, tp=tp, where=where, kv_name=kv_name, head_dim=head_dim, kv_heads_per_gpu=max(1, n_kv // tp), vllm=vllm
    )
    if mla:
        attn.mla_tok = _mla_latent(cfg, kv_bytes, where, notes)
    state_bytes = 0
    if any(t in _STATE_TYPES for t in types):
        state_bytes, state_note = _state_bytes(cfg, tp, dtype_bytes, where)
        if state_note:
            notes.append(state_note)
    layers: list[LayerKV] = []
    unknown_attn: list[int] = []
    for i, t in enumerate(types):
        if i >= shared_from:
            layers.append(LayerKV(i, "shared"))
        elif t in _STATE_TYPES:
            layers.append(LayerKV(i, "state", state_bytes=state_bytes))
        else:
            if t not in _FULL_TYPES | _SLIDING_TYPES | _CHUNKED_TYPES and "attention" in t:
                unknown_attn.append(i)
                t = "full_attention"  # the upper bound: an attention layer keeps at most every token
            layers.append(attn.layer(i, t))
    layers = _layer_notes(layers, types, unknown_attn, n_layers, shared_from, notes, vllm)
    return ModelShape(
        layers=layers,
        dtype_bytes=dtype_bytes,
        kv_dtype=kv_name,
        hidden_size=hidden,
        intermediate_size=_intermediate_size(cfg, hidden),
        vocab_size=int(cfg.get("vocab_size") or 32000),
        num_attention_heads=n_heads,
        num_kv_heads=n_kv,
        head_dim=head_dim,
        max_position_embeddings=cfg.get("max_position_embeddings"),
        mla=mla,
        notes=notes,
    )


def _head_dim(cfg: dict, hidden: int, n_heads: int, where: str) -> int:
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if hidden % n_heads:
            raise BadInput(
                f"{where}: no 'head_dim' and hidden_size {hidden} is not divisible by num_attention_heads {n_heads}."
            )
        head_dim = hidden // n_heads
    return _int_field({"head_dim": head_dim}, "head_dim", where)


def _kv_dtype(cfg: dict, kv_cache_dtype: str, dtype_name: str) -> tuple[str, str | None]:
    """The KV cache's dtype ('auto': the checkpoint's ModelOpt KV quantization, else the model's
    dtype) and the note saying what 'auto' resolved to."""
    kv_dt = (kv_cache_dtype or "auto").lower()
    if kv_dt not in KV_CACHE_DTYPES:
        raise BadInput(f"kv_cache_dtype {kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}.")
    auto_note = None
    if kv_dt == "auto" and (resolved := _modelopt_kv_dtype(cfg)):
        kv_dt = resolved
        auto_note = f"kv_cache_dtype 'auto' resolves to {resolved} from the checkpoint's ModelOpt quantization_config"
    return (dtype_name if kv_dt == "auto" else kv_dt), auto_note


def _check_tp(n_heads: int, n_kv: int, tp: int, mla: bool, where: str, notes: list[str]) -> None:
    """The TP checks vLLM itself makes (ModelConfig.verify_with_parallel_config, QKVParallelLinear)."""
    if n_heads % tp:
        raise BadInput(
            f"{where}: num_attention_heads ({n_heads}) is not divisible by tp={tp}; vLLM refuses this "
            f"(\"Total number of attention heads must be divisible by tensor parallel size\")."
        )
    if mla:
        return
    if n_kv >= tp and n_kv % tp:
        raise BadInput(f"{where}: num_key_value_heads ({n_kv}) is not divisible by tp={tp}; vLLM cannot shard them.")
    if n_kv < tp and tp % n_kv:
        raise BadInput(
            f"{where}: tp={tp} is not a multiple of num_key_value_heads ({n_kv}); vLLM cannot replicate them."
        )
    if n_kv < tp:
        notes.append(
            f"{n_kv} KV heads < tp={tp}: each GPU holds a replica of one KV head ({tp // n_kv} copies per head)"
        )


def _mla_latent(cfg: dict, kv_bytes: int, where: str, notes: list[str]) -> int:
    """Bytes per token per layer of an MLA model: one latent, replicated on every TP rank."""
    rank = _int_field(cfg, "kv_lora_rank", where)
    rope = _int_field(cfg, "qk_rope_head_dim", where, 64)
    notes.append(f"MLA: one {rank}+{rope} latent per token per layer, identical on every TP rank (not split)")
    if cfg.get("index_topk") is not None:
        notes.append("sparse-MLA indexer cache (DeepSeek V3.2 style) not counted")
    return (rank + rope) * kv_bytes


@dataclass
class _Attention:
    """What an attention layer's KV spec depends on."""

    cfg: dict
    tp: int
    where: str
    kv_name: str
    head_dim: int
    kv_heads_per_gpu: int
    mla_tok: int | None = None  # MLA: bytes per token per layer
    vllm: str = DEFAULT_VLLM  # the release whose KV specs are modelled (named in errors)

    def layer(self, i: int, t: str) -> LayerKV:
        """The KV of attention layer ``i`` of type ``t``."""
        cfg, where = self.cfg, self.where
        if t not in _FULL_TYPES | _SLIDING_TYPES | _CHUNKED_TYPES:
            raise BadInput(
                f"{where}: layer_types[{i}] is {t!r}, which vLLM {self.vllm} has no KV spec for here "
                f"(known: full_attention, sliding_attention, chunked_attention, linear_attention, mamba)."
            )
        if self.mla_tok is not None:
            return LayerKV(i, "mla", bytes_per_token=self.mla_tok)
        hd = self.head_dim
        heads = self.kv_heads_per_gpu
        global_head = cfg.get("global_head_dim")
        if t in _FULL_TYPES and global_head:
            hd = int(global_head)
            if cfg.get("attention_k_eq_v") and cfg.get("num_global_key_value_heads"):
                heads = max(1, int(cfg["num_global_key_value_heads"]) // self.tp)
        per_tok = heads * 2 * _head_bytes(hd, self.kv_name)
        if t in _SLIDING_TYPES:
            window = cfg.get("sliding_window")
            if not isinstance(window, int) or window <= 0:
                raise BadInput(
                    f"{where}: layer {i} is sliding_attention but 'sliding_window' is not a positive integer."
                )
            return LayerKV(i, "sliding", per_tok, window=window)
        if t in _CHUNKED_TYPES:
            chunk = cfg.get("attention_chunk_size")
            if not isinstance(chunk, int) or chunk <= 0:
                raise BadInput(f"{where}: layer {i} is chunked_attention but 'attention_chunk_size' is missing.")
            return LayerKV(i, "chunked", per_tok, window=chunk)
        return LayerKV(i, "full", per_tok)


def _layer_notes(
    layers: list[LayerKV],
    types: list[str],
    unknown_attn: list[int],
    n_layers: int,
    shared_from: int,
    notes: list[str],
    vllm: str = DEFAULT_VLLM,
) -> list[LayerKV]:
    """What the layers' notes say (unknown attention types, chunked layers at full length,
    shared KV), and the layers with chunked ones at full length where vLLM keeps them so."""
    if unknown_attn:
        names = sorted({types[i] for i in unknown_attn})
        notes.append(
            f"layer_types {', '.join(map(repr, names))} at layers {unknown_attn} are not a type vLLM {vllm} knows "
            "(stock vLLM refuses them; the layer-type rewrite patch maps them to full_attention): "
            "counted as full attention"
        )
    if any(l.kind == "chunked" for l in layers) and any(l.kind == "full" for l in layers):
        # vLLM disables the hybrid KV manager for chunked local attention (latency regression,
        # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE unset): chunked layers then hold full-length KV.
        layers = [LayerKV(l.index, "full", l.bytes_per_token) if l.kind == "chunked" else l for l in layers]
        notes.append(
            "chunked-local-attention layers counted at full length (vLLM disables the hybrid KV manager for them)"
        )
    if shared_from < n_layers:
        notes.append(f"last {n_layers - shared_from} layers reuse earlier layers' KV (num_kv_shared_layers)")
    return layers


def _intermediate_size(cfg: dict, hidden: int) -> int:
    inter = cfg.get("intermediate_size") or 4 * hidden
    moe_inter, topk = cfg.get("moe_intermediate_size"), cfg.get("num_experts_per_tok")
    if isinstance(moe_inter, int) and isinstance(topk, int):
        inter = max(int(inter), moe_inter * topk)
    return int(inter)


# --------------------------------------------------------------------------- vLLM KV allocator model


@dataclass(frozen=True)
class _Spec:
    kind: str  # full | sliding | chunked | state  (mla is a full-attention spec)
    block: int
    page: int  # bytes per block per layer
    window: int = 0

    def max_mem(self, max_len: int, in_flight: int) -> int:
        if self.kind == "full":
            return _cdiv(max_len, self.block) * self.page
        if self.kind == "sliding":
            return (_cdiv(min(self.window - 1 + in_flight, max_len), self.block) + 1) * self.page
        if self.kind == "chunked":
            return _cdiv(min(self.window + in_flight, max_len), self.block) * self.page
        return self.page  # state: one page per request (mamba_cache_mode 'none', the hybrid default)


@dataclass
class _Layout:
    """The KV cache groups vLLM builds, as layer-index lists per group."""

    specs: dict[int, _Spec]
    groups: list[tuple[list[int], _Spec]]
    uniform_type: bool  # one UniformTypeKVCacheSpecs group (per-layer page sizes)
    block_size: int


def _build_layout(model: ModelShape, block_size: int) -> _Layout:
    owners = [l for l in model.layers if l.kind not in ("shared", "none")]
    if not owners:
        return _Layout({}, [], False, block_size)
    attn = [l for l in owners if l.kind != "state"]
    states = [l for l in owners if l.kind == "state"]
    if not attn and not any(l.state_bytes for l in states):
        return _Layout({}, [], False, block_size)  # state of an unknown shape (counted as 0 bytes) only: no pages
    if model.mla:
        block_size = max(block_size, 64)  # FlashMLA kernel block size on Hopper
    if attn and states:
        # platforms/interface.py:_align_hybrid_block_size
        attn_tok = attn[0].bytes_per_token
        state_page = max(l.state_bytes for l in states)
        if state_page > 0:
            align = max(64 if model.mla else 16, block_size)
            block_size = max(block_size, align * _cdiv(state_page, align * attn_tok))
    specs: dict[int, _Spec] = {}
    for l in owners:
        if l.kind == "state":
            page = block_size * attn[0].bytes_per_token if attn else l.state_bytes
            specs[l.index] = _Spec("state", block_size, max(page, l.state_bytes))
        else:
            kind = "full" if l.kind in ("full", "mla") else l.kind
            specs[l.index] = _Spec(kind, block_size, block_size * l.bytes_per_token, l.window or 0)

    values = list(specs.values())
    if all(v == values[0] for v in values):
        return _Layout(specs, [(list(specs), values[0])], False, block_size)
    kinds = {v.kind for v in values}
    windows = {v.window for v in values}
    if len(kinds) == 1 and (kinds != {"sliding"} or len(windows) == 1) and kinds != {"state"}:
        # UniformTypeKVCacheSpecs: same type, different page sizes -> one group
        return _Layout(specs, [(list(specs), values[0])], True, block_size)
    # unify_kv_cache_spec_page_size: grow the block size of smaller attention pages
    max_page = max(v.page for v in values)
    for idx, v in list(specs.items()):
        if v.page == max_page:
            continue
        if v.kind == "state":
            specs[idx] = _Spec("state", v.block, max_page)
        elif max_page % v.page == 0:
            ratio = max_page // v.page
            specs[idx] = _Spec(v.kind, v.block * ratio, max_page, v.window)
        else:
            raise BadInput(
                f"model config: layer {idx}'s KV page ({v.page} B) does not divide the largest page ({max_page} B); "
                "vLLM 0.26.0 cannot unify these page sizes (NotImplementedError at boot)."
            )
    # _get_kv_cache_groups_uniform_page_size
    by_spec: dict[_Spec, list[int]] = {}
    for idx, v in specs.items():
        by_spec.setdefault(v, []).append(idx)
    counts = [len(v) for v in by_spec.values()]
    group_size = min(counts)
    if max(counts) < group_size * 1.5:
        group_size = max(counts)
    groups: list[tuple[list[int], _Spec]] = []
    for spec, idxs in by_spec.items():
        n = _cdiv(len(idxs), group_size)
        for i in range(n):
            groups.append((idxs[i::n], spec))
    return _Layout(specs, groups, False, block_size)


def pp_partition(n_layers: int, pp: int) -> list[range]:
    """vllm.distributed.utils.get_pp_indices (without VLLM_PP_LAYER_PARTITION)."""
    per = n_layers // pp
    parts = [per] * pp
    for i in range(2, n_layers % pp + 2):
        parts[-i] += 1
    out, start = [], 0
    for p in parts:
        out.append(range(start, start + p))
        start += p
    return out


@dataclass
class _Worker:
    groups: list[tuple[list[int], _Spec]]
    uniform_type: bool

    @property
    def empty(self) -> bool:
        return not any(g for g, _ in self.groups)

    def bytes_per_block(self, specs: dict[int, _Spec]) -> int:
        if self.uniform_type:
            return sum(specs[i].page for i in self.groups[0][0])
        size = max(len(g) for g, _ in self.groups)
        return self.groups[0][1].page * size

    def per_request_pages(self, specs: dict[int, _Spec], max_len: int, in_flight: int) -> int:
        """Blocks of the pool one max-length request holds (get_max_concurrency_for_kv_cache_config)."""
        if self.uniform_type:
            return max(_cdiv(specs[i].max_mem(max_len, in_flight), specs[i].page) for i in self.groups[0][0])
        page = self.groups[0][1].page
        return sum(_cdiv(spec.max_mem(max_len, in_flight), page) for _, spec in self.groups)

    def needed_bytes(self, specs: dict[int, _Spec], max_len: int, in_flight: int) -> int:
        """_max_memory_usage_bytes_from_groups: the boot check."""
        if self.uniform_type:
            return sum(specs[i].max_mem(max_len, in_flight) for i in self.groups[0][0])
        return self.bytes_per_block(specs) * self.per_request_pages(specs, max_len, in_flight)


def _workers(layout: _Layout, n_layers: int, pp: int) -> list[_Worker]:
    out = []
    for part in pp_partition(n_layers, pp):
        groups = [([i for i in g if i in part], spec) for g, spec in layout.groups]
        out.append(_Worker(groups, layout.uniform_type))
    return out


# --------------------------------------------------------------------------- the plan


@dataclass
class Plan:
    # inputs (resolved)
    gpus: int
    tp: int
    pp: int
    replicas: int
    gpu_memory_bytes: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int | None
    max_num_batched_tokens: int
    kv_cache_dtype: str
    block_size: int
    weights_bytes: int
    cpu_offload_bytes: int
    # budget, per GPU (worst PP stage)
    requested_bytes: int
    weights_per_gpu: int
    reserve_bytes: int
    reserve_breakdown: dict[str, int]
    reserve_source: str
    available_kv_bytes: int
    # KV arithmetic
    kv_bytes_per_token_per_gpu: int
    kv_bytes_per_token_node: int
    per_sequence_fixed_bytes: int
    needed_one_seq_bytes: int
    needed_requested_bytes: int | None
    headroom_bytes: int
    num_blocks: int
    kv_tokens_per_gpu: int
    max_concurrency: float
    # answers
    boots: bool
    fits: bool
    reasons: list[str]
    max_context_one_seq: int | None  # None: not limited by KV memory
    max_context_at_num_seqs: int | None  # None: not asked (no max_num_seqs) or not limited
    max_seqs_at_context: int
    min_utilization: float | None
    suggestions: list[dict[str, Any]]
    layers: dict[str, int]
    notes: list[str]
    vllm: str = DEFAULT_VLLM  # the release planned for (its facts: RELEASE_FACTS)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema"] = "build-image/plan/v1"
        d["verdict"] = "fits" if self.fits else "does-not-fit"
        return d


def _default_reserve(
    model: ModelShape, *, tp: int, pp: int, max_num_batched_tokens: int, sampler_rows: int, enforce_eager: bool
) -> dict[str, int]:
    act_b = model.dtype_bytes
    qkv = (model.num_attention_heads + 2 * max(model.num_kv_heads, 1)) * model.head_dim // tp
    per_token = act_b * (2 * model.hidden_size + qkv + 3 * model.intermediate_size // tp)
    parts = {
        "activations": max_num_batched_tokens * per_token,
        "sampler": sampler_rows * model.vocab_size * SAMPLER_BYTES_PER_LOGIT,
        "workspace": RESERVE_BASE_BYTES,
        "communication": RESERVE_COMM_BYTES if tp * pp > 1 else 0,
        "cuda_graphs": 0 if enforce_eager else RESERVE_CUDAGRAPH_BYTES,
    }
    return parts


def make_plan(
    config: dict,
    *,
    weights_bytes: int,
    gpus: int | None = None,
    gpu_memory_bytes: int,
    tp: int = 1,
    pp: int = 1,
    gpu_memory_utilization: float | None = None,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    kv_cache_dtype: str = "auto",
    cpu_offload_gb: float = 0,
    reserve_bytes: int | None = None,
    max_num_batched_tokens: int | None = None,
    block_size: int = 16,
    enforce_eager: bool = False,
    where: str = "model config",
    vllm: str | None = None,
) -> Plan:
    """Predict what vLLM ``vllm`` (a shipped release; None: 0.26.0) will allocate per GPU and
    whether the settings fit.  ``gpu_memory_utilization`` None is the release's default; a
    ``kv_cache_dtype`` the release does not accept is BadInput.  The arithmetic is vLLM 0.26.0's
    (module doc); what differs per release is in :data:`RELEASE_FACTS`.

    ``gpu_memory_bytes`` is the per-GPU total as CUDA reports it; ``weights_bytes``
    the whole checkpoint (split evenly over tp × pp).  ``reserve_bytes`` replaces
    the default activation/workspace/CUDA-graph estimate.  Raises BadInput for
    settings vLLM would refuse before loading anything.
    """
    facts = release_facts(vllm)
    u = facts.default_gpu_memory_utilization if gpu_memory_utilization is None else gpu_memory_utilization
    check_kv_cache_dtype(kv_cache_dtype, facts)
    gpus = _check_settings(
        gpus=gpus,
        tp=tp,
        pp=pp,
        u=u,
        gpu_memory_bytes=gpu_memory_bytes,
        weights_bytes=weights_bytes,
        cpu_offload_gb=cpu_offload_gb,
        reserve_bytes=reserve_bytes,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
    )
    model, notes, max_model_len = _shape(
        config, facts, tp, pp, kv_cache_dtype, where, gpu_memory_utilization, max_model_len
    )
    max_num_batched_tokens, sampler_rows, in_flight = _batching(
        gpu_memory_bytes, max_num_batched_tokens, max_num_seqs, pp
    )
    budget = _budget(
        model,
        gpu_memory_bytes=gpu_memory_bytes,
        u=u,
        weights_bytes=weights_bytes,
        tp=tp,
        pp=pp,
        cpu_offload_gb=cpu_offload_gb,
        reserve_bytes=reserve_bytes,
        max_num_batched_tokens=max_num_batched_tokens,
        sampler_rows=sampler_rows,
        enforce_eager=enforce_eager,
    )
    layout = _noted_layout(model, block_size, notes)
    pool = _Pool(_workers(layout, len(model.layers), pp), layout.specs, in_flight)
    kv = _kv_per_token(model, pp_partition(len(model.layers), pp), pool, max_model_len, tp)
    v, fit, suggestions = _judge(pool, budget, u, gpu_memory_bytes, max_model_len, max_num_seqs)
    settings = dict(
        gpus=gpus,
        tp=tp,
        pp=pp,
        gpu_memory_bytes=gpu_memory_bytes,
        gpu_memory_utilization=float(u),
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        weights_bytes=weights_bytes,
    )
    return _assemble(settings, model, layout, budget, kv, v, fit, suggestions, notes, facts.vllm)


def _shape(
    config: dict, facts, tp: int, pp: int, kv_cache_dtype: str, where: str, util: float | None, max_model_len
) -> tuple[ModelShape, list[str], int]:
    """The model's shape on ``tp`` GPUs, the notes it starts the plan with, and the context length planned."""
    model = describe_model(config, tp=tp, kv_cache_dtype=kv_cache_dtype, where=where, vllm=facts.vllm)
    n_layers = len(model.layers)
    if pp > n_layers:
        raise BadInput(f"--pp {pp} is larger than the model's {n_layers} layers.")
    notes = list(model.notes) + _unset_utilization_notes(facts, util)
    return model, notes, _max_model_len(model, max_model_len, where, notes)


def _noted_layout(model: ModelShape, block_size: int, notes: list[str]):
    """The layout across the layers (:func:`_build_layout`); a block size vLLM raises is noted."""
    layout = _build_layout(model, block_size)
    if layout.block_size != block_size:
        notes.append(
            f"attention block size raised to {layout.block_size} tokens (vLLM aligns it to the state/MLA page)"
        )
    return layout


def _judge(pool, budget, u: float, gpu_memory_bytes: int, max_model_len: int, max_num_seqs: int | None):
    """Whether the settings boot and fit, what would fit, and what to change when they do not."""
    v = _verdict(
        pool, budget, u=u, gpu_memory_bytes=gpu_memory_bytes, max_model_len=max_model_len, max_num_seqs=max_num_seqs
    )
    fit = _what_fits(
        pool, budget, v, gpu_memory_bytes=gpu_memory_bytes, max_model_len=max_model_len, max_num_seqs=max_num_seqs
    )
    suggestions = (
        [] if v.fits else _suggestions(fit, budget, u=u, max_model_len=max_model_len, max_num_seqs=max_num_seqs)
    )
    return v, fit, suggestions


def _batching(
    gpu_memory_bytes: int, max_num_batched_tokens: int | None, max_num_seqs: int | None, pp: int
) -> tuple[int, int, int]:
    """vLLM OpenAI-server defaults (arg_utils.py): tokens per step, the sampler's rows, and the tokens in flight
    (async scheduling keeps 2 batches in flight, a pipeline one per stage)."""
    big_gpu = gpu_memory_bytes >= 70 * GiB
    if max_num_batched_tokens is None:
        max_num_batched_tokens = 8192 if big_gpu else 2048
    sampler_rows = min(max_num_seqs or (1024 if big_gpu else 256), max_num_batched_tokens)
    in_flight = (2 if pp == 1 else pp) * max_num_batched_tokens
    return max_num_batched_tokens, sampler_rows, in_flight


def _assemble(settings: dict, model, layout, budget, kv, v, fit, suggestions, notes, vllm) -> Plan:
    """The plan from the settings (make_plan's, defaults applied) and each step's result."""
    kv_tok_gpu, kv_tok_node, fixed = kv
    kinds = [l.kind for l in model.layers]
    return Plan(
        **settings,
        replicas=settings["gpus"] // (settings["tp"] * settings["pp"]),
        kv_cache_dtype=model.kv_dtype,
        block_size=layout.block_size,
        cpu_offload_bytes=budget.offload,
        requested_bytes=budget.requested,
        weights_per_gpu=budget.weights_per_gpu,
        reserve_bytes=budget.reserve,
        reserve_breakdown=budget.breakdown,
        reserve_source=budget.source,
        available_kv_bytes=budget.available,
        kv_bytes_per_token_per_gpu=kv_tok_gpu,
        kv_bytes_per_token_node=kv_tok_node,
        per_sequence_fixed_bytes=max(fixed),
        needed_one_seq_bytes=v.needed_one,
        needed_requested_bytes=v.needed_req,
        headroom_bytes=v.headroom,
        num_blocks=v.num_blocks,
        kv_tokens_per_gpu=v.tokens,
        max_concurrency=v.conc if v.conc != float("inf") else -1.0,
        boots=v.boots,
        fits=v.fits,
        reasons=v.reasons,
        max_context_one_seq=fit.max_ctx_one,
        max_context_at_num_seqs=fit.max_ctx_seqs,
        max_seqs_at_context=fit.max_seqs,
        min_utilization=fit.min_util,
        suggestions=suggestions,
        layers={k: kinds.count(k) for k in sorted(set(kinds))},
        notes=notes,
        vllm=vllm,
    )


def _check_settings(
    *,
    gpus: int | None,
    tp: int,
    pp: int,
    u: float,
    gpu_memory_bytes: int,
    weights_bytes: int,
    cpu_offload_gb: float,
    reserve_bytes: int | None,
    max_num_seqs: int | None,
    block_size: int,
) -> int:
    """The settings vLLM refuses before loading anything; the number of GPUs (default tp × pp)."""
    for name, val in (("tp", tp), ("pp", pp)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise BadInput(f"--{name} must be a positive integer, got {val!r}.")
    gpus = tp * pp if gpus is None else gpus
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise BadInput(f"--gpus must be a positive integer, got {gpus!r}.")
    if gpus < tp * pp or gpus % (tp * pp):
        raise BadInput(f"--gpus {gpus} is not a multiple of tp × pp = {tp * pp}; vLLM needs tp × pp GPUs per replica.")
    if isinstance(u, bool) or not isinstance(u, (int, float)) or not (0 < u <= 1):
        raise BadInput(f"--gpu-memory-utilization must be in (0, 1], got {u!r}.")
    if not isinstance(gpu_memory_bytes, int) or gpu_memory_bytes <= 0:
        raise BadInput(f"--gpu-memory must be a positive size, got {gpu_memory_bytes!r}.")
    if isinstance(weights_bytes, bool) or not isinstance(weights_bytes, int) or weights_bytes < 0:
        raise BadInput(f"--weights-bytes must be a non-negative integer, got {weights_bytes!r}.")
    if (
        cpu_offload_gb is None
        or isinstance(cpu_offload_gb, bool)
        or not isinstance(cpu_offload_gb, (int, float))
        or not math.isfinite(cpu_offload_gb)
        or cpu_offload_gb < 0
    ):
        raise BadInput(f"--cpu-offload-gb must be a finite number >= 0, got {cpu_offload_gb!r}.")
    if reserve_bytes is not None and reserve_bytes < 0:
        raise BadInput(f"--reserve-gib must be >= 0, got {reserve_bytes / GiB!r}.")
    if max_num_seqs is not None and (
        isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1
    ):
        raise BadInput(f"--max-num-seqs must be a positive integer, got {max_num_seqs!r}.")
    if not isinstance(block_size, int) or block_size < 1:
        raise BadInput(f"block size must be a positive integer, got {block_size!r}.")
    return gpus


def _max_model_len(model: ModelShape, max_model_len: int | None, where: str, notes: list[str]) -> int:
    """The context length planned for (default: the model's max_position_embeddings)."""
    if max_model_len is None:
        if not model.max_position_embeddings:
            raise BadInput(f"{where}: no --max-model-len given and no 'max_position_embeddings' to default to.")
        max_model_len = int(model.max_position_embeddings)
        notes.append(f"max_model_len defaults to the model's max_position_embeddings ({max_model_len:,})")
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
        raise BadInput(f"--max-model-len must be a positive integer, got {max_model_len!r}.")
    if model.max_position_embeddings and max_model_len > model.max_position_embeddings:
        notes.append(
            f"max_model_len {max_model_len:,} exceeds max_position_embeddings {model.max_position_embeddings:,}: "
            "vLLM refuses this unless rope scaling extends it or VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
    return max_model_len


@dataclass
class _Budget:
    """The memory budget per GPU (worst PP stage)."""

    gpu_memory_bytes: int
    requested: int
    offload: int
    weights_per_gpu: int
    breakdown: dict[str, int]
    reserve: int
    source: str
    startup_free: int  # what is free after the CUDA context (and communicators)

    @property
    def available(self) -> int:
        return self.requested - self.weights_per_gpu - self.reserve

    def available_at(self, uu: float) -> int | None:
        """The KV budget at utilization ``uu``; None when vLLM refuses it at startup."""
        req = math.ceil(self.gpu_memory_bytes * uu)
        if req > self.startup_free:
            return None
        return req - self.weights_per_gpu - self.reserve


def _budget(
    model: ModelShape,
    *,
    gpu_memory_bytes: int,
    u: float,
    weights_bytes: int,
    tp: int,
    pp: int,
    cpu_offload_gb: float,
    reserve_bytes: int | None,
    max_num_batched_tokens: int,
    sampler_rows: int,
    enforce_eager: bool,
) -> _Budget:
    offload = int(cpu_offload_gb * GiB)
    if reserve_bytes is None:
        breakdown = _default_reserve(
            model,
            tp=tp,
            pp=pp,
            max_num_batched_tokens=max_num_batched_tokens,
            sampler_rows=sampler_rows,
            enforce_eager=enforce_eager,
        )
        reserve = sum(breakdown.values())
        source = "estimated (docs/plan.md: activations, sampler, workspace, communication, CUDA graphs)"
    else:
        breakdown = {"given": int(reserve_bytes)}
        reserve = int(reserve_bytes)
        source = "given (--reserve-gib)"
    return _Budget(
        gpu_memory_bytes=gpu_memory_bytes,
        requested=math.ceil(gpu_memory_bytes * u),
        offload=offload,
        weights_per_gpu=max(0, _cdiv(weights_bytes, tp * pp) - offload),
        breakdown=breakdown,
        reserve=reserve,
        source=source,
        startup_free=gpu_memory_bytes - STARTUP_CONTEXT_BYTES - (RESERVE_COMM_BYTES if tp * pp > 1 else 0),
    )


@dataclass
class _Pool:
    """The KV allocator of the PP workers: what a length and a budget give."""

    workers: list[_Worker]
    specs: dict[int, _Spec]
    in_flight: int

    @property
    def first(self) -> _Worker | None:
        return next((w for w in self.workers if not w.empty), None)

    @property
    def attention_free(self) -> bool:
        return all(w.empty for w in self.workers)

    def num_blocks(self, avail: int) -> int:
        return min(max(0, avail) // w.bytes_per_block(self.specs) for w in self.workers if not w.empty)

    def concurrency(self, length: int, nblocks: int) -> float:
        first = self.first
        if first is None:
            return float("inf")
        return nblocks / first.per_request_pages(self.specs, length, self.in_flight)

    def boots_at(self, length: int, avail: int) -> bool:
        if self.first is None:
            return avail > 0
        return avail > 0 and all(
            w.needed_bytes(self.specs, length, self.in_flight) <= avail for w in self.workers if not w.empty
        )


def _kv_per_token(
    model: ModelShape, parts: list[range], pool: _Pool, max_model_len: int, tp: int
) -> tuple[int, int, list[int]]:
    """KV bytes per token on the worst GPU and on the node, and each stage's fixed bytes per
    sequence (window and state layers)."""
    per_gpu_tok = []
    fixed = []
    specs = pool.specs
    for part in parts:
        tok = sum(l.bytes_per_token for l in model.layers if l.index in part and l.kind in ("full", "mla"))
        fx = sum(
            specs[i].max_mem(max_model_len, pool.in_flight)
            for i in part
            if i in specs and specs[i].kind in ("sliding", "chunked", "state")
        )
        per_gpu_tok.append(tok)
        fixed.append(fx)
    return max(per_gpu_tok), sum(per_gpu_tok) * tp, fixed


@dataclass
class _Verdict:
    """The KV pool at the requested settings and whether they boot and fit."""

    num_blocks: int = 0
    tokens: int = 0
    conc: float = float("inf")
    needed_one: int = 0
    startup_ok: bool = True
    boots: bool = False
    fits: bool = False
    reasons: list[str] = field(default_factory=list)
    needed_req: int | None = None
    headroom: int = 0


def _verdict(
    pool: _Pool, budget: _Budget, *, u: float, gpu_memory_bytes: int, max_model_len: int, max_num_seqs: int | None
) -> _Verdict:
    v = _Verdict()
    available = budget.available
    if not pool.attention_free:
        v.num_blocks = pool.num_blocks(available)
        v.needed_one = max(
            w.needed_bytes(pool.specs, max_model_len, pool.in_flight) for w in pool.workers if not w.empty
        )
        v.conc = pool.concurrency(max_model_len, v.num_blocks)
        v.tokens = int(v.conc * max_model_len)
    requested, startup_free = budget.requested, budget.startup_free
    v.startup_ok = requested <= startup_free
    if not v.startup_ok:
        v.reasons.append(
            f"utilization {u} requests {requested / GiB:.2f} GiB but only ~{startup_free / GiB:.2f} GiB is free after "
            "the CUDA context: vLLM refuses at startup (\"Free memory on device ... is less than desired GPU memory "
            "utilization\")"
        )
    v.boots = v.startup_ok and pool.boots_at(max_model_len, available)
    if available <= 0:
        v.reasons.append(
            f"no memory left for the KV cache: {u} × {gpu_memory_bytes / GiB:.2f} GiB = {requested / GiB:.2f} GiB "
            f"requested, weights take {budget.weights_per_gpu / GiB:.2f} GiB and the reserve "
            f"{budget.reserve / GiB:.2f} GiB per GPU"
        )
    elif not pool.boots_at(max_model_len, available):
        v.reasons.append(
            f"one {max_model_len:,}-token sequence needs {v.needed_one / GiB:.2f} GiB of KV per GPU but only "
            f"{available / GiB:.2f} GiB is available: vLLM raises at boot, after the weights are loaded"
        )
    first = pool.first
    if max_num_seqs is not None and first is not None:
        v.needed_req = (
            first.bytes_per_block(pool.specs)
            * first.per_request_pages(pool.specs, max_model_len, pool.in_flight)
            * max_num_seqs
        )
        if v.boots and v.conc < max_num_seqs:
            v.reasons.append(
                f"{max_num_seqs} concurrent {max_model_len:,}-token sequences need {v.needed_req / GiB:.2f} GiB of KV "
                f"per GPU; the KV pool holds {v.conc:.2f} such sequences: vLLM boots but preempts/queues under "
                "full load"
            )
    v.fits = v.boots and (max_num_seqs is None or v.conc >= max_num_seqs)
    v.headroom = available - (v.needed_req if v.needed_req is not None else v.needed_one)
    return v


def _largest(pred: Callable[[int], bool], hi: int) -> int:
    """The largest n in [1, hi] for which ``pred`` holds, ``pred`` holding on a prefix; 0 when none."""
    if not pred(1):
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class _Fit:
    """What would fit: the longest contexts, the most sequences, the lowest utilization."""

    max_ctx_one: int | None
    max_ctx_seqs: int | None
    max_seqs: int
    min_util: float | None
    top: int  # the highest utilization (in thousandths) vLLM starts with


def _what_fits(
    pool: _Pool, budget: _Budget, v: _Verdict, *, gpu_memory_bytes: int, max_model_len: int, max_num_seqs: int | None
) -> _Fit:
    available = budget.available
    search_top = max(max_model_len, 1 << 31)
    max_ctx_one = _largest(lambda n: pool.boots_at(n, available), search_top) if v.startup_ok else 0
    max_ctx_seqs = None
    if max_num_seqs is not None and v.startup_ok and not pool.attention_free:
        max_ctx_seqs = _largest(
            lambda n: pool.boots_at(n, available) and pool.concurrency(n, v.num_blocks) >= max_num_seqs, search_top
        )
    if max_ctx_one == search_top:  # window/state layers only: context is not limited by KV memory
        max_ctx_one = None
    if max_ctx_seqs == search_top:
        max_ctx_seqs = None
    max_seqs = int(math.floor(v.conc)) if (v.boots and not pool.attention_free) else 0
    # Below the startup limit, the utilizations that do not fit are a prefix; above it
    # nothing fits (vLLM refuses at startup), so search only up to that limit -- else the
    # bisection can step over a narrow window that fits (e.g. 600 GB on 8 × 80 GB GPUs at 4,096 tokens: 0.986..0.989).
    startup_free = budget.startup_free
    min_util = None
    top = min(1000, math.floor(startup_free * 1000 / gpu_memory_bytes))
    while top > 0 and math.ceil(gpu_memory_bytes * top / 1000) > startup_free:
        top -= 1
    if top >= 1:
        k = _largest(lambda m: not _fits_at_util(pool, budget, m / 1000, max_model_len, max_num_seqs), top)
        if k < top and _fits_at_util(pool, budget, (k + 1) / 1000, max_model_len, max_num_seqs):
            min_util = (k + 1) / 1000
    return _Fit(max_ctx_one, max_ctx_seqs, max_seqs, min_util, top)


def _fits_at_util(pool: _Pool, budget: _Budget, uu: float, max_model_len: int, max_num_seqs: int | None) -> bool:
    av = budget.available_at(uu)
    if av is None or not pool.boots_at(max_model_len, av):
        return False
    if max_num_seqs is None or pool.first is None:
        return True
    return pool.concurrency(max_model_len, pool.num_blocks(av)) >= max_num_seqs


def _suggestions(
    fit: _Fit, budget: _Budget, *, u: float, max_model_len: int, max_num_seqs: int | None
) -> list[dict[str, Any]]:
    """What to change when the settings do not fit."""
    suggestions: list[dict[str, Any]] = []
    if fit.max_ctx_seqs and max_num_seqs is not None:
        suggestions.append(
            {
                "setting": "max_model_len",
                "value": fit.max_ctx_seqs,
                "text": f"--max-model-len {fit.max_ctx_seqs} keeps {max_num_seqs} concurrent sequences",
            }
        )
    elif fit.max_ctx_one:
        suggestions.append(
            {
                "setting": "max_model_len",
                "value": fit.max_ctx_one,
                "text": f"--max-model-len {fit.max_ctx_one} is the longest single sequence that fits",
            }
        )
    if fit.max_seqs >= 1 and max_num_seqs is not None and fit.max_seqs < max_num_seqs:
        suggestions.append(
            {
                "setting": "max_num_seqs",
                "value": fit.max_seqs,
                "text": f"--max-num-seqs {fit.max_seqs} at {max_model_len:,} tokens",
            }
        )
    if fit.min_util is not None and fit.min_util > u:
        suggestions.append(
            {
                "setting": "gpu_memory_utilization",
                "value": fit.min_util,
                "text": f"--gpu-memory-utilization {fit.min_util} fits the requested settings",
            }
        )
    elif fit.min_util is not None and budget.requested > budget.startup_free:
        # too high to start; the highest that starts fits
        suggestions.append(
            {
                "setting": "gpu_memory_utilization",
                "value": fit.top / 1000,
                "text": f"--gpu-memory-utilization {fit.top / 1000} is the highest that starts "
                f"(~{budget.startup_free / GiB:.2f} GiB free after the CUDA context) and fits",
            }
        )
    if not suggestions:
        suggestions.append(
            {
                "setting": "gpus",
                "value": None,
                "text": "nothing within one GPU's budget fits: more GPUs (tp/pp), cpu offload, or a smaller checkpoint",
            }
        )
    return suggestions


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


def compare_with_log(plan: Plan, log_text: str, *, tolerance: float = 0.05) -> dict[str, Any]:
    """Prediction vs what vLLM logged at boot (for the smoke step's ground truth).

    ``implied_reserve_bytes`` is what vLLM actually set aside besides weights
    (requested − weights − logged available): feed it back as ``reserve_bytes``.
    """
    logged = parse_vllm_kv_log(log_text)
    res: dict[str, Any] = {
        "predicted_kv_tokens": plan.kv_tokens_per_gpu,
        "logged_kv_tokens": logged["kv_tokens"],
        "predicted_max_concurrency": plan.max_concurrency,
        "logged_max_concurrency": logged["max_concurrency"],
        "predicted_available_kv_bytes": plan.available_kv_bytes,
        "logged_available_kv_bytes": logged["available_kv_bytes"],
        "token_error": None,
        "within_tolerance": None,
        "implied_reserve_bytes": None,
    }
    if logged["kv_tokens"]:
        err = (plan.kv_tokens_per_gpu - logged["kv_tokens"]) / logged["kv_tokens"]
        res["token_error"] = err
        res["within_tolerance"] = abs(err) <= tolerance
    if logged["available_kv_bytes"] is not None:
        res["implied_reserve_bytes"] = plan.requested_bytes - plan.weights_per_gpu - logged["available_kv_bytes"]
    return res


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
