#!/usr/bin/env bash
# GPU proof of `build-image smoke` on the lent H200 (device tool).  Every device command of the proof is one
# of these, back to back (the machine keeps /tmp only while warm, about 30 s between calls).
#
# Any shipped releases (the layered bundle; docs/gpu-proof-results.md "Per release"):
#   here:    scripts/gpu/make-bundle.sh --vllm 0.27.0 [--vllm 0.33.0 ...]  # -> .bundle/ (ignored)
#   device:  scripts/gpu-proof.sh layer torch-2.13.0 0   (carry .bundle/manifest.json, .bundle/torch-2.13.0/p00)
#            ... one call per part of each layer the releases need (scripts/gpu/device-calls.sh installs a
#            layer in the background once its last part has arrived) ...
#            RELEASES="0.27.0" UNPATCHED="0.27.0" scripts/gpu-proof.sh run vllm-0.27.0 N   # last part, then
#                                    # scripts/gpu/proof-run.sh in the background, waiting for DONE
#            scripts/gpu-proof.sh wait                 # results again ($OUT/proof.tgz, progress.txt)
# The 0.26.0-only scripts (serve-proof-run.sh, tp-proof-run.sh, proof-run.sh's 0.26.0 phases with LEGACY=1) from
# the layered bundle of --vllm 0.26.0 (its vllm and ray layers; the device's own torch):
#            RELEASES=0.26.0 RUN=serve-proof-run.sh scripts/gpu-proof.sh run ray-2.58.1 N
# or from the first proofs' single bundle (c00/ ... of the former make-bundle.sh): recv 0 .. / start N / wait
#
# Results come back as $OUT/proof.tgz (results/*.json, logs/*.log, progress.txt).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
P=${P:-/tmp/proof}
WAIT=${WAIT:-540}
RUN=${RUN:-proof-run.sh}   # or serve-proof-run.sh (the Serve path + the output-equivalence gate)
BUNDLE=${BUNDLE:-$PWD/.bundle}
mode=${1:-}; n=${2:-}

LABEL=PROOF TGZ=proof.tgz TGZ_EXCLUDE='' RUN_SCRIPT="$REPO/scripts/gpu/$RUN" WAIT_CMD="scripts/gpu-proof.sh wait"
part_dir() { echo "$REPO/c0$1"; }
# shellcheck source-path=SCRIPTDIR source=gpu/device-calls.sh
. "$REPO/scripts/gpu/device-calls.sh"

case "$mode" in
  recv) recv "$n" ;;
  start) start "$n" ;;
  layer) recv_layer "$n" "$3" ;;
  run)
    [ -n "${RELEASES:-}" ] || { echo "run: set RELEASES (e.g. RELEASES=0.27.0)"; exit 2; }
    [ -z "$n" ] || recv_layer "$n" "$3"
    [ "$RUN" = proof-run.sh ] && [ -z "${LEGACY:-}" ] || export SERVE=1   # the 0.26.0 scripts import ray
    # shellcheck disable=SC2046,SC2086  # one word per layer and release
    BUNDLE=/tmp/L wait_layers $(BUNDLE=/tmp/L release_layers $RELEASES)
    if [ "${SERVE:-}" = 1 ]; then
      # serve-proof-run.sh, tp-proof-run.sh and LEGACY=1 proof-run.sh (the 0.26.0 phases) read /tmp/bwhl/whl:
      # the wheels of RELEASES=0.26.0's layers, linked there
      rm -rf /tmp/bwhl && mkdir -p /tmp/bwhl/whl
      # shellcheck disable=SC2046,SC2086
      for l in $(BUNDLE=/tmp/L release_layers $RELEASES); do ln -s "/tmp/L/$l.whl/whl/"*.whl /tmp/bwhl/whl/; done
      unset RELEASES
    else
      export RELEASES UNPATCHED="${UNPATCHED:-}" PHASES="${PHASES:-layer-type ple}"
    fi
    launch ;;
  wait) waitdone ;;
  *) echo "usage: $0 layer LAYER N | run [LAYER N] | recv N | start N | wait"; exit 2 ;;
esac
