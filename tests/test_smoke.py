"""CPU tests of the smoke probe (builder/serving/smoke.py, `build-image smoke`).

The probe runs against tests/fake_openai_server.py (started by the probe, as it
starts `vllm serve`), with failures injected; log parsing uses real vLLM 0.26.0
lines from the H200 proof (scripts/gpu-proof.sh).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from builder.errors import BadInput
from builder.events import SILENT, Recorder
from builder.serving import smoke
from builder.serving.smoke import (
    FAIL,
    PASS,
    SMOKE_REPORT_SCHEMA,
    LogFacts,
    RequestResult,
    SmokeConfig,
    build_docker_command,
    build_local_command,
    decide,
    first_error_line,
    make_prompt,
    parse_server_log,
    percentile,
    render_text,
    run_smoke,
    summarize_round,
)

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fake_openai_server.py"
CLI = [sys.executable, "-c", "import sys; from builder.cli import main; main(prog_name='build-image')"]

# Real vLLM 0.26.0 lines (H200, this project's GPU proof).
REAL_BOOT_LOG = """\
(APIServer pid=2568) INFO 11-30 03:07:20 [model.py:623] Resolved architecture: Qwen3ForCausalLM
(EngineCore pid=2644) INFO 11-30 03:07:41 [cuda.py:482] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'TRITON_ATTN', 'FLEX_ATTENTION'].
(EngineCore pid=2644) INFO 11-30 03:07:41 [default_loader.py:430] Loading weights took 0.01 seconds
(EngineCore pid=2644) INFO 11-30 03:07:41 [model_runner.py:305] Model loading took 0.01 GiB and 1.424945 seconds
(EngineCore pid=2644) INFO 11-30 03:07:43 [gpu_worker.py:560] Available KV cache memory: 69.6 GiB
(EngineCore pid=2644) INFO 11-30 03:07:43 [kv_cache_utils.py:2177] GPU KV cache size: 72,979,664 tokens
(EngineCore pid=2644) INFO 11-30 03:07:43 [kv_cache_utils.py:2178] Maximum concurrency for 4,096 tokens per request: 17817.30x
(EngineCore pid=2644) INFO 11-30 03:07:43 [gpu_worker.py:857] Free memory on device (139.29/139.8 GiB) on startup. Desired GPU memory utilization is (0.5, 69.9 GiB). Actual usage is 0.01 GiB for weight, 0.07 GiB for peak activation, 0.22 GiB for non-torch memory, and 0.0 GiB for CUDAGraph memory.
(EngineCore pid=2644) INFO 11-30 03:07:44 [core.py:347] init engine (profile, create kv cache, warmup model) took 2.48 s
(APIServer pid=2568) INFO 11-30 03:07:51 [api_server.py:677] Starting vLLM server on http://127.0.0.1:45355
(APIServer pid=2568) INFO:     Application startup complete.
"""  # noqa: E501 - verbatim vLLM lines
REAL_KV_TOO_SMALL = """\
(EngineCore pid=2422) INFO 11-30 03:06:53 [gpu_worker.py:560] Available KV cache memory: 10.51 GiB
(EngineCore pid=2422) ERROR 11-30 03:06:53 [core.py:1330] EngineCore failed to start.
(EngineCore pid=2422) ERROR 11-30 03:06:53 [core.py:1330] ValueError: To serve at least one request with the model's max seq len (1048576), (24.0 GiB KV cache is needed, which is larger than the available KV cache memory (10.51 GiB). Based on the available memory, the estimated maximum model length is 459232.
(APIServer pid=2283) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""  # noqa: E501 - verbatim vLLM lines
REAL_PLE_SHORT = """\
(EngineCore pid=1254) ERROR 11-30 03:04:31 [core.py:1330] EngineCore failed to start.
(EngineCore pid=1254) ERROR 11-30 03:04:31 [core.py:1330] ValueError: There is no module or parameter named 'embed_tokens_per_layer' in Gemma4ForCausalLM.
(APIServer pid=813) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""  # noqa: E501 - verbatim vLLM lines


# ----------------------------------------------------------------- pure logic


def test_parse_real_boot_log():
    f = parse_server_log(REAL_BOOT_LOG)
    assert f.kv_cache_tokens == 72_979_664
    assert f.max_concurrency == pytest.approx(17817.30)
    assert f.max_concurrency_tokens_per_request == 4096
    assert f.available_kv_cache_gib == pytest.approx(69.6)
    assert (f.model_load_gib, f.model_load_s) == (0.01, pytest.approx(1.424945))
    assert (f.weights_gib, f.peak_activation_gib, f.non_torch_gib) == (0.01, 0.07, 0.22)
    assert f.init_engine_s == pytest.approx(2.48)
    assert f.server_starts == 1
    assert f.oom_lines == [] and f.fatal_lines == []


def test_parse_kv_too_small_is_an_oom_verdict():
    f = parse_server_log(REAL_KV_TOO_SMALL)
    assert f.kv_cache_tokens is None
    assert len(f.oom_lines) == 1 and "larger than the available KV cache memory" in f.oom_lines[0]
    verdict, failures = decide(
        rounds=[],
        expected_rounds=3,
        facts=f,
        server_exit_code=1,
        server_exited=True,
        boot_error="server exited during boot (code 1) before /health answered",
    )
    assert verdict == FAIL
    assert any("larger than the available KV cache memory" in x for x in failures)


def test_root_cause_skips_the_generic_wrapper():
    f = parse_server_log(REAL_PLE_SHORT)
    root = first_error_line(f)
    assert root.startswith("ERROR") or root.startswith("ValueError")
    assert "no module or parameter named 'embed_tokens_per_layer'" in root
    _, failures = decide(
        rounds=[],
        expected_rounds=3,
        facts=f,
        server_exit_code=1,
        server_exited=True,
        boot_error="server exited during boot",
    )
    assert any("embed_tokens_per_layer" in x for x in failures)


@pytest.mark.parametrize(
    "line",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "RuntimeError: CUDA error: out of memory",
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
        "ValueError: Failed to load model - not enough GPU memory. Tried to allocate 3 GiB",
    ],
)
def test_oom_patterns(line):
    assert parse_server_log(f"(EngineCore pid=1) ERROR 11-30 03:00:00 [core.py:1] {line}\n").oom_lines


def test_restart_counts_server_starts():
    twice = REAL_BOOT_LOG + REAL_BOOT_LOG
    f = parse_server_log(twice)
    assert f.server_starts == 2
    verdict, failures = decide(
        rounds=[], expected_rounds=0, facts=f, server_exit_code=None, server_exited=False, boot_error=None
    )
    assert verdict == FAIL and any("restarted" in x for x in failures)


def test_layer_rewrite_lines_are_collected_but_errors_are_not():
    log = (
        "WARNING 11-30 03:20:00 [config.py:300] layer_types rewritten for qwen3: layers [1, 3] "
        "qwen_sparse_attention -> full_attention (output quality unvalidated)\n"
        "ValueError: The `layer_types` entries must be in ('full_attention',) but got ['qwen_sparse_attention']\n"
    )
    f = parse_server_log(log)
    assert len(f.layer_rewrite_lines) == 1 and "[1, 3]" in f.layer_rewrite_lines[0]


def test_percentile():
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)


def test_summarize_round_and_decide_pass():
    res = [
        RequestResult(index=i, stream=i % 2 == 0, ok=True, status=200, latency_s=0.1 * (i + 1), output_tokens=10)
        for i in range(4)
    ]
    r = summarize_round(1, res, wall_s=0.5, expected=4)
    assert (r.ok, r.failed, r.output_tokens) == (4, 0, 40)
    assert r.latency_p50_s == pytest.approx(0.25)
    assert r.output_tokens_per_s == pytest.approx(80.0)
    verdict, failures = decide(
        rounds=[r], expected_rounds=1, facts=LogFacts(), server_exit_code=None, server_exited=False, boot_error=None
    )
    assert (verdict, failures) == (PASS, [])


def test_summarize_round_counts_missing_requests_as_failed():
    res = [
        RequestResult(index=0, stream=True, ok=True, latency_s=0.1, output_tokens=5),
        RequestResult(index=1, stream=False, ok=False, status=500, error="HTTP 500: boom"),
    ]
    r = summarize_round(2, res, wall_s=1.0, expected=4)
    assert r.failed == 3
    assert any("HTTP 500" in e for e in r.errors) and any("did not finish" in e for e in r.errors)
    verdict, failures = decide(
        rounds=[r], expected_rounds=3, facts=LogFacts(), server_exit_code=None, server_exited=False, boot_error=None
    )
    assert verdict == FAIL
    assert any("round 2: 3/4" in x for x in failures) and any("only 1 of 3 rounds" in x for x in failures)


def test_prompts_are_distinct_and_sized():
    a = make_prompt(0, 128, 1024, seed=1)
    b = make_prompt(1, 128, 1024, seed=1)
    assert len(a) == 128 and a != b and all(0 <= t < 1024 for t in a)
    assert make_prompt(0, 128, 1024, seed=1) == a  # deterministic
    words = make_prompt(0, 20, None)
    assert isinstance(words, str) and len(words.split()) == 20


def test_local_and_docker_commands(tmp_path):
    cfg = SmokeConfig(
        model=str(tmp_path),
        tp=2,
        max_model_len=4096,
        gpu_memory_utilization=0.85,
        max_num_seqs=16,
        kv_cache_dtype="fp8",
        extra_args=["--enforce-eager"],
        image="reg:5000/vllm:1",
    )
    local = build_local_command(cfg, 8123, ["vllm"])
    assert local[:3] == ["vllm", "serve", str(tmp_path.resolve())]
    flags = " ".join(local)
    for expect in (
        "--port 8123",
        "--host 127.0.0.1",
        "--tensor-parallel-size 2",
        "--max-model-len 4096",
        "--gpu-memory-utilization 0.85",
        "--max-num-seqs 16",
        "--kv-cache-dtype fp8",
    ):
        assert expect in flags
    assert local[-1] == "--enforce-eager"
    dk = build_docker_command(cfg, 8123, "smoke-x", "/usr/bin/docker")
    s = " ".join(dk)
    for expect in (
        "run --rm --name smoke-x",
        "--pull=never",
        "--gpus all",
        "--ipc=host",
        f"-v {tmp_path.resolve()}:/model:ro",
        "--network=host",
        "--entrypoint vllm reg:5000/vllm:1 serve /model",
        "--host 127.0.0.1",
        "--port 8123",
    ):
        assert expect in s


@pytest.mark.parametrize(
    "kwargs,msg",
    [
        ({"concurrency": 0}, "--concurrency"),
        ({"rounds": 0}, "--rounds"),
        ({"gpu_memory_utilization": 1.5}, "--gpu-memory-utilization"),
        ({"max_model_len": 100, "prompt_tokens": 90, "max_tokens": 20}, "exceeds --max-model-len"),
    ],
)
def test_config_validation(tmp_path, kwargs, msg):
    with pytest.raises(BadInput, match=msg):
        SmokeConfig(model=str(tmp_path), **kwargs).validate()


def test_report_json_matches_schema_and_text(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    rep = _run(tmp_path, rounds=1, concurrency=2)
    d = rep.to_dict()
    jsonschema.validate(d, SMOKE_REPORT_SCHEMA)
    json.dumps(d)  # serialisable
    text = render_text(rep)
    assert "smoke: PASS" in text and "3,024,928 tokens" in text


# ----------------------------------------------------------------- against the fake server


def _fake_cmd(*flags: str) -> str:
    return " ".join([shlex.quote(sys.executable), shlex.quote(str(FAKE)), "--port", "{port}", *flags])


def _run(tmp_path, *fake_flags, **kw):
    kw.setdefault("rounds", 2)
    kw.setdefault("concurrency", 4)
    kw.setdefault("max_tokens", 8)
    kw.setdefault("prompt_tokens", 16)
    kw.setdefault("timeout", 10)
    kw.setdefault("boot_timeout", 20)
    kw.setdefault("stop_grace", 2)
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    cfg = SmokeConfig(model=str(model), server_cmd=_fake_cmd(*fake_flags), log_file=str(tmp_path / "server.log"), **kw)
    return run_smoke(cfg)


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie child of ours still answers kill(0); check its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_pass_reports_numbers_and_stops_the_server(tmp_path):
    pidfile = tmp_path / "srv.pid"
    child = tmp_path / "child.pid"
    rep = _run(tmp_path, "--boot-delay", "1", "--pidfile", str(pidfile), "--child-pidfile", str(child), rounds=3)
    assert rep.verdict == PASS, rep.failures
    assert rep.exit_code == 0
    assert rep.boot["health_s"] >= 1.0 and rep.boot["first_token_s"] >= rep.boot["health_s"]
    assert rep.kv_cache["tokens"] == 3_024_928 and rep.kv_cache["max_concurrency"] == pytest.approx(738.51)
    # 3 rounds of /v1/completions, then one of /v1/chat/completions (streaming and not)
    assert [(r.kind, r.ok) for r in rep.rounds] == [("completion", 4)] * 3 + [("chat", 4)]
    assert all(r.output_tokens == 4 * 8 for r in rep.rounds)
    assert all(r.latency_p50_s is not None and r.latency_p95_s >= r.latency_p50_s for r in rep.rounds)
    assert all(r.ttft_p50_s is not None and r.ttft_p95_s >= r.ttft_p50_s for r in rep.rounds)
    assert "round 4 (chat): 4/4 ok" in render_text(rep) and "TTFT p50" in render_text(rep)
    assert rep.throughput["output_tokens_per_s"] > 0
    assert rep.probe["text"].strip().startswith("w0")
    # stopped by process group: the server and its (SIGTERM-ignoring) child are gone
    assert _dead(int(pidfile.read_text())) and _dead(int(child.read_text()))


@pytest.mark.parametrize(
    "flags,needle",
    [
        (("--fail-500-at", "3"), "HTTP 500"),
        (("--drop-stream-at", "2"), "without [DONE]"),
        (("--error-event-at", "2"), "error event in stream"),
    ],
)
def test_request_failures_fail_the_verdict(tmp_path, flags, needle):
    rep = _run(tmp_path, *flags)
    assert rep.verdict == FAIL and rep.exit_code == 1
    assert any(needle in f for f in rep.failures), rep.failures
    assert len(rep.rounds) == 1  # stops after the failing round
    assert rep.log_tail, "the server log tail is reported on failure"


@pytest.mark.parametrize("status", [400, 500])
def test_a_broken_chat_template_fails_the_verdict_though_completions_pass(tmp_path, status):
    rep = _run(tmp_path, "--broken-chat-template", str(status), rounds=2)
    assert rep.verdict == FAIL and rep.exit_code == 1
    assert [(r.kind, r.failed) for r in rep.rounds] == [("completion", 0), ("completion", 0), ("chat", 4)]
    assert rep.failures[0].startswith(
        f"round 3 (chat): 4/4 requests failed (first: chat request 0 (stream): HTTP {status}"
    )
    assert ("chat template" in rep.failures[0]) and rep.log_tail
    # a model without a chat template: --no-chat skips the round, and the verdict is the completions'
    off = _run(tmp_path, "--broken-chat-template", str(status), rounds=2, chat=False)
    assert off.verdict == PASS and [r.kind for r in off.rounds] == ["completion", "completion"]


def test_chat_stream_ttft_is_the_first_content_delta_not_the_role_chunk():
    """Against a live fake server: the role-only first chunk of a chat stream is no token."""
    import socket
    import subprocess as sp

    from builder.serving.smoke.client import chat_body, post_completion

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = sp.Popen([sys.executable, str(FAKE), "--port", str(port), "--token-delay", "0.2"], stdout=sp.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        r = post_completion("127.0.0.1", port, chat_body("fake-model", "hello there", 3, True), 20, 0)
        assert r.ok and r.kind == "chat" and r.output_tokens == 3 and r.text == " w0 w1 w2"
        assert r.ttft_s >= 0.2  # the role chunk came at once; the first content delta one token-delay later
        plain = post_completion("127.0.0.1", port, chat_body("fake-model", "hello there", 3, False), 20, 1)
        assert plain.ok and plain.text == "w0 w1 w2"
    finally:
        proc.terminate()
        proc.wait(10)


def test_server_dying_mid_round_fails_fast(tmp_path):
    t0 = time.monotonic()
    rep = _run(tmp_path, "--die-at", "3", "--token-delay", "0.05", timeout=60)
    assert time.monotonic() - t0 < 20, "a dead server must not wait for request timeouts"
    assert rep.verdict == FAIL
    assert any("server process exited (code 3)" in f for f in rep.failures)
    assert any("EngineCore encountered a fatal error" in ln for ln in rep.log_tail)


def test_oom_line_in_log_fails_even_if_requests_succeed(tmp_path):
    rep = _run(tmp_path, "--oom-at", "3")
    assert rep.verdict == FAIL
    assert all(r.failed == 0 for r in rep.rounds)
    assert any("out-of-memory" in f and "CUDA out of memory" in f for f in rep.failures)


def test_request_timeout(tmp_path):
    rep = _run(tmp_path, "--hang-at", "2", timeout=2, rounds=1)
    assert rep.verdict == FAIL
    assert any("timeout" in f.lower() for f in rep.failures), rep.failures


def test_slow_health_times_out_at_boot(tmp_path):
    pidfile = tmp_path / "srv.pid"
    t0 = time.monotonic()
    rep = _run(tmp_path, "--boot-delay", "30", "--pidfile", str(pidfile), boot_timeout=2)
    assert time.monotonic() - t0 < 15
    assert rep.verdict == FAIL and rep.rounds == []
    assert any("/health did not answer 200 within 2s" in f for f in rep.failures)
    assert _dead(int(pidfile.read_text()))


def test_exit_during_boot_reports_the_cause(tmp_path):
    rep = _run(tmp_path, "--exit-during-boot")
    assert rep.verdict == FAIL
    assert any("server exited during boot (code 1)" in f for f in rep.failures)
    assert any("24.0 GiB KV cache is needed" in f for f in rep.failures)
    assert rep.server_exit_code == 1


def test_sigterm_ignoring_server_is_killed(tmp_path):
    pidfile = tmp_path / "srv.pid"
    rep = _run(tmp_path, "--ignore-sigterm", "--pidfile", str(pidfile), rounds=1, stop_grace=1)
    assert rep.verdict == PASS
    assert _dead(int(pidfile.read_text()))


# ----------------------------------------------------------------- CLI


def _cli(args, **kw):
    return subprocess.run(CLI + args, capture_output=True, text=True, cwd=ROOT, timeout=120, **kw)


def test_cli_json_and_exit_codes(tmp_path):
    (tmp_path / "m").mkdir()
    ok = _cli(
        [
            "smoke",
            "--model",
            str(tmp_path / "m"),
            "--server-cmd",
            _fake_cmd(),
            "--rounds",
            "1",
            "--concurrency",
            "2",
            "--max-tokens",
            "4",
            "--json",
        ]
    )
    assert ok.returncode == 0, ok.stderr
    d = json.loads(ok.stdout)
    assert d["verdict"] == PASS and d["schema"] == "build-image/smoke-report/v1"
    bad = _cli(
        [
            "smoke",
            "--model",
            str(tmp_path / "m"),
            "--server-cmd",
            _fake_cmd("--fail-500-at", "2"),
            "--rounds",
            "1",
            "--concurrency",
            "2",
            "--max-tokens",
            "4",
            "--json",
        ]
    )
    assert bad.returncode == 1 and json.loads(bad.stdout)["verdict"] == FAIL


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--local"], "--model"),
        (["--local", "--model", "/nonexistent/model"], "no such file or directory"),
        (["img:1", "--local", "--model", "."], "either IMAGE or --local"),
        (["--model", "."], "give an IMAGE"),
        (["--local", "--model", ".", "--concurrency", "0"], "--concurrency"),
    ],
)
def test_cli_bad_input_exit_2(args, msg):
    r = _cli(["smoke", *args])
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert msg in r.stderr + r.stdout


def test_ctrl_c_stops_the_server(tmp_path):
    (tmp_path / "m").mkdir()
    pidfile, child = tmp_path / "srv.pid", tmp_path / "child.pid"
    proc = subprocess.Popen(
        CLI
        + [
            "smoke",
            "--model",
            str(tmp_path / "m"),
            "--server-cmd",
            _fake_cmd("--boot-delay", "60", "--pidfile", str(pidfile), "--child-pidfile", str(child)),
            "--boot-timeout",
            "90",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not (pidfile.exists() and child.exists() and child.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pidfile.exists(), "the fake server never started"
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in out
    assert _dead(int(pidfile.read_text())) and _dead(int(child.read_text()))


# ----------------------------------------------------------------- preflight plan


def _tiny_checkpoint(d: Path, *, layers=8, kv_heads=8, head_dim=128, weights=1 << 20) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen3ForCausalLM"],
                "model_type": "qwen3",
                "hidden_size": 1024,
                "num_hidden_layers": layers,
                "num_attention_heads": 16,
                "num_key_value_heads": kv_heads,
                "head_dim": head_dim,
                "intermediate_size": 2048,
                "vocab_size": 1024,
                "torch_dtype": "bfloat16",
                "max_position_embeddings": 1 << 20,
            }
        )
    )
    header = json.dumps({"w": {"dtype": "BF16", "shape": [weights // 2], "data_offsets": [0, weights]}}).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * weights)
    return d


def test_plan_refuses_impossible_configuration_without_booting(tmp_path):
    model = _tiny_checkpoint(tmp_path / "m")
    pidfile = tmp_path / "srv.pid"
    args = [
        "smoke",
        "--model",
        str(model),
        "--server-cmd",
        _fake_cmd("--pidfile", str(pidfile)),
        "--gpu-memory",
        "1GiB",
        "--gpu-memory-utilization",
        "0.9",
        "--max-model-len",
        "1048576",
        "--rounds",
        "1",
        "--concurrency",
        "2",
        "--max-tokens",
        "4",
        "--json",
    ]
    r = _cli(args)
    assert r.returncode == 1, r.stderr
    d = json.loads(r.stdout)
    assert d["verdict"] == FAIL and d["refused_by_plan"] is True
    assert "DOES NOT FIT" in d["failures"][0] and d["plan"]["fits"] is False
    assert not pidfile.exists(), "the server must not start when the plan refuses"
    # --no-plan boots anyway (the fake server passes) and still reports the plan
    r2 = _cli(args + ["--no-plan"])
    assert r2.returncode == 0, r2.stderr
    d2 = json.loads(r2.stdout)
    assert d2["verdict"] == PASS and pidfile.exists() and d2["plan"]["fits"] is False


def test_plan_that_fits_is_reported(tmp_path):
    model = _tiny_checkpoint(tmp_path / "m")
    rep = run_smoke(
        SmokeConfig(
            model=str(model),
            server_cmd=_fake_cmd(),
            gpu_memory_bytes=80 << 30,
            max_model_len=4096,
            rounds=1,
            concurrency=2,
            max_tokens=4,
            prompt_tokens=8,
            stop_grace=2,
        )
    )
    assert rep.verdict == PASS
    assert rep.plan["fits"] is True and rep.plan["kv_tokens_per_gpu"] > 0


def test_checkpoint_tokenizer_covers_vocab(tmp_path):
    from tests.checkpoints import write_tokenizer

    write_tokenizer(tmp_path, 300)
    tok = json.loads((tmp_path / "tokenizer.json").read_text())
    ids = sorted(tok["model"]["vocab"].values())
    assert ids == list(range(300))
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["eos_token"] == "<eos>"


def test_config_from_serving(tmp_path):
    from builder.serving.smoke import config_from_serving
    from builder.spec import Serving

    s = Serving(
        tp=2,
        max_model_len=131072,
        gpu_memory_utilization=0.93,
        max_num_seqs=16,
        kv_cache_dtype="auto",
        gpu_memory="80GiB",
        gpus=8,
    )
    cfg = config_from_serving(s, model=str(tmp_path), image="reg/x:1", rounds=1)
    assert (cfg.tp, cfg.max_model_len, cfg.gpu_memory_utilization, cfg.max_num_seqs) == (2, 131072, 0.93, 16)
    assert cfg.kv_cache_dtype is None and cfg.image == "reg/x:1" and cfg.rounds == 1 and cfg.gpus == 8
    assert cfg.gpu_memory_bytes == 80 << 30
    with pytest.raises(TypeError):
        config_from_serving(s, model=str(tmp_path), nonsense=1)


# ----------------------------------------------------------------- docker mode (stand-in image, no GPU)

from tests.fx_docker import DOCKER, missing  # noqa: E402 - the CLI the tool itself runs


@pytest.fixture(scope="module")
def fake_vllm_image(standin_base_image, tmp_path_factory):
    """The stand-in base plus a `vllm` shim that runs the fake server (`vllm serve /model ...`)."""
    ctx = tmp_path_factory.mktemp("fake-vllm-image")
    (ctx / "fake_openai_server.py").write_bytes(FAKE.read_bytes())
    shim = ctx / "vllm"
    shim.write_text('#!/bin/sh\n[ "$1" = serve ] && shift\nexec python3 -u /opt/fake_openai_server.py "$@"\n')
    shim.chmod(0o755)
    (ctx / "Dockerfile").write_text(
        f"FROM {standin_base_image.ref}\nCOPY fake_openai_server.py /opt/\nCOPY vllm /usr/local/bin/vllm\n"
    )
    tag = "build-image-test/smoke-fake-vllm:1"
    r = subprocess.run(
        [DOCKER, "build", "--network=none", "-q", "-t", tag, str(ctx)],
        capture_output=True,
        text=True,
        env=dict(os.environ, DOCKER_BUILDKIT="1"),
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return tag


def _smoke_containers() -> list[str]:
    r = subprocess.run(
        [DOCKER, "ps", "-a", "-q", "--filter", "name=build-image-smoke-"], capture_output=True, text=True, timeout=60
    )
    return r.stdout.split()


@pytest.mark.slow
@pytest.mark.docker
def test_docker_mode_pass_and_cleanup(fake_vllm_image, tmp_path):
    rep = run_smoke(
        SmokeConfig(
            model=str(tmp_path),
            image=fake_vllm_image,
            docker_gpus=None,
            docker_bin=DOCKER,
            rounds=2,
            concurrency=4,
            max_tokens=8,
            prompt_tokens=16,
            boot_timeout=90,
            timeout=30,
            stop_grace=5,
        )
    )
    assert rep.verdict == PASS, (rep.failures, rep.log_tail)
    assert rep.mode == "docker" and "--pull=never" in rep.command and "--ipc=host" in rep.command
    assert rep.kv_cache["tokens"] == 3_024_928  # parsed from the container's log
    assert _smoke_containers() == []


@pytest.mark.slow
@pytest.mark.docker
def test_docker_mode_server_death_fails_and_removes_container(fake_vllm_image, tmp_path):
    rep = run_smoke(
        SmokeConfig(
            model=str(tmp_path),
            image=fake_vllm_image,
            docker_gpus=None,
            docker_bin=DOCKER,
            rounds=2,
            concurrency=4,
            max_tokens=8,
            prompt_tokens=16,
            boot_timeout=90,
            timeout=30,
            stop_grace=5,
            extra_args=["--die-at", "3"],
        )
    )
    assert rep.verdict == FAIL
    assert any("server process exited" in f for f in rep.failures), rep.failures
    assert _smoke_containers() == []


@pytest.mark.slow
@pytest.mark.docker
def test_docker_mode_missing_image_is_bad_input_not_a_verdict(docker_engine, tmp_path):
    # `docker run --pull=never` of an absent image used to be a FAIL (exit 1) carrying docker's 125
    with pytest.raises(BadInput, match="not in the local engine"):
        run_smoke(
            SmokeConfig(
                model=str(tmp_path), image="build-image-test/no-such-image:404", docker_gpus=None, docker_bin=DOCKER
            )
        )
    assert _smoke_containers() == []


def test_docker_mode_unreachable_engine_exits_8(tmp_path):
    if not shutil.which(DOCKER):
        missing("needs the docker CLI (no engine needed)")
    short = tempfile.mkdtemp(prefix="bi-", dir="/tmp")  # a socket path must fit 107 bytes; tmp_path may not
    try:
        r = _cli(
            ["smoke", "some/image:1", "--model", str(tmp_path)],
            env={**os.environ, "DOCKER_HOST": f"unix://{short}/no-engine.sock"},
        )
    finally:
        os.rmdir(short)
    assert r.returncode == 8, (r.returncode, r.stderr)
    assert "not reachable" in r.stderr and "Cannot connect to the Docker daemon" in r.stderr


def test_a_docker_host_socket_path_too_long_for_a_socket_is_named(tmp_path):
    """The docker CLI crashes (a Go panic) on a unix socket path over 107 bytes; the tool says why instead."""
    if not shutil.which(DOCKER):
        missing("needs the docker CLI (no engine needed)")
    sock = tmp_path / ("d" * 120) / "engine.sock"
    r = _cli(["smoke", "some/image:1", "--model", str(tmp_path)], env={**os.environ, "DOCKER_HOST": f"unix://{sock}"})
    assert r.returncode == 8, (r.returncode, r.stderr)
    assert f"the socket path is {len(str(sock))} bytes, over the 107" in r.stderr
    assert "panic" not in r.stderr and "goroutine" not in r.stderr


@pytest.mark.slow
def test_checkpoint_generators_write_the_ple_variants(tmp_path):
    """Needs torch + transformers >= 5.14 (Gemma 4): the 'checkpoints' extra, which scripts/setup.sh installs."""
    import transformers.models.gemma4  # noqa: F401 - an ImportError here is a failure, not a skip
    from safetensors import safe_open

    from tests.checkpoints import BUILDERS

    BUILDERS["gemma4-ple-numbered"](tmp_path / "n")
    BUILDERS["gemma4-ple-short"](tmp_path / "s")
    with safe_open(str(tmp_path / "n" / "model.safetensors"), "pt") as f:
        names = [k for k in f.keys() if "per_layer" in k and "embed_tokens" in k]
        assert sorted(names) == [f"model.language_model.embed_tokens_per_layer.shard_{i}.weight" for i in range(4)]
        assert sum(f.get_tensor(k).shape[0] for k in names) == 1024
    with safe_open(str(tmp_path / "s" / "model.safetensors"), "pt") as f:
        assert "embed_tokens_per_layer.shard_.weight" in f.keys()


# ----------------------------------------------------------------- review: cleanup, ordering, bounds, wiring


def test_second_ctrl_c_while_stopping_still_kills_the_server(tmp_path):
    """The first Ctrl-C starts the stop (SIGTERM + grace); an impatient second one used to
    abort the stop and leave the server and its engine child running. Now it only skips
    the grace period."""
    (tmp_path / "m").mkdir()
    pidfile, child = tmp_path / "srv.pid", tmp_path / "child.pid"
    proc = subprocess.Popen(
        CLI
        + [
            "smoke",
            "--model",
            str(tmp_path / "m"),
            "--server-cmd",
            _fake_cmd("--hang-at", "3", "--ignore-sigterm", "--pidfile", str(pidfile), "--child-pidfile", str(child)),
            "--rounds",
            "2",
            "--concurrency",
            "4",
            "--max-tokens",
            "4",
            "--timeout",
            "100",
            "--json",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        log_deadline = time.monotonic() + 30
        while time.monotonic() < log_deadline and not (pidfile.exists() and child.exists() and child.read_text()):
            time.sleep(0.1)
        assert pidfile.exists(), "the fake server never started"
        time.sleep(2)  # inside round 1: request 3 hangs
        proc.send_signal(signal.SIGINT)
        time.sleep(0.7)  # stopping: SIGTERM is ignored, the 15 s grace runs
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out[-500:], err[-2000:])
    assert time.monotonic() - t0 < 10, "the second Ctrl-C should cut the grace period short"
    assert json.loads(out)["interrupted"] is True
    assert _dead(int(pidfile.read_text())) and _dead(int(child.read_text()))


def test_root_cause_comes_first():
    """The CLI's one-line message is failures[0]: it must name the cause, not 'only 1 of 3 rounds ran'."""
    ok_round = summarize_round(
        1, [RequestResult(index=0, stream=True, ok=True, latency_s=0.1, output_tokens=4)], 0.1, 1
    )
    facts = parse_server_log(
        "(EngineCore pid=1) ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n"
    )
    _, failures = decide(
        rounds=[ok_round], expected_rounds=3, facts=facts, server_exit_code=None, server_exited=False, boot_error=None
    )
    assert failures[0].startswith("out-of-memory") and failures[-1] == "only 1 of 3 rounds ran"
    _, failures = decide(
        rounds=[],
        expected_rounds=3,
        facts=LogFacts(),
        server_exit_code=None,
        server_exited=False,
        boot_error=None,
        extra_failures=["interrupted (Ctrl-C / SIGTERM); server stopped"],
    )
    assert failures[0].startswith("interrupted")
    bad_round = summarize_round(
        1, [RequestResult(index=0, stream=True, ok=False, error="ConnectionResetError")], 0.1, 1
    )
    _, failures = decide(
        rounds=[bad_round], expected_rounds=3, facts=LogFacts(), server_exit_code=3, server_exited=True, boot_error=None
    )
    assert failures[0] == "server process exited (code 3)"


