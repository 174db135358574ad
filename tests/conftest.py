"""Shared test configuration.

Shared fixtures live in plugin modules (one per area) so that parallel work on
different stages does not collide in one file:
  tests/fx_wheels.py  - small wheels built by the tests into a find-links folder (+ gcc extensions)
  tests/fx_docker.py  - Docker engine / local registry / stand-in base image (session scoped)
  tests/fx_podman.py  - podman with the stand-in in its store (skipped where podman cannot run)
  tests/fx_cache.py   - locks for what the tests make in the shared download cache (no fixtures)

Under pytest-xdist (``scripts/test.sh`` runs the tests that need no engine with ``-n N --dist
loadgroup``) tests that share something run on one worker, in order: an ``xdist_group`` mark
names what they share; every ``docker`` test is in the group "docker" (the engine, the registry
on 127.0.0.1:5000, the image tags and the stand-in base).

Shared helpers: :func:`run` (a CLI command in process: exit code and output) and the
``private_cache`` fixture (the test's own download cache, named by its module's ``PRIVATE_CACHE``).
"""

import os
import signal

import pytest
from click.testing import CliRunner

pytest_plugins = ["tests.fx_wheels", "tests.fx_docker", "tests.fx_podman"]

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


def run(*args: str) -> tuple[int, str]:
    """``build-image ARGS`` in this process: (exit code, stdout and stderr); an unexpected exception raises."""
    from builder.cli import main

    res = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return res.exit_code, res.output


@pytest.fixture
def private_cache(request, tmp_path_factory, tmp_path, monkeypatch):
    """``BUILD_IMAGE_CACHE`` for this test: the folder its module names in ``PRIVATE_CACHE`` under the
    session's temp folder (shared by the modules naming the same one, so a wheel is fetched once per run;
    default ``bi-cache``), or a fresh one per test when the module sets ``PRIVATE_CACHE = None``."""
    name = getattr(request.module, "PRIVATE_CACHE", "bi-cache")
    cache = tmp_path / "bi-cache" if name is None else tmp_path_factory.getbasetemp() / name
    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(cache))
    return cache
