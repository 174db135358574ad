#!/usr/bin/env python3
"""The per-release table of a matrix run (scripts/gpu/matrix-run.sh) from its raw files.

    summarize_matrix.py RUN_DIR [RERUN_DIR ...]

RUN_DIR (and any RERUN_DIR, whose results replace the same release's) holds results/*.json, results/versions-V.txt,
results/gate.log.  Per release: the patched qwen3-sparse verdict and rounds, the layers rewritten, vLLM's logged KV
tokens against the run's plan, /health, output tok/s, the patched PLE long-name verdict and whether its greedy probe
equals the plain-name reference of the same checkpoints, the versions imported, and the sized boot's gate: seconds it
waited and the MiB the other processes' memory moved inside its window.  Markdown on stdout.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def load(dirs: list[Path]) -> tuple[dict, dict, dict, dict]:
    runs, versions, gate, refs = {}, {}, {}, {}
    for d in dirs:
        for f in sorted((d / "results").glob("*.json")):
            if re.match(r"[pu]-\d", f.name):
                runs[f.stem] = (json.loads(f.read_text() or "{}"), d)
        for f in (d / "results").glob("versions-*.txt"):
            versions[f.stem[len("versions-") :]] = f.read_text().strip().splitlines()[-1]
        log = d / "results" / "gate.log"
        for ln in log.read_text().splitlines() if log.exists() else []:
            f = dict(x.split("=", 1) for x in ln.split()[1:] if "=" in x)
            ev = ln.split()[3] if len(ln.split()) > 3 else ""
            if ev == "ex-acquired":
                gate.setdefault(f["tag"], {})["waited"] = f["waited"]
            elif ev == "ex-released":
                gate.setdefault(f["tag"], {})["others"] = f.get("others_delta_mib")
        for name, (r, src) in runs.items():
            if name.startswith("u-") and src == d and (r.get("probe") or {}).get("text"):
                refs[d] = r["probe"]["text"]
    return runs, versions, gate, refs


def row(v: str, runs: dict, versions: dict, gate: dict, refs: dict) -> str:
    q, qd = runs.get(f"p-{v}-qwen3-sparse", ({}, None))
    p, pd = runs.get(f"p-{v}-gemma4-ple-long", ({}, None))
    rounds = "/".join(str(r.get("ok")) for r in q.get("rounds", []))
    found = (re.search(r"layer\(s\) (\[[^]]*\])", t) for t in q.get("layer_rewrites", []))
    rew = sorted({m.group(1) for m in found if m})
    kv, plan = (q.get("kv_cache") or {}).get("tokens"), (q.get("plan") or {}).get("kv_tokens_per_gpu")
    err = f" ({(plan - kv) / kv:+.2%})" if kv and plan else ""
    probe = (p.get("probe") or {}).get("text")
    same = "probe = reference" if probe and probe == refs.get(pd) else "**probe differs**" if probe else "no probe"
    g = gate.get(f"p-{v}-qwen3-sparse", {})
    return (
        f"| {v} | {q.get('verdict', 'not run')} ({rounds}; layers {', '.join(rew) or 'none'} rewritten) | "
        f"{p.get('verdict', 'not run')}; {same} | {kv or '–':,} / {plan or '–':,}{err} | "
        f"{(q.get('boot') or {}).get('health_s')} | {(q.get('throughput') or {}).get('output_tokens_per_s')} | "
        f"{g.get('waited', '–')} s / {g.get('others', '–')} MiB | {versions.get(v, '–')} |"
    )


def main(argv: list[str]) -> int:
    dirs = [Path(a) for a in argv]
    runs, versions, gate, refs = load(dirs)
    rel = sorted({n.split("-")[1] for n in runs}, key=lambda v: tuple(int(x) for x in v.split(".")))
    print(
        "| release | patched qwen3-sparse (3 x 16 + chat) | patched PLE long name |"
        " KV tokens: vLLM / plan (plan error) | /health s | out tok/s |"
        " sized boot: gate wait / others' MiB in its window | imported |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for v in rel:
        print(row(v, runs, versions, gate, refs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
