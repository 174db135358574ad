#!/usr/bin/env bash
# The release matrix from the content-addressed bundle (scripts/gpu/cas_pack.py), one device call per part:
#   scripts/gpu/cas-proof.sh recv N      carry .bundle/cas/manifest.json and .bundle/cas/cNNN: the part kept, every
#                                        layer whose parts are all here installed in the background (cas_device.py)
#   RELEASES=... [REF_RELEASES=...] [UNPATCHED=...] [PATCHED=0|LIST] [SERVE_RELEASES=...] [GATE_RELEASE=V] \
#     [COLD_FORMATS=...] \
#     scripts/gpu/cas-proof.sh launch N
#                                        part N, then scripts/gpu/matrix-run.sh in the background (it waits for each
#                                        release's layers itself); the call returns at once
#   [WAIT_UNTIL='MATRIX DONE'] scripts/gpu/cas-proof.sh wait    until DONE (or WAIT_UNTIL's line), at most WAIT s
# The call list, and after a lost machine the parts to send again: scripts/gpu/cas_calls.py (here).
# Every call prints the boot id and one INVENTORY line (parts held, each layer's state).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
P=${P:-/tmp/proof}
WAIT=${WAIT:-540}
CASB=${CASB:-$REPO/.bundle/cas}
LABEL=PROOF TGZ=proof.tgz TGZ_EXCLUDE='cca' RUN_SCRIPT="$REPO/scripts/gpu/matrix-run.sh" WAIT_CMD="scripts/gpu/cas-proof.sh wait"
part_dir() { echo "$CASB"; }
# shellcheck source-path=SCRIPTDIR source=device-calls.sh
. "$REPO/scripts/gpu/device-calls.sh"
t0=$(date +%s.%N)
case "${1:-}" in
  recv) python3 "$REPO/scripts/gpu/cas_device.py" recv "$CASB" "$2" || exit $?
        [ ! -f "$P/progress.txt" ] || { echo "run in flight ($(running && echo alive || echo ended)):"; tail -2 "$P/progress.txt"; } ;;
  launch)
    [ -n "${RELEASES:-}" ] || { echo "launch: set RELEASES"; exit 2; }
    [ -z "${2:-}" ] || python3 "$REPO/scripts/gpu/cas_device.py" recv "$CASB" "$2" || exit $?
    export RELEASES REF_RELEASES="${REF_RELEASES:-}" SERVE_RELEASES="${SERVE_RELEASES:-}" COLD_FORMATS="${COLD_FORMATS:-}" \
      UNPATCHED="${UNPATCHED:-}" PATCHED="${PATCHED:-1}" GATE_RELEASE="${GATE_RELEASE:-none}"
    export MAXJOBS="${MAXJOBS:-6}" NOWAIT=1
    # the run works from a copy of the checkout: the device tool sends the checkout again with every call, and a
    # boot that imported builder while a call was arriving failed with "No module named 'builder.cli'" (2026-12-03)
    rm -rf /tmp/repo-run && mkdir -p /tmp/repo-run && tar -C "$REPO" --exclude=./.bundle -cf - . | tar -C /tmp/repo-run -xf -
    RUN_SCRIPT=/tmp/repo-run/scripts/gpu/matrix-run.sh
    launch ;;
  wait) waitdone ;;
  inventory) python3 "$REPO/scripts/gpu/cas_device.py" inventory ;;
  *) echo "usage: $0 recv N | launch [N] | wait | inventory"; exit 2 ;;
esac
echo "CALL $(date -u +%T) boot $(boot_id) command seconds $(python3 -c "import time; print(round(time.time() - $t0, 2))")"
