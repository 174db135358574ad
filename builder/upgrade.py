"""``build-image upgrade``: one vLLM release to the next, as one reviewable report.

Stages, composed in memory (each is the project's own stage, not a re-implementation):

1. **bases**: A's and B's base manifests (shipped ``lockfiles/base/vllm-openai-vX.json``
   or given); a B without one is reconstructed from its recipe (``builder.resolve.reconstruct``);
2. **port**: A's patch series ported to B (:func:`builder.patching.port.port`: applies / merged /
   conflict / upstream, every status backed by the patch's probe);
3. **lock**: the overlay A's lock records, re-locked on B's base (:func:`builder.resolve.lock.run`,
   ``upgrade``: a fresh resolution; the ray per release is chosen there) — the ABI gate runs
   as part of it;
4. **report**: base moves (torch, CUDA, Python, glibc, numpy, transformers and vllm's
   transformers window, flashinfer), overlay changes, the ray chosen, each patch's
   status, and what ``plan`` says differently for the spec's serving settings.

Nothing is written unless ``out_dir`` is given; then B's base manifest (when
reconstructed), series, lock and the report go under it in the repository's layout
(``lockfiles/...``, ``patches/vllm/B/``), ready to be committed as one pull request.

Verdict (:attr:`UpgradeReport.exit_code`): 0 every patch ``applies``/``upstream`` and the
gate passes; 1 something needs review (a ``merged`` or ``conflict`` patch, a gate
rejection, an overlay that no longer resolves).
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from builder.credentials import redact_text
from builder.errors import AbiRejected, BadInput, BuildImageError, Unsatisfiable
from builder.events import SILENT, Reporter
from builder.fetch import vllm_wheel
from builder.patching import port as PO
from builder.patching import series as P
from builder.patching.probe import PROBE_ENV as PR_ENV
from builder.platforms import DEFAULT, Platform
from builder.report import render_json
from builder.resolve import lock as L
from builder.resolve import sdist
from builder.resolve.baseref import resolve_base
from builder.resolve.lockfile import load_lock, refuse_foreign_outputs
from builder.resolve.manifest import BaseManifest, load_manifest, refuse_foreign_manifest
from builder.resolve.recipe import derive, recipe_table, write_recipe_table
from builder.resolve.recipe.audit import AuditRow, changed_runs
from builder.resolve.recipe.derive import audit_derive
from builder.resolve.reconstruct import default_recipes_path, load_recipes, reconstruct
from builder.serving import plan as PL
from builder.serving import release_facts as RF
from builder.serving.release_facts import facts_from_wheel
from builder.spec import default_base_manifest, default_lock_path, load_spec
from builder.util import atomic_write_text, refuse_foreign, sweep_write_leftovers, write_target

#: base-image distributions whose move the report always shows (when either side has them)
KEY_DISTS = ("torch", "numpy", "transformers", "flashinfer-python", "triton", "nvidia-cuda-runtime", "ray", "vllm")


#: the JSON report's first key; with the text and markdown reports' first lines, what marks a report as ours
REPORT_SCHEMA = "build-image/upgrade-report/v1"
REPORT_MARKS = ("build-image upgrade: ", "## build-image upgrade: ", f'  "schema": "{REPORT_SCHEMA}"')
REPORT_EXT = {"markdown": "md", "json": "json", "text": "txt"}


# =========================================================================== data
@dataclass
class Move:
    what: str
    old: str | None
    new: str | None
    note: str = ""  # a base distribution a side's replay does not hold: why (the version is its recipe's)

    @property
    def changed(self) -> bool:
        return self.old != self.new or bool(self.note)

    def to_dict(self) -> dict:
        d = {"what": self.what, "old": self.old, "new": self.new, "changed": self.changed}
        return {**d, "note": self.note} if self.note else d


@dataclass
class LockStep:
    status: str  # written | abi-rejected | unsatisfiable
    path: str | None = None
    message: str = ""
    details: str = ""
    ray: str | None = None
    serve_backend: str | None = None
    overlay: list[str] = field(default_factory=list)
    changes: list[Move] = field(default_factory=list)  # overlay entries A's lock -> B's lock

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "path": self.path,
            "message": self.message,
            "details": self.details,
            "ray": self.ray,
            "serve_backend": self.serve_backend,
            "overlay": self.overlay,
            "changes": [c.to_dict() for c in self.changes],
        }


@dataclass
class PlatformSection:
    """Another platform's part of an upgrade (linux/arm64): B's base of that platform, its moves against A's, and
    A's overlay locked on it (the patch series and the plan are the platforms' common part)."""

    platform: str
    base_from: str
    base_to: str
    base_to_source: str  # shipped | reconstructed
    moves: list[Move]
    lock: LockStep
    base_notes: list[str] = field(default_factory=list)
    relaxed: list[str] = field(default_factory=list)

    def review(self) -> list[str]:
        out = [f"{self.platform} base: relaxed {r}" for r in self.relaxed]
        if self.lock.status != "written":
            out.append(f"{self.platform} lock: {self.lock.status}")
        return out

    def to_dict(self) -> dict:
        return {
            "platform": self.platform,
            "base": {
                "from": self.base_from,
                "to": self.base_to,
                "to_source": self.base_to_source,
                "moves": [m.to_dict() for m in self.moves],
            },
            "lock": self.lock.to_dict(),
            "base_notes": self.base_notes,
            "relaxed": self.relaxed,
        }


@dataclass
class RunChanges:
    """The RUN lines of B's target chain that A's does not have as they are, each with what the recipe reader
    concluded (installs …, harmless because …, accepted undecided, refused); ``note`` when they could not be
    compared (the sdists not at hand), said as such, never as "nothing changed"."""

    rows: list[AuditRow]
    note: str = ""

    def to_dict(self) -> dict:
        return {"changed": [a.to_json() for a in self.rows], "note": self.note}


@dataclass
class UpgradeReport:
    from_version: str
    to_version: str
    base_from: str
    base_to: str
    base_to_source: str  # shipped | given | reconstructed
    moves: list[Move]
    port: PO.PortReport
    lock: LockStep
    plan: list[Move] = field(default_factory=list)
    plan_notes: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    shipped_series: str | None = None  # a series for B already in this checkout (finished by hand)
    # what B's reconstructed base knowingly approximates: relaxations, pins no reachable index served,
    # indexes that did not answer, RUN lines accepted undecided (the manifest's lacks)
    base_notes: list[str] = field(default_factory=list)
    relaxed: list[str] = field(default_factory=list)
    platforms: list[PlatformSection] = field(default_factory=list)  # --platform: each other platform's part
    # B not yet published (build files from a checkout past its tag): the published vllm whose wheel stands in
    stand_in: str | None = None
    # the RUN lines of B's image build new or changed against A's, with the recipe reader's conclusions
    runs: RunChanges | None = None

    @property
    def review(self) -> list[str]:
        out = [f"base: relaxed {r}" for r in self.relaxed]
        if self.stand_in:
            out.append(f"base: vllm {self.to_version} is not published; the vllm {self.stand_in} wheel stands in")
        out += [f"patch {p.name}: {p.status}" for p in self.port.patches if p.status in (PO.MERGED, PO.CONFLICT)]
        if self.lock.status != "written":
            out.append(f"lock: {self.lock.status}")
        for section in self.platforms:
            out += section.review()
        return out

    @property
    def exit_code(self) -> int:
        return 1 if self.review else 0

    def to_dict(self) -> dict:
        return {
            "schema": REPORT_SCHEMA,
            "from": self.from_version,
            "to": self.to_version,
            "exit_code": self.exit_code,
            "needs_review": self.review,
            "base": {
                "from": self.base_from,
                "to": self.base_to,
                "to_source": self.base_to_source,
                "moves": [m.to_dict() for m in self.moves],
            },
            "patches": self.port.to_dict(),
            "lock": self.lock.to_dict(),
            "plan": {"changes": [m.to_dict() for m in self.plan], "notes": self.plan_notes},
            "base_notes": self.base_notes,
            "relaxed": self.relaxed,
            **({"platforms": [p.to_dict() for p in self.platforms]} if self.platforms else {}),
            **({"runs": self.runs.to_dict()} if self.runs is not None else {}),
            "shipped_series": self.shipped_series,
            "written": self.written,
            "seconds": self.seconds,
        }


# =========================================================================== pure parts
def wheel_requirement(wheel: Path | None, name: str) -> str | None:
    """The specifier a vllm wheel's METADATA puts on ``name`` (e.g. ``>=5.16.1,<5.21.0``)."""
    if wheel is None or not Path(wheel).is_file():
        return None
    from email.parser import HeaderParser

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        if meta is None:
            return None
        msg = HeaderParser().parsestr(z.read(meta).decode("utf-8", "replace"))
    for raw in msg.get_all("Requires-Dist") or []:
        try:
            r = Requirement(raw)
        except Exception:  # noqa: BLE001 - a malformed line is not ours to judge here
            continue
        if r.name.lower() == name and (r.marker is None or "extra" not in str(r.marker)):
            return str(r.specifier) or "any"
    return None


