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
  from (:func:`wanted`), read from the archive without unpacking it.
* :func:`load_local_sdist` (``--sdist PATH``) and :func:`load_source` (``--source DIR``, through
  :mod:`builder.resolve.checkout`) — the same from a file or a git checkout the user gives.

Every sdist, the index's or the user's, is read under one set of rules: each member's path inside the
archive's folder (:func:`_member_rel`), each file read a regular file within :data:`MAX_BUILD_FILE`
(:func:`_member_text`); a file a RUN line names later (a script) comes through :func:`tar_reader` under
the same rules, its path confined by :func:`builder.resolve.checkout.context_path`.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from builder.errors import BadInput, IntegrityError
from builder.fetch import cached_path, fetch, verified
from builder.resolve import index as ix
from builder.resolve.checkout import CommitTree, context_path, source_version
from builder.resolve.recipe import DOCKERFILE, PIPELINE, BuildFiles, SdistRef
from builder.resolve.recipe.interpret import OVERSIZE
from builder.validate import version_string


def wanted(rel: str) -> bool:
    """Whether a path inside the sdist is one a recipe reads (pure): the Dockerfile, the release pipeline,
    the requirements, and the shell scripts a RUN line or a pipeline step may run (the publish scripts under
    .buildkite/ among them; read only where one does)."""
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
    """The recipe's files of the index's sdist at ``path`` (text by path, the archive's top folder stripped),
    under the same rules as a local sdist (:func:`read_tar`); other files of it through ``reader``."""
    label = ref.filename
    got = read_tar(path, label)
    return BuildFiles(vllm=vllm, sdist=ref, files=got.files, reader=tar_reader(path, label, got))


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


def _member_rel(m: tarfile.TarInfo, label: str) -> tuple[str, str]:
    """(the member's top folder, its path below it); BadInput when the member's path is absolute or holds
    ``..`` (the one rule every sdist member meets, read or not)."""
    parts = m.name.split("/")
    if m.name.startswith("/") or ".." in parts:
        raise BadInput(
            f"{label}: the member {m.name[:200]!r} points outside the archive's folder; the file is refused."
        )
    return parts[0], "/".join(p for p in parts[1:] if p not in ("", "."))


def _member_text(tf: tarfile.TarFile, m: tarfile.TarInfo, label: str) -> str:
    """The text of a member a recipe reads: a file of the archive (a link is refused) within
    :data:`MAX_BUILD_FILE`, refused from its header before it is read."""
    if m.issym() or m.islnk():
        raise BadInput(f"{label}: {m.name[:200]!r} is a link; the build files must be files of the archive.")
    if not m.isfile():
        raise BadInput(f"{label}: {m.name[:200]!r} is not a file of the archive.")
    if m.size > MAX_BUILD_FILE:
        raise BadInput(
            f"{label}: {m.name[:200]!r} is {m.size} bytes, more than a build file holds "
            f"({MAX_BUILD_FILE} at most); the file is refused."
        )
    fh = tf.extractfile(m)
    return fh.read(MAX_BUILD_FILE + 1).decode("utf-8", errors="replace") if fh else ""


def _tar_error(label: str, exc: BaseException) -> BadInput:
    why = str(exc).splitlines()[0].rstrip(":") if str(exc) else type(exc).__name__
    return BadInput(f"{label} cannot be read as a tar archive (gzip, bzip2, xz or plain): {why}.")


@dataclass
class TarRead:
    """What one pass over an sdist gives: the build files a recipe reads by path below the top folder, the
    PKG-INFO text, the top folders and every member's path below its top folder (for :func:`tar_reader`)."""

    files: dict[str, str] = field(default_factory=dict)
    pkg_info: str | None = None
    tops: set[str] = field(default_factory=set)
    names: set[str] = field(default_factory=set)


def read_tar(path: Path, label: str) -> TarRead:
    """One pass over the sdist at ``path``, read in memory, never unpacked (see :class:`TarRead`).  Every
    member is checked by :func:`_member_rel`; the files read by :func:`_member_text`, except a shell script
    over :data:`MAX_BUILD_FILE`, kept as ``OVERSIZE`` and its size (the recipe reader refuses it where a RUN
    line runs it; a script nothing runs does not matter)."""
    out = TarRead()
    try:
        with tarfile.open(path, "r:*") as tf:
            for m in tf:
                top, rel = _member_rel(m, label)
                out.tops.add(top)
                out.names.add(rel)
                if not (wanted(rel) or rel == "PKG-INFO") or not (m.isfile() or m.issym() or m.islnk()):
                    continue
                if rel.endswith(".sh") and m.isfile() and m.size > MAX_BUILD_FILE:
                    out.files[rel] = f"{OVERSIZE}{m.size}"
                    continue
                text = _member_text(tf, m, label)
                if rel == "PKG-INFO":
                    out.pkg_info = text
                else:
                    out.files[rel] = text
    except (OSError, tarfile.TarError, EOFError, ValueError) as exc:
        raise _tar_error(label, exc) from None
    return out


