"""Versioned patch series for an installed package (vllm): load, check, apply.

A series is a folder ``patches/<package>/<version>/`` holding

* ``series``           — patch file names, one a line, in application order (``#`` comments);
* ``NNNN-name.patch``  — a header (``Subject``, ``Why``, ``Applies-To: vllm==0.26.0``,
  ``Upstream-Status``, ``Risk``; RFC-822 style, continuation lines indented) then a
  unified diff with ``a/`` ``b/`` paths relative to site-packages (``a/vllm/...``);
* ``sha256sums.orig``  — ``sha256sum`` lines for every file the series touches, as
  shipped in the package's wheel (``build-image patch sums`` writes it);
* ``wheel.sha256``     — ``sha256sum`` line of the wheel the series was made against.

Diffs are parsed with ``unidiff`` (PyPI) and applied by this module with no fuzz and
no offset: every hunk must match byte for byte at the line its header states.
Refused (:class:`PatchFailed`): paths outside the package folder, absolute paths,
``..``, renames, created/deleted files, binary or symlink diffs, and symlinks in the
target tree.  Everything here is pure (data in, data out) except the thin readers
of a wheel / a directory and the writers of :func:`apply_to_dir` and
:func:`apply_site_packages`.

Public interface (used by render and the ``patch`` command):
``series_dir_for``, ``load_series``, ``check``, ``apply_to_dir``,
``apply_site_packages``, ``original_sums``, :class:`PatchedFile`, :class:`PatchResult`.
"""

from __future__ import annotations

import os
import re
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from builder.data import path as data_path
from builder.errors import BadInput, PatchFailed
from builder.util import atomic_write_bytes, sha256_bytes
from builder.validate import version_string

HEADER_FIELDS = ("Subject", "Why", "Applies-To", "Upstream-Status", "Risk")
ORIG_SUMS = "sha256sums.orig"
WHEEL_SUM = "wheel.sha256"
SERIES_FILE = "series"

APPLIED = "applied"
ALREADY_APPLIED = "already-applied"
DOES_NOT_APPLY = "does-not-apply"


# =========================================================================== data
@dataclass(frozen=True)
class Hunk:
    source_start: int
    source_length: int
    target_start: int
    target_length: int
    old: tuple[str, ...]  # lines (with their line endings) the hunk expects
    new: tuple[str, ...]  # lines it writes instead
    text: str  # the hunk as written in the diff (for error messages)


@dataclass(frozen=True)
class FileDiff:
    relpath: str  # relative to site-packages: "vllm/transformers_utils/config.py"
    hunks: tuple[Hunk, ...]


@dataclass(frozen=True)
class Patch:
    name: str  # file name in the series folder
    headers: dict[str, str]
    files: tuple[FileDiff, ...]
    text: str = ""  # the patch file as read (header and diff)

    @property
    def subject(self) -> str:
        return self.headers["Subject"]


@dataclass(frozen=True)
class Series:
    dir: Path
    package: str  # "vllm"
    version: str  # "0.26.0"
    patches: tuple[Patch, ...]
    originals: dict[str, str] = field(default_factory=dict)  # relpath -> sha256 as in the wheel
    wheel_sha256: str | None = None
    wheel_filename: str | None = None

    @property
    def targets(self) -> list[str]:
        seen: dict[str, None] = {}
        for p in self.patches:
            for f in p.files:
                seen.setdefault(f.relpath, None)
        return list(seen)


@dataclass(frozen=True)
class PatchedFile:
    relpath: str
    original_sha256: str
    patched_sha256: str


@dataclass
class PatchResult:
    name: str
    subject: str
    status: str  # applied | already-applied | does-not-apply
    files: list[str]
    detail: str = ""  # for does-not-apply: which file, which hunk, why (+ the hunk text)

    def to_dict(self) -> dict:
        return {
            "patch": self.name,
            "subject": self.subject,
            "status": self.status,
            "files": self.files,
            "detail": self.detail,
        }


# =========================================================================== loading
def patches_root() -> Path:
    return data_path("patches")


