#!/usr/bin/env bash
# Build the H200 bundle here (needs PyPI): the slimmed vllm 0.26.0 wheel plus the
# wheels in scripts/gpu/wheels.txt, tarred and split into <=60 MB parts, one per
# ignored folder c00/ c01/ ... at the repo root (each carried by one device call).
#   scripts/gpu/make-bundle.sh            # -> c00/part00 (+ .sha256) ... and cNN/bundle.sha256
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/tmp/gpu-bundle}
PY=${PY:-$ROOT/.venv/bin/python}
VLLM_WHEEL_DIR=${VLLM_WHEEL_DIR:-/tmp/vllm-wheel}
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64
      --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 --platform any)
mkdir -p "$WORK/whl" "$VLLM_WHEEL_DIR"
ls "$VLLM_WHEEL_DIR"/vllm-0.26.0-*.whl >/dev/null 2>&1 || \
  "$PY" -m pip download -q --no-deps vllm==0.26.0 --only-binary=:all: --python-version 3.12 \
      --implementation cp --abi abi3 --abi cp312 --abi none "${PLAT[@]}" -d "$VLLM_WHEEL_DIR"
# wheels.txt (engine, server, Gemma 4, build-image) and wheels-serve.txt (ray 2.58.1 + serve extra)
cat "$ROOT/scripts/gpu/wheels.txt" "$ROOT/scripts/gpu/wheels-serve.txt" | grep -v '^#' | grep . | sort -u | \
  xargs "$PY" -m pip download -q --no-deps \
  --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" -d "$WORK/whl"
VW=$(ls "$VLLM_WHEEL_DIR"/vllm-0.26.0-*.whl | head -1)
[ -f "$WORK/whl/$(basename "$VW")" ] || "$PY" "$ROOT/scripts/gpu/slim_wheel.py" "$VW" "$WORK/whl/$(basename "$VW")"
(cd "$WORK" && rm -f bundle.tar part* && tar cf bundle.tar whl && split -b 60m -d -a 2 bundle.tar part)
rm -rf "$ROOT"/c0[0-9]
last=""
for p in "$WORK"/part*; do
  n=${p##*/part}; d="$ROOT/c0$((10#$n))"; mkdir -p "$d"; mv "$p" "$d/"
  (cd "$d" && sha256sum "part$n" > "part$n.sha256"); last=$d
done
(cd "$WORK" && sha256sum bundle.tar | sed 's/bundle.tar/\/tmp\/bundle.tar/') > "$last/bundle.sha256"
ls -la "$ROOT"/c0*/ ; du -sh "$WORK/bundle.tar"
