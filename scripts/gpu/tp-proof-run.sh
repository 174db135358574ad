#!/usr/bin/env bash
# NOT YET RUN: no multi-GPU kind of the device machine has been lent so far; this is the
# ready command for the first session that gets one (nvidia-h200-x2 or nvidia-h200-x4).
#
# Tensor parallel across GPUs on the device, with the patched vLLM 0.26.0, run by
#   RUN=tp-proof-run.sh scripts/gpu-proof.sh start N      (kind nvidia-h200-x2 / -x4; same
#   bundle as the other proofs: scripts/gpu/make-bundle.sh, wheels-serve.txt brings ray 2.58.1)
# then `scripts/gpu-proof.sh wait` until DONE.  For TP 2 (and TP 4 when nvidia-smi shows 4 GPUs),
# with vLLM's mp and Ray executors (`smoke --distributed-executor-backend mp|ray`; with ray, smoke
# starts a loopback Ray head and stops it by PID), one run at a time on all TP GPUs, 3 x 16:
#   qwen3-b     8 KV heads  (KV heads >= TP: split across the ranks)
#   qwen3-kv1   1 KV head   (fewer KV heads than TP: replicated on every rank)
#   qwen3-a     2 KV heads  (equal to TP 2, fewer than TP 4)
#   qwen3-sparse at TP 2 (the layer-type rewrite patch under tensor parallel), mp executor
# NVLink multicast stays off (smoke sets it in every environment it starts; exported here too).
# Then the plan's per-GPU KV tokens and maximum concurrency (the smoke report's `plan`, computed
# with --tp) against vLLM's logged "GPU KV cache size" / "Maximum concurrency" (`kv_cache`):
# results/tp-compare.md, a row per run, "ok" within 5%.
# Writes $P/progress.txt, results/*.json (smoke reports), results/tp-compare.{md,json}, logs/*.log.
set -uo pipefail
. "$(dirname "$0")/env.sh"
smoke() {  # smoke NAME PYTHONPATH ARGS...  -> results/NAME.json, logs/NAME.log, logs/NAME.smoke.txt
  local name=$1 pp=$2; shift 2
  # the Ray head smoke starts runs `ray` next to this Python or on PATH: the bundle's ray is in /tmp/site
  PATH=/tmp/site/bin:$PATH PYTHONPATH=$pp python3 -c 'import sys; from builder.cli import main; main(["smoke"] + sys.argv[1:], prog_name="build-image")' \
     --local --vllm-bin "$VB" --log-file "$L/$name.log" --json --skip-checkpoint-check "$@" \
     > "$R/$name.json" 2> "$L/$name.smoke.txt"
  local rc=$?; echo "$rc" > "$R/$name.rc"
  say "$name: rc=$rc $(python3 -c "import json; d=json.load(open('$R/$name.json')); print(d['verdict'], d['kv_cache']['tokens'], d['failures'][:2])" 2>/dev/null | cut -c1-400)"
}
GT=(--gpu-memory-utilization 0.5 --max-model-len 4096 --max-num-seqs 32 --extra-arg=--enforce-eager
    --extra-arg=--max-num-batched-tokens --extra-arg=8192 --no-plan --boot-timeout 420 --timeout 120
    --concurrency 16 --rounds 3 --max-tokens 64 --prompt-tokens 128)