def series_dir_for(vllm_version: str, package: str = "vllm") -> Path:
    """``patches/<package>/<version>``; :class:`BadInput` naming the available versions (or saying that
    ``vllm_version`` is not a version: a path like ``../x`` never reaches the file system)."""
    version_string(vllm_version)
    root = patches_root() / package
    d = root / vllm_version
    if (d / SERIES_FILE).is_file():
        return d
    avail = sorted(p.name for p in root.iterdir() if (p / SERIES_FILE).is_file()) if root.is_dir() else []
    raise BadInput(
        f"no patch series for {package} {vllm_version} (looked for {d / SERIES_FILE}); "
        f"series available: {', '.join(avail) or 'none'}.",
        hint="pass --series DIR for a series elsewhere, or create patches/vllm/<version>/ (docs/patches.md).",
    )


def require_series(vllm_version: str, package: str = "vllm") -> Path:
    """The shipped series for ``vllm_version``, or :class:`PatchFailed` (exit 6) saying how to port one:
    an image of a release whose patches were never carried over must not be built silently without them."""
    version_string(vllm_version)  # nothing below turns a word or a path into a suggested command or a path
    return shipped_series(vllm_version, package)


def shipped_series(vllm_version: str, package: str = "vllm") -> Path:
    """:func:`require_series` for a ``vllm_version`` the caller has validated already (the pipeline's
    release context): a version, never a word or a path."""
    d = patches_root() / package / vllm_version
    if (d / SERIES_FILE).is_file():
        return d
    root = patches_root() / package
    avail = sorted((p.name for p in root.iterdir() if (p / SERIES_FILE).is_file()), key=_vkey) if root.is_dir() else []
    older = [v for v in avail if _vkey(v) < _vkey(vllm_version)]
    src = (older or avail or ["<A>"])[-1]
    raise PatchFailed(
        f"no patch series for {package} {vllm_version} yet (no {root / vllm_version / SERIES_FILE}); "
        f"the image would carry none of the local loader patches. Port the series of {src}: "
        f"`build-image patch port --from {src} --to {vllm_version} -o patches/{package}/{vllm_version}` "
        "(review what it reports, docs/patches.md).",
        hint="or pass --series DIR for a series elsewhere, or --no-patches to build knowingly without patches.",
    )


def _vkey(v: str):
    from packaging.version import Version

    try:
        return Version(v)
    except ValueError:  # InvalidVersion, or a part past int()'s digit limit
        return Version("0")


_HEADER_LINE = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):\s?(.*)$")
_APPLIES_TO = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


def _split_header(text: str, where: str) -> tuple[dict[str, str], str]:
    """Header fields before the first diff line, and the diff text."""
    lines = text.splitlines(keepends=True)
    headers: dict[str, str] = {}
    last: str | None = None
    i = 0
    for i, line in enumerate(lines):
        if line.startswith(("--- ", "diff ", "Index: ")):
            break
        if not line.strip():
            last = None
            continue
        if line[0] in " \t" and last is not None:
            headers[last] += " " + line.strip()
            continue
        m = _HEADER_LINE.match(line.rstrip("\r\n"))
        if m:
            last = m.group(1)
            headers[last] = m.group(2).strip()
        else:
            last = None  # free text between the header and the diff is allowed
    else:
        i = len(lines)
    missing = [f for f in HEADER_FIELDS if not headers.get(f)]
    if missing:
        raise BadInput(
            f"patch {where}: header field(s) {', '.join(missing)} missing or empty "
            f"(every patch starts with {', '.join(HEADER_FIELDS)})."
        )
    return headers, "".join(lines[i:])


