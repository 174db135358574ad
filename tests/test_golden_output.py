"""Byte-for-byte output of `plan`, the upgrade report, the smoke report and promote / rollback, pinned.

The files under tests/data/golden were written by the code as it printed them; a change that moves a byte of
these outputs (a renamed field, a reordered line, a rounding) fails here and shows the diff.  After a change that
means to alter an output, rewrite them with ``BUILD_IMAGE_WRITE_GOLDEN=1 pytest tests/test_golden_output.py``
and review the diff of the files.  Paths, digests, repositories and times that differ between runs are replaced
by placeholders before the comparison.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import main

GOLDEN = Path(__file__).parent / "data" / "golden"
PLAN = Path(__file__).parent / "data" / "plan"


def check(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("BUILD_IMAGE_WRITE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.is_file(), f"{path}: no golden output (write it with BUILD_IMAGE_WRITE_GOLDEN=1)"
    assert text == path.read_text(), name


# --------------------------------------------------------------------------- plan: text and --json

PLAN_CASES = {
    "600gb-default": [
        "--model",
        "600gb-on-8-gpus",
        "--weights-bytes",
        "600GB",
        "--gpus",
        "8",
        "--tp",
        "8",
        "--gpu-memory",
        "80GB",
        "--gpu-memory-utilization",
        "0.96",
        "--kv-cache-dtype",
        "fp8",
    ],
    "600gb-fits": [
        "--model",
        "600gb-on-8-gpus",
        "--weights-bytes",
        "600GB",
        "--gpus",
        "8",
        "--tp",
        "8",
        "--gpu-memory",
        "80GB",
        "--gpu-memory-utilization",
        "0.96",
        "--kv-cache-dtype",
        "fp8",
        "--reserve-gib",
        "0",
        "--max-model-len",
        "4096",
        "--max-num-seqs",
        "60",
    ],
    "qwen-sparse": ["--model", "qwen-sparse-attention", "--weights-bytes", "60GB", "--gpu-memory", "h200"],
    "mla-tp4-pp2": [
        "--model",
        "mla",
        "--weights-bytes",
        "300GB",
        "--tp",
        "4",
        "--pp",
        "2",
        "--gpu-memory",
        "h200",
        "--max-model-len",
        "32768",
        "--max-num-seqs",
        "8",
    ],
    "sliding-eager": [
        "--model",
        "sliding",
        "--weights-bytes",
        "8GB",
        "--gpu-memory",
        "h100",
        "--enforce-eager",
        "--max-model-len",
        "8192",
        "--kv-cache-dtype",
        "fp8",
    ],
    "nested-offload": [
        "--model",
        "nested",
        "--weights-bytes",
        "20GB",
        "--gpu-memory",
        "24GiB",
        "--cpu-offload-gb",
        "4",
        "--max-model-len",
        "16384",
    ],
    "tiny-qwen3-pp": [
        "--model",
        "tiny_qwen3",
        "--weights-bytes",
        "1GB",
        "--gpu-memory",
        "h100",
        "--pp",
        "2",
        "--max-num-batched-tokens",
        "4096",
    ],
    "h200-proof-gemma": [
        "--model",
        "h200-proof/gemma4-ple-ref",
        "--weights-bytes",
        "949572",
        "--gpu-memory",
        "h200",
        "--gpu-memory-utilization",
        "0.08",
        "--max-model-len",
        "2048",
    ],
    "h200-proof-qwen3": [
        "--model",
        "h200-proof/qwen3-b",
        "--weights-bytes",
        "45112592",
        "--gpu-memory",
        "h200",
        "--gpu-memory-utilization",
        "0.5",
        "--max-model-len",
        "4096",
        "--max-num-seqs",
        "32",
        "--image-size",
        "12GB",
        "--load-rate",
        "2GiB/s",
    ],
}


@pytest.mark.parametrize("case", sorted(PLAN_CASES))
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_plan_output_is_unchanged(case, as_json, monkeypatch):
    monkeypatch.chdir(PLAN)
    args = ["plan", *PLAN_CASES[case], *(["--json"] if as_json else [])]
    r = CliRunner().invoke(main, args)
    check(f"plan/{case}.{'json' if as_json else 'txt'}", f"exit {r.exit_code}\n{r.output}")


# --------------------------------------------------------------------------- the upgrade report


def _upgrade_report(review: bool):
    from builder import upgrade as U
    from builder.patching import port as PO

    patches = [
        PO.PortedPatch("0001-f.patch", "fix f", PO.APPLIES, detail=["toy/mod.py: applies at line 3"]),
        PO.PortedPatch(
            "0002-g.patch",
            "fix g",
            PO.MERGED if review else PO.APPLIES,
            detail=["toy/mod.py: merged (3-way)", "placed after def g"],
        ),
    ]
    port = PO.PortReport("toy", "1.0", "2.0", patches, out_dir="/out/patches/toy/2.0")
    lock = U.LockStep(
        "abi-rejected" if review else "written",
        path=None if review else "/out/lockfiles/vllm-2.0/requirements.lock",
        message="fakearrow 14.0.2 needs numpy<2" if review else "",
        details="fakearrow==14.0.2 built against numpy 1.x ABI" if review else "",
        ray="2.52.0",
        serve_backend="ray-serve-llm",
        overlay=["numpy2user==1.0.0", "fakearrow==14.0.2"],
        changes=[U.Move("numpy2user", "0.9.0", "1.0.0"), U.Move("oldpkg", "1.0", None)],
    )
    moves = [
        U.Move("python", "3.12.3", "3.12.3"),
        U.Move("numpy", "1.26.4", "2.1.0"),
        U.Move("torch", "2.9.0", "2.10.0", note="not in the replay: the recipe's pin"),
        U.Move("OS", "Ubuntu 22.04", "Ubuntu 24.04"),
    ]
    platforms = [
        U.PlatformSection(
            "linux/arm64",
            "base-a-arm64",
            "base-b-arm64",
            "reconstructed",
            [U.Move("numpy", "1.26.4", "2.1.0")],
            U.LockStep("unsatisfiable" if review else "written", message="no arm64 wheel" if review else ""),
            base_notes=["pin x==1 was not served"],
            relaxed=["x==1 -> x>=1"] if review else [],
        )
    ]
    return U.UpgradeReport(
        "1.0",
        "2.0",
        "base-a",
        "base-b",
        "reconstructed" if review else "shipped",
        moves,
        port,
        lock,
        plan=[U.Move("max_model_len", "4096", "8192")],
        plan_notes=["the KV cache per token grows by 0 B"],
        written=["/out/upgrade-1.0-2.0.md"] if review else [],
        seconds={"base": 1.5, "port": 0.25, "lock": 3.0},
        shipped_series="patches/toy/2.0" if review else None,
        base_notes=["index https://pypi.example did not answer"] if review else [],
        relaxed=["torch==2.10.0 -> torch>=2.10"] if review else [],
        platforms=platforms if review else [],
        stand_in="1.9" if review else None,
    )


@pytest.mark.parametrize("review", [False, True], ids=["clean", "review"])
@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_upgrade_report_is_unchanged(review, fmt):
    from builder import upgrade as U

    r = _upgrade_report(review)
    name = f"upgrade/{'review' if review else 'clean'}.{U.REPORT_EXT[fmt]}"
    check(name, U.render(r, fmt) + f"\nexit {r.exit_code}\n")


# --------------------------------------------------------------------------- the smoke report's text


def _smoke_reports():
    from builder.serving.smoke import RoundResult
    from tests.fx_cutover import smoke_report_obj

    yield "pass", smoke_report_obj()
    fail = smoke_report_obj(verdict="FAIL", concurrency=4, rounds=2, tp=2)
    fail.settings.update(
        pp=2,
        distributed_executor_backend="ray",
        ray_address="10.0.0.1:6379",
        release={
            "vllm": "0.26.0",
            "lock": "lockfiles/vllm-0.26.0/requirements.lock",
            "lock_hash": "0123456789abcdef0123",
            "serve_backend": "ray-serve-llm",
            "patch_series": "patches/vllm/0.26.0",
            "patches": ["a", "b"],
        },
    )
    fail.kv_cache = {"tokens": 123456, "available_gib": 10.5, "max_concurrency": 30.1, "tokens_per_request": 4096}
    fail.rounds.append(
        RoundResult(
            round=3,
            requests=4,
            ok=1,
            failed=3,
            wall_s=3.25,
            latency_p50_s=None,
            latency_p95_s=None,
            ttft_p50_s=None,
            output_tokens=8,
            output_tokens_per_s=None,
            errors=["timeout"],
            kind="chat",
        )
    )
    fail.gpu = {"memory_used_mib_peak": 1000, "memory_total_mib": 81559}
    fail.plan = {"summary": "fits: 30 sequences at 4096"}
    fail.layer_rewrites = ["a" * 300, "b", "c", "d"]
    fail.equivalence = {"verdict": "DIFFER", "summary": "2 of 5 prompts differ"}
    fail.reference_saved = "/tmp/ref.json"
    fail.log_file = "/tmp/server.log"
    fail.log_tail = ["line 1", "line 2"]
    fail.serve = {
        "ray_version": "2.52.0",
        "ray_start_s": 3.5,
        "app_running_s": 40.25,
        "backend": "ray-serve-llm",
        "backend_reason": "the lock holds ray[serve-llm]",
        "replica_log": "/tmp/replica.log",
        "replica_log_tail": ["r1"],
    }
    fail.cold_start = {"load_format": "safetensors", "model_load_s": 1.3, "weights_gib": 0.29, "init_engine_s": 2.4}
    yield "fail", fail
    bare = smoke_report_obj(max_model_len=None)
    bare.mode = "local"
    bare.image = "registry/x:1"
    bare.throughput = {}
    bare.gpu = {}
    bare.settings["pp"] = 1
    bare.settings["ray_address"] = "auto"
    yield "bare", bare


def test_smoke_report_text_is_unchanged():
    from builder.serving.smoke import render_text

    for name, rep in _smoke_reports():
        check(f"smoke/{name}.txt", render_text(rep) + f"\nexit {rep.exit_code}\n")


# --------------------------------------------------------------------------- promote / rollback (registry)


@pytest.mark.slow
@pytest.mark.docker
def test_promote_and_rollback_output_is_unchanged(tmp_path, local_registry):
    from tests.fx_cutover import attest, cli, make_world, signing_key

    w = make_world(tmp_path, local_registry)
    attest(w.registry, w.repo, w.new)

    pem = signing_key()[1].read_text().splitlines()[1:-1]  # the test process's key: its base64 lines

    def norm(text: str) -> str:
        for line in pem:
            text = text.replace(line, "<KEY>")
        text = re.sub(r"key-[0-9a-f]{12}", "key-<ID>", text)
        marks = ((w.new, "<NEW>"), (w.old, "<OLD>"), (str(w.tmp), "<TMP>"), (w.base, "<BASE>"), (w.repo, "<REPO>"))
        for value, mark in marks:
            text = text.replace(value, mark)
        text = re.sub(r"cutover-[0-9a-f]{10}", "cutover-<ID>", text)
        text = re.sub(r"sha256:[0-9a-f]{64}", "sha256:<DIGEST>", text)
        text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?", "<TIME>", text)
        return re.sub(r"\d+\.\d+ ?s\b", "<SECONDS>", text)

    out = []
    for args in (
        ["promote", f"{w.base}@{w.new}", "--to", w.tag, "--spec", str(w.spec), "--history", str(w.history)],
        ["rollback", w.tag, "--history", str(w.history), "-o", str(tmp_path / "back"), "--json"],
        ["promote", f"{w.base}@{w.new}", "--to", w.tag, "--spec", str(w.spec), "--history", str(w.history)]
        + ["-o", str(tmp_path / "apply"), "--json"],
        ["rollback", w.tag, "--history", str(w.history)],
        ["rollback", w.tag, "--history", str(w.history)],
    ):
        r = cli(*args)
        out.append(f"$ {args[0]}\nexit {r.returncode}\n--- stdout\n{r.stdout}--- stderr\n{r.stderr}")
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file() and p.parent.name in ("apply", "back"))
    out += [f"--- {p.relative_to(tmp_path)}\n{p.read_text()}" for p in files]
    history = json.loads(w.history.read_text())
    out.append("--- history entries\n" + json.dumps([sorted(e) for e in history["entries"]]))
    check("cutover/promote-rollback.txt", norm("\n".join(out)))