def tar_reader(path: Path, label: str, first: TarRead | None = None):
    """A reader of any other file of the sdist at ``path`` by its path below the top folder (for
    :attr:`BuildFiles.reader`: a Dockerfile a pipeline step names, a file no recipe reads up front): the path
    confined to the archive (:func:`context_path`), the member read by :func:`_member_text`; None when the
    archive has no such file (known from the ``first`` pass's names without reading it again)."""

    def read(rel: str) -> str | None:
        want = context_path(rel, label)
        if first is not None and want not in first.names:
            return None
        try:
            with tarfile.open(path, "r:*") as tf:
                for m in tf:
                    if _member_rel(m, label)[1] == want and not m.isdir():
                        return _member_text(tf, m, label)
        except (OSError, tarfile.TarError, EOFError, ValueError) as exc:
            raise _tar_error(label, exc) from None
        return None

    return read


def load_local_sdist(path: Path, vllm: str | None = None) -> BuildFiles:
    """The build files of a vLLM sdist the user gives (``--sdist PATH``: a nightly, a fork): read from the
    archive in memory, never unpacked.  Refused (BadInput naming the file and member): not a readable
    tar, no ``PKG-INFO`` naming vllm, no docker/Dockerfile, a member path that is absolute or holds
    ``..``, a link among the files read, a build file over :data:`MAX_BUILD_FILE`.  The provenance
    carries the file's own sha256."""
    path = Path(path)
    label = f"--sdist {path}"
    if not path.is_file():
        raise BadInput(f"{label}: no such file.")
    ref = SdistRef(path.name, _sha256_of(path))
    got = read_tar(path, label)
    files = got.files
    if len(got.tops) != 1 or got.pkg_info is None:
        raise BadInput(f"--sdist {path} is not an sdist (one top folder with a PKG-INFO).")
    name, version = _pkg_version(got.pkg_info)
    if (name or "").lower() != "vllm":
        raise BadInput(f"--sdist {path} is the sdist of {name!r}, not of vllm.")
    if DOCKERFILE not in files:
        raise BadInput(f"--sdist {path} has no {DOCKERFILE}: the image recipe cannot be derived from it.")
    return BuildFiles(
        vllm=_checked_version(vllm, version, label), sdist=ref, files=files, reader=tar_reader(path, label, got)
    )


def load_source(folder: Path, vllm: str | None = None) -> BuildFiles:
    """The build files of a vLLM git checkout (``--source DIR``), read from the tree object of its ``HEAD``
    commit (:class:`builder.resolve.checkout.CommitTree`: every path confined to the tree, git run only
    through :func:`builder.gitcli.git`).  The provenance names the commit, a sha256 over the files read,
    whether the work tree holds them as the commit does, and how the version was decided
    (:func:`builder.resolve.checkout.source_version`: the tag, ``--vllm``, or a development version with
    the tag's wheel standing in)."""
    import hashlib

    folder = Path(folder)
    if not folder.is_dir():
        raise BadInput(f"--source {folder}: no such folder; give the root of a vLLM checkout.")
    tree = CommitTree(folder, MAX_BUILD_FILE)
    if tree.locate(DOCKERFILE) is None:
        raise BadInput(
            f"--source {folder}: the commit {tree.commit[:12]} has no {DOCKERFILE}; give the root of a vLLM checkout."
        )
    rels = [DOCKERFILE, *([PIPELINE] if tree.locate(PIPELINE) is not None else [])]
    rels += [rel for rel in tree.files_under("requirements") if wanted(rel)]
    oversize: dict[str, str] = {}
    for rel, size in tree.files_under("").items():  # the shell scripts a RUN line or a pipeline step may run
        if rel.endswith(".sh") and wanted(rel):
            if size > MAX_BUILD_FILE:
                oversize[rel] = f"{OVERSIZE}{size}"  # refused where a RUN line runs it
            else:
                rels.append(rel)
    files = {**tree.read_many(rels), **oversize}
    ver = source_version(vllm, tree.described(), tree.commit, f"--source {folder}")
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + files[rel].encode() + b"\0")
    differs = tree.worktree_differs(sorted(files))
    detail = (
        ("commit", tree.commit),
        (
            "work_tree",
            "holds the files read as the commit does"
            if not differs
            else "differs from the commit in " + ", ".join(differs) + " (the commit's files were read)",
        ),
        ("version", ver.how),
    )
    return BuildFiles(
        vllm=ver.version,
        sdist=SdistRef(f"{folder.name}@{tree.commit}", h.hexdigest(), detail),
        files=files,
        wheel=ver.wheel if ver.wheel != ver.version else "",
        reader=lambda rel: tree.read(rel) if tree.locate(rel) is not None else None,
    )


def load(vllm: str, *, sha256: str | None = None, index=None) -> BuildFiles:
    """:func:`sdist_file` + :func:`read_build_files`."""
    path, ref = sdist_file(vllm, sha256=sha256, index=index)
    return read_build_files(path, vllm, ref)
