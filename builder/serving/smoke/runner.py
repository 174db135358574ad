"""One smoke run: plan, start, boot, send the rounds, stop, decide.

:func:`run_smoke` is a short composition of the named steps below; each step
reads the configuration and writes what it observed into :class:`Observed`,
which :func:`make_report` turns into the report.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.credentials import redact_env
from builder.errors import BadInput
from builder.events import SILENT, Reporter
from builder.serving.smoke import equivalence as eqv
from builder.serving.smoke import rayhead
from builder.serving.smoke import serve as serve_mode
from builder.serving.smoke.client import (
    WARMUP_TOKENS,
    chat_body,
    completion_body,
    http_get,
    make_prompt,
    model_vocab_size,
    post_completion,
    run_round,
)
from builder.serving.smoke.config import SmokeConfig, check_gpus_visible, ensure_fd_room, with_multicast_off
from builder.serving.smoke.gpu import nvidia_smi_memory
from builder.serving.smoke.preflight import checkpoint_ready, preflight_plan
from builder.serving.smoke.report import FAIL, PASS, RoundResult, SmokeReport, decide, fmt_value, summarize_round
from builder.serving.smoke.server import (
    ServerProcess,
    build_docker_command,
    build_local_command,
    build_override_command,
    check_docker_image,
    defer_signals,
    docker_spawn,
    file_size,
    find_docker,
    find_vllm,
    free_port,
    remove_container,
)
from builder.serving.vllm_log import (
    cold_start_phases,
    count_server_starts,
    first_error_line,
    log_tail,
    parse_server_log,
    read_log,
)
from builder.util import cache_dir

HOST = "127.0.0.1"


@dataclass
class Launch:
    """How the server is started: the mode, its command line and environment,
    where it listens, and what removes it besides its process group (docker mode)."""

    mode: str  # local | docker | command
    argv: list[str]
    env: dict[str, str]
    port: int
    host: str = HOST
    docker: str | None = None
    cleanup: Callable[[], None] | None = None
    spawn: Callable[..., subprocess.Popen] = subprocess.Popen
    health_path: str = "/health"
    ready: Callable[[str], bool] | None = None  # serve mode: the runner's RUNNING line must be in the log
    ray_temp_dir: str | None = None


@dataclass
class Gate:
    """The output-equivalence gate of this run (--reference / --save-reference), checked before the boot."""

    identity: dict[str, Any]
    reference: eqv.Reference | None = None
    save_to: str | None = None
    config_keys_differ: list[str] = field(default_factory=list)


@dataclass
class Observed:
    """What the run saw, filled in step by step."""

    boot: dict[str, float | None] = field(default_factory=lambda: {"health_s": None, "first_token_s": None})
    boot_log_bytes: int | None = None  # size of the server log when /health first answered
    boot_error: str | None = None
    model_id: str | None = None
    warmup: dict[str, Any] | None = None  # the greedy warm-up request (the report's "probe")
    rounds: list[RoundResult] = field(default_factory=list)
    extra_failures: list[str] = field(default_factory=list)
    gpu_peak: dict[str, Any] | None = None
    exit_code: int | None = None
    exited: bool = False
    interrupted: bool = False
    equivalence: dict[str, Any] | None = None
    engine: dict[str, Any] | None = None  # what the server reports of itself (vLLM's /version)
    reference_outputs: list[dict[str, Any]] | None = None

    def sample_gpu(self) -> None:
        m = nvidia_smi_memory()
        if m is None:
            return
        if self.gpu_peak is None:
            self.gpu_peak = {
                "memory_used_mib_peak": m["memory_used_mib"],
                "memory_total_mib": m["memory_total_mib"],
                "gpus": m["gpus"],
            }
        else:
            self.gpu_peak["memory_used_mib_peak"] = max(self.gpu_peak["memory_used_mib_peak"], m["memory_used_mib"])


# --------------------------------------------------------------------------- steps before the boot


def plan_step(cfg: SmokeConfig, reporter: Reporter) -> dict[str, Any] | None:
    """The plan is computed whenever it can be (it is the prediction the report
    sets beside vLLM's own numbers); a config it cannot read is bad input unless --no-plan."""
    try:
        return preflight_plan(cfg, reporter)
    except BadInput as exc:
        if cfg.plan:
            raise
        reporter.step(f"plan skipped (--no-plan): {exc.message}")
        return None


def prepare_launch(cfg: SmokeConfig) -> Launch:
    env = dict(os.environ)
    env.update(cfg.env)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env = with_multicast_off(env)
    if cfg.ray_address:
        env["RAY_ADDRESS"] = cfg.ray_address
    port = cfg.port or free_port()
    if cfg.serve:
        return serve_launch(cfg, env, port)
    if cfg.server_cmd:
        return Launch("command", build_override_command(cfg, port), env, port)
    if cfg.image:
        docker = cfg.docker_bin or find_docker()
        name = f"build-image-smoke-{uuid.uuid4().hex[:10]}"

        def cleanup() -> None:  # the container outlives a killed CLI
            remove_container(docker, name)

        inner = {"RAY_ADDRESS": cfg.ray_address} if cfg.ray_address else None
        return Launch(
            "docker",
            build_docker_command(cfg, port, name, docker, env=inner),
            env,
            port,
            docker=docker,
            cleanup=cleanup,
            spawn=docker_spawn(docker),
        )
    vllm = shlex.split(cfg.vllm_bin) if cfg.vllm_bin else find_vllm()
    return Launch("local", build_local_command(cfg, port, vllm), env, port)


def serve_launch(cfg: SmokeConfig, env: dict[str, str], port: int) -> Launch:
    """The Serve application on a local Ray head (in the image with docker): its Ray temp dir
    is ours, so the replica logs can be read back, and it is removed after a PASS."""
    ready = serve_mode.is_ready
    if cfg.image:
        docker = cfg.docker_bin or find_docker()
        args = serve_mode.app_args(cfg, "/model")
        name = f"build-image-smoke-{uuid.uuid4().hex[:10]}"
        inner = "/tmp/ray-smoke"
        temp_dir = tempfile.mkdtemp(prefix="smoke-ray-", dir=_short_tmp())
        argv = build_docker_command(
            cfg,
            port,
            name,
            docker,
            entrypoint="python3",
            args=serve_mode.runner_args(args, port, inner, cfg.serve_num_gpus),
            volumes=[(temp_dir, inner)],
            env=serve_mode.serve_env({}),
        )

        def cleanup() -> None:  # the container outlives a killed CLI
            remove_container(docker, name)

        return Launch(
            "docker",
            argv,
            env,
            port,
            docker=docker,
            cleanup=cleanup,
            spawn=docker_spawn(docker),
            health_path="/v1/models",
            ready=ready,
            ray_temp_dir=temp_dir,
        )
    serve_mode.app_args(cfg, str(cfg.model))  # bad --extra-arg: refused before anything is created
    temp_dir = tempfile.mkdtemp(prefix="smoke-ray-", dir=_short_tmp())
    return Launch(
        "local",
        serve_mode.local_command(cfg, port, temp_dir),
        serve_mode.local_env(env),
        port,
        health_path="/v1/models",
        ready=ready,
        ray_temp_dir=temp_dir,
    )


def needs_ray_head(cfg: SmokeConfig, launch: Launch) -> bool:
    """Local ``vllm serve`` with the Ray executor and no --ray-address: smoke starts the head."""
    return (
        cfg.distributed_executor_backend == "ray" and not cfg.ray_address and launch.mode == "local" and not cfg.serve
    )


def _short_tmp() -> str:
    """Ray's temp dir holds AF_UNIX sockets (at most 107 bytes of path): /tmp, not the
    tool's scratch directory under the cache (seen failing on the H200 with a 115-byte path)."""
    return "/tmp" if os.access("/tmp", os.W_OK) else tempfile.gettempdir()


def gate_step(cfg: SmokeConfig) -> Gate | None:
    """Before any GPU time: a reference for another model or prompt set is bad input."""
    if not cfg.reference and not cfg.save_reference:
        return None
    if cfg.save_reference:
        eqv.check_reference_output(cfg.save_reference)  # before any GPU time: a user's file is never replaced
    identity = eqv.model_identity(cfg.model)
    eqv.vocab_size(identity)
    if cfg.reference:
        ref = eqv.load_reference(cfg.reference)
        return Gate(
            identity=identity,
            reference=ref,
            config_keys_differ=eqv.check_compatible(ref, identity),
            save_to=cfg.save_reference,
        )
    return Gate(identity=identity, save_to=cfg.save_reference)


def settings_of(cfg: SmokeConfig) -> dict[str, Any]:
    return {
        "tp": cfg.tp,
        "pp": cfg.pp,
        "distributed_executor_backend": cfg.distributed_executor_backend,
        "ray_address": cfg.ray_address,
        "cpu_offload_gb": cfg.cpu_offload_gb,
        "max_model_len": cfg.max_model_len,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "max_num_seqs": cfg.max_num_seqs,
        "kv_cache_dtype": cfg.kv_cache_dtype,
        "load_format": cfg.load_format,
        "concurrency": cfg.concurrency,
        "rounds": cfg.rounds,
        "chat": cfg.chat,
        "prompt_tokens": cfg.prompt_tokens,
        "max_tokens": cfg.max_tokens,
        "timeout_s": cfg.timeout,
        "boot_timeout_s": cfg.boot_timeout,
        "extra_args": list(cfg.extra_args),
        "serve": cfg.serve,
        "serve_backend": (cfg.serve_backend or "image default") if cfg.serve else None,
        "vllm": cfg.vllm,
        "release": cfg.release,
        **({"env": redact_env(cfg.env)} if cfg.env else {}),
    }


def refused_report(cfg: SmokeConfig, launch: Launch, settings: dict[str, Any], plan: dict[str, Any]) -> SmokeReport:
    return SmokeReport(
        verdict=FAIL,
        failures=[f"memory plan: {plan['summary']} (no GPU time spent; --no-plan boots anyway)"],
        mode=launch.mode,
        model=str(cfg.model),
        image=cfg.image,
        command=launch.argv,
        settings=settings,
        boot={"health_s": None, "first_token_s": None},
        kv_cache={"tokens": None, "max_concurrency": None, "tokens_per_request": None, "available_gib": None},
        rounds=[],
        throughput={"output_tokens_per_s": None},
        gpu=None,
        plan=plan,
        server_exit_code=None,
        log_file=None,
        log_tail=[],
        layer_rewrites=[],
        refused_by_plan=True,
    )


LOGS_KEPT = 20


def open_log(cfg: SmokeConfig) -> tuple[str, bool]:
    """The server log, created only now: bad input and a plan refusal leave no file
    behind (and do not truncate a --log-file the user pointed at).  Returns (path, ours)."""
    if cfg.log_file:
        path, own = cfg.log_file, False
    else:  # kept after the run (the report names it), under the cache, the newest LOGS_KEPT only
        logs = cache_dir() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for old in sorted(logs.glob("smoke-server-*.log"), key=lambda p: p.stat().st_mtime)[:-LOGS_KEPT]:
            old.unlink(missing_ok=True)
        fd, path = tempfile.mkstemp(prefix="smoke-server-", suffix=".log", dir=logs)
        os.close(fd)
        own = True
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(b"")
    return path, own


# --------------------------------------------------------------------------- steps while the server runs


def start_server(server: ServerProcess, log_path: str, own_log: bool) -> None:
    try:
        server.start()
    except BadInput:
        if own_log:
            Path(log_path).unlink(missing_ok=True)
        raise


def wait_for_health(
    cfg: SmokeConfig, server: ServerProcess, launch: Launch, t_start: float, log_path: str, obs: Observed
) -> None:
    """Until ``/health`` answers 200, the server exits, or the boot timeout passes."""
    deadline = t_start + cfg.boot_timeout
    while True:
        if not server.alive():
            obs.boot_error = f"server exited during boot (code {server.poll()}) before {launch.health_path} answered"
            return
        if time.monotonic() > deadline:
            obs.boot_error = f"timeout: {launch.health_path} did not answer 200 within {cfg.boot_timeout:g}s"
            return
        if launch.ready is not None and not launch.ready(read_log(log_path)):
            time.sleep(0.5)
            continue
        try:
            status, _ = http_get(launch.host, launch.port, launch.health_path, timeout=5)
            if status == 200:
                obs.boot["health_s"] = round(time.monotonic() - t_start, 2)
                obs.boot_log_bytes = file_size(log_path)
                return
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.5)


