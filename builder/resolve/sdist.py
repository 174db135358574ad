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
from builder.fetch import cached_path, fetch, verified
from builder.resolve import index as ix
from builder.resolve.recipe import DOCKERFILE, PIPELINE, BuildFiles, SdistRef
from builder.resolve.recipe.interpret import OVERSIZE
from builder.validate import version_string


def wanted(rel: str) -> bool:
    """Whether a path inside the sdist is one a recipe reads (pure): the Dockerfile, the release pipeline,
    the requirements, and the shell scripts a RUN line may run (read only where one does)."""
    return (
        rel in (DOCKERFILE, PIPELINE)
        or (rel.startswith("requirements/") and rel.endswith((".txt", ".in")))
        or rel.endswith(".sh")
    )


def sdist_name(vllm: str) -> str:
    return f"vllm-{vllm}.tar.gz"


def _cached(sha256: str, name: str) -> Path | None:
    p = cached_path(sha256, name)
    return p if verified(p, sha256) else None


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
        raise BadInput(
            f"vllm {vllm} has no sdist ({name}) on the index; its recipe cannot be derived.",
            hint="the recipe is read from the release's docker/Dockerfile, release pipeline and "
            "requirements, which ship only in the sdist.",
        )
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
                if wanted(rel) and rel.endswith(".sh") and m.size > MAX_BUILD_FILE:
                    files[rel] = f"{OVERSIZE}{m.size}"  # refused where a RUN line runs it
                elif wanted(rel):
                    fh = tf.extractfile(m)
                    if fh is not None:
                        files[rel] = fh.read().decode("utf-8", errors="replace")
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise BadInput(f"{ref.filename} cannot be read as a gzip tar: {exc}.") from None
    return BuildFiles(vllm=vllm, sdist=ref, files=files)


# The largest build file read from a local sdist or checkout (a Dockerfile or requirements file is kilobytes).
MAX_BUILD_FILE = 4 << 20


