#!/usr/bin/env bash
# The test command: set up, start the Docker engine + local registry, run the whole suite
# (unit + slow integration; GPU tests are skipped without a GPU), stop what was started.
set -euo pipefail
cd "$(dirname "$0")/.."
# uv must never fetch CPython from the network (only PyPI is allowed/reachable).
export UV_PYTHON_DOWNLOADS=never
# Docker-backed tests fail (not skip) when the engine the script started is unusable.
export BUILD_IMAGE_REQUIRE_DOCKER=1
scripts/setup.sh
scripts/services.sh start
trap 'scripts/services.sh stop' EXIT
.venv/bin/python -m pytest -m "not gpu" "$@"
