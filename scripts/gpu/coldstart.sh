#!/usr/bin/env bash
# Issue 28's cold-start measurement on the lent H200 (device tool), in the manner of scripts/gpu-proof.sh.
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

recv() {
  local d="$HERE/../c$n" f; f=$(printf 'part%02d' "$n")
  mkdir -p /tmp/parts
  (cd "$d" && sha256sum -c "$f.sha256") || { echo "part $n: sha256 mismatch"; exit 7; }
  cp "$d/$f" /tmp/parts/ && ls -la /tmp/parts
}

collect() {
  [ -n "${OUT:-}" ] || return 0
  tar czf "$OUT/cold.tgz" -C "$P" --exclude='cc-*' . 2>/dev/null
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
  grep -qE "^[0-9:]+ DONE$" "$P/progress.txt" && echo "COLD FINISHED" || echo "COLD STILL RUNNING (call: coldstart.sh wait)"
}

case "$mode" in
  recv) recv ;;
  start)
    recv
    cat /tmp/parts/part* > /tmp/bundle.tar
    sha256sum -c "$HERE/../c$n/bundle.sha256" || { echo "bundle sha256 mismatch"; exit 7; }
    rm -rf /tmp/bwhl && mkdir -p /tmp/bwhl && tar xf /tmp/bundle.tar -C /tmp/bwhl && rm -f /tmp/bundle.tar
    rm -rf "$P" && mkdir -p "$P"
    setsid nohup "$HERE/coldstart-run.sh" > "$P/run.log" 2>&1 < /dev/null & echo $! > "$P/run.pid"
    sleep 2; waitdone ;;
  rerun)  # the bundle is installed and the checkpoint written: stop the run in flight (its pid file), start again
    [ -f "$P/run.pid" ] && kill -- -"$(cat "$P/run.pid")" 2>/dev/null; sleep 3
    rm -rf "$P" && mkdir -p "$P"
    setsid nohup "$HERE/coldstart-run.sh" > "$P/run.log" 2>&1 < /dev/null & echo $! > "$P/run.pid"
    sleep 2; waitdone ;;
  wait) waitdone ;;
  *) echo "usage: $0 recv N | start N | rerun | wait"; exit 2 ;;
esac