def _check_relpath(raw: str, package: str, where: str) -> str:
    """``a/vllm/x.py`` -> ``vllm/x.py``; PatchFailed for anything outside ``<package>/``."""
    path = raw.split("\t")[0].strip()
    if path == "/dev/null":
        raise PatchFailed(
            f"patch {where}: creates or deletes a file ({raw!r}); a series may only modify existing files."
        )
    if path.startswith("/"):
        raise PatchFailed(f"patch {where}: absolute path {path!r} refused.")
    parts = PurePosixPath(path).parts
    if ".." in parts or "\\" in path:
        raise PatchFailed(f"patch {where}: path {path!r} contains '..' or a backslash; refused.")
    if parts and parts[0] in ("a", "b"):
        parts = parts[1:]
    if len(parts) < 2 or parts[0] != package:  # (PurePosixPath drops "" and "." parts: vllm//a.py is vllm/a.py)
        raise PatchFailed(f"patch {where}: path {path!r} is outside the {package}/ package; refused.")
    return "/".join(parts)


def parse_patch(text: str, name: str, package: str) -> Patch:
    """Pure: one patch file's text -> :class:`Patch` (header + file diffs)."""
    import unidiff

    headers, diff = _split_header(text, name)
    for line in diff.splitlines():
        low = line.lower()
        if low.startswith(("rename from", "rename to", "copy from", "copy to", "similarity index")):
            raise PatchFailed(f"patch {name}: renames/copies are refused ({line.strip()!r}).")
        if low.startswith(("new file mode", "deleted file mode", "old mode", "new mode")):
            if "120000" in low:
                raise PatchFailed(f"patch {name}: symlink in the diff refused ({line.strip()!r}).")
            raise PatchFailed(f"patch {name}: file creation/deletion/mode changes are refused ({line.strip()!r}).")
        if line.startswith(("GIT binary patch", "Binary files ")):
            raise PatchFailed(f"patch {name}: binary diffs are refused.")
    try:
        ps = unidiff.PatchSet(diff)
    except unidiff.UnidiffParseError as exc:
        raise BadInput(f"patch {name}: not a valid unified diff ({exc}).") from None
    if not len(ps):
        raise BadInput(f"patch {name}: holds no diff after its header.")
    files = []
    for pf in ps:
        if pf.is_binary_file or getattr(pf, "is_symlink", False):
            raise PatchFailed(f"patch {name}: binary or symlink diff for {pf.path!r} refused.")
        src = _check_relpath(pf.source_file, package, name)
        dst = _check_relpath(pf.target_file, package, name)
        if src != dst or pf.is_rename:
            raise PatchFailed(f"patch {name}: renames are refused ({pf.source_file} -> {pf.target_file}).")
        hunks = []
        for h in pf:
            old: list[str] = []
            new: list[str] = []
            prev = None
            for ln in h:
                t = ln.line_type
                if t == "\\":  # "\ No newline at end of file": the previous line has no newline
                    if prev in (" ", "-") and old:
                        old[-1] = old[-1].rstrip("\r\n")
                    if prev in (" ", "+") and new:
                        new[-1] = new[-1].rstrip("\r\n")
                    continue
                if t in (" ", "-"):
                    old.append(ln.value)
                if t in (" ", "+"):
                    new.append(ln.value)
                prev = t
            hunks.append(
                Hunk(h.source_start, h.source_length, h.target_start, h.target_length, tuple(old), tuple(new), str(h))
            )
        files.append(FileDiff(dst, tuple(hunks)))
    seen = [f.relpath for f in files]
    if len(seen) != len(set(seen)):
        raise BadInput(f"patch {name}: names the same file twice; merge its hunks into one file diff.")
    return Patch(name=name, headers=headers, files=tuple(files), text=text)


def _read_sums(path: Path) -> dict[str, str]:
    sums: dict[str, str] = {}
    if not path.is_file():
        return sums
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        m = re.match(r"^([0-9a-f]{64})\s+\*?(\S.*)$", line.strip())
        if not m:
            raise BadInput(f"{path}, line {i}: expected '<sha256>  <path>' (sha256sum format), got {line!r:.80}.")
        sums[m.group(2)] = m.group(1)
    return sums