def discover_model(launch: Launch, obs: Observed) -> None:
    """The served model's id, from ``/v1/models``."""
    try:
        status, raw = http_get(launch.host, launch.port, "/v1/models", timeout=30)
        if status == 200:
            data = json.loads(raw).get("data") or []
            obs.model_id = data[0]["id"] if data else None
        if obs.model_id is None:
            obs.boot_error = f"/v1/models answered {status} with no model"
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as exc:
        obs.boot_error = f"/v1/models failed: {exc}"
    obs.engine = engine_versions(launch)


def engine_versions(launch: Launch) -> dict[str, Any] | None:
    """The versions the running engine reports (vLLM's ``/version``); None where it has no such endpoint
    (Ray Serve's proxy)."""
    try:
        status, raw = http_get(launch.host, launch.port, "/version", timeout=10)
        doc = json.loads(raw) if status == 200 else None
    except (OSError, http.client.HTTPException, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    out = {("vllm" if k == "version" else str(k)): v for k, v in doc.items() if isinstance(v, (str, int, float))}
    return out or None


def first_token(
    cfg: SmokeConfig, launch: Launch, vocab: int | None, t_start: float, obs: Observed, reporter: Reporter
) -> None:
    """A greedy streamed warm-up request: the first-token time and an output fingerprint."""
    prompt = make_prompt(-1, min(cfg.prompt_tokens, 16), vocab)
    body = completion_body(obs.model_id or "", prompt, WARMUP_TOKENS, True)
    body["ignore_eos"] = False
    r = post_completion(launch.host, launch.port, body, cfg.timeout, -1)
    obs.warmup = {"prompt": prompt, "text": r.text, "max_tokens": WARMUP_TOKENS}
    if r.ok and r.ttft_s is not None:
        obs.boot["first_token_s"] = round(time.monotonic() - t_start - (r.latency_s - r.ttft_s), 2)
        reporter.step(f"first token after {obs.boot['first_token_s']}s")
    else:
        obs.boot_error = f"first request failed: {r.error}"


def one_round(
    cfg: SmokeConfig,
    server: ServerProcess,
    launch: Launch,
    vocab: int | None,
    n: int,
    model_id: str,
    kind: str = "completion",
) -> RoundResult:
    """``concurrency`` simultaneous requests (even index: streaming, odd: not); ``kind`` chat:
    /v1/chat/completions with the prompt as a user message (words: it goes through the template)."""
    if kind == "chat":
        bodies = [
            chat_body(model_id, str(make_prompt(i, cfg.prompt_tokens, None, seed=n)), cfg.max_tokens, i % 2 == 0)
            for i in range(cfg.concurrency)
        ]
    else:
        bodies = [
            completion_body(model_id, make_prompt(i, cfg.prompt_tokens, vocab, seed=n), cfg.max_tokens, i % 2 == 0)
            for i in range(cfg.concurrency)
        ]
    run = run_round(launch.host, launch.port, bodies, timeout=cfg.timeout, alive=server.alive)
    rr = summarize_round(n, run.results, run.wall_s, cfg.concurrency, kind=kind)
    if run.pending and not run.server_died:
        rr.errors.append(f"timeout: {run.pending} request(s) still running after {cfg.timeout:g}s")
    if run.server_died:
        rr.errors.append("server process died during the round")
    return rr


def request_rounds(
    cfg: SmokeConfig,
    server: ServerProcess,
    launch: Launch,
    vocab: int | None,
    log_path: str,
    obs: Observed,
    reporter: Reporter,
) -> None:
    """The rounds (``cfg.rounds`` of /v1/completions, then one of /v1/chat/completions unless
    ``cfg.chat`` is off); stop at the first failed request, a dead server, an OOM line or a failing /health."""
    total = expected_rounds(cfg)
    for n in range(1, total + 1):
        kind = "chat" if n > cfg.rounds else "completion"
        reporter.step(f"round {n}/{total}: {cfg.concurrency} concurrent {'chat ' if kind == 'chat' else ''}requests")
        rr = one_round(cfg, server, launch, vocab, n, obs.model_id or "", kind)
        obs.rounds.append(rr)
        obs.sample_gpu()
        reporter.step(
            f"round {n}: {rr.ok}/{rr.requests} ok, p50 {fmt_value(rr.latency_p50_s, 's')} "
            f"p95 {fmt_value(rr.latency_p95_s, 's')}, TTFT p50 {fmt_value(rr.ttft_p50_s, 's')} "
            f"p95 {fmt_value(rr.ttft_p95_s, 's')}, "
            f"{fmt_value(rr.output_tokens_per_s, ' tok/s')}"
        )
        if rr.failed or not server.alive():
            return
        if parse_server_log(read_log(log_path)).oom_lines:
            return
        try:
            status, _ = http_get(launch.host, launch.port, launch.health_path, timeout=10)
            if status != 200:
                obs.extra_failures.append(f"{launch.health_path} answered {status} after round {n}")
                return
        except (OSError, http.client.HTTPException) as exc:
            obs.extra_failures.append(f"{launch.health_path} failed after round {n}: {exc}")
            return


def gate_run(cfg: SmokeConfig, gate: Gate, launch: Launch, obs: Observed, reporter: Reporter) -> None:
    """After clean rounds: record the reference outputs, or compare with the reference."""
    model_id = obs.model_id or ""
    try:
        if gate.reference is not None:
            reporter.step(f"output equivalence: {len(gate.reference.prompts)} prompts vs {gate.reference.path}")
            eq = eqv.check(
                launch.host,
                launch.port,
                model_id,
                gate.reference,
                cfg.timeout,
                logprob_tolerance=(
                    cfg.reference_logprob_tolerance
                    if cfg.reference_logprob_tolerance is not None
                    else eqv.LOGPROB_TOLERANCE
                ),
                tie_margin=(cfg.reference_tie_margin if cfg.reference_tie_margin is not None else eqv.TIE_MARGIN),
                config_keys_differ=gate.config_keys_differ,
            )
            obs.equivalence = eq.to_dict()
            obs.equivalence["summary"] = eqv.summary(eq)
            reporter.step(f"output equivalence {obs.equivalence['summary']}")
            obs.extra_failures.extend(f"output equivalence: {f}" for f in eq.failures)
        if gate.save_to is not None:
            prompts = eqv.prompt_set(eqv.vocab_size(gate.identity))
            reporter.step(f"recording the reference outputs of {len(prompts)} prompts")
            obs.reference_outputs = eqv.record(launch.host, launch.port, model_id, prompts, cfg.timeout)
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError, IndexError) as exc:
        obs.extra_failures.append(f"output equivalence: the server's answer could not be read: {exc}"[:400])


