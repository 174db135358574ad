"""A vLLM git checkout (``--source DIR``) read for its build files (adapter: git through
:func:`builder.gitcli.git`, the work tree only to say whether it matches).

* The files come from the commit's tree object (``git ls-tree`` / ``git cat-file`` on ``HEAD``), never
  from the work tree: the provenance names the commit the files really came from.  Whether the work
  tree's copies of the files read differ from the commit is said beside it (never by ``git status``,
  which runs the repository's fsmonitor and filters: the blob ids are compared here).
* Every path is confined to the tree (:meth:`CommitTree.locate`): an absolute path or one whose ``..``
  leaves the tree is refused, a symbolic link is followed only while its target stays inside the tree
  (a link leaving it — a committed ``docker -> /etc`` — is refused naming it), a submodule is refused,
  and a file over the size bound is refused from the tree's listing, before it is read.
* The version (:func:`source_version`): the tag ``git describe --tags`` finds; a commit past it gets a
  development version as setuptools-scm writes it (``0.34.1.dev5+g0123abcd9``), and the tag's published
  wheel stands in for the commit's own.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from builder.errors import BadInput
from builder.gitcli import git

# Symbolic links followed while locating one path (git's own bound on nested links is 40).
MAX_LINK_HOPS = 40
# The longest symbolic-link target read from a tree.
MAX_LINK_TARGET = 4096
# The characters of the commit a development version's local part carries (vLLM's nightly wheels: 9).
NODE_CHARS = 9


@dataclass(frozen=True)
class Entry:
    """One entry of the commit's tree: mode (``100644``, ``120000`` link, ``160000`` submodule), object id and
    size (-1 for a tree or submodule)."""

    mode: str
    kind: str
    oid: str
    size: int


def context_path(rel: str, label: str) -> str:
    """``rel`` as a normalized path inside the build context (pure); BadInput naming it when it is empty,
    absolute, holds a NUL or leaves the context through ``..``."""
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise BadInput(f"{label}: {rel!r:.200} is not a path inside the build context.")
    norm = posixpath.normpath(rel)
    if rel.startswith("/") or norm.startswith("/") or norm in ("..", ".") or norm.startswith("../"):
        raise BadInput(f"{label}: the path {rel!r:.200} leaves the build context; nothing outside it is read.")
    return norm


def parse_ls_tree(out: bytes) -> dict[str, Entry]:
    """``git ls-tree -r -t -l -z`` output → path → :class:`Entry` (pure)."""
    entries: dict[str, Entry] = {}
    for rec in out.split(b"\0"):
        if not rec:
            continue
        meta, _, path = rec.partition(b"\t")
        mode, kind, oid, size = meta.decode("ascii").split(maxsplit=3)
        entries[path.decode("utf-8", errors="surrogateescape")] = Entry(
            mode, kind, oid, int(size) if size.strip().isdigit() else -1
        )
    return entries


def blob_id(data: bytes, oid_len: int) -> str:
    """The git object id of a blob holding ``data`` (pure; sha1, or sha256 for 64-digit ids)."""
    h = hashlib.sha256() if oid_len == 64 else hashlib.sha1()  # noqa: S324 - git's object name, not a security hash
    h.update(b"blob %d\0" % len(data) + data)
    return h.hexdigest()


class CommitTree:
    """The files of ``HEAD`` of the checkout at ``folder``, read from the commit's tree object."""

    def __init__(self, folder: Path, max_file: int):
        self.folder = Path(folder)
        self.max_file = max_file
        self.label = f"--source {self.folder}"
        dot_git = self.folder / ".git"
        if not (dot_git.is_dir() or dot_git.is_file()):  # a folder, or a worktree's `gitdir:` file
            raise BadInput(f"{self.label}: not a git checkout (no .git); give the root of a vLLM checkout.")
        self.git_dir = self.folder / ".git"
        self.commit = self._git("rev-parse", "--verify", "--end-of-options", "HEAD^{commit}").decode().strip()
        if not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", self.commit):
            raise BadInput(f"{self.label}: HEAD does not name a commit.")
        tree = self._git("rev-parse", "--verify", "--end-of-options", self.commit + "^{tree}").decode().strip()
        self.root = Entry("040000", "tree", tree, -1)
        self._trees: dict[str, dict[str, Entry]] = {}

    def _listing(self, tree: str) -> dict[str, Entry]:
        """One tree's entries by name (listed once, on demand: only the folders on the way of a path read)."""
        if tree not in self._trees:
            self._trees[tree] = parse_ls_tree(self._git("ls-tree", "-l", "-z", tree))
        return self._trees[tree]

    def _git(self, *args: str) -> bytes:
        r = git(args, git_dir=self.git_dir)
        if r.returncode != 0:
            msg = (r.stderr.decode("utf-8", errors="replace").strip().splitlines() or [f"exit {r.returncode}"])[-1]
            raise BadInput(f"{self.label}: git cannot read the checkout (`git {args[0]}`: {msg[:300]}).")
        return r.stdout

    def _blob(self, oid: str, size: int, what: str) -> bytes:
        if size > self.max_file:
            raise BadInput(
                f"{self.label}: {what} is {size} bytes, more than a build file holds ({self.max_file} at most); "
                "it is not read."
            )
        data = self._git("cat-file", "blob", oid)
        return data[: self.max_file + 1]

    def locate(self, rel: str, label: str | None = None) -> tuple[str, Entry] | None:
        """(the path inside the tree ``rel`` names once links are followed, its entry), or None when the commit
        has no such path; BadInput naming ``rel`` when it or a link on its way leaves the tree, or crosses a
        submodule."""
        label = label or self.label
        parts = context_path(rel, label).split("/")
        hops, i, cur = 0, 0, self.root
        while i < len(parts):
            here = "/".join(parts[: i + 1])
            e = self._listing(cur.oid).get(parts[i]) if cur.kind == "tree" else None
            if e is None:
                return None
            if e.mode == "160000":
                raise BadInput(f"{label}: {rel} lies in the submodule {here}; its files are not in this commit.")
            if e.mode != "120000":
                cur, i = e, i + 1
                continue
            hops += 1
            if hops > MAX_LINK_HOPS:
                raise BadInput(f"{label}: {rel}: more than {MAX_LINK_HOPS} symbolic links on its way.")
            parts = self._link_target(here, e, rel, label) + parts[i + 1 :]
            i, cur = 0, self.root
        return "/".join(parts), cur

    def _link_target(self, here: str, e: Entry, rel: str, label: str) -> list[str]:
        """The parts of the path the link ``here`` names, from the tree's root; BadInput when it leaves the tree."""
        if e.size > MAX_LINK_TARGET:
            raise BadInput(f"{label}: {rel}: the symbolic link {here} names a target of {e.size} bytes.")
        target = self._blob(e.oid, e.size, f"the link {here}").decode("utf-8", errors="replace")
        norm = posixpath.normpath(posixpath.join(posixpath.dirname(here), target))
        if target.startswith("/") or norm == ".." or norm.startswith(("../", "/")) or "\0" in target:
            raise BadInput(
                f"{label}: {here} is a symbolic link to {target[:200]!r}, outside the checkout; "
                f"{rel} is not read (only files of the commit's tree are)."
            )
        return [p for p in norm.split("/") if p not in ("", ".")]

    def _file_entry(self, rel: str) -> Entry:
        found = self.locate(rel)
        if found is None:
            raise BadInput(f"{self.label}: the commit {self.commit[:12]} has no {rel}.")
        e = found[1]
        if e.kind != "blob" or e.mode not in ("100644", "100755"):
            raise BadInput(f"{self.label}: {rel} is not a file of the commit's tree.")
        if e.size > self.max_file:
            raise BadInput(
                f"{self.label}: {rel} is {e.size} bytes, more than a build file holds ({self.max_file} at most); "
                "it is not read."
            )
        return e

    def read(self, rel: str) -> str:
        """The text of ``rel`` as the commit holds it (BadInput: not a file of the tree, over the bound)."""
        e = self._file_entry(rel)
        return self._blob(e.oid, e.size, rel).decode("utf-8", errors="replace")

    def read_many(self, rels: list[str]) -> dict[str, str]:
        """:meth:`read` of each of ``rels``, the blobs brought by one ``git cat-file --batch``."""
        entries = {rel: self._file_entry(rel) for rel in rels}
        if not entries:
            return {}
        oids = sorted({e.oid for e in entries.values()})
        out = git(("cat-file", "--batch"), git_dir=self.git_dir, stdin="".join(o + "\n" for o in oids).encode())
        if out.returncode != 0:
            raise BadInput(f"{self.label}: git cannot read the checkout's files (`git cat-file`).")
        blobs, pos = {}, 0
        for oid in oids:  # "<oid> blob <size>\n<content>\n", in the order asked
            head_end = out.stdout.index(b"\n", pos)
            got, kind, size = out.stdout[pos:head_end].decode("ascii").split()
            if got != oid or kind != "blob":
                raise BadInput(f"{self.label}: git answered {got} {kind} for the blob {oid}.")
            blobs[oid] = out.stdout[head_end + 1 : head_end + 1 + int(size)]
            pos = head_end + 1 + int(size) + 1
        return {rel: blobs[e.oid].decode("utf-8", errors="replace") for rel, e in entries.items()}

    def files_under(self, folder: str) -> dict[str, int]:
        """The files and links below ``folder`` of the commit's tree (``""``: all of it), named as under
        ``folder`` (links on its way followed), with their sizes."""
        found = self.locate(folder) if folder else ("", self.root)
        if found is None or found[1].kind != "tree":
            return {}
        below = parse_ls_tree(self._git("ls-tree", "-r", "-l", "-z", found[1].oid))
        return {(f"{folder}/{p}" if folder else p): e.size for p, e in sorted(below.items()) if e.kind == "blob"}

    def worktree_differs(self, rels: list[str]) -> list[str]:
        """Which of ``rels`` the work tree does not hold as the commit does (a missing file, a link on the
        way, another content): each read without following a link, within the size bound."""
        differs = []
        for rel in rels:
            found = self.locate(rel)
            if found is None or not self._same_in_worktree(*found):
                differs.append(rel)
        return differs

    def _same_in_worktree(self, path: str, e: Entry) -> bool:
        p = self.folder
        for part in path.split("/"):
            p = p / part
            try:
                st = p.lstat()
            except OSError:
                return False
            if stat.S_ISLNK(st.st_mode):
                return False
        if not stat.S_ISREG(st.st_mode) or st.st_size > self.max_file:
            return False
        try:
            data = p.read_bytes()
        except OSError:
            return False
        return blob_id(data, len(e.oid)) == e.oid

    def described(self) -> tuple[str, int] | None:
        """(the nearest tag with a digit in its name, commits since it), or None when no tag describes it."""
        r = git(
            ("describe", "--tags", "--long", "--abbrev=40", "--match", "*[0-9]*", self.commit),
            git_dir=self.git_dir,
        )
        if r.returncode != 0:
            return None
        m = re.fullmatch(r"(.+)-(\d+)-g[0-9a-f]+", r.stdout.decode("utf-8", errors="replace").strip())
        return (m.group(1), int(m.group(2))) if m else None


