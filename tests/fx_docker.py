"""Fixtures: Docker engine, local registry, stand-in base image (owned by the render/build work)."""