def expected_rounds(cfg: SmokeConfig) -> int:
    return cfg.rounds + (1 if cfg.chat else 0)


def stop_server(cfg: SmokeConfig, server: ServerProcess, obs: Observed, reporter: Reporter) -> None:
    """Record how the server ended, then stop it by its process group.  A second
    Ctrl-C / SIGTERM while stopping must not abandon the server: it only cuts the
    SIGTERM grace period short (SIGKILL at once)."""
    hurry = threading.Event()
    restore_signals = defer_signals(hurry)
    try:
        lost = any(("Connection" in e or "Disconnected" in e) for r in obs.rounds for e in r.errors)
        if server.alive() and (obs.boot_error or lost):
            # a dying server resets its connections a moment before it can be reaped
            try:
                server.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        obs.exited = not server.alive() and server.proc is not None
        obs.exit_code = server.poll() if obs.exited else None
        reporter.step("stopping server")
        server.stop(grace=cfg.stop_grace, hurry=hurry)
    finally:
        restore_signals()
    if hurry.is_set() and not obs.interrupted:
        obs.interrupted = True
        obs.extra_failures.append("interrupted (Ctrl-C / SIGTERM) while stopping the server; server stopped")


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM takes Ctrl-C's path (main thread only) while the server runs."""

    def on_term(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term) if threading.current_thread() is threading.main_thread() else None
    try:
        yield
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


