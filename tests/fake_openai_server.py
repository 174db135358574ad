"""A small stand-in for `vllm serve` (OpenAI-compatible), for CPU tests of the smoke probe.

Standard library only.  It prints real vLLM 0.26.0 log lines to stdout (the
probe parses them from the server log), answers /health, /v1/models,
/v1/completions and /v1/chat/completions (plain and streaming SSE; a chat stream
opens with vLLM's role-only delta), and can inject failures, including a chat
template that does not render (``--broken-chat-template 400|500``: every chat
request answers that status with vLLM's error shape, completions still work).  The
completion requests are numbered from 1 in arrival order; the probe's warm-up
request is number 1, so round 1's requests are 2..1+concurrency.  Stream faults
(--drop-stream-at, --error-event-at K) hit the first streaming request >= K.

    python tests/fake_openai_server.py --port N [--boot-delay S] [--fail-500-at K ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BOOT_LINES = [  # real vLLM 0.26.0 lines (H200 run of scripts/gpu-proof.sh, model qwen3-b)
    "(APIServer pid=2855) INFO 11-30 03:07:58 [model.py:623] Resolved architecture: Qwen3ForCausalLM",
    "(EngineCore pid=2925) INFO 11-30 03:08:31 [default_loader.py:430] Loading weights took 0.03 seconds",
    "(EngineCore pid=2925) INFO 11-30 03:08:32 [model_runner.py:305] Model loading took 0.29 GiB and 1.316428 seconds",
    "(EngineCore pid=2925) INFO 11-30 03:08:34 [gpu_worker.py:560] Available KV cache memory: 69.24 GiB",
    "(EngineCore pid=2925) INFO 11-30 03:08:34 [kv_cache_utils.py:2177] GPU KV cache size: 3,024,928 tokens",
    "(EngineCore pid=2925) INFO 11-30 03:08:34 [kv_cache_utils.py:2178] Maximum concurrency for 4,096 tokens per "
    "request: 738.51x",
    "(EngineCore pid=2925) INFO 11-30 03:08:34 [gpu_worker.py:857] Free memory on device (139.29/139.8 GiB) "
    "on startup. "
    "Desired GPU memory utilization is (0.5, 69.9 GiB). Actual usage is 0.29 GiB for weight, 0.15 GiB for peak "
    "activation, 0.22 GiB for non-torch memory, and 0.0 GiB for CUDAGraph memory.",
    "(EngineCore pid=2925) INFO 11-30 03:08:35 [core.py:347] init engine (profile, create kv cache, warmup "
    "model) took 2.45 s",
    "(APIServer pid=2855) INFO 11-30 03:08:35 [api_server.py:677] Starting vLLM server on http://127.0.0.1:41627",
    "(APIServer pid=2855) INFO:     Application startup complete.",
]
OOM_LINE = (  # torch's message, as vLLM's engine core logs it when a forward pass runs out of memory
    "(EngineCore pid=2925) ERROR 11-30 03:11:02 [core.py:1012] torch.OutOfMemoryError: CUDA out of memory. Tried to "
    "allocate 2.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 1.06 GiB is free."
)


VOCAB = 1000  # the toy model's vocabulary (token ids 0..999)


def toy_logprobs(prev: int, position: int, seed: int, noise: float) -> list[float]:
    """The toy model: log-softmax over VOCAB of pseudo-random logits that depend on the
    previous token, the model seed and (for --logprob-noise) the position.  Deterministic."""
    import math
    import random

    rng = random.Random(seed * 1_000_003 + prev)
    logits = [rng.gauss(0.0, 3.0) for _ in range(VOCAB)]
    if noise:
        jitter = random.Random(seed * 7_919 + prev * 31 + position)
        logits = [x + jitter.uniform(-noise, noise) for x in logits]
    m = max(logits)
    lse = m + math.log(sum(math.exp(x - m) for x in logits))
    return [x - lse for x in logits]


def toy_generate(prompt: list[int], n: int, seed: int, noise: float) -> tuple[list[int], list[float]]:
    toks: list[int] = []
    lps: list[float] = []
    prev = prompt[-1] if prompt else 0
    for i in range(n):
        lp = toy_logprobs(prev, len(prompt) + i, seed, noise)
        t = max(range(VOCAB), key=lp.__getitem__)
        toks.append(t)
        lps.append(lp[t])
        prev = t
    return toks, lps


def toy_prompt_logprobs(prompt: list[int], k: int, seed: int, noise: float) -> list:
    """vLLM's ``prompt_logprobs`` shape: None for the first token, then {token_id: Logprob} with
    the actual token and the top-k, ranks from 1."""
    out: list = [None]
    for j in range(1, len(prompt)):
        lp = toy_logprobs(prompt[j - 1], j, seed, noise)
        order = sorted(range(VOCAB), key=lambda t: -lp[t])
        rank = {t: r + 1 for r, t in enumerate(order)}
        entry = {str(t): {"logprob": lp[t], "rank": rank[t], "decoded_token": f"w{t}"} for t in order[:k]}
        entry[str(prompt[j])] = {"logprob": lp[prompt[j]], "rank": rank[prompt[j]], "decoded_token": f"w{prompt[j]}"}
        out.append(entry)
    return out


def log(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class State:
    def __init__(self, args):
        self.args = args
        self.t0 = time.monotonic()
        self.count = 0
        self.lock = threading.Lock()
        self.pending: dict[str, list[int]] = {}

    def next_index(self) -> int:
        with self.lock:
            self.count += 1
            return self.count

    def take_stream_fault(self, kind: str, k: int) -> bool:
        """Stream faults hit the first *streaming* request numbered >= K."""
        with self.lock:
            pending = self.pending.setdefault(kind, sorted(getattr(self.args, kind)))
            for K in pending:
                if k >= K:
                    pending.remove(K)
                    return True
            return False


def make_handler(state: State):
    a = state.args

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet access log
            pass

        def _json(self, code: int, obj) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                if time.monotonic() - state.t0 < a.boot_delay:
                    self._json(503, {"status": "loading"})
                else:
                    self._json(200, {})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": a.model_id, "object": "model"}]})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._json(404, {"error": "not found"})
                return
            chat = self.path == "/v1/chat/completions"
            k = state.next_index()
            if k in a.die_at:
                log("(EngineCore pid=2925) ERROR 11-30 03:11:05 [core.py:1012] EngineCore encountered a fatal error.")
                os._exit(3)
            if k in a.oom_at:
                log(OOM_LINE)
            if k in a.restart_at:  # as a supervisor restarting the server would log it
                for line in BOOT_LINES:
                    log(line.replace("pid=2855", "pid=3999").replace("pid=2925", "pid=4011"))
            if k in a.fail_500_at:
                self._json(500, {"error": {"message": "Internal Server Error", "type": "InternalServerError"}})
                return
            if k in a.hang_at:
                time.sleep(3600)
            if body.get("model") != a.model_id:
                self._json(404, {"error": {"message": f"model {body.get('model')!r} does not exist"}})
                return
            if chat and a.broken_chat_template:
                # what vLLM answers when the chat template cannot be rendered
                code = a.broken_chat_template
                msg = (
                    "jinja2.exceptions.TemplateSyntaxError: unexpected '}' in chat template"
                    if code == 500
                    else "As of transformers v4.44, default chat template is no longer allowed, so you must "
                    "provide a chat template if the tokenizer does not define one."
                )
                self._json(
                    code,
                    {
                        "object": "error",
                        "message": msg,
                        "type": "BadRequestError" if code == 400 else "InternalServerError",
                        "code": code,
                    },
                )
                return
            if chat and not (isinstance(body.get("messages"), list) and body["messages"]):
                self._json(400, {"object": "error", "message": "messages must be a non-empty list", "code": 400})
                return
            n = int(body.get("max_tokens") or 16)
            prompt = body.get("prompt")
            wants_model = any(body.get(f) is not None for f in ("logprobs", "prompt_logprobs", "return_token_ids"))
            if (
                wants_model
                and not body.get("stream")
                and isinstance(prompt, list)
                and all(isinstance(t, int) for t in prompt)
            ):
                # token-id prompts asking for logprobs or token ids are answered by the toy model
                if any(not 0 <= t < VOCAB for t in prompt):
                    self._json(400, {"error": {"message": f"token id out of vocabulary (0..{VOCAB - 1})"}})
                    return
                toks, lps = toy_generate(prompt, n, a.model_seed, a.logprob_noise)
                choice = {"index": 0, "text": "".join(f" w{t}" for t in toks), "finish_reason": "length"}
                if body.get("return_token_ids"):
                    choice["token_ids"] = toks
                    choice["prompt_token_ids"] = prompt
                if body.get("logprobs") is not None:
                    choice["logprobs"] = {
                        "tokens": [f"w{t}" for t in toks],
                        "token_logprobs": lps,
                        "top_logprobs": [],
                        "text_offset": [],
                    }
                if body.get("prompt_logprobs") is not None:
                    choice["prompt_logprobs"] = toy_prompt_logprobs(
                        prompt, int(body["prompt_logprobs"]), a.model_seed, a.logprob_noise
                    )
                self._json(
                    200,
                    {
                        "id": f"cmpl-{k}",
                        "object": "text_completion",
                        "model": a.model_id,
                        "choices": [choice],
                        "usage": {
                            "prompt_tokens": len(prompt),
                            "completion_tokens": n,
                            "total_tokens": len(prompt) + n,
                        },
                    },
                )
                return
            if not body.get("stream"):
                time.sleep(a.token_delay * n)
                text = " ".join(f"w{i}" for i in range(n))
                choice = (
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                    if chat
                    else {"index": 0, "text": text, "finish_reason": "length"}
                )
                self._json(
                    200,
                    {
                        "id": f"{'chatcmpl' if chat else 'cmpl'}-{k}",
                        "object": "chat.completion" if chat else "text_completion",
                        "model": a.model_id,
                        "choices": [choice],
                        "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n},
                    },
                )
                return
            drop = state.take_stream_fault("drop_stream_at", k)
            err = state.take_stream_fault("error_event_at", k)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            obj = "chat.completion.chunk" if chat else "text_completion"
            try:
                if chat:  # vLLM's first chat chunk carries only the role
                    first = {
                        "id": f"chatcmpl-{k}",
                        "object": obj,
                        "model": a.model_id,
                        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                    }
                    self.wfile.write(f"data: {json.dumps(first)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(a.token_delay)
                for i in range(n):
                    if drop and i == n // 2:
                        self.wfile.flush()
                        self.connection.shutdown(2)
                        return
                    if err and i == n // 2:
                        ev = {"error": {"object": "error", "message": "engine error during generation", "code": 500}}
                        self.wfile.write(f"data: {json.dumps(ev)}\n\n".encode())
                        self.wfile.flush()
                        break
                    piece = {"delta": {"content": f" w{i}"}} if chat else {"text": f" w{i}"}
                    chunk = {
                        "id": f"cmpl-{k}",
                        "object": obj,
                        "model": a.model_id,
                        "choices": [{"index": 0, **piece, "finish_reason": None}],
                    }
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(a.token_delay)
                usage = {
                    "id": f"cmpl-{k}",
                    "object": obj,
                    "model": a.model_id,
                    "choices": [],
                    "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n},
                }
                self.wfile.write(f"data: {json.dumps(usage)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass

    return H


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default=None, help="ignored (as `vllm serve MODEL`)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model-id", "--served-model-name", dest="model_id", default="fake-model")
    p.add_argument("--model-seed", type=int, default=0, help="the toy model's weights (token-id prompts)")
    p.add_argument("--logprob-noise", type=float, default=0.0, help="per-position logit jitter (run-to-run noise)")
    p.add_argument("--boot-delay", type=float, default=0.0, help="/health answers 503 for this long")
    p.add_argument("--token-delay", type=float, default=0.001)
    p.add_argument("--exit-during-boot", action="store_true", help="log a ValueError and exit 1 before serving")
    p.add_argument("--ignore-sigterm", action="store_true", help="needs SIGKILL to stop")
    p.add_argument(
        "--child-pidfile", default=None, help="spawn a sleeping child (like the engine core) and write its pid"
    )
    p.add_argument("--pidfile", default=None)
    p.add_argument("--record", default=None, help="write {argv, env} as JSON here (what the server was started with)")
    p.add_argument("--no-kv-lines", action="store_true")
    p.add_argument(
        "--api-servers",
        type=int,
        default=1,
        help="log 'Starting vLLM server on' once per API server (vLLM's data-parallel default)",
    )
    p.add_argument(
        "--broken-chat-template",
        type=int,
        choices=(400, 500),
        default=None,
        help="every /v1/chat/completions request answers this status (the template does not render)",
    )
    for name in ("fail-500-at", "drop-stream-at", "error-event-at", "die-at", "oom-at", "hang-at", "restart-at"):
        p.add_argument(f"--{name}", type=int, action="append", default=[])
    a, _unknown = p.parse_known_args(argv)  # vLLM serving flags are accepted and ignored
    if a.record:
        with open(a.record, "w") as fh:
            json.dump({"argv": list(sys.argv[1:] if argv is None else argv), "env": dict(os.environ)}, fh)
    if a.pidfile:
        with open(a.pidfile, "w") as fh:
            fh.write(str(os.getpid()))
    if a.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if a.child_pidfile:
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)",
            ]
        )
        with open(a.child_pidfile, "w") as fh:
            fh.write(str(child.pid))
    for line in BOOT_LINES[:2]:
        log(line)
    if a.exit_during_boot:
        log("(EngineCore pid=2422) ERROR 11-30 03:06:53 [core.py:1330] EngineCore failed to start.")
        log(
            "(EngineCore pid=2422) ERROR 11-30 03:06:53 [core.py:1330] ValueError: To serve at least one request with "
            "the model's max seq len (1048576), (24.0 GiB KV cache is needed, which is larger than the available KV "
            "cache memory (10.51 GiB). Based on the available memory, the estimated maximum model length is 459232."
        )
        log(
            "(APIServer pid=2283) RuntimeError: Engine core initialization failed. See root cause above. Failed "
            "core proc(s): {}"
        )
        return 1
    for line in BOOT_LINES[2:]:
        if a.no_kv_lines and "KV cache" in line or a.no_kv_lines and "concurrency" in line:
            continue
        if "Starting vLLM server on" in line:
            for i in range(a.api_servers):
                log(
                    line
                    if a.api_servers == 1
                    else line.replace("(APIServer pid=2855)", f"(ApiServer_{i} pid={2855 + i})")
                )
            continue
        log(line)
    # the listen backlog must hold a whole round (the default of 5 resets connections
    # beyond it, so the probe's default --concurrency 16 failed against this server)
    ThreadingHTTPServer.request_queue_size = 256
    srv = ThreadingHTTPServer((a.host, a.port), make_handler(State(a)))
    srv.daemon_threads = True
    srv.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