def base_moves(
    a: BaseManifest, b: BaseManifest, *, a_wheel: Path | None = None, b_wheel: Path | None = None
) -> list[Move]:
    """Pure but for reading two wheels' METADATA: what moves in the base image from A to B."""

    def os_of(m: BaseManifest) -> str | None:
        return m.os.split(" (")[0] if m.os else None

    def listed(items) -> str | None:
        return ", ".join(sorted(items)) or None

    moves = [
        Move("python", a.python_version, b.python_version),
        Move("OS", os_of(a), os_of(b)),
        Move("glibc", a.glibc, b.glibc),
        Move("CUDA", a.cuda, b.cuda),
        Move("platform", a.platform, b.platform),
        # derived from each release's build files: the image's uv overrides, what the manifest cannot version
        Move("image uv overrides", listed(a.uv_overrides or []), listed(b.uv_overrides or [])),
        Move("unversioned in the image", listed(a.unversioned), listed(b.unversioned)),
    ]
    for name in KEY_DISTS:  # a distribution a replay leaves out: the version its recipe names, and why
        ha, hb = a.held(name), b.held(name)
        if ha is None and hb is None:
            continue
        note = "; ".join(f"{side}: {h.reason}" for side, h in (("from", ha), ("to", hb)) if h and not h.replayed)
        moves.append(Move(name, ha.text() if ha else None, hb.text() if hb else None, note))
    wa, wb = wheel_requirement(a_wheel, "transformers"), wheel_requirement(b_wheel, "transformers")
    if wa or wb:
        moves.append(Move("transformers window (vllm requires)", wa, wb))
    return moves


