"""The output-equivalence gate: did this server compute what the reference server computed?

A smoke PASS says the engine serves; it does not say the weights it serves are the
checkpoint's (vLLM 0.26.0 boots a per-layer-embedding checkpoint whose table it never
loaded, and answers every request).  ``smoke --save-reference FILE`` records, for a
fixed prompt set:

* the greedy continuation (``temperature 0``, ``ignore_eos``, ``max_tokens`` tokens) of
  each prompt, as token ids;
* the log-probability the model gives each of those tokens, teacher-forced (the prompt
  followed by the continuation, scored with vLLM's ``prompt_logprobs``), and the margin
  to the best other token at each position;
* the prompts and the sampling settings, with a hash over both, and the model's
  identity (architecture, shapes, vocabulary and tokenizer files) and config hash.

``smoke --reference FILE`` sends the same prompts and compares: the index of the first
differing greedy token, and the maximum |Δ logprob| over the reference tokens (both runs
teacher-forced on the reference continuation, so every position is compared even after
a divergence).  FAIL when a logprob differs by more than ``logprob_tolerance`` or a
greedy token differs where the reference's margin was larger than ``tie_margin`` (a
divergence at a near-tie is run-to-run noise).  The defaults come from measured H200
noise (docs/gpu-proof-results.md).  A reference from another model, or recorded with
another prompt set, is bad input (exit 2), not a FAIL.

Pure functions for the file, the prompt set and the comparison; the two HTTP requests
per prompt go through :mod:`.client`.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builder.credentials import redact_value
from builder.errors import BadInput
from builder.report import render_json
from builder.serving.smoke.client import post_json
from builder.util import atomic_write_text, is_own_output, output_lock, write_target
from builder.validate import load_json, read_bounded_text

SCHEMA = "build-image/smoke-reference/v1"
PROMPTS = 8  # prompts in the set
PROMPT_TOKENS = 32  # tokens per prompt
MAX_TOKENS = 16  # greedy tokens per prompt
TOP_K = 2  # prompt_logprobs: the actual token plus the best 2
PROMPT_SEED = 20261201

# Thresholds (nats), from run-to-run noise measured on the H200 (docs/gpu-proof-results.md):
# the same engine settings twice gave bit-identical logprobs (eager twice, CUDA graphs twice,
# two models); an eager reference against a CUDA-graph run differed by at most 0.037 (and the
# plain- vs long-name PLE table, both loaded, by 0.0039); an unloaded PLE table by 0.143-0.192.
# The tolerance is twice the largest noise; a greedy token may flip where the reference's margin
# is within what two such errors can close (2 x tolerance).
LOGPROB_TOLERANCE = 0.075
TIE_MARGIN = 0.15

# What makes two checkpoints "the same model" for the gate: token ids and shapes mean the
# same thing.  Other config keys (layer_types, rope settings, ...) may differ; the
# comparison then reports which ones.
_IDENTITY_KEYS = (
    "architectures",
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "hidden_size_per_layer_input",
    "vocab_size_per_layer_input",
    "tie_word_embeddings",
)
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "special_tokens_map.json",
)


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _sha(obj: Any) -> str:
    return hashlib.sha256(_canonical(obj)).hexdigest()


# --------------------------------------------------------------------------- model and prompt identity


def _load_config(model_dir: str) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.exists():
        raise BadInput(f"smoke: {path}: no config.json; the output-equivalence gate needs the model's config")
    try:
        cfg = load_json(read_bounded_text(path, "smoke: model config"), f"smoke: {path}")
    except FileNotFoundError:
        raise BadInput(f"smoke: {path}: no config.json; the output-equivalence gate needs the model's config") from None
    except (OSError, ValueError) as exc:
        raise BadInput(f"smoke: {path}: cannot read the model config ({exc})") from None
    if not isinstance(cfg, dict):
        raise BadInput(f"smoke: {path}: the model config is not a JSON object")
    return cfg


def model_identity(model_dir: str) -> dict[str, Any]:
    """The fields that make two checkpoints the same model for the gate, the hash over them,
    and the hash of the whole config.json."""
    cfg = _load_config(model_dir)
    fields: dict[str, Any] = {}
    for scope, c in (("", cfg), ("text_config.", cfg.get("text_config"))):
        if isinstance(c, dict):
            for k in _IDENTITY_KEYS:
                if k in c:
                    fields[scope + k] = c[k]
    tok: dict[str, str] = {}
    for name in _TOKENIZER_FILES:
        p = Path(model_dir) / name
        if p.is_file():
            tok[name] = hashlib.sha256(p.read_bytes()).hexdigest()
    return {
        "fields": fields,
        "tokenizer_sha256": tok,
        "identity_sha256": _sha({"fields": fields, "tokenizer": tok}),
        "config_sha256": _sha(cfg),
        "config": cfg,
    }


def vocab_size(identity: dict[str, Any]) -> int:
    f = identity["fields"]
    v = f.get("vocab_size") or f.get("text_config.vocab_size")
    if not isinstance(v, int) or v < 8:
        raise BadInput(
            "smoke: the model config has no usable vocab_size; the output-equivalence gate "
            "sends token-id prompts and needs it"
        )
    return v


def sampling() -> dict[str, Any]:
    return {"temperature": 0.0, "max_tokens": MAX_TOKENS, "ignore_eos": True, "prompt_logprobs": TOP_K}


def prompt_set(vocab: int) -> list[list[int]]:
    """The fixed prompt set: PROMPTS prompts of PROMPT_TOKENS token ids, away from the
    special tokens at the low end of the vocabulary."""
    rng = random.Random(PROMPT_SEED)
    lo = min(100, vocab // 4)
    return [[rng.randrange(lo, vocab - 1) for _ in range(PROMPT_TOKENS)] for _ in range(PROMPTS)]


def prompt_set_sha256(prompts: list[list[int]], sampling_: dict[str, Any]) -> str:
    return _sha({"prompts": prompts, "sampling": sampling_})


# --------------------------------------------------------------------------- the reference file


@dataclass
class Reference:
    path: str
    model: dict[str, Any]
    sampling: dict[str, Any]
    prompt_set_sha256: str
    prompts: list[dict[str, Any]]  # {"prompt", "tokens", "logprobs", "margins", "text"}
    recorded: dict[str, Any] = field(default_factory=dict)


def _bad(path: str, why: str) -> BadInput:
    return BadInput(f"smoke: --reference {path}: {why}")


def load_reference(path: str) -> Reference:
    """Read and check a reference file; anything malformed is BadInput naming the field."""
    if not Path(path).exists():
        raise _bad(path, "no such file")
    try:
        doc = load_json(read_bounded_text(path, "smoke: --reference"), f"smoke: --reference {path}")
    except FileNotFoundError:
        raise _bad(path, "no such file") from None
    except (OSError, ValueError) as exc:
        raise _bad(path, f"not a JSON reference file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise _bad(path, f"'schema' must be {SCHEMA!r} (written by `build-image smoke --save-reference`)")
    model, samp, prompts = doc.get("model"), doc.get("sampling"), doc.get("prompts")
    if not isinstance(model, dict) or not isinstance(model.get("identity_sha256"), str):
        raise _bad(path, "'model.identity_sha256' is missing")
    if not isinstance(samp, dict):
        raise _bad(path, "'sampling' is missing")
    if not isinstance(prompts, list) or not prompts:
        raise _bad(path, "'prompts' must be a non-empty list")
    for i, p in enumerate(prompts):
        if not isinstance(p, dict):
            raise _bad(path, f"'prompts[{i}]' is not an object")
        for key in ("prompt", "tokens"):
            v = p.get(key)
            if not isinstance(v, list) or not v or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
                raise _bad(path, f"'prompts[{i}].{key}' must be a non-empty list of token ids")
        for key in ("logprobs", "margins"):
            v = p.get(key)
            if (
                not isinstance(v, list)
                or len(v) != len(p["tokens"])
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)
            ):
                raise _bad(path, f"'prompts[{i}].{key}' must hold one finite number per token of 'tokens'")
    digest = prompt_set_sha256([p["prompt"] for p in prompts], samp)
    if doc.get("prompt_set_sha256") != digest:
        raise _bad(path, "'prompt_set_sha256' does not match its prompts and sampling (the file was edited or cut)")
    return Reference(
        path=path,
        model=model,
        sampling=samp,
        prompt_set_sha256=digest,
        prompts=prompts,
        recorded=doc.get("recorded") or {},
    )


def check_compatible(ref: Reference, identity: dict[str, Any]) -> list[str]:
    """BadInput when the reference is for another model or another prompt set; else the
    config keys that differ (reported, compared anyway)."""
    if ref.model.get("identity_sha256") != identity["identity_sha256"]:
        theirs = ref.model.get("fields") or {}
        ours = identity["fields"]
        diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        tok = "the tokenizer files differ" if ref.model.get("tokenizer_sha256") != identity["tokenizer_sha256"] else ""
        what = ", ".join(f"{k}: {theirs.get(k)!r} vs {ours.get(k)!r}" for k in diff[:6]) or tok or "identity hash"
        raise _bad(
            ref.path,
            f"recorded for another model ({what}); a reference compares one model's outputs "
            "across engines, images or patch levels",
        )
    expected = prompt_set_sha256(prompt_set(vocab_size(identity)), sampling())
    if ref.prompt_set_sha256 != expected:
        raise _bad(
            ref.path,
            "recorded with another prompt set or sampling than this build-image uses; "
            "record it again with --save-reference",
        )
    theirs_cfg = ref.model.get("config") or {}
    ours_cfg = redact_value(identity["config"])  # as the reference file holds it
    return sorted(k for k in set(theirs_cfg) | set(ours_cfg) if theirs_cfg.get(k) != ours_cfg.get(k))


def reference_document(
    identity: dict[str, Any], prompts: list[list[int]], outputs: list[dict[str, Any]], recorded: dict[str, Any]
) -> dict[str, Any]:
    samp = sampling()
    return {
        "schema": SCHEMA,
        "model": {k: identity[k] for k in ("fields", "tokenizer_sha256", "identity_sha256", "config_sha256", "config")},
        "sampling": samp,
        "prompt_set_sha256": prompt_set_sha256(prompts, samp),
        "recorded": recorded,
        "prompts": [{"prompt": p, **o} for p, o in zip(prompts, outputs)],
    }


#: the first lines of a reference file build-image wrote (render_json's two-space indent; one space before)
REFERENCE_MARKS = (f'  "schema": "{SCHEMA}"', f' "schema": "{SCHEMA}"')


def check_reference_output(path: str) -> None:
    """The output rule for ``--save-reference``, checked before the server starts: a device node, FIFO or
    directory is refused, and so is an existing file that is not a reference build-image wrote (a user's
    file is never replaced); a symlink is written through."""
    target = write_target(path)
    if target.exists() and not is_own_output(target, REFERENCE_MARKS):
        raise BadInput(
            f"smoke: --save-reference {path} exists and is not a smoke reference written by build-image; "
            "it is not replaced.",
            hint="name a new file (or remove that one first).",
        )


def write_reference(path: str, doc: dict[str, Any]) -> None:
    """Atomically, under the output's lock, through the redacting JSON writer (a credential in the model's
    config.json, ``_name_or_path`` say, is masked; the compared hashes are of the model's files, unchanged)."""
    with output_lock(path):
        check_reference_output(path)
        atomic_write_text(path, render_json(doc))