def load_series(series_dir: str | os.PathLike, vllm_version: str | None = None) -> Series:
    """Parse a series folder.  ``vllm_version``: refuse a series made for another version."""
    d = Path(series_dir)
    sf = d / SERIES_FILE
    if not sf.is_file():
        raise BadInput(f"{d} is not a patch series: it has no '{SERIES_FILE}' file.")
    if sf.is_symlink():
        raise PatchFailed(
            f"{sf} is a symlink; a series' files must be regular files in {d} (refused, like a symlink in a patch)."
        )
    names = [ln.split("#", 1)[0].strip() for ln in sf.read_text(encoding="utf-8").splitlines()]
    names = [n for n in names if n]
    patches: list[Patch] = []
    applies: dict[str, str] = {}
    for n in names:
        p = d / n
        if "/" in n or not p.is_file():  # ("." and ".." are folders)
            raise BadInput(f"{sf}: lists {n!r}, which is not a file in {d}.")
        if p.is_symlink():  # it would read a file from anywhere (outside the reviewed series) as a patch
            raise PatchFailed(
                f"patch {p} is a symlink (to {os.readlink(p)}); a series' patches must be regular "
                "files in the series directory (refused, like a symlink in a patch)."
            )
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise BadInput(f"patch {p} is not UTF-8 text.") from None
        headers, _ = _split_header(text, str(p))
        m = _APPLIES_TO.match(headers["Applies-To"].strip())
        if not m:
            raise BadInput(f"patch {p}: 'Applies-To' must read '<package>==<version>', got {headers['Applies-To']!r}.")
        applies[n] = f"{m.group(1).lower()}=={m.group(2)}"
        patches.append(parse_patch(text, n, m.group(1).lower()))
    if not patches:
        raise BadInput(f"{sf} lists no patches.")
    distinct = sorted(set(applies.values()))
    if len(distinct) > 1:
        raise BadInput(
            f"series {d} mixes Applies-To values: " + ", ".join(f"{k}: {v}" for k, v in applies.items()) + "."
        )
    package, version = distinct[0].split("==")
    if vllm_version is not None and version != vllm_version:
        raise BadInput(
            f"series {d} is for {package}=={version} (its patches' Applies-To), not {package}=={vllm_version}; "
            "a series is never applied to another version.",
            hint=f"port the patches into patches/{package}/{vllm_version}/ and check them against that wheel.",
        )
    originals = _read_sums(d / ORIG_SUMS)
    wheel = _read_sums(d / WHEEL_SUM)
    wheel_fn, wheel_sha = next(iter(wheel.items()), (None, None))
    return Series(
        dir=d,
        package=package,
        version=version,
        patches=tuple(patches),
        originals=originals,
        wheel_sha256=wheel_sha,
        wheel_filename=wheel_fn,
    )


# =========================================================================== sources (thin readers)
class _Source:
    """Read-only view of the package files: a wheel (zip) or a directory tree."""

    def __init__(self, source: str | os.PathLike):
        self.path = Path(source)
        if self.path.is_dir():
            self.zip = None
        elif self.path.is_file() and zipfile.is_zipfile(self.path):
            self.zip = zipfile.ZipFile(self.path)
        else:
            raise BadInput(f"patch source {self.path} is neither a wheel (zip) nor a directory.")

    def read(self, relpath: str) -> bytes | None:
        """The file's bytes, None if absent; PatchFailed on a symlink anywhere on its path."""
        if self.zip is not None:
            try:
                info = self.zip.getinfo(relpath)
            except KeyError:
                return None
            if stat.S_ISLNK(info.external_attr >> 16):
                raise PatchFailed(f"{self.path}: {relpath} is a symlink in the wheel; refused.")
            return self.zip.read(info)
        cur = self.path
        for part in PurePosixPath(relpath).parts:
            cur = cur / part
            if cur.is_symlink():
                raise PatchFailed(
                    f"{self.path}: {cur.relative_to(self.path)} is a symlink; patching through symlinks is refused."
                )
        if not cur.is_file():
            return None
        return cur.read_bytes()

    def close(self) -> None:
        if self.zip is not None:
            self.zip.close()


# =========================================================================== applying (pure)
def _lines(data: bytes) -> list[str]:
    return data.decode("utf-8").splitlines(keepends=True)


