"""GPU smoke test: boot the engine with production flags, generate at target
concurrency, and give a verdict.

A passing ``/health`` is not a verdict (seed 003: the first configuration
booted, answered a few requests, then ran out of GPU memory under 16
concurrent requests).  The probe here:

1. plans the configuration with :mod:`builder.plan` when it can (zero GPU time
   for an impossible configuration; ``plan=False`` skips it);
2. starts ``vllm serve`` — locally as a subprocess in its own process group, or
   through ``docker run --gpus all --ipc=host --pull=never IMAGE`` — with its
   output in a log file;
3. waits for ``/health`` (bounded), measures the first streamed token;
4. runs ``rounds`` rounds of ``concurrency`` simultaneous ``/v1/completions``
   requests, streaming and non-streaming alternately;
5. FAILs on any non-200, any error inside a stream or a stream that ends
   without ``[DONE]``, a server exit or restart, an out-of-memory message in
   the server log, or a timeout; the server is always stopped by PID (its
   process group), also on Ctrl-C.

Layout: pure functions (log parsing, percentiles, verdict, rendering, command
building) first; then thin adapters (server process, HTTP, nvidia-smi); then
:func:`run_smoke`, which wires them.  Only the standard library is used, so the
probe runs unchanged on a bare GPU host's Python 3.12 next to vLLM.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import plan as _plan_mod
from .errors import BadInput

PASS = "PASS"
FAIL = "FAIL"
PROBE_TOKENS = 8  # the greedy warm-up request: first-token time + an output fingerprint

# --------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------


@dataclass
class SmokeConfig:
    model: str                          # host path of the checkpoint directory
    image: str | None = None            # docker mode when set, else local mode
    tp: int = 1
    pp: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    kv_cache_dtype: str | None = None
    cpu_offload_gb: float | None = None  # vLLM --cpu-offload-gb (GiB per GPU)
    concurrency: int = 16
    rounds: int = 3
    max_tokens: int = 64
    prompt_tokens: int = 128
    timeout: float = 300.0              # per request (and per round) seconds
    boot_timeout: float = 900.0         # until /health answers 200
    extra_args: list[str] = field(default_factory=list)
    server_cmd: str | None = None       # full override ({port} {model} substituted); used by tests
    vllm_bin: str | None = None         # local mode: the vllm executable (default: PATH, else python -m)
    port: int | None = None             # default: a free port
    log_file: str | None = None         # default: a temp file, kept on failure
    plan: bool = True
    gpu_memory_bytes: int | None = None  # default: nvidia-smi
    gpus: int | None = None              # default: tp
    docker_bin: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    stop_grace: float = 15.0            # SIGTERM -> SIGKILL delay when stopping the server
    docker_gpus: str | None = "all"     # docker mode: --gpus value (None: no --gpus, for CPU tests)

    def validate(self) -> None:
        where = "smoke"
        if not self.model:
            raise BadInput(f"{where}: --model is required (the checkpoint directory to serve)")
        p = Path(self.model)
        if not p.exists():
            raise BadInput(f"{where}: --model {self.model}: no such file or directory")
        if self.image is None and self.server_cmd is None and not p.is_dir():
            raise BadInput(f"{where}: --model {self.model}: not a directory")
        for name, value, lo in (
            ("--tp", self.tp, 1),
            ("--pp", self.pp, 1),
            ("--concurrency", self.concurrency, 1),
            ("--rounds", self.rounds, 1),
            ("--max-tokens", self.max_tokens, 1),
            ("--prompt-tokens", self.prompt_tokens, 1),
        ):
            if not isinstance(value, int) or value < lo:
                raise BadInput(f"{where}: {name} must be an integer >= {lo}, got {value!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise BadInput(f"{where}: --max-model-len must be >= 2, got {self.max_model_len}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise BadInput(f"{where}: --max-num-seqs must be >= 1, got {self.max_num_seqs}")
        if self.gpu_memory_utilization is not None and not (0.0 < self.gpu_memory_utilization <= 1.0):
            raise BadInput(
                f"{where}: --gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        for name, value in (("--timeout", self.timeout), ("--boot-timeout", self.boot_timeout)):
            # nan/inf would make the deadlines never expire: the probe must stay bounded
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise BadInput(f"{where}: {name} must be a positive number of seconds, got {value!r}")
        if self.cpu_offload_gb is not None and not (math.isfinite(self.cpu_offload_gb) and self.cpu_offload_gb >= 0):
            raise BadInput(f"{where}: --cpu-offload-gb must be a finite number >= 0, got {self.cpu_offload_gb!r}")
        if self.max_model_len is not None and self.prompt_tokens + self.max_tokens > self.max_model_len:
            raise BadInput(
                f"{where}: --prompt-tokens ({self.prompt_tokens}) + --max-tokens ({self.max_tokens}) "
                f"exceeds --max-model-len ({self.max_model_len}); the requests could never be served"
            )


def config_from_serving(serving: Any, *, model: str, image: str | None = None, **overrides: Any) -> SmokeConfig:
    """A SmokeConfig from a spec's ``[serving]`` table (:class:`builder.spec.Serving`),
    for the pipeline's last stage: ``run_smoke(config_from_serving(spec.serving, model=..., image=ref))``."""
    gpu_mem = None
    if getattr(serving, "gpu_memory", None):
        try:
            from .plan import parse_size

            gpu_mem = parse_size(serving.gpu_memory, what="serving.gpu_memory")
        except ImportError:
            gpu_mem = None
    kv = getattr(serving, "kv_cache_dtype", None)
    cfg = SmokeConfig(
        model=model,
        image=image,
        tp=getattr(serving, "tp", 1) or 1,
        pp=getattr(serving, "pp", 1) or 1,
        cpu_offload_gb=getattr(serving, "cpu_offload_gb", None) or None,
        max_model_len=getattr(serving, "max_model_len", None),
        gpu_memory_utilization=getattr(serving, "gpu_memory_utilization", None),
        max_num_seqs=getattr(serving, "max_num_seqs", None),
        kv_cache_dtype=None if kv in (None, "auto") else kv,
        gpu_memory_bytes=gpu_mem,
        gpus=getattr(serving, "gpus", None),
    )
    for k, v in overrides.items():
        if not hasattr(cfg, k):
            raise TypeError(f"SmokeConfig has no field {k!r}")
        setattr(cfg, k, v)
    return cfg


