#!/usr/bin/env bash
# Build the H200 bundle here (needs PyPI) for one or more shipped releases, as layers split into 56 MiB parts:
#   scripts/gpu/make-bundle.sh --vllm 0.27.0 [--vllm 0.33.0 ...] [--full-torch-stack] [--out DIR]
# The wheel list of each release is scripts/gpu/bundle_plan.py's (its base manifest's torch stack, the engine
# names of wheels.txt and the Serve names of wheels-serve.txt at the manifest's / default lock's versions); the
# vllm wheel is slimmed by slim_wheel.py.  Output (DIR, default .bundle/ at the repo root, ignored):
#   DIR/manifest.json                      layers -> parts, each release's layers in PYTHONPATH order
#   DIR/LAYER/pNN/part, part.sha256        one folder per part (one device call carries one)
#   DIR/LAYER/layer.sha256                 the joined tar's sha256
# Layers shared by releases (torch-2.13.0 for seven of them, ray-2.59.0 ...) are built and uploaded once.
# Downloads are cached in $WHEELS (default /tmp/gpu-wheels) and checked against PyPI's sha256.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
WHEELS=${WHEELS:-/tmp/gpu-wheels}
VLLM_WHEEL_DIR=${VLLM_WHEEL_DIR:-/tmp/vllm-wheel}
SLIM_DIR=${SLIM_DIR:-/tmp/vllm-wheel/slim}
OUTDIR=$ROOT/.bundle
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --vllm) ARGS+=(--vllm "$2"); shift 2 ;;
    --full-torch-stack) ARGS+=(--full-torch-stack); shift ;;
    --out) OUTDIR=$2; shift 2 ;;
    *) echo "usage: $0 --vllm X [--vllm Y ...] [--full-torch-stack] [--out DIR]" >&2; exit 2 ;;
  esac
done
[ ${#ARGS[@]} -gt 0 ] || { echo "usage: $0 --vllm X [--vllm Y ...]" >&2; exit 2; }
PLAT=()
for t in manylinux1 manylinux2010 manylinux2014 manylinux_2_5 manylinux_2_12 manylinux_2_17 manylinux_2_18 \
         manylinux_2_24 manylinux_2_26 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35; do
  PLAT+=(--platform "${t}_x86_64")
done
PLAT+=(--platform any)
DL=(-m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}")
mkdir -p "$WHEELS" "$VLLM_WHEEL_DIR" "$SLIM_DIR"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT

# 1. the vllm wheels (their requirements feed the plan), checked against patches/vllm/X/wheel.sha256
for v in $("$PY" "$ROOT/scripts/gpu/bundle_plan.py" "${ARGS[@]}" --json | "$PY" -c 'import json,sys; print(*json.load(sys.stdin)["releases"])'); do
  ls "$VLLM_WHEEL_DIR"/vllm-"$v"-*.whl >/dev/null 2>&1 || "$PY" "${DL[@]}" --abi abi3 --abi cp312 --abi none "vllm==$v" -d "$VLLM_WHEEL_DIR"
  ws=("$VLLM_WHEEL_DIR"/vllm-"$v"-*.whl); w=${ws[0]}
  if [ -f "$ROOT/patches/vllm/$v/wheel.sha256" ]; then
    (cd "$VLLM_WHEEL_DIR" && sed "s|  .*/|  |" "$ROOT/patches/vllm/$v/wheel.sha256" | sha256sum -c --quiet -) \
      || { echo "vllm $v: wheel sha256 differs from patches/vllm/$v/wheel.sha256" >&2; exit 1; }
  fi
  [ -f "$SLIM_DIR/$(basename "$w")" ] || "$PY" "$ROOT/scripts/gpu/slim_wheel.py" "$w" "$SLIM_DIR/$(basename "$w")"
done

# 2. the plan, and every layer's wheels (one pip call per layer; one by one where a batch fails); planned again
#    with the downloaded wheels' own requirements until nothing is added (bundle_plan.py --wheels-dir)
PLAN=("$PY" "$ROOT/scripts/gpu/bundle_plan.py" "${ARGS[@]}" --vllm-wheel-dir "$VLLM_WHEEL_DIR" --wheels-dir "$WHEELS")
: > "$TMP/plan.prev"
for pass in 1 2 3 4 5; do
  "${PLAN[@]}" --json > "$TMP/plan.json"
  cmp -s "$TMP/plan.json" "$TMP/plan.prev" && break
  echo "pass $pass"
  while read -r layer; do   # the layers and their NAME==VERSION lines of this pass's plan.json
    "$PY" -c 'import json,sys; sys.path.insert(0, sys.argv[3]); from bundle_plan import wheel_file
w = json.load(open(sys.argv[1]))["layers"][sys.argv[2]]["wheels"]   # only those not in the cache yet
sys.stdout.write("".join(f"{n}=={v}\n" for n, v in w.items() if wheel_file(sys.argv[4], n, v) is None))' \
      "$TMP/plan.json" "$layer" "$ROOT/scripts/gpu" "$WHEELS" > "$TMP/$layer.txt"
    echo "  $layer: $(wc -l < "$TMP/$layer.txt") wheels to download"
    [ -s "$TMP/$layer.txt" ] || continue
    "$PY" "${DL[@]}" -r "$TMP/$layer.txt" -d "$WHEELS" 2>"$TMP/$layer.err" || {
      echo "  $layer: batch download failed ($(grep -m1 ERROR "$TMP/$layer.err")); one by one"
      while read -r req; do "$PY" "${DL[@]}" "$req" -d "$WHEELS" 2>/dev/null || echo "  not downloadable: $req"; done \
        < "$TMP/$layer.txt"
    }
  done < <("$PY" -c 'import json,sys; print(*json.load(open(sys.argv[1]))["layers"], sep="\n")' "$TMP/plan.json")
  cp "$TMP/plan.json" "$TMP/plan.prev"
done

# 3. layers -> parts + manifest.json (wheels checked against PyPI's sha256)
"$PY" "$ROOT/scripts/gpu/bundle_pack.py" "$TMP/plan.json" "$WHEELS" "$OUTDIR" --slim-dir "$SLIM_DIR" --verify-pypi
cp "$TMP/plan.json" "$OUTDIR/plan.json"
du -sh "$OUTDIR"/*/ | sed "s|$OUTDIR/||"