def _find(lines: list[str], block: tuple[str, ...]) -> list[int]:
    n = len(block)
    if not n:
        return []
    return [i for i in range(len(lines) - n + 1) if tuple(lines[i : i + n]) == block]


def _apply_hunks(lines: list[str], hunks: tuple[Hunk, ...], reverse: bool = False) -> tuple[list[str] | None, str]:
    """Exact application (no fuzz, no offset).  (new lines, "") or (None, why + failing hunk)."""
    out: list[str] = []
    cur = 0
    for k, h in enumerate(hunks, 1):
        old, new = (h.new, h.old) if reverse else (h.old, h.new)
        start_line, length = (h.target_start, h.target_length) if reverse else (h.source_start, h.source_length)
        start = start_line - 1 if length > 0 else start_line
        if start < cur:
            return None, f"hunk #{k} overlaps the previous hunk.\n{h.text}"
        if not old and start > len(lines):  # no old lines: the empty slice past the end would "match"
            return None, f"hunk #{k} names line {start_line}, past the end of the file ({len(lines)} lines).\n{h.text}"
        if tuple(lines[start : start + len(old)]) == old:
            out += lines[cur:start] + list(new)
            cur = start + len(old)
            continue
        where = [i + 1 for i in _find(lines, old)]
        if where:
            why = (
                f"hunk #{k} does not match at line {start_line}; it matches exactly at line(s) "
                f"{', '.join(map(str, where[:5]))} (offset {where[0] - start_line:+d}): offsets are refused"
            )
        else:
            why = f"hunk #{k} does not match at line {start_line} (nor anywhere else: fuzz is refused)"
        return None, f"{why}.\n{h.text}"
    out += lines[cur:]
    return out, ""


def _patch_texts(
    series: Series, src, *, whole: bool = True
) -> tuple[list[PatchResult], dict[str, bytes], dict[str, bytes]]:
    """Run the series in order over in-memory copies of ``src``'s files (a :class:`_Source` or
    :class:`_Memory`): results, originals, final contents.  ``whole``: where some patch does not
    apply, a tree that is the whole series applied is still every patch ``already-applied``."""
    originals: dict[str, bytes] = {}
    current: dict[str, list[str]] = {}
    results: list[PatchResult] = []
    for p in series.patches:
        staged: dict[str, list[str]] = {}
        statuses: list[str] = []
        detail = ""
        for f in p.files:
            if f.relpath not in current:
                data = src.read(f.relpath)
                if data is None:
                    statuses.append(DOES_NOT_APPLY)
                    detail = f"{f.relpath}: no such file in {src.path}."
                    break
                originals[f.relpath] = data
                try:
                    current[f.relpath] = _lines(data)
                except UnicodeDecodeError:
                    raise PatchFailed(f"{src.path}: {f.relpath} is not UTF-8 text; refused.") from None
            lines = current[f.relpath]
            new, why = _apply_hunks(lines, f.hunks)
            if new is not None:
                staged[f.relpath] = new
                statuses.append(APPLIED)
                continue
            back, _ = _apply_hunks(lines, f.hunks, reverse=True)
            if back is not None:
                statuses.append(ALREADY_APPLIED)
                continue
            statuses.append(DOES_NOT_APPLY)
            detail = f"{f.relpath}: {why}"
            break
        if DOES_NOT_APPLY in statuses:
            status = DOES_NOT_APPLY
        elif all(s == ALREADY_APPLIED for s in statuses):
            status = ALREADY_APPLIED
        elif ALREADY_APPLIED in statuses:
            status = DOES_NOT_APPLY
            detail = (
                "partly applied already ("
                + ", ".join(f"{f.relpath}: {s}" for f, s in zip(p.files, statuses))
                + "); refusing a half-patched tree."
            )
        else:
            status = APPLIED
            current.update(staged)
        results.append(PatchResult(p.name, p.subject, status, [f.relpath for f in p.files], detail))
    final = {rel: "".join(lines).encode("utf-8") for rel, lines in current.items()}
    if whole and any(r.status != APPLIED for r in results):
        done = _applied_as_a_whole(series, src)
        if done is not None:
            return [PatchResult(r.name, r.subject, ALREADY_APPLIED, r.files, "") for r in results], done, done
    return results, originals, final


