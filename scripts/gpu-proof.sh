#!/usr/bin/env bash
# GPU proof of `build-image smoke` on the lent H200 (device tool).  Every device
# command of the proof is one of these, in this order, back to back (the machine
# keeps /tmp only while warm, 30 s between calls):
#
#   here:    scripts/gpu/make-bundle.sh                  # -> c00/ .. c04/ (ignored), <=60 MB each
#   device:  scripts/gpu-proof.sh recv 0   (carry c00)   # one call per part
#            scripts/gpu-proof.sh recv 1   (carry c01) ...
#            scripts/gpu-proof.sh start 4  (carry c04)   # last part, join, verify, run in background, wait
#            scripts/gpu-proof.sh wait                   # until scripts/gpu/proof-run.sh prints DONE
#   RUN=serve-proof-run.sh ... start N               # the Serve path + output-equivalence proof instead
#
# Results come back as $OUT/proof.tgz (results/*.json, logs/*.log, progress.txt).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
P=${P:-/tmp/proof}
WAIT=${WAIT:-540}
RUN=${RUN:-proof-run.sh}   # or serve-proof-run.sh (the Serve path + the output-equivalence gate)
mode=${1:-}; n=${2:-}

LABEL=PROOF TGZ=proof.tgz TGZ_EXCLUDE='' RUN_SCRIPT="$REPO/scripts/gpu/$RUN" WAIT_CMD="scripts/gpu-proof.sh wait"
part_dir() { echo "$REPO/c0$1"; }
# shellcheck source=gpu/device-calls.sh
. "$REPO/scripts/gpu/device-calls.sh"

case "$mode" in
  recv) recv "$n" ;;
  start) start "$n" ;;
  wait) waitdone ;;
  *) echo "usage: $0 recv N | start N | wait"; exit 2 ;;
esac
