#!/usr/bin/env bash
# The Serve path and the output-equivalence gate of shipped releases from the layered bundle, run on the device by
# proof-run.sh (after its RELEASES, before DONE) when SERVE_RELEASES is set.  Needs each release's vllm, torch and
# ray layers in /tmp/L and its patched copy (/tmp/L/vllm-V.patched: V in RELEASES too), and the checkpoints of
# proof-run.sh in $CK.  Two chains side by side on the one GPU, then one boot alone:
#   S (one Ray head at a time): for each V of SERVE_RELEASES, `smoke --local --serve --vllm V`, patched, with the
#     backend V's default lock chooses (its `serve-backend` line), qwen3-sparse, utilization 0.3, 3 x 16 + chat;
#   G (GATE_RELEASE, default the first of SERVE_RELEASES; fixed 2 GiB KV caches): qwen3-sparse-full records a
#     reference, then side by side the same checkpoint again (run-to-run noise), two copies with one weight
#     scaled (model.norm.weight x GATE_NORM_FACTOR, layer 0's mlp.down_proj x GATE_DOWN_FACTOR: both must FAIL)
#     and qwen3-sparse under the layer-type override (must PASS), patched and unpatched (r-V-sparse-unpatched: what
#     the release computes for the declared layer type without the rewrite); GATE_RELEASE needs its engine layers
#     and its patched copy only (no ray layer, and it need not be in SERVE_RELEASES);
#   DRYRUN=1: here, without a GPU: the order and the paths, the boots and the scaled copies stubbed;
#   D (DEFAULT_UTIL_RELEASE, when set): qwen3-sparse patched alone with gpu_memory_utilization unset, as the
#     GT boot of proof-run.sh otherwise (vLLM's own default: 0.34.0's extensible KV cache).
# Optional steps start only while $SECONDS (since the run began) < RUN_BUDGET_S.
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=env.sh
. "$(dirname "$0")/env.sh"
# shellcheck source-path=SCRIPTDIR source=device-calls.sh
BUNDLE=/tmp/L . "$(dirname "$0")/device-calls.sh"
F=$P/refs; mkdir -p "$F"
BUDGET=${RUN_BUDGET_S:-100000}
smoke() {  # smoke NAME PYTHONPATH ARGS...  -> results/NAME.json, logs/NAME.log, logs/NAME.smoke.txt
  local name=$1 pp=$2; shift 2
  PYTHONPATH=$pp python3 -c 'import sys; from builder.cli import main; main(["smoke"] + sys.argv[1:], prog_name="build-image")' \
     --local --vllm-bin "$VB" --log-file "$L/$name.log" --json "$@" > "$R/$name.json" 2> "$L/$name.smoke.txt"
  local rc=$?; echo "$rc" > "$R/$name.rc"
  say "$name: rc=$rc $(python3 -c "
import json; d=json.load(open('$R/$name.json')); e=d.get('equivalence') or {}; s=d.get('serve') or {}
print(d['verdict'], d['boot'], [r['ok'] for r in d['rounds']], 'kv', d['kv_cache']['tokens'], 'backend', s.get('backend'),
      'eq', e.get('verdict'), e.get('first_diff'), e.get('max_abs_dlogprob'), d['failures'][:2])" 2>/dev/null | cut -c1-600)"
}
if [ -n "${DRYRUN:-}" ]; then
  smoke() { echo "{}" > "$R/$1.json"; say "$1: (dry run) PYTHONPATH=$2 ${*:3}"; sleep 1; }
fi
in_budget() { [ "$SECONDS" -lt "$BUDGET" ] || { say "$1: skipped (run budget ${BUDGET} s spent)"; return 1; }; }
COMMON=(--max-model-len 2048 --boot-timeout 420 --timeout 120 --concurrency 16 --rounds 3 --max-tokens 64 --prompt-tokens 128 --no-plan)
EAGER=(--extra-arg=--enforce-eager)
PAR=(--gpu-memory-utilization 0.08 --extra-arg=--kv-cache-memory --extra-arg=2147483648)
GATE=${GATE_RELEASE:-${SERVE_RELEASES%% *}}

ready=""
for V in $SERVE_RELEASES; do
  # shellcheck disable=SC2046  # one word per layer
  if ! why=$(SERVE=1 await_layers $(SERVE=1 release_layers "$V")); then say "serve $V SKIPPED: layers ($why)"; continue; fi
  [ -d "/tmp/L/vllm-$V.patched/vllm" ] || { say "serve $V SKIPPED: no patched copy (/tmp/L/vllm-$V.patched)"; continue; }
  PYTHONPATH=$(release_pp "$V") python3 -c "import ray, vllm; print('ray', ray.__version__, 'vllm', vllm.__version__)" \
    > "$R/versions-serve-$V.txt" 2>&1
  say "serve $V: $(tail -1 "$R/versions-serve-$V.txt"); backend from lockfiles/vllm-$V: $(grep -m1 'serve-backend' "$REPO/lockfiles/vllm-$V/requirements.lock")"
  ready="$ready $V"
done

