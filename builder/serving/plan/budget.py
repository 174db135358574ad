"""The memory budget per GPU and the verdict: :func:`make_plan` (settings checked, the reserve estimated, the
KV pool sized, whether the settings boot and fit, what would fit, what to change) and the comparison with
vLLM's boot log."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from builder.errors import BadInput
from builder.serving.plan.layout import KVPool, build_layout, kv_per_token, pp_partition, stage_workers
from builder.serving.plan.settings import (
    DEFAULT_VLLM,
    RESERVE_BASE_BYTES,
    RESERVE_COMM_BYTES,
    RESERVE_CUDAGRAPH_BYTES,
    SAMPLER_BYTES_PER_LOGIT,
    STARTUP_CONTEXT_BYTES,
    GiB,
    cdiv,
    check_kv_cache_dtype,
    release_facts,
    unset_utilization_notes,
)
from builder.serving.plan.shape import ModelShape, describe_model
from builder.serving.vllm_log import parse_vllm_kv_log

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
    pool = KVPool(stage_workers(layout, len(model.layers), pp), layout.specs, in_flight)
    kv = kv_per_token(model, pp_partition(len(model.layers), pp), pool, max_model_len, tp)
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
    notes = list(model.notes) + unset_utilization_notes(facts, util)
    return model, notes, _max_model_len(model, max_model_len, where, notes)


def _noted_layout(model: ModelShape, block_size: int, notes: list[str]):
    """The layout across the layers (:func:`build_layout`); a block size vLLM raises is noted."""
    layout = build_layout(model, block_size)
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
        weights_per_gpu=max(0, cdiv(weights_bytes, tp * pp) - offload),
        breakdown=breakdown,
        reserve=reserve,
        source=source,
        startup_free=gpu_memory_bytes - STARTUP_CONTEXT_BYTES - (RESERVE_COMM_BYTES if tp * pp > 1 else 0),
    )


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
    pool: KVPool, budget: _Budget, *, u: float, gpu_memory_bytes: int, max_model_len: int, max_num_seqs: int | None
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
    pool: KVPool, budget: _Budget, v: _Verdict, *, gpu_memory_bytes: int, max_model_len: int, max_num_seqs: int | None
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


def _fits_at_util(pool: KVPool, budget: _Budget, uu: float, max_model_len: int, max_num_seqs: int | None) -> bool:
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
