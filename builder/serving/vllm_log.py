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

# The cold-start phases (vLLM 0.26.0: model_executor/model_loader/default_loader.py, v1/worker/gpu/model_runner.py,
# compilation/backends.py + monitor.py, v1/engine/core.py); lines as captured on the H200
# (benchmarks/coldstart-h200/).  "Loading weights" is the default loader's (safetensors, fastsafetensors, ...);
# the runai streamer logs only "Model loading", which also counts building the model on the GPU.
WEIGHTS_LOAD = re.compile(r"Loading weights took ([\d.]+) seconds")
DYNAMO_TRANSFORM = re.compile(r"Dynamo bytecode transform time: ([\d.]+) s")
GRAPH_COMPILE = re.compile(r"Compiling a graph for compile range \([^)]*\) takes ([\d.]+) s")
GRAPH_FROM_CACHE = re.compile(
    r"Directly load the compiled graph\(s\) for compile range \([^)]*\) from the cache, took ([\d.]+) s"
)
TORCH_COMPILE = re.compile(r"torch\.compile took ([\d.]+) s in total")
CUDA_GRAPHS = re.compile(r"Graph capturing finished in ([\d.]+) secs?, took ([\d.]+) GiB")
ENGINE_START = re.compile(r"Initializing a V1 LLM engine")
# "INFO 12-02 07:24:56 [file.py:1]": month-day and a whole second (vLLM's default log format)
LOAD_FORMAT_ARG = re.compile(r"non-default args: .*'load_format': '([^']+)'")
LOG_TIME = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) \[")

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
    load_format: str | None = None  # --load-format as vLLM echoed it ("non-default args"); None: auto
    weights_load_s: float | None = None
    dynamo_transform_s: float | None = None
    graph_compile_s: float | None = None  # Inductor compiled the graph(s) (an empty compile cache)
    graph_from_cache_s: float | None = None  # the graph(s) came from VLLM_CACHE_ROOT (a warm compile cache)
    torch_compile_s: float | None = None
    cuda_graph_capture_s: float | None = None
    cuda_graph_gib: float | None = None
    log_to_engine_start_s: float | None = None  # first log line -> "Initializing a V1 LLM engine" (1 s resolution)
    log_to_server_start_s: float | None = None  # first log line -> "Starting vLLM server on"
    server_starts: int = 0
    oom_lines: list[str] = field(default_factory=list)
    fatal_lines: list[str] = field(default_factory=list)
    layer_rewrite_lines: list[str] = field(default_factory=list)
    last_exception_line: str | None = None


def parse_server_log(text: str) -> LogFacts:
    """Extract what the smoke verdict and report need from a vLLM server log."""
    facts = LogFacts()
    clock: dict[str, int] = {}
    for line in text.splitlines():
        if m := KV_TOKENS.search(line):
            facts.kv_cache_tokens = int(m.group(1).replace(",", ""))
        if m := KV_CONCURRENCY.search(line):
            facts.max_concurrency_tokens_per_request = int(m.group(1).replace(",", ""))
            facts.max_concurrency = float(m.group(2))
        if m := KV_AVAILABLE.search(line):
            facts.available_kv_cache_gib = float(m.group(1))
        if m := MODEL_LOAD.search(line):
            facts.model_load_gib = float(m.group(1))
            facts.model_load_s = float(m.group(2))
        if m := MEMORY_USAGE.search(line):
            facts.weights_gib, facts.peak_activation_gib, facts.non_torch_gib = (float(m.group(i)) for i in (1, 2, 3))
        if m := INIT_ENGINE.search(line):
            facts.init_engine_s = float(m.group(1))
        _cold_start_line(facts, line, clock)
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


def _seconds(m: re.Match) -> int:
    """A log timestamp as seconds since the start of its year's month 1 (31-day months: differences within a
    boot, which never spans a month, are exact)."""
    mo, d, h, mi, sec = (int(g) for g in m.groups())
    return ((mo * 31 + d) * 24 + h) * 3600 + mi * 60 + sec


def _cold_start_line(facts: LogFacts, line: str, clock: dict[str, int]) -> None:
    """The cold-start phases of one log line (first occurrence wins for timings of the first boot)."""
    if (t := LOG_TIME.search(line)) and "first" not in clock:
        clock["first"] = _seconds(t)
    for attr, pat in (
        ("weights_load_s", WEIGHTS_LOAD),
        ("dynamo_transform_s", DYNAMO_TRANSFORM),
        ("graph_compile_s", GRAPH_COMPILE),
        ("graph_from_cache_s", GRAPH_FROM_CACHE),
        ("torch_compile_s", TORCH_COMPILE),
    ):
        if getattr(facts, attr) is None and (m := pat.search(line)):
            setattr(facts, attr, float(m.group(1)))
    if facts.load_format is None and (m := LOAD_FORMAT_ARG.search(line)):
        facts.load_format = m.group(1)
    if facts.cuda_graph_capture_s is None and (m := CUDA_GRAPHS.search(line)):
        facts.cuda_graph_capture_s, facts.cuda_graph_gib = float(m.group(1)), float(m.group(2))
    if t and "first" in clock:
        if facts.log_to_engine_start_s is None and ENGINE_START.search(line):
            facts.log_to_engine_start_s = float(_seconds(t) - clock["first"])
        if facts.log_to_server_start_s is None and SERVER_START.search(line):
            facts.log_to_server_start_s = float(_seconds(t) - clock["first"])


def cold_start_phases(
    facts: LogFacts, boot: dict[str, Any] | None = None, load_format: str | None = None
) -> dict[str, Any]:
    """The cold-start phases of one boot, named once for the smoke report and ``--json``: what vLLM logged
    (weights load time and GiB/s, torch.compile, CUDA-graph capture, engine init) and what the probe timed
    (``/health`` and the first token, seconds from the server's start).  Missing ones are None."""
    boot = boot or {}
    gib, load_s = facts.model_load_gib, facts.model_load_s
    rate = round(gib / load_s, 3) if gib and load_s else None
    weights_rate = round(gib / facts.weights_load_s, 3) if gib and facts.weights_load_s else None
    if facts.graph_compile_s is not None:
        compile_cache = "miss"
    elif facts.graph_from_cache_s is not None:
        compile_cache = "hit"
    else:
        compile_cache = None  # eager, or a log without the lines
    return {
        "load_format": load_format or facts.load_format or "auto",
        "weights_gib": gib,
        "model_load_s": load_s,  # "Model loading took X GiB and Y seconds"
        "model_load_gib_per_s": rate,
        "weights_load_s": facts.weights_load_s,  # "Loading weights took Y seconds" (default loader only)
        "weights_load_gib_per_s": weights_rate,
        "dynamo_transform_s": facts.dynamo_transform_s,
        "graph_compile_s": facts.graph_compile_s,
        "graph_from_cache_s": facts.graph_from_cache_s,
        "compile_cache": compile_cache,
        "torch_compile_s": facts.torch_compile_s,
        "cuda_graph_capture_s": facts.cuda_graph_capture_s,
        "cuda_graph_gib": facts.cuda_graph_gib,
        "init_engine_s": facts.init_engine_s,  # profile + KV cache + compile + CUDA graphs + warmup
        "log_to_engine_start_s": facts.log_to_engine_start_s,
        "log_to_server_start_s": facts.log_to_server_start_s,
        "health_s": boot.get("health_s"),
        "first_token_s": boot.get("first_token_s"),
    }


COLD_START_LABELS = (  # (key, label) in the order the text report shows them
    ("model_load_s", "weights load"),
    ("torch_compile_s", "torch.compile"),
    ("cuda_graph_capture_s", "CUDA-graph capture"),
    ("init_engine_s", "engine init"),
    ("health_s", "/health"),
    ("first_token_s", "first token"),
)


def render_cold_start(cs: dict[str, Any]) -> str:
    """One line: ``cold start (load format auto): weights load 17.4 s (20.31 GiB, 1.17 GiB/s), ...``."""
    parts = []
    for key, label in COLD_START_LABELS:
        v = cs.get(key)
        if v is None:
            continue
        extra = ""
        if key == "model_load_s" and cs.get("weights_gib"):
            rate = cs.get("model_load_gib_per_s")
            extra = f" ({cs['weights_gib']:g} GiB" + (f", {rate:.2f} GiB/s)" if rate else ")")
        elif key == "torch_compile_s" and cs.get("compile_cache"):
            extra = f" (compile cache {cs['compile_cache']})"
        parts.append(f"{label} {v:.1f} s{extra}")
    return f"cold start (load format {cs.get('load_format') or 'auto'}): " + (", ".join(parts) or "no phases logged")


def parse_vllm_kv_log(text: str) -> dict[str, Any]:
    """The KV lines vLLM 0.26.0 logs at boot (first occurrence of each); missing ones are None."""
    out: dict[str, Any] = {
        "available_kv_bytes": None,
        "kv_tokens": None,
        "max_model_len": None,
        "max_concurrency": None,
    }
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
