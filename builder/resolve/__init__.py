"""Resolve: what the base image holds and what goes on top of it.

Base manifests (``manifest``, ``base`` snapshots, ``recipe`` derived from a release's own build
files in its sdist (``sdist`` brings them, sha256-verified), ``reconstruct`` replaying the recipe's
install steps, ``baseref`` naming which manifest a run uses), the package index (``index``), ray's version per
release (``raychoice``), the overlay lock (``lock``, the pipeline stage ``lockstage``), the lock
file (``lockfile``: the one door that reads, checks, writes and sweeps requirements.lock and its
pylock.toml twin; its formats ``lockfile.requirements`` and ``lockfile.pylock``), the ABI gate (``abi``), the review
diff of two locks (``diff``) and the floor checks' host side (``floor``: the image's checker,
imported for the native digest and the manifest-vs-image comparison).  Imports only the ground
floor.
"""