# --------------------------------------------------------------------------
# Pure: server log parsing (real vLLM 0.26.0 lines)
# --------------------------------------------------------------------------

# The KV-cache log lines are defined once, in builder.plan (its ground-truth check reads them too).
_RE_KV_TOKENS, _RE_MAX_CONC, _RE_KV_MEM = _plan_mod._LOG_TOKENS, _plan_mod._LOG_CONC, _plan_mod._LOG_AVAILABLE
_RE_MODEL_LOAD = re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds")
_RE_USAGE = re.compile(
    r"Actual usage is ([\d.]+) GiB for weight, ([\d.]+) GiB for peak activation, ([\d.]+) GiB for non-torch memory"
)
_RE_INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
_RE_SERVER_START = re.compile(r"Starting vLLM (?:API )?server on")  # once per boot

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
_RE_ANY_EXC = re.compile(r"\b[A-Z]\w*(?:Error|Exception): ")

# The layer-type override patch logs one warning naming the rewritten layers.
_RE_LAYER_TYPES = re.compile(r"layer[_ ]types?", re.IGNORECASE)
_RE_REWRITE = re.compile(r"rewr|overrid|->|\u2192", re.IGNORECASE)


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
    """Extract what the verdict and the report need from a vLLM server log."""
    facts = LogFacts()
    for line in text.splitlines():
        if (m := _RE_KV_TOKENS.search(line)):
            facts.kv_cache_tokens = int(m.group(1).replace(",", ""))
        if (m := _RE_MAX_CONC.search(line)):
            facts.max_concurrency_tokens_per_request = int(m.group(1).replace(",", ""))
            facts.max_concurrency = float(m.group(2))
        if (m := _RE_KV_MEM.search(line)):
            facts.available_kv_cache_gib = float(m.group(1))
        if (m := _RE_MODEL_LOAD.search(line)):
            facts.model_load_gib = float(m.group(1))
            facts.model_load_s = float(m.group(2))
        if (m := _RE_USAGE.search(line)):
            facts.weights_gib, facts.peak_activation_gib, facts.non_torch_gib = (float(m.group(i)) for i in (1, 2, 3))
        if (m := _RE_INIT_ENGINE.search(line)):
            facts.init_engine_s = float(m.group(1))
        if _RE_SERVER_START.search(line):
            facts.server_starts += 1
        stripped = line.strip()
        if any(p.search(line) for p in OOM_PATTERNS):
            if stripped not in facts.oom_lines:
                facts.oom_lines.append(stripped)
        elif any(p.search(line) for p in FATAL_PATTERNS):
            if stripped not in facts.fatal_lines:
                facts.fatal_lines.append(stripped)
        elif _RE_ANY_EXC.search(line):
            facts.last_exception_line = stripped
        if _RE_LAYER_TYPES.search(line) and _RE_REWRITE.search(line) and "Error" not in line:
            if stripped not in facts.layer_rewrite_lines:
                facts.layer_rewrite_lines.append(stripped)
    return facts


# --------------------------------------------------------------------------
# Pure: statistics, verdict, report
# --------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * (q / 100.0)
    lo = math.floor(k)
    hi = math.ceil(k)
    if lo == hi:
        return xs[int(k)]
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass
class RequestResult:
    index: int
    stream: bool
    ok: bool
    status: int | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    output_tokens: int = 0
    error: str | None = None
    text: str = ""


@dataclass
class RoundResult:
    round: int
    requests: int
    ok: int
    failed: int
    wall_s: float
    latency_p50_s: float | None
    latency_p95_s: float | None
    ttft_p50_s: float | None
    output_tokens: int
    output_tokens_per_s: float | None
    errors: list[str]


def summarize_round(n: int, results: list[RequestResult], wall_s: float, expected: int) -> RoundResult:
    lat = [r.latency_s for r in results if r.ok and r.latency_s is not None]
    ttft = [r.ttft_s for r in results if r.ok and r.ttft_s is not None]
    tokens = sum(r.output_tokens for r in results if r.ok)
    errors = [f"request {r.index} ({'stream' if r.stream else 'plain'}): {r.error}" for r in results if not r.ok]
    missing = expected - len(results)
    if missing > 0:
        errors.append(f"{missing} request(s) did not finish")
    ok = sum(1 for r in results if r.ok)
    return RoundResult(
        round=n,
        requests=expected,
        ok=ok,
        failed=expected - ok,
        wall_s=round(wall_s, 3),
        latency_p50_s=_r(percentile(lat, 50)),
        latency_p95_s=_r(percentile(lat, 95)),
        ttft_p50_s=_r(percentile(ttft, 50)),
        output_tokens=tokens,
        output_tokens_per_s=_r(tokens / wall_s) if wall_s > 0 and tokens else None,
        errors=errors,
    )


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


@dataclass
class SmokeReport:
    verdict: str
    failures: list[str]
    mode: str
    model: str
    image: str | None
    command: list[str]
    settings: dict[str, Any]
    boot: dict[str, float | None]
    kv_cache: dict[str, Any]
    rounds: list[RoundResult]
    throughput: dict[str, float | None]
    gpu: dict[str, Any] | None
    plan: dict[str, Any] | None
    server_exit_code: int | None
    log_file: str | None
    log_tail: list[str]
    layer_rewrites: list[str]
    probe: dict[str, Any] | None = None
    refused_by_plan: bool = False
    interrupted: bool = False

    @property
    def passed(self) -> bool:
        return self.verdict == PASS

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 0 if self.passed else 1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema"] = "build-image/smoke-report/v1"
        return d