def lock_changes(a_entries: dict[str, str], b_entries: dict[str, str]) -> list[Move]:
    """Pure: per locked overlay distribution, A's version -> B's (added/removed as None)."""
    names = sorted(set(a_entries) | set(b_entries))
    return [Move(n, a_entries.get(n), b_entries.get(n)) for n in names if a_entries.get(n) != b_entries.get(n)]


def release_defaults(wheel: Path | None, version: str = "?") -> dict[str, str]:
    """Serving defaults the planner models, as the release's own code declares them
    (:func:`builder.serving.release_facts.facts_from_wheel`: ``CacheConfig.gpu_memory_utilization``, and
    from 0.34.0 the extensible KV cache that leaves it unset)."""
    if wheel is None or not Path(wheel).is_file():
        return {}
    try:
        f = facts_from_wheel(Path(wheel), version)
    except BadInput:
        return {}
    out = {"gpu_memory_utilization": repr(f["default_gpu_memory_utilization"])}
    if f.get("extensible_kv_cache"):
        out["gpu_memory_utilization"] = (
            f"unset: {f['default_gpu_memory_utilization']} with the extensible KV "
            f"cache, {f['non_extensible_gpu_memory_utilization']} without"
        )
    return out


# =========================================================================== rendering
def render(r: UpgradeReport, fmt: str = "text") -> str:
    if fmt == "json":
        return render_json(r.to_dict(), ensure_ascii=True)
    md = fmt == "markdown"
    out: list[str] = []
    head = f"vLLM {r.from_version} -> {r.to_version}"
    verdict = (
        "ready: every patch applies or is retired upstream, the gate passes"
        if not r.review
        else "needs review: " + "; ".join(r.review)
    )
    if md:
        out += [f"## build-image upgrade: {head}", "", f"**{verdict}**", ""]
    else:
        out += [f"build-image upgrade: {head}", f"  verdict: {verdict}"]
    out += _base_lines(r, md)
    out += _run_lines(r, md)
    # lock
    lk = r.lock
    if md:
        out += ["", "### Overlay lock", ""]
        out.append(f"overlay `{' '.join(lk.overlay) or '-'}`: **{lk.status}**" + (f" ({lk.path})" if lk.path else ""))
        if lk.ray:
            out.append(f"\nray: {lk.ray}; serve backend: {lk.serve_backend}")
        if lk.changes:
            out += ["", "| package | " + r.from_version + " | " + r.to_version + " |", "| --- | --- | --- |"]
            out += [f"| {c.what} | {c.old or '(new)'} | {c.new or '(removed)'} |" for c in lk.changes]
        if lk.message and lk.status != "written":
            out += ["", "```", lk.message, *(lk.details.splitlines()[:40]), "```"]
    else:
        out.append(f"  lock ({' '.join(lk.overlay) or '-'}): {lk.status}" + (f" -> {lk.path}" if lk.path else ""))
        if lk.ray:
            out.append(f"    ray: {lk.ray}; serve backend: {lk.serve_backend}")
        out += [f"    {c.what:38} {c.old or '(new)'} -> {c.new or '(removed)'}" for c in lk.changes]
        if lk.message and lk.status != "written":
            out += ["    " + ln for ln in (lk.message + "\n" + lk.details).strip().splitlines()[:40]]
    # patches
    if md:
        out += ["", PO.render(r.port, "markdown").rstrip()]
    else:
        out += ["  " + ln for ln in PO.render(r.port, "text").rstrip().splitlines()]
    if r.shipped_series:
        note = (
            f"A series for {r.to_version} already ships in this checkout ({r.shipped_series}); its patches' "
            f"Ported-From headers say what was finished by hand. Check it with "
            f"`build-image patch check --vllm {r.to_version} --probe`."
        )
        out += ["", note] if md else ["  " + note]
    # plan
    if md:
        out += ["", "### Plan", ""]
        if r.plan:
            out += ["| | " + r.from_version + " | " + r.to_version + " |", "| --- | --- | --- |"]
            out += [f"| {m.what} | {m.old} | {m.new} |" for m in r.plan]
        out += [f"- {n}" for n in r.plan_notes]
    else:
        out.append("  plan:")
        out += [f"    {m.what:38} {m.old} -> {m.new}" for m in r.plan]
        out += [f"    {n}" for n in r.plan_notes]
    for section in r.platforms:
        out += render_platform(section, r.from_version, r.to_version, md)
    if r.written:
        out += (
            (["", "### Written", ""] + [f"- `{w}`" for w in r.written])
            if md
            else ["  written:"] + [f"    {w}" for w in r.written]
        )
    return "\n".join(out) + "\n"


