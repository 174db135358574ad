"""GPU smoke test: boot the engine with production flags, generate at target
concurrency, and give a verdict.

A passing ``/health`` is not a verdict (the Qwen sparse-attention checkpoint: the first
configuration booted, answered a few requests, then ran out of GPU memory under 16
concurrent requests).  A smoke run:

1. plans the configuration with :mod:`builder.serving.plan` when it can (zero GPU time
   for an impossible configuration; ``plan=False`` skips it);
2. starts ``vllm serve`` -- locally as a subprocess in its own process group, or
   through ``docker run --gpus all --ipc=host --pull=never IMAGE`` -- with its
   output in a log file;
3. waits for ``/health`` (bounded), measures the first streamed token;
4. runs ``rounds`` rounds of ``concurrency`` simultaneous ``/v1/completions``
   requests, streaming and non-streaming alternately;
5. FAILs on any non-200, any error inside a stream or a stream that ends
   without ``[DONE]``, a server exit or restart, an out-of-memory message in
   the server log, or a timeout; the server is always stopped by PID (its
   process group), also on Ctrl-C.

The package, one concern per module:

* :mod:`.config` -- :class:`SmokeConfig` and its validation;
* :mod:`.client` -- the smoke client (prompts, request bodies, HTTP/SSE, a round);
* :mod:`.server` -- the server's lifecycle (commands, process group, signals);
* :mod:`builder.serving.vllm_log` -- reading vLLM's log (shared with :mod:`builder.serving.plan`);
* :mod:`.report` -- statistics, the verdict, the report and its schema;
* :mod:`.preflight` -- the memory plan before the boot;
* :mod:`.gpu` -- nvidia-smi;
* :mod:`.runner` -- :func:`run_smoke`, the composition of named steps.

Only the standard library (and this package) is used, so the smoke test runs
unchanged on a bare GPU host's Python 3.12 next to vLLM.
"""

from __future__ import annotations

from builder.serving.smoke.client import (
    WARMUP_TOKENS,
    RequestResult,
    RoundRun,
    completion_body,
    http_get,
    make_prompt,
    model_vocab_size,
    post_completion,
    run_round,
)
from builder.serving.smoke.config import SmokeConfig, config_from_serving
from builder.serving.smoke.gpu import nvidia_smi_memory
from builder.serving.smoke.preflight import checkpoint_ready, preflight_plan
from builder.serving.smoke.report import (
    FAIL,
    PASS,
    SMOKE_REPORT_SCHEMA,
    RoundResult,
    SmokeReport,
    decide,
    percentile,
    render_text,
    summarize_round,
)
from builder.serving.smoke.runner import run_smoke
from builder.serving.smoke.server import (
    ServerProcess,
    build_docker_command,
    build_local_command,
    build_override_command,
    check_docker_image,
    find_docker,
    find_vllm,
    free_port,
    serve_flags,
    vllm_kv_cache_dtype,
)
from builder.serving.vllm_log import (
    FATAL_PATTERNS,
    OOM_PATTERNS,
    LogFacts,
    first_error_line,
    log_tail,
    parse_server_log,
    read_log,
)

__all__ = [
    "FAIL",
    "FATAL_PATTERNS",
    "OOM_PATTERNS",
    "PASS",
    "SMOKE_REPORT_SCHEMA",
    "WARMUP_TOKENS",
    "LogFacts",
    "RequestResult",
    "RoundResult",
    "RoundRun",
    "ServerProcess",
    "SmokeConfig",
    "SmokeReport",
    "build_docker_command",
    "build_local_command",
    "build_override_command",
    "check_docker_image",
    "checkpoint_ready",
    "completion_body",
    "config_from_serving",
    "decide",
    "find_docker",
    "find_vllm",
    "first_error_line",
    "free_port",
    "http_get",
    "log_tail",
    "make_prompt",
    "model_vocab_size",
    "nvidia_smi_memory",
    "parse_server_log",
    "percentile",
    "post_completion",
    "preflight_plan",
    "read_log",
    "render_text",
    "run_round",
    "run_smoke",
    "serve_flags",
    "summarize_round",
    "vllm_kv_cache_dtype",
]
