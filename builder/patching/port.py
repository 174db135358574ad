"""Port a patch series from one release of its package to another (``build-image patch port``).

Per patch, in series order, exactly one status:

``applies``   every hunk's old lines occur exactly in B (offsets allowed, regenerated
              away; no fuzz);
``merged``    a three-way merge with A's original as the common ancestor, A's patched
              file as ours and B's original as theirs, succeeded without a conflict
              region (``merge3``, a maintained pure-Python implementation of the
              bzr/breezy merge, chosen over ``git merge-file`` because its regions are
              data, and no git binary is needed): a candidate that needs review;
``conflict``  neither: the regions that did not merge are shown, or a placement/probe
              check below failed;
``upstream``  B's unpatched tree (with the earlier patches of the series ported) already
              passes the patch's probe: propose retiring the patch; the probe output is
              the evidence.

Nothing is ``applies`` or ``merged`` unless every changed line lands in the same
enclosing function or class (``ast``: the qualified name of the innermost
``def``/``class`` holding the line) as in A, and the probe passes on the ported tree.

Everything here is pure (texts in, texts out) except :func:`port_series`, which reads
the sources and runs probes through :mod:`builder.patching.probe`, and :func:`write_series`.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from builder.errors import BadInput
from builder.events import SILENT, Reporter
from builder.patching import probe as PR
from builder.patching import series as P
from builder.report import render_json
from builder.util import atomic_write_text, sha256_bytes, sha256_file, write_error
from builder.validate import read_bounded

APPLIES, MERGED, CONFLICT, UPSTREAM = "applies", "merged", "conflict", "upstream"
STATUSES = (APPLIES, MERGED, CONFLICT, UPSTREAM)
PORTED_FIELD = "Ported-From"


# =========================================================================== data
@dataclass
class PortedPatch:
    name: str
    subject: str
    status: str
    detail: list[str] = field(default_factory=list)  # why (per file), conflict regions, placement
    files: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)  # relpath -> (B original, B ported)
    text: str | None = None  # the ported patch file (applies / merged)
    probe_unpatched: PR.ProbeRun | None = None
    probe_ported: PR.ProbeRun | None = None
    probe: str | None = None

    def to_dict(self) -> dict:
        return {
            "patch": self.name,
            "subject": self.subject,
            "status": self.status,
            "detail": self.detail,
            "files": sorted(self.files),
            "probe": self.probe,
            "probe_unpatched": self.probe_unpatched.to_dict() if self.probe_unpatched else None,
            "probe_ported": self.probe_ported.to_dict() if self.probe_ported else None,
        }


@dataclass
class PortReport:
    package: str
    from_version: str
    to_version: str
    patches: list[PortedPatch]
    out_dir: str | None = None
    merge_tool: str = "merge3"

    @property
    def needs_review(self) -> bool:
        return any(p.status in (MERGED, CONFLICT) for p in self.patches)

    def to_dict(self) -> dict:
        return {
            "package": self.package,
            "from": self.from_version,
            "to": self.to_version,
            "merge": self.merge_tool,
            "out_dir": self.out_dir,
            "needs_review": self.needs_review,
            "patches": [p.to_dict() for p in self.patches],
        }


# =========================================================================== scopes (ast)
def scopes(text: str) -> list[str] | None:
    """Per line (1-based index i -> list[i-1]) the qualified name of the innermost def/class
    holding it ("<module>" outside any); None if ``text`` does not parse."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    n = text.count("\n") + 1
    out = ["<module>"] * n

    def walk(node, prefix: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                q = f"{prefix}.{child.name}" if prefix else child.name
                start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                for i in range(start, (child.end_lineno or child.lineno) + 1):
                    out[i - 1] = q
                walk(child, q)
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def changed_lines(old: list[str], new: list[str]) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(removed [(old line no, text)], added [(new line no, text)]) of old -> new."""
    removed, added = [], []
    sm = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag in ("replace", "delete"):
            removed += [(i + 1, old[i]) for i in range(i1, i2)]
        if tag in ("replace", "insert"):
            added += [(j + 1, new[j]) for j in range(j1, j2)]
    return removed, added


def placement(a_old: str, a_new: str, b_old: str, b_new: str) -> list[str]:
    """Pure: why B's change is not A's change in the same places (empty list: it is).

    Compares, line by line, the removed and the added lines of A (A's original -> A's
    patched) and of B (B's original -> B ported), each with the qualified name of its
    enclosing def/class.
    """
    sa_old, sa_new, sb_old, sb_new = scopes(a_old), scopes(a_new), scopes(b_old), scopes(b_new)
    if sb_new is None:
        return ["the ported file does not parse as Python"]
    if None in (sa_old, sa_new, sb_old):
        return ["an original file does not parse as Python"]
    ar, aa = changed_lines(a_old.splitlines(True), a_new.splitlines(True))
    br, ba = changed_lines(b_old.splitlines(True), b_new.splitlines(True))
    problems = []
    for what, a_lines, a_sc, b_lines, b_sc in (("removed", ar, sa_old, br, sb_old), ("added", aa, sa_new, ba, sb_new)):
        a_seq = [(a_sc[i - 1], t) for i, t in a_lines]
        b_seq = [(b_sc[i - 1], t) for i, t in b_lines]
        if a_seq == b_seq:
            continue
        if [t for _, t in a_seq] != [t for _, t in b_seq]:
            problems.append(f"the {what} lines differ from A's ({len(a_seq)} in A, {len(b_seq)} in B)")
            continue
        for (sa, t), (sb, _) in zip(a_seq, b_seq):
            if sa != sb:
                problems.append(f"a {what} line lands in {sb}, in A it is in {sa}: {t.strip()[:80]!r}")
                break
    return problems


# =========================================================================== hunks on B (pure)
def exact_apply(lines: list[str], hunks: tuple[P.Hunk, ...], scope_of_a: list[str] | None = None) -> list[str] | None:
    """Every hunk's old lines found exactly in ``lines`` (any offset), in order, without overlap.
    Where a block occurs more than once, the occurrence in A's scope is taken (else None)."""
    out: list[str] = []
    cur = 0
    sc = scopes("".join(lines)) if scope_of_a is not None else None
    for h in hunks:
        if not h.old:
            return None  # a pure insertion has no context to place it by
        cands = [i for i in P._find(lines, h.old) if i >= cur]
        if len(cands) > 1 and sc is not None:  # (sc is None without A's scopes, or when B does not parse)
            want = scope_of_a[max(h.source_start - 1, 0)] if h.source_start - 1 < len(scope_of_a) else None
            cands = [i for i in cands if sc[i] == want] or cands
        if len(cands) != 1:
            return None
        i = cands[0]
        out += lines[cur:i] + list(h.new)
        cur = i + len(h.old)
    return out + lines[cur:]


def three_way(base: list[str], ours: list[str], theirs: list[str]) -> tuple[list[str] | None, list[str]]:
    """merge3: (merged lines, []) or (None, [conflict regions rendered for the report])."""
    import merge3

    m = merge3.Merge3(base, ours, theirs)
    merged: list[str] = []
    conflicts: list[str] = []
    for region in m.merge_regions():
        kind = region[0]
        if kind == "unchanged":
            merged += base[region[1] : region[2]]
        elif kind in ("a", "same"):
            merged += ours[region[1] : region[2]]
        elif kind == "b":
            merged += theirs[region[1] : region[2]]
        else:  # conflict: zstart, zend, astart, aend, bstart, bend
            z1, z2, a1, a2, b1, b2 = region[1:]
            conflicts.append(
                f"conflict at {B_LABEL} lines {b1 + 1}-{b2} (A's original lines {z1 + 1}-{z2}):\n"
                + "".join(
                    marker + "".join(block)
                    for marker, block in (
                        ("<<<<<<< patched A\n", ours[a1:a2]),
                        ("||||||| A original\n", base[z1:z2]),
                        ("=======\n", theirs[b1:b2]),
                        (">>>>>>> B original\n", []),
                    )
                )
            )
    return (None, conflicts) if conflicts else (merged, [])


B_LABEL = "B's"


def unified(relpath: str, old: str, new: str) -> str:
    """A unified diff (3 lines of context) with ``a/``/``b/`` labels, as the series stores it."""
    lines = list(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{relpath}", f"b/{relpath}", n=3))
    out = []
    for ln in lines:
        if not ln.endswith("\n"):
            ln += "\n\\ No newline at end of file\n"
        out.append(ln)
    return "".join(out)


def header_text(headers: dict[str, str]) -> str:
    """RFC-822 style header; long values wrapped with indented continuation lines."""
    import textwrap

    out = []
    for k, v in headers.items():
        wrapped = textwrap.wrap(
            v, width=88, initial_indent=f"{k}: ", subsequent_indent=" ", break_long_words=False, break_on_hyphens=False
        ) or [f"{k}:"]
        out += wrapped
    return "\n".join(out) + "\n\n"


def ported_headers(headers: dict[str, str], package: str, a: str, b: str, note: str) -> dict[str, str]:
    out = dict(headers)
    out["Applies-To"] = f"{package}=={b}"
    out[PORTED_FIELD] = f"{package}=={a}: {note}"
    return out


# =========================================================================== the port
def port_series(
    series: P.Series,
    a_source,
    b_source,
    b_version: str,
    *,
    runner_a: PR.ProbeRunner | None = None,
    runner_b: PR.ProbeRunner | None = None,
    probes: bool = True,
    reporter: Reporter = SILENT,
) -> PortReport:
    """Port ``series`` (made for A, read from ``a_source``) to B (``b_source``: a wheel or a tree); each probe run
    is a step on ``reporter``."""
    a_src, b_src = P._Source(a_source), P._Source(b_source)
    try:
        a_cur: dict[str, list[str]] = {}
        b_cur: dict[str, list[str]] = {}
        b_orig: dict[str, bytes] = {}
        for rel in series.targets:
            da = a_src.read(rel)
            if da is None:
                raise BadInput(f"{a_source}: {rel} (a target of series {series.dir}) does not exist.")
            a_cur[rel] = P._lines(da)
            db = b_src.read(rel)
            if db is not None:
                b_orig[rel] = db
                b_cur[rel] = P._lines(db)
    finally:
        a_src.close()
        b_src.close()
    b_tree = PR.unpatched_tree(b_source, series.package) if probes else None
    out: list[PortedPatch] = []
    tmp = Path(tempfile.mkdtemp(prefix="build-image-port-"))
    try:
        for k, p in enumerate(series.patches):
            out.append(
                _port_one(
                    series, p, k, a_cur, b_cur, b_orig, b_version, b_tree, tmp, runner_b if probes else None, reporter
                )
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return PortReport(series.package, series.version, b_version, out)


def _tree_with(b_tree: Path, b_cur: dict[str, list[str]], b_orig: dict[str, bytes], tmp: Path, tag: str) -> Path:
    files = {rel: "".join(lines).encode() for rel, lines in b_cur.items() if "".join(lines).encode() != b_orig.get(rel)}
    if not files:
        return b_tree
    return PR.patched_tree(b_tree, files, tmp / tag)


def _port_one(series, p: P.Patch, k: int, a_cur, b_cur, b_orig, b_version, b_tree, tmp, runner, reporter: Reporter):
    pp = PortedPatch(p.name, p.subject, CONFLICT, probe=PR.probe_name(p))
    probe_file = PR.find_probe(series.dir, pp.probe) if pp.probe else None
    has_probe = runner is not None and probe_file is not None and probe_file.is_file()
    # 1. place each file's hunks on B (pure, cheap)
    method, staged = _place_hunks(series, p, a_cur, b_cur, b_version, pp)
    _advance_a(p, a_cur)
    # 2. the probes: B as it is (with the earlier ported patches) and, if the hunks landed, B ported
    if has_probe:
        reporter.step(
            f"{p.name}: probe on {series.package} {b_version} as shipped"
            + (" and on the ported tree" if method != CONFLICT else "")
        )
        pre = _tree_with(b_tree, b_cur, b_orig, tmp, f"pre{k}")
        post = _tree_with(b_tree, {**b_cur, **staged}, b_orig, tmp, f"post{k}") if method != CONFLICT else None
        pp.probe_unpatched, pp.probe_ported = _run_probes(runner, probe_file, pre, post)
        if pp.probe_unpatched.status == PR.PASS:
            pp.status = UPSTREAM
            pp.detail.insert(
                0, f"{series.package} {b_version} unpatched passes the probe {pp.probe}: propose retiring the patch."
            )
            return pp
    if method == CONFLICT:
        pp.status = CONFLICT
        return pp
    # 3. the probe must pass on the ported tree
    if not has_probe:
        pp.status = CONFLICT
        pp.detail.append(
            f"no probe to run ({pp.probe or 'no Probe: header'}): a port is never accepted without its probe passing."
        )
        return pp
    if pp.probe_ported.status != PR.PASS:
        pp.status = CONFLICT
        pp.detail.append(
            f"the hunks land, but the probe {pp.probe} does not pass on the ported tree: " + pp.probe_ported.summary()
        )
        return pp
    _accept(series, pp, method, staged, b_cur, b_version, p.headers)
    return pp


def _place_hunks(series, p: P.Patch, a_cur, b_cur, b_version, pp: PortedPatch) -> tuple[str, dict[str, list[str]]]:
    """Each file's hunks placed on B: APPLIES (exact context), MERGED (three-way merge) or
    CONFLICT for the patch, and the new lines of each file that landed."""
    method = APPLIES
    staged: dict[str, list[str]] = {}
    for f in p.files:
        a_old = a_cur[f.relpath]
        a_new, why = P._apply_hunks(a_old, f.hunks)
        if a_new is None:
            raise BadInput(f"series {series.dir}: {p.name} does not apply to its own release: {why}")
        if f.relpath not in b_cur:
            pp.detail.append(f"{f.relpath}: no such file in {series.package} {b_version}.")
            method = CONFLICT
            continue
        b_new, how = _place_file(f, a_old, a_new, b_cur[f.relpath], b_version, pp)
        if b_new is None:
            method = CONFLICT
            continue
        staged[f.relpath] = b_new
        if how == MERGED and method == APPLIES:
            method = MERGED
    return method, staged


def _place_file(
    f, a_old: list[str], a_new: list[str], b_old: list[str], b_version: str, pp: PortedPatch
) -> tuple[list[str] | None, str]:
    """One file's hunks on B: exactly where A's context is, else by a three-way merge; the
    change must land where it did on A.  (None, CONFLICT) when it does not; why is in ``pp.detail``."""
    b_new = exact_apply(b_old, f.hunks, scopes("".join(a_old)))
    if b_new is not None:
        bad = placement("".join(a_old), "".join(a_new), "".join(b_old), "".join(b_new))
        if not bad:
            pp.detail.append(f"{f.relpath}: every hunk's context found exactly in {b_version}.")
            return b_new, APPLIES
        pp.detail.append(f"{f.relpath}: the exact context matches, but in another place: " + "; ".join(bad))
    merged, conflicts = three_way(a_old, a_new, b_old)
    if merged is None:
        pp.detail.append(f"{f.relpath}: {len(conflicts)} region(s) did not merge:")
        pp.detail += conflicts
        return None, CONFLICT
    bad = placement("".join(a_old), "".join(a_new), "".join(b_old), "".join(merged))
    if bad:
        pp.detail.append(f"{f.relpath}: the merge puts the change elsewhere: " + "; ".join(bad))
        return None, CONFLICT
    pp.detail.append(f"{f.relpath}: three-way merge (A's original as the ancestor) succeeded; review it.")
    return merged, MERGED


def _run_probes(runner: PR.ProbeRunner, probe_file: Path, pre: Path, post: Path | None):
    """The probe on B as it is and on B ported, side by side (independent processes)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        f_pre = pool.submit(runner.run, probe_file, pre)
        f_post = pool.submit(runner.run, probe_file, post) if post is not None else None
        return f_pre.result(), (f_post.result() if f_post is not None else None)


def _accept(series, pp: PortedPatch, method: str, staged: dict[str, list[str]], b_cur, b_version: str, headers) -> None:
    """The port is accepted: its files become B's current state and its text is written."""
    pp.status = method
    for rel, new in staged.items():
        pp.files[rel] = ("".join(b_cur[rel]).encode(), "".join(new).encode())
    b_cur.update(staged)
    note = (
        "applies (no fuzz; offsets regenerated)"
        if method == APPLIES
        else "merged (three-way merge with the old release's original as the ancestor; needs review)"
    )
    headers = ported_headers(headers, series.package, series.version, b_version, note)
    pp.text = header_text(headers) + "".join(unified(rel, o.decode(), n.decode()) for rel, (o, n) in pp.files.items())


def _advance_a(p: P.Patch, a_cur: dict[str, list[str]]) -> None:
    for f in p.files:
        new, _ = P._apply_hunks(a_cur[f.relpath], f.hunks)
        if new is not None:
            a_cur[f.relpath] = new


# =========================================================================== output
#: how the ``series`` file :func:`write_series` writes ends its first line
PORT_MARK = "by build-image patch port"


def refuse_foreign_series(out_dir: str | os.PathLike, *, force: bool = False) -> None:
    """The output rule for a port's ``-o``: an existing, non-empty folder whose ``series`` file does not open
    with the line :func:`write_series` writes (``# vllm B, ported from A by build-image patch port``) is a
    series made by hand; porting into it would overwrite its patches, so it is refused (BadInput, exit 2,
    nothing written) unless ``force``.  A file (not a folder) in its place is refused even then."""
    d = Path(out_dir)
    if not d.exists() and not d.is_symlink():
        return
    if not d.is_dir():
        raise BadInput(f"-o {d} exists and is not a directory; a ported series is a folder.")
    if force or not any(d.iterdir()):
        return
    try:  # the bounded reader: a FIFO or a device named `series` is no series (and never hangs the check)
        head = read_bounded(d / P.SERIES_FILE, "series")[:4096]  # the mark is in the first 4 KiB
        first = head.decode("utf-8", errors="replace").split("\n", 1)[0].rstrip()
    except BadInput:
        first = ""
    if first.startswith("# ") and first.endswith(PORT_MARK):
        return
    raise BadInput(
        f"-o {d} holds files and is not a series ported by build-image (its {P.SERIES_FILE} file does "
        f"not open with '# … {PORT_MARK}'); porting into it would overwrite its patches. Nothing was "
        "written.",
        hint="port into a new folder, or pass --force to write B's series there anyway.",
    )


def write_series(
    report: PortReport,
    series: P.Series,
    out_dir: str | os.PathLike,
    *,
    b_originals: dict[str, bytes],
    wheel: Path | None,
) -> Path:
    """Write B's series: ported patches, their probes, probe-env, sums; conflicts as ``.conflict`` files.
    A folder that cannot be written (read-only, full, not a directory) is BadInput (exit 2) naming it."""
    d = Path(out_dir)
    try:
        return _write_series(report, series, d, b_originals=b_originals, wheel=wheel)
    except OSError as exc:
        err = write_error(exc.filename or d, exc)
        if err is None:
            raise
        raise err from None


def _write_series(
    report: PortReport, series: P.Series, d: Path, *, b_originals: dict[str, bytes], wheel: Path | None
) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    lines = [f"# {series.package} {report.to_version}, ported from {report.from_version} {PORT_MARK}"]
    kept = []
    for pp, p in zip(report.patches, series.patches):
        if pp.status in (APPLIES, MERGED) and pp.text:
            atomic_write_text(d / pp.name, pp.text)
            (d / f"{pp.name}.conflict").unlink(missing_ok=True)  # left by an earlier run
            lines.append(pp.name + ("  # merged: review" if pp.status == MERGED else ""))
            kept.append(p)
        elif pp.status == UPSTREAM:
            lines.append(f"# {pp.name}  retired: {report.to_version} passes its probe unpatched")
        else:
            lines.append(f"# {pp.name}  conflict: see {pp.name}.conflict, finish by hand, then list it here")
            atomic_write_text(d / f"{pp.name}.conflict", "\n".join(pp.detail) + "\n")
        _write_probe(series, pp.probe, d)
    if (series.dir / PR.PROBE_ENV).is_file() and not (d / PR.PROBE_ENV).is_file():
        shutil.copyfile(series.dir / PR.PROBE_ENV, d / PR.PROBE_ENV)
    atomic_write_text(d / P.SERIES_FILE, "\n".join(lines) + "\n")
    targets = sorted({f.relpath for p in kept for f in p.files})
    atomic_write_text(
        d / P.ORIG_SUMS, P.format_sums({rel: sha256_bytes(b_originals[rel]) for rel in targets if rel in b_originals})
    )
    if wheel is not None and wheel.is_file():
        atomic_write_text(d / P.WHEEL_SUM, f"{sha256_file(wheel)}  {wheel.name}\n")
    return d


def _write_probe(series: P.Series, name: str | None, out_dir: Path) -> None:
    """B's copy of a probe: none when the shared probe folder beside B's series holds the same bytes (the
    probe fits B's code as it is), else the probe A uses, written into B's series."""
    probe = PR.find_probe(series.dir, name) if name else None
    if probe is None:
        return
    shared = PR.shared_probes_dir(out_dir) / probe.name
    if shared.is_file() and shared.read_bytes() == probe.read_bytes():
        (out_dir / probe.name).unlink(missing_ok=True)  # an earlier port's copy: the shared one is used
        return
    shutil.copyfile(probe, out_dir / probe.name)


def b_originals(series: P.Series, b_source) -> dict[str, bytes]:
    src = P._Source(b_source)
    try:
        return {rel: data for rel in series.targets if (data := src.read(rel)) is not None}
    finally:
        src.close()


# =========================================================================== rendering
def render(report: PortReport, fmt: str = "text") -> str:
    if fmt == "json":
        return render_json(report.to_dict(), ensure_ascii=True)
    md = fmt == "markdown"
    out = []
    title = f"{report.package} patch series: {report.from_version} -> {report.to_version}"
    out.append(f"### {title}\n" if md else title)
    if md:
        out += ["| patch | status | evidence |", "| --- | --- | --- |"]
    for p in report.patches:
        ev = ""
        if p.status == UPSTREAM and p.probe_unpatched:
            ev = f"probe passes unpatched: {p.probe_unpatched.summary()}"
        elif p.probe_ported:
            ev = f"probe on the ported tree: {p.probe_ported.summary()}"
        elif p.detail:
            ev = p.detail[0].splitlines()[0]
        if md:
            out.append(f"| `{p.name}` | **{p.status}** | {_md(ev)} |")
        else:
            out.append(f"  {p.status:9} {p.name}  {p.subject}")
            for d in p.detail:
                out += ["      " + ln for ln in d.rstrip().splitlines()]
            if ev and (p.probe_ported or p.status == UPSTREAM):
                out.append("      " + ev)
    if md:
        for p in report.patches:
            if p.status == CONFLICT:
                out += [
                    "",
                    f"<details><summary>{p.name}: what did not port</summary>",
                    "",
                    "```diff",
                    *[ln for d in p.detail for ln in d.rstrip().splitlines()],
                    "```",
                    "</details>",
                ]
    if report.out_dir:
        out.append(("\n" if md else "") + f"series written to {report.out_dir}")
    return "\n".join(out) + "\n"


def _md(s: str) -> str:
    return re.sub(r"[|\n]", " ", s)[:400]


# =========================================================================== the command's whole job
def probe_env_dir(series: P.Series, b_version: str, out_dir: str | os.PathLike | None) -> Path:
    """Whose probe-env.txt runs B's probes: ``out_dir``'s or the shipped B series' when present, else A's."""
    cands = [Path(out_dir)] if out_dir else []
    try:
        cands.append(P.series_dir_for(b_version, series.package))
    except BadInput:
        pass
    for c in cands:
        if (c / PR.PROBE_ENV).is_file():
            return c
    return series.dir


def port(
    series: P.Series,
    a_source,
    b_source,
    b_version: str,
    *,
    out_dir=None,
    probe_python: str | None = None,
    reporter: Reporter = SILENT,
) -> PortReport:
    """Port, then (with ``out_dir``) write B's series there."""
    runner = PR.runner_for(probe_env_dir(series, b_version, out_dir), probe_python)
    report = port_series(series, a_source, b_source, b_version, runner_b=runner, reporter=reporter)
    if out_dir:
        wheel = Path(b_source) if Path(b_source).is_file() else None
        write_series(report, series, out_dir, b_originals=b_originals(series, b_source), wheel=wheel)
        report.out_dir = str(out_dir)
    return report