# --------------------------------------------------------------------------- after the stop


def make_report(
    cfg: SmokeConfig,
    launch: Launch,
    settings: dict[str, Any],
    plan: dict[str, Any] | None,
    obs: Observed,
    log_path: str,
) -> SmokeReport:
    text = read_log(log_path)
    facts = parse_server_log(text)
    serve_info = None
    if launch.ray_temp_dir is not None:
        serve_info = serve_mode.parse_serve_lines(text)
        obs.boot["ray_start_s"] = serve_info["ray_start_s"]
        obs.boot["app_running_s"] = serve_info["app_running_s"]
        obs.extra_failures[:0] = [f"serve: {f}" for f in serve_info["failed"]]
        obs.extra_failures.extend(f"serve: replica restarted: {r}" for r in serve_info["restarts"])
    starts_after_boot = None
    if obs.boot_log_bytes is not None and serve_info is None:
        try:
            later = Path(log_path).read_bytes()[obs.boot_log_bytes :].decode("utf-8", "replace")
        except OSError:
            later = ""
        starts_after_boot = count_server_starts(later)
    verdict, failures = decide(
        rounds=obs.rounds,
        expected_rounds=expected_rounds(cfg),
        facts=facts,
        server_exit_code=obs.exit_code,
        server_exited=obs.exited,
        boot_error=obs.boot_error,
        extra_failures=obs.extra_failures,
        starts_after_boot=starts_after_boot,
    )
    if serve_info is not None and failures and not obs.exited:
        root = first_error_line(facts) or facts.last_exception_line
        if root and not any(root[:200] in f for f in failures):
            failures.append(f"replica log: {root[:300]}")
    total_tokens = sum(r.output_tokens for r in obs.rounds)
    total_wall = sum(r.wall_s for r in obs.rounds)
    return SmokeReport(
        verdict=verdict,
        failures=failures,
        mode=launch.mode,
        model=str(cfg.model),
        image=cfg.image,
        command=launch.argv,
        settings=settings,
        boot=obs.boot,
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
        cold_start=cold_start_phases(facts, obs.boot, cfg.load_format),
        rounds=obs.rounds,
        throughput={"output_tokens_per_s": round(total_tokens / total_wall, 1) if total_wall > 0 else None},
        gpu=obs.gpu_peak,
        plan=plan,
        server_exit_code=obs.exit_code,
        log_file=log_path,
        log_tail=log_tail(text) if verdict == FAIL else [],
        layer_rewrites=facts.layer_rewrite_lines,
        probe=obs.warmup,
        interrupted=obs.interrupted,
        serve=_serve_section(serve_info, launch, verdict),
        equivalence=obs.equivalence,
        engine=obs.engine,
    )


