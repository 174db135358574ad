"""Stand-in for the vllm package of the official image (tests only)."""

from .version import __version__

__all__ = ["__version__"]
