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
#   or, the run overlapping the uploads: the first release's parts, then `launch LAYER N` (its last part; the run
#   starts and the call returns), the other releases' parts, then `wait`.  SERVE_RELEASES="V" adds
#   scripts/gpu/release-serve-run.sh (smoke --serve with the lock's backend, the output-equivalence gate).
#   The call list, in order with what each carries: `scripts/gpu-proof.sh calls --releases "0.26.0 0.34.0" ...`
#   here; after a lost machine or a failed call, `scripts/gpu-proof.sh resend REPLY --releases ...` reads the last
#   reply (its INVENTORY line: boot id and the parts the machine holds) and lists the calls still needed.
#   Every upload call prints the INVENTORY; a wait never waits on a layer or a run that is not on the machine.
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
  run|launch)   # launch: wait only for the first release's layers, start the run and return (NOWAIT): upload
                # calls for the later releases follow while it runs (proof-run.sh waits for each release's layers)
    [ -n "${RELEASES:-}" ] || { echo "$mode: set RELEASES (e.g. RELEASES=0.27.0)"; exit 2; }
    [ -z "$n" ] || recv_layer "$n" "$3"
    [ "$RUN" = proof-run.sh ] && [ -z "${LEGACY:-}" ] || export SERVE=1   # the 0.26.0 scripts import ray
    if [ "$mode" = launch ]; then
      export NOWAIT=1
      # shellcheck disable=SC2086
      BUNDLE=/tmp/L wait_layers $(BUNDLE=/tmp/L release_layers ${RELEASES%% *})
    else
      # shellcheck disable=SC2046,SC2086  # one word per layer and release
      BUNDLE=/tmp/L wait_layers $(BUNDLE=/tmp/L release_layers $RELEASES) \
        $([ -z "${SERVE_RELEASES:-}" ] || BUNDLE=/tmp/L SERVE=1 release_layers $SERVE_RELEASES)
    fi
    if [ "${SERVE:-}" = 1 ]; then
      # serve-proof-run.sh, tp-proof-run.sh and LEGACY=1 proof-run.sh (the 0.26.0 phases) read /tmp/bwhl/whl:
      # the wheels of RELEASES=0.26.0's layers, linked there
      rm -rf /tmp/bwhl && mkdir -p /tmp/bwhl/whl
      # shellcheck disable=SC2046,SC2086
      for l in $(BUNDLE=/tmp/L release_layers $RELEASES); do ln -s "/tmp/L/$l.whl/whl/"*.whl /tmp/bwhl/whl/; done
      unset RELEASES
    else
      export RELEASES UNPATCHED="${UNPATCHED:-}" PHASES="${PHASES:-layer-type ple}" SERVE_RELEASES="${SERVE_RELEASES:-}"
    fi
    launch ;;
  wait) waitdone ;;
  inventory) inventory ;;
  calls|resend)  # here: the device calls to make (resend: those a lost or partial upload needs, from the last reply)
    exec "${PY:-python3}" "$REPO/scripts/gpu/bundle_calls.py" "$mode" --bundle "$BUNDLE" "${@:2}" ;;
  *) echo "usage: $0 layer LAYER N | run|launch [LAYER N] | wait | inventory | recv N | start N
       (here) calls --releases 'V ...' [--serve-releases 'V ...'] | resend REPLY_FILE --releases ..."; exit 2 ;;
esac