SMOKE_REPORT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": [
        "schema", "verdict", "failures", "mode", "model", "settings", "boot", "kv_cache",
        "rounds", "throughput", "gpu", "plan", "server_exit_code", "log_tail",
    ],
    "properties": {
        "schema": {"const": "build-image/smoke-report/v1"},
        "verdict": {"enum": [PASS, FAIL]},
        "failures": {"type": "array", "items": {"type": "string"}},
        "mode": {"enum": ["local", "docker", "command"]},
        "model": {"type": "string"},
        "image": {"type": ["string", "null"]},
        "command": {"type": "array", "items": {"type": "string"}},
        "settings": {"type": "object"},
        "boot": {
            "type": "object",
            "required": ["health_s", "first_token_s"],
            "properties": {
                "health_s": {"type": ["number", "null"]},
                "first_token_s": {"type": ["number", "null"]},
            },
        },
        "kv_cache": {
            "type": "object",
            "required": ["tokens", "max_concurrency"],
            "properties": {
                "tokens": {"type": ["integer", "null"]},
                "max_concurrency": {"type": ["number", "null"]},
                "tokens_per_request": {"type": ["integer", "null"]},
                "available_gib": {"type": ["number", "null"]},
            },
        },
        "rounds": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["round", "requests", "ok", "failed", "latency_p50_s", "latency_p95_s",
                             "output_tokens", "output_tokens_per_s", "errors"],
            },
        },
        "throughput": {"type": "object", "required": ["output_tokens_per_s"]},
        "gpu": {"type": ["object", "null"]},
        "plan": {"type": ["object", "null"]},
        "server_exit_code": {"type": ["integer", "null"]},
        "log_tail": {"type": "array", "items": {"type": "string"}},
        "interrupted": {"type": "boolean"},
        "probe": {"type": ["object", "null"]},
        "refused_by_plan": {"type": "boolean"},
    },
}


def decide(
    *,
    rounds: list[RoundResult],
    expected_rounds: int,
    facts: LogFacts,
    server_exit_code: int | None,
    server_exited: bool,
    boot_error: str | None,
    extra_failures: list[str] | None = None,
    starts_after_boot: int | None = None,
) -> tuple[str, list[str]]:
    """The verdict: PASS only if every request of every round succeeded, the
    server is still the same running process, and its log holds no OOM."""
    # Root causes first (the CLI's one-line message is failures[0]); "only N of M
    # rounds ran" is a consequence and goes last.
    failures: list[str] = []
    if boot_error:
        failures.append(boot_error)
    if facts.oom_lines:
        failures.append(f"out-of-memory in server log: {facts.oom_lines[0][:300]}")
    if server_exited:
        if not (boot_error and "exited" in boot_error):  # already said
            failures.append(f"server process exited (code {server_exit_code})")
        root = first_error_line(facts) or facts.last_exception_line
        if root and not facts.oom_lines:
            failures.append(f"server log: {root[:300]}")
    # A restart is a "Starting vLLM server on" after /health first answered (``starts_after_boot``,
    # from run_smoke).  Counting all starts in the log would call data parallelism a restart:
    # vLLM 0.26.0 defaults --api-server-count to the DP size, and every API server logs the line.
    if starts_after_boot is not None:
        if starts_after_boot > 0:
            failures.append(f"server restarted ({starts_after_boot} start(s) logged after /health first answered)")
    elif facts.server_starts > 1:
        failures.append(f"server restarted ({facts.server_starts} starts in its log)")
    failures.extend(extra_failures or [])
    for r in rounds:
        if r.failed:
            first = r.errors[0] if r.errors else "unknown error"
            failures.append(f"round {r.round}: {r.failed}/{r.requests} requests failed (first: {first})")
    if not boot_error and len(rounds) < expected_rounds:
        failures.append(f"only {len(rounds)} of {expected_rounds} rounds ran")
    return (FAIL if failures else PASS), failures


_RE_EXC = re.compile(r"\b\w*(?:Error|Exception): ")


def first_error_line(facts: LogFacts) -> str | None:
    """The root cause among the fatal lines: the first ``XxxError: ...`` that
    is not vLLM's generic "Engine core initialization failed" wrapper."""
    for line in facts.fatal_lines:
        if _RE_EXC.search(line) and "Engine core initialization failed" not in line:
            return re.sub(r"^\(\w+ pid=\d+\)\s*", "", line).strip()
    return facts.fatal_lines[0] if facts.fatal_lines else None