def _serve_section(info: dict[str, Any] | None, launch: Launch, verdict: str) -> dict[str, Any] | None:
    if info is None:
        return None
    replica_log, tail = serve_mode.replica_log_tail(launch.ray_temp_dir) if verdict == FAIL else (None, [])
    return {
        **info,
        "ray_temp_dir": launch.ray_temp_dir if verdict == FAIL else None,
        "replica_log": replica_log,
        "replica_log_tail": tail,
    }


def save_reference(
    cfg: SmokeConfig, gate: Gate | None, launch: Launch, rep: SmokeReport, obs: Observed, reporter: Reporter
) -> None:
    """Write the reference file (atomically), only for a PASS: a failing server's outputs are no reference."""
    if gate is None or gate.save_to is None:
        return
    if rep.verdict != PASS or obs.reference_outputs is None:
        reporter.step(f"reference not written ({gate.save_to}): the smoke test did not pass")
        return
    prompts = eqv.prompt_set(eqv.vocab_size(gate.identity))
    doc = eqv.reference_document(
        gate.identity,
        prompts,
        obs.reference_outputs,
        eqv.recorded_info(launch.mode + (" serve" if cfg.serve else ""), cfg.image, cfg.extra_args, str(cfg.model)),
    )
    eqv.write_reference(gate.save_to, doc)
    rep.reference_saved = gate.save_to
    reporter.step(f"reference written: {gate.save_to}")


