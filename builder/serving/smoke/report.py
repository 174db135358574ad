"""The verdict and the report: per-round statistics, :func:`decide` (PASS only
when every request of every round succeeded, the server is the same running
process and its log holds no OOM), the JSON report and its schema, the text
summary.  Pure functions."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from builder.serving.smoke.client import RequestResult
from builder.serving.vllm_log import LogFacts, first_error_line, render_cold_start

PASS = "PASS"
FAIL = "FAIL"


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
    kind: str = "completion"  # completion (/v1/completions) | chat (/v1/chat/completions)
    ttft_p95_s: float | None = None


def summarize_round(
    n: int, results: list[RequestResult], wall_s: float, expected: int, kind: str = "completion"
) -> RoundResult:
    lat = [r.latency_s for r in results if r.ok and r.latency_s is not None]
    ttft = [r.ttft_s for r in results if r.ok and r.ttft_s is not None]
    tokens = sum(r.output_tokens for r in results if r.ok)
    what = "chat " if kind == "chat" else ""
    errors = [f"{what}request {r.index} ({'stream' if r.stream else 'plain'}): {r.error}" for r in results if not r.ok]
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
        kind=kind,
        ttft_p95_s=_r(percentile(ttft, 95)),
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
    serve: dict[str, Any] | None = None  # --serve: Ray timings, backend, replica log tail
    equivalence: dict[str, Any] | None = None  # --reference: the output-equivalence comparison
    reference_saved: str | None = None  # --save-reference: the file written
    cold_start: dict[str, Any] | None = None  # the boot's phases (builder.serving.vllm_log.cold_start_phases)
    engine: dict[str, Any] | None = None  # versions the server reported (vLLM's /version)

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
        "schema",
        "verdict",
        "failures",
        "mode",
        "model",
        "settings",
        "boot",
        "kv_cache",
        "rounds",
        "throughput",
        "gpu",
        "plan",
        "server_exit_code",
        "log_tail",
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
                "required": [
                    "round",
                    "kind",
                    "requests",
                    "ok",
                    "failed",
                    "latency_p50_s",
                    "latency_p95_s",
                    "ttft_p50_s",
                    "ttft_p95_s",
                    "output_tokens",
                    "output_tokens_per_s",
                    "errors",
                ],
                "properties": {
                    "kind": {"enum": ["completion", "chat"]},
                    "ttft_p50_s": {"type": ["number", "null"]},
                    "ttft_p95_s": {"type": ["number", "null"]},
                },
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
        "serve": {"type": ["object", "null"]},
        "equivalence": {
            "type": ["object", "null"],
            "required": ["verdict", "failures", "first_diff", "max_abs_dlogprob", "logprob_tolerance", "tie_margin"],
        },
        "reference_saved": {"type": ["string", "null"]},
        "engine": {"type": ["object", "null"]},
        "cold_start": {
            "type": ["object", "null"],
            "required": [
                "load_format",
                "weights_gib",
                "model_load_s",
                "model_load_gib_per_s",
                "torch_compile_s",
                "compile_cache",
                "cuda_graph_capture_s",
                "init_engine_s",
                "health_s",
                "first_token_s",
            ],
        },
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
            what = " (chat)" if r.kind == "chat" else ""
            failures.append(f"round {r.round}{what}: {r.failed}/{r.requests} requests failed (first: {first})")
    if not boot_error and len(rounds) < expected_rounds:
        failures.append(f"only {len(rounds)} of {expected_rounds} rounds ran")
    return (FAIL if failures else PASS), failures


def render_text(rep: SmokeReport) -> str:
    """Human summary (the --json form is ``rep.to_dict()``)."""
    lines = [f"smoke: {rep.verdict}  ({rep.mode}{' ' + rep.image if rep.image else ''}, model {rep.model})"]
    lines += _settings_lines(rep.settings)
    b = rep.boot
    if rep.serve is not None:
        sv = rep.serve
        lines.append(
            f"  ray serve: ray {sv.get('ray_version') or '?'} started in {fmt_value(sv.get('ray_start_s'), 's')}, "
            f"application RUNNING after {fmt_value(sv.get('app_running_s'), 's')}, backend {sv.get('backend') or '?'}"
            + (f" ({sv['backend_reason']})" if sv.get("backend_reason") else "")
        )
    ready = "/v1/models" if rep.serve is not None else "/health"
    lines.append(
        f"  boot: {ready} after {fmt_value(b.get('health_s'), 's')}, first token after "
        f"{fmt_value(b.get('first_token_s'), 's')}"
    )
    if rep.cold_start:
        lines.append("  " + render_cold_start(rep.cold_start))
    kv = rep.kv_cache
    if kv.get("tokens") is not None:
        lines.append(
            f"  KV cache: {kv['tokens']:,} tokens ({fmt_value(kv.get('available_gib'), ' GiB')}); max concurrency "
            f"{fmt_value(kv.get('max_concurrency'), 'x')} at {kv.get('tokens_per_request') or '?'} tokens/request"
        )
    else:
        lines.append("  KV cache: (not found in the server log)")
    for r in rep.rounds:
        lines.append(
            f"  round {r.round}{' (chat)' if r.kind == 'chat' else ''}: {r.ok}/{r.requests} ok, "
            f"p50 {fmt_value(r.latency_p50_s, 's')}, p95 {fmt_value(r.latency_p95_s, 's')}, "
            f"TTFT p50 {fmt_value(r.ttft_p50_s, 's')} p95 {fmt_value(r.ttft_p95_s, 's')}, "
            f"{r.output_tokens} tokens in {r.wall_s:.2f}s ({fmt_value(r.output_tokens_per_s, ' tok/s')})"
        )
    if rep.throughput.get("output_tokens_per_s") is not None:
        lines.append(f"  output: {rep.throughput['output_tokens_per_s']} tokens/s over all rounds")
    if rep.gpu:
        lines.append(
            f"  GPU memory used: peak {rep.gpu.get('memory_used_mib_peak')} MiB of "
            f"{rep.gpu.get('memory_total_mib')} MiB"
        )
    if rep.plan:
        lines.append(f"  plan: {rep.plan.get('summary', json.dumps(rep.plan)[:200])}")
    for line in rep.layer_rewrites[:3]:
        lines.append(f"  layer types: {line[:240]}")
    if rep.equivalence is not None:
        lines.append(f"  output equivalence: {rep.equivalence.get('summary', rep.equivalence.get('verdict'))}")
    if rep.reference_saved:
        lines.append(f"  reference written: {rep.reference_saved}")
    for f in rep.failures:
        lines.append(f"  FAIL: {f}")
    if rep.verdict == FAIL and rep.log_tail:
        lines.append(f"  server log tail ({rep.log_file}):")
        lines.extend("    | " + ln for ln in rep.log_tail)
    if rep.verdict == FAIL and rep.serve and rep.serve.get("replica_log_tail"):
        lines.append(f"  replica log tail ({rep.serve.get('replica_log')}):")
        lines.extend("    | " + ln for ln in rep.serve["replica_log_tail"])
    return "\n".join(lines)


def _settings_lines(s: dict) -> list[str]:
    """The settings, the parallel layout when not one GPU's, and the release the image holds."""
    lines: list[str] = []
    lines.append(
        "  settings: tp={tp} max_model_len={max_model_len} gpu_memory_utilization={gpu_memory_utilization} "
        "max_num_seqs={max_num_seqs} concurrency={concurrency} rounds={rounds} prompt~{prompt_tokens} "
        "max_tokens={max_tokens}".format(**s)
    )
    if s.get("pp", 1) != 1 or s.get("distributed_executor_backend") or s.get("ray_address"):
        lines.append(
            f"  parallel: tp={s.get('tp')} pp={s.get('pp')} "
            f"executor={s.get('distributed_executor_backend') or 'vLLM default'}"
            + (f" ray={s['ray_address']}" if s.get("ray_address") else "")
        )
    rel = s.get("release")
    if rel:
        lines.append(
            f"  release: vllm {rel['vllm']}, lock {rel.get('lock') or 'none committed'}"
            + (f" ({rel['lock_hash'][:12]}, serve-backend {rel.get('serve_backend')})" if rel.get("lock_hash") else "")
            + ", patch series "
            + (
                f"{rel['patch_series']} ({len(rel.get('patches') or [])} patch(es))"
                if rel.get("patch_series")
                else "none shipped"
            )
        )
    return lines


def fmt_value(v: float | None, unit: str) -> str:
    return "n/a" if v is None else f"{v:g}{unit}"
