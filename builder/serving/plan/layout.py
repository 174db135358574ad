"""The layout of vLLM's KV allocator across the layers: page specs, groups sharing one pool, the layer split
across pipeline stages, each worker's pages, and the KV bytes per token and fixed bytes per sequence."""

from __future__ import annotations

from dataclasses import dataclass

from builder.errors import BadInput
from builder.serving.plan.settings import cdiv
from builder.serving.plan.shape import ModelShape

# --------------------------------------------------------------------------- vLLM KV allocator model


@dataclass(frozen=True)
class _Spec:
    kind: str  # full | sliding | chunked | state  (mla is a full-attention spec)
    block: int
    page: int  # bytes per block per layer
    window: int = 0

    def max_mem(self, max_len: int, in_flight: int) -> int:
        if self.kind == "full":
            return cdiv(max_len, self.block) * self.page
        if self.kind == "sliding":
            return (cdiv(min(self.window - 1 + in_flight, max_len), self.block) + 1) * self.page
        if self.kind == "chunked":
            return cdiv(min(self.window + in_flight, max_len), self.block) * self.page
        return self.page  # state: one page per request (mamba_cache_mode 'none', the hybrid default)


@dataclass
class _Layout:
    """The KV cache groups vLLM builds, as layer-index lists per group."""

    specs: dict[int, _Spec]
    groups: list[tuple[list[int], _Spec]]
    uniform_type: bool  # one UniformTypeKVCacheSpecs group (per-layer page sizes)
    block_size: int


def build_layout(model: ModelShape, block_size: int) -> _Layout:
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
            block_size = max(block_size, align * cdiv(state_page, align * attn_tok))
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
        n = cdiv(len(idxs), group_size)
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
            return max(cdiv(specs[i].max_mem(max_len, in_flight), specs[i].page) for i in self.groups[0][0])
        page = self.groups[0][1].page
        return sum(cdiv(spec.max_mem(max_len, in_flight), page) for _, spec in self.groups)

    def needed_bytes(self, specs: dict[int, _Spec], max_len: int, in_flight: int) -> int:
        """_max_memory_usage_bytes_from_groups: the boot check."""
        if self.uniform_type:
            return sum(specs[i].max_mem(max_len, in_flight) for i in self.groups[0][0])
        return self.bytes_per_block(specs) * self.per_request_pages(specs, max_len, in_flight)


def stage_workers(layout: _Layout, n_layers: int, pp: int) -> list[_Worker]:
    out = []
    for part in pp_partition(n_layers, pp):
        groups = [([i for i in g if i in part], spec) for g, spec in layout.groups]
        out.append(_Worker(groups, layout.uniform_type))
    return out


@dataclass
class KVPool:
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


def kv_per_token(
    model: ModelShape, parts: list[range], pool: KVPool, max_model_len: int, tp: int
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
