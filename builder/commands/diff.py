"""``build-image diff``: review a lock change in ten seconds; a CI gate.

    build-image diff OLD NEW                      two lock files
    build-image diff --git BASE[..HEAD] [PATH...] locks across git revisions
    build-image diff --textconv FILE              a lock as a stable summary (git textconv)

Exit 0: no dangerous change; 1: a change the ABI gate would reject (group 1;
allowed ones only with --fail-on-allowed); 2: bad input.

Imports stay lazy (rich, packaging, builder.resolve.abi are loaded only when used): the
command runs as a git textconv and in CI on every PR.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from builder.data import path as data_path
from builder.errors import BadInput, VerdictFailure
from builder.util import sha256_bytes
from builder.validate import read_bounded, read_bounded_text

# What a command runs (its stage, the engine adapter, downloads, reports) is imported inside the command
# function, not here: `build-image --help` imports every command module to list it, and a stage
# (with its dependencies) loads only when its command runs.

FORMATS = ("text", "markdown", "json")


# ------------------------------------------------------------- git adapter


class Git:
    """The repository's revisions, read through :func:`builder.gitcli.git` (read-only plumbing, none of the
    repository's configured programs)."""

    def __init__(self, cwd: str | Path = "."):
        self.cwd = Path(cwd)
        self.root = Path(self._run("rev-parse", "--show-toplevel", what="find the repository").decode().strip())

    def _run(self, *args: str, what: str, ok_codes=(0,)) -> bytes:
        from builder.gitcli import git

        p = git(args, cwd=getattr(self, "root", self.cwd))
        if p.returncode not in ok_codes:
            err = p.stderr.decode(errors="replace").strip().splitlines()
            msg = err[-1] if err else f"exit {p.returncode}"
            if "not a git repository" in msg:
                raise BadInput(f"`diff --git` must run inside a git repository ({self.cwd.resolve()} is not one).")
            if "dubious ownership" in " ".join(err):
                raise BadInput(
                    f"`diff --git`: the repository at {self.cwd.resolve()} belongs to another user; git reads it "
                    "only for its owner (build-image runs git without the user's configuration, so a "
                    "safe.directory entry does not apply): run as its owner."
                )
            raise BadInput(f"git could not {what}: {msg}")
        return p.stdout

    def commit(self, rev: str) -> str:
        out = self._run(
            "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", what=f"resolve {rev!r}", ok_codes=(0, 1)
        )
        if not out.strip():
            raise BadInput(
                f"`diff --git`: {rev!r} is not a revision of this repository.",
                hint="fetch it first (e.g. `git fetch origin main`) or check the spelling.",
            )
        return out.decode().strip()

    def merge_base(self, a: str, b: str) -> str:
        return self._run("merge-base", a, b, what=f"find the merge base of {a} and {b}").decode().strip()

    def changed(self, a: str, b: str, paths: list[str]) -> list[str]:
        out = self._run("diff", "--name-only", "--no-renames", "-z", a, b, "--", *paths, what="list changed files")
        return [p for p in out.decode().split("\0") if p]

    def show(self, rev: str, path: str) -> bytes | None:
        """The blob ``rev:path`` or None when the path does not exist there."""
        from builder.gitcli import git

        p = git(("cat-file", "blob", f"{rev}:{path}"), cwd=self.root)
        return p.stdout if p.returncode == 0 else None

    def rel(self, path: str) -> str:
        """``path`` (relative to the cwd) as a repository-relative POSIX path."""
        import os

        absolute = (self.cwd / path).resolve()
        rel = os.path.relpath(absolute, self.root.resolve())
        if rel.startswith(".."):
            raise BadInput(f"`diff --git`: {path} is outside the repository {self.root}.")
        return Path(rel).as_posix()


def split_revs(spec: str) -> tuple[str, str, bool]:
    """``A..B`` -> (A, B, False); ``A...B`` -> (A, B, True: use the merge base);
    ``A`` -> (A, HEAD, False)."""
    if "..." in spec:
        a, b = spec.split("...", 1)
        return a or "HEAD", b or "HEAD", True
    if ".." in spec:
        a, b = spec.split("..", 1)
        return a or "HEAD", b or "HEAD", False
    return spec, "HEAD", False