def _base_lines(r: UpgradeReport, md: bool) -> list[str]:
    """The report's base part: the moves (a left-out distribution with its recipe's version and why), what
    the reconstructed base approximates."""
    out: list[str] = []
    changed = [m for m in r.moves if m.changed]
    if md:
        out += [
            "### Base image",
            "",
            f"`{r.base_from}` -> `{r.base_to}` ({r.base_to_source})",
            "",
            "| | " + r.from_version + " | " + r.to_version + " |",
            "| --- | --- | --- |",
        ]
        out += [
            f"| {'**' + m.what + '**' if m.changed else m.what} | {m.old or '-'} | {m.new or '-'}"
            + (f" ({m.note})" if m.note else "")
            + " |"
            for m in r.moves
        ]
    else:
        out.append(f"  base: {r.base_from} -> {r.base_to} ({r.base_to_source})")
        out += [
            f"    {m.what:38} {m.old or '-'} -> {m.new or '-'}" + (f"\n      not replayed: {m.note}" if m.note else "")
            for m in changed
        ]
        same = [m.what for m in r.moves if not m.changed]
        if same:
            out.append(f"    unchanged: {', '.join(same)}")
    if r.base_notes:
        title = f"What the reconstructed {r.to_version} base approximates (its manifest's lacks)"
        out += (
            (["", f"#### {title}", ""] + [f"- {n}" for n in r.base_notes])
            if md
            else [f"    {title}:"] + [f"      - {n}" for n in r.base_notes]
        )
    return out


def _run_lines(r: UpgradeReport, md: bool) -> list[str]:
    """The report's part on B's image build: the RUN lines new or changed against A's, with the recipe
    reader's conclusions, or why they were not compared (pure)."""
    if r.runs is None:
        return []
    title = f"RUN lines of the {r.to_version} image build new or changed since {r.from_version}"
    # markdown: a heading and a list (code in backticks); text: indented lines
    head, row, run, cmd = (
        ("", "- `{}`: {}", "  - `RUN {}`", "  - `{}`: `{}` → {}")
        if md
        else ("    ", "    {}: {}", "      RUN {}", "        {}: {}  -> {}")
    )
    out = ["", f"### {title}", ""] if md else [f"  {title}:"]
    if r.runs.note:
        out.append(f"{head}not compared: {r.runs.note}")
    elif not r.runs.rows:
        out.append(f"{head}none: every RUN line of the target chain reads as it did")
    for a in r.runs.rows:
        out.append(row.format(a.where, a.conclusion))
        out.append(run.format(" ".join(a.text.split())[: 200 if md else 160]))
        out += [cmd.format(c.where, c.command[:100], c.conclusion) for c in a.commands]
    return out


def run_changes(
    from_version: str, to_version: str, b_files=None, *, accept_undecided: tuple[str, ...] = (), offline: bool = False
) -> RunChanges:
    """The RUN lines of B's target chain (its sdist, or the --sdist/--source build files) new or changed
    against A's, each with the reader's conclusion; read to the end (a refused line is a row, not an error).
    Where a release's build files cannot be had (offline, no sdist on the index), the note says so."""
    if offline:
        return RunChanges([], "--no-index: the releases' sdists were not fetched")
    tables = load_recipes()
    try:
        a_files = sdist.load(from_version, sha256=(tables.get(from_version) or {}).get("sdist_sha256"))
        b_files = b_files or sdist.load(to_version, sha256=(tables.get(to_version) or {}).get("sdist_sha256"))
        _, a_rows = audit_derive(a_files, keep_going=True)
        _, b_rows = audit_derive(b_files, accept_undecided=accept_undecided, keep_going=True)
    except BuildImageError as exc:
        return RunChanges([], redact_text(" ".join(exc.message.split()))[:300])
    return RunChanges(changed_runs(a_rows, b_rows, a_files.vllm, b_files.vllm))


def render_platform(p: PlatformSection, a: str, b: str, md: bool) -> list[str]:
    """Another platform's base moves and overlay lock, as the report's lines (pure)."""
    changed = [m for m in p.moves if m.changed]
    lk = p.lock
    lock_line = f"overlay {' '.join(lk.overlay) or '-'}: {lk.status}" + (f" ({lk.path})" if lk.path else "")
    if md:
        out = [
            "",
            f"### {p.platform}",
            "",
            f"`{p.base_from}` -> `{p.base_to}` ({p.base_to_source})",
            "",
            "| | " + a + " | " + b + " |",
            "| --- | --- | --- |",
        ]
        out += [f"| **{m.what}** | {m.old or '-'} | {m.new or '-'} |" for m in changed]
        out += ["", lock_line + (f"; ray {lk.ray}, serve backend {lk.serve_backend}" if lk.ray else "")]
        out += [f"- {c.what}: {c.old or '(new)'} -> {c.new or '(removed)'}" for c in lk.changes]
        out += [f"- base: {n}" for n in p.base_notes]
        if lk.message and lk.status != "written":
            out += ["", "```", lk.message, *(lk.details.splitlines()[:40]), "```"]
        return out
    out = [f"  {p.platform}: base {p.base_from} -> {p.base_to} ({p.base_to_source})"]
    out += [f"    {m.what:38} {m.old or '-'} -> {m.new or '-'}" for m in changed]
    out.append(f"    lock ({lock_line})" + (f"; ray {lk.ray}, serve backend {lk.serve_backend}" if lk.ray else ""))
    out += [f"      {c.what:36} {c.old or '(new)'} -> {c.new or '(removed)'}" for c in lk.changes]
    out += [f"    base: {n}" for n in p.base_notes]
    if lk.message and lk.status != "written":
        out += ["    " + ln for ln in (lk.message + "\n" + lk.details).strip().splitlines()[:40]]
    return out


# =========================================================================== outputs
def report_path(out_dir: str | Path, from_version: str, to_version: str, fmt: str) -> Path:
    return Path(out_dir) / f"upgrade-{from_version}-{to_version}.{REPORT_EXT[fmt]}"


