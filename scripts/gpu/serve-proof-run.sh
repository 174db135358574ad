#!/usr/bin/env bash
# The H200 proof of the serving path and the output-equivalence gate, run on the device by
# `RUN=serve-proof-run.sh scripts/gpu-proof.sh start N` in the background.  Needs the bundle
# (vllm 0.26.0 slimmed, wheels.txt, wheels-serve.txt: ray 2.58.1 + serve) in /tmp/bwhl/whl.
# Two chains run side by side on the one GPU:
#   S (sequential, one Ray head at a time): `smoke --local --serve` through ray.serve.llm (auto) and
#     through the vllm-server fallback, for qwen3-sparse and gemma4-ple-long, patched, 3 x 16;
#   L (pairs): the reference gate: PLE reference (unpatched plain name, eager), the long name
#     unpatched and patched against it (eager and CUDA graphs), run-to-run noise (eager twice,
#     CUDA graphs twice, eager reference vs CUDA graphs; two models), and qwen3-sparse under the
#     override against the same weights declared full_attention.
# Writes $P/progress.txt, results/*.json (smoke reports), refs/*.json (references), logs/*.log.
set -uo pipefail
. "$(dirname "$0")/env.sh"
F=$P/refs; mkdir -p "$F"
smoke() {  # smoke NAME PYTHONPATH ARGS...  -> results/NAME.json, logs/NAME.log, logs/NAME.smoke.txt
  local name=$1 pp=$2; shift 2
  PYTHONPATH=$pp python3 -c 'import sys; from builder.cli import main; main(["smoke"] + sys.argv[1:], prog_name="build-image")' \
     --local --vllm-bin "$VB" --log-file "$L/$name.log" --json --skip-checkpoint-check "$@" \
     > "$R/$name.json" 2> "$L/$name.smoke.txt"
  local rc=$?; echo "$rc" > "$R/$name.rc"
  say "$name: rc=$rc $(python3 -c "
import json; d=json.load(open('$R/$name.json')); e=d.get('equivalence') or {}; s=d.get('serve') or {}
print(d['verdict'], d['boot'], [r['ok'] for r in d['rounds']], 'backend', s.get('backend'), 'eq', e.get('verdict'), e.get('first_diff'), e.get('max_abs_dlogprob'), d['failures'][:2])" 2>/dev/null | cut -c1-600)"
}
# --no-chat: the synthetic checkpoints have no chat template (vLLM answers the chat round 400)
COMMON=(--no-chat --max-model-len 2048 --boot-timeout 420 --timeout 120 --concurrency 16 --rounds 3 --max-tokens 64 --prompt-tokens 128 --no-plan)
EAGER=(--extra-arg=--enforce-eager)
PAR=(--gpu-memory-utilization 0.08 --extra-arg=--kv-cache-memory --extra-arg=2147483648)

