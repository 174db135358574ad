#!/usr/bin/env bash
# The release matrix on the one H200, boots side by side, run on the device by scripts/gpu/cas-proof.sh launch
# while the content-addressed parts still upload.  Writes under $P (default /tmp/proof): progress.txt,
# results/*.json, logs/*.log, results/gate.log.
#   RELEASES="0.26.0 0.27.0 ..."  in upload order; per release, as soon as its layers are installed: its vllm
#     patched by `build-image patch apply --vllm V` in a copy, then, started together and not awaited:
#       p-V-qwen3-sparse   patched, utilization 0.5 (plan vs vLLM's logged KV tokens), GPU_GATE=ex
#       p-V-gemma4-ple-long patched, fixed 2 GiB KV cache, GPU_GATE=sh
#       u-V-gemma4-ple-ref  (V in REF_RELEASES) unpatched plain-name reference, fixed KV, GPU_GATE=sh
#     3 x 16 + the chat round each.  scripts/gpu/gate/sitecustomize.py keeps each boot's GPU window (init snapshot
#     .. KV cache allocated and warmed up) exclusive for the sized boots, shared for the fixed ones, and server
#     stops outside the sized windows; everything else of the boots (imports, config, requests) overlaps.
#     At most MAXJOBS background jobs (a release's boots are one).  "MATRIX DONE" when every boot has ended.
#   UNPATCHED="0.26.0 0.33.0": for these releases also the unpatched boots, started with the others:
#       u-V-qwen3-sparse (utilization 0.5, GPU_GATE=ex), u-V-gemma4-ple-long (fixed KV, sh) and the reference
#       u-V-gemma4-ple-ref; each names its failure in its report (boot error, or a probe unlike the reference's).
#   PATCHED=0: no patched boots and no patch apply (a run of the unpatched boots only); PATCHED="0.33.0 ...": the
#     patched boots of those releases only (default 1: every release's).
#   GATE_RELEASE=0.34.0: after the matrix, the output-equivalence gate on that release (release-serve-run.sh's chain
#     G: a full-attention reference, the noise of a second run, two scaled weights, the layer-type override patched
#     and unpatched); its patched copy is made whatever PATCHED says, and qwen3-sparse-full is written with the
#     other checkpoints, by the first release's stack, so that the override rows compare the same weights.
#   SERVE_RELEASES="0.27.0": then `smoke --serve` with the backend of each one's lock (release-serve-run.sh, no
#     equivalence gate).
#   COLD_FORMATS="instanttensor runai_streamer": then the cold-start runs of docs/cold-start.md with vllm 0.26.0
#     (its layer, the device's torch, the `cold` layer's load-format wheels) on the ~21.8 GB checkpoint that
#     coldstart_ckpt.py writes on the CPU while the matrix runs: the first format with an empty compile cache,
#     the next with the kept one, the page cache cold (drop_caches) before each.
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=env.sh
. "$(dirname "$0")/env.sh"
export BUNDLE=/tmp/L   # the installed bundle's manifest, for release_layers (also in release-serve-run.sh)
# shellcheck source-path=SCRIPTDIR source=device-calls.sh
. "$(dirname "$0")/device-calls.sh"
GD=$REPO/scripts/gpu/gate
export GPU_GATE_LOCK=$P/gate.lock GPU_GATE_LOG=$R/gate.log
MAXJOBS=${MAXJOBS:-6}   # background jobs: releases in flight (2-3 boots each), the checkpoint writer
T0=$SECONDS
SMOKE_PY='import sys
from builder.cli import main
main(["smoke"] + sys.argv[1:], prog_name="build-image")'
smoke() {  # smoke NAME PYTHONPATH GATE ARGS...  -> results/NAME.json, logs/NAME.log, logs/NAME.smoke.txt
  local name=$1 pp=$2 gate=$3; shift 3
  GPU_GATE=$gate GPU_GATE_TAG=$name GPU_GATE_FREE_GIB=$FREE_GIB PYTHONPATH=$GD:$pp python3 -c "$SMOKE_PY" --local --vllm-bin "$VB" \
    --log-file "$L/$name.log" --json "$@" > "$R/$name.json" 2> "$L/$name.smoke.txt"
  local rc=$?; echo "$rc" > "$R/$name.rc"
  say "$name: rc=$rc $(python3 -c "import json,sys; d=json.load(open('$R/$name.json')); print(d['verdict'], d['boot'], [r['ok'] for r in d['rounds']], 'kv', d['kv_cache']['tokens'], 'plan', (d.get('plan') or {}).get('kv_tokens_per_gpu') or (d.get('plan') or {}).get('kv_tokens'), 'probe', (d.get('probe') or {}).get('text'), d['failures'][:2])" 2>/dev/null | cut -c1-500)"
}
throttle() { while [ "$(jobs -rp | wc -l)" -ge "$MAXJOBS" ]; do wait -n; done; }
patch_copy() {  # patch_copy V SITE DEST PYTHONPATH: DEST = SITE's vllm package patched by the project's CLI
  local v=$1 site=$2 dest=$3 pp=$4
  rm -rf "$dest" && mkdir -p "$dest" && cp -a "$site/vllm" "$site/vllm-$v.dist-info" "$dest/"
  ( cd "$REPO" && PYTHONPATH=$pp python3 -c 'import sys
from builder.cli import main
main(["patch", "apply", "--vllm", sys.argv[1], "--site-packages", sys.argv[2]], prog_name="build-image")' "$v" "$dest" ) \
    > "$R/patch-apply-$v.txt" 2>&1
  echo $? > "$R/patch-apply-$v.rc"
  diff -r -q "$site/vllm" "$dest/vllm" > "$R/patched-files-$v.txt" 2>&1
  say "patch apply $v rc=$(cat "$R/patch-apply-$v.rc"), files differing: $(grep -c differ "$R/patched-files-$v.txt")"
  [ "$(cat "$R/patch-apply-$v.rc")" = 0 ]
}
in_list() { case " $2 " in *" $1 "*) return 0 ;; esac; return 1; }   # in_list V "LIST"
patched_boots() {  # patched_boots V: PATCHED is 1 (every release), 0 (none) or a list of releases
  case "${PATCHED:-1}" in 1) return 0 ;; 0) return 1 ;; esac
  in_list "$1" "$PATCHED"
}
GATE_RELEASE=${GATE_RELEASE:-none}
run_release() {  # run_release V UNPATCHED_PP PATCHED_PP: its boots side by side; then its patched copy goes (disk)
  local V=$1 UN=$2 PA=$3
  local unp=0; in_list "$V" "${UNPATCHED:-}" && unp=1
  if patched_boots "$V"; then
    smoke "p-$V-qwen3-sparse" "$PA" ex --vllm "$V" --model "$CK/qwen3-sparse" "${GT[@]}" &
    smoke "p-$V-gemma4-ple-long" "$PA" sh --vllm "$V" --model "$CK/gemma4-ple-long" "${PAR[@]}" &
  fi
  if [ $unp = 1 ]; then
    smoke "u-$V-qwen3-sparse" "$UN" ex --vllm "$V" --model "$CK/qwen3-sparse" "${GT[@]}" &
    smoke "u-$V-gemma4-ple-long" "$UN" sh --vllm "$V" --model "$CK/gemma4-ple-long" "${PAR[@]}" &
  fi
  in_list "$V" "${REF_RELEASES:-}" && unp=1
  [ $unp = 0 ] || smoke "u-$V-gemma4-ple-ref" "$UN" sh --vllm "$V" --model "$CK/gemma4-ple-ref" "${PAR[@]}" &
  wait
  in_list "$V" "${SERVE_RELEASES:-} $GATE_RELEASE" || rm -rf "/tmp/L/vllm-$V.patched"
}
GT=(--gpu-memory-utilization 0.5 --max-model-len 4096 --max-num-seqs 32 --extra-arg=--enforce-eager --extra-arg=--max-num-batched-tokens --extra-arg=8192 --no-plan --boot-timeout 420 --timeout 120 --concurrency 16 --rounds 3 --max-tokens 64 --prompt-tokens 128)
PAR=(--gpu-memory-utilization 0.08 --no-plan --extra-arg=--kv-cache-memory --extra-arg=2147483648 --max-model-len 2048 --extra-arg=--enforce-eager --boot-timeout 420 --timeout 120 --concurrency 16 --rounds 3 --max-tokens 64 --prompt-tokens 128)
TOTAL_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
TOTAL_MIB=${TOTAL_MIB:-143771}
# a sized boot starts its window once half the card (its utilization) and 1 GiB are free
FREE_GIB=$(python3 -c "print(round(0.5 * $TOTAL_MIB / 1024 + 1, 2))")