def render_text(rep: SmokeReport) -> str:
    """Human summary (the --json form is ``rep.to_dict()``)."""
    lines = [f"smoke: {rep.verdict}  ({rep.mode}{' ' + rep.image if rep.image else ''}, model {rep.model})"]
    s = rep.settings
    lines.append(
        "  settings: tp={tp} max_model_len={max_model_len} gpu_memory_utilization={gpu_memory_utilization} "
        "max_num_seqs={max_num_seqs} concurrency={concurrency} rounds={rounds} prompt~{prompt_tokens} "
        "max_tokens={max_tokens}".format(**s)
    )
    b = rep.boot
    lines.append(f"  boot: /health after {_fmt(b.get('health_s'), 's')}, first token after {_fmt(b.get('first_token_s'), 's')}")
    kv = rep.kv_cache
    if kv.get("tokens") is not None:
        lines.append(
            f"  KV cache: {kv['tokens']:,} tokens ({_fmt(kv.get('available_gib'), ' GiB')}); max concurrency "
            f"{_fmt(kv.get('max_concurrency'), 'x')} at {kv.get('tokens_per_request') or '?'} tokens/request"
        )
    else:
        lines.append("  KV cache: (not found in the server log)")
    for r in rep.rounds:
        lines.append(
            f"  round {r.round}: {r.ok}/{r.requests} ok, p50 {_fmt(r.latency_p50_s, 's')}, p95 {_fmt(r.latency_p95_s, 's')}, "
            f"{r.output_tokens} tokens in {r.wall_s:.2f}s ({_fmt(r.output_tokens_per_s, ' tok/s')})"
        )
    if rep.throughput.get("output_tokens_per_s") is not None:
        lines.append(f"  output: {rep.throughput['output_tokens_per_s']} tokens/s over all rounds")
    if rep.gpu:
        lines.append(
            f"  GPU memory used: peak {rep.gpu.get('memory_used_mib_peak')} MiB of {rep.gpu.get('memory_total_mib')} MiB"
        )
    if rep.plan:
        lines.append(f"  plan: {rep.plan.get('summary', json.dumps(rep.plan)[:200])}")
    for line in rep.layer_rewrites[:3]:
        lines.append(f"  layer types: {line[:240]}")
    for f in rep.failures:
        lines.append(f"  FAIL: {f}")
    if rep.verdict == FAIL and rep.log_tail:
        lines.append(f"  server log tail ({rep.log_file}):")
        lines.extend("    | " + ln for ln in rep.log_tail)
    return "\n".join(lines)


def _fmt(v: float | None, unit: str) -> str:
    return "n/a" if v is None else f"{v:g}{unit}"


# --------------------------------------------------------------------------
# Pure: command building and request bodies
# --------------------------------------------------------------------------


def serve_flags(cfg: SmokeConfig, model_arg: str, port: int, host: str) -> list[str]:
    flags = [model_arg, "--host", host, "--port", str(port), "--tensor-parallel-size", str(cfg.tp)]
    if cfg.max_model_len is not None:
        flags += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.gpu_memory_utilization is not None:
        flags += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    if cfg.max_num_seqs is not None:
        flags += ["--max-num-seqs", str(cfg.max_num_seqs)]
    if cfg.pp > 1:
        flags += ["--pipeline-parallel-size", str(cfg.pp)]
    if cfg.cpu_offload_gb:
        flags += ["--cpu-offload-gb", f"{cfg.cpu_offload_gb:g}"]
    if cfg.kv_cache_dtype:
        flags += ["--kv-cache-dtype", vllm_kv_cache_dtype(cfg.kv_cache_dtype)]
    return flags + list(cfg.extra_args)


# The planner (and the spec) accept short names; vLLM 0.26.0's --kv-cache-dtype
# (vllm/config/cache.py CacheDType) only knows "bfloat16" / "float16".
_VLLM_KV_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def vllm_kv_cache_dtype(name: str) -> str:
    return _VLLM_KV_DTYPE.get(name, name)


def build_local_command(cfg: SmokeConfig, port: int, vllm_bin: list[str]) -> list[str]:
    return vllm_bin + ["serve"] + serve_flags(cfg, str(Path(cfg.model).resolve()), port, "127.0.0.1")


def build_docker_command(cfg: SmokeConfig, port: int, name: str, docker_bin: str) -> list[str]:
    model = str(Path(cfg.model).resolve())
    cmd = [docker_bin, "run", "--rm", "--name", name, "--pull=never"]
    if cfg.docker_gpus:
        cmd += ["--gpus", cfg.docker_gpus]
    # host networking: the server binds 127.0.0.1:PORT on the host itself (no bridge needed,
    # nothing exposed beyond loopback)
    cmd += [
        "--ipc=host", "--network=host", "-v", f"{model}:/model:ro",
        "-e", "HF_HUB_OFFLINE=1", "-e", "VLLM_NO_USAGE_STATS=1",
    ]
    for k, v in sorted(cfg.env.items()):
        cmd += ["-e", f"{k}={v}"]
    cmd += ["--entrypoint", "vllm", cfg.image or "", "serve"]
    return cmd + serve_flags(cfg, "/model", port, "127.0.0.1")


def build_override_command(cfg: SmokeConfig, port: int) -> list[str]:
    text = (cfg.server_cmd or "").format(port=port, model=shlex.quote(str(cfg.model)))
    return shlex.split(text)


