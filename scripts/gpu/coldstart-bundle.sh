#!/usr/bin/env bash
# Build issue 28's cold-start bundle here (needs PyPI): the slimmed vllm 0.26.0 wheel, the engine/server wheels of
# scripts/gpu/wheels.txt, transformers 5.14.1 + tokenizers 0.22.2, and the load-format wheels (runai-model-streamer,
# its humanize, fastsafetensors, instanttensor), tarred and split into 60 MiB parts DEST/c0/part00, DEST/c1/part01 ...;
# the device scripts are copied to DEST/s.  DEST must be ignored by the session checkout's .git/info/exclude.
#   scripts/gpu/coldstart-bundle.sh DEST
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:?usage: coldstart-bundle.sh DEST}
WORK=${WORK:-/tmp/cold-bundle}
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64
      --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 --platform any)
DL=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}")
mkdir -p "$WORK/vw" "$WORK/whl"
ls "$WORK"/vw/vllm-0.26.0-*.whl >/dev/null 2>&1 || "${DL[@]}" --abi abi3 --abi cp312 --abi none -d "$WORK/vw" vllm==0.26.0
{ sed -n '/^# Offline/,/^# Gemma/p' "$ROOT/scripts/gpu/wheels.txt" | grep -v '^#'
  printf '%s\n' transformers==5.14.1 tokenizers==0.22.2 pyelftools==0.32 unidiff==1.0.1 \
    runai-model-streamer==0.17.1 humanize==4.17.0 fastsafetensors==0.5.0 instanttensor==0.2.2; } > "$WORK/list.txt"
"${DL[@]}" -d "$WORK/whl" -r "$WORK/list.txt"
VW=$(ls "$WORK"/vw/vllm-0.26.0-*.whl | head -1)
[ -f "$WORK/whl/$(basename "$VW")" ] || python3 "$ROOT/scripts/gpu/slim_wheel.py" "$VW" "$WORK/whl/$(basename "$VW")"
(cd "$WORK" && rm -f bundle.tar part* && tar cf bundle.tar whl && split -b 60m -d -a 2 bundle.tar part)
rm -rf "$DEST"/c[0-9]* "$DEST/s"; mkdir -p "$DEST/s"
last=""
for p in "$WORK"/part*; do
  n=${p##*/part}; d="$DEST/c$((10#$n))"; mkdir -p "$d"; mv "$p" "$d/"
  (cd "$d" && sha256sum "part$n" > "part$n.sha256"); last=$d
done
(cd "$WORK" && sha256sum bundle.tar | sed 's/bundle.tar/\/tmp\/bundle.tar/') > "$last/bundle.sha256"
cp "$ROOT"/scripts/gpu/{coldstart.sh,device-calls.sh,coldstart-run.sh,coldstart_ckpt.py,pagecache.py} "$DEST/s/"
mkdir -p "$DEST/s/tests" && cp "$ROOT/tests/checkpoints.py" "$DEST/s/tests/"
ls -la "$DEST"/c*/ "$DEST/s"; du -sh "$WORK/bundle.tar"