def b_lock_path(out_dir: str | Path, to_version: str, platform: Platform = DEFAULT) -> Path:
    folder = Path(out_dir) / "lockfiles" / f"vllm-{to_version}"
    return (folder if platform.is_default else folder / platform.slug) / "requirements.lock"


def check_outputs(
    out_dir: str | Path,
    from_version: str,
    to_version: str,
    fmt: str,
    *,
    base_to: str | None = None,
    force: bool = False,
    platforms: tuple[Platform, ...] = (),
    local: bool = False,
) -> None:
    """The output rule for ``-o DIR``, applied before any work (nothing is written when it refuses): the
    report, B's lock and its pylock twin, and B's base manifest when it is reconstructed (no ``base_to``,
    none shipped) are each either absent, a file
    of that kind build-image wrote (symlinks are written through), or replaced only with ``force``; a device
    node, FIFO, socket or directory in their place is refused even then (BadInput, exit 2).  What a killed
    run left beside the report (``.NAME.<pid>-<start>.<random>.tmp``) is swept.  B's series folder under
    ``DIR/patches/`` is refused when it holds a series build-image did not port (``refuse_foreign_series``).
    ``local``: B's build files are given (--sdist/--source), so B's manifests are reconstructed into DIR."""
    report = report_path(out_dir, from_version, to_version, fmt)
    write_target(report)
    refuse_foreign(report, "upgrade report", force=force, marks=REPORT_MARKS)
    for series_out in sorted((Path(out_dir) / "patches").glob(f"*/{to_version}")):  # B's ported series
        PO.refuse_foreign_series(series_out, force=force)
    refuse_foreign_outputs(b_lock_path(out_dir, to_version), force)
    shipped = default_base_manifest(to_version)
    if base_to is None and (local or not shipped.is_file()):  # B's manifest is reconstructed into DIR
        refuse_foreign_manifest(Path(out_dir) / "lockfiles" / "base" / shipped.name, force=force)
    for p in platforms:  # each other platform's lock and reconstructed manifest
        if p.is_default:
            continue
        refuse_foreign_outputs(b_lock_path(out_dir, to_version, p), force)
        theirs = default_base_manifest(to_version, p)
        if local or not theirs.is_file():
            refuse_foreign_manifest(Path(out_dir) / "lockfiles" / "base" / theirs.name, force=force)
    sweep_write_leftovers(report)


def write_report(path: Path, text: str) -> None:
    """The report file: redacted like stdout (:func:`builder.credentials.redact_text`), written atomically."""
    atomic_write_text(path, redact_text(text))


# =========================================================================== the command's job
@dataclass
class BaseB:
    """B's base manifest and where it came from; a reconstruction brings its recipe and what it lacks."""

    path: Path
    source: str  # shipped | given | reconstructed
    recipe: object | None = None
    notes: list[str] = field(default_factory=list)
    relaxed: list[str] = field(default_factory=list)


# The most relaxations upgrade adds on its own before it gives up (each is one missing distribution).
MAX_AUTO_RELAX = 6


def _base_for(
    version: str,
    given: str | None,
    out_dir: Path | None,
    scratch: Path,
    reporter: Reporter,
    *,
    relax: tuple[str, ...] = (),
    auto_relax: bool = True,
    accept_undecided: tuple[str, ...] = (),
    platform: Platform = DEFAULT,
    files=None,
) -> BaseB:
    """B's base: ``given`` (--base-to), else the shipped one, else reconstructed from the release's sdist;
    with ``files`` (--sdist/--source: B's build files) always reconstructed from them."""
    if given:
        p = Path(given)
        if not p.is_file():
            raise BadInput(f"base manifest {p} does not exist.")
        return BaseB(p, "given")
    shipped = default_base_manifest(version, platform)
    if shipped.is_file() and files is None:
        return BaseB(shipped, "shipped")
    reporter.step(
        f"reconstructing the {platform.name} base manifest of vllm {version}: its recipe derived from "
        f"{files.sdist.filename if files is not None else 'its sdist'}, the install steps replayed"
    )
    rec = reconstruct(
        version,
        reporter=reporter,
        recorded_only=False,
        relax=tuple(relax),
        accept_undecided=accept_undecided,
        auto_relax=MAX_AUTO_RELAX if auto_relax else 0,
        platform=platform,
        recipe=None if files is None else derive(files, accept_undecided=accept_undecided, platform=platform),
        files=files,
    )
    dest = (out_dir / "lockfiles" / "base" / shipped.name) if out_dir else scratch / shipped.name
    atomic_write_text(dest, rec.manifest.to_json())
    lacks = rec.manifest.lacks or {}
    notes = [f"relaxed: {x}" for x in lacks.get("relaxed", [])]
    notes += [f"approximated: {x}" for x in lacks.get("approximated", [])]
    notes += [f"index: {x}" for x in lacks.get("other_indexes", []) if ": asked (" not in x]
    notes += [f"undecided: {x}" for x in lacks.get("undecided", [])]
    if files is not None:
        said = "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in files.sdist.detail if k != "commit")
        notes.append(f"build files: {files.sdist.filename}" + (f" ({said})" if said else ""))
        if files.wheel:
            notes.append(
                f"stand-in: vllm {version} is not published; the vllm {files.wheel} wheel stands in for it in "
                "the base and the lock (run upgrade again once the release is out)"
            )
    if rec.manifest.consistency and rec.manifest.consistency.get("problems"):
        notes += [
            f"the base's own dependency problem (allowed at build): {p}" for p in rec.manifest.consistency["problems"]
        ]
    return BaseB(
        dest,
        "reconstructed",
        rec.recipe,
        notes,
        [
            f"{r} (added by upgrade: what it needs is on no index the replay can ask)"
            if r in rec.auto_relaxed
            else f"{r} (--relax)"
            for r in rec.relaxed
        ],
    )


