"""Reconstruct a release's base manifest by replaying its image's install steps (when the image cannot be pulled).

The recipe (:mod:`builder.resolve.recipe`) is derived from the release's own build files in its
sdist; ``lockfiles/base/recipes.toml`` is that derivation's generated record.  :func:`reconstruct`:

1. derives the recipe from the cached, sha256-verified sdist and requires it to equal the
   release's table in recipes.toml (a stale table is :class:`BadInput`: regenerate it);
2. takes the exclude-newer instant from the index: the upload time of the vllm X wheel for the
   recipe's platform, rounded up to the next second (:func:`release_instant`);
3. replays the recipe's steps in order into one ``--target`` tree (:func:`plan_step` decides each
   step's arguments from what the earlier steps installed; ``uv pip install --target`` keeps what
   satisfies a step and moves what does not, as ``uv pip install --system`` does in the image);
   steps that take wheels from another index or build from source are skipped and listed;
4. scans the tree (:func:`builder.resolve.base.snapshot_site_packages`) and returns the manifest with
   its provenance: the sdist, every step with what it moved, and what the manifest knowingly lacks.

Pure parts: :func:`plan_step`, :func:`installed_in`, :func:`sanitized_requirements`,
:func:`provenance_text`, :func:`moved`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from builder.errors import BadInput, ExternalToolError, Unsatisfiable
from builder.events import SILENT, Reporter
from builder.platforms import DEFAULT, Platform
from builder.report import render_json
from builder.resolve import index as ix
from builder.resolve import sdist, sedit
from builder.resolve.base import snapshot_site_packages
from builder.resolve.explain import trim_derivation
from builder.resolve.index import format_time
from builder.resolve.lock import target_tags
from builder.resolve.manifest import BaseManifest, target_environment
from builder.resolve.recipe import (
    INSTALLED_RE,
    Recipe,
    Step,
    derive,
    parse_recipes,
    recipe_table,
    refuse_other_platform_tables,
    requirement_lines,
)
from builder.resolve.stepindex import (
    Relaxation,
    StepIndexes,
    explain_unsatisfiable,
    is_python_index,
    parse_relaxations,
    plan_indexes,
    relax_file,
    relax_requirement,
)
from builder.resolve.uv import Uv, is_resolution_failure
from builder.spec import lockfiles_dir
from builder.util import atomic_write_text, cache_dir, canonical_name
from builder.validate import read_bounded_text


def default_recipes_path(platform: Platform = DEFAULT) -> Path:
    """``lockfiles/base/recipes.toml`` (linux/amd64) or ``recipes-linux-arm64.toml``: one file per platform, each
    the derivation from the pipeline step that builds that platform's image."""
    return lockfiles_dir() / "base" / f"recipes{platform.file_suffix()}.toml"


def load_recipes(path: Path | None = None, platform: Platform = DEFAULT) -> dict[str, dict]:
    """``platform``'s recipe tables (its recipes file, or ``path``): a table of another platform is exit 2
    (:func:`builder.resolve.recipe.table.refuse_other_platform_tables`)."""
    p = Path(path) if path else default_recipes_path(platform)
    tables = parse_recipes(read_bounded_text(p, "recipes file"), str(p))  # a FIFO, a device: exit 2, no hang
    refuse_other_platform_tables(tables, platform, p)
    return tables


def recipe_table_for(tables: Mapping[str, dict], vllm: str, path: str = "lockfiles/base/recipes.toml") -> dict:
    if vllm not in tables:
        known = ", ".join(sorted(tables, key=Version)) or "none"
        raise BadInput(
            f"no recipe for vllm {vllm} in {path} (known: {known}).",
            hint=f"derive it from the release's sdist: `build-image base recipe --vllm {vllm} --write`.",
        )
    return tables[vllm]


def derived_recipe(
    vllm: str,
    *,
    recipes: Path | None = None,
    index=None,
    check: bool = True,
    recorded_only: bool = True,
    accept_undecided: tuple[str, ...] = (),
    platform: Platform = DEFAULT,
) -> tuple[Recipe, object]:
    """(the recipe of ``platform``'s image derived from the release's sdist, its build files); with ``check``
    the release's table in the platform's recipes file must equal the derivation (``recorded_only=False``: a
    release without a table is derived from its sdist alone, as ``upgrade`` does for a release newer than the
    file)."""
    path = recipes or default_recipes_path(platform)
    sha = None
    table = None
    if check:
        tables = load_recipes(path, platform)
        if recorded_only or vllm in tables:
            table = recipe_table_for(tables, vllm, str(path))
            sha = table.get("sdist_sha256")
    files = sdist.load(vllm, sha256=sha, index=index)
    recipe = derive(files, accept_undecided=accept_undecided, platform=platform)
    if table is not None and recipe_table(recipe) != table:
        raise BadInput(
            f"{path}: the table of vllm {vllm} differs from what its sdist {recipe.sdist.filename} says.",
            hint=f"the file is generated: `build-image base recipe --vllm {vllm} --write`.",
        )
    return recipe, files


def release_instant(index, vllm: str, python: str, platform: str) -> tuple[datetime, str]:
    """(the vllm wheel's upload time, the exclude-newer instant: the next whole second after it)."""
    tags = set(target_tags(python, "cp" + python.replace(".", ""), platform))
    want = Version(vllm)
    files = [
        f
        for f in index.files("vllm")
        if f.version == want and f.filename.endswith(".whl") and not tags.isdisjoint(f.tags)
    ]
    if not files:
        raise Unsatisfiable(f"the index has no vllm {vllm} wheel for {platform} (Python {python}).")
    times = [f.upload_time for f in files if f.upload_time is not None]
    if not times:
        raise BadInput(
            f"the index reports no upload time for the vllm {vllm} wheel "
            f"({files[0].filename}); the exclude-newer instant cannot be derived."
        )
    t = max(times)
    after = t.replace(microsecond=0) + timedelta(seconds=1)  # uv excludes a file uploaded at the instant itself
    return t, format_time(after)


# --------------------------------------------------------------------------- pure planning
_INDEX_OPTION = re.compile(r"^\s*(--extra-index-url|--index-url|-i|--find-links|-f|--trusted-host)\b")
_INSTALLED_MARK = INSTALLED_RE


