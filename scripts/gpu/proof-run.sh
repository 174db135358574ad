#!/usr/bin/env bash
# The H200 proof itself (issue 6 + issue 7 ground truth), run on the device by
# scripts/gpu-proof.sh in the background.  Needs /tmp/bundle.tar (joined parts).
# Writes everything under $P (default /tmp/proof): progress.txt, results/*.json, logs/*.log.
set -uo pipefail
. "$(dirname "$0")/env.sh"
SMOKE_PY='import sys
try:
    from builder.cli import main
except Exception as e:  # another stage failing to import must not stop the probe
    print(f"builder.cli import failed ({e!r}); using builder.commands.smoke", file=sys.stderr)
    from builder.commands.smoke import command as main
    main(sys.argv[1:], prog_name="build-image smoke")
main(["smoke"] + sys.argv[1:], prog_name="build-image")'
smoke() {  # smoke NAME PYTHONPATH ARGS...  -> results/NAME.json, logs/NAME.log, logs/NAME.smoke.txt
  local name=$1 pp=$2; shift 2
  PYTHONPATH=$pp python3 -c "$SMOKE_PY" --local --vllm-bin "$VB" --log-file "$L/$name.log" --json "$@" \
     > "$R/$name.json" 2> "$L/$name.smoke.txt"
  local rc=$?; echo "$rc" > "$R/$name.rc"
  say "$name: rc=$rc $(python3 -c "import json,sys; d=json.load(open('$R/$name.json')); print(d['verdict'], d['boot'], d['kv_cache']['tokens'], d['failures'][:2])" 2>/dev/null | cut -c1-400)"
}
COMMON=(--max-model-len 2048 --extra-arg=--enforce-eager --boot-timeout 420 --timeout 120 --concurrency 16 --rounds 3 --max-tokens 64 --prompt-tokens 128)

