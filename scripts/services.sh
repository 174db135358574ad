#!/usr/bin/env bash
# Start/stop what the tests need: a Docker engine and a registry on 127.0.0.1:5000.
#   scripts/services.sh install   apt-get the packages (docker.io docker-registry skopeo debootstrap
#                                 qemu-user-static, and podman crun conmon: the podman engine's tests,
#                                 rootful, no daemon) and, on a host that is not aarch64, register
#                                 qemu-aarch64 in binfmt_misc (linux/arm64 builds under emulation)
#   scripts/services.sh start     install, start dockerd and the registry (PIDs in $STATE_DIR), wait until ready
#   scripts/services.sh stop [registry] [dockerd] [binfmt]   stop those (default registry and dockerd), by
#                                 the PID start recorded; binfmt: unregister qemu-aarch64 if install registered it
# Nothing listens beyond loopback: dockerd has no bridge/iptables, the registry binds 127.0.0.1.
set -euo pipefail
STATE_DIR=${BUILD_IMAGE_SERVICES_DIR:-/tmp/build-image-services}
# the docker CLI as build-image finds it: BUILD_IMAGE_DOCKER, else `docker` on PATH
DOCKER=${BUILD_IMAGE_DOCKER:-docker}
mkdir -p "$STATE_DIR"

install() {
  local need=()
  command -v dockerd >/dev/null || need+=(docker.io)
  command -v docker-registry >/dev/null || need+=(docker-registry)
  command -v skopeo >/dev/null || need+=(skopeo)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  command -v podman >/dev/null || need+=(podman crun conmon)
  [ "$(uname -m)" = aarch64 ] || [ -x /usr/bin/qemu-aarch64-static ] || need+=(qemu-user-static)
  if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
  fi
  binfmt_register
}

BINFMT=/proc/sys/fs/binfmt_misc

binfmt_register() {
  # qemu-aarch64 in binfmt_misc with the F (fix-binary) flag: the kernel opens the static interpreter
  # now, so it also runs inside chroots and containers (debootstrap's second stage, BuildKit's RUN steps).
  # Idempotent; what it mounted or registered is recorded in $STATE_DIR for `stop binfmt`.
  [ "$(uname -m)" = aarch64 ] && return 0
  local conf=/usr/lib/binfmt.d/qemu-aarch64.conf line
  if [ ! -e "$BINFMT/register" ]; then
    mount -t binfmt_misc binfmt_misc "$BINFMT"
    touch "$STATE_DIR/binfmt.mounted"
  fi
  [ -e "$BINFMT/qemu-aarch64" ] && return 0
  [ -f "$conf" ] || { echo "services.sh: $conf is missing (is qemu-user-static installed?)" >&2; exit 1; }
  line=$(grep -v '^[[:space:]]*#' "$conf" | grep -m1 '^:qemu-aarch64:')
  case "${line##*:}" in *F*) ;; *) line="${line}F" ;; esac
  printf '%s' "$line" >"$BINFMT/register"
  touch "$STATE_DIR/binfmt.registered"
  echo "registered qemu-aarch64 in binfmt_misc (flags ${line##*:})"
}

binfmt_unregister() {
  if [ -f "$STATE_DIR/binfmt.registered" ]; then
    [ -e "$BINFMT/qemu-aarch64" ] && echo -1 >"$BINFMT/qemu-aarch64"
    rm -f "$STATE_DIR/binfmt.registered"
  fi
  if [ -f "$STATE_DIR/binfmt.mounted" ]; then
    umount "$BINFMT" 2>/dev/null || true
    rm -f "$STATE_DIR/binfmt.mounted"
  fi
}

start() {
  install
  if ! "$DOCKER" info >/dev/null 2>&1; then
    dockerd --storage-driver=overlay2 --bridge=none --iptables=false --ip-forward=false \
      >"$STATE_DIR/dockerd.log" 2>&1 &
    echo $! >"$STATE_DIR/dockerd.pid"
    for _ in $(seq 1 60); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 1; done
    "$DOCKER" info >/dev/null 2>&1 || { echo "dockerd did not start:"; tail -20 "$STATE_DIR/dockerd.log"; exit 1; }
  fi
  if ! curl -fsS http://127.0.0.1:5000/v2/ >/dev/null 2>&1; then
    mkdir -p "$STATE_DIR/registry-data"
    cat >"$STATE_DIR/registry.yml" <<YML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $STATE_DIR/registry-data
  delete:
    enabled: true
http:
  addr: 127.0.0.1:5000
YML
    docker-registry serve "$STATE_DIR/registry.yml" >"$STATE_DIR/registry.log" 2>&1 &
    echo $! >"$STATE_DIR/registry.pid"
    for _ in $(seq 1 30); do curl -fsS http://127.0.0.1:5000/v2/ >/dev/null 2>&1 && break; sleep 0.5; done
    curl -fsS http://127.0.0.1:5000/v2/ >/dev/null || { echo "registry did not start:"; tail -20 "$STATE_DIR/registry.log"; exit 1; }
  fi
  echo "docker engine and registry (127.0.0.1:5000) are up"
}

stop() {
  # stop [registry] [dockerd]: only the named services (default both), each by the PID its start recorded
  local svcs=("$@")
  [ ${#svcs[@]} -gt 0 ] || svcs=(registry dockerd)
  for svc in "${svcs[@]}"; do
    case "$svc" in registry|dockerd) ;; binfmt) binfmt_unregister; continue ;;
      *) echo "services.sh stop: unknown service $svc" >&2; exit 2 ;; esac
    if [ -f "$STATE_DIR/$svc.pid" ]; then
      pid=$(cat "$STATE_DIR/$svc.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$STATE_DIR/$svc.pid"
    fi
  done
}

cmd=${1:?usage: services.sh install|start|stop [registry] [dockerd] [binfmt]}
shift
"$cmd" "$@"