def b_probe_env(a_text: str, a_version: str, b_version: str, transformers: str | None) -> str:
    """B's probe-env.txt from A's (pure): the probes run with the transformers B's base image holds; the
    header names B.  Without a transformers version (a base that lacks it) A's pins stay, and say so."""
    out = []
    a_tf = next((m.group(1) for m in re.finditer(r"^transformers\s*==\s*(\S+)", a_text, re.M)), None)
    for line in a_text.splitlines():
        if line.startswith("#"):
            line = line.replace(f"vllm {a_version}", f"vllm {b_version}")
            if a_tf and transformers:
                line = line.replace(f"({a_tf}:", f"({transformers}:")
        elif transformers and re.match(r"^transformers\s*==", line):
            line = f"transformers=={transformers}"
        out.append(line)
    if transformers:
        out[0:0] = [
            f"# written by `build-image upgrade --to {b_version}`: A's ({a_version}) environment with the "
            f"transformers of {b_version}'s base ({transformers})"
        ]
    else:
        out[0:0] = [
            f"# written by `build-image upgrade --to {b_version}`: A's ({a_version}) environment as it is "
            f"(the base of {b_version} names no transformers)"
        ]
    return "\n".join(out) + "\n"


def write_b_recipe_table(out: Path, recipe, platform: Platform = DEFAULT) -> Path:
    """B's table in DIR/lockfiles/base/recipes.toml (recipes-linux-arm64.toml for that platform; the repository's
    generated recipes file when DIR is the checkout): an existing recipes file gets B's table added; a new one
    starts from the shipped tables, so that DIR's lockfiles/ is complete (the output rule and lock of
    :func:`write_recipe_table`)."""
    shipped = default_recipes_path(platform)
    return write_recipe_table(
        out / "lockfiles" / "base" / shipped.name,
        recipe.vllm,
        recipe_table(recipe),
        seed=load_recipes(shipped, platform) if shipped.is_file() else {},
        platform=platform,
    )


def _entries(lock) -> dict[str, str]:
    return {e.name: e.version for e in lock.entries}


@dataclass(frozen=True)
class UpgradeRequest:
    """What ``upgrade`` was asked to do, built once by the command from its flags: releases A and B, their inputs
    as given (None: the shipped or downloaded one), the overlay, how B's base may be reconstructed, and -o."""

    from_version: str
    to_version: str
    series_dir: str | None = None  # A's patch series
    from_wheel: str | None = None  # A's and B's vllm wheels or package trees
    to_wheel: str | None = None
    base_from: str | None = None  # A's and B's base manifests
    base_to: str | None = None
    lock_from: str | None = None  # A's lock, whose overlay is re-locked
    with_: tuple[str, ...] = ()  # overlay requirements replacing the lock's
    default_overlay: bool | None = None  # None: as A's overlay has it
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    spec_path: str | None = None  # whose [serving] settings are planned on both releases
    out_dir: str | None = None  # -o: nothing is written without it
    probe_python: str | None = None
    relax: tuple[str, ...] = ()
    auto_relax: bool = True
    accept_undecided: tuple[str, ...] = ()
    platforms: tuple[Platform, ...] = ()  # each other platform gets its own section
    b_files: object | None = None  # B's build files (--sdist/--source), or None

    @property
    def out(self) -> Path | None:
        return Path(self.out_dir) if self.out_dir else None

    @property
    def stand_in(self) -> str | None:
        """The published vllm whose wheel stands in for B's own in B's base (B's build files from a checkout
        past its last tag), or None."""
        return (self.b_files.wheel or None) if self.b_files is not None else None


def upgrade(req: UpgradeRequest, reporter: Reporter = SILENT) -> UpgradeReport:
    """The four stages (the module doc) on ``req``; the scratch folder goes with the run."""
    for p in req.platforms:  # before any work: each other platform needs A's base of that platform
        if not p.is_default:
            _platform_base_from(req.from_version, p)
    timings: dict[str, float] = {}
    scratch = Path(tempfile.mkdtemp(prefix="build-image-upgrade-"))
    written: list[str] = []
    try:
        t0 = time.monotonic()
        a_path, b = _bases(req, scratch, written, reporter)
        a_base, b_base = load_manifest(a_path), load_manifest(b.path)
        timings["bases"] = time.monotonic() - t0
        t0 = time.monotonic()
        series, report, a_src, b_src = _port(req, b_base, written, reporter)
        timings["port"] = time.monotonic() - t0
        moves = base_moves(
            a_base, b_base, a_wheel=a_src if a_src.is_file() else None, b_wheel=b_src if b_src.is_file() else None
        )
        t0 = time.monotonic()
        step = _lock_on_b(req, b.path, scratch, written, reporter)
        timings["lock"] = time.monotonic() - t0
        plan_moves, plan_notes = _plan_diff(req.spec_path, a_src, b_src, req.from_version, req.to_version)
        t0 = time.monotonic()
        sections = [_platform_section(req, p, scratch, written, reporter) for p in req.platforms if not p.is_default]
        if sections:
            timings["platforms"] = time.monotonic() - t0
        rep = UpgradeReport(
            req.from_version,
            req.to_version,
            str(a_path),
            str(b.path),
            b.source,
            moves,
            report,
            step,
            plan_moves,
            plan_notes,
            written,
            {k: round(v, 2) for k, v in timings.items()},
            base_notes=b.notes,
            relaxed=b.relaxed,
            platforms=sections,
            stand_in=req.stand_in,
            runs=run_changes(
                req.from_version,
                req.to_version,
                req.b_files,
                accept_undecided=req.accept_undecided,
                offline=bool(req.no_index),
            ),
        )
        rep.shipped_series = _shipped_series(req.to_version, series.package)
        return rep
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _shipped_series(version: str, package: str) -> str | None:
    """The series for ``version`` already in this checkout, or None."""
    try:
        return str(P.series_dir_for(version, package))
    except BadInput:
        return None