say "install"
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/bwhl/whl/*.whl > "$L/pip.log" 2>&1 || { say "pip install FAILED"; tail -20 "$L/pip.log" | tee -a "$P/progress.txt"; exit 1; }
PYTHONPATH=$PP_UN python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)" > "$R/versions.txt" 2>&1
say "versions: $(tail -1 "$R/versions.txt")"

PHASES=${PHASES:-"unpatched impossible gt patched"}
if [[ " $PHASES " == *" patched "* || " $PHASES " == *" prod "* ]]; then
rm -rf /tmp/sitep && mkdir -p /tmp/sitep && cp -a /tmp/site/vllm /tmp/site/vllm-0.26.0.dist-info /tmp/sitep/
say "patch apply (the project's own series) on /tmp/sitep"
( cd "$REPO" && PYTHONPATH=$PP_UN python3 -c 'import sys
try:
    from builder.cli import main
except Exception as e:
    print(f"builder.cli import failed ({e!r}); using builder.commands.patch", file=sys.stderr)
    from builder.commands.patch import command as main
    main(["apply", "--vllm", "0.26.0", "--site-packages", "/tmp/sitep"], prog_name="build-image patch")
main(["patch", "apply", "--vllm", "0.26.0", "--site-packages", "/tmp/sitep"], prog_name="build-image")' ) > "$R/patch-apply.txt" 2>&1
echo $? > "$R/patch-apply.rc"
say "patch apply rc=$(cat "$R/patch-apply.rc"): $(tail -3 "$R/patch-apply.txt" | tr '\n' ' ' | cut -c1-300)"
[ "$(cat "$R/patch-apply.rc")" = 0 ] || { say "patch apply FAILED: patched runs skipped"; exit 1; }
(cd /tmp && diff -r -q site/vllm sitep/vllm) > "$R/patched-files.txt" 2>&1
say "files differing after patch: $(grep -c differ "$R/patched-files.txt")"
fi

say "checkpoints"
(cd "$REPO" && PYTHONPATH=$PP_UN python3 -m tests.checkpoints "$CK") > "$L/checkpoints.log" 2>&1 || { say "checkpoint generation FAILED"; tail -30 "$L/checkpoints.log" | tee -a "$P/progress.txt"; }
for d in "$CK"/*; do b=$(basename "$d"); cp "$d/config.json" "$R/$b.config.json"; [ -f "$d/ple-variant.json" ] && cp "$d/ple-variant.json" "$R/$b.ple-variant.json"; done
cat "$L/checkpoints.log" | tee -a "$P/progress.txt"

PHASES=${PHASES:-"unpatched impossible gt patched"}
has() { case " $PHASES " in *" $1 "*) return 0;; esac; return 1; }
say "phases: $PHASES"

if has unpatched; then
say "wave U: unpatched vLLM: expected refusals + the PLE reference (parallel)"
smoke u-qwen3-sparse "$PP_UN" --model "$CK/qwen3-sparse" --gpu-memory-utilization 0.08 --no-plan "${COMMON[@]}" &
smoke u-gemma4-ple-long "$PP_UN" --model "$CK/gemma4-ple-long" --gpu-memory-utilization 0.08 --no-plan "${COMMON[@]}" &
smoke u-gemma4-ple-short "$PP_UN" --model "$CK/gemma4-ple-short" --gpu-memory-utilization 0.08 --no-plan "${COMMON[@]}" &
smoke u-gemma4-ple-numbered "$PP_UN" --model "$CK/gemma4-ple-numbered" --gpu-memory-utilization 0.08 --no-plan "${COMMON[@]}" &
wait
smoke u-gemma4-ple-ref "$PP_UN" --model "$CK/gemma4-ple-ref" --gpu-memory-utilization 0.08 --no-plan "${COMMON[@]}"
fi

if has impossible; then
say "wave I: impossible configuration: refused by the plan (no boot), and booted with --no-plan"
IMPOSSIBLE=(--model "$CK/qwen3-b" --gpu-memory-utilization 0.08 --max-model-len 1048576 --extra-arg=--enforce-eager --boot-timeout 420 --timeout 120 --concurrency 16 --rounds 3)
smoke x-impossible-planned "$PP_UN" "${IMPOSSIBLE[@]}"
smoke x-impossible-noplan "$PP_UN" "${IMPOSSIBLE[@]}" --no-plan
fi

GT=(--gpu-memory-utilization 0.5 --max-model-len 4096 --max-num-seqs 32 --extra-arg=--enforce-eager --extra-arg=--max-num-batched-tokens --extra-arg=8192 --no-plan --boot-timeout 420 --timeout 120 --concurrency 16 --rounds 3 --max-tokens 64 --prompt-tokens 128)
if has gt; then
say "wave G: plan ground truth, alone on the GPU, utilization 0.5"
smoke g-qwen3-a "$PP_UN" --model "$CK/qwen3-a" "${GT[@]}"
smoke g-qwen3-b "$PP_UN" --model "$CK/qwen3-b" "${GT[@]}"
fi

if has patched; then
# Parallel boots on one GPU: a fixed KV size (--kv-cache-memory) so that no server sizes its
# KV cache from free memory that its siblings are allocating at the same time.
PAR=(--gpu-memory-utilization 0.08 --no-plan --extra-arg=--kv-cache-memory --extra-arg=2147483648 "${COMMON[@]}")
say "wave P: patched PLE variants + unpatched reference and mid-name variant (parallel)"
smoke u-gemma4-ple-ref2 "$PP_UN" --model "$CK/gemma4-ple-ref" "${PAR[@]}" &
smoke u-gemma4-ple-mid "$PP_UN" --model "$CK/gemma4-ple-mid" "${PAR[@]}" &
smoke p-gemma4-ple-ref "$PP_PA" --model "$CK/gemma4-ple-ref" "${PAR[@]}" &
smoke p-gemma4-ple-mid "$PP_PA" --model "$CK/gemma4-ple-mid" "${PAR[@]}" &
smoke p-gemma4-ple-long "$PP_PA" --model "$CK/gemma4-ple-long" "${PAR[@]}" &
smoke p-gemma4-ple-short "$PP_PA" --model "$CK/gemma4-ple-short" "${PAR[@]}" &
smoke p-gemma4-ple-numbered "$PP_PA" --model "$CK/gemma4-ple-numbered" "${PAR[@]}" &
wait
say "wave S: patched layer-type rewrite, alone (also plan ground truth #3)"
smoke p-qwen3-sparse "$PP_PA" --model "$CK/qwen3-sparse" "${GT[@]}"
fi
if has prod; then
say "wave F: production flags (CUDA graphs + torch.compile, no --enforce-eager), patched, alone"
PROD=(--gpu-memory-utilization 0.5 --max-model-len 4096 --max-num-seqs 32 --extra-arg=--max-num-batched-tokens --extra-arg=8192 --no-plan --boot-timeout 480 --timeout 120 --concurrency 16 --rounds 3 --max-tokens 64 --prompt-tokens 128)
smoke f-qwen3-sparse "$PP_PA" --model "$CK/qwen3-sparse" "${PROD[@]}"
smoke f-qwen3-b "$PP_PA" --model "$CK/qwen3-b" "${PROD[@]}"
fi
say "DONE"