# --------------------------------------------------------------------------- the comparison (pure)


@dataclass
class PromptComparison:
    index: int
    first_diff: int | None  # first differing greedy token (None: all equal)
    diverged_at_tie: bool  # the reference's margin there was <= tie_margin
    max_abs_dlogprob: float
    worst_token: int  # position of the max |Δ logprob|


@dataclass
class Equivalence:
    verdict: str
    failures: list[str]
    reference: str
    prompts: int
    tokens_per_prompt: int
    first_diff: int | None  # smallest first-differing index over the prompts
    prompts_diverged: int
    max_abs_dlogprob: float
    logprob_tolerance: float
    tie_margin: float
    config_keys_differ: list[str]
    per_prompt: list[PromptComparison]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(
    ref: Reference,
    tokens: list[list[int]],
    logprobs: list[list[float]],
    *,
    logprob_tolerance: float = LOGPROB_TOLERANCE,
    tie_margin: float = TIE_MARGIN,
    config_keys_differ: list[str] | None = None,
) -> Equivalence:
    """Compare the candidate's greedy tokens and its teacher-forced logprobs of the
    reference tokens with the reference."""
    per: list[PromptComparison] = []
    failures: list[str] = []
    for i, (r, toks, lps) in enumerate(zip(ref.prompts, tokens, logprobs)):
        rt, rl, rm = r["tokens"], r["logprobs"], r["margins"]
        first = next((j for j, (a, b) in enumerate(zip(rt, toks)) if a != b), None)
        if first is None and len(toks) != len(rt):
            first = min(len(toks), len(rt))
        tie = first is not None and first < len(rm) and rm[first] <= tie_margin
        deltas = [abs(a - b) for a, b in zip(rl, lps)]
        worst = max(range(len(deltas)), key=deltas.__getitem__) if deltas else 0
        pc = PromptComparison(
            index=i,
            first_diff=first,
            diverged_at_tie=tie,
            max_abs_dlogprob=round(deltas[worst], 6) if deltas else 0.0,
            worst_token=worst,
        )
        per.append(pc)
        if first is not None and not tie:
            failures.append(
                f"prompt {i}: greedy output differs from the reference at token {first} "
                f"(reference margin {rm[first] if first < len(rm) else float('nan'):.3f} > "
                f"tie margin {tie_margin:g})"
            )
        if pc.max_abs_dlogprob > logprob_tolerance:
            failures.append(
                f"prompt {i}: |Δ logprob| {pc.max_abs_dlogprob:.4f} at token {worst} exceeds {logprob_tolerance:g}"
            )
    firsts = [p.first_diff for p in per if p.first_diff is not None]
    return Equivalence(
        verdict="FAIL" if failures else "PASS",
        failures=failures,
        reference=ref.path,
        prompts=len(per),
        tokens_per_prompt=len(ref.prompts[0]["tokens"]) if ref.prompts else 0,
        first_diff=min(firsts) if firsts else None,
        prompts_diverged=len(firsts),
        max_abs_dlogprob=max((p.max_abs_dlogprob for p in per), default=0.0),
        logprob_tolerance=logprob_tolerance,
        tie_margin=tie_margin,
        config_keys_differ=list(config_keys_differ or []),
        per_prompt=per,
    )