def test_oom_headline_on_the_cli(tmp_path):
    (tmp_path / "m").mkdir()
    r = _cli(
        [
            "smoke",
            "--model",
            str(tmp_path / "m"),
            "--server-cmd",
            _fake_cmd("--oom-at", "3"),
            "--rounds",
            "3",
            "--concurrency",
            "2",
            "--max-tokens",
            "4",
        ]
    )
    assert r.returncode == 1
    assert "smoke FAIL: out-of-memory in server log" in r.stderr


@pytest.mark.parametrize(
    "kwargs,msg",
    [
        ({"timeout": float("nan")}, "--timeout"),
        ({"boot_timeout": float("inf")}, "--boot-timeout"),
        ({"boot_timeout": 0}, "--boot-timeout"),
        ({"pp": 0}, "--pp"),
        ({"cpu_offload_gb": float("nan")}, "--cpu-offload-gb"),
    ],
)
def test_deadlines_must_be_finite(tmp_path, kwargs, msg):
    # a nan deadline never expires: `time.monotonic() > nan` is always False
    with pytest.raises(BadInput, match=msg):
        SmokeConfig(model=str(tmp_path), **kwargs).validate()


@pytest.mark.parametrize(
    "value,ok", [("141", False), ("garbage", False), ("0GiB", False), ("h200", True), ("80GB", True)]
)
def test_gpu_memory_flag_uses_the_planner_syntax(tmp_path, value, ok):
    model = _tiny_checkpoint(tmp_path / "m")
    r = _cli(
        [
            "smoke",
            "--model",
            str(model),
            "--server-cmd",
            _fake_cmd(),
            "--gpu-memory",
            value,
            "--max-model-len",
            "4096",
            "--rounds",
            "1",
            "--concurrency",
            "2",
            "--max-tokens",
            "4",
            "--json",
        ]
    )
    if ok:
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["plan"]["gpu_memory_bytes"] > 10**10
    else:  # a bare "141" used to be taken as 141 bytes
        assert r.returncode == 2 and "--gpu-memory" in r.stderr, (r.returncode, r.stderr)


