#!/usr/bin/env bash
# The test command: set up, start the Docker engine + local registry, run the whole suite
# (unit + slow integration; GPU tests are skipped without a GPU), then stop and remove only what
# this run started: an engine or registry that was already running stays running, and images
# that were there before stay; the run's temp files (smoke server logs, vLLM's cache) go.
set -euo pipefail
cd "$(dirname "$0")/.."
# uv must never fetch CPython from the network (only PyPI is allowed/reachable).
export UV_PYTHON_DOWNLOADS=never
# Docker-backed tests fail (not skip) when the engine the script started is unusable.
export BUILD_IMAGE_REQUIRE_DOCKER=1
DOCKER=${BUILD_IMAGE_DOCKER:-docker}
scripts/setup.sh
# the linters first (pyproject.toml [tool.ruff], [tool.importlinter]; both are in the test extra): a finding
# fails the run in seconds
.venv/bin/ruff check .
.venv/bin/ruff format --check .
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" .venv/bin/lint-imports --no-cache

# Everything the suite writes outside the checkout and the download cache lands in one run dir.
RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/build-image-test.XXXXXX")
export TMPDIR="$RUN_DIR/tmp" VLLM_CACHE_ROOT="$RUN_DIR/vllm-cache"
mkdir -p "$TMPDIR" "$VLLM_CACHE_ROOT"

# Free space on the file systems the run writes to (its temp files, the download cache, the engine's
# storage), printed at the start, before the Docker tests and after a failure: a full disk then reads
# as such in the log.  A fresh machine's run needs about NEED_GB free (measured peak, docs/testing.md).
NEED_GB=10
disk() {
  local cache=${BUILD_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/build-image} paths=("$RUN_DIR") p
  # the nearest existing folder of each (a fresh machine has no cache and no engine storage yet)
  for p in "$cache" /var/lib/docker; do
    while [ ! -d "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done
    paths+=("$p")
  done
  echo "disk ($1):"
  { df -Ph "${paths[@]}" 2>/dev/null || true; } | awk 'NR == 1 || !seen[$6]++ {print "  " $0}'
  local avail
  avail=$(df -Pk "$RUN_DIR" | awk 'NR == 2 {print int($4 / 1048576)}')
  if [ "$1" = start ] && [ "$avail" -lt "$NEED_GB" ]; then
    echo "  warning: ${avail} GiB free beside $RUN_DIR; a run on a fresh machine needs about ${NEED_GB} GiB"
  fi
}
disk start

engine_was_up=0; registry_was_up=0
"$DOCKER" info >/dev/null 2>&1 && engine_was_up=1
curl -fsS http://127.0.0.1:5000/v2/ >/dev/null 2>&1 && registry_was_up=1
images_before=""
[ "$engine_was_up" = 1 ] && images_before=$("$DOCKER" image ls -aq --no-trunc | sort -u)

prepare_pid=""; docker_pid=""
cleanup() {
  local rc=$?
  [ "$rc" = 0 ] || disk "at the end, exit $rc"
  [ -z "$prepare_pid" ] || kill "$prepare_pid" 2>/dev/null || true
  [ -z "$docker_pid" ] || kill "$docker_pid" 2>/dev/null || true
  if "$DOCKER" info >/dev/null 2>&1; then
    if [ "$engine_was_up" = 1 ]; then
      # a shared engine: remove only the images this run added (by ID), keep its build cache
      local new
      new=$(comm -13 <(printf '%s\n' "$images_before") <("$DOCKER" image ls -aq --no-trunc | sort -u) | grep . || true)
      [ -z "$new" ] || "$DOCKER" image rm -f $new >/dev/null 2>&1 || true
    else
      # this run's own engine: nothing in it predates the run
      "$DOCKER" image prune -af >/dev/null 2>&1 || true
      "$DOCKER" builder prune -af >/dev/null 2>&1 || true
    fi
  fi
  local stop=()
  [ "$registry_was_up" = 1 ] || stop+=(registry)
  [ "$engine_was_up" = 1 ] || stop+=(dockerd)
  [ ${#stop[@]} -eq 0 ] || scripts/services.sh stop "${stop[@]}"
  # the registry this run started kept what the tests pushed: its storage goes with it
  [ "$registry_was_up" = 1 ] || rm -rf "${BUILD_IMAGE_SERVICES_DIR:-/tmp/build-image-services}/registry-data"
  rm -rf "$RUN_DIR"
  exit "$rc"
}
trap cleanup EXIT
scripts/services.sh start
# Two pytest runs side by side, each printing its summary ("N passed"): the tests that need no engine in
# parallel (pytest-xdist, BUILD_IMAGE_TEST_WORKERS processes; tests sharing a cache, a wheel or a local Ray
# head are grouped onto one worker by their xdist_group mark), and the Docker tests one after another (one
# engine, one registry port, shared image tags), whose log is printed when both have ended.  The two runs
# overlap because neither keeps both cores busy alone (a cold run measured 62% of two cores with them one after
# the other: downloads, container starts and builds wait).  Meanwhile, in the background,
# tests/prepare_docker.py makes what the Docker tests download and build into the cache (the stand-in base
# image, find-links folders, the ray wheelhouse; each under its lock, so a fixture needing one waits for it).
# The script fails when either run fails; a run that selects no test (pytest's exit 5, e.g. a file argument) is
# not a failure unless neither selects one.  Each run ends with its ten slowest tests (--durations): where the
# time goes, in every CI log.
WORKERS=${BUILD_IMAGE_TEST_WORKERS:-3}
.venv/bin/python -m tests.prepare_docker >"$RUN_DIR/prepare-docker.log" 2>&1 &
prepare_pid=$!
parallel=0; serial=0
.venv/bin/python -m pytest -m "docker and not gpu" --durations=10 "$@" >"$RUN_DIR/docker-tests.log" 2>&1 &
docker_pid=$!
.venv/bin/python -m pytest -m "not gpu and not docker" -n "$WORKERS" --dist loadgroup --durations=10 "$@" || parallel=$?
wait "$docker_pid" || serial=$?
docker_pid=""
echo "==== the Docker tests (run beside the others) ===="
cat "$RUN_DIR/docker-tests.log"
if ! wait "$prepare_pid"; then
  echo "tests/prepare_docker.py: not everything was prepared (the Docker tests' fixtures made it again):"
  cat "$RUN_DIR/prepare-docker.log"
fi
prepare_pid=""
disk "after the tests"
if [ "$parallel" = 5 ] && [ "$serial" = 5 ]; then exit 5; fi
[ "$parallel" = 5 ] && parallel=0
[ "$serial" = 5 ] && serial=0
[ "$parallel" = 0 ] || exit "$parallel"
exit "$serial"