def summary(eq: Equivalence) -> str:
    fd = "none" if eq.first_diff is None else str(eq.first_diff)
    return (
        f"{eq.verdict}: {eq.prompts} prompts x {eq.tokens_per_prompt} tokens vs {eq.reference}: "
        f"first differing token {fd} ({eq.prompts_diverged} prompt(s) diverged), "
        f"max |Δ logprob| {eq.max_abs_dlogprob:.4g} (tolerance {eq.logprob_tolerance:g}, tie margin "
        f"{eq.tie_margin:g})"
        + (f"; config keys differ: {', '.join(eq.config_keys_differ)}" if eq.config_keys_differ else "")
    )


# --------------------------------------------------------------------------- reading the server's answers


def parse_scores(choice: dict[str, Any], prompt_len: int, continuation: list[int]) -> tuple[list[float], list[float]]:
    """From vLLM's ``prompt_logprobs`` of prompt+continuation: the logprob of each
    continuation token and its margin to the best other token listed there."""
    pl = choice.get("prompt_logprobs")
    if not isinstance(pl, list) or len(pl) < prompt_len + len(continuation):
        raise ValueError(f"response has no prompt_logprobs for {prompt_len + len(continuation)} positions")
    lps: list[float] = []
    margins: list[float] = []
    for j, tok in enumerate(continuation):
        entry = pl[prompt_len + j]
        if not isinstance(entry, dict):
            raise ValueError(f"prompt_logprobs[{prompt_len + j}] is not an object")
        by_id = {int(k): v for k, v in entry.items()}
        if tok not in by_id:
            raise ValueError(f"prompt_logprobs[{prompt_len + j}] lacks token {tok}")
        lp = float(by_id[tok]["logprob"])
        others = [float(v["logprob"]) for t, v in by_id.items() if t != tok]
        lps.append(lp)
        margins.append(lp - max(others) if others else float(MAX_TOKENS))
    return lps, margins