def drop_passing_log(rep: SmokeReport, own_log: bool, launch: Launch | None = None) -> None:
    """A temp log (and the Ray temp dir of --serve) is kept only for a FAIL."""
    if launch is not None and launch.ray_temp_dir and rep.verdict == PASS:
        shutil.rmtree(launch.ray_temp_dir, ignore_errors=True)
    if own_log and rep.verdict == PASS and rep.log_file:
        try:
            os.unlink(rep.log_file)
            rep.log_file = None
        except OSError:
            pass


# --------------------------------------------------------------------------- the composition


def run_smoke(cfg: SmokeConfig, *, reporter: Reporter = SILENT, planned: dict[str, Any] | None = None) -> SmokeReport:
    """Boot, send the rounds, stop; return the report.  Never raises for a FAIL verdict: a
    configuration the plan refuses is a FAIL report with ``refused_by_plan``
    (nothing booted).  Raises BadInput for bad input (flags, config.json).

    ``planned``: the preflight plan the caller computed in this run, after its checkpoint
    check (the pipeline's preflight); both are then not done again."""
    cfg = cfg.validate()  # the flags checked, --load-format in the release's spelling
    gpus = nvidia_smi_memory()
    check_gpus_visible(cfg, gpus["gpus"] if gpus else None)  # TP x PP GPUs must exist here
    ensure_fd_room(cfg.concurrency)  # one socket per simultaneous request
    if cfg.image and cfg.server_cmd:
        raise BadInput("smoke: give either IMAGE or --server-cmd, not both")
    if planned is None:
        checkpoint_ready(cfg, reporter)  # CheckpointNotReady (exit 13) before any plan, server or GPU work
    gate = gate_step(cfg)
    plan = planned if planned is not None else plan_step(cfg, reporter)
    launch = prepare_launch(cfg)
    settings = settings_of(cfg)
    try:
        if cfg.plan and plan is not None and plan.get("fits") is False:
            reporter.step("refused by the memory plan; the server was not started (--no-plan boots anyway)")
            if launch.ray_temp_dir:
                shutil.rmtree(launch.ray_temp_dir, ignore_errors=True)
            return refused_report(cfg, launch, settings, plan)
        if launch.mode == "docker":
            check_docker_image(launch.docker or "", cfg.image or "")
        log_path, own_log = open_log(cfg)
    except BaseException:
        if launch.ray_temp_dir:
            shutil.rmtree(launch.ray_temp_dir, ignore_errors=True)
        raise
    server = ServerProcess(launch.argv, log_path, env=launch.env, cleanup=launch.cleanup, spawn=launch.spawn)
    obs = Observed()
    head: rayhead.RayHead | None = None
    with sigterm_as_interrupt():
        if needs_ray_head(cfg, launch):
            try:
                head = rayhead.start_head(launch.env, timeout=min(cfg.boot_timeout, 180.0), reporter=reporter)
            except BaseException:
                if launch.ray_temp_dir:
                    shutil.rmtree(launch.ray_temp_dir, ignore_errors=True)
                raise
            launch.env["RAY_ADDRESS"] = head.address
        t_start = time.monotonic()
        reporter.step(f"starting server ({launch.mode}): {' '.join(shlex.quote(a) for a in launch.argv)}")
        reporter.step(f"server log: {log_path}")
        try:
            start_server(server, log_path, own_log)
            wait_for_health(cfg, server, launch, t_start, log_path, obs)
            if obs.boot_error is None:
                reporter.step(f"/health OK after {obs.boot['health_s']}s")
                obs.sample_gpu()
                discover_model(launch, obs)
            vocab = model_vocab_size(cfg.model)
            if obs.boot_error is None:
                first_token(cfg, launch, vocab, t_start, obs, reporter)
            if obs.boot_error is None:
                request_rounds(cfg, server, launch, vocab, log_path, obs, reporter)
            if gate is not None and clean_so_far(cfg, server, obs):
                gate_run(cfg, gate, launch, obs, reporter)
        except KeyboardInterrupt:
            obs.interrupted = True
            obs.extra_failures.append("interrupted (Ctrl-C / SIGTERM); server stopped")
        finally:
            try:
                stop_server(cfg, server, obs, reporter)
            finally:
                if head is not None:
                    reporter.step(f"stopping the Ray head (pid {head.pid})")
                    head.stop(grace=cfg.stop_grace)
    rep = make_report(cfg, launch, settings, plan, obs, log_path)
    save_reference(cfg, gate, launch, rep, obs, reporter)
    drop_passing_log(rep, own_log, launch)
    return rep


def clean_so_far(cfg: SmokeConfig, server: ServerProcess, obs: Observed) -> bool:
    return (
        obs.boot_error is None
        and not obs.extra_failures
        and server.alive()
        and len(obs.rounds) == expected_rounds(cfg)
        and not any(r.failed for r in obs.rounds)
    )
