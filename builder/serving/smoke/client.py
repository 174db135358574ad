"""The smoke client: the requests a smoke run sends to an OpenAI-compatible
server (vLLM's own, or Ray Serve's HTTP proxy in front of it) and what it reads
back.

Prompts and request bodies are pure; :func:`post_completion` is one request to
``/v1/completions`` or, for a body with ``messages``, ``/v1/chat/completions``
(SSE streams read line by line, an ``error`` event or a missing ``[DONE]`` is a
failure; a chat stream's time to first token is its first content delta, not
the role-only chunk); :func:`run_round` sends ``concurrency`` requests at once.  Standard
library only (``http.client``), so the smoke test runs on a bare GPU host.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.errors import BadInput
from builder.validate import load_json, read_bounded

WARMUP_TOKENS = 8  # the greedy warm-up request: first-token time + an output fingerprint
COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"


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
    kind: str = "completion"  # completion | chat


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
        "ignore_eos": True,  # vLLM extension: generate exactly max_tokens
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def chat_body(model_id: str, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    """A /v1/chat/completions body: the prompt as one user message, so the server renders it
    through the model's chat template (a broken template fails here, not in completions)."""
    body: dict[str, Any] = {
        "model": model_id,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def endpoint_of(body: dict[str, Any]) -> tuple[str, str]:
    """(path, kind) a body is sent to."""
    return (CHAT_PATH, "chat") if "messages" in body else (COMPLETIONS_PATH, "completion")


def _choice_text(choice: dict[str, Any], chat: bool, stream: bool) -> str:
    if not chat:
        return str(choice.get("text") or "")
    part = choice.get("delta" if stream else "message") or {}
    return str(part.get("content") or "") if isinstance(part, dict) else ""


def model_vocab_size(model_dir: str) -> int | None:
    cfg_path = Path(model_dir) / "config.json"
    try:  # the bounded reader: a FIFO or a huge file is no config (the checkpoint checks name it)
        cfg = load_json(read_bounded(cfg_path, "config.json"), str(cfg_path))
    except (BadInput, ValueError):
        return None
    for c in (cfg, cfg.get("text_config") or {}):
        v = c.get("vocab_size") if isinstance(c, dict) else None
        if isinstance(v, int) and v > 0:
            return v
    return None


def http_get(host: str, port: int, path: str, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def post_json(host: str, port: int, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One non-streaming JSON POST; a non-200 answer or a non-object body raises ValueError."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status != 200:
            text = raw[:2000].decode("utf-8", "replace").strip().replace("\n", " ")
            raise ValueError(f"{path} answered HTTP {resp.status}: {text[:300]}")
        data = json.loads(raw)
        if not isinstance(data, dict) or not data.get("choices"):
            raise ValueError(f"{path} answered without choices")
        return data
    finally:
        conn.close()


def post_completion(host: str, port: int, body: dict[str, Any], timeout: float, index: int) -> RequestResult:
    """One /v1/completions (or, with ``messages``, /v1/chat/completions) request; streaming
    bodies are read as SSE and any ``error`` event or a missing ``[DONE]`` is a failure."""
    stream = bool(body.get("stream"))
    path, kind = endpoint_of(body)
    chat = kind == "chat"
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    res = RequestResult(index=index, stream=stream, ok=False, kind=kind)
    try:
        payload = json.dumps(body).encode()
        conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        res.status = resp.status
        if resp.status != 200:
            text = resp.read(2000).decode("utf-8", "replace").strip().replace("\n", " ")
            res.error = f"HTTP {resp.status}: {text[:300]}"
            return res
        if not stream:
            return _read_response(resp, res, chat, t0)
        return _read_stream(resp, res, chat, t0, timeout)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        kind = "timeout" if isinstance(exc, (socket.timeout, TimeoutError)) else type(exc).__name__
        res.error = f"{kind}: {exc}"[:300]
        return res
    finally:
        conn.close()


def _read_response(resp: http.client.HTTPResponse, res: RequestResult, chat: bool, t0: float) -> RequestResult:
    """A non-streaming answer: its first choice's text and the usage's token count."""
    data = json.loads(resp.read())
    if "error" in data and data["error"]:
        res.error = f"error object in response: {str(data['error'])[:300]}"
        return res
    usage = data.get("usage") or {}
    res.output_tokens = int(usage.get("completion_tokens") or 0)
    if not data.get("choices"):
        res.error = "response has no choices"
        return res
    res.text = _choice_text(data["choices"][0], chat, stream=False)
    if chat and not res.text and res.output_tokens:
        res.error = "chat response has no message content"
        return res
    res.latency_s = time.monotonic() - t0
    res.ok = True
    return res


@dataclass
class _Stream:
    """What an SSE stream has delivered so far."""

    done: bool = False  # the [DONE] event arrived
    chunks: int = 0
    parts: list[str] = field(default_factory=list)
    usage_tokens: int | None = None


def _read_stream(
    resp: http.client.HTTPResponse, res: RequestResult, chat: bool, t0: float, timeout: float
) -> RequestResult:
    """A streaming answer, read event by event until [DONE]; ``res.error`` says why not."""
    deadline = t0 + timeout
    st = _Stream()
    while not st.done:
        if time.monotonic() > deadline:
            res.error = f"timeout after {timeout:g}s inside the stream"
            return res
        raw = resp.readline()
        if not raw:
            break
        _stream_line(raw.decode("utf-8", "replace").strip(), res, chat, t0, st)
        if res.error:
            return res
    if not st.done:
        res.error = f"stream ended without [DONE] after {st.chunks} chunks (dropped)"
        return res
    res.output_tokens = int(st.usage_tokens if st.usage_tokens is not None else st.chunks)
    res.text = "".join(st.parts)
    res.latency_s = time.monotonic() - t0
    res.ok = True
    return res


def _stream_line(line: str, res: RequestResult, chat: bool, t0: float, st: _Stream) -> None:
    """One line of the stream: an event that fails the request sets ``res.error``."""
    if not line or line.startswith(":"):
        return
    if line.startswith("event:") and "error" in line:
        res.error = f"error event in stream: {line[:200]}"
        return
    if not line.startswith("data:"):
        return
    data_s = line[5:].strip()
    if data_s == "[DONE]":
        st.done = True
        return
    try:
        data = json.loads(data_s)
    except ValueError:
        res.error = f"malformed stream event: {data_s[:200]}"
        return
    if isinstance(data, dict) and data.get("error"):
        res.error = f"error event in stream: {str(data['error'])[:300]}"
        return
    if data.get("choices"):
        piece = _choice_text(data["choices"][0], chat, stream=True)
        if chat and not piece:
            return  # the role-only first chunk (or an empty delta) is no token
        if res.ttft_s is None:
            res.ttft_s = time.monotonic() - t0
        st.chunks += 1
        st.parts.append(piece)
    if data.get("usage"):
        st.usage_tokens = data["usage"].get("completion_tokens")


@dataclass
class RoundRun:
    """The raw outcome of one round: the finished requests (by index), its wall
    time, how many were still running at the deadline, and whether the server
    died during it."""

    results: list[RequestResult]
    wall_s: float
    pending: int = 0
    server_died: bool = False
    notes: list[str] = field(default_factory=list)


def run_round(
    host: str, port: int, bodies: list[dict[str, Any]], *, timeout: float, alive: Callable[[], bool]
) -> RoundRun:
    """Send ``bodies`` at once (one thread each, released together by a barrier);
    abandoned early when ``alive()`` turns false or after ``timeout`` (+5 s)."""
    n = len(bodies)
    results: list[RequestResult] = []
    pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="smoke")
    barrier = threading.Barrier(n)

    def one(i: int) -> RequestResult:
        try:
            barrier.wait(timeout=30)
        except threading.BrokenBarrierError:
            pass
        return post_completion(host, port, bodies[i], timeout, i)

    t0 = time.monotonic()
    futures = {pool.submit(one, i) for i in range(n)}
    pending = set(futures)
    deadline = t0 + timeout + 5
    died = False
    try:
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for f in done:
                results.append(f.result())
            if not alive():
                # give in-flight requests a moment to report their own errors
                done, pending = wait(pending, timeout=2)
                results.extend(f.result() for f in done)
                died = True
                break
            if time.monotonic() > deadline:
                break
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return RoundRun(
        results=sorted(results, key=lambda r: r.index),
        wall_s=time.monotonic() - t0,
        pending=len(pending),
        server_died=died,
    )