def _sha256_of(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _pkg_version(pkg_info: str) -> tuple[str | None, str | None]:
    from email.parser import HeaderParser

    msg = HeaderParser().parsestr(pkg_info)
    return msg.get("Name"), msg.get("Version")


def _checked_version(vllm: str | None, found: str | None, what: str) -> str:
    if vllm is None:
        if not found:
            raise BadInput(f"{what} says no vLLM version; pass --vllm X.")
        return version_string(found, where=what)
    version_string(vllm)
    if found and found != vllm:
        raise BadInput(f"{what} is vllm {found}, not {vllm} (--vllm).")
    return vllm


def load_local_sdist(path: Path, vllm: str | None = None) -> BuildFiles:
    """The build files of a vLLM sdist the user gives (``--sdist PATH``: a nightly, a fork): read from the
    archive in memory, never unpacked.  Refused (BadInput naming the file and member): not a readable
    tar, no ``PKG-INFO`` naming vllm, no docker/Dockerfile, a member path that is absolute or holds
    ``..``, a link among the files read, a build file over :data:`MAX_BUILD_FILE`.  The provenance
    carries the file's own sha256."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"--sdist {path}: no such file.")
    ref = SdistRef(path.name, _sha256_of(path))
    files: dict[str, str] = {}
    pkg_info = None
    tops: set[str] = set()
    try:
        with tarfile.open(path, "r:*") as tf:
            for m in tf:
                parts = m.name.split("/")
                if m.name.startswith("/") or ".." in parts:
                    raise BadInput(
                        f"--sdist {path}: the member {m.name[:200]!r} points outside the archive's "
                        "folder; the file is refused."
                    )
                tops.add(parts[0])
                rel = "/".join(parts[1:])
                if m.issym() or m.islnk():
                    if wanted(rel) or rel == "PKG-INFO":
                        raise BadInput(
                            f"--sdist {path}: {m.name[:200]!r} is a link; the build files must be files of the archive."
                        )
                    continue
                if not m.isfile() or not (wanted(rel) or rel == "PKG-INFO"):
                    continue
                if m.size > MAX_BUILD_FILE:
                    raise BadInput(
                        f"--sdist {path}: {m.name[:200]!r} is {m.size} bytes, more than a build file "
                        f"holds ({MAX_BUILD_FILE} at most); the file is refused."
                    )
                fh = tf.extractfile(m)
                text = fh.read(MAX_BUILD_FILE + 1).decode("utf-8", errors="replace") if fh else ""
                if rel == "PKG-INFO":
                    pkg_info = text
                else:
                    files[rel] = text
    except (OSError, tarfile.TarError, EOFError, ValueError) as exc:
        why = str(exc).splitlines()[0].rstrip(":") if str(exc) else type(exc).__name__
        raise BadInput(f"--sdist {path} cannot be read as a tar archive (gzip, bzip2, xz or plain): {why}.") from None
    if len(tops) != 1 or pkg_info is None:
        raise BadInput(f"--sdist {path} is not an sdist (one top folder with a PKG-INFO).")
    name, version = _pkg_version(pkg_info)
    if (name or "").lower() != "vllm":
        raise BadInput(f"--sdist {path} is the sdist of {name!r}, not of vllm.")
    if DOCKERFILE not in files:
        raise BadInput(f"--sdist {path} has no {DOCKERFILE}: the image recipe cannot be derived from it.")
    return BuildFiles(vllm=_checked_version(vllm, version, f"--sdist {path}"), sdist=ref, files=files)


def load_source(folder: Path, vllm: str | None = None, git=None) -> BuildFiles:
    """The build files of a vLLM git checkout (``--source DIR``): the files a recipe reads, from the work
    tree; the provenance names the commit (``git rev-parse HEAD``; a tree with changes is refused, so the
    commit says what was read) and a sha256 over the files read.  The version is --vllm, else
    ``git describe --tags`` (``v0.34.0`` → ``0.34.0``)."""
    import hashlib
    import subprocess

    folder = Path(folder)
    if not (folder / DOCKERFILE).is_file():
        raise BadInput(f"--source {folder}: no {DOCKERFILE}; give the root of a vLLM checkout.")

    def run_git(*args: str) -> str:
        try:
            r = (git or subprocess.run)(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BadInput(f"--source {folder}: git cannot read it ({exc}).") from None
        if r.returncode != 0:
            raise BadInput(f"--source {folder}: `git {' '.join(args)}` failed: {r.stderr.strip()[:300]}.")
        return r.stdout.strip()

    commit = run_git("rev-parse", "HEAD")
    if run_git("status", "--porcelain", "--", "docker", "requirements", ".buildkite"):
        raise BadInput(
            f"--source {folder}: the build files have uncommitted changes; commit them so that the "
            "provenance's commit says what was read."
        )
    files: dict[str, str] = {}
    root = folder.resolve()
    for sub in ("docker/Dockerfile", ".buildkite/release-pipeline.yaml"):
        files[sub] = ""
    for p in [folder / DOCKERFILE, folder / PIPELINE, *sorted((folder / "requirements").glob("*"))]:
        rel = p.relative_to(folder).as_posix()
        if not wanted(rel) or not p.exists():
            continue
        if p.is_symlink() and not p.resolve().is_relative_to(root) or not p.is_file():
            raise BadInput(f"--source {folder}: {rel} is not a file of the checkout.")
        if p.stat().st_size > MAX_BUILD_FILE:
            raise BadInput(f"--source {folder}: {rel} is larger than a build file ({MAX_BUILD_FILE} bytes at most).")
        files[rel] = p.read_text(encoding="utf-8", errors="replace")
    files = {k: v for k, v in files.items() if v or k.startswith("requirements/")}
    files.update(_source_scripts(folder))
    found = None
    if vllm is None:
        tag = run_git("describe", "--tags", "--abbrev=0")
        found = tag[1:] if tag.startswith("v") else tag
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + files[rel].encode() + b"\0")
    version = _checked_version(vllm, found, f"--source {folder}")
    return BuildFiles(vllm=version, sdist=SdistRef(f"{folder.name}@{commit}", h.hexdigest()), files=files)


#: the folders of a checkout whose shell scripts a RUN line may run (the release Dockerfiles COPY them from here)
SCRIPT_FOLDERS = ("tools", "docker", ".buildkite")


def _source_scripts(folder: Path) -> dict[str, str]:
    """The ``*.sh`` files under :data:`SCRIPT_FOLDERS` of a checkout, by path: only regular files whose real
    path stays inside the checkout (a link out, or through a linked folder, is left out: a RUN line that runs
    it is then refused); one over :data:`MAX_BUILD_FILE` is recorded by its size (refused where run)."""
    import os

    root = folder.resolve()
    out: dict[str, str] = {}
    for sub in SCRIPT_FOLDERS:
        top = folder / sub
        if top.is_symlink() or not top.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(top):  # never follows a linked folder
            for name in sorted(filenames):
                p = Path(dirpath) / name
                if not name.endswith(".sh") or p.is_symlink() or not p.is_file():
                    continue
                if not p.resolve().is_relative_to(root):
                    continue
                rel = p.relative_to(folder).as_posix()
                size = p.stat().st_size
                out[rel] = f"{OVERSIZE}{size}" if size > MAX_BUILD_FILE else p.read_text("utf-8", errors="replace")
    return out


def load(vllm: str, *, sha256: str | None = None, index=None) -> BuildFiles:
    """:func:`sdist_file` + :func:`read_build_files`."""
    path, ref = sdist_file(vllm, sha256=sha256, index=index)
    return read_build_files(path, vllm, ref)