# ---------------------------------------------------------------- loading


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{where} is not a build-image lock: it is not UTF-8 text (byte {exc.start}).") from None


def parse_checked(text: str, where: str, strict: bool = False):
    """parse_lock, lenient by default: a truncated or hand-edited lock is diffed anyway, its
    findings (each naming the line) in ``problems``, flagged by the diff as dangerous; a file
    that is not a lock is BadInput (exit 2)."""
    from builder.resolve.lockfile import parse_lock

    return parse_lock(text, where, strict=strict)


def _manifest_name(vllm: str, lock=None) -> str:
    """The shipped base manifest's file name of the lock's release and platform (its header's ``platform``:
    an aarch64 lock's base is ``vllm-openai-vX-linux-arm64.json``)."""
    from builder import platforms  # why: this module loads for --help; the platform only when a lock is read

    try:
        platform = platforms.from_uv_platform((lock.header.get("platform") if lock is not None else "") or "")
    except BadInput:
        platform = platforms.DEFAULT
    return f"vllm-openai-v{vllm}{platform.file_suffix()}.json"


_PARSED: dict[str, object] = {}


def _manifest_from_text(text: str, where: str, lock, notes: list[str]):
    from builder.resolve.manifest import parse_manifest

    m = _PARSED.get(text)
    if m is None:  # both sides usually share one manifest: parse it once
        m = _PARSED[text] = parse_manifest(text, where)
    want = lock.header.get("base-manifest-sha256")
    got = sha256_bytes(text.encode("utf-8"))
    if want and want not in ("-", got):
        notes.append(
            f"base manifest {where} differs from the one the lock was made with "
            f"(base-manifest-sha256 {want[:12]}…, file {got[:12]}…); used anyway."
        )
    return m


def _file_manifest(lock, lock_path: Path, explicit: Path | None, notes: list[str]):
    """The base manifest for a lock read from a file: --base-manifest, else
    lockfiles/base/vllm-openai-v<vllm>.json beside the lock's folder, in the cwd,
    or in the checkout."""
    if explicit is not None:
        text = read_bounded_text(explicit, "base manifest")
        return _manifest_from_text(text, str(explicit), lock, notes), str(explicit)
    vllm = lock.header.get("vllm")
    if not vllm:
        return None, None
    name = _manifest_name(vllm, lock)
    here = lock_path.resolve().parent  # lockfiles/vllm-X/ (or lockfiles/vllm-X/linux-arm64/)
    for cand in (
        here.parent / "base" / name,
        here.parent.parent / "base" / name,
        Path("lockfiles/base") / name,
        data_path("lockfiles/base") / name,
    ):
        if cand.is_file():
            return _manifest_from_text(cand.read_text(encoding="utf-8"), str(cand), lock, notes), str(cand)
    return None, None


def _git_manifest(git: Git, rev: str, label: str, lock, explicit: Path | None, notes: list[str]):
    if explicit is not None:
        return _file_manifest(lock, Path("."), explicit, notes)
    vllm = lock.header.get("vllm")
    if not vllm:
        return None, None
    path = f"lockfiles/base/{_manifest_name(vllm, lock)}"
    blob = git.show(rev, path)
    if blob is None:
        return None, None
    where = f"{label}:{path}"
    return _manifest_from_text(_decode(blob, where), where, lock, notes), where


def _diff_files(old: str, new: str, base_manifest: Path | None, fail_on_allowed: bool):
    from builder.resolve.diff import diff_locks

    sides = []
    for p in (old, new):
        path = Path(p)
        if not path.exists():
            raise BadInput(f"lock {p} does not exist.")
        text = _decode(read_bounded(path, "lock"), p)
        sides.append((text, parse_checked(text, p)))
    notes: list[str] = []
    old_m, _ = _file_manifest(sides[0][1], Path(old), base_manifest, [])
    new_m, new_src = _file_manifest(sides[1][1], Path(new), base_manifest, notes)
    d = diff_locks(
        sides[0][1],
        sides[1][1],
        old_base=old_m,
        new_base=new_m,
        path=new,
        old_label=old,
        new_label=new,
        old_text=sides[0][0],
        new_text=sides[1][0],
        fail_on_allowed=fail_on_allowed,
        base_source={"kind": "manifest", "manifest": new_src} if new_m else None,
    )
    d.notes[:0] = notes
    return [d]


