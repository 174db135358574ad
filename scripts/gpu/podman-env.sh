# podman on a machine without a container engine, from carried Debian .debs (source this file):
#   DEBS=DIR . scripts/gpu/podman-env.sh
# Unpacks podman, crun, conmon, catatonit, docker-registry and their libraries into $PM (never into /), links only
# the shared libraries the host lacks into $PM/missing (LD_LIBRARY_PATH for podman and its helpers, never for the
# container), writes the engine's configuration (crun, cgroupfs, overlay storage or vfs where the kernel has no
# overlay, an insecure registry on loopback only) and a CDI spec for the GPUs (nvidia-ctk's if the host has it,
# else scripts/gpu/cdi_spec.py's with its ldconfig hook).  Prints one PODMAN line: version, storage driver, CDI.
PM=${PM:-/tmp/pm}
_REPO=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
DEBS=${DEBS:-$_REPO/.pm}
REGISTRY_HOSTPORT=${REGISTRY_HOSTPORT:-127.0.0.1:5001}
if [ ! -x "$PM/usr/bin/podman" ]; then
  mkdir -p "$PM/missing"
  for f in "$DEBS"/*.deb; do dpkg-deb -x "$f" "$PM"; done
  for round in 1 2 3; do
    for b in "$PM"/usr/bin/podman "$PM"/usr/bin/crun "$PM"/usr/bin/conmon "$PM"/usr/bin/docker-registry "$PM"/missing/*; do
      [ -e "$b" ] && LD_LIBRARY_PATH="$PM/missing" ldd "$b" 2>/dev/null | sed -n 's/^[[:space:]]*\([^[:space:]]*\) => not found.*/\1/p'
    done | sort -u | while read -r so; do
      f=$(find "$PM/usr/lib" "$PM/lib" -name "$so" 2>/dev/null | head -1)
      [ -n "$f" ] && ln -sf "$(readlink -f "$f")" "$PM/missing/$so"
    done
  done
fi
export LD_LIBRARY_PATH="$PM/missing" PATH="$PM/usr/bin:$PM/usr/sbin:$PATH"
mkdir -p /etc/containers /etc/cdi /var/lib/containers/storage /run/containers/storage
_driver=overlay
grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null || true
grep -qw overlay /proc/filesystems || _driver=vfs
cat > /etc/containers/storage.conf <<EOF
[storage]
driver = "$_driver"
runroot = "/run/containers/storage"
graphroot = "${GRAPHROOT:-/var/lib/containers/storage}"
EOF
echo '{"default":[{"type":"insecureAcceptAnything"}]}' > /etc/containers/policy.json
cat > /etc/containers/registries.conf <<EOF
unqualified-search-registries = []
[[registry]]
location = "$REGISTRY_HOSTPORT"
insecure = true
EOF
# podman starts conmon, and conmon crun, with an environment of their own: each gets a wrapper that sets
# LD_LIBRARY_PATH for itself alone
for _b in conmon crun; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$PM/missing" "$PM/usr/bin/$_b" > "$PM/$_b-wrap"
  chmod +x "$PM/$_b-wrap"
done
_py=$(command -v python3)
printf '#!/bin/sh\nexec %s %s\n' "$_py" "$_REPO/scripts/gpu/cdi_ldcache_hook.py" > "$PM/cdi-hook" && chmod +x "$PM/cdi-hook"
export CONTAINERS_CONF="$PM/containers.conf"
cat > "$CONTAINERS_CONF" <<EOF
[containers]
# podman's default nofile limit (1048576) is above what such a host lets a process raise to: the host's limits
default_ulimits = []
seccomp_profile = "$PM/usr/share/containers/seccomp.json"
init_path = "$PM/usr/bin/catatonit"
cgroups = "${PODMAN_CGROUPS:-enabled}"
[engine]
runtime = "crun"
cgroup_manager = "cgroupfs"
events_logger = "file"
conmon_path = ["$PM/conmon-wrap"]
helper_binaries_dir = ["$PM/usr/libexec/podman", "$PM/usr/lib/podman"]
[engine.runtimes]
crun = ["$PM/crun-wrap"]
EOF
if [ ! -s /etc/cdi/nvidia.json ] && [ ! -s /etc/cdi/nvidia.yaml ]; then
  if command -v nvidia-ctk >/dev/null 2>&1; then
    nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml >/dev/null 2>&1 && _cdi=nvidia-ctk
  fi
  [ -n "${_cdi:-}" ] || { "$_py" "$_REPO/scripts/gpu/cdi_spec.py" /etc/cdi/nvidia.json --hook "$PM/cdi-hook" >/dev/null && _cdi=cdi_spec.py; }
fi
echo "PODMAN $(podman --version 2>&1 | head -1); storage $_driver; CDI ${_cdi:-existing} ($(ls /etc/cdi))"
# proof_registry_up LOG: Debian's docker-registry on $REGISTRY_HOSTPORT (loopback) over /var/lib/proof-registry, in a
# session of its own (it outlives the call that starts it); says whether it answers
proof_registry_up() {
  mkdir -p /var/lib/proof-registry
  printf 'version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: /var/lib/proof-registry\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n' \
    "$REGISTRY_HOSTPORT" > /tmp/registry.yml
  setsid docker-registry serve /tmp/registry.yml > "$1" 2>&1 < /dev/null &
  for _ in $(seq 1 40); do curl -fsS "http://$REGISTRY_HOSTPORT/v2/" > /dev/null 2>&1 && break; sleep 0.25; done
  if curl -fsS "http://$REGISTRY_HOSTPORT/v2/" > /dev/null 2>&1; then echo "REGISTRY up on $REGISTRY_HOSTPORT"; else echo "REGISTRY failed"; tail -5 "$1"; fi
}
