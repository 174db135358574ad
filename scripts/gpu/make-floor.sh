#!/usr/bin/env bash
# The floor image for `base materialize --from`, from the parts engine-probe.sh brought back:
#   scripts/gpu/make-floor.sh DIR [TAG]
# DIR holds part.NN (the xz of floor_rootfs.py's tar, in order), floor.tar.xz.sha256 and floor.json.  The joined
# file is checked against its sha256, imported as localhost/floor-rootfs:noble, and scripts/gpu/floor.Dockerfile
# adds what the release's Dockerfile does after its apt-get install (python3 alternative, pip the get-pip way;
# pip's wheel from PyPI, checked against the index's sha256).  TAG defaults to localhost/floor:noble-py312.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
D=$1; TAG=${2:-localhost/floor:noble-py312}
cd "$D"
cat part.* > floor.tar.xz
sha256sum -c floor.tar.xz.sha256
xz -dc floor.tar.xz > floor.tar
want=$(python3 -c 'import json; print(json.load(open("floor.json"))["tar_sha256"])')
[ "$(sha256sum floor.tar | cut -c1-64)" = "$want" ] || { echo "floor.tar differs from floor.json's tar_sha256"; exit 1; }
docker import floor.tar localhost/floor-rootfs:noble > /dev/null
rm -f pip-*.whl
python3 -m pip download -q --no-deps --only-binary=:all: -d . pip
W=$(ls pip-*.whl)
index=$(curl -fsS -H 'Accept: application/vnd.pypi.simple.v1+json' https://pypi.org/simple/pip/ \
  | python3 -c "import json,sys; print(next(f['hashes']['sha256'] for f in json.load(sys.stdin)['files'] if f['filename']=='$W'))")
[ "$(sha256sum "$W" | cut -c1-64)" = "$index" ] || { echo "$W differs from the index's sha256"; exit 1; }
cp "$REPO/scripts/gpu/floor.Dockerfile" Dockerfile
docker build -q --network=none --build-arg PIP_WHEEL="$W" \
  --label "org.build-image.floor.source=$(python3 -c 'import json; r=json.load(open("floor.json")); print(r["os"], "packages of a GPU host (floor_rootfs.py; tar sha256", r["tar_sha256"] + ")")')" \
  --label "org.build-image.floor.pip=$W (PyPI sha256 $index)" -t "$TAG" .
docker run --rm --pull=never --network=none "$TAG" sh -c 'python3 --version && python3 -m pip --version'
