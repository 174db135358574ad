"""Patching: the versioned vLLM patch series.

``series`` checks and applies a release's series, ``probe`` runs each patch's behaviour probe
against the real wheel, ``port`` carries a series from one release to the next.  Imports
``builder.resolve`` and the ground floor.
"""