def sanitized_requirements(text: str) -> str:
    """A requirements file without its index options (the replay resolves from the one index) (pure)."""
    return "".join(
        ("# (index option kept in the recipe) " + ln) if _INDEX_OPTION.match(ln) else ln
        for ln in text.splitlines(keepends=True)
    )


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;,]+)\s*(;.*)?$")
_FILE_INDEX = re.compile(r"^\s*(--extra-index-url|--index-url|-i)[\s=]+(\S+)")


def _pins_of(files: Mapping[str, str], paths: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """``==`` pins of requirement files and their includes: (canonical name, version, "file:line") (pure)."""
    return [
        (canonical_name(m.group(1)), m.group(3), f"{p}:{i}")
        for p, i, body in requirement_lines(files, paths)
        for m in [_PIN.match(body)]
        if m
    ]


def pinned_in_index_files(files: Mapping[str, str], paths: tuple[str, ...]) -> list[tuple[str, str, str, str]]:
    """``==`` pins of the requirement files (and their includes) that carry an index option of their own:
    (canonical name, version, "file:line", the file's index) (pure).  Such a pin may exist only on that index."""

    def index_of(f: str) -> str | None:
        return next((m.group(2) for ln in files[f].splitlines() for m in [_FILE_INDEX.match(ln)] if m), None)

    return [
        (name, version, where, idx)
        for name, version, where in _pins_of(files, paths)
        if (idx := index_of(where.rpartition(":")[0]))
    ]


def drop_lines(text: str, lines: set[int], why: str) -> str:
    """``text`` with the given 1-based lines commented out (pure)."""
    return "".join((f"# ({why}) " + ln) if i in lines else ln for i, ln in enumerate(text.splitlines(keepends=True), 1))


def installed_in(target: Path) -> dict[str, str]:
    """Canonical name → version of the distributions in a tree (its ``*.dist-info`` folders)."""
    out: dict[str, str] = {}
    if target.is_dir():
        for d in target.glob("*.dist-info"):
            m = re.match(r"^(.+)-([^-]+)\.dist-info$", d.name)
            if m:
                out[canonical_name(m.group(1))] = m.group(2)
    return out


def unmet_requirements(requires: Mapping[str, tuple[str, list[str]]], env: Mapping[str, str]) -> list[str]:
    """What the tree's own distributions require and the tree does not satisfy (pure): ``requires`` maps a
    canonical name to (its version, its Requires-Dist lines); markers are evaluated for ``env`` (no extras)."""
    versions = {k: v for k, (v, _r) in requires.items()}
    out = []
    for key in sorted(requires):
        version, lines = requires[key]
        for line in lines:
            try:
                r = Requirement(line)
            except InvalidRequirement:
                continue
            if r.marker is not None and not r.marker.evaluate(dict(env)):
                continue
            have = versions.get(canonical_name(r.name))
            if have is None:
                out.append(f"{key} {version} requires {r}, which the image does not hold")
            elif r.specifier and not r.specifier.contains(have, prereleases=True):
                out.append(f"{key} {version} requires {r}, the image holds {canonical_name(r.name)} {have}")
    return out


def requirements_in(target: Path) -> dict[str, tuple[str, list[str]]]:
    """Canonical name → (version, Requires-Dist lines) of the distributions in a tree (reads METADATA)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for d in target.glob("*.dist-info"):
        try:
            msg = HeaderParser().parsestr((d / "METADATA").read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if msg.get("Name") and msg.get("Version"):
            out[canonical_name(msg["Name"])] = (msg["Version"], list(msg.get_all("Requires-Dist") or []))
    return out


def moved(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, str]:
    """What one step changed: name → "old -> new", "+new" (added) or "-old" (removed) (pure)."""
    out: dict[str, str] = {}
    for n in sorted(set(before) | set(after)):
        a, b = before.get(n), after.get(n)
        if a == b:
            continue
        out[n] = f"+{b}" if a is None else f"-{a}" if b is None else f"{a} -> {b}"
    return out


@dataclass(frozen=True)
class StepPlan:
    """What the replay does for one step: ``install``, ``uninstall`` or ``skip`` (with the reason)."""

    action: str
    reason: str = ""
    requirements: tuple[str, ...] = ()
    requirement_files: tuple[str, ...] = ()
    constraint_files: tuple[str, ...] = ()
    constraint_pins: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()


_UV_FLAGS = {
    "--no-deps": ("--no-deps",),
    "--force-reinstall": ("--reinstall",),
    "--reinstall": ("--reinstall",),
    "--pre": ("--prerelease", "allow"),
    "--upgrade": ("--upgrade",),
    "-U": ("--upgrade",),
}


def plan_step(step: Step, installed: Mapping[str, str], captured: Mapping[str, str]) -> StepPlan:
    """The replay of ``step`` given what the tree holds and the versions captured for state tests (pure)."""
    if step.replay in ("off-index", "source-build"):
        return StepPlan("skip", f"{step.replay}: {step.note}")
    if (
        step.when_installed
        and canonical_name(step.when_installed) not in installed
        and canonical_name(step.when_installed) not in captured
    ):
        return StepPlan("skip", f"runs only when {step.when_installed} is installed, and it is not")
    if step.replay == "uninstall":
        names = tuple(n for n in step.requirements if canonical_name(n) in installed)
        if not names:
            return StepPlan("skip", f"none of {', '.join(step.requirements)} is installed")
        return StepPlan("uninstall", requirements=names)

    def fill(req: str) -> str:
        def one(m: re.Match) -> str:
            name = canonical_name(m.group(1))
            v = captured.get(name) or installed.get(name)
            if v is None:
                raise BadInput(
                    f"step {step.n} ({step.where}) needs the installed version of {m.group(1)}, "
                    "which no earlier step installed."
                )
            return v

        return _INSTALLED_MARK.sub(one, req)

    pins = tuple(
        f"{canonical_name(n)}=={installed[canonical_name(n)]}"
        for n in step.constrain_installed
        if canonical_name(n) in installed
    )
    flags: list[str] = []
    for f in step.flags:
        flags += _UV_FLAGS.get(f, ())
    return StepPlan(
        "install",
        requirements=tuple(fill(r) for r in step.requirements),
        requirement_files=step.requirement_files,
        constraint_files=step.constraint_files,
        constraint_pins=pins,
        overrides=step.overrides,
        flags=tuple(dict.fromkeys(flags)),
    )


def install_args(
    plan: StepPlan,
    src: Path,
    work: Path,
    n: int,
    *,
    exclude_newer: str,
    index_args: list[str],
    excludes: tuple[str, ...] = (),
) -> list[str]:
    """uv arguments of an install plan; writes its pin files under ``work`` (the replay's scratch).
    ``excludes``: distributions left out of the resolution (a pin no asked index serves, a relaxation)."""
    args = ["--exclude-newer", exclude_newer, *index_args]
    if excludes:
        p = work / f"step{n}-excludes.txt"
        p.write_text("\n".join(excludes) + "\n", encoding="utf-8")
        args += ["--excludes", str(p)]
    if plan.overrides:
        p = work / f"step{n}-overrides.txt"
        p.write_text("\n".join(plan.overrides) + "\n", encoding="utf-8")
        args += ["--override", str(p)]
    if plan.constraint_pins:
        p = work / f"step{n}-installed-constraints.txt"
        p.write_text("\n".join(plan.constraint_pins) + "\n", encoding="utf-8")
        args += ["-c", str(p)]
    for c in plan.constraint_files:
        args += ["-c", str(src / c)]
    for r in plan.requirement_files:
        args += ["-r", str(src / r)]
    return args + list(plan.requirements) + list(plan.flags)


def provenance_text(
    recipe: Recipe,
    *,
    uv_version: str,
    uploaded: datetime,
    instant: str,
    day: str,
    cuda_found: str | None,
    lacks: dict | None = None,
    unmet: list[str] | None = None,
) -> str:
    """What the manifest's ``provenance.method`` says (pure)."""
    n_replayed = sum(1 for s in recipe.steps if s.replay in ("index", "uninstall"))
    lacks = lacks or recipe.lacks()
    diff = []
    if lacks["off_index"]:
        diff.append("absent, taken from outside the index: " + "; ".join(lacks["off_index"]))
    if lacks["source_builds"]:
        diff.append("absent, built from source in the image: " + "; ".join(lacks["source_builds"]))
    if lacks["other_indexes"]:
        unasked = [u.split(": ", 1)[0] for u in lacks["other_indexes"] if ": asked (" not in u]
        if unasked:
            diff.append(
                "other indexes the steps name are not asked (" + ", ".join(unasked) + "): a file only they "
                "serve, such as a +cuXYZ local build of torch, is replaced by the index's build of the same "
                "version"
            )
    if lacks.get("approximated"):
        diff.append("pins no reachable index serves are left out: " + "; ".join(lacks["approximated"]))
    if lacks.get("relaxed"):
        diff.append("relaxed by the user: " + "; ".join(lacks["relaxed"]))
    if lacks.get("undecided"):
        diff.append("RUN lines accepted undecided, replayed as nothing: " + "; ".join(lacks["undecided"]))
    diff += [
        f"OS packages ({recipe.os.value} debs: {len(lacks['os_packages'])} named by apt-get install lines) and the "
        "system Python's own files are not scanned",
        f"glibc {recipe.glibc.value} is {recipe.os.value}'s ({recipe.glibc.rule}), CUDA {recipe.cuda.value} the "
        f"build's CUDA_VERSION, not read from a libc or the image",
        f"versions are those the index served up to {instant}; a package released later on the build day would differ",
        "the image digest is unknown (null)",
    ]
    if cuda_found and cuda_found != recipe.cuda.value:
        diff.append(f"the tree's nvidia-cuda-runtime says CUDA {cuda_found}, the recipe {recipe.cuda.value}")
    if unmet:
        diff.append(
            f"not different but worth knowing: as replayed, the tree leaves {len(unmet)} requirement(s) of its "
            "own distributions unmet (a --no-deps reinstall, a later step moving a pin an earlier package "
            "needed), listed in provenance.recipe.unmet_requirements"
        )
    return (
        f"Reconstructed, not read from the image ({recipe.image} cannot be pulled here). On {day} with uv "
        f"{uv_version}: the {len(recipe.steps)} install steps of the release's docker/Dockerfile (target "
        f"{recipe.target}, build args of the pipeline step {recipe.pipeline_step.value!r}) from its sdist "
        f"{recipe.sdist.filename} (sha256 {recipe.sdist.sha256}) replayed in order into one tree "
        f"({n_replayed} resolved from the index with `uv pip install --target DIR --python-version "
        f"{recipe.python.value} --python-platform {recipe.platform} --no-build --exclude-newer {instant}`, each "
        f"step seeing what the earlier ones installed; the exclude-newer instant is the vllm "
        f"{recipe.wheel_version} wheel's upload time on the index, {uploaded.isoformat()}, rounded up), then "
        f"the binary scan of `build-image base snapshot --site-packages DIR`. Each step, its source line and "
        f"what it moved are in provenance.recipe.steps. Knowingly different from the real image: "
        + "; ".join(diff)
        + "."
    )


_DAY = re.compile(r"\bOn \d{4}-\d{2}-\d{2} with uv ")


def manifest_differences(old_json: str, new_json: str) -> list[str]:
    """What a fresh replay changes in a manifest file, one line each (pure); the replay's day in the
    provenance text is not a difference.  Distributions: added, removed, version or facts moved; any
    other field by its name."""
    old, new = json.loads(old_json), json.loads(new_json)
    for doc in (old, new):
        prov = doc.get("provenance")
        if isinstance(prov, dict) and isinstance(prov.get("method"), str):
            prov["method"] = _DAY.sub("On DAY with uv ", prov["method"])
    out: list[str] = []
    od, nd = old.pop("distributions", {}) or {}, new.pop("distributions", {}) or {}
    for key in sorted(set(od) | set(nd)):
        a, b = od.get(key), nd.get(key)
        if a is None:
            out.append(f"{key}: added {b.get('version')}")
        elif b is None:
            out.append(f"{key}: removed (was {a.get('version')})")
        elif a.get("version") != b.get("version"):
            out.append(f"{key}: {a.get('version')} -> {b.get('version')}")
        elif a != b:
            fields = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            out.append(f"{key} {a.get('version')}: {', '.join(fields)} differ")
    for k in sorted(set(old) | set(new)):
        if old.get(k) != new.get(k):
            a, b = old.get(k), new.get(k)
            if isinstance(a, dict) and isinstance(b, dict):
                out.append(f"{k}: " + ", ".join(sorted(x for x in set(a) | set(b) if a.get(x) != b.get(x))) + " differ")
            elif isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
                out.append(f"{k} differs")
            else:
                out.append(f"{k}: {a} -> {b}")
    return out


@dataclass
class Reconstruction:
    manifest: BaseManifest
    recipe: Recipe
    exclude_newer: str
    uploaded: datetime
    steps: list[dict] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    files: int = 0
    uv_steps: dict[str, int] = field(default_factory=dict)  # install steps answered offline / online
    relaxed: list[str] = field(default_factory=list)  # every relaxation the replay ran with
    auto_relaxed: list[str] = field(default_factory=list)  # those it added itself (auto_relax)


def _cuda_of(manifest: BaseManifest) -> str | None:
    for name in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"):
        d = manifest.get(name)
        if d is not None:
            parts = d.version.split(".")
            return ".".join(parts[:2]) if len(parts) >= 2 else None
    return None


def _write_sources(files, src: Path) -> None:
    for rel, text in files.files.items():
        if rel.startswith("requirements/"):
            p = src / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(sanitized_requirements(text), encoding="utf-8")


def off_index_pins(recipe: Recipe, files, index) -> list[tuple[str, str, str, str]]:
    """The pins of the steps' requirement files that the index does not serve (adapter: asks the index)."""
    out = []
    for step in recipe.steps:
        if step.replay != "index" or not step.file_indexes:
            continue
        for name, version, where, idx in pinned_in_index_files(files.files, step.requirement_files):
            try:
                want = Version(version)
            except ValueError:  # InvalidVersion, or a part past int()'s digit limit
                continue
            if not any(f.version == want for f in index.files(name)):
                out.append((name, version, where, idx))
    return list(dict.fromkeys(out))


def step_index_plans(recipe: Recipe, index_args: list[str], reachable) -> dict[int, StepIndexes]:
    """Step number → the indexes its replay asks (adapter: ``reachable`` asks each named index once)."""
    out = {}
    for step in recipe.steps:
        si = plan_indexes(step, index_args, reachable)
        if si is not None:
            out[step.n] = si
    return out


def unmatched_pins(
    recipe: Recipe, files, index, plans: Mapping[int, StepIndexes], relaxed: tuple[Relaxation, ...] = ()
) -> list[tuple[str, str, str, str]]:
    """Pins of the steps whose line names an index the replay could not reach that the replay's own index
    does not serve at that version: (name, version, "file:line", the unreachable index) (adapter: asks the
    index).  The replay leaves them out (their lines dropped, the names excluded from resolution) and the
    manifest lists them: the image holds them from the other index."""
    out = []
    dropped = {r.name for r in relaxed if r.whole}
    for step in recipe.steps:
        si = plans.get(step.n)
        if si is None or not si.unreachable:
            continue
        pins = _pins_of(files.files, step.requirement_files) + [
            (canonical_name(m.group(1)), m.group(2), str(step.where))
            for r in step.requirements
            for m in [re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;,]+)$", r)]
            if m
        ]
        for name, version, where in pins:
            if name in dropped:
                continue
            try:
                want = Version(version)
            except ValueError:  # InvalidVersion, or a part past int()'s digit limit
                continue
            if not any(f.version == want for f in index.files(name)):
                out.append((name, version, where, si.unreachable[0]))
    return list(dict.fromkeys(out))


def _edited_copy(src: Path, step: Step, rel: str) -> str:
    """The step's own copy of a requirement file with its ``sed -i`` edits applied (the image edits a
    copy of the file before the step reads it); returns its path relative to ``src``."""
    edits = [(s, e) for f, s, e, _w in step.requirement_edits if f == rel]
    if not edits:
        return rel
    text = (src / rel).read_text(encoding="utf-8")
    for script, ere in edits:
        text = sedit.apply(text, sedit.parse(script, ere=ere))
    p = Path(rel)
    out = str(p.parent / f".step{step.n}-{p.name}")
    (src / out).write_text(text, encoding="utf-8")
    return out


def replay_key(recipe: Recipe, *, uv_version: str, uv_cache: str, exclude_newer: str, index_args: list[str]) -> dict:
    """What an online replay of ``recipe`` is recorded under (pure): a later replay with the same key
    can answer from uv's cache, which then holds listings fetched after ``exclude_newer``."""
    return {
        "vllm": recipe.vllm,
        "sdist_sha256": recipe.sdist.sha256,
        "uv": uv_version,
        "uv_cache": uv_cache,
        "exclude_newer": exclude_newer,
        "index_args": list(index_args),
    }


def replayed_marker(vllm: str) -> Path:
    return cache_dir() / "reconstruct" / f"replayed-{vllm}.json"


def key_digest(key: dict) -> str:
    """The record's digest of a replay key (pure): the key holds the index options, which may carry
    credentials, so only its sha256 is written."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def replayed_online_before(key: dict) -> bool:
    """Whether an online replay with ``key`` completed before (adapter: reads the record)."""
    try:
        doc = json.loads(replayed_marker(key["vllm"]).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("key_sha256") == key_digest(key)


def record_replayed_online(key: dict) -> None:
    path = replayed_marker(key["vllm"])
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        path,
        render_json(
            {
                "vllm": key["vllm"],
                "exclude_newer": key["exclude_newer"],
                "uv": key["uv"],
                "key_sha256": key_digest(key),
            },
            sort_keys=True,
        )
        + "\n",
    )


class _Replay:
    """The state of one replay: the scratch sources (with dropped pins, relaxations and sed edits), the
    excluded names, what each step relaxed; :meth:`install` runs one install step (adapter: uv)."""

    def __init__(
        self,
        recipe: Recipe,
        files,
        target: Path,
        work: Path,
        *,
        uv,
        exclude_newer: str,
        index_args: list[str],
        reporter: Reporter,
        offline: bool,
        stats: dict,
        plans,
        unmatched,
        relaxed: list,
    ):
        self.recipe, self.files, self.target, self.work, self.uv = recipe, files, target, work, uv
        self.exclude_newer, self.index_args, self.reporter, self.offline, self.stats = (
            exclude_newer,
            index_args,
            reporter,
            offline,
            stats,
        )
        self.plans, self.unmatched, self.relaxed = plans, unmatched, relaxed
        self.src = work / "src"
        self.relaxed_done: dict[int, list[str]] = {}
        self.excludes: tuple[str, ...] = ()
        self.auto_added = 0

    def drop_pins(self, pins) -> None:
        by_file: dict[str, set[int]] = {}
        for _n, _v, where, _i in pins:
            f, _, ln = where.rpartition(":")
            if f.startswith("requirements/"):
                by_file.setdefault(f, set()).add(int(ln))
        for f, lines in by_file.items():
            p = self.src / f
            p.write_text(drop_lines(p.read_text(encoding="utf-8"), lines, "only on another index"), encoding="utf-8")

    def relax_sources(self, new: tuple[Relaxation, ...]) -> None:
        for rel in sorted(self.files.files):
            p = self.src / rel
            if rel.startswith("requirements/") and p.is_file():
                text, done = relax_file(p.read_text(encoding="utf-8"), new, rel)
                if done:
                    p.write_text(text, encoding="utf-8")
                    for step in self.recipe.steps:
                        if rel in step.requirement_files or rel in step.constraint_files:
                            self.relaxed_done.setdefault(step.n, []).extend(done)
        self.excludes = tuple(sorted({n for n, *_ in self.unmatched} | {r.name for r in self.relaxed if r.whole}))

    def prepare(self, step: Step, plan: StepPlan) -> tuple[StepPlan, list[str]]:
        """The plan with the relaxations and the step's sed edits applied, and its uv arguments."""
        reqs: list[str] = []
        for r0 in plan.requirements:
            r1, what = relax_requirement(r0, self.relaxed)
            self.relaxed_done.setdefault(step.n, []).extend(f"{w} ({step.where})" for w in what)
            if r1 is not None:
                reqs.append(r1)
        rfiles = tuple(_edited_copy(self.src, step, f) for f in plan.requirement_files)
        cfiles = tuple(_edited_copy(self.src, step, f) for f in plan.constraint_files)
        plan = replace(plan, requirements=tuple(reqs), requirement_files=rfiles, constraint_files=cfiles)
        si = self.plans.get(step.n)
        return plan, install_args(
            plan,
            self.src,
            self.work,
            step.n,
            exclude_newer=self.exclude_newer,
            index_args=si.args(self.index_args) if si else self.index_args,
            excludes=self.excludes,
        )

    def _uv_install(self, args: list[str]):
        return self.uv.pip_target(
            "install", self.target, args, python_version=self.recipe.python.value, platform=self.recipe.platform
        )[1]

    def install(self, step: Step, plan: StepPlan, rec: dict, before: Mapping[str, str], captured):
        """One install step (and the line's fallback when it does not resolve): (uv's result, plan, args)."""
        plan, args = self.prepare(step, plan)
        self.reporter.step(
            f"step {step.n} ({step.where}): install {' '.join(plan.requirements + plan.requirement_files)}"
        )
        r = None
        if self.offline:
            r = self._uv_install([*args, "--offline"])
            if r.returncode == 0:
                self.stats["offline"] += 1
            else:
                self.reporter.step(f"step {step.n}: uv's cache cannot answer it offline; asking the index")
                r = None
        if r is None:
            r = self._uv_install(args)
            self.stats["online"] += 1
        if r.returncode != 0 and step.fallback_steps and is_resolution_failure(r.stderr):
            for fb in step.fallback_steps:  # the image runs the line's `|| ...` fallback when the install fails
                fplan = plan_step(fb, before, captured)
                if fplan.action != "install":
                    continue
                fplan, fargs = self.prepare(fb, fplan)
                self.reporter.step(f"step {step.n}: the install does not resolve; replaying the line's fallback")
                r2 = self._uv_install(fargs)
                self.stats["online"] += 1
                if r2.returncode == 0:
                    rec["fallback_taken"] = True
                    return r2, fplan, fargs
        return r, plan, args

    def install_relaxing(self, step: Step, plan0: StepPlan, rec: dict, before, captured, auto_relax: int):
        """:meth:`install`, retried in place with the relaxation an unsatisfiable step names while
        ``auto_relax`` allows (uv changes nothing on a failed resolution: the earlier steps stand)."""
        si = self.plans.get(step.n)
        while True:
            r, plan, args = self.install(step, plan0, rec, before, captured)
            if r.returncode == 0 or not is_resolution_failure(r.stderr):
                return r, plan, args
            err = unsatisfiable_step(self.recipe, step, r.stderr, si, self.index_args)
            miss = getattr(err, "missing", None)
            rx = Relaxation.parse(miss.relax) if miss is not None else None
            if rx is None or self.auto_added >= auto_relax or rx in self.relaxed or (rx.whole and rx.name in before):
                raise err
            self.reporter.step(
                f"step {step.n}: {miss.distribution} is on no index the replay can ask "
                f"({miss.needed_by} needs it): replaying the step without it (--relax '{rx.text}'), "
                "for review"
            )
            self.auto_added += 1
            self.relaxed.append(rx)
            self.relax_sources((rx,))

    def run_step(self, step: Step, captured: dict[str, str], auto_relax: int) -> dict:
        """Run one of the recipe's steps into the tree (skip, uninstall or install): its record.  ``captured``
        (extended in place): the versions a step's ``when_installed`` found, which later steps keep."""
        before = installed_in(self.target)
        if step.when_installed:
            name = canonical_name(step.when_installed)
            if name in before:
                captured.setdefault(name, before[name])
        plan0 = plan_step(step, before, captured)
        rec = {"n": step.n, "from": str(step.where), "stage": step.stage, "action": plan0.action}
        if plan0.action == "skip":
            rec["reason"] = plan0.reason
            return rec
        args: list[str] = []
        if plan0.action == "uninstall":
            self.reporter.step(f"step {step.n} ({step.where}): uninstall {' '.join(plan0.requirements)}")
            _cmd, r = self.uv.pip_target("uninstall", self.target, list(plan0.requirements))
            plan = plan0
        else:
            _record_indexes(rec, self.plans.get(step.n), step, self.reporter)
            r, plan, args = self.install_relaxing(step, plan0, rec, before, captured, auto_relax)
            if self.relaxed_done.get(step.n):
                rec["relaxed"] = list(dict.fromkeys(self.relaxed_done[step.n]))
        if r.returncode != 0:
            raise ExternalToolError(
                f"uv pip {plan.action} --target (step {step.n}, {step.where}) failed "
                f"(exit {r.returncode}):\n{trim_derivation(r.stderr)}"
            )
        shown = args if plan.action == "install" else list(plan.requirements)
        rec["command"] = shown_command(plan.action, shown, self.recipe, src=self.src, work=self.work)
        if plan.overrides:
            rec["overrides"] = list(plan.overrides)
        if plan.constraint_pins:
            rec["constraints_from_installed"] = list(plan.constraint_pins)
        rec["moved"] = moved(before, installed_in(self.target))
        return rec


def replay(
    recipe: Recipe,
    files,
    target: Path,
    work: Path,
    *,
    uv,
    exclude_newer: str,
    index_args: list[str],
    reporter: Reporter = SILENT,
    absent: list[tuple[str, str, str, str]] = (),
    offline: bool = False,
    stats: dict | None = None,
    plans: Mapping[int, StepIndexes] | None = None,
    unmatched: list[tuple[str, str, str, str]] = (),
    relaxed: list[Relaxation] | None = None,
    auto_relax: int = 0,
) -> list[dict]:
    """Run the recipe's steps into ``target`` in order; the record of each (adapter: runs uv).  ``absent``:
    pins only another index serves (:func:`off_index_pins`), left out of the replayed files; ``unmatched``:
    pins of steps whose index does not answer that the replay's index does not serve, left out too.

    ``offline``: each install step first asks uv's cache only (``--offline``: no index round trips,
    the bulk of a warm replay's time) and asks the index when the cache cannot answer.  Sound only
    when the cache's listings were fetched after ``exclude_newer`` (:func:`replayed_online_before`).
    ``stats`` counts ``offline`` and ``online`` steps.

    ``relaxed`` (a list, extended in place): the user's relaxations; with ``auto_relax`` > 0, a step no
    asked index satisfies is retried in place with the relaxation its error names (up to that many in
    all), else the error is raised.  Each step run (and why it asks another index) is a step on ``reporter``."""
    stats = stats if stats is not None else {}
    stats.update(offline=0, online=0)
    rp = _Replay(
        recipe,
        files,
        target,
        work,
        uv=uv,
        exclude_newer=exclude_newer,
        index_args=index_args,
        reporter=reporter,
        offline=offline,
        stats=stats,
        plans=plans or {},
        unmatched=unmatched,
        relaxed=relaxed if relaxed is not None else [],
    )
    _write_sources(files, rp.src)
    rp.drop_pins([*absent, *unmatched])
    rp.relax_sources(tuple(rp.relaxed))
    captured: dict[str, str] = {}
    return [rp.run_step(step, captured, auto_relax) for step in recipe.steps]


def _record_indexes(rec: dict, si: StepIndexes | None, step: Step, reporter: Reporter) -> None:
    if si is not None:
        rec["indexes"] = [si.primary, *si.extras]
        if si.unreachable:
            rec["unreachable_indexes"] = list(si.unreachable)
            reporter.step(
                f"step {step.n}: {', '.join(si.unreachable)} does not answer from here; asking "
                f"{si.primary} in its place"
            )


def unsatisfiable_step(
    recipe: Recipe, step: Step, stderr: str, si: StepIndexes | None, index_args: list[str]
) -> Unsatisfiable:
    """The error of a step no asked index satisfies: what is missing, what needs it, both ways through."""
    asked = (
        [si.primary, *si.extras]
        if si
        else [
            a
            for i, a in enumerate(index_args)
            if i and index_args[i - 1] in ("--index-url", "--extra-index-url", "--find-links")
        ]
    )
    miss = explain_unsatisfiable(stderr, step)
    shown = ", ".join(asked) or "the replay's index"
    head = (
        f"step {step.n} of the vllm {recipe.vllm} image ({step.where} in {recipe.sdist.filename}) does not "
        f"resolve from {shown}"
    )
    if si is not None and si.unreachable:
        head += f" (the line also names {', '.join(si.unreachable)}, which does not answer from here)"
    ways = (
        f"take the manifest from the real image: `docker pull {recipe.image} && build-image base snapshot "
        f"--image {recipe.image} -o base.json`, then `--base base.json` (`upgrade --base-to base.json`)"
    )
    if miss is None:
        return Unsatisfiable(f"{head}:\n{trim_derivation(stderr)}", hint=ways + ".")
    err = Unsatisfiable(
        f"{head}: {miss.distribution} is on none of them; {miss.needed_by} needs it.\n{trim_derivation(stderr)}",
        hint=f"two ways through: {ways}; or replay without it: `--relax '{miss.relax}'` (the manifest's lacks "
        "and the upgrade report then say so).",
    )
    err.missing = miss
    return err


def shown_command(action: str, args: list[str], recipe: Recipe, *, src: Path, work: Path) -> str:
    """The step's uv command as the provenance shows it: scratch paths relative, the tree as DIR (pure)."""
    head = ["uv", "pip", action, "--target", "DIR"]
    if action == "install":
        head += ["--python-version", recipe.python.value, "--python-platform", recipe.platform, "--no-build"]
    rel = [a.replace(str(src) + "/", "").replace(str(work) + "/", "") for a in args]
    return shlex.join(head + rel)


def uv_index_args(find_links: list[str], no_index: bool, index_url: str | None) -> list[str]:
    """uv's index options of a replay (adapter: the default index URL from the environment)."""
    if index_url is None and not no_index:
        index_url = ix.index_url()
    args: list[str] = ["--index-url", index_url] if index_url else []
    for fl in find_links:
        args += ["--find-links", str(fl)]
    return args + (["--no-index"] if no_index else [])


def replay_from_cache_or_index(
    recipe: Recipe,
    files,
    target: Path,
    work: Path,
    *,
    uv,
    exclude_newer: str,
    index_args: list[str],
    reporter: Reporter,
    absent,
    refresh: bool,
    stats: dict,
    plans: Mapping[int, StepIndexes] | None = None,
    unmatched=(),
    relaxed: list[Relaxation] | None = None,
    auto_relax: int = 0,
) -> list[dict]:
    """:func:`replay`, answered from uv's cache when this release was replayed online with it before
    (and not ``refresh``); records the completed replay for the next one."""
    key = replay_key(
        recipe, uv_version=uv.version(), uv_cache=uv.cache_dir(), exclude_newer=exclude_newer, index_args=index_args
    )
    if plans or relaxed:  # the same release replayed with other indexes or relaxations is another replay
        key["step_indexes"] = {str(n): si.args([]) for n, si in sorted((plans or {}).items())}
        key["relaxed"] = sorted(r.text for r in relaxed or ())
    offline = not refresh and replayed_online_before(key)
    if offline:
        reporter.step(
            f"answering from uv's cache: vllm {recipe.vllm} was replayed online with it before "
            "(--refresh asks the index)"
        )
    records = replay(
        recipe,
        files,
        target,
        work,
        uv=uv,
        exclude_newer=exclude_newer,
        index_args=index_args,
        reporter=reporter,
        absent=absent,
        offline=offline,
        stats=stats,
        plans=plans,
        unmatched=unmatched,
        relaxed=relaxed,
        auto_relax=auto_relax,
    )
    if not offline:  # an offline replay found the record already there, under the same key
        record_replayed_online(key)
    return records


def index_lacks(recipe: Recipe, plans: Mapping[int, StepIndexes], records: list[dict]) -> list[str]:
    """``lacks.other_indexes`` as the replay found them (pure): each index the steps name, asked or not
    reachable from here (then the replay's own index stood in for it)."""
    named: dict[str, list[int]] = {}
    for s in recipe.steps:
        if s.replay == "index":
            for u in (*([s.index_url] if s.index_url else []), *s.extra_index_urls):
                if not is_python_index(u):
                    named.setdefault(u, []).append(s.n)
    if not plans:  # a --no-index replay (or steps that name no index): nothing else was asked
        return [
            f"{u}: not asked (the replay ran from its --find-links folders only): a file only it serves is "
            "absent, or replaced by a folder's build of the same version"
            for u in sorted(named)
        ]
    asked = {u for r in records for u in r.get("indexes", [])}
    out = []
    for u, steps in sorted(named.items()):
        where = ", ".join(f"step {n}" for n in steps)
        if u.rstrip("/") in asked:
            out.append(f"{u}: asked ({where}), in the line's order and index strategy")
        else:
            out.append(
                f"{u}: does not answer from here ({where}): the replay asked the Python index in its "
                "place; a file only it serves is absent (listed under approximated) or replaced by the "
                "Python index's build of the same version"
            )
    return out


def leave_out_unversioned(
    recipe: Recipe,
    absent,
    manifest: BaseManifest,
    unmatched=(),
    relaxed: tuple[Relaxation, ...] = (),
    auto: frozenset[str] = frozenset(),
) -> tuple[dict, dict[str, str]]:
    """The manifest's ``lacks`` and ``unversioned``: the recipe's, plus the pins only another index
    serves, the pins no reachable index served and the user's relaxations; an index build an earlier
    step installed under an unversioned name is removed from ``manifest.distributions`` (the image
    replaces it) and listed."""
    lacks = recipe.lacks()
    unversioned = recipe.unversioned_names()
    for name, version, where, idx in absent:
        lacks["off_index"].append(f"{name}=={version} ({where}; served by {idx} only, not by the index)")
        unversioned.setdefault(name, f"off-index: {name}=={version} from {idx} ({recipe.sdist.filename} {where})")
    if unmatched:
        lacks["approximated"] = [
            f"{name}=={version} ({where}): not on the Python index at that version; the step asks {idx}, which "
            "does not answer from here: left out of the replay (and of every step's resolution)"
            for name, version, where, idx in unmatched
        ]
        for name, version, where, idx in unmatched:
            unversioned.setdefault(
                name,
                f"approximated: {name}=={version} from {idx}, not reachable from here "
                f"({recipe.sdist.filename} {where})",
            )
    if relaxed:
        lacks["relaxed"] = [
            f"{r.text}: "
            + (
                "replayed without it (dropped from the steps and excluded from resolution)"
                if r.whole
                else f"replayed without its extras {', '.join(sorted(r.extras))}"
            )
            + (
                " (added by the replay: what it needs is on no index the replay can ask)"
                if r.text in auto
                else " (--relax)"
            )
            for r in relaxed
        ]
        for r in relaxed:
            if r.whole:
                unversioned.setdefault(r.name, f"relaxed: replayed without it (--relax {r.text})")
    for name in sorted(unversioned):
        d = manifest.distributions.pop(canonical_name(name), None)
        if d is not None:  # an earlier step's index build, replaced in the image by the off-index/source one
            lacks["off_index"].append(
                f"{d.name} {d.version}, which an earlier step installed from the index, "
                f"is left out: a later step replaces it ({unversioned[name]})"
            )
    return lacks, unversioned


def _scratch_tree(keep: Path | None) -> Path:
    """The folder the replay installs into: ``--keep DIR`` (empty, kept) or a scratch folder (removed after)."""
    if keep is None:
        return Path(tempfile.mkdtemp(prefix="bi-reconstruct-"))
    scratch = Path(keep)
    if scratch.exists() and any(scratch.iterdir()):
        raise BadInput(f"--keep {scratch}: the directory is not empty.")
    scratch.mkdir(parents=True, exist_ok=True)
    return scratch


@dataclass(frozen=True)
class _Release:
    """What a reconstruction replays, known before any scratch folder exists: the recipe and the sdist's
    build files, the index and uv's options for it, each step's indexes, the vllm wheel's upload time and
    the exclude-newer instant after it."""

    recipe: Recipe
    files: object
    index: object
    index_args: list[str]
    plans: Mapping[int, StepIndexes]
    uploaded: datetime
    instant: str


def reconstruct(
    vllm: str,
    *,
    recipes: Path | None = None,
    index=None,
    uv=None,
    find_links: list[str] | None = None,
    no_index: bool = False,
    index_url: str | None = None,
    keep: Path | None = None,
    reporter: Reporter = SILENT,
    recipe: Recipe | None = None,
    files=None,
    recorded_only: bool = True,
    refresh: bool = False,
    relax: tuple[str, ...] = (),
    accept_undecided: tuple[str, ...] = (),
    reachable=None,
    auto_relax: int = 0,
    platform: Platform = DEFAULT,
) -> Reconstruction:
    """Replay release ``vllm``'s install steps into a scratch tree, scan it, return the manifest (no
    output written; the cache records a completed online replay so that the next one of the same
    release, uv, uv cache and index answers from uv's cache; ``refresh`` asks the index throughout).  What it
    does (each step replayed, the scan) are steps on ``reporter``."""
    relaxed = list(parse_relaxations(relax))  # bad input before any download; the replay may add to it
    given = {r.name for r in relaxed}
    uv = uv or Uv()
    find_links = list(find_links or [])
    index = index or ix.for_request(find_links, no_index)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    if recipe is None or files is None:
        recipe, files = derived_recipe(
            vllm,
            recipes=recipes,
            index=index,
            recorded_only=recorded_only,
            accept_undecided=accept_undecided,
            platform=platform,
        )
    timings["recipe"] = time.monotonic() - t0
    index_args = uv_index_args(find_links, no_index, index_url)
    plans = step_index_plans(recipe, index_args, reachable or ix.reachable)
    t0 = time.monotonic()
    uploaded, instant = release_instant(index, recipe.wheel_version, recipe.python.value, recipe.platform)
    timings["index"] = time.monotonic() - t0
    release = _Release(recipe, files, index, index_args, plans, uploaded, instant)
    return _replay_and_scan(
        release,
        keep=keep,
        uv=uv,
        reporter=reporter,
        refresh=refresh,
        relaxed=relaxed,
        given=given,
        auto_relax=auto_relax,
        timings=timings,
    )


def _replay_and_scan(
    release: _Release,
    *,
    keep: Path | None,
    uv,
    reporter: Reporter,
    refresh: bool,
    relaxed: list[Relaxation],
    given: set[str],
    auto_relax: int,
    timings: dict[str, float],
) -> Reconstruction:
    """Replay the release's steps into the scratch tree (:func:`_scratch_tree`), scan it, describe the
    manifest; the scratch folders go after (``keep``: the tree stays).  ``given``: the user's relaxations'
    names (the others in ``relaxed`` the replay added)."""
    recipe, files, index, plans, instant = release.recipe, release.files, release.index, release.plans, release.instant
    scratch = _scratch_tree(keep)
    target = scratch / "dist-packages"
    work = Path(tempfile.mkdtemp(prefix="bi-replay-"))
    try:
        t0 = time.monotonic()
        absent = off_index_pins(recipe, files, index)
        unmatched = unmatched_pins(recipe, files, index, plans, tuple(relaxed))
        timings["index"] += time.monotonic() - t0
        t0 = time.monotonic()
        stats: dict = {}
        records = replay_from_cache_or_index(
            recipe,
            files,
            target,
            work,
            uv=uv,
            exclude_newer=instant,
            index_args=release.index_args,
            reporter=reporter,
            absent=absent,
            refresh=refresh,
            stats=stats,
            plans=plans,
            unmatched=unmatched,
            relaxed=relaxed,
            auto_relax=auto_relax,
        )
        timings["install"] = time.monotonic() - t0
        reporter.step(f"scanning {target}")
        t0 = time.monotonic()
        manifest = _scan_replayed(target, recipe)
        timings["scan"] = time.monotonic() - t0
        auto = frozenset(r.text for r in relaxed if r.name not in given)
        _describe_replayed(manifest, release, target, uv, records, absent, unmatched, relaxed, auto)
        files_n = sum(1 for _ in target.rglob("*")) if keep is not None else 0
        return Reconstruction(
            relaxed=[r.text for r in relaxed],
            auto_relaxed=sorted(auto),
            manifest=manifest,
            recipe=recipe,
            exclude_newer=instant,
            uploaded=release.uploaded,
            steps=records,
            timings=timings,
            files=files_n,
            uv_steps=stats,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if keep is None:
            t0 = time.monotonic()
            shutil.rmtree(scratch, ignore_errors=True)
            timings["cleanup"] = time.monotonic() - t0


def _scan_replayed(target: Path, recipe: Recipe) -> BaseManifest:
    """The replayed tree's manifest, with the image's facts the recipe records (adapter: reads the tree)."""
    return snapshot_site_packages(
        target,
        python=recipe.python.value,
        glibc=recipe.glibc.value,
        cuda=recipe.cuda.value,
        platform=recipe.platform,
        image_ref=recipe.image,
        os_name=f"{recipe.os.value} ({recipe.final_base_image.value})",
        site_packages_label=recipe.site_packages.value,
        method="-",
        # the tree holds the index's builds, not the image's (cu130 torch): their ELF digests would be wrong
        native_digests=False,
    )


def _describe_replayed(
    manifest: BaseManifest,
    release: _Release,
    target: Path,
    uv,
    records: list[dict],
    absent,
    unmatched,
    relaxed: list[Relaxation],
    auto: frozenset[str],
) -> None:
    """Fill in the replayed manifest's provenance (recipe, method), ``lacks`` and ``uv_overrides``:
    what the replay ran, what it left out and why, what the tree leaves unmet."""
    recipe, instant = release.recipe, release.instant
    unmet = unmet_requirements(requirements_in(target), target_environment(recipe.python.value, recipe.platform))
    manifest.provenance_recipe = {
        "sdist": recipe.sdist.to_json(),
        "exclude_newer": instant,
        "steps": records,
        # the replayed tree is not pip-consistent where the image's steps leave it so
        "unmet_requirements": unmet,
    }
    lacks, unversioned = leave_out_unversioned(recipe, absent, manifest, unmatched, tuple(relaxed), auto)
    lacks["other_indexes"] = index_lacks(recipe, release.plans, records)
    undecided = [f"{s.where}: {s.note}" for s in recipe.steps if s.replay == "undecided"]
    if undecided:
        lacks["undecided"] = undecided
    manifest.provenance_method = provenance_text(
        recipe,
        uv_version=uv.version(),
        uploaded=release.uploaded,
        instant=instant,
        cuda_found=_cuda_of(manifest),
        day=datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        lacks=lacks,
        unmet=unmet,
    )
    manifest.lacks = {**lacks, "unversioned": unversioned}
    manifest.uv_overrides = [d.value for d in recipe.image_overrides] or None
