"""Shared test configuration.

Shared fixtures live in plugin modules (one per area) so that parallel work on
different stages does not collide in one file:
  tests/fx_wheels.py  - small wheels built by the tests into a find-links folder (+ gcc extensions)
  tests/fx_docker.py  - Docker engine / local registry / stand-in base image (session scoped)
"""

pytest_plugins = ["tests.fx_wheels", "tests.fx_docker"]
