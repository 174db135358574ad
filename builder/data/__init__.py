"""The data that ships with the package: Dockerfile and KubeRay templates, the vLLM
patch series and the default base manifests and locks.

In the repository they live at the top level (``templates/``, ``patches/``,
``lockfiles/``), where reviewers read them; ``builder/data/<name>`` are symlinks to
those folders, and the wheel carries copies of them as package data.  Every module
finds them through :func:`path`, so an editable checkout and a ``pip install .``
into a fresh virtual environment read the same files whatever the working directory.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

#: the top-level data folders (``path()`` accepts names below these only)
FOLDERS = ("templates", "patches", "lockfiles")


def path(rel: str = "") -> Path:
    """The on-disk path of the package data ``rel`` (e.g. ``"lockfiles/base"``,
    ``"templates/Dockerfile.j2"``); ``""`` is the data root.

    The path may not exist (a version without a base manifest); callers check.
    Installed packages are always unpacked on disk (pip never runs them from a zip),
    so the resource is a real :class:`~pathlib.Path`."""
    top = rel.replace("\\", "/").strip("/").split("/", 1)[0]
    if rel and top not in FOLDERS:
        raise ValueError(f"builder.data.path: {rel!r} is not under {', '.join(FOLDERS)}")
    root = resources.files(__name__)
    res = root.joinpath(*[p for p in rel.split("/") if p]) if rel else root
    # resolved: in a checkout, messages name lockfiles/... rather than the symlink
    return Path(str(res)).resolve()
