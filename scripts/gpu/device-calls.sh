# shellcheck shell=bash
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

# ---- the layered bundle of scripts/gpu/make-bundle.sh (BUNDLE: the carried .bundle/, with manifest.json) ----
# Each call carries BUNDLE/manifest.json and one BUNDLE/LAYER/pNN; the part goes to /tmp/parts/LAYER/.  When
# the last part of a layer has arrived, the layer is joined, checked against the manifest's sha256 and installed
# into /tmp/L/LAYER (pip --target) in the background, so the next upload calls overlap the install;
# /tmp/L/LAYER.ok or LAYER.failed says how it ended.
layer_field() {  # layer_field LAYER parts|sha256 -> from BUNDLE/manifest.json
  python3 -c 'import json,sys; l=json.load(open(sys.argv[1]))["layers"][sys.argv[2]]
print(len(l["parts"]) if sys.argv[3] == "parts" else l["sha256"])' "$BUNDLE/manifest.json" "$1" "$2"
}

recv_layer() {  # recv_layer LAYER N
  local d; d=$(printf '%s/%s/p%02d' "$BUNDLE" "$1" "$2")
  mkdir -p "/tmp/parts/$1" /tmp/L
  (cd "$d" && sha256sum -c --quiet part.sha256) || { echo "$1 part $2: sha256 mismatch"; exit 7; }
  cp "$d/part" "$(printf '/tmp/parts/%s/p%02d' "$1" "$2")"
  local have want; have=$(find "/tmp/parts/$1" -name 'p*' | wc -l); want=$(layer_field "$1" parts)
  echo "$1: part $2 received ($have of $want; boot $(cat /proc/sys/kernel/random/boot_id 2>/dev/null))"
  cp "$BUNDLE/manifest.json" /tmp/L/manifest.json
  if [ "$have" = "$want" ]; then
    rm -f "/tmp/L/$1.ok" "/tmp/L/$1.failed"
    setsid nohup bash -c "$(declare -f install_layer layer_field); BUNDLE=/tmp/L install_layer $1" \
      > "/tmp/L/$1.log" 2>&1 < /dev/null &
    echo "$1: complete; installing in the background (/tmp/L/$1.log)"
  fi
}

install_layer() {  # install_layer LAYER: join, verify, pip install --target /tmp/L/LAYER
  local t0=$SECONDS
  cat "/tmp/parts/$1"/p* > "/tmp/L/$1.tar"
  if [ "$(sha256sum < "/tmp/L/$1.tar" | cut -d' ' -f1)" != "$(layer_field "$1" sha256)" ]; then
    echo "$1: joined tar sha256 mismatch" > "/tmp/L/$1.failed"; return 1
  fi
  rm -rf "/tmp/L/$1.whl" "/tmp/L/$1" && mkdir -p "/tmp/L/$1.whl" && tar xf "/tmp/L/$1.tar" -C "/tmp/L/$1.whl" \
    && rm -f "/tmp/L/$1.tar" "/tmp/parts/$1"/p*
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "/tmp/L/$1" \
       "/tmp/L/$1.whl"/whl/*.whl; then
    echo "installed in $((SECONDS - t0)) s" > "/tmp/L/$1.ok"
  else
    echo "pip install failed" > "/tmp/L/$1.failed"; return 1
  fi
}

wait_layers() {  # wait_layers LAYER...: until each is .ok (exit 7 on .failed, 8 after 300 s, 9 at once when a
  # layer has no part, no install log and no result on this machine: it went back and came up bare, and waiting
  # would only spend device time; the upload calls print the boot id, so a new one shows which parts to resend)
  local t0=$SECONDS l
  for l in "$@"; do
    if [ ! -f "/tmp/L/$l.ok" ] && [ ! -f "/tmp/L/$l.log" ] && [ -z "$(ls -A "/tmp/parts/$l" 2>/dev/null)" ]; then
      echo "$l: nothing of it on this machine (boot $(cat /proc/sys/kernel/random/boot_id 2>/dev/null)): upload it again"
      exit 9
    fi
    while [ ! -f "/tmp/L/$l.ok" ]; do
      [ -f "/tmp/L/$l.failed" ] && { echo "$l: $(cat "/tmp/L/$l.failed")"; tail -5 "/tmp/L/$l.log"; exit 7; }
      [ $((SECONDS - t0)) -lt 300 ] || { echo "$l: not installed after 300 s"; tail -5 "/tmp/L/$l.log"; exit 8; }
      sleep 1
    done
    echo "$l: $(cat "/tmp/L/$l.ok")"
  done
}

release_layers() {  # release_layers V... -> the layers those releases need (each once), from the manifest;
  # the ray layers only with SERVE=1 (the engine proofs do not import ray)
  python3 -c 'import json,os,sys; m=json.load(open(sys.argv[1])); seen=[]
ok = lambda l: os.environ.get("SERVE") == "1" or m["layers"][l]["kind"] != "ray"
[seen.append(l) for v in sys.argv[2:] for l in m["releases"][v] if l not in seen and ok(l)]; print(*seen)' \
    "$BUNDLE/manifest.json" "$@"
}