def test_default_concurrency_against_the_fake_server(tmp_path):
    # the fake's listen backlog was 5: 16 simultaneous connects got "Connection reset by peer"
    rep = _run(tmp_path, rounds=1, concurrency=48, max_tokens=4)
    assert rep.verdict == PASS, rep.failures


def test_plan_uses_vllms_default_utilization_and_suggests(tmp_path):
    from builder.serving.plan import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION

    model = _tiny_checkpoint(tmp_path / "m")
    d = smoke.preflight_plan(SmokeConfig(model=str(model), gpu_memory_bytes=80 << 30, max_model_len=4096), SILENT)
    assert d["gpu_memory_utilization"] == VLLM_DEFAULT_GPU_MEMORY_UTILIZATION == 0.92
    # refused "with the plan's numbers and suggestions"
    rep = run_smoke(
        SmokeConfig(
            model=str(model),
            server_cmd=_fake_cmd(),
            gpu_memory_bytes=8 << 30,
            gpu_memory_utilization=0.9,
            max_model_len=1 << 20,
            rounds=1,
            concurrency=2,
            max_tokens=4,
            prompt_tokens=8,
        )
    )
    assert rep.refused_by_plan and "try: --max-model-len" in rep.failures[0]


def test_pp_offload_and_kv_dtype_reach_vllm_and_the_plan(tmp_path):
    from builder.serving.smoke import config_from_serving
    from builder.spec import Serving

    s = Serving(
        tp=2,
        pp=2,
        gpus=4,
        cpu_offload_gb=3.0,
        kv_cache_dtype="bf16",
        gpu_memory="80GiB",
        max_model_len=4096,
        gpu_memory_utilization=0.9,
    )
    model = _tiny_checkpoint(tmp_path / "m", weights=8 << 20)
    cfg = config_from_serving(s, model=str(model))
    flags = " ".join(build_local_command(cfg, 8000, ["vllm"]))
    # vLLM 0.26.0's --kv-cache-dtype choices have "bfloat16", not "bf16"
    assert "--pipeline-parallel-size 2" in flags and "--cpu-offload-gb 3" in flags
    assert "--kv-cache-dtype bfloat16" in flags and "bf16" not in flags
    d = smoke.preflight_plan(cfg, SILENT)
    assert (d["tp"], d["pp"], d["gpus"]) == (2, 2, 4) and d["cpu_offload_bytes"] == 3 << 30