# ----------------------------------------------------------------------------- the checkout's version
def tag_version(tag: str) -> Version | None:
    """The release a tag names (``v0.34.0`` → 0.34.0), or None when it names none (pure)."""
    try:
        return Version(tag[1:] if tag[:1] in ("v", "V") else tag)
    except InvalidVersion:
        return None


def dev_version(tag: Version, distance: int, commit: str) -> str:
    """The development version setuptools-scm gives a commit ``distance`` commits past the tag ``tag``
    (its default ``guess-next-dev`` scheme, as vLLM's nightly wheels carry it): the tag's last number bumped
    (``0.34.0`` → ``0.34.1``, ``0.11.1rc1`` → ``0.11.1rc2``, a ``.dev0`` tag → its release), then
    ``.devN+g`` and the commit's first :data:`NODE_CHARS` hex digits (pure; ValueError for a tag it
    cannot continue)."""
    text = str(tag).split("+", 1)[0]
    if tag.is_devrelease:
        head, _, n = text.rpartition(".dev")
        if n != "0":
            raise ValueError(f"a tag that is a development release ({tag}) cannot be continued")
        guessed = head
    else:
        m = re.fullmatch(r"(.*?)(\d+)", text)
        if m is None:
            raise ValueError(f"the tag {tag} ends in no number")
        guessed = f"{m.group(1)}{int(m.group(2)) + 1}"
    return str(Version(f"{guessed}.dev{distance}+g{commit[:NODE_CHARS]}"))


