"""The model's shape as the planner sees it: from a ``config.json`` (a dict) to each layer's KV bytes per
token, its kind (full, sliding, chunked, MLA, state) and the notes on what was assumed."""

from __future__ import annotations

from dataclasses import dataclass, field

from builder.errors import BadInput
from builder.serving.modelconfig import text_config
from builder.serving.plan.settings import (
    CHUNKED_TYPES,
    DEFAULT_VLLM,
    DTYPE_BYTES,
    FULL_TYPES,
    KV_CACHE_DTYPES,
    SLIDING_TYPES,
    STATE_TYPES,
    check_config_numbers,
    head_bytes,
    int_field,
    modelopt_kv_dtype,
)

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
    if name not in DTYPE_BYTES:
        raise BadInput(f"model config: unsupported torch_dtype {name!r}.")
    return name, DTYPE_BYTES[name]


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
        nk = int_field(cfg, "linear_num_key_heads", where)
        nv = int_field(cfg, "linear_num_value_heads", where)
        dk = int_field(cfg, "linear_key_head_dim", where)
        dv = int_field(cfg, "linear_value_head_dim", where)
        kernel = int_field(cfg, "linear_conv_kernel_dim", where, 4)
        conv_dim = dk * nk * 2 + dv * nv
        if conv_dim % tp or nv % tp:
            raise BadInput(f"{where}: linear-attention heads ({nk} key, {nv} value) cannot be split across tp={tp}.")
        conv = conv_dim // tp * (kernel - 1) * dtype_bytes
        temporal = nv // tp * dv * dk * ssm_bytes
        return conv + temporal, None
    if "mamba_n_heads" in cfg or "mamba_num_heads" in cfg:  # Mamba2 (NemotronH, Bamba, ...)
        heads = cfg.get("mamba_n_heads", cfg.get("mamba_num_heads"))
        head_dim = int_field(cfg, "mamba_head_dim", where)
        state = int_field(cfg, "ssm_state_size", where, cfg.get("mamba_d_state", 128))
        groups = int_field(cfg, "n_groups", where, cfg.get("mamba_n_groups", 1))
        kernel = int_field(cfg, "conv_kernel", where, cfg.get("mamba_d_conv", 4))
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
    n_layers = int_field(cfg, "num_hidden_layers", where)
    hidden = int_field(cfg, "hidden_size", where)
    n_heads = int_field(cfg, "num_attention_heads", where)
    n_kv = int_field(cfg, "num_key_value_heads", where, n_heads)
    head_dim = _head_dim(cfg, hidden, n_heads, where)
    dtype_name, dtype_bytes = _model_dtype(cfg)
    kv_name, auto_note = _kv_dtype(cfg, kv_cache_dtype, dtype_name)
    kv_bytes = DTYPE_BYTES[kv_name]
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
    if any(t in STATE_TYPES for t in types):
        state_bytes, state_note = _state_bytes(cfg, tp, dtype_bytes, where)
        if state_note:
            notes.append(state_note)
    layers: list[LayerKV] = []
    unknown_attn: list[int] = []
    for i, t in enumerate(types):
        if i >= shared_from:
            layers.append(LayerKV(i, "shared"))
        elif t in STATE_TYPES:
            layers.append(LayerKV(i, "state", state_bytes=state_bytes))
        else:
            if t not in FULL_TYPES | SLIDING_TYPES | CHUNKED_TYPES and "attention" in t:
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
    return int_field({"head_dim": head_dim}, "head_dim", where)


def _kv_dtype(cfg: dict, kv_cache_dtype: str, dtype_name: str) -> tuple[str, str | None]:
    """The KV cache's dtype ('auto': the checkpoint's ModelOpt KV quantization, else the model's
    dtype) and the note saying what 'auto' resolved to."""
    kv_dt = (kv_cache_dtype or "auto").lower()
    if kv_dt not in KV_CACHE_DTYPES:
        raise BadInput(f"kv_cache_dtype {kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}.")
    auto_note = None
    if kv_dt == "auto" and (resolved := modelopt_kv_dtype(cfg)):
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
    rank = int_field(cfg, "kv_lora_rank", where)
    rope = int_field(cfg, "qk_rope_head_dim", where, 64)
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
        if t not in FULL_TYPES | SLIDING_TYPES | CHUNKED_TYPES:
            raise BadInput(
                f"{where}: layer_types[{i}] is {t!r}, which vLLM {self.vllm} has no KV spec for here "
                f"(known: full_attention, sliding_attention, chunked_attention, linear_attention, mamba)."
            )
        if self.mla_tok is not None:
            return LayerKV(i, "mla", bytes_per_token=self.mla_tok)
        hd = self.head_dim
        heads = self.kv_heads_per_gpu
        global_head = cfg.get("global_head_dim")
        if t in FULL_TYPES and global_head:
            hd = int(global_head)
            if cfg.get("attention_k_eq_v") and cfg.get("num_global_key_value_heads"):
                heads = max(1, int(cfg["num_global_key_value_heads"]) // self.tp)
        per_tok = heads * 2 * head_bytes(hd, self.kv_name)
        if t in SLIDING_TYPES:
            window = cfg.get("sliding_window")
            if not isinstance(window, int) or window <= 0:
                raise BadInput(
                    f"{where}: layer {i} is sliding_attention but 'sliding_window' is not a positive integer."
                )
            return LayerKV(i, "sliding", per_tok, window=window)
        if t in CHUNKED_TYPES:
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
