# Sourced by the device-side scripts (scripts/gpu-proof.sh, scripts/gpu/coldstart.sh): receive a bundle part by
# part, join and verify it, start the run in the background and wait for its progress file.  The sourcing script
# sets P (the run's folder), WAIT (seconds one call waits), LABEL (PROOF, COLD), TGZ (the result archive's name),
# TGZ_EXCLUDE (a tar --exclude pattern, or empty), RUN_SCRIPT (what runs in the background), WAIT_CMD (the call that
# waits again) and defines part_dir N (the folder that holds part N and bundle.sha256).

recv() {
  local d f; d=$(part_dir "$1"); f=$(printf 'part%02d' "$1")
  mkdir -p /tmp/parts
  (cd "$d" && sha256sum -c "$f.sha256") || { echo "part $1: sha256 mismatch"; exit 7; }
  cp "$d/$f" /tmp/parts/ && ls -la /tmp/parts
}

collect() {
  [ -n "${OUT:-}" ] || return 0
  tar czf "$OUT/$TGZ" -C "$P" ${TGZ_EXCLUDE:+--exclude="$TGZ_EXCLUDE"} . 2>/dev/null
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
  grep -qE "^[0-9:]+ DONE$" "$P/progress.txt" && echo "$LABEL FINISHED" || echo "$LABEL STILL RUNNING (call: $WAIT_CMD)"
}

launch() {  # a fresh run folder, the run in its own session (it outlives the call), its pid kept
  rm -rf "$P" && mkdir -p "$P"
  setsid nohup "$RUN_SCRIPT" > "$P/run.log" 2>&1 < /dev/null & echo $! > "$P/run.pid"
  sleep 2; waitdone
}

start() {  # the last part, the joined bundle verified and unpacked into /tmp/bwhl, then launch
  recv "$1"
  cat /tmp/parts/part* > /tmp/bundle.tar
  sha256sum -c "$(part_dir "$1")/bundle.sha256" || { echo "bundle sha256 mismatch"; exit 7; }
  rm -rf /tmp/bwhl && mkdir -p /tmp/bwhl && tar xf /tmp/bundle.tar -C /tmp/bwhl && rm -f /tmp/bundle.tar
  launch
}