def test_any_exception_names_the_cause_when_the_server_exits(tmp_path):
    # `--local` without vllm installed: python prints one ModuleNotFoundError line and exits 1
    line = (
        "/usr/bin/python3: Error while finding module specification for 'vllm.entrypoints.cli.main' "
        "(ModuleNotFoundError: No module named 'vllm')"
    )
    facts = parse_server_log("INFO starting\n" + line + "\n")
    _, failures = decide(
        rounds=[],
        expected_rounds=3,
        facts=facts,
        server_exit_code=1,
        server_exited=True,
        boot_error="server exited during boot (code 1) before /health answered",
    )
    assert failures == ["server exited during boot (code 1) before /health answered", f"server log: {line}"]
    # the specific vLLM lines still win over a generic one
    facts = parse_server_log("WARNING x ImportError: optional thing\n(EngineCore pid=1) ERROR ValueError: bad config\n")
    _, failures = decide(
        rounds=[], expected_rounds=1, facts=facts, server_exit_code=1, server_exited=True, boot_error=None
    )
    assert failures == [
        "server process exited (code 1)",
        "server log: ERROR ValueError: bad config",
        "only 0 of 1 rounds ran",
    ]


def test_refusal_and_bad_start_leave_no_log_behind(tmp_path, monkeypatch):
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))  # where mkstemp puts the temp log
    model = _tiny_checkpoint(tmp_path / "m")
    keep = tmp_path / "mine.log"
    keep.write_text("an earlier run\n")
    rep = run_smoke(
        SmokeConfig(
            model=str(model),
            server_cmd=_fake_cmd(),
            gpu_memory_bytes=8 << 30,
            max_model_len=1 << 20,
            log_file=str(keep),
            prompt_tokens=8,
            max_tokens=4,
        )
    )
    assert rep.refused_by_plan and keep.read_text() == "an earlier run\n"  # used to be truncated, then deleted
    with pytest.raises(BadInput, match="cannot start the server"):
        run_smoke(SmokeConfig(model=str(model), server_cmd="/nonexistent/vllm-serve --port {port}", plan=False))
    assert list(own_tmp.iterdir()) == []


