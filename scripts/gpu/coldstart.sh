#!/usr/bin/env bash
# The cold-start measurement on the lent H200 (device tool), in the manner of scripts/gpu-proof.sh.
# Here: scripts/gpu/coldstart-bundle.sh  -> DEST/c0 .. cN (parts of <= 60 MiB) and DEST/s (these scripts),
# DEST a folder of the session's checkout ignored through .git/info/exclude (the device gets that checkout).
# Device, back to back (the machine keeps /tmp only while calls follow within ~30 s):
#   DEST/s/coldstart.sh recv 0            (carry DEST/s, DEST/c0)
#   DEST/s/coldstart.sh start N           (carry DEST/s, DEST/cN: last part, join, verify, run in background, wait)
#   DEST/s/coldstart.sh wait              (carry DEST/s; until coldstart-run.sh prints DONE)
# Results come back as $OUT/cold.tgz (results/*.json, logs/*.log, progress.txt).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
P=${P:-/tmp/cold}
WAIT=${WAIT:-540}
mode=${1:-}; n=${2:-}

LABEL=COLD TGZ=cold.tgz TGZ_EXCLUDE='cc-*' RUN_SCRIPT="$HERE/coldstart-run.sh" WAIT_CMD="coldstart.sh wait"
part_dir() { echo "$HERE/../c$1"; }
# shellcheck source=device-calls.sh
. "$HERE/device-calls.sh"

case "$mode" in
  recv) recv "$n" ;;
  start) start "$n" ;;
  rerun)  # the bundle is installed and the checkpoint written: stop the run in flight (its pid file), start again
    [ -f "$P/run.pid" ] && kill -- -"$(cat "$P/run.pid")" 2>/dev/null; sleep 3
    launch ;;
  wait) waitdone ;;
  *) echo "usage: $0 recv N | start N | rerun | wait"; exit 2 ;;
esac
