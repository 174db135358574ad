#!/usr/bin/env bash
# Build the local stand-in for the official vLLM image (tests/benchmarks only).
#
#   scripts/make-standin-base.sh [--platform linux/amd64|linux/arm64] [TAG]
#       (default: linux/amd64, tag standin.local/vllm/vllm-openai:v0.26.0; for linux/arm64
#        standin.local/vllm/vllm-openai:v0.26.0-linux-arm64)
#   ARCH=arm64 scripts/make-standin-base.sh   (the same as --platform linux/arm64)
#
# linux/arm64 on an x86_64 host: debootstrap --arch=arm64 --foreign, its second stage in a chroot
# under QEMU (qemu-aarch64 registered in binfmt_misc with the F flag: scripts/services.sh install),
# an image of the rootfs built FROM scratch with --platform linux/arm64, and the final `docker build --platform linux/arm64`
# (BuildKit runs its RUN steps under the same QEMU).  Docker's classic image store keeps one image
# per tag, so the two stand-ins carry different tags.
#
# No image can be pulled here, so the tests need a small local base that looks
# like the vendor image where it matters to build-image:
#   - Debian bookworm minbase (debootstrap) with Debian's python3 (3.11),
#     python3-numpy (a numpy 1.x build: the ABI floor), python3-numexpr (a C extension
#     compiled against that numpy 1.x C API, like the vendor image's binary packages) and python3-pip;
#   - a small *installed* fake `vllm` 0.26.0 distribution (real dist-info with
#     RECORD, installed by pip from a wheel built here) whose files the test
#     patch series in tests/data/standin/patches touches.
#
# Idempotent: the image carries the label org.build-image.standin.recipe=<hash
# of this script + tests/data/standin/vllm>; when an image with that tag and that
# label exists, nothing is done.  The debootstrap rootfs is cached as a tarball
# under $BUILD_IMAGE_CACHE (default ~/.cache/build-image)/standin/.
#
# Outputs (stdout, last line): the image tag.  Also writes the fake vllm wheel to
# $CACHE/standin/vllm-0.26.0-py3-none-any.whl (the "vendor wheel" for patch checks).
set -euo pipefail

ARCH=${ARCH:-amd64}
case "${1:-}" in
  --platform) ARCH=${2:?--platform needs linux/amd64 or linux/arm64}; shift 2 ;;
  --platform=*) ARCH=${1#--platform=}; shift ;;
esac
case "$ARCH" in
  linux/amd64|amd64|x86_64) ARCH=amd64 ;;
  linux/arm64|linux/arm64/v8|arm64|aarch64) ARCH=arm64 ;;
  *) echo "make-standin-base: unknown platform $ARCH (linux/amd64 or linux/arm64)" >&2; exit 2 ;;
esac
if [ "$ARCH" = amd64 ]; then
  TAG=${1:-standin.local/vllm/vllm-openai:v0.26.0}
else
  TAG=${1:-standin.local/vllm/vllm-openai:v0.26.0-linux-$ARCH}