def _diff_git(spec: str, paths: tuple[str, ...], base_manifest: Path | None, fail_on_allowed: bool):
    from builder.resolve.diff import diff_locks

    git = Git(".")
    a, b, use_mb = split_revs(spec)
    ca, cb = git.commit(a), git.commit(b)
    if use_mb:
        ca = git.merge_base(ca, cb)
        a = f"merge-base({a},{b})"
    scope = [git.rel(p) for p in paths] if paths else ["lockfiles"]
    changed = [p for p in git.changed(ca, cb, scope) if p.endswith(".lock")]
    if paths:
        from builder.resolve.lockfile import is_pylock_path

        for p, given in zip(scope, paths):
            if not (p.endswith(".lock") or is_pylock_path(p)) and (
                git.show(ca, p) is not None or git.show(cb, p) is not None
            ):
                raise BadInput(
                    f"`diff --git {spec}`: {given} is a file but not a lock (*.lock, pylock.toml); "
                    "name a lock, or a folder holding locks."
                )
        # An explicit PATH that is a file is always compared (even if unchanged: "no changes").
        for p in scope:
            if (
                (p.endswith(".lock") or is_pylock_path(p))
                and p not in changed
                and (git.show(ca, p) is not None or git.show(cb, p) is not None)
            ):
                changed.append(p)
        if not changed and all(p.endswith(".lock") or is_pylock_path(p) for p in scope):
            raise BadInput(f"`diff --git {spec}`: {', '.join(paths)} exists in neither revision.")
    diffs = []
    for path in sorted(changed):
        sides = []
        for rev, label in ((ca, a), (cb, b)):
            blob = git.show(rev, path)
            if blob is None:
                sides.append((None, None, label))
                continue
            where = f"{label}:{path}"
            text = _decode(blob, where)
            sides.append((text, parse_checked(text, where), label))
        notes: list[str] = []
        old_m = _git_manifest(git, ca, a, sides[0][1], base_manifest, [])[0] if sides[0][1] else None
        new_m, new_src = _git_manifest(git, cb, b, sides[1][1], base_manifest, notes) if sides[1][1] else (None, None)
        d = diff_locks(
            sides[0][1],
            sides[1][1],
            old_base=old_m,
            new_base=new_m,
            path=path,
            old_label=a,
            new_label=b,
            old_text=sides[0][0],
            new_text=sides[1][0],
            fail_on_allowed=fail_on_allowed,
            base_source={"kind": "manifest", "manifest": new_src} if new_m else None,
        )
        d.notes[:0] = notes
        diffs.append(d)
    return diffs


# ---------------------------------------------------------------- output


def render(diffs, fmt: str, color: bool) -> str:
    from builder import report
    from builder.resolve.diff import to_document, to_json_doc

    if fmt == "json":
        return report.render_json(to_json_doc(diffs))
    if not diffs:
        msg = "no lock changed between the revisions"
        return f"{msg}\n" if fmt == "text" else f"✅ build-image lock diff: {msg}.\n"
    docs = [to_document(d) for d in diffs]
    if fmt == "markdown":
        head = []
        if len(docs) > 1:
            bad = sum(1 for d in diffs if d.dangerous)
            head = [f"## build-image lock diff: {len(docs)} locks, {bad} with dangerous changes", ""]
        return "\n".join(head) + "\n".join(report.render_markdown(doc) for doc in docs)
    return "\n".join(report.render_text(doc, color=color) for doc in docs)


