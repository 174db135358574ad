#!/usr/bin/env bash
# The image the tool built, booted through podman with CDI GPUs on a machine without a container engine.
#   scripts/gpu/image-proof.sh setup        carry .pm (podman-env.sh's .debs) and .biwhl (build-image's own
#                                           requirements as wheels): podman set up, build-image installed in
#                                           /tmp/bi-site, the registry (127.0.0.1:5001) started over
#                                           /var/lib/proof-registry
#   scripts/gpu/image-proof.sh recv N       carry .imgparts/manifest.json, .imgparts/images.json and .imgparts/pNNN:
#                                           registry_pack.py recv (the storage unpacked once all parts are here)
#   scripts/gpu/image-proof.sh launch N     recv N, then image-proof-run.sh (from setup's copy of the checkout)
#                                           in the background; returns at once.  recv and launch need only this
#                                           script and registry_pack.py of the checkout: the rest of the tree may
#                                           be left behind, so a call carries a larger part
#   [WAIT=S] scripts/gpu/image-proof.sh wait   until PROOF DONE (at most S s), then $OUT/proof.tgz
# Every call prints the boot id and the run's last progress lines.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
P=${P:-/tmp/iproof}
WAIT=${WAIT:-540}
echo "BOOT $(cat /proc/sys/kernel/random/boot_id)"
t0=$(date +%s)
progress() { [ -f "$P/progress.txt" ] && tail -"${1:-3}" "$P/progress.txt"; }
case "${1:-}" in
  setup)
    mkdir -p "$P"
    DEBS=$REPO/.pm . "$REPO/scripts/gpu/podman-env.sh" > "$P/podman.txt"; cat "$P/podman.txt"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/bi-site "$REPO"/.biwhl/*.whl \
      && echo "build-image's requirements in /tmp/bi-site"
    rm -rf /tmp/repo-run && mkdir -p /tmp/repo-run && tar -C "$REPO" --exclude=./.pm --exclude=./.biwhl --exclude=./.imgparts -cf - . | tar -C /tmp/repo-run -xf -
    PYTHONPATH=/tmp/bi-site:/tmp/repo-run python3 -c 'from builder.cli import main; main()' --version
    proof_registry_up "$P/registry.log"
    echo "$(date -u +%T) setup done in $(( $(date +%s) - t0 )) s" >> "$P/phases.txt"; cat "$P/phases.txt" ;;
  recv)
    python3 "$REPO/scripts/gpu/registry_pack.py" recv "$REPO/.imgparts" "$2" /var/lib/proof-registry; progress 2 ;;
  launch)
    python3 "$REPO/scripts/gpu/registry_pack.py" recv "$REPO/.imgparts" "$2" /var/lib/proof-registry || exit 1
    echo "$(date -u +%T) last part received and unpacked at +$(( $(date +%s) - t0 )) s of this call" >> "$P/phases.txt"
    cp "$REPO/.imgparts/images.json" "$REPO"/.imgparts/*.lock "$P/" 2>/dev/null
    setsid bash /tmp/repo-run/scripts/gpu/image-proof-run.sh > "$P/run.log" 2>&1 < /dev/null &
    sleep 5; progress 5 ;;
  wait)
    while [ $(( $(date +%s) - t0 )) -lt "$WAIT" ]; do
      grep -q "PROOF DONE" "$P/progress.txt" 2>/dev/null && break; sleep 5
    done
    progress 40
    tar -C "$P" -czf "$OUT/proof.tgz" --exclude=cache --exclude=state/cache . 2>/dev/null; ls -l "$OUT" ;;
  *) echo "usage: $0 setup | recv N | launch N | wait"; exit 2 ;;
esac