class _Memory:
    """Package files held in memory, read like a :class:`_Source`."""

    def __init__(self, files: dict[str, bytes], path: Path):
        self.files, self.path = files, path

    def read(self, relpath: str) -> bytes | None:
        return self.files.get(relpath)


def _applied_as_a_whole(series: Series, src) -> dict[str, bytes] | None:
    """The target files if ``src`` is exactly the series applied (reverted last patch first, then
    re-applied in order, every patch applies and gives ``src`` back), else None.  Patch by patch,
    an applied series can look unapplied: a later patch that moves an earlier one's lines in the
    same file leaves the earlier one's new lines where it does not name them."""
    current: dict[str, bytes] = {}
    for rel in series.targets:
        data = src.read(rel)
        if data is None:
            return None
        current[rel] = data
    unpatched = _reverted(series, current)
    if unpatched is None:
        return None
    results, _, final = _patch_texts(series, _Memory(unpatched, src.path), whole=False)
    if all(r.status == APPLIED for r in results) and final == current:
        return current
    return None


def _raise_if_failed(series: Series, results: list[PatchResult], source) -> None:
    bad = [r for r in results if r.status == DOES_NOT_APPLY]
    if bad:
        exc = PatchFailed(
            f"{len(bad)} of {len(results)} patch(es) of series {series.dir} do not apply to {source}: "
            + ", ".join(r.name for r in bad)
            + ".",
            hint="port the patch to this vllm (exact context, no fuzz/offset) or remove it from the series.",
            details="\n".join(f"--- {r.name}: {r.detail}" for r in bad),
        )
        exc.results = results  # type: ignore[attr-defined]
        raise exc


def check(series: Series, source: str | os.PathLike, *, raise_on_failure: bool = True) -> list[PatchResult]:
    """Apply the series in memory to ``source`` (a wheel or a directory holding the package).

    Returns one :class:`PatchResult` per patch.  ``raise_on_failure`` (default): a
    :class:`PatchFailed` listing every patch that does not apply, with its failing hunk.
    """
    src = _Source(source)
    try:
        results, _, _ = _patch_texts(series, src)
    finally:
        src.close()
    if raise_on_failure:
        _raise_if_failed(series, results, source)
    return results


def _mismatched_originals(series: Series, originals: dict[str, bytes]) -> list[str]:
    out = []
    for rel, data in originals.items():
        want = series.originals.get(rel)
        if want is not None and sha256_bytes(data) != want:
            out.append(f"{rel}: sha256 {sha256_bytes(data)}, the series was made for {want}")
    return out


def apply_to_dir(series: Series, source: str | os.PathLike, out_dir: str | os.PathLike) -> list[PatchedFile]:
    """Write the patched target files (only those) under ``out_dir/<relpath>``.

    Refuses (PatchFailed) a patch that does not apply, and a source whose target files
    differ from the originals recorded in ``sha256sums.orig``.
    """
    src = _Source(source)
    try:
        results, originals, final = _patch_texts(series, src)
    finally:
        src.close()
    _raise_if_failed(series, results, source)
    wrong = _mismatched_originals(series, originals)
    if wrong:
        raise PatchFailed(
            f"{source}: target files differ from the {series.package} {series.version} originals; refusing to patch.",
            details="\n".join(wrong),
        )
    out = Path(out_dir)
    done = []
    for rel in series.targets:
        atomic_write_bytes(out / rel, final[rel])
        done.append(PatchedFile(rel, sha256_bytes(originals[rel]), sha256_bytes(final[rel])))
    return done


def _reverted(series: Series, current: dict[str, bytes]) -> dict[str, bytes] | None:
    """``current`` (patched contents) with the whole series reverted, last patch first; None if it does not revert."""
    out = {}
    for rel, data in current.items():
        try:
            lines: list[str] | None = _lines(data)
        except UnicodeDecodeError:
            return None
        for p in reversed(series.patches):
            for f in p.files:
                if f.relpath == rel and lines is not None:
                    lines, _ = _apply_hunks(lines, f.hunks, reverse=True)
        if lines is None:
            return None
        out[rel] = "".join(lines).encode("utf-8")
    return out


