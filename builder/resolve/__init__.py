"""Resolve: what the base image holds and what goes on top of it.

Base manifests (``manifest``, ``base`` snapshots, ``reconstruct`` from a release's recipe,
``baseref`` naming which manifest a run uses), the package index (``index``), ray's version per
release (``raychoice``), the overlay lock (``lock``, the pipeline stage ``lockstage``), the lock
file formats (``lockfile`` for requirements.lock and its PEP 751 form, ``pylock`` reading and
writing PEP 751, ``twin`` the pylock.toml beside a lock), the ABI gate (``abi``) and the review
diff of two locks (``diff``).  Imports only the ground floor.
"""
