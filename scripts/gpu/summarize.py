#!/usr/bin/env python3
"""Summarize one or more GPU proof result folders (from scripts/gpu-proof.sh's proof.tgz).

    python scripts/gpu/summarize.py DIR [DIR ...]     # DIR holds results/ and logs/

Prints markdown: per-run verdicts and numbers, the PLE output fingerprints
against the unpatched reference, and the plan (builder.serving.plan, recomputed with the
current code) against vLLM's logged KV capacity.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def load(dirs: list[Path]) -> dict[str, dict]:
    runs: dict[str, dict] = {}
    for d in dirs:
        for f in sorted((d / "results").glob("*.json")):
            if f.name.endswith(".config.json") or f.name.endswith(".ple-variant.json"):
                continue
            try:
                rep = json.loads(f.read_text())
            except ValueError:
                continue
            rep["_dir"] = d
            runs[f.stem] = rep
    return runs


def fmt(v, nd=2):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def runs_table(runs: dict[str, dict]) -> str:
    out = ["| run | verdict | /health s | first token s | KV tokens (vLLM) | max conc. (vLLM) | p50 / p95 s (rounds) | "
           "out tok/s | GPU MiB peak | failure (root cause) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        lat = "; ".join(f"{fmt(x['latency_p50_s'])}/{fmt(x['latency_p95_s'])}" for x in r["rounds"]) or "–"
        gpu = (r.get("gpu") or {}).get("memory_used_mib_peak")
        fail = ""
        if r["failures"]:
            fail = r["failures"][-1]
            log = r["_dir"] / "logs" / f"{name}.log"
            if log.exists():
                from builder.serving.smoke import first_error_line, parse_server_log

                facts = parse_server_log(log.read_text("utf-8", "replace"))
                root = facts.oom_lines[0] if facts.oom_lines else first_error_line(facts)
                if root:
                    fail = root.split("] ", 1)[-1] if "] " in root[:80] else root
            fail = fail.replace("|", "/")[:170]
        out.append(
            f"| {name} | {r['verdict']} | {fmt(r['boot']['health_s'])} | {fmt(r['boot']['first_token_s'])} | "
            f"{fmt(r['kv_cache']['tokens'])} | {fmt(r['kv_cache']['max_concurrency'])} | {lat} | "
            f"{fmt(r['throughput']['output_tokens_per_s'], 0)} | {fmt(gpu)} | {fail} |"
        )
    return "\n".join(out)


def fingerprints(runs: dict[str, dict]) -> str:
    ref = None
    for name in ("u-gemma4-ple-ref2", "u-gemma4-ple-ref"):
        if name in runs and runs[name].get("probe"):
            ref = runs[name]["probe"]["text"]
            break
    out = ["| run | greedy 8-token probe | equals unpatched reference |", "|---|---|---|"]
    for name, r in runs.items():
        if "gemma4" not in name:
            continue
        text = (r.get("probe") or {}).get("text")
        same = "–" if text is None or ref is None else ("yes" if text == ref else "**no**")
        out.append(f"| {name} | `{text.strip() if text else '(no boot)'}` | {same} |")
    return "\n".join(out)


# Runs that had the GPU to themselves (proof-run.sh): vLLM measures its non-torch
# memory from the device's free memory, so concurrent boots skew each other's KV size.
ALONE = {"g-qwen3-a", "g-qwen3-b", "u-gemma4-ple-ref", "p-qwen3-sparse", "f-qwen3-sparse", "f-qwen3-b"}


def ground_truth(runs: dict[str, dict]) -> str:
    try:
        from builder.serving import plan as planmod
    except ImportError:
        return "(builder.serving.plan not importable)"
    out = ["| run | model (layers × KV heads × head_dim) | util | max_model_len | KV tokens: plan | vLLM | error | max "
           "concurrency: plan | vLLM | error | available KV GiB: plan | vLLM |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        p = r.get("plan")
        if not p or r["kv_cache"]["tokens"] is None or name not in ALONE:
            continue
        ckpt = Path(r["model"]).name
        cfg_file = r["_dir"] / "results" / f"{ckpt}.config.json"
        shape = ""
        if cfg_file.exists():
            c = json.loads(cfg_file.read_text())
            c = c.get("text_config", c)
            shape = f"{ckpt} ({c.get('num_hidden_layers')} × {c.get('num_key_value_heads')} × {c.get('head_dim')})"
            s = r["settings"]
            extra = s.get("extra_args") or []
            kw = {"enforce_eager": "--enforce-eager" in extra}
            if "--max-num-batched-tokens" in extra:
                kw["max_num_batched_tokens"] = int(extra[extra.index("--max-num-batched-tokens") + 1])
            try:
                cur = planmod.make_plan(
                    json.loads(cfg_file.read_text()), weights_bytes=int(p["weights_bytes"]),
                    gpu_memory_bytes=int(p["gpu_memory_bytes"]), tp=s["tp"],
                    gpu_memory_utilization=s["gpu_memory_utilization"], max_model_len=s["max_model_len"],
                    max_num_seqs=s["max_num_seqs"], **kw,
                ).to_dict()
            except Exception as exc:  # noqa: BLE001
                print(f"recompute failed for {name}: {exc}", file=sys.stderr)
                cur = p
        else:
            cur = p
        kv_p, kv_m = cur["kv_tokens_per_gpu"], r["kv_cache"]["tokens"]
        mc_p, mc_m = cur["max_concurrency"], r["kv_cache"]["max_concurrency"]
        out.append(
            f"| {name} | {shape} | {r['settings']['gpu_memory_utilization']} | {fmt(r['settings']['max_model_len'])} | "
            f"{fmt(kv_p)} | {fmt(kv_m)} | {100 * (kv_p - kv_m) / kv_m:+.2f}% | {fmt(float(mc_p))} | {fmt(mc_m)} | "
            f"{100 * (mc_p - mc_m) / mc_m:+.2f}% | {cur['available_kv_bytes'] / 2**30:.2f} | "
            f"{fmt(r['kv_cache']['available_gib'])} |"
        )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    dirs = [Path(a) for a in argv] or [Path("/tmp/proof")]
    runs = load(dirs)
    print("## Runs\n")
    print(runs_table(runs))
    print("\n## PLE fingerprints\n")
    print(fingerprints(runs))
    print("\n## Plan vs vLLM (issue 7 ground truth)\n")
    print(ground_truth(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
