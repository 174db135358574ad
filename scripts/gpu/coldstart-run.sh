#!/usr/bin/env bash
# Issue 28's cold-start matrix on the lent H200, run in the background by scripts/gpu/coldstart.sh
# (needs /tmp/bundle.tar joined from the parts).  Writes everything under $P (default /tmp/cold):
# progress.txt, results/*.json (smoke reports, page-cache states), logs/*.log (vLLM server logs).
#   1. install the bundle (vllm 0.26.0 slimmed + engine/server wheels + runai-model-streamer,
#      fastsafetensors, instanttensor) into /tmp/site
#   2. write a ~21.8 GB synthetic Qwen3 checkpoint on the local disk (coldstart_ckpt.py)
#   3. one `build-image smoke --local` per measurement: load format x page cache (cold: sync +
#      drop_caches, else posix_fadvise DONTNEED per file; warm: every file read once) x compile
#      cache (VLLM_CACHE_ROOT empty, or kept from the run before); torch.compile + CUDA graphs on.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
P=${P:-/tmp/cold}; R=$P/results; L=$P/logs; CK=${CK:-/tmp/ck20}
BUDGET_S=${BUDGET_S:-840}   # no new run starts after this many seconds of runs
mkdir -p "$R" "$L"
say() { echo "$(date -u +%T) $*" | tee -a "$P/progress.txt"; }
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PP=/tmp/site:$REPO
VB="python3 -m vllm.entrypoints.cli.main"
SMOKE_PY='import sys
try:
    from builder.cli import main
except Exception as e:
    print(f"builder.cli import failed ({e!r}); using builder.commands.smoke", file=sys.stderr)
    from builder.commands.smoke import command as main
    main(sys.argv[1:], prog_name="build-image smoke")
main(["smoke"] + sys.argv[1:], prog_name="build-image")'

say "install"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; df -h /tmp; free -g; nproc; uname -r;
  mount | grep -E " /tmp | / " ; } > "$R/machine.txt" 2>&1
[ -d /tmp/site/vllm ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/bwhl/whl/*.whl \
  > "$L/pip.log" 2>&1 || { say "pip install FAILED"; tail -20 "$L/pip.log" | tee -a "$P/progress.txt"; exit 1; }
PYTHONPATH=$PP python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)" > "$R/versions.txt" 2>&1
for m in runai_model_streamer fastsafetensors instanttensor; do
  PYTHONPATH=$PP python3 -c "import $m; print('$m', getattr($m, '__version__', 'imported'))" >> "$R/versions.txt" 2>&1
done
say "versions: $(tr '\n' ' ' < "$R/versions.txt" | cut -c1-600)"

say "checkpoint"
if [ ! -f "$CK/model.safetensors.index.json" ]; then
  PYTHONPATH=$PP python3 "$HERE/coldstart_ckpt.py" "$CK" > "$R/checkpoint.json" 2> "$L/checkpoint.log" \
    || { say "checkpoint FAILED"; tail -20 "$L/checkpoint.log" | tee -a "$P/progress.txt"; exit 1; }
fi
say "checkpoint: $(cat "$R/checkpoint.json")"
sync
if (echo 3 > /proc/sys/vm/drop_caches) 2> "$R/drop_caches.err"; then echo ok > "$R/drop_caches.txt"; else echo refused > "$R/drop_caches.txt"; fi
say "drop_caches: $(cat "$R/drop_caches.txt") $(cat "$R/drop_caches.err")"
cold() { sync; [ "$(cat "$R/drop_caches.txt")" = ok ] && echo 3 > /proc/sys/vm/drop_caches; python3 "$HERE/pagecache.py" evict "$CK"; }
warm() { python3 "$HERE/pagecache.py" read "$CK"; }
cold > "$R/disk-evict.json"; warm > "$R/disk-read-cold.json"; warm > "$R/disk-read-warm.json"
say "disk: cold read $(cat "$R/disk-read-cold.json"); warm read $(cat "$R/disk-read-warm.json")"

T0=$SECONDS
COMMON=(--local --vllm-bin "$VB" --model "$CK" --no-plan --skip-checkpoint-check --max-model-len 2048
        --concurrency 16 --rounds 1 --max-tokens 32 --prompt-tokens 64 --no-chat --boot-timeout 300 --timeout 120)
run() {  # run NAME FORMAT(auto: none given) PAGECACHE(cold|warm) CCDIR
  local name=$1 fmt=$2 pc=$3 cc=$4
  if [ $((SECONDS - T0)) -gt "$BUDGET_S" ]; then say "$name: skipped (budget)"; return; fi
  if [ "$pc" = cold ]; then cold > "$R/$name.pagecache.json"; else warm > "$R/$name.pagecache.json"; fi
  local lf=(); [ "$fmt" = auto ] || lf=(--extra-arg=--load-format "--extra-arg=$fmt")
  mkdir -p "$cc"; du -sb "$cc" > "$R/$name.ccbefore.txt"
  local t=$SECONDS
  VLLM_CACHE_ROOT=$cc PYTHONPATH=$PP python3 -c "$SMOKE_PY" "${COMMON[@]}" "${lf[@]}" --log-file "$L/$name.log" --json \
    > "$R/$name.json" 2> "$L/$name.smoke.txt"
  local rc=$?; echo "$rc" > "$R/$name.rc"; du -sb "$cc" > "$R/$name.ccafter.txt"
  say "$name: rc=$rc wall=$((SECONDS - t))s pc=$(cut -c1-120 "$R/$name.pagecache.json") $(python3 -c "import json; d=json.load(open('$R/$name.json')); print(d['verdict'], d['boot'], d['failures'][:1])" 2>/dev/null | cut -c1-400)"
  grep -hE "Loading weights took|Model loading took|torch.compile|Compiling a graph|Graph capturing finished|init engine|Directly load|compile range" "$L/$name.log" | cut -c1-300 >> "$P/progress.txt"
}
CCA=$P/cc-a   # not CC: that is the C compiler triton runs
RUNS=${RUNS:-"st-cold-cc0 st-cold-ccw st-warm-ccw rs-cold rs-warm fst-cold fst-warm it-cold it-warm st-warm-cc0"}
for r in $RUNS; do
  case $r in
    st-cold-cc0) run "$r" auto cold "$CCA" ;;
    st-cold-ccw) run "$r" auto cold "$CCA" ;;
    st-warm-ccw) run "$r" auto warm "$CCA" ;;
    rs-cold) run "$r" runai_streamer cold "$CCA" ;;
    rs-warm) run "$r" runai_streamer warm "$CCA" ;;
    fst-cold) run "$r" fastsafetensors cold "$CCA" ;;
    fst-warm) run "$r" fastsafetensors warm "$CCA" ;;
    it-cold) run "$r" instanttensor cold "$CCA" ;;
    it-warm) run "$r" instanttensor warm "$CCA" ;;
    st-warm-cc0) run "$r" auto warm "$P/cc-b" ;;
  esac
done
say "DONE"