say "install"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/bwhl/whl/*.whl > "$L/pip.log" 2>&1 || { say "pip install FAILED"; tail -20 "$L/pip.log" | tee -a "$P/progress.txt"; echo FAILED >> "$P/progress.txt"; exit 1; }
PYTHONPATH=$PP_UN python3 -c "import vllm, transformers, torch, ray; from importlib import metadata; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__, 'ray', ray.__version__, [r for r in metadata.requires('ray') if r.startswith('vllm')])" > "$R/versions.txt" 2>&1
say "versions: $(tail -1 "$R/versions.txt")"
rm -rf /tmp/sitep && mkdir -p /tmp/sitep && cp -a /tmp/site/vllm /tmp/site/vllm-0.26.0.dist-info /tmp/sitep/
( cd "$REPO" && PYTHONPATH=$PP_UN python3 -c 'from builder.cli import main; main(["patch", "apply", "--vllm", "0.26.0", "--site-packages", "/tmp/sitep"], prog_name="build-image")' ) > "$R/patch-apply.txt" 2>&1
say "patch apply rc=$?: $(tail -2 "$R/patch-apply.txt" | tr '\n' ' ' | cut -c1-300)"
(cd "$REPO" && PYTHONPATH=$PP_UN python3 -m tests.checkpoints "$CK" qwen3-sparse qwen3-sparse-full gemma4-ple-ref gemma4-ple-long) > "$L/checkpoints.log" 2>&1 || { say "checkpoints FAILED"; tail -20 "$L/checkpoints.log" | tee -a "$P/progress.txt"; }
for d in "$CK"/*; do cp "$d/config.json" "$R/$(basename "$d").config.json"; done
say "checkpoints: $(ls "$CK" | tr '\n' ' ')"

chain_serve() {
  local SV=(--serve --serve-python python3 --gpu-memory-utilization 0.3 "${EAGER[@]}" "${COMMON[@]}")
  smoke s-llm-qwen3-sparse "$PP_PA" --model "$CK/qwen3-sparse" "${SV[@]}"
  smoke s-llm-gemma4-ple-long "$PP_PA" --model "$CK/gemma4-ple-long" "${SV[@]}"
  smoke s-fb-qwen3-sparse "$PP_PA" --model "$CK/qwen3-sparse" --serve-backend vllm-server "${SV[@]}"
  smoke s-fb-gemma4-ple-long "$PP_PA" --model "$CK/gemma4-ple-long" --serve-backend vllm-server "${SV[@]}"
  say "chain S done"
}
chain_local() {
  smoke r-u-ple-ref-eager1 "$PP_UN" --model "$CK/gemma4-ple-ref" "${PAR[@]}" "${EAGER[@]}" "${COMMON[@]}" --save-reference "$F/ple-ref-eager.json" &
  smoke r-p-qwen3-full "$PP_PA" --model "$CK/qwen3-sparse-full" "${PAR[@]}" "${EAGER[@]}" "${COMMON[@]}" --save-reference "$F/qwen3-full.json" &
  wait
  smoke r-u-ple-long "$PP_UN" --model "$CK/gemma4-ple-long" "${PAR[@]}" "${EAGER[@]}" "${COMMON[@]}" --reference "$F/ple-ref-eager.json" &
  smoke r-p-ple-long "$PP_PA" --model "$CK/gemma4-ple-long" "${PAR[@]}" "${EAGER[@]}" "${COMMON[@]}" --reference "$F/ple-ref-eager.json" &
  wait
  smoke r-u-ple-ref-eager2 "$PP_UN" --model "$CK/gemma4-ple-ref" "${PAR[@]}" "${EAGER[@]}" "${COMMON[@]}" --reference "$F/ple-ref-eager.json" &
  smoke r-p-qwen3-sparse "$PP_PA" --model "$CK/qwen3-sparse" "${PAR[@]}" "${EAGER[@]}" "${COMMON[@]}" --reference "$F/qwen3-full.json" &
  wait
  smoke r-u-ple-ref-graphs1 "$PP_UN" --model "$CK/gemma4-ple-ref" "${PAR[@]}" "${COMMON[@]}" --reference "$F/ple-ref-eager.json" --save-reference "$F/ple-ref-graphs.json"
  smoke r-u-ple-ref-graphs2 "$PP_UN" --model "$CK/gemma4-ple-ref" "${PAR[@]}" "${COMMON[@]}" --reference "$F/ple-ref-graphs.json"
  # more noise (a second model) and the unloaded PLE table under CUDA graphs
  smoke n-q-full-eager2 "$PP_PA" --model "$CK/qwen3-sparse-full" "${PAR[@]}" "${EAGER[@]}" "${COMMON[@]}" --reference "$F/qwen3-full.json" &
  smoke n-q-full-graphs1 "$PP_PA" --model "$CK/qwen3-sparse-full" "${PAR[@]}" "${COMMON[@]}" --reference "$F/qwen3-full.json" --save-reference "$F/qwen3-full-graphs.json" &
  smoke n-u-ple-long-graphs "$PP_UN" --model "$CK/gemma4-ple-long" "${PAR[@]}" "${COMMON[@]}" --reference "$F/ple-ref-graphs.json" &
  smoke n-p-ple-long-graphs "$PP_PA" --model "$CK/gemma4-ple-long" "${PAR[@]}" "${COMMON[@]}" --reference "$F/ple-ref-graphs.json" &
  wait
  smoke n-q-full-graphs2 "$PP_PA" --model "$CK/qwen3-sparse-full" "${PAR[@]}" "${COMMON[@]}" --reference "$F/qwen3-full-graphs.json" &
  smoke n-p-q-sparse-graphs "$PP_PA" --model "$CK/qwen3-sparse" "${PAR[@]}" "${COMMON[@]}" --reference "$F/qwen3-full-graphs.json" &
  wait
  say "chain L done"
}
say "chains S and L"
chain_serve &
chain_local &
wait
say "DONE"