def apply_site_packages(series: Series, site_packages_dir: str | os.PathLike) -> list[PatchedFile]:
    """Patch an installed package in place, all or nothing.

    First every target's sha256 must equal the wheel's original (``sha256sums.orig``):
    a base with another vllm is refused before anything changes.  A tree already
    patched by this very series (every patch ``already-applied``) is left as is.
    """
    root = Path(site_packages_dir)
    if not root.is_dir():
        raise BadInput(f"--site-packages {root}: not a directory.")
    missing = [rel for rel in series.targets if rel not in series.originals]
    if missing:
        raise PatchFailed(
            f"series {series.dir} records no original sha256 for {', '.join(missing)}; "
            "in-place patching needs them to refuse a different base.",
            hint=f"generate {ORIG_SUMS} with `build-image patch sums --series {series.dir} --wheel <the wheel>`.",
        )
    src = _Source(root)
    originals: dict[str, bytes] = {}
    for rel in series.targets:
        data = src.read(rel)
        if data is not None:
            originals[rel] = data
    absent = [rel for rel in series.targets if rel not in originals]
    if absent:
        raise PatchFailed(f"{root}: target file(s) missing: {', '.join(absent)}; is {series.package} installed there?")
    wrong = _mismatched_originals(series, originals)
    results, _, final = _patch_texts(series, src)
    if wrong and all(r.status == ALREADY_APPLIED for r in results):  # patched earlier by this very series?
        # Only if reverting the series gives back exactly the wheel's originals: a tree patched
        # by it *and* changed elsewhere is refused, not reported as patched.
        unpatched = _reverted(series, originals)
        still = _mismatched_originals(series, unpatched) if unpatched is not None else ["the series does not revert"]
        if not still:
            return [PatchedFile(rel, series.originals[rel], sha256_bytes(originals[rel])) for rel in series.targets]
        raise PatchFailed(
            f"{root}: the series looks applied already, but reverting it does not give the {series.package} "
            f"{series.version} wheel's originals: the files were changed beyond this series. Nothing was changed.",
            details="\n".join(still),
        )
    if wrong:
        raise PatchFailed(
            f"{root}: {len(wrong)} target file(s) differ from the {series.package} {series.version} wheel's originals; "
            "this is not the vllm the series was made for. Nothing was changed.",
            details="\n".join(wrong),
        )
    _raise_if_failed(series, results, root)
    written: list[str] = []
    try:
        for rel in series.targets:
            dest = root / rel
            mode = stat.S_IMODE(dest.stat().st_mode)
            atomic_write_bytes(dest, final[rel], mode)
            written.append(rel)
    except BaseException:
        for rel in written:  # all or nothing: put the originals back
            atomic_write_bytes(root / rel, originals[rel])
        raise
    return [PatchedFile(rel, sha256_bytes(originals[rel]), sha256_bytes(final[rel])) for rel in series.targets]


def original_sums(series: Series, source: str | os.PathLike) -> dict[str, str]:
    """sha256 of every target file as found in ``source`` (for ``sha256sums.orig``)."""
    src = _Source(source)
    try:
        sums = {}
        for rel in series.targets:
            data = src.read(rel)
            if data is None:
                raise PatchFailed(f"{source}: {rel} (a target of the series) does not exist.")
            sums[rel] = sha256_bytes(data)
        return sums
    finally:
        src.close()


def format_sums(sums: dict[str, str]) -> str:
    """``sha256sum -c`` format, sorted by path."""
    return "".join(f"{h}  {rel}\n" for rel, h in sorted(sums.items()))


def sha256_list(files: list[PatchedFile], which: str = "patched") -> str:
    """``sha256sum -c`` lines for the original or patched contents of ``files``."""
    return format_sums({f.relpath: (f.patched_sha256 if which == "patched" else f.original_sha256) for f in files})
