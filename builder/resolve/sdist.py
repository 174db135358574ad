"""A release's sdist (``vllm-X.tar.gz``): downloaded once, sha256-verified, read for its build files.

Adapter module (index + download cache + disk).  Public interface:

* :func:`sdist_file` ``(vllm, *, sha256=None, index=None) -> (Path, SdistRef)`` — the verified
  local copy of the release's sdist.  With a known ``sha256`` (the one ``recipes.toml`` records)
  and a verified copy in the download cache no index is asked; otherwise the index's listing
  (PEP 691, :mod:`builder.resolve.index`) gives the file's URL and sha256 and
  :func:`builder.fetch.fetch` downloads it into the same cache as the wheels.  A release
  with no sdist on the index is :class:`BadInput`; an index hash that differs from the
  recorded one is :class:`IntegrityError`.
* :func:`read_build_files` ``(path, vllm, ref) -> BuildFiles`` — the files a recipe is derived
  from (:data:`WANTED`), read from the archive without unpacking it.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from builder.errors import BadInput, IntegrityError
from builder.fetch import _verified, cached_path, fetch
from builder.resolve import index as ix
from builder.resolve.recipe import DOCKERFILE, PIPELINE, BuildFiles, SdistRef


def wanted(rel: str) -> bool:
    """Whether a path inside the sdist is one a recipe reads (pure)."""
    return rel in (DOCKERFILE, PIPELINE) or (rel.startswith("requirements/") and rel.endswith((".txt", ".in")))


def sdist_name(vllm: str) -> str:
    return f"vllm-{vllm}.tar.gz"


def _cached(sha256: str, name: str) -> Path | None:
    p = cached_path(sha256, name)
    return p if _verified(p, sha256) else None


def sdist_file(vllm: str, *, sha256: str | None = None, index=None) -> tuple[Path, SdistRef]:
    """The verified sdist of vllm ``vllm`` (see the module doc)."""
    name = sdist_name(vllm)
    if sha256:
        hit = _cached(sha256, name)
        if hit is not None:
            return hit, SdistRef(name, sha256)
    if index is None:
        index = ix.for_request([], False)
    files = [f for f in index.files("vllm") if f.filename == name]
    if not files:
        raise BadInput(f"vllm {vllm} has no sdist ({name}) on the index; its recipe cannot be derived.",
                       hint="the recipe is read from the release's docker/Dockerfile, release pipeline and "
                            "requirements, which ship only in the sdist.")
    f = files[0]
    if sha256 and f.sha256 != sha256:
        raise IntegrityError(f"the index lists {name} with sha256 {f.sha256}, but the recipe records {sha256}.")
    path = fetch(f.url, f.sha256, filename=name)
    return path, SdistRef(name, f.sha256)


def read_build_files(path: Path, vllm: str, ref: SdistRef) -> BuildFiles:
    """The recipe's files of the sdist at ``path`` (text by path, the archive's top folder stripped)."""
    files: dict[str, str] = {}
    try:
        with tarfile.open(path, "r:gz") as tf:
            for m in tf:
                if not m.isfile():
                    continue
                rel = m.name.split("/", 1)[1] if "/" in m.name else m.name
                if wanted(rel):
                    fh = tf.extractfile(m)
                    if fh is not None:
                        files[rel] = fh.read().decode("utf-8", errors="replace")
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise BadInput(f"{ref.filename} cannot be read as a gzip tar: {exc}.") from None
    return BuildFiles(vllm=vllm, sdist=ref, files=files)


def load(vllm: str, *, sha256: str | None = None, index=None) -> BuildFiles:
    """:func:`sdist_file` + :func:`read_build_files`."""
    path, ref = sdist_file(vllm, sha256=sha256, index=index)
    return read_build_files(path, vllm, ref)