say "install"
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
nvidia-smi topo -m > "$R/nvidia-smi-topo.txt" 2>&1
NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
say "GPUs: $NGPU"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/bwhl/whl/*.whl > "$L/pip.log" 2>&1 || { say "pip install FAILED"; tail -20 "$L/pip.log" | tee -a "$P/progress.txt"; exit 1; }
PYTHONPATH=$PP_UN python3 -c "import vllm, ray, torch; print('vllm', vllm.__version__, 'ray', ray.__version__, 'torch', torch.__version__)" > "$R/versions.txt" 2>&1
say "versions: $(tail -1 "$R/versions.txt")"
rm -rf /tmp/sitep && mkdir -p /tmp/sitep && cp -a /tmp/site/vllm /tmp/site/vllm-0.26.0.dist-info /tmp/sitep/
( cd "$REPO" && PYTHONPATH=$PP_UN python3 -c 'from builder.cli import main; main(["patch", "apply", "--vllm", "0.26.0", "--site-packages", "/tmp/sitep"], prog_name="build-image")' ) > "$R/patch-apply.txt" 2>&1
echo $? > "$R/patch-apply.rc"
say "patch apply rc=$(cat "$R/patch-apply.rc")"
[ "$(cat "$R/patch-apply.rc")" = 0 ] || { say "patch apply FAILED"; exit 1; }
(cd "$REPO" && PYTHONPATH=$PP_UN python3 -m tests.checkpoints "$CK") > "$L/checkpoints.log" 2>&1 || { say "checkpoint generation FAILED"; tail -30 "$L/checkpoints.log" | tee -a "$P/progress.txt"; exit 1; }
for d in "$CK"/*; do cp "$d/config.json" "$R/$(basename "$d").config.json"; done

TPS="2"; [ "$NGPU" -ge 4 ] && TPS="2 4"
for tp in $TPS; do
  for ex in mp ray; do
    for m in qwen3-b qwen3-kv1 qwen3-a; do
      smoke "tp$tp-$ex-$m" "$PP_PA" --model "$CK/$m" --tp "$tp" --distributed-executor-backend "$ex" "${GT[@]}"
    done
  done
done
smoke "tp2-mp-qwen3-sparse" "$PP_PA" --model "$CK/qwen3-sparse" --tp 2 --distributed-executor-backend mp "${GT[@]}"

say "plan vs vLLM"
python3 - "$R" <<'PY' 2>&1 | tee -a "$P/progress.txt"
import json, sys
from pathlib import Path
R = Path(sys.argv[1]); rows = []; lines = [
    "| run | KV heads | verdict | KV tokens/GPU: plan | vLLM | error | max concurrency: plan | vLLM | error | within 5% |",
    "|---|---|---|---|---|---|---|---|---|---|"]
for f in sorted(R.glob("tp*.json")):
    if f.name.startswith("tp-compare"):
        continue
    try:
        d = json.loads(f.read_text())
    except ValueError:
        lines.append(f"| {f.stem} | | no report | | | | | | | no |"); continue
    p, kv = d.get("plan") or {}, d.get("kv_cache") or {}
    ck = Path(d["model"]).name
    c = json.loads((R / f"{ck}.config.json").read_text())
    kp, km, cp, cm = p.get("kv_tokens_per_gpu"), kv.get("tokens"), p.get("max_concurrency"), kv.get("max_concurrency")
    e1 = 100 * (kp - km) / km if kp and km else None
    e2 = 100 * (float(cp) - cm) / cm if cp and cm else None
    ok = e1 is not None and e2 is not None and abs(e1) <= 5 and abs(e2) <= 5 and d["verdict"] == "PASS"
    rows.append({"run": f.stem, "kv_heads": c.get("num_key_value_heads"), "verdict": d["verdict"], "plan_kv_tokens_per_gpu": kp,
                 "vllm_kv_tokens": km, "kv_error_pct": e1, "plan_max_concurrency": cp, "vllm_max_concurrency": cm,
                 "concurrency_error_pct": e2, "ok": ok})
    fmt = lambda x: "–" if x is None else (f"{x:+.2f}%" if isinstance(x, float) and abs(x) < 1000 else f"{x:,}")
    lines.append(f"| {f.stem} | {c.get('num_key_value_heads')} | {d['verdict']} | {fmt(kp)} | {fmt(km)} | {fmt(e1)} | "
                 f"{cp} | {cm} | {fmt(e2)} | {'ok' if ok else 'NO'} |")
(R / "tp-compare.json").write_text(json.dumps(rows, indent=1))
(R / "tp-compare.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
say "DONE"
