"""Image: from a lock and a patch series to a pushed image.

``naming`` (image references, tags, repository, installer, serve backend and file names),
``render`` (Dockerfile and build context), ``sbom`` (CycloneDX), ``provenance`` (SLSA), ``build``
(BuildKit through the engine adapter), ``push`` with ``registry`` and ``referrers``.  Imports ``builder.patching``,
``builder.resolve`` and the ground floor.
"""
