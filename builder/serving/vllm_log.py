"""Reading a vLLM server log: the lines vLLM 0.26.0 prints at boot and when it dies.

One definition of every pattern, shared by the smoke test (its verdict and
report) and the memory planner (its ground-truth check against vLLM's own KV
numbers).  Pure functions over text; standard library only, so the smoke test runs
on a bare GPU host next to vLLM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GiB = 1 << 30

# The KV-cache lines (vllm/v1/worker/gpu_worker.py, vllm/v1/core/kv_cache_utils.py).
KV_AVAILABLE = re.compile(r"Available KV cache memory:\s*([0-9.]+)\s*GiB")
KV_TOKENS = re.compile(r"GPU KV cache size:\s*([0-9,]+)\s*tokens")
KV_CONCURRENCY = re.compile(r"Maximum concurrency for\s*([0-9,]+)\s*tokens per request:\s*([0-9.]+)x")

MODEL_LOAD = re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds")
MEMORY_USAGE = re.compile(
    r"Actual usage is ([\d.]+) GiB for weight, ([\d.]+) GiB for peak activation, ([\d.]+) GiB for non-torch memory"
)
INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
SERVER_START = re.compile(r"Starting vLLM (?:API )?server on")  # once per boot (per API server)

# Out-of-memory and "does not fit" messages vLLM / torch / CUDA print.
OOM_PATTERNS: tuple[re.Pattern, ...] = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"CUDA out of memory",
        r"torch\.OutOfMemoryError",
        r"\bOutOfMemoryError\b",
        r"CUDA error: out of memory",
        r"cudaErrorMemoryAllocation",
        r"Failed to load model - not enough GPU memory",
        r"No available memory for the cache blocks",
        r"is larger than the available KV cache memory",
        r"insufficient (?:GPU|KV cache) memory",
    )
)

# Fatal engine errors worth naming in the verdict (besides OOM).
FATAL_PATTERNS: tuple[re.Pattern, ...] = tuple(
    re.compile(p)
    for p in (
        r"EngineDeadError",
        r"EngineCore (?:encountered|failed)",
        r"Engine core initialization failed",
        r"RuntimeError: .*",
        r"ValueError: .*",
    )
)
# Any other exception line (ModuleNotFoundError, ImportError, ...): the last one is the
# fallback root cause when a server exits without one of the lines above.
_ANY_EXC = re.compile(r"\b[A-Z]\w*(?:Error|Exception): ")
_EXC = re.compile(r"\b\w*(?:Error|Exception): ")

# The layer-type override patch logs one warning naming the rewritten layers.
_LAYER_TYPES = re.compile(r"layer[_ ]types?", re.IGNORECASE)
_REWRITE = re.compile(r"rewr|overrid|->|\u2192", re.IGNORECASE)


@dataclass
class LogFacts:
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens_per_request: int | None = None
    available_kv_cache_gib: float | None = None
    model_load_gib: float | None = None
    model_load_s: float | None = None
    init_engine_s: float | None = None
    weights_gib: float | None = None
    peak_activation_gib: float | None = None
    non_torch_gib: float | None = None
    server_starts: int = 0
    oom_lines: list[str] = field(default_factory=list)
    fatal_lines: list[str] = field(default_factory=list)
    layer_rewrite_lines: list[str] = field(default_factory=list)
    last_exception_line: str | None = None


def parse_server_log(text: str) -> LogFacts:
    """Extract what the smoke verdict and report need from a vLLM server log."""
    facts = LogFacts()
    for line in text.splitlines():
        if (m := KV_TOKENS.search(line)):
            facts.kv_cache_tokens = int(m.group(1).replace(",", ""))
        if (m := KV_CONCURRENCY.search(line)):
            facts.max_concurrency_tokens_per_request = int(m.group(1).replace(",", ""))
            facts.max_concurrency = float(m.group(2))
        if (m := KV_AVAILABLE.search(line)):
            facts.available_kv_cache_gib = float(m.group(1))
        if (m := MODEL_LOAD.search(line)):
            facts.model_load_gib = float(m.group(1))
            facts.model_load_s = float(m.group(2))
        if (m := MEMORY_USAGE.search(line)):
            facts.weights_gib, facts.peak_activation_gib, facts.non_torch_gib = (float(m.group(i)) for i in (1, 2, 3))
        if (m := INIT_ENGINE.search(line)):
            facts.init_engine_s = float(m.group(1))
        if SERVER_START.search(line):
            facts.server_starts += 1
        stripped = line.strip()
        if any(p.search(line) for p in OOM_PATTERNS):
            if stripped not in facts.oom_lines:
                facts.oom_lines.append(stripped)
        elif any(p.search(line) for p in FATAL_PATTERNS):
            if stripped not in facts.fatal_lines:
                facts.fatal_lines.append(stripped)
        elif _ANY_EXC.search(line):
            facts.last_exception_line = stripped
        if _LAYER_TYPES.search(line) and _REWRITE.search(line) and "Error" not in line:
            if stripped not in facts.layer_rewrite_lines:
                facts.layer_rewrite_lines.append(stripped)
    return facts


def parse_vllm_kv_log(text: str) -> dict[str, Any]:
    """The KV lines vLLM 0.26.0 logs at boot (first occurrence of each); missing ones are None."""
    out: dict[str, Any] = {"available_kv_bytes": None, "kv_tokens": None, "max_model_len": None, "max_concurrency": None}
    if m := KV_AVAILABLE.search(text):
        out["available_kv_bytes"] = int(float(m.group(1)) * GiB)
    if m := KV_TOKENS.search(text):
        out["kv_tokens"] = int(m.group(1).replace(",", ""))
    if m := KV_CONCURRENCY.search(text):
        out["max_model_len"] = int(m.group(1).replace(",", ""))
        out["max_concurrency"] = float(m.group(2))
    return out


def first_error_line(facts: LogFacts) -> str | None:
    """The root cause among the fatal lines: the first ``XxxError: ...`` that
    is not vLLM's generic "Engine core initialization failed" wrapper."""
    for line in facts.fatal_lines:
        if _EXC.search(line) and "Engine core initialization failed" not in line:
            return re.sub(r"^\([^()]*pid=\d+[^()]*\)\s*", "", line).strip()
    return facts.fatal_lines[0] if facts.fatal_lines else None


def count_server_starts(text: str) -> int:
    return len(SERVER_START.findall(text))


def read_log(path: str | None) -> str:
    if not path:
        return ""
    try:
        return Path(path).read_text("utf-8", "replace")
    except OSError:
        return ""


def log_tail(text: str, n: int = 40) -> list[str]:
    return [ln.rstrip()[:400] for ln in text.splitlines()[-n:]]