def _base_b(req: UpgradeRequest, scratch: Path, reporter: Reporter, platform: Platform = DEFAULT) -> BaseB:
    """B's base of ``platform`` (--base-to is the default platform's), reconstructed as ``req`` allows."""
    return _base_for(
        req.to_version,
        req.base_to if platform.is_default else None,
        req.out,
        scratch,
        reporter,
        relax=req.relax,
        auto_relax=req.auto_relax,
        accept_undecided=req.accept_undecided,
        platform=platform,
        files=req.b_files,
    )


def _bases(req: UpgradeRequest, scratch: Path, written: list[str], reporter: Reporter) -> tuple[Path, BaseB]:
    """Stage 1: A's base manifest and B's (B's reconstruction written with its recipes table under -o)."""
    a_path = _base_for(req.from_version, req.base_from, None, scratch, SILENT).path
    if not a_path.is_file():
        raise BadInput(f"no base manifest for vllm {req.from_version} ({a_path}); pass --base-from MANIFEST.")
    b = _base_b(req, scratch, reporter)
    if b.source == "reconstructed" and req.out:
        written.append(str(b.path))
        written.append(str(write_b_recipe_table(req.out, b.recipe)))
    return a_path, b


def _port(req: UpgradeRequest, b_base: BaseManifest, written: list[str], reporter: Reporter):
    """Stage 2: A's series ported onto B's code (under -o: B's series with its probe-env.txt, and B's release
    facts).  Returns the series, the port report and A's and B's vllm (wheel or tree)."""
    series = P.load_series(req.series_dir or P.series_dir_for(req.from_version), req.from_version)
    a_src = (
        Path(req.from_wheel) if req.from_wheel else vllm_wheel(req.from_version, series.wheel_sha256, reporter=SILENT)
    )
    b_src = Path(req.to_wheel) if req.to_wheel else vllm_wheel(req.to_version, reporter=SILENT)
    out = req.out
    series_out = out / "patches" / series.package / req.to_version if out else None
    a_env = series.dir / PR_ENV
    if series_out is not None and a_env.is_file() and not (series_out / PR_ENV).is_file():
        tf = b_base.get("transformers")
        series_out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(
            series_out / PR_ENV,
            b_probe_env(
                a_env.read_text(encoding="utf-8"), req.from_version, req.to_version, tf.version if tf else None
            ),
        )
    report = PO.port(
        series, a_src, b_src, req.to_version, out_dir=series_out, probe_python=req.probe_python, reporter=reporter
    )
    if series_out:
        written.append(str(series_out))
    if out and b_src.is_file():
        facts = RF.facts_from_wheel(b_src, req.to_version)
        written.append(str(RF.write_entry(out / "lockfiles" / "release-facts.json", req.to_version, facts)))
    return series, report, a_src, b_src


def _lock_on_b(
    req: UpgradeRequest,
    b_path: Path,
    scratch: Path,
    written: list[str],
    reporter: Reporter,
    platform: Platform = DEFAULT,
) -> LockStep:
    """A's overlay (its lock's, or ``req.with_``) locked on B's base; a lock the gate rejects or
    that cannot be resolved is a step with that status, not an error.  The vllm B's base holds is
    ``req.stand_in`` when that is given (a published wheel standing in for an unreleased B's).  An explicit
    --lock is the default platform's lock: another platform's overlay comes from its own lock."""
    out, vllm = req.out, req.stand_in or req.to_version
    lock_from = req.lock_from if platform.is_default else None
    a_lock_path = Path(lock_from) if lock_from else default_lock_path(req.from_version, platform)
    a_lock = load_lock(a_lock_path) if a_lock_path.is_file() else None
    overlay = list(req.with_) if req.with_ else (list(a_lock.overlay) if a_lock else [])
    default_overlay = req.default_overlay
    if default_overlay is None:
        default_overlay = L.DEFAULT_RAY in overlay or not overlay
    named = [w for w in overlay if w != L.DEFAULT_RAY]
    lock_path = b_lock_path(out, req.to_version, platform) if out else scratch / platform.slug / "requirements.lock"
    resolved = resolve_base(str(b_path), vllm, platform=platform)
    lock_req = L.request_for(
        vllm=vllm,
        base=resolved,
        with_=named,
        default_overlay=default_overlay,
        vllm_given=False,
        allow=dict(a_lock.allow_abi_change) if a_lock else {},
        find_links=list(req.find_links),
        no_index=req.no_index,
    )
    step = LockStep(status="written", overlay=list(lock_req.overlay))
    try:
        reporter.step(f"locking {' '.join(lock_req.overlay)} on {b_path.name}")
        # foreign files: check_outputs
        outcome = L.run(lock_req, lock_path, upgrade=True, force=True, reporter=reporter)
        b_lock = load_lock(outcome.path)
        step.path = str(outcome.path) if out else None
        step.ray = b_lock.header.get("ray")
        step.serve_backend = b_lock.header.get("serve-backend")
        step.changes = lock_changes(_entries(a_lock) if a_lock else {}, _entries(b_lock))
        if out:
            written.append(str(outcome.path))
    except AbiRejected as exc:
        step.status, step.message, step.details = "abi-rejected", exc.message, exc.details or ""
    except Unsatisfiable as exc:
        step.status, step.message, step.details = "unsatisfiable", exc.message, exc.details or ""
    return step


