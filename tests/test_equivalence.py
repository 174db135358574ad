"""The output-equivalence gate (`smoke --save-reference` / `--reference`) against the fake
server's toy model: match, mismatch, noise within and beyond the thresholds, near-ties,
and references that are malformed, edited, or recorded for another model."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from builder.errors import BadInput
from builder.serving.smoke import SmokeConfig, run_smoke
from builder.serving.smoke import equivalence as eqv

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fake_openai_server.py"
CLI = [sys.executable, "-c", "import sys; from builder.cli import main; main(prog_name='build-image')"]
CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 1000,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "layer_types": ["full_attention", "full_attention"],
}


def _model(d: Path, **changes) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({**CONFIG, **changes}))
    (d / "tokenizer.json").write_text('{"model": {"type": "WordLevel"}}')
    return d


def _cmd(*flags: str) -> str:
    return " ".join([shlex.quote(sys.executable), shlex.quote(str(FAKE)), "--port", "{port}", *flags])


def _smoke(tmp_path, model: Path, *flags: str, **kw):
    kw.setdefault("rounds", 1)
    kw.setdefault("concurrency", 2)
    kw.setdefault("max_tokens", 4)
    kw.setdefault("prompt_tokens", 8)
    kw.setdefault("timeout", 20)
    kw.setdefault("boot_timeout", 20)
    kw.setdefault("stop_grace", 2)
    return run_smoke(
        SmokeConfig(model=str(model), server_cmd=_cmd(*flags), plan=False, log_file=str(tmp_path / "server.log"), **kw)
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    model = _model(d / "model")
    path = d / "ref.json"
    rep = _smoke(d, model, save_reference=str(path))
    assert rep.verdict == "PASS", rep.failures
    assert rep.reference_saved == str(path)
    return model, path


def test_saved_reference_records_prompts_sampling_and_model(reference):
    model, path = reference
    doc = json.loads(path.read_text())
    assert doc["schema"] == eqv.SCHEMA
    assert doc["sampling"] == {
        "temperature": 0.0,
        "max_tokens": eqv.MAX_TOKENS,
        "ignore_eos": True,
        "prompt_logprobs": eqv.TOP_K,
    }
    assert len(doc["prompts"]) == eqv.PROMPTS
    p0 = doc["prompts"][0]
    assert len(p0["prompt"]) == eqv.PROMPT_TOKENS and len(p0["tokens"]) == eqv.MAX_TOKENS
    assert len(p0["logprobs"]) == len(p0["margins"]) == eqv.MAX_TOKENS
    # the toy model's own numbers: greedy tokens are its argmax, so each margin is >= 0
    assert all(m >= 0 for p in doc["prompts"] for m in p["margins"])
    assert doc["model"]["identity_sha256"] == eqv.model_identity(str(model))["identity_sha256"]
    assert doc["prompt_set_sha256"] == eqv.prompt_set_sha256([p["prompt"] for p in doc["prompts"]], doc["sampling"])


def test_same_model_passes_with_zero_delta(tmp_path, reference):
    model, path = reference
    rep = _smoke(tmp_path, model, reference=str(path))
    assert rep.verdict == "PASS", rep.failures
    eq = rep.equivalence
    assert eq["verdict"] == "PASS" and eq["first_diff"] is None and eq["max_abs_dlogprob"] == pytest.approx(0, abs=1e-5)


def test_another_weights_fail_with_the_first_differing_token(tmp_path, reference):
    model, path = reference
    rep = _smoke(tmp_path, model, "--model-seed", "7", reference=str(path))
    assert rep.verdict == "FAIL"
    eq = rep.equivalence
    assert eq["verdict"] == "FAIL" and eq["first_diff"] == 0 and eq["prompts_diverged"] == eqv.PROMPTS
    assert eq["max_abs_dlogprob"] > 1.0
    assert any("output equivalence" in f and "differs from the reference at token 0" in f for f in rep.failures)


def test_noise_below_the_tolerance_passes_and_above_fails(tmp_path, reference):
    model, path = reference
    small = _smoke(tmp_path, model, "--logprob-noise", "0.001", reference=str(path))
    assert small.verdict == "PASS", small.failures
    assert 0 < small.equivalence["max_abs_dlogprob"] <= 0.002 * 2
    big = _smoke(tmp_path, model, "--logprob-noise", "0.001", reference=str(path), reference_logprob_tolerance=1e-5)
    assert big.verdict == "FAIL"
    assert any("|Δ logprob|" in f and "exceeds 1e-05" in f for f in big.failures)


def _ref(tokens, margins, logprobs=None) -> eqv.Reference:
    logprobs = logprobs or [-1.0] * len(tokens)
    return eqv.Reference(
        path="r.json",
        model={},
        sampling={},
        prompt_set_sha256="x",
        prompts=[{"prompt": [1], "tokens": tokens, "logprobs": logprobs, "margins": margins}],
    )


def test_compare_rules():
    ref = _ref([5, 6, 7, 8], [2.0, 0.05, 2.0, 2.0])
    same = eqv.compare(ref, [[5, 6, 7, 8]], [[-1.0, -1.0, -1.0, -1.0]])
    assert same.verdict == "PASS" and same.first_diff is None
    tie = eqv.compare(ref, [[5, 9, 9, 9]], [[-1.0, -1.02, -1.0, -1.0]])  # differs where the margin was 0.05
    assert tie.verdict == "PASS" and tie.first_diff == 1 and tie.per_prompt[0].diverged_at_tie
    real = eqv.compare(ref, [[5, 6, 9, 9]], [[-1.0, -1.0, -1.0, -1.0]])  # differs where the margin was 2.0
    assert real.verdict == "FAIL" and real.first_diff == 2
    drift = eqv.compare(ref, [[5, 6, 7, 8]], [[-1.0, -1.0, -1.5, -1.0]])
    assert (
        drift.verdict == "FAIL"
        and drift.max_abs_dlogprob == pytest.approx(0.5)
        and drift.per_prompt[0].worst_token == 2
    )
    assert eqv.compare(ref, [[5, 6, 7, 8]], [[-1.0, -1.0, -1.5, -1.0]], logprob_tolerance=0.6).verdict == "PASS"
    short = eqv.compare(ref, [[5, 6]], [[-1.0, -1.0, -1.0, -1.0]])
    assert short.verdict == "FAIL" and short.first_diff == 2


def test_parse_scores_reads_vllm_prompt_logprobs():
    choice = {
        "prompt_logprobs": [
            None,
            {"7": {"logprob": -0.5, "rank": 1}, "3": {"logprob": -1.5, "rank": 2}},
            {"9": {"logprob": -2.0, "rank": 2}, "4": {"logprob": -0.25, "rank": 1}},
        ]
    }
    lps, margins = eqv.parse_scores(choice, 1, [7, 9])
    assert lps == [-0.5, -2.0] and margins == [1.0, -1.75]
    with pytest.raises(ValueError, match="lacks token 8"):
        eqv.parse_scores(choice, 1, [8, 9])
    with pytest.raises(ValueError, match="no prompt_logprobs"):
        eqv.parse_scores({}, 1, [7])


def _cli(args):
    return subprocess.run(CLI + args, capture_output=True, text=True, cwd=ROOT, timeout=120)


def _edit(path: Path, tmp_path: Path, fn) -> Path:
    doc = json.loads(path.read_text())
    fn(doc)
    out = tmp_path / "edited.json"
    out.write_text(json.dumps(doc))
    return out


@pytest.mark.parametrize(
    "case,msg",
    [
        ("missing", "no such file"),
        ("not-json", "not a JSON reference file"),
        ("schema", "'schema' must be"),
        ("cut", "'prompts[0].logprobs' must hold one finite number per token"),
        ("edited-prompt", "'prompt_set_sha256' does not match"),
        ("other-model", "recorded for another model (hidden_size: 64 vs 128"),
        ("other-tokenizer", "recorded for another model (the tokenizer files differ"),
        ("other-prompts", "another prompt set"),
    ],
)
def test_bad_reference_is_bad_input_before_any_boot(tmp_path, reference, case, msg):
    model, path = reference
    target = model
    ref = path
    if case == "missing":
        ref = tmp_path / "nope.json"
    elif case == "not-json":
        ref = tmp_path / "x.json"
        ref.write_text("{")
    elif case == "schema":
        ref = _edit(path, tmp_path, lambda d: d.update(schema="other/v9"))
    elif case == "cut":
        ref = _edit(path, tmp_path, lambda d: d["prompts"][0].update(logprobs=d["prompts"][0]["logprobs"][:-1]))
    elif case == "edited-prompt":
        ref = _edit(path, tmp_path, lambda d: d["prompts"][0]["prompt"].__setitem__(0, 101))
    elif case == "other-model":
        target = _model(tmp_path / "big", hidden_size=128)
    elif case == "other-tokenizer":
        target = _model(tmp_path / "tok")
        (target / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    elif case == "other-prompts":

        def other(d):
            d["sampling"]["max_tokens"] = 4
            d["prompt_set_sha256"] = eqv.prompt_set_sha256([p["prompt"] for p in d["prompts"]], d["sampling"])

        ref = _edit(path, tmp_path, other)
    pidfile = tmp_path / "srv.pid"
    r = _cli(
        [
            "smoke",
            "--model",
            str(target),
            "--server-cmd",
            _cmd("--pidfile", str(pidfile)),
            "--no-plan",
            "--reference",
            str(ref),
        ]
    )
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert msg in r.stderr, r.stderr
    assert not pidfile.exists()  # refused before the server was started


def test_config_difference_is_compared_and_reported(tmp_path, reference):
    """The same weights declared with other layer types (the layer-type override case): compared, keys named."""
    _, path = reference
    other = _model(tmp_path / "declared", layer_types=["full_attention", "qwen_sparse_attention"])
    rep = _smoke(tmp_path, other, reference=str(path))
    assert rep.verdict == "PASS", rep.failures
    assert rep.equivalence["config_keys_differ"] == ["layer_types"]


def test_save_reference_is_not_written_for_a_failing_run(tmp_path):
    model = _model(tmp_path / "m")
    out = tmp_path / "ref.json"
    rep = _smoke(tmp_path, model, "--fail-500-at", "2", save_reference=str(out))
    assert rep.verdict == "FAIL" and rep.reference_saved is None
    assert not out.exists()


def test_check_and_record_in_one_run(tmp_path, reference):
    """--reference A --save-reference B: compared with A, and B recorded (a second engine's reference)."""
    model, path = reference
    out = tmp_path / "b.json"
    rep = _smoke(tmp_path, model, reference=str(path), save_reference=str(out))
    assert rep.verdict == "PASS" and rep.equivalence["verdict"] == "PASS" and rep.reference_saved == str(out)
    assert json.loads(out.read_text())["prompts"] == json.loads(path.read_text())["prompts"]
    with pytest.raises(BadInput, match="another file than --reference"):
        _smoke(tmp_path, model, reference=str(path), save_reference=str(path))