def test_data_parallel_api_servers_are_not_a_restart_but_a_restart_is(tmp_path):
    # vLLM 0.26.0 defaults --api-server-count to the data-parallel size: each logs the start line
    rep = _run(tmp_path, "--api-servers", "2", rounds=1)
    assert rep.verdict == PASS, rep.failures
    rep = _run(tmp_path, "--restart-at", "3", rounds=2)
    assert rep.verdict == FAIL
    assert any("server restarted (1 start(s) logged after /health first answered)" in f for f in rep.failures), (
        rep.failures
    )


def test_plan_reads_extra_args_in_both_forms_and_steps_aside_for_a_fixed_kv_size(tmp_path):
    model = _tiny_checkpoint(tmp_path / "m")
    base = dict(model=str(model), gpu_memory_bytes=80 << 30, max_model_len=4096)
    d = smoke.preflight_plan(SmokeConfig(**base, extra_args=["--max-num-batched-tokens=2048"]), SILENT)
    assert d["max_num_batched_tokens"] == 2048
    d = smoke.preflight_plan(SmokeConfig(**base, extra_args=["--max-num-batched-tokens", "4096"]), SILENT)
    assert d["max_num_batched_tokens"] == 4096
    # the proof's parallel wave: --kv-cache-memory 2GiB at utilization 0.08 -- the plan must not refuse it
    notes: list[str] = []
    for extra in (["--kv-cache-memory", "2147483648"], ["--kv-cache-memory-bytes=2G"]):
        assert (
            smoke.preflight_plan(SmokeConfig(**base, gpu_memory_utilization=0.01, extra_args=extra), Recorder(notes))
            is None
        )
    assert all("fixes the KV cache size" in n for n in notes) and len(notes) == 2


def test_a_kv_dtype_the_planner_does_not_model_skips_the_plan_not_the_smoke(tmp_path):
    model = _tiny_checkpoint(tmp_path / "m")
    notes: list[str] = []
    cfg = SmokeConfig(model=str(model), gpu_memory_bytes=80 << 30, max_model_len=4096, kv_cache_dtype="fp8_ds_mla")
    assert smoke.preflight_plan(cfg, Recorder(notes)) is None  # used to be BadInput (exit 2)
    assert "fp8_ds_mla" in notes[0]