def make_prompt(index: int, prompt_tokens: int, vocab_size: int | None, seed: int = 0) -> str | list[int]:
    """A prompt of about ``prompt_tokens`` tokens, different per request (no
    prefix-cache shortcut).  Token ids when the vocabulary size is known (exact
    length, needs no tokenizer), else words (~1 token each)."""
    rng = random.Random(seed * 1_000_003 + index)
    if vocab_size and vocab_size > 16:
        lo = min(100, vocab_size // 4)
        return [rng.randrange(lo, vocab_size - 1) for _ in range(prompt_tokens)]
    words = ("alpha", "river", "stone", "cloud", "green", "number", "seven", "house", "light", "table")
    return " ".join(rng.choice(words) for _ in range(prompt_tokens))


def completion_body(model_id: str, prompt: str | list[int], max_tokens: int, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model_id,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,   # vLLM extension: generate exactly max_tokens
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def model_vocab_size(model_dir: str) -> int | None:
    cfg_path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError):
        return None
    for c in (cfg, cfg.get("text_config") or {}):
        v = c.get("vocab_size") if isinstance(c, dict) else None
        if isinstance(v, int) and v > 0:
            return v
    return None


# --------------------------------------------------------------------------
# Adapters: HTTP (stdlib), server process, nvidia-smi
# --------------------------------------------------------------------------


class HttpError(Exception):
    pass


def http_get(host: str, port: int, path: str, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def post_completion(host: str, port: int, body: dict[str, Any], timeout: float, index: int) -> RequestResult:
    """One /v1/completions request; streaming bodies are read as SSE and any
    ``error`` event or a missing ``[DONE]`` is a failure."""
    stream = bool(body.get("stream"))
    t0 = time.monotonic()
    deadline = t0 + timeout
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    res = RequestResult(index=index, stream=stream, ok=False)
    try:
        payload = json.dumps(body).encode()
        conn.request("POST", "/v1/completions", body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        res.status = resp.status
        if resp.status != 200:
            text = resp.read(2000).decode("utf-8", "replace").strip().replace("\n", " ")
            res.error = f"HTTP {resp.status}: {text[:300]}"
            return res
        if not stream:
            data = json.loads(resp.read())
            if "error" in data and data["error"]:
                res.error = f"error object in response: {str(data['error'])[:300]}"
                return res
            usage = data.get("usage") or {}
            res.output_tokens = int(usage.get("completion_tokens") or 0)
            if not data.get("choices"):
                res.error = "response has no choices"
                return res
            res.text = str(data["choices"][0].get("text") or "")
            res.latency_s = time.monotonic() - t0
            res.ok = True
            return res
        done = False
        chunks = 0
        parts: list[str] = []
        usage_tokens = None
        while True:
            if time.monotonic() > deadline:
                res.error = f"timeout after {timeout:g}s inside the stream"
                return res
            raw = resp.readline()
            if not raw:
                break
            line = raw.decode("utf-8", "replace").strip()
            if not line or line.startswith(":"):
                continue
            if line.startswith("event:") and "error" in line:
                res.error = f"error event in stream: {line[:200]}"
                return res
            if not line.startswith("data:"):
                continue
            data_s = line[5:].strip()
            if data_s == "[DONE]":
                done = True
                break
            try:
                data = json.loads(data_s)
            except ValueError:
                res.error = f"malformed stream event: {data_s[:200]}"
                return res
            if isinstance(data, dict) and data.get("error"):
                res.error = f"error event in stream: {str(data['error'])[:300]}"
                return res
            if data.get("choices"):
                if res.ttft_s is None:
                    res.ttft_s = time.monotonic() - t0
                chunks += 1
                parts.append(str(data["choices"][0].get("text") or ""))
            if data.get("usage"):
                usage_tokens = data["usage"].get("completion_tokens")
        if not done:
            res.error = f"stream ended without [DONE] after {chunks} chunks (dropped)"
            return res
        res.output_tokens = int(usage_tokens if usage_tokens is not None else chunks)
        res.text = "".join(parts)
        res.latency_s = time.monotonic() - t0
        res.ok = True
        return res
    except (OSError, http.client.HTTPException, ValueError) as exc:
        kind = "timeout" if isinstance(exc, (socket.timeout, TimeoutError)) else type(exc).__name__
        res.error = f"{kind}: {exc}"[:300]
        return res
    finally:
        conn.close()


class ServerProcess:
    """A server started in its own process group; stopped by PID (group)."""

    def __init__(self, argv: list[str], log_path: str, env: dict[str, str] | None = None,
                 cleanup: Callable[[], None] | None = None):
        self.argv = argv
        self.log_path = log_path
        self._env = env
        self._cleanup = cleanup
        self.proc: subprocess.Popen | None = None
        self._log_fh = None

    def start(self) -> None:
        self._log_fh = open(self.log_path, "ab", buffering=0)
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=self._log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self._env, start_new_session=True,
            )
        except OSError as exc:
            self._log_fh.close()
            raise BadInput(f"smoke: cannot start the server {self.argv[0]!r}: {exc}") from exc

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 15.0, hurry: threading.Event | None = None) -> int | None:
        """SIGTERM the process group, then SIGKILL after ``grace`` seconds (at
        once when ``hurry`` is set, e.g. by a second Ctrl-C)."""
        if self.proc is None:
            return None
        pgid = self.proc.pid  # start_new_session: the pid is the group id
        try:
            if self.proc.poll() is None:
                _killpg(pgid, signal.SIGTERM)
                until = time.monotonic() + grace
                while (self.proc.poll() is None and time.monotonic() < until
                       and not (hurry is not None and hurry.is_set())):
                    time.sleep(0.05)
            # children (engine core, workers) may outlive the leader: kill the group
            _killpg(pgid, signal.SIGKILL)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            deadline = time.monotonic() + 10
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            if self._cleanup:
                try:
                    self._cleanup()
                except Exception:  # noqa: BLE001 - best effort
                    pass
            if self._log_fh:
                self._log_fh.close()
        return self.proc.returncode


def _defer_signals(hurry: threading.Event) -> Callable[[], None]:
    """While the server is being stopped, SIGINT/SIGTERM set ``hurry`` instead of
    raising (main thread only; elsewhere signals cannot be handled anyway).
    Returns the function that puts the previous handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    saved = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            saved[sig] = signal.signal(sig, lambda signum, frame: hurry.set())
        except (ValueError, OSError):
            pass

    def restore() -> None:
        for sig, handler in saved.items():
            signal.signal(sig, handler)

    return restore


def _group_alive(pgid: int) -> bool:
    """Any non-zombie process left in the process group?"""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _file_size(path: str) -> int | None:
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def read_log(path: str | None) -> str:
    if not path:
        return ""
    try:
        return Path(path).read_text("utf-8", "replace")
    except OSError:
        return ""


def log_tail(text: str, n: int = 40) -> list[str]:
    return [ln.rstrip()[:400] for ln in text.splitlines()[-n:]]


def nvidia_smi_memory() -> dict[str, int] | None:
    """Summed memory.used / memory.total (MiB) over visible GPUs, or None."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    used = total = 0
    n = 0
    for line in out.stdout.strip().splitlines():
        try:
            u, t = (int(float(x)) for x in line.split(","))
        except ValueError:
            continue
        used += u
        total += t
        n += 1
    return {"memory_used_mib": used, "memory_total_mib": total, "gpus": n} if n else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_vllm() -> list[str]:
    exe = shutil.which("vllm")
    if exe:
        return [exe]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def find_docker() -> str:
    for cand in (os.environ.get("BUILD_IMAGE_DOCKER"), "/usr/bin/docker", shutil.which("docker")):
        if cand and os.path.exists(cand):
            return cand
    raise BadInput("smoke: IMAGE given but no docker CLI found (set BUILD_IMAGE_DOCKER or use --local)")


def check_docker_image(docker: str, image: str) -> None:
    """Before `docker run --pull=never`: the engine answers (else EngineUnavailable,
    exit 8) and holds the image (else BadInput, exit 2) -- not a FAIL verdict with
    `docker run`'s exit code 125 in it."""
    from .engine import DockerEngine

    eng = DockerEngine(docker=docker)
    eng.ping()
    if eng.inspect(image) is None:
        raise BadInput(
            f"smoke: image {image} is not in the local engine (the smoke test runs it with --pull=never); "
            "build it, or pull it first"
        )


# --------------------------------------------------------------------------
# Preflight plan (builder.plan), zero GPU time
# --------------------------------------------------------------------------


def _extra_value(extra: list[str], flag: str) -> str | None:
    """The value of ``flag`` among the extra `vllm serve` arguments (``--flag V`` or ``--flag=V``)."""
    for i, a in enumerate(extra):
        if a == flag and i + 1 < len(extra):
            return extra[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def preflight_plan(cfg: SmokeConfig, warn: Callable[[str], None]) -> dict[str, Any] | None:
    """Plan the serving settings before booting (:func:`builder.plan.make_plan`).

    Returns the plan as a dict (``fits``, ``summary`` and the planner's fields),
    or None when it cannot be planned (no config.json, no GPU memory figure).
    """
    model_dir = Path(cfg.model)
    if not (model_dir / "config.json").is_file():
        warn("plan skipped: no config.json in the model directory")
        return None
    gpu_mem = cfg.gpu_memory_bytes
    if gpu_mem is None:
        smi = nvidia_smi_memory()
        if smi and smi["gpus"]:
            gpu_mem = smi["memory_total_mib"] // smi["gpus"] * (1 << 20)
    if gpu_mem is None:
        warn("plan skipped: GPU memory unknown (no nvidia-smi; pass --gpu-memory)")
        return None
    try:
        from . import plan as planmod  # type: ignore[attr-defined]
    except ImportError:
        warn("plan skipped: builder.plan is not available")
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
    if cfg.kv_cache_dtype and cfg.kv_cache_dtype not in planmod.KV_CACHE_DTYPES:
        # vLLM knows more KV dtypes (fp8_inc, fp8_ds_mla, turboquant_*, ...) than the planner models
        warn(f"plan skipped: the planner does not model --kv-cache-dtype {cfg.kv_cache_dtype}")
        return None
    fixed = [a for a in extra if a.split("=", 1)[0].startswith(("--kv-cache-memory", "--num-gpu-blocks-override"))]
    if fixed:
        warn(f"plan skipped: {fixed[0].split('=', 1)[0]} fixes the KV cache size; the plan models gpu_memory_utilization")
        return None
    try:
        config, _ = planmod.load_config(model_dir)
        weights = planmod.checkpoint_bytes(model_dir)
        if weights is None:
            warn("plan skipped: no safetensors files to size the weights")
            return None
        plan = planmod.make_plan(
            config,
            weights_bytes=int(weights),
            gpus=cfg.gpus or cfg.tp * cfg.pp,
            gpu_memory_bytes=int(gpu_mem),
            tp=cfg.tp,
            pp=cfg.pp,
            cpu_offload_gb=cfg.cpu_offload_gb or 0,
            # unset: vLLM's own default, which is what `vllm serve` will use
            gpu_memory_utilization=(cfg.gpu_memory_utilization if cfg.gpu_memory_utilization is not None
                                    else planmod.VLLM_DEFAULT_GPU_MEMORY_UTILIZATION),
            max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            kv_cache_dtype=cfg.kv_cache_dtype or "auto",
            where=str(model_dir / "config.json"),
            **kwargs,
        )
    except BadInput:
        raise
    except Exception as exc:  # noqa: BLE001 - the planner is advisory for the probe
        warn(f"plan skipped: {type(exc).__name__}: {exc}")
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


# --------------------------------------------------------------------------
# The probe
# --------------------------------------------------------------------------


class _Interrupted(Exception):
    pass


def run_smoke(
    cfg: SmokeConfig,
    *,
    progress: Callable[[str], None] | None = None,
) -> SmokeReport:
    """Boot, probe, stop; return the report.  Never raises for a FAIL verdict: a
    configuration the plan refuses is a FAIL report with ``refused_by_plan``
    (nothing booted).  Raises BadInput for bad input (flags, config.json)."""
    say = progress or (lambda msg: None)
    cfg.validate()
    if cfg.image and cfg.server_cmd:
        raise BadInput("smoke: give either IMAGE or --server-cmd, not both")

    # The plan is computed whenever it can be (it is the prediction the report
    # sets beside vLLM's own numbers); it refuses only without --no-plan.
    try:
        plan_dict = preflight_plan(cfg, say)
    except BadInput as exc:
        if cfg.plan:
            raise
        say(f"plan skipped (--no-plan): {exc.message}")
        plan_dict = None
    refused = cfg.plan and plan_dict is not None and plan_dict.get("fits") is False
    port = cfg.port or free_port()
    host = "127.0.0.1"
    cleanup = None
    env = dict(os.environ)
    env.update(cfg.env)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if cfg.server_cmd:
        mode = "command"
        argv = build_override_command(cfg, port)
    elif cfg.image:
        mode = "docker"
        docker = cfg.docker_bin or find_docker()
        name = f"build-image-smoke-{uuid.uuid4().hex[:10]}"
        argv = build_docker_command(cfg, port, name, docker)

        def cleanup() -> None:  # the container outlives a killed CLI
            subprocess.run([docker, "rm", "-f", name], capture_output=True, timeout=60)
    else:
        mode = "local"
        argv = build_local_command(cfg, port, shlex.split(cfg.vllm_bin) if cfg.vllm_bin else find_vllm())

    settings = {
        "tp": cfg.tp, "pp": cfg.pp, "cpu_offload_gb": cfg.cpu_offload_gb, "max_model_len": cfg.max_model_len, "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "max_num_seqs": cfg.max_num_seqs, "kv_cache_dtype": cfg.kv_cache_dtype, "concurrency": cfg.concurrency,
        "rounds": cfg.rounds, "prompt_tokens": cfg.prompt_tokens, "max_tokens": cfg.max_tokens,
        "timeout_s": cfg.timeout, "boot_timeout_s": cfg.boot_timeout, "extra_args": list(cfg.extra_args),
    }
    if refused:
        say("refused by the memory plan; the server was not started (--no-plan boots anyway)")
        return SmokeReport(
            verdict=FAIL,
            failures=[f"memory plan: {plan_dict['summary']} (no GPU time spent; --no-plan boots anyway)"],
            mode=mode, model=str(cfg.model), image=cfg.image, command=argv, settings=settings,
            boot={"health_s": None, "first_token_s": None},
            kv_cache={"tokens": None, "max_concurrency": None, "tokens_per_request": None, "available_gib": None},
            rounds=[], throughput={"output_tokens_per_s": None}, gpu=None, plan=plan_dict,
            server_exit_code=None, log_file=None, log_tail=[], layer_rewrites=[], refused_by_plan=True,
        )
    if mode == "docker":
        check_docker_image(docker, cfg.image or "")
    # the log is created only now: bad input and a plan refusal leave no file behind
    # (and do not truncate a --log-file the user pointed at)
    own_log = cfg.log_file is None
    if cfg.log_file:
        log_path = cfg.log_file
    else:
        fd, log_path = tempfile.mkstemp(prefix="smoke-server-", suffix=".log")
        os.close(fd)
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    Path(log_path).write_bytes(b"")
    server = ServerProcess(argv, log_path, env=env, cleanup=cleanup)
    rounds: list[RoundResult] = []
    boot = {"health_s": None, "first_token_s": None}
    boot_log_bytes: int | None = None   # size of the server log when /health first answered
    boot_error: str | None = None
    probe: dict[str, Any] | None = None
    extra_failures: list[str] = []
    gpu_peak: dict[str, Any] | None = None
    exit_code: int | None = None
    exited = False
    interrupted = False

    def sample_gpu() -> None:
        nonlocal gpu_peak
        m = nvidia_smi_memory()
        if m is None:
            return
        if gpu_peak is None:
            gpu_peak = {"memory_used_mib_peak": m["memory_used_mib"], "memory_total_mib": m["memory_total_mib"],
                        "gpus": m["gpus"]}
        else:
            gpu_peak["memory_used_mib_peak"] = max(gpu_peak["memory_used_mib_peak"], m["memory_used_mib"])

    def on_term(signum, frame):  # SIGTERM -> same path as Ctrl-C
        raise KeyboardInterrupt

    old_term = None
    if threading.current_thread() is threading.main_thread():
        old_term = signal.signal(signal.SIGTERM, on_term)
    t_start = time.monotonic()
    say(f"starting server ({mode}): {' '.join(shlex.quote(a) for a in argv)}")
    say(f"server log: {log_path}")
    try:
        try:
            server.start()
        except BadInput:
            if own_log:
                Path(log_path).unlink(missing_ok=True)
            raise
        # ---- boot: wait for /health
        deadline = t_start + cfg.boot_timeout
        while True:
            if not server.alive():
                boot_error = f"server exited during boot (code {server.poll()}) before /health answered"
                break
            if time.monotonic() > deadline:
                boot_error = f"timeout: /health did not answer 200 within {cfg.boot_timeout:g}s"
                break
            try:
                status, _ = http_get(host, port, "/health", timeout=5)
                if status == 200:
                    boot["health_s"] = round(time.monotonic() - t_start, 2)
                    boot_log_bytes = _file_size(log_path)
                    break
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.5)
        model_id = None
        if boot_error is None:
            say(f"/health OK after {boot['health_s']}s")
            sample_gpu()
            try:
                status, raw = http_get(host, port, "/v1/models", timeout=30)
                if status == 200:
                    data = json.loads(raw).get("data") or []
                    model_id = data[0]["id"] if data else None
                if model_id is None:
                    boot_error = f"/v1/models answered {status} with no model"
            except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as exc:
                boot_error = f"/v1/models failed: {exc}"
        vocab = model_vocab_size(cfg.model)
        if boot_error is None:
            # ---- first token (a warm-up streamed request)
            probe_prompt = make_prompt(-1, min(cfg.prompt_tokens, 16), vocab)
            body = completion_body(model_id, probe_prompt, PROBE_TOKENS, True)
            body["ignore_eos"] = False
            r = post_completion(host, port, body, cfg.timeout, -1)
            probe = {"prompt": probe_prompt, "text": r.text, "max_tokens": PROBE_TOKENS}
            if r.ok and r.ttft_s is not None:
                boot["first_token_s"] = round(time.monotonic() - t_start - (r.latency_s - r.ttft_s), 2)
                say(f"first token after {boot['first_token_s']}s")
            else:
                boot_error = f"first request failed: {r.error}"
        if boot_error is None:
            for n in range(1, cfg.rounds + 1):
                say(f"round {n}/{cfg.rounds}: {cfg.concurrency} concurrent requests")
                rr = _run_round(cfg, server, host, port, model_id, vocab, n)
                rounds.append(rr)
                sample_gpu()
                say(
                    f"round {n}: {rr.ok}/{rr.requests} ok, p50 {_fmt(rr.latency_p50_s, 's')} "
                    f"p95 {_fmt(rr.latency_p95_s, 's')}, {_fmt(rr.output_tokens_per_s, ' tok/s')}"
                )
                if rr.failed or not server.alive():
                    break
                if parse_server_log(read_log(log_path)).oom_lines:
                    break
                try:
                    status, _ = http_get(host, port, "/health", timeout=10)
                    if status != 200:
                        extra_failures.append(f"/health answered {status} after round {n}")
                        break
                except (OSError, http.client.HTTPException) as exc:
                    extra_failures.append(f"/health failed after round {n}: {exc}")
                    break
    except KeyboardInterrupt:
        interrupted = True
        extra_failures.append("interrupted (Ctrl-C / SIGTERM); server stopped")
    finally:
        # A second Ctrl-C / SIGTERM while stopping must not abandon the server:
        # it only cuts the SIGTERM grace period short (SIGKILL at once).
        hurry = threading.Event()
        restore_signals = _defer_signals(hurry)
        try:
            lost = any(("Connection" in e or "Disconnected" in e) for r in rounds for e in r.errors)
            if server.alive() and (boot_error or lost):
                # a dying server resets its connections a moment before it can be reaped
                try:
                    server.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
            exited = not server.alive() and server.proc is not None
            exit_code = server.poll() if exited else None
            say("stopping server")
            server.stop(grace=cfg.stop_grace, hurry=hurry)
        finally:
            restore_signals()
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
        if hurry.is_set() and not interrupted:
            interrupted = True
            extra_failures.append("interrupted (Ctrl-C / SIGTERM) while stopping the server; server stopped")

    text = read_log(log_path)
    facts = parse_server_log(text)
    starts_after_boot = None
    if boot_log_bytes is not None:
        try:
            later = Path(log_path).read_bytes()[boot_log_bytes:].decode("utf-8", "replace")
        except OSError:
            later = ""
        starts_after_boot = len(_RE_SERVER_START.findall(later))
    verdict, failures = decide(
        rounds=rounds, expected_rounds=cfg.rounds, facts=facts, server_exit_code=exit_code,
        server_exited=exited, boot_error=boot_error, extra_failures=extra_failures,
        starts_after_boot=starts_after_boot,
    )
    total_tokens = sum(r.output_tokens for r in rounds)
    total_wall = sum(r.wall_s for r in rounds)
    rep = SmokeReport(
        verdict=verdict,
        failures=failures,
        mode=mode,
        model=str(cfg.model),
        image=cfg.image,
        command=argv,
        settings=settings,
        boot=boot,
        kv_cache={
            "tokens": facts.kv_cache_tokens,
            "max_concurrency": facts.max_concurrency,
            "tokens_per_request": facts.max_concurrency_tokens_per_request,
            "available_gib": facts.available_kv_cache_gib,
            "model_load_gib": facts.model_load_gib,
            "model_load_s": facts.model_load_s,
            "peak_activation_gib": facts.peak_activation_gib,
            "non_torch_gib": facts.non_torch_gib,
            "init_engine_s": facts.init_engine_s,
        },
        rounds=rounds,
        throughput={"output_tokens_per_s": round(total_tokens / total_wall, 1) if total_wall > 0 else None},
        gpu=gpu_peak,
        plan=plan_dict,
        server_exit_code=exit_code,
        log_file=log_path,
        log_tail=log_tail(text) if verdict == FAIL else [],
        layer_rewrites=facts.layer_rewrite_lines,
        probe=probe,
        interrupted=interrupted,
    )
    if own_log and verdict == PASS:
        try:
            os.unlink(log_path)
            rep.log_file = None
        except OSError:
            pass
    return rep


def _run_round(cfg: SmokeConfig, server: ServerProcess, host: str, port: int, model_id: str,
               vocab: int | None, n: int) -> RoundResult:
    """``concurrency`` simultaneous requests (even index: streaming, odd: not);
    abandoned early when the server process dies or the round times out."""
    results: list[RequestResult] = []
    pool = ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="smoke")
    barrier = threading.Barrier(cfg.concurrency)

    def one(i: int) -> RequestResult:
        body = completion_body(model_id, make_prompt(i, cfg.prompt_tokens, vocab, seed=n), cfg.max_tokens, i % 2 == 0)
        try:
            barrier.wait(timeout=30)
        except threading.BrokenBarrierError:
            pass
        return post_completion(host, port, body, cfg.timeout, i)

    t0 = time.monotonic()
    futures = {pool.submit(one, i) for i in range(cfg.concurrency)}
    pending = set(futures)
    deadline = t0 + cfg.timeout + 5
    died = False
    try:
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for f in done:
                results.append(f.result())
            if not server.alive():
                # give in-flight requests a moment to report their own errors
                done, pending = wait(pending, timeout=2)
                results.extend(f.result() for f in done)
                died = True
                break
            if time.monotonic() > deadline:
                break
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    wall = time.monotonic() - t0
    rr = summarize_round(n, sorted(results, key=lambda r: r.index), wall, cfg.concurrency)
    if pending and not died:
        rr.errors.append(f"timeout: {len(pending)} request(s) still running after {cfg.timeout:g}s")
    if died:
        rr.errors.append("server process died during the round")
    return rr
