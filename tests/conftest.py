"""Shared test configuration.

Shared fixtures live in plugin modules (one per area) so that parallel work on
different stages does not collide in one file:
  tests/fx_wheels.py  - small wheels built by the tests into a find-links folder (+ gcc extensions)
  tests/fx_docker.py  - Docker engine / local registry / stand-in base image (session scoped)
  tests/fx_cache.py   - locks for what the tests make in the shared download cache (no fixtures)

Under pytest-xdist (``scripts/test.sh`` runs the tests that need no engine with ``-n N --dist
loadgroup``) tests that share something run on one worker, in order: an ``xdist_group`` mark
names what they share; every ``docker`` test is in the group "docker" (the engine, the registry
on 127.0.0.1:5000, the image tags and the stand-in base).
"""

import os
import signal

import pytest

pytest_plugins = ["tests.fx_wheels", "tests.fx_docker"]

# A suite started in the background of a non-interactive shell (`cmd &`) inherits SIGINT ignored,
# and an ignored signal stays ignored across exec: the Ctrl-C tests' commands would never see the
# SIGINT they send.  A handled signal is reset to the default in each child the suite starts.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Property-based fuzzing (tests/test_fuzz.py, docs/testing.md): the "ci" profile (the default) runs each
# property's bounded example count with a fixed seed (derandomize: the same cases every run, no example
# database), so CI stays within its time budget and a failure reproduces; BUILD_IMAGE_FUZZ=nightly runs
# test_fuzz.NIGHTLY_SCALE times as many, randomly seeded, keeping found failures in .hypothesis/.
try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:  # the test extra without hypothesis: tests/test_fuzz.py fails on its import, the rest runs
    pass
else:
    _hypothesis_settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
    _hypothesis_settings.register_profile("nightly", derandomize=False, deadline=None, print_blob=True)
    _hypothesis_settings.load_profile("nightly" if os.environ.get("BUILD_IMAGE_FUZZ") == "nightly" else "ci")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("docker") is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group("docker"))