fi
DOCKER=${DOCKER:-${BUILD_IMAGE_DOCKER:-docker}}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA="$ROOT/tests/data/standin/vllm"
CACHE=${BUILD_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/build-image}/standin
SUITE=bookworm
MIRROR=${STANDIN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3,python3-numpy,python3-numexpr,python3-pip,python3-venv
mkdir -p "$CACHE"
export DOCKER_BUILDKIT=1

log() { echo "make-standin-base: $*" >&2; }

recipe=$( { cat "$0"; (cd "$DATA" && find . -type f | LC_ALL=C sort | xargs sha256sum); } | sha256sum | cut -c1-16)
# amd64 keeps the key and the names it always had (existing caches stay valid); arm64's carry the arch
if [ "$ARCH" = amd64 ]; then
  recipe_label=$recipe; AKEY=""; DEB_ARCH=""
else
  recipe_label="$recipe-$ARCH"; AKEY="-$ARCH"; DEB_ARCH=$ARCH
fi

if have=$($DOCKER image inspect --format '{{ index .Config.Labels "org.build-image.standin.recipe" }}' "$TAG" 2>/dev/null) \
   && [ "$have" = "$recipe_label" ] && [ -f "$CACHE/vllm-0.26.0-py3-none-any.whl" ]; then
  log "$TAG is up to date (recipe $recipe_label)"
  echo "$TAG"
  exit 0
fi

# 1. the fake vllm wheel (deterministic: fixed timestamps, sorted entries)
WHEEL="$CACHE/vllm-0.26.0-py3-none-any.whl"
python3 - "$DATA" "$WHEEL" <<'PY'
import base64, hashlib, os, sys, zipfile
src, out = sys.argv[1], sys.argv[2]
di = "vllm-0.26.0.dist-info"
files = []
for dp, dn, fn in os.walk(os.path.join(src, "vllm")):
    dn.sort()
    for f in sorted(fn):
        if f.endswith(".pyc"):
            continue
        p = os.path.join(dp, f)
        files.append((os.path.relpath(p, src), open(p, "rb").read()))
files.sort()
files.append((f"{di}/METADATA", open(os.path.join(src, "METADATA"), "rb").read()))
files.append((f"{di}/WHEEL", b"Wheel-Version: 1.0\nGenerator: build-image-standin\nRoot-Is-Purelib: true\nTag: py3-none-any\n"))
files.append((f"{di}/top_level.txt", b"vllm\n"))
def rec(name, data):
    d = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={d},{len(data)}"
record = "\n".join([rec(n, d) for n, d in files] + [f"{di}/RECORD,,"]) + "\n"
files.append((f"{di}/RECORD", record.encode()))
tmp = out + ".tmp"
with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
    for name, data in files:
        zi = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
        zi.external_attr = 0o644 << 16
        zi.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(zi, data)
os.replace(tmp, out)
PY
log "fake vllm wheel: $WHEEL"

# 2. the debootstrap rootfs (cached tarball keyed by suite + package list, and the arch but for amd64)
rkey=$(echo "$SUITE minbase $PACKAGES" | sha256sum | cut -c1-16)
ROOTFS_TAR="$CACHE/rootfs-$SUITE$AKEY-$rkey.tar"
ROOTFS_IMG="standin.local/rootfs:$SUITE$AKEY-$rkey"
if ! $DOCKER image inspect "$ROOTFS_IMG" >/dev/null 2>&1 && [ ! -s "$ROOTFS_TAR" ]; then
  work=$(mktemp -d /tmp/standin-rootfs.XXXXXX)
  trap 'rm -rf "$work"' EXIT
  if [ -z "$DEB_ARCH" ]; then
    log "debootstrap --variant=minbase $SUITE (+ $PACKAGES); this takes a few minutes once"
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$work/root" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
      || { tail -30 "$work/debootstrap.log" >&2; exit 1; }
  else
    # the first stage unpacks on the host; the second runs the target's own binaries, under QEMU
    # unless the host is that machine (binfmt_misc: scripts/services.sh install registers qemu-aarch64)
    if [ "$(uname -m)" != aarch64 ] && [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
      log "qemu-aarch64 is not registered in binfmt_misc: run scripts/services.sh install"; exit 1
    fi
    log "debootstrap --arch=$DEB_ARCH --variant=minbase $SUITE (+ $PACKAGES), second stage under QEMU"
    { debootstrap --arch="$DEB_ARCH" --foreign --variant=minbase --include="$PACKAGES" "$SUITE" "$work/root" \
        "$MIRROR" && chroot "$work/root" /debootstrap/debootstrap --second-stage; } >"$work/debootstrap.log" 2>&1 \
      || { tail -30 "$work/debootstrap.log" >&2; exit 1; }
  fi
  rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"* \
         "$work/root/usr/share/doc" "$work/root/usr/share/man" "$work/root/usr/share/locale"
  tar -C "$work/root" --numeric-owner -cf "$ROOTFS_TAR.tmp" .
  mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
  rm -rf "$work"
  trap - EXIT
fi

# 3. import the rootfs, then install the fake vllm with pip (no network)
if ! $DOCKER image inspect "$ROOTFS_IMG" >/dev/null 2>&1; then
  log "import $ROOTFS_IMG"
  if [ -z "$DEB_ARCH" ]; then
    $DOCKER import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      -c 'CMD ["/bin/bash"]' "$ROOTFS_TAR" "$ROOTFS_IMG" >/dev/null
  else
    # Docker 20.10's `docker import --platform` records the host's architecture; an image built FROM scratch
    # with --platform carries the one asked for, which BuildKit needs to find the image locally below
    rctx=$(mktemp -d /tmp/standin-rootfs-ctx.XXXXXX)
    ln "$ROOTFS_TAR" "$rctx/rootfs.tar" 2>/dev/null || cp "$ROOTFS_TAR" "$rctx/rootfs.tar"
    printf '%s\n' 'FROM scratch' 'ADD rootfs.tar /' \
      'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' 'CMD ["/bin/bash"]' >"$rctx/Dockerfile"
    $DOCKER build --platform "linux/$DEB_ARCH" --network=none -q -t "$ROOTFS_IMG" "$rctx" >/dev/null \
      || { rm -rf "$rctx"; exit 1; }
    rm -rf "$rctx"
  fi
fi

ctx=$(mktemp -d /tmp/standin-ctx.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
cp "$WHEEL" "$ctx/"
# Debian installs its Python packages with .egg-info metadata; the official image has
# pip-installed ones (.dist-info + RECORD).  Give Debian's numpy & co. a dist-info made
# from dpkg's file list, so the stand-in's numpy is seen like the vendor image's.
cat >"$ctx/egg2dist.py" <<'PY'
import base64, glob, hashlib, os, shutil
site = "/usr/lib/python3/dist-packages"
for egg in sorted(glob.glob(f"{site}/*.egg-info")):
    meta = open(os.path.join(egg, "PKG-INFO") if os.path.isdir(egg) else egg, "rb").read()
    kv = dict(l.split(": ", 1) for l in meta.decode().splitlines() if ": " in l)
    name, version = kv["Name"], kv["Version"]
    owners = [f for f in glob.glob("/var/lib/dpkg/info/*.list") if egg in open(f).read().split("\n")]
    files = []
    for lst in owners:
        for path in open(lst).read().split("\n"):
            if path.startswith(site + "/") and os.path.isfile(path) and not os.path.islink(path) and ".egg-info" not in path:
                files.append(path)
    di = f"{site}/{name.replace('-', '_')}-{version}.dist-info"
    os.makedirs(di, exist_ok=True)
    open(f"{di}/METADATA", "wb").write(meta)
    open(f"{di}/INSTALLER", "w").write("debian\n")
    rows = []
    for path in sorted(set(files)):
        data = open(path, "rb").read()
        d = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{os.path.relpath(path, site)},sha256={d},{len(data)}")
    rows += [f"{os.path.relpath(di, site)}/{n}" + ",," for n in ("METADATA", "INSTALLER", "RECORD")]
    open(f"{di}/RECORD", "w").write("\n".join(rows) + "\n")
    shutil.rmtree(egg) if os.path.isdir(egg) else os.unlink(egg)
    print(f"egg2dist: {name} {version}: {len(files)} files")
PY
cat >"$ctx/Dockerfile" <<EOF
FROM $ROOTFS_IMG
COPY vllm-0.26.0-py3-none-any.whl egg2dist.py /tmp/
RUN python3 /tmp/egg2dist.py && rm /tmp/egg2dist.py
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-index --no-deps --no-cache-dir \\
      --root-user-action=ignore --disable-pip-version-check /tmp/vllm-0.26.0-py3-none-any.whl \\
 && rm /tmp/vllm-0.26.0-py3-none-any.whl \\
 && python3 -c 'import vllm, numpy; assert vllm.__version__ == "0.26.0"; assert numpy.__version__.startswith("1.")'
LABEL org.build-image.standin.recipe="$recipe_label" \\
      org.opencontainers.image.title="build-image stand-in for vllm/vllm-openai:v0.26.0" \\
      org.opencontainers.image.description="Debian bookworm minbase + python3 + python3-numpy (1.x) + fake vllm 0.26.0; tests only"
EOF
log "building $TAG"
$DOCKER build ${DEB_ARCH:+--platform "linux/$DEB_ARCH"} --network=none -q -t "$TAG" "$ctx" >/dev/null
echo "$TAG"
