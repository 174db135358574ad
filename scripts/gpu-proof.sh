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

recv() {
  local d="$REPO/c0$n" f; f=$(printf 'part%02d' "$n")
  mkdir -p /tmp/parts
  (cd "$d" && sha256sum -c "$f.sha256") || { echo "part $n: sha256 mismatch"; exit 7; }
  cp "$d/$f" /tmp/parts/ && ls -la /tmp/parts
}

collect() {
  [ -n "${OUT:-}" ] || return 0
  tar czf "$OUT/proof.tgz" -C "$P" . 2>/dev/null
  cp "$P/progress.txt" "$OUT/" 2>/dev/null
}

waitdone() {
  local t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$WAIT" ]; do
    grep -qE "^[0-9:]+ DONE$|FAILED$" "$P/progress.txt" 2>/dev/null && break
    sleep 5
  done
  cat "$P/progress.txt"
  collect
  grep -qE "^[0-9:]+ DONE$" "$P/progress.txt" && echo "PROOF FINISHED" || echo "PROOF STILL RUNNING (call: scripts/gpu-proof.sh wait)"
}

case "$mode" in
  recv) recv ;;
  start)
    recv
    cat /tmp/parts/part* > /tmp/bundle.tar
    sha256sum -c "$REPO/c0$n/bundle.sha256" || { echo "bundle sha256 mismatch"; exit 7; }
    rm -rf /tmp/bwhl && mkdir -p /tmp/bwhl && tar xf /tmp/bundle.tar -C /tmp/bwhl && rm -f /tmp/bundle.tar
    rm -rf "$P" && mkdir -p "$P"
    setsid nohup "$REPO/scripts/gpu/$RUN" > "$P/run.log" 2>&1 < /dev/null &
    sleep 2; waitdone ;;
  wait) waitdone ;;
  *) echo "usage: $0 recv N | start N | wait"; exit 2 ;;
esac