def generate(host: str, port: int, model_id: str, prompt: list[int], timeout: float) -> list[int]:
    body = {
        "model": model_id,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
        "logprobs": 1,
    }
    data = post_json(host, port, "/v1/completions", body, timeout)
    toks = data["choices"][0].get("token_ids")
    if not isinstance(toks, list) or not toks:
        raise ValueError("response has no token_ids (the server must honour vLLM's return_token_ids)")
    return [int(t) for t in toks]


def score(
    host: str, port: int, model_id: str, prompt: list[int], continuation: list[int], timeout: float
) -> tuple[list[float], list[float]]:
    body = {
        "model": model_id,
        "prompt": prompt + continuation,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": TOP_K,
    }
    data = post_json(host, port, "/v1/completions", body, timeout)
    return parse_scores(data["choices"][0], len(prompt), continuation)


def record(host: str, port: int, model_id: str, prompts: list[list[int]], timeout: float) -> list[dict[str, Any]]:
    """The reference outputs: greedy tokens, then their teacher-forced logprobs and margins."""
    out = []
    for p in prompts:
        toks = generate(host, port, model_id, p, timeout)
        lps, margins = score(host, port, model_id, p, toks, timeout)
        out.append({"tokens": toks, "logprobs": [round(x, 6) for x in lps], "margins": [round(x, 6) for x in margins]})
    return out


def check(
    host: str,
    port: int,
    model_id: str,
    ref: Reference,
    timeout: float,
    *,
    logprob_tolerance: float,
    tie_margin: float,
    config_keys_differ: list[str],
) -> Equivalence:
    tokens, logprobs = [], []
    for r in ref.prompts:
        tokens.append(generate(host, port, model_id, r["prompt"], timeout))
        logprobs.append(score(host, port, model_id, r["prompt"], r["tokens"], timeout)[0])
    return compare(
        ref,
        tokens,
        logprobs,
        logprob_tolerance=logprob_tolerance,
        tie_margin=tie_margin,
        config_keys_differ=config_keys_differ,
    )


def recorded_info(mode: str, image: str | None, extra_args: list[str], model: str) -> dict[str, Any]:
    return {
        "mode": mode,
        "image": image,
        "extra_args": list(extra_args),
        "model_path": model,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