if [ -n "${DRYRUN:-}" ]; then  # here, without a GPU: the layers, paths and order, with the boots and the patch stubbed
  smoke() { echo "{}" > "$R/$1.json"; say "$1: (dry run) PYTHONPATH=$2 gate=$3"; sleep 1; }
  patch_copy() { mkdir -p "$3/vllm"; say "patch apply $1 (dry run) on $3 from $2"; }
fi
say "matrix: releases $RELEASES; unpatched boots: ${UNPATCHED:-none}; patched boots: $(case "${PATCHED:-1}" in 1) echo all ;; 0) echo none ;; *) echo "$PATCHED" ;; esac); PLE references: ${REF_RELEASES:-none}; then Serve: ${SERVE_RELEASES:-none}; gate: $GATE_RELEASE; cold start: ${COLD_FORMATS:-none}"
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1
{ nproc; free -g; df -h /tmp; uname -r; } > "$R/machine.txt" 2>&1
if [ -n "${COLD_FORMATS:-}" ]; then  # the cold-start checkpoint, on the CPU, beside the matrix
  ( say "cold checkpoint: writing /tmp/ck20 (CPU)"
    CKPT_DEVICE=cpu nice -n 10 python3 "$REPO/scripts/gpu/coldstart_ckpt.py" /tmp/ck20 > "$R/cold-checkpoint.json" 2> "$L/cold-checkpoint.log"
    say "cold checkpoint: rc=$? $(cut -c1-300 "$R/cold-checkpoint.json")" ) &
  CKPID=$!
