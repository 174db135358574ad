#!/usr/bin/env python3
"""Summarize one or more GPU proof result folders (from scripts/gpu-proof.sh's proof.tgz).

    python scripts/gpu/summarize.py DIR [DIR ...]     # DIR holds results/ and logs/
    python scripts/gpu/summarize.py --releases [DIR ...]   # the per-release table (proof-run.sh RELEASES mode)

Prints markdown: per-run verdicts and numbers, the PLE output fingerprints
against the unpatched reference, and the plan (builder.serving.plan, recomputed with the
current code) against vLLM's logged KV capacity.
"""

from __future__ import annotations

import json
import re
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
            if not isinstance(rep, dict) or "verdict" not in rep:  # bundle-manifest.json and the like
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
    out = [
        "| run | verdict | /health s | first token s | KV tokens (vLLM) | max conc. (vLLM) | p50 / p95 s (rounds) | "
        "out tok/s | GPU MiB peak | failure (root cause) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
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
        m = re.match(r"[pu]-([0-9.]+)-", name)  # proof-run.sh RELEASES mode: that release's reference
        if m and f"u-{m.group(1)}-gemma4-ple-ref" in runs:
            ref = (runs[f"u-{m.group(1)}-gemma4-ple-ref"].get("probe") or {}).get("text")
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
    out = [
        "| run | model (layers × KV heads × head_dim) | util | max_model_len | KV tokens: plan | vLLM | error | max "
        "concurrency: plan | vLLM | error | available KV GiB: plan | vLLM |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in runs.items():
        p = r.get("plan")
        alone = name in ALONE or re.fullmatch(r"p-[0-9.]+-qwen3-sparse", name)  # proof-run.sh RELEASES mode
        if not p or r["kv_cache"]["tokens"] is None or not alone:
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
                    json.loads(cfg_file.read_text()),
                    weights_bytes=int(p["weights_bytes"]),
                    gpu_memory_bytes=int(p["gpu_memory_bytes"]),
                    tp=s["tp"],
                    gpu_memory_utilization=s["gpu_memory_utilization"],
                    max_model_len=s["max_model_len"],
                    max_num_seqs=s["max_num_seqs"],
                    **kw,
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


NOT_RUN = "not run (device budget)"


def _releases() -> list[str]:
    base = ROOT / "lockfiles" / "base"
    out = [p.name[len("vllm-openai-v") : -len(".json")] for p in base.glob("vllm-openai-v*.json")]
    return sorted(out, key=lambda v: tuple(int(x) for x in v.split(".")))


def _carried(v: str) -> str:
    """The versions release V carries (torch stack, transformers, ray), from scripts/gpu/bundle_plan.py's plan."""
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    import bundle_plan

    r = bundle_plan.release_plan(v)
    t, e = r["torch_wheels"], r["engine_wheels"]
    e.setdefault("transformers", bundle_plan.manifest(v)["transformers"] + " (the device's)")
    torch = (
        f"torch {t['torch']}, triton {t['triton']}, NCCL {t.get('nvidia-nccl-cu13', '(device)')}"
        if t
        else f"(the device's torch {bundle_plan.DEVICE_TORCH})"
    )
    return f"{torch}; transformers {e['transformers']}; ray {r['ray']}"


def _verdict(r: dict | None) -> str:
    if r is None:
        return NOT_RUN
    if r["verdict"] == "PASS":
        rounds = ", ".join(f"{x.get('kind', 'completion')} {x['ok']}/{x['requests']}" for x in r["rounds"])
        return f"PASS ({rounds})"
    fail = (r["failures"] or ["?"])[-1]
    log = r["_dir"] / "logs" / f"{r['_name']}.log"
    if log.exists():
        from builder.serving.smoke import first_error_line, parse_server_log

        root = first_error_line(parse_server_log(log.read_text("utf-8", "replace")))
        fail = root.split("] ", 1)[-1] if root and "] " in root[:80] else (root or fail)
    return f"FAIL: {fail.replace('|', '/')[:160]}"


def release_table(runs: dict[str, dict]) -> str:
    for name, r in runs.items():
        r["_name"] = name
    out = [
        "| release | carried | patched layer-type (qwen3-sparse) | KV tokens: vLLM logged / plan (error) | "
        "/health s | out tok/s | unpatched layer-type | patched PLE long name | unpatched PLE long name |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def ple(r: dict | None, ref: dict | None) -> str:
        text = _verdict(r)
        if r is None or ref is None or not (r.get("probe") or {}).get("text"):
            return text
        same = r["probe"]["text"] == (ref.get("probe") or {}).get("text")
        return text + (
            "; greedy probe = the plain-name reference"
            if same
            else "; **greedy probe differs from the plain-name reference** (table not loaded)"
        )

    for v in _releases():
        p, u = runs.get(f"p-{v}-qwen3-sparse"), runs.get(f"u-{v}-qwen3-sparse")
        pl, ul = runs.get(f"p-{v}-gemma4-ple-long"), runs.get(f"u-{v}-gemma4-ple-long")
        ref = runs.get(f"u-{v}-gemma4-ple-ref")
        kv = boot = tps = NOT_RUN if p is None else "–"
        if p is not None:
            m, plan = p["kv_cache"]["tokens"], (p.get("plan") or {}).get("kv_tokens_per_gpu")
            if m and plan:
                kv = f"{m:,} / {plan:,} ({100 * (plan - m) / m:+.2f}%)"
            boot = fmt(p["boot"]["health_s"])
            tps = fmt(p["throughput"]["output_tokens_per_s"], 0)
        out.append(
            f"| {v} | {_carried(v)} | {_verdict(p)} | {kv} | {boot} | {tps} | {_verdict(u)} | "
            f"{ple(pl, ref)} | {ple(ul, ref)} |"
        )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--releases"]:
        runs = load([Path(a) for a in argv[1:]])
        print(release_table(runs))
        return 0
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
