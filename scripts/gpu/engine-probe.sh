#!/usr/bin/env bash
# First call on a GPU machine without a container engine (carry .pm: the .debs of podman-env.sh):
#   scripts/gpu/engine-probe.sh probe   what the host is; the floor made of its installed packages
#                                       (floor_rootfs.py) as xz parts of 16 MiB, the first three to $OUT;
#                                       podman from the .debs: the floor imported, a container with CDI GPUs
#                                       (cuInit, device count, nvidia-smi), a push and pull through a registry
#                                       on 127.0.0.1:5001
#   scripts/gpu/engine-probe.sh rest    the floor's remaining parts to $OUT (the next call, same machine)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
F=/tmp/floor
FLOOR_WITH=${FLOOR_WITH:-"python3.12 python3.12-dev python3.12-venv gcc libc6-dev ca-certificates curl sudo libnuma1"}
t0=$(date +%s)
echo "BOOT $(cat /proc/sys/kernel/random/boot_id)"
}
case "${1:-}" in
  probe)
    . /etc/os-release; echo "OS $PRETTY_NAME; kernel $(uname -r); $(nproc) cores"
    df -h / /tmp /var/lib 2>/dev/null | tail -n +2
    for c in python3 python3.12 gcc dpkg-deb nvidia-ctk nvidia-smi xz zstd ldconfig curl; do printf '%s=%s ' $c "$(command -v $c)"; done; echo
    ls -la /dev/nvidia* 2>&1 | head; ls /usr/local/nvidia 2>&1
    ldconfig -p | grep -E 'libcuda\.so|libnvidia-ml\.so'
    grep -E 'overlay|cgroup' /proc/filesystems; mount | grep -E 'cgroup' | head -3
    dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\n' python3.12 python3.12-dev python3.12-venv python3-pip gcc g++ libnuma1 curl sudo ca-certificates ffmpeg libibverbs1 2>&1
    python3.12 -c 'import sysconfig; print("scheme", sysconfig.get_default_scheme(), sysconfig.get_paths()["purelib"])'
    mkdir -p $F; args=(); for p in $FLOOR_WITH; do args+=(--with "$p"); done
    python3 "$REPO/scripts/gpu/floor_rootfs.py" $F/floor.tar "${args[@]}" --report "$OUT/floor.json"
    xz -T0 -6 -c $F/floor.tar > $F/floor.tar.xz && (cd $F && sha256sum floor.tar.xz > floor.tar.xz.sha256 && split -b 16M -d -a 2 floor.tar.xz part.)
    cp $F/floor.tar.xz.sha256 "$OUT/"; ls -l $F
    n=0; for p in $F/part.*; do [ $n -lt 3 ] && cp "$p" "$OUT/"; n=$((n+1)); done
    echo "PARTS $n (3 in this call); TIME floor $(( $(date +%s)-t0 )) s"
    DEBS=$REPO/.pm . "$REPO/scripts/gpu/podman-env.sh"
    podman info --format '{{.Host.CgroupsVersion}} {{.Host.OCIRuntime.Name}} {{.Store.GraphDriverName}}' 2>&1 | tail -3
    podman import $F/floor.tar localhost/floor:probe 2>&1 | tail -1
    probe='ls /dev/nvidia*; ldconfig -p | grep libcuda.so; nvidia-smi -L; python3.12 -c "import ctypes; l=ctypes.CDLL(\"libcuda.so.1\"); print(\"cuInit\", l.cuInit(0)); n=ctypes.c_int(); l.cuDeviceGetCount(ctypes.byref(n)); print(\"devices\", n.value)"'
    podman run --rm --pull=never --network=host --device nvidia.com/gpu=all localhost/floor:probe sh -c "$probe" 2>&1 | tail -12 \
      || true
    echo "--- again with --cgroups=disabled"
    podman run --rm --pull=never --cgroups=disabled --network=host --device nvidia.com/gpu=all localhost/floor:probe sh -c "$probe" 2>&1 | tail -6
    proof_registry_up /tmp/registry.log
    podman push --tls-verify=false localhost/floor:probe 127.0.0.1:5001/floor:probe 2>&1 | tail -2
    podman rmi localhost/floor:probe > /dev/null 2>&1; podman pull --tls-verify=false 127.0.0.1:5001/floor:probe 2>&1 | tail -1
    echo "TIME total $(( $(date +%s)-t0 )) s"
    ;;
  rest)
    n=0; for p in $F/part.*; do [ $n -ge 3 ] && cp "$p" "$OUT/"; n=$((n+1)); done; ls -l "$OUT" ;;
  *) echo "usage: $0 probe | rest"; exit 2 ;;
esac
