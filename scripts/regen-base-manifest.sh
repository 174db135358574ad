#!/usr/bin/env bash
# Regenerate lockfiles/base/vllm-openai-v0.26.0.json: a RECONSTRUCTION of the
# Python layer of the official vllm/vllm-openai:v0.26.0 image (which cannot be
# pulled here).  Needs network access to PyPI (~8 GB of wheels, ~1 min at 100 MB/s).
#
#   scripts/regen-base-manifest.sh [OUTPUT]        (default: lockfiles/base/vllm-openai-v0.26.0.json)
#
# Env: UV_CACHE_DIR (default /tmp/uv-cache), WORKDIR (default: a fresh temp dir, removed afterwards;
#      set it to keep the installed tree), KEEP=1 keeps the temp dir.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/lockfiles/base/vllm-openai-v0.26.0.json}"
VENV="${VENV:-$ROOT/.venv}"
UV="$VENV/bin/uv"
BI="$VENV/bin/build-image"
export UV_CACHE_DIR="${UV_CACHE_DIR:-/tmp/uv-cache}"
export UV_NO_CONFIG=1

VLLM_VERSION=0.26.0
EXCLUDE_NEWER=2026-07-25          # the vllm 0.26.0 wheel's release day: versions of the image's day
PYTHON=3.12
GLIBC=2.35                         # nvidia/cuda:13.0.x-base-ubuntu22.04 -> Ubuntu 22.04 -> glibc 2.35
CUDA=13.0
PLATFORM=x86_64-manylinux_2_35
IMAGE_REF=vllm/vllm-openai:v${VLLM_VERSION}
IMAGE_SITE=/usr/local/lib/python3.12/dist-packages
# docker/Dockerfile, vllm-openai-base stage: the vllm wheel (its requirements) + these extras
REQS=("vllm==${VLLM_VERSION}" "accelerate" "modelscope<1.38" "bitsandbytes>=0.46.1" "timm>=1.0.17"
      "runai-model-streamer[s3,gcs,azure]>=0.15.7")

if [[ -n "${WORKDIR:-}" ]]; then
  rm -rf "$WORKDIR"; mkdir -p "$WORKDIR"
else
  WORKDIR="$(mktemp -d /tmp/regen-base.XXXXXX)"
  [[ "${KEEP:-0}" == 1 ]] || trap 'rm -rf "$WORKDIR"' EXIT
fi
TARGET="$WORKDIR/dist-packages"

INSTALL=("$UV" pip install --target "$TARGET" --python-version "$PYTHON" --python-platform "$PLATFORM"
         --exclude-newer "$EXCLUDE_NEWER" --no-build --index-url https://pypi.org/simple "${REQS[@]}")
quote() { local out="" a; for a in "$@"; do out+="$(printf '%q' "$a") "; done; printf '%s' "${out% }"; }
INSTALL_TEXT="$(quote uv pip install --target DIR --python-version "$PYTHON" --python-platform "$PLATFORM" \
  --exclude-newer "$EXCLUDE_NEWER" --no-build --index-url https://pypi.org/simple "${REQS[@]}")"

echo "+ ${INSTALL[*]}" >&2
"${INSTALL[@]}"

UV_VERSION="$("$UV" --version)"
METHOD="Reconstructed, not read from the image (vllm/vllm-openai:v${VLLM_VERSION} cannot be pulled here). \
On $(date -u +%Y-%m-%d) with ${UV_VERSION}: \`${INSTALL_TEXT}\` (the closure vllm 0.26.0's docker/Dockerfile installs \
into ${IMAGE_SITE} with \`uv pip install --system\`: the vllm wheel's requirements plus accelerate, modelscope<1.38, \
bitsandbytes>=0.46.1, timm>=1.0.17, runai-model-streamer[s3,gcs,azure]>=0.15.7), then \
\`build-image base snapshot --site-packages DIR --python ${PYTHON} --glibc ${GLIBC} --cuda ${CUDA}\`. \
Knowingly different from the real image: OS packages (Ubuntu 22.04 debs, the system python3.10's \
/usr/lib/python3/dist-packages) are not scanned; pip and uv, which the Dockerfile puts into the same dist-packages \
(get-pip.py, \`pip install uv\`), are absent; glibc ${GLIBC} and CUDA ${CUDA} are taken from the Dockerfile's base image \
nvidia/cuda:13.0.x-base-ubuntu22.04, not read from a libc; versions are those PyPI served before ${EXCLUDE_NEWER}, \
so a package released later on the image's build day would differ; the extras list follows the project's reading of \
the v0.26.0 Dockerfile (the reference copies available here were older revisions, which also installed hf_transfer and boto3); \
the image digest is unknown (null)."

"$BI" base snapshot --site-packages "$TARGET" --python "$PYTHON" --glibc "$GLIBC" --cuda "$CUDA" \
  --platform "$PLATFORM" --image-ref "$IMAGE_REF" --os "Ubuntu 22.04 (nvidia/cuda:13.0.x-base-ubuntu22.04)" \
  --as-path "$IMAGE_SITE" --method "$METHOD" -o "$OUT"
