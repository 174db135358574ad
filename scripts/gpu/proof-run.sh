#!/usr/bin/env bash
# The H200 proof itself, run on the device by scripts/gpu-proof.sh in the background.
# Writes everything under $P (default /tmp/proof): progress.txt, results/*.json, logs/*.log.
#  - RELEASES="0.27.0 0.33.0 ..." (the layered bundle installed in /tmp/L, `gpu-proof.sh run`): per release, its
#    vllm patched by `build-image patch apply --vllm V` in a copy (/tmp/L/vllm-V.patched), then the phases of
#    PHASES (default "layer-type ple"): layer-type = the patched qwen3-sparse boot alone at utilization 0.5 (plan
#    vs vLLM's logged KV tokens), the unpatched one (releases in UNPATCHED) started once the patched has logged
#    its KV cache; ple = gemma4-ple-long patched, and for UNPATCHED releases unpatched plus the plain-name
#    reference, in parallel with a fixed 2 GiB KV cache.  3 x 16 + the chat round each.  Each release waits for
#    its layers first (the run may start while later layers upload: `gpu-proof.sh launch`); one whose layers
#    failed or stopped arriving is skipped, named in progress.txt.  SERVE_RELEASES: then release-serve-run.sh.
#  - RELEASES unset: the vllm 0.26.0 proof (issue 6 + issue 7 ground truth) from the single bundle in /tmp/bwhl.
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=env.sh
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
patch_copy() {  # patch_copy V SITE DEST PYTHONPATH SUFFIX: DEST = SITE's vllm package patched by the project's CLI
  local v=$1 site=$2 dest=$3 pp=$4 sfx=$5
  rm -rf "$dest" && mkdir -p "$dest" && cp -a "$site/vllm" "$site/vllm-$v.dist-info" "$dest/"
  say "patch apply --vllm $v (the project's own series) on $dest"
  ( cd "$REPO" && PYTHONPATH=$pp python3 -c 'import sys
v, dest = sys.argv[1:3]
try:
    from builder.cli import main
except Exception as e:
    print(f"builder.cli import failed ({e!r}); using builder.commands.patch", file=sys.stderr)
    from builder.commands.patch import command as main
    main(["apply", "--vllm", v, "--site-packages", dest], prog_name="build-image patch")
main(["patch", "apply", "--vllm", v, "--site-packages", dest], prog_name="build-image")' "$v" "$dest" ) \
    > "$R/patch-apply$sfx.txt" 2>&1
  echo $? > "$R/patch-apply$sfx.rc"
  say "patch apply $v rc=$(cat "$R/patch-apply$sfx.rc"): $(tail -3 "$R/patch-apply$sfx.txt" | tr '\n' ' ' | cut -c1-300)"
  [ "$(cat "$R/patch-apply$sfx.rc")" = 0 ] || { say "patch apply $v FAILED: its patched runs are skipped"; return 1; }
  diff -r -q "$site/vllm" "$dest/vllm" > "$R/patched-files$sfx.txt" 2>&1
  say "files differing after patch ($v): $(grep -c differ "$R/patched-files$sfx.txt")"
}
checkpoints() {  # checkpoints PYTHONPATH [NAME...]: tests/checkpoints.py into $CK, configs copied to results/
  (cd "$REPO" && PYTHONPATH=$1 python3 -m tests.checkpoints "$CK" "${@:2}") > "$L/checkpoints.log" 2>&1 \
    || { say "checkpoint generation FAILED"; tail -30 "$L/checkpoints.log" | tee -a "$P/progress.txt"; }
  for d in "$CK"/*; do b=$(basename "$d"); cp "$d/config.json" "$R/$b.config.json"
    [ -f "$d/ple-variant.json" ] && cp "$d/ple-variant.json" "$R/$b.ple-variant.json"; done
  tee -a "$P/progress.txt" < "$L/checkpoints.log"
}
COMMON=(--max-model-len 2048 --extra-arg=--enforce-eager --boot-timeout 420 --timeout 120 --concurrency 16 --rounds 3 --max-tokens 64 --prompt-tokens 128)

GT=(--gpu-memory-utilization 0.5 --max-model-len 4096 --max-num-seqs 32 --extra-arg=--enforce-eager --extra-arg=--max-num-batched-tokens --extra-arg=8192 --no-plan --boot-timeout 420 --timeout 120 --concurrency 16 --rounds 3 --max-tokens 64 --prompt-tokens 128)
# Parallel boots on one GPU: a fixed KV size (--kv-cache-memory) so that no server sizes its
# KV cache from free memory that its siblings are allocating at the same time.
PAR=(--gpu-memory-utilization 0.08 --no-plan --extra-arg=--kv-cache-memory --extra-arg=2147483648 "${COMMON[@]}")
has() { case " $PHASES " in *" $1 "*) return 0;; esac; return 1; }

if [ -n "${RELEASES:-}" ]; then
  PHASES=${PHASES:-"layer-type ple"}
  say "releases: $RELEASES (unpatched too: ${UNPATCHED:-none}); phases: $PHASES"
  nvidia-smi > "$R/nvidia-smi.txt" 2>&1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1
  cp /tmp/L/manifest.json "$R/bundle-manifest.json"
  for f in /tmp/L/*.ok; do echo "$(basename "$f" .ok): $(cat "$f")"; done > "$R/layers-installed.txt"
  # shellcheck source-path=SCRIPTDIR source=device-calls.sh
  BUNDLE=/tmp/L . "$(dirname "$0")/device-calls.sh"
  first=1
  for V in $RELEASES; do
    # launched before the uploads ended (gpu-proof.sh launch): this release's layers may still be arriving
    # shellcheck disable=SC2046  # one word per layer
    if ! why=$(BUNDLE=/tmp/L await_layers $(BUNDLE=/tmp/L SERVE=0 release_layers "$V")); then
      say "$V SKIPPED: its layers are not installed ($why)"; continue
    fi
    UN=$(release_pp "$V"); PA=$(release_pp "$V" patched)
    # the versions, the checkpoints (once, with the first release's torch and transformers) and the patch, side by side
    PYTHONPATH=$UN python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__, torch.__file__)" > "$R/versions-$V.txt" 2>&1 &
    if [ $first = 1 ]; then say "checkpoints (with $V's torch and transformers)"; checkpoints "$UN" qwen3-sparse gemma4-ple-ref gemma4-ple-long ${SERVE_RELEASES:+qwen3-sparse-full} & first=0; fi
    site=$(echo "$UN" | tr ':' '\n' | grep "/tmp/L/vllm-$V$")
    patch_copy "$V" "$site" "/tmp/L/vllm-$V.patched" "$UN" "-$V"; prc=$?
    wait
    say "$V versions: $(tail -1 "$R/versions-$V.txt" | cut -c1-300)"
    [ $prc = 0 ] || continue
    unp=0; case " ${UNPATCHED:-} " in *" $V "*) unp=1;; esac
    if has layer-type; then
      say "wave $V/T: patched qwen3-sparse alone at utilization 0.5 (plan vs KV), then unpatched beside it"
      smoke "p-$V-qwen3-sparse" "$PA" --vllm "$V" --model "$CK/qwen3-sparse" "${GT[@]}" &
      pid=$!
      if [ $unp = 1 ]; then
        t0=$SECONDS  # the unpatched boot starts once the patched one has sized its KV cache (or ended)
        until grep -q "GPU KV cache size" "$L/p-$V-qwen3-sparse.log" 2>/dev/null || ! kill -0 $pid 2>/dev/null \
              || [ $((SECONDS - t0)) -gt 150 ]; do sleep 2; done
        smoke "u-$V-qwen3-sparse" "$UN" --vllm "$V" --skip-checkpoint-check --model "$CK/qwen3-sparse" "${PAR[@]}" &
      fi
      wait
    fi
    if has ple; then
      say "wave $V/P: gemma4-ple-long patched$([ $unp = 1 ] && echo ', unpatched and the plain-name reference') (parallel)"
      smoke "p-$V-gemma4-ple-long" "$PA" --vllm "$V" --model "$CK/gemma4-ple-long" "${PAR[@]}" &
      if [ $unp = 1 ]; then
        smoke "u-$V-gemma4-ple-long" "$UN" --vllm "$V" --skip-checkpoint-check --model "$CK/gemma4-ple-long" "${PAR[@]}" &
        smoke "u-$V-gemma4-ple-ref" "$UN" --vllm "$V" --model "$CK/gemma4-ple-ref" "${PAR[@]}" &
      fi
      wait
    fi
  done
  # then the Serve path and the output-equivalence gate of SERVE_RELEASES (their ray layers too)
  [ -z "${SERVE_RELEASES:-}" ] || "$(dirname "$0")/release-serve-run.sh"
  say "DONE"
  exit 0
fi

say "install"
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/bwhl/whl/*.whl > "$L/pip.log" 2>&1 || { say "pip install FAILED"; tail -20 "$L/pip.log" | tee -a "$P/progress.txt"; exit 1; }
PYTHONPATH=$PP_UN python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)" > "$R/versions.txt" 2>&1
say "versions: $(tail -1 "$R/versions.txt")"

PHASES=${PHASES:-"unpatched impossible gt patched"}
if [[ " $PHASES " == *" patched "* || " $PHASES " == *" prod "* ]]; then
patch_copy 0.26.0 /tmp/site /tmp/sitep "$PP_UN" "" || exit 1
fi

say "checkpoints"
checkpoints "$PP_UN"

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

if has gt; then
say "wave G: plan ground truth, alone on the GPU, utilization 0.5"
smoke g-qwen3-a "$PP_UN" --model "$CK/qwen3-a" "${GT[@]}"
smoke g-qwen3-b "$PP_UN" --model "$CK/qwen3-b" "${GT[@]}"
fi

if has patched; then
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