@dataclass(frozen=True)
class SourceVersion:
    """The version of the checkout's files, the published release whose wheel stands in for the commit's
    own, and how each was decided (for the provenance)."""

    version: str
    wheel: str
    how: str


def source_version(vllm: str | None, described: tuple[str, int] | None, commit: str, label: str) -> SourceVersion:
    """The checkout's version from its tag and ``--vllm`` (pure; BadInput naming both where they disagree):

    * no tag: ``--vllm`` is the version (and its wheel stands in); without it, BadInput saying to pass it;
    * at the tag: the tag's version; ``--vllm`` must be the same release;
    * N commits past the tag: the development version (:func:`dev_version`), or ``--vllm`` when it names
      that version or a release after the tag (the release the commit is to become); the tag's published
      wheel stands in for the commit's."""
    given = _given(vllm, label)
    if described is None:
        if vllm is None:
            raise BadInput(
                f"{label}: no version tag (like v0.34.0) is reachable from commit {commit[:12]}, so its vLLM "
                "version is unknown; pass --vllm X (the release these build files are for).",
                hint="a shallow clone or one without tags: `git fetch --tags` brings them.",
            )
        return SourceVersion(vllm, vllm, f"--vllm {vllm} (no tag reachable from the commit)")
    tag, distance = described
    tv = tag_version(tag)
    if tv is None:
        raise BadInput(f"{label}: the nearest tag {tag[:100]!r} names no version; pass --vllm X.")
    if distance == 0:
        if given is not None and given != tv:
            raise BadInput(f"{label}: --vllm {vllm} disagrees with the checkout's tag {tag} (vllm {tv}).")
        return SourceVersion(vllm or str(tv), vllm or str(tv), f"the tag {tag} at the commit")
    try:
        dev = dev_version(tv, distance, commit)
    except (ValueError, InvalidVersion) as exc:
        if given is None:
            raise BadInput(f"{label}: {exc}; pass --vllm X.") from None
        dev = None
    past = f"{distance} commit{'s' if distance != 1 else ''} past the tag {tag}"
    stand_in = f"; the published vllm {tv} wheel (the tag's) stands in for the commit's own"
    if given is None:
        return SourceVersion(dev, str(tv), f"{past} (setuptools-scm's development version){stand_in}")
    if (dev is None or given != Version(dev)) and not given > tv:
        raise BadInput(
            f"{label}: --vllm {vllm} disagrees with the checkout: its commit is {past}"
            + (f" (version {dev})" if dev else "")
            + f"; name a release after {tv}, or leave --vllm out."
        )
    return SourceVersion(vllm, str(tv), f"--vllm {vllm}, {past}{stand_in}")


def _given(vllm: str | None, label: str) -> Version | None:
    if vllm is None:
        return None
    try:
        return Version(vllm)
    except InvalidVersion:
        raise BadInput(f"--vllm {vllm!r:.60} is not a version (like 0.34.0); name a vLLM release.") from None