def _platform_base_from(from_version: str, platform: Platform) -> Path:
    """A's base manifest of ``platform``, or :class:`BadInput` naming the commands that make it."""
    a_path = default_base_manifest(from_version, platform)
    if not a_path.is_file():
        raise BadInput(
            f"--platform {platform.name}: there is no {platform.name} base manifest for vllm {from_version} "
            f"({a_path}) to upgrade from.",
            hint=f"`build-image base reconstruct --vllm {from_version} --platform {platform.name}` and "
            f"`build-image lock --vllm {from_version} --platform {platform.name}` first.",
        )
    return a_path


def _platform_section(
    req: UpgradeRequest, platform: Platform, scratch: Path, written: list[str], reporter: Reporter
) -> PlatformSection:
    """Another platform's part: A's and B's bases of ``platform`` (B's reconstructed from the release's step for
    that platform when none is shipped, written with its recipes table under -o), their moves, and A's overlay of
    that platform locked on B's."""
    a_path = _platform_base_from(req.from_version, platform)
    scoped = reporter.scoped(f"{platform.name}: ")
    b = _base_b(req, scratch / platform.slug, scoped, platform)
    if b.source == "reconstructed" and req.out:
        written += [str(b.path), str(write_b_recipe_table(req.out, b.recipe, platform))]
    moves = base_moves(load_manifest(a_path), load_manifest(b.path))
    step = _lock_on_b(req, b.path, scratch, written, scoped, platform)
    return PlatformSection(
        platform=platform.name,
        base_from=str(a_path),
        base_to=str(b.path),
        base_to_source=b.source,
        moves=moves,
        lock=step,
        base_notes=b.notes,
        relaxed=b.relaxed,
    )


def _plan_diff(spec_path, a_src: Path, b_src: Path, a: str, b: str) -> tuple[list[Move], list[str]]:
    """What ``plan`` says differently on B for the spec's serving settings.

    The planner models one allocator; what a release changes for it is the defaults it
    assumes where the spec is silent.  Those are read from each release's code; with a
    spec naming a model, the plan is made with each release's defaults and compared."""
    da = release_defaults(a_src if a_src.is_file() else None, a)
    db = release_defaults(b_src if b_src.is_file() else None, b)
    moves = [Move(f"vLLM default {k}", da.get(k), db.get(k)) for k in sorted(set(da) | set(db))]
    notes: list[str] = []
    if not da and not db:
        notes.append("the releases' serving defaults could not be read (no wheels): plan compared on the spec only.")
    if not spec_path:
        notes.append(
            "no --spec: no serving settings to plan (pass --spec FILE with a [serving] table naming the model)."
        )
        return [m for m in moves if m.changed] or moves, notes

    serving = load_spec(spec_path).serving
    if not serving.model:
        notes.append(f"{spec_path}: [serving] names no model: nothing to plan.")
        return moves, notes
    plan = PL.plan_from_model_dir(serving.model, serving).to_dict()
    keys = [
        k
        for k in ("verdict", "kv_tokens_per_gpu", "max_concurrency", "available_kv_bytes", "headroom_bytes")
        if k in plan
    ]
    notes.append(
        "plan for the spec's serving settings (the planner models one allocator; the only "
        "release-specific inputs it has are the defaults above): " + ", ".join(f"{k}={plan[k]}" for k in keys)
    )
    if util_default_moved := next((m for m in moves if m.what.endswith("gpu_memory_utilization") and m.changed), None):
        notes.append(
            f"vLLM's default gpu_memory_utilization moves {util_default_moved.old} -> "
            f"{util_default_moved.new}; the spec sets {serving.gpu_memory_utilization} explicitly."
        )
    return moves, notes
    plans = {}
    for ver, d in ((a, da), (b, db)):
        util = serving.gpu_memory_utilization
        if util is None and "gpu_memory_utilization" in d:
            util = float(d["gpu_memory_utilization"])
        import dataclasses

        s = dataclasses.replace(
            serving, gpu_memory_utilization=util if util is not None else PL.VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
        )
        plans[ver] = PL.plan_from_model_dir(serving.model, s).to_dict()
    pa, pb = plans[a], plans[b]
    for k in sorted(set(pa) | set(pb)):
        if isinstance(pa.get(k), (int, float, str, bool)) and pa.get(k) != pb.get(k):
            moves.append(Move(f"plan {k}", str(pa.get(k)), str(pb.get(k))))
    if all(not m.changed for m in moves):
        notes.append("the plan for the spec's serving settings is the same on both releases.")
    return moves, notes
