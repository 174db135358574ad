"""Image: from a lock and a patch series to a pushed image.

``naming`` (image references, tags, repository, installer, serve backend and file names),
``render`` (Dockerfile and build context), ``sbom`` (CycloneDX), ``provenance`` (SLSA), ``build``
(BuildKit through the engine adapter), ``push`` with ``registry`` and ``referrers``, ``retag`` (a deploy tag moved to a
manifest the registry holds, and an image's container config).  Imports ``builder.patching``,
``builder.resolve`` and the ground floor.
"""
