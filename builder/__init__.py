"""build-image: dependency-consistent vLLM + Ray serving images."""

__version__ = "0.1.0"