gate_ckpts() {  # the scaled copies of qwen3-sparse-full
  # qwen3-sparse-full must come from the stack that wrote qwen3-sparse (proof-run.sh writes both with the first
  # release's torch and transformers): the same seed under another torch/transformers gives other weights, and
  # the override comparison then measures that difference (seen on 2026-12-03: 0.34.0's stack, max |Δ| 1.73)
  local pp; pp=$(release_pp "$GATE")
  if [ ! -f "$CK/qwen3-sparse-full/config.json" ]; then
    say "gate: qwen3-sparse-full missing (SERVE_RELEASES unset when the checkpoints were written): r-$GATE-sparse compares other weights"
    (cd "$REPO" && PYTHONPATH=$pp python3 -m tests.checkpoints "$CK" qwen3-sparse-full) > "$L/checkpoints-gate.log" 2>&1
  fi
  cp "$CK/qwen3-sparse-full/config.json" "$R/qwen3-sparse-full.config.json"
  PYTHONPATH=$pp python3 "$REPO/scripts/gpu/scale_weight.py" "$CK/qwen3-sparse-full" "$CK/qwen3-full-norm" \
    model.norm.weight "${GATE_NORM_FACTOR:-1.25}" > "$R/scaled-norm.json" 2>> "$L/checkpoints-gate.log"
  PYTHONPATH=$pp python3 "$REPO/scripts/gpu/scale_weight.py" "$CK/qwen3-sparse-full" "$CK/qwen3-full-down" \
    model.layers.0.mlp.down_proj.weight "${GATE_DOWN_FACTOR:-2}" > "$R/scaled-down.json" 2>> "$L/checkpoints-gate.log"
  say "gate checkpoints: $(cat "$R/scaled-norm.json" "$R/scaled-down.json" | tr '\n' ' ' | cut -c1-400)"
}

chain_serve() {
  local V
  for V in $ready; do
    in_budget "s-$V-qwen3-sparse" || return
    smoke "s-$V-qwen3-sparse" "$(release_pp "$V" patched)" --vllm "$V" --serve --serve-python python3 \
      --model "$CK/qwen3-sparse" --gpu-memory-utilization 0.3 "${EAGER[@]}" "${COMMON[@]}"
  done
  say "chain S done"
}
chain_gate() {
  [ "$GATE" != none ] && [ -n "$GATE" ] || return 0
  # shellcheck disable=SC2046  # one word per layer
  if ! why=$(SERVE=0 await_layers $(SERVE=0 release_layers "$GATE")); then say "gate $GATE SKIPPED: layers ($why)"; return; fi
  [ -d "/tmp/L/vllm-$GATE.patched/vllm" ] || { say "gate $GATE SKIPPED: no patched copy (/tmp/L/vllm-$GATE.patched)"; return; }
  local PA UN; PA=$(release_pp "$GATE" patched); UN=$(release_pp "$GATE")
  if [ -n "${DRYRUN:-}" ]; then say "gate checkpoints (dry run)"; : > "$F/$GATE-qwen3-full.json"; else gate_ckpts; fi
  in_budget "gate $GATE" || return
  smoke "r-$GATE-full-1" "$PA" --vllm "$GATE" --model "$CK/qwen3-sparse-full" "${PAR[@]}" "${EAGER[@]}" "${COMMON[@]}" \
    --save-reference "$F/$GATE-qwen3-full.json"
  [ -f "$F/$GATE-qwen3-full.json" ] || { say "gate $GATE: no reference recorded"; return; }
  smoke "r-$GATE-full-2" "$PA" --vllm "$GATE" --model "$CK/qwen3-sparse-full" "${PAR[@]}" "${EAGER[@]}" "${COMMON[@]}" \
    --reference "$F/$GATE-qwen3-full.json" &
  smoke "r-$GATE-full-norm" "$PA" --vllm "$GATE" --skip-checkpoint-check --model "$CK/qwen3-full-norm" "${PAR[@]}" \
    "${EAGER[@]}" "${COMMON[@]}" --reference "$F/$GATE-qwen3-full.json" &
  smoke "r-$GATE-full-down" "$PA" --vllm "$GATE" --skip-checkpoint-check --model "$CK/qwen3-full-down" "${PAR[@]}" \
    "${EAGER[@]}" "${COMMON[@]}" --reference "$F/$GATE-qwen3-full.json" &
  smoke "r-$GATE-sparse" "$PA" --vllm "$GATE" --model "$CK/qwen3-sparse" "${PAR[@]}" "${EAGER[@]}" "${COMMON[@]}" \
    --reference "$F/$GATE-qwen3-full.json" &
  smoke "r-$GATE-sparse-unpatched" "$UN" --vllm "$GATE" --model "$CK/qwen3-sparse" "${PAR[@]}" "${EAGER[@]}" \
    "${COMMON[@]}" --reference "$F/$GATE-qwen3-full.json" &
  wait
  say "chain G done"
}
say "serve and gate: SERVE_RELEASES=$SERVE_RELEASES (ready:${ready:- none}); gate on $GATE"
chain_serve &
chain_gate &
wait
if [ -n "${DEFAULT_UTIL_RELEASE:-}" ] && [ -d "/tmp/L/vllm-$DEFAULT_UTIL_RELEASE.patched/vllm" ] \
   && in_budget "d-$DEFAULT_UTIL_RELEASE-qwen3-sparse"; then
  V=$DEFAULT_UTIL_RELEASE
  say "wave $V/D: patched qwen3-sparse alone, gpu_memory_utilization unset (vLLM's default)"
  smoke "d-$V-qwen3-sparse" "$(release_pp "$V" patched)" --vllm "$V" --model "$CK/qwen3-sparse" --max-model-len 4096 \
    --max-num-seqs 32 "${EAGER[@]}" --extra-arg=--max-num-batched-tokens --extra-arg=8192 --no-plan --boot-timeout 420 \
    --timeout 120 --concurrency 16 --rounds 3 --max-tokens 64 --prompt-tokens 128
fi
