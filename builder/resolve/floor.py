"""The floor checks' shared logic on the host: the checker the image runs, imported here.

``templates/checks/base_check.py`` runs in the image's checks stage with the base's own
python (standard library only).  The host needs two of its functions: the digest of a
distribution's native files (recorded in a base manifest by ``base snapshot``) and the
comparison of a manifest with what an image holds (the pipeline's verification of a base
the engine holds).  Importing the one file keeps both sides the same code.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

from builder.data import path as data_path
from builder.resolve.manifest import BaseManifest

CHECKER = "templates/checks/base_check.py"


def checker_path() -> Path:
    return data_path(CHECKER)


@functools.lru_cache(maxsize=1)
def checker() -> ModuleType:
    """The checker script as a module (its ``main`` is not run)."""
    spec = importlib.util.spec_from_file_location("build_image_base_check", checker_path())
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def native_digest(dist_info: str | Path) -> str | None:
    """sha256 of a ``.dist-info``'s ELF files (relpath + content), None when it lists none."""
    return checker().native_digest(str(dist_info))


def _doc(manifest: BaseManifest) -> dict:
    return {
        key: {"name": d.name, "version": d.version, "native_sha256": d.facts.native_sha256}
        for key, d in manifest.distributions.items()
    }


def compare(expected: BaseManifest, observed: BaseManifest) -> list[str]:
    """Pure: each difference between a manifest and a snapshot of the image it describes
    (distribution missing, extra, at another version, native files differing where the
    manifest records a digest; the Python version), one line each."""
    want = {k: {kk: vv for kk, vv in v.items() if vv is not None} for k, v in _doc(expected).items()}
    out = []
    if expected.python_version != observed.python_version:
        out.append(f"Python: the manifest has {expected.python_version}, the image has {observed.python_version}")
    return out + checker().compare(want, _doc(observed))


def consistency_tool(manifest_or_names) -> str:
    """``pip`` when the base has pip, else ``uv`` when it has uv, else ``pip`` (the checks stage then
    fails naming it): the tool that checks the environment's consistency, here and in the image."""
    names = manifest_or_names.distributions if isinstance(manifest_or_names, BaseManifest) else manifest_or_names
    return "uv" if "pip" not in names and "uv" in names else "pip"