@click.command("diff")
@click.argument("paths", nargs=-1, metavar="[OLD NEW | PATH...]")
@click.option(
    "--git",
    "git_revs",
    metavar="BASE[..HEAD]",
    help="Compare locks across git revisions (A..B, A...B for the merge base, A alone = A..HEAD). "
    "PATHs narrow the search (default: every *.lock under lockfiles/).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    help="text (colour on a terminal), markdown (a PR comment) or json (schema build-image/lock-diff/v1).",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option(
    "--textconv",
    "textconv_file",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Print FILE as a stable one-line-per-package summary (for git's diff textconv) and exit.",
)
@click.option(
    "--base-manifest",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Base manifest to judge both locks against (default: lockfiles/base/vllm-openai-v<vllm>.json "
    "of each side, else rebuilt from the lock).",
)
@click.option(
    "--fail-on-allowed", is_flag=True, help="Exit 1 also for group-1 changes the lock header allows (allow-abi-change)."
)
@click.option(
    "--color/--no-color", default=None, help="Force colour on/off (default: on for a terminal, off with NO_COLOR)."
)
@click.option(
    "--max-chars",
    "max_chars",
    type=click.IntRange(min=1024),
    metavar="N",
    help="Markdown: cut the report to at most N characters (UTF-16 units, as GitHub counts; a PR comment "
    "holds 65,536), closing open blocks and ending with a pointer to the full report.",
)
@click.option(
    "--full-report",
    "full_report",
    metavar="TEXT",
    help="With --max-chars: where the full report is (e.g. the workflow run's summary URL).",
)
def command(
    paths,
    git_revs,
    fmt,
    as_json,
    textconv_file,
    base_manifest,
    fail_on_allowed,
    color,
    max_chars=None,
    full_report=None,
):
    """Review a lock change: ABI-aware groups, most dangerous first.

    \b
    build-image diff OLD NEW
    build-image diff --git origin/main..HEAD [PATH...]
    build-image diff --textconv lockfiles/vllm-0.26.0/requirements.lock

    Exit codes: 0 no dangerous change; 1 a change the ABI gate would reject; 2 bad input.
    """
    if as_json:
        fmt = "json"
    if textconv_file:
        if paths or git_revs:
            raise BadInput("`diff --textconv FILE` takes no other paths and no --git.")
        _textconv(textconv_file)
        return
    if git_revs:
        diffs = _diff_git(git_revs, paths, base_manifest, fail_on_allowed)
    else:
        if len(paths) != 2:
            raise BadInput(
                f"`diff` compares two lock files (OLD NEW); got {len(paths)} path(s).",
                hint="or use `build-image diff --git origin/main..HEAD` to compare across git revisions.",
            )
        diffs = _diff_files(paths[0], paths[1], base_manifest, fail_on_allowed)
    from builder import report

    out = render(diffs, fmt, report.use_color(sys.stdout, color) if fmt == "text" else False)
    if max_chars is not None:
        if fmt != "markdown":
            raise BadInput("--max-chars applies to --format markdown (a PR comment); text and json are never cut.")
        from builder.comment_fit import fit

        out = fit(out, max_chars, full_report)
    report.emit_text(out)  # redacted like every result on stdout
    dangerous = [d for d in diffs if d.dangerous]
    if dangerous:
        names = sorted({c.name for d in dangerous for c in d.group(1) if c.allowed is None or fail_on_allowed})
        edited = [d.path or d.new_label for d in dangerous if d.hand_edited]
        why = ([f"the ABI gate would reject {', '.join(names)}"] if names else []) + (
            [f"{', '.join(edited)}: not what `build-image lock` wrote (hand-edited or truncated)"] if edited else []
        )
        raise VerdictFailure(f"dangerous lock change: {'; '.join(why)}.")


def _textconv(path: str) -> None:
    """git calls the textconv with a temp file; a file that is not a valid lock is
    printed as is, under a one-line warning, so `git diff` still shows it."""
    from builder.resolve.diff import textconv

    data = read_bounded(path, "--textconv")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        sys.stdout.buffer.write(data)
        return
    if not text.strip():
        return
    try:
        lock = parse_checked(text, path, strict=True)
    except BadInput as exc:
        sys.stdout.write(f"# build-image: not a valid lock, shown raw ({exc.message})\n{text}")
        return
    sys.stdout.write(textconv(lock))