fi
first=1
for V in $RELEASES; do
  # shellcheck disable=SC2046  # one word per layer
  if ! why=$(await_layers $(SERVE=0 release_layers "$V")); then say "$V SKIPPED: its layers are not installed ($why)"; continue; fi
  UN=$(release_pp "$V"); PA=$(release_pp "$V" patched)
  say "$V: layers installed ($(for l in $(SERVE=0 release_layers "$V"); do printf '%s %s; ' "$l" "$(cat "/tmp/L/$l.ok")"; done))"
  PYTHONPATH=$UN python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__, torch.__file__)" > "$R/versions-$V.txt" 2>&1 &
  if [ $first = 1 ]; then
    extra=(); [ "$GATE_RELEASE" = none ] || extra=(qwen3-sparse-full)
    (cd "$REPO" && PYTHONPATH=$UN python3 -m tests.checkpoints "$CK" qwen3-sparse gemma4-ple-ref gemma4-ple-long "${extra[@]}") > "$L/checkpoints.log" 2>&1 \
      || say "checkpoint generation FAILED: $(tail -3 "$L/checkpoints.log")"
    for d in "$CK"/*; do cp "$d/config.json" "$R/$(basename "$d").config.json"; done
    say "checkpoints written with $V's torch and transformers"; first=0
  fi
  site=$(echo "$UN" | tr ':' '\n' | grep "/tmp/L/vllm-$V$")
  if patched_boots "$V" || [ "$V" = "$GATE_RELEASE" ]; then
    patch_copy "$V" "$site" "/tmp/L/vllm-$V.patched" "$UN" || { say "$V: patch apply FAILED, its runs skipped"; continue; }
  fi
  throttle
  run_release "$V" "$UN" "$PA" &
  say "$V: started ($((SECONDS - T0)) s into the run)"
done
for j in $(jobs -rp); do [ "$j" = "${CKPID:-}" ] || wait "$j"; done
say "MATRIX DONE ($((SECONDS - T0)) s)"

if [ -n "${SERVE_RELEASES:-}" ] || [ "$GATE_RELEASE" != none ]; then
  SERVE_RELEASES=${SERVE_RELEASES:-} GATE_RELEASE=$GATE_RELEASE DRYRUN=${DRYRUN:-} "$(dirname "$0")/release-serve-run.sh"
fi

if [ -n "${COLD_FORMATS:-}" ]; then
  [ -z "${CKPID:-}" ] || wait "$CKPID"
  cl=$(python3 -c 'import json; m=json.load(open("/tmp/L/manifest.json")); print(*[n for n, l in m["layers"].items() if l["kind"] == "cold"])')
  # shellcheck disable=SC2086
  if ! why=$(await_layers $cl $(SERVE=0 release_layers 0.26.0)); then say "cold start SKIPPED: layers ($why)"; else
    CPP=/tmp/L/$cl:$(release_pp 0.26.0)
    for m in runai_model_streamer instanttensor; do
      PYTHONPATH=$CPP python3 -c "import $m; print('$m', getattr($m, '__version__', 'imported'))" >> "$R/cold-versions.txt" 2>&1
    done
    say "cold: $(tr '\n' ' ' < "$R/cold-versions.txt" | cut -c1-300)"
    CCA=$P/cca; rm -rf "$CCA"; mkdir -p "$CCA"
    for fmt in $COLD_FORMATS; do
      name=cold-$fmt
      sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
      python3 "$REPO/scripts/gpu/pagecache.py" evict /tmp/ck20 > "$R/$name.pagecache.json" 2>&1
      du -sb "$CCA" > "$R/$name.ccbefore.txt"
      t=$SECONDS
      VLLM_CACHE_ROOT=$CCA PYTHONPATH=$CPP python3 -c "$SMOKE_PY" --local --vllm-bin "$VB" --model /tmp/ck20 --no-plan \
        --skip-checkpoint-check --max-model-len 2048 --concurrency 16 --rounds 1 --max-tokens 32 --prompt-tokens 64 \
        --no-chat --boot-timeout 300 --timeout 120 --load-format "$fmt" --vllm 0.26.0 --log-file "$L/$name.log" --json \
        > "$R/$name.json" 2> "$L/$name.smoke.txt"
      echo $? > "$R/$name.rc"; du -sb "$CCA" > "$R/$name.ccafter.txt"
      say "$name: rc=$(cat "$R/$name.rc") wall=$((SECONDS - t)) s $(python3 -c "import json; d=json.load(open('$R/$name.json')); print(d['verdict'], d['boot'], d.get('cold_start'), d['failures'][:1])" 2>/dev/null | cut -c1-700)"
      grep -hE "Loading weights took|Model loading took|torch.compile took|Graph capturing finished|init engine" "$L/$name.log" | cut -c1-200 >> "$P/progress.txt"
    done
  fi
fi
say "DONE"
