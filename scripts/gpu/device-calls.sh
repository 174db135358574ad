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

boot_id() { cat /proc/sys/kernel/random/boot_id 2>/dev/null; }

running() {  # the run launched on this machine is still alive (its own pid, written by the run's shell)
  [ -f "$P/run.pid" ] && kill -0 "$(cat "$P/run.pid")" 2>/dev/null
}

waitdone() {  # until the run prints DONE or FAILED, or its process is gone; never waits on a run that is not there
  local t0=$SECONDS pat='^[0-9:]+ DONE$|FAILED$'
  [ -z "${WAIT_UNTIL:-}" ] || pat="$pat|$WAIT_UNTIL"   # WAIT_UNTIL: a progress line to return at (MATRIX DONE)
  if [ ! -f "$P/run.pid" ]; then
    echo "$LABEL LOST: no run on this machine (boot $(boot_id)); it went back and came up bare: upload and launch again"
    exit 9
  fi
  while [ $((SECONDS - t0)) -lt "$WAIT" ]; do
    grep -qE "$pat" "$P/progress.txt" 2>/dev/null && break
    running || break
    sleep 5
  done
  cat "$P/progress.txt"
  collect
  if grep -qE "^[0-9:]+ DONE$" "$P/progress.txt"; then echo "$LABEL FINISHED"
  elif [ -n "${WAIT_UNTIL:-}" ] && grep -qE "$WAIT_UNTIL" "$P/progress.txt"; then echo "$LABEL REACHED $WAIT_UNTIL"
  elif running; then echo "$LABEL STILL RUNNING (call: $WAIT_CMD)"
  else echo "$LABEL ENDED WITHOUT DONE (run.log:)"; tail -20 "$P/run.log"; fi
}

launch() {  # a fresh run folder, the run in its own session (it outlives the call), its own pid kept; NOWAIT=1:
  # return at once (upload calls may follow while it runs)
  rm -rf "$P" && mkdir -p "$P"
  P=$P setsid nohup bash -c 'echo $$ > "$P/run.pid"; exec "$0"' "$RUN_SCRIPT" > "$P/run.log" 2>&1 < /dev/null &
  sleep 2
  if [ "${NOWAIT:-}" = 1 ]; then cat "$P/progress.txt" 2>/dev/null; echo "$LABEL LAUNCHED (boot $(boot_id))"
  else waitdone; fi
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
  echo "$1: part $2 received ($have of $want; boot $(boot_id))"
  cp "$BUNDLE/manifest.json" /tmp/L/manifest.json
  if [ "$have" = "$want" ]; then
    rm -f "/tmp/L/$1.ok" "/tmp/L/$1.failed"
    setsid nohup bash -c "$(declare -f install_layer layer_field); BUNDLE=/tmp/L install_layer $1" \
      > "/tmp/L/$1.log" 2>&1 < /dev/null &
    echo "$1: complete; installing in the background (/tmp/L/$1.log)"
  fi
  inventory
  [ ! -f "$P/progress.txt" ] || { echo "run in flight ($(running && echo alive || echo ended)):"; tail -3 "$P/progress.txt"; }
}

inventory() {  # one line the host reads back (scripts/gpu/bundle_calls.py --reply): the boot id and, for every
  # layer of the manifest, ok | installing | failed | HAVE/WANT:the part numbers held
  python3 - /tmp/L/manifest.json "$(boot_id)" <<'PY'
import json, os, sys
m = json.load(open(sys.argv[1]))
out = [f"boot={sys.argv[2]}"]
for name, layer in m["layers"].items():
    if os.path.exists(f"/tmp/L/{name}.ok"):
        state = "ok"
    elif os.path.exists(f"/tmp/L/{name}.failed"):
        state = "failed"
    elif os.path.exists(f"/tmp/L/{name}.log"):
        state = "installing"
    else:
        d = f"/tmp/parts/{name}"
        held = sorted(int(p[1:]) for p in os.listdir(d) if p[:1] == "p" and p[1:].isdigit()) if os.path.isdir(d) else []
        state = f"{len(held)}/{len(layer['parts'])}" + (":" + ",".join(map(str, held)) if held else "")
    out.append(f"{name}={state}")
print("INVENTORY", " ".join(out))
PY
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
  # layer has no install log and no result on this machine: it went back and came up bare, or a part is missing,
  # and waiting would only spend device time; the upload calls print the boot id and the inventory, from which
  # scripts/gpu/bundle_calls.py --reply says which parts to send again; a
  # layer whose parts are not all here and whose install never started fails at once too (exit 9): its missing
  # parts are not coming while this call runs)
  local t0=$SECONDS l
  for l in "$@"; do
    if [ ! -f "/tmp/L/$l.ok" ] && [ ! -f "/tmp/L/$l.log" ]; then
      echo "$l: not all of its parts are on this machine (boot $(boot_id)): send the missing ones again"
      inventory
      exit 9
    fi
    while [ ! -f "/tmp/L/$l.ok" ]; do
      [ -f "/tmp/L/$l.failed" ] && { echo "$l: $(cat "/tmp/L/$l.failed")"; tail -5 "/tmp/L/$l.log"; inventory; exit 7; }
      [ $((SECONDS - t0)) -lt 300 ] || { echo "$l: not installed after 300 s"; tail -5 "/tmp/L/$l.log"; inventory; exit 8; }
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

await_layers() {  # await_layers LAYER...: wait_layers for a run launched while uploads go on (gpu-proof.sh launch):
  # returns 1 (never exits) when a layer failed, or when nothing of a missing layer changed for STALL_S seconds
  local l sig last t lim
  for l in "$@"; do
    t=$SECONDS; last=""
    while [ ! -f "/tmp/L/$l.ok" ]; do
      [ -f "/tmp/L/$l.failed" ] && { echo "$l: $(cat "/tmp/L/$l.failed")"; return 1; }
      sig="$(find "/tmp/parts/$l" /tmp/cas/parts -name '[pc]*' 2>/dev/null | wc -l) $(stat -c %s "/tmp/L/$l.log" 2>/dev/null)"
      [ "$sig" = "$last" ] || { last=$sig; t=$SECONDS; }
      lim=${STALL_S:-120}; [ ! -f "/tmp/L/$l.log" ] || lim=300   # installing: pip -q writes nothing meanwhile
      [ $((SECONDS - t)) -lt "$lim" ] || { echo "$l: nothing arrived for $lim s (boot $(boot_id))"; return 1; }
      sleep 2
    done
  done
}
