"""build-image's floor checks, run inside the image build with the base image's own python3.

Standard library only (it runs before anything is installed).  Three modes:

``drift``        the base image's installed distributions (name, version and, for
                 distributions with native code, the digest of their ELF files) against
                 the base manifest the lock was made against (``--manifest``, whose sha256
                 must be ``--sha256``: an edited copy fails); any difference fails unless
                 ``--allow-drift``, which turns each into a listed warning.  Also records
                 the base's own dependency problems when the manifest holds none.
``consistency``  after the overlay install: ``pip check`` (or ``uv pip check``) of the whole
                 environment; problems the base already had (recorded in the manifest,
                 else measured by ``drift`` in the checks stage) are allowed and listed,
                 any other fails naming the packages.
``constraints``  writes every installed distribution as ``name==version``: the constraint
                 file the image sets as ``PIP_CONSTRAINT`` / ``UV_CONSTRAINT``.

build-image imports this file on the host too (``builder.resolve.floor``), so the digest
the manifest records and the one checked here are computed by the same code.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import subprocess
import sys

PREFIX = "build-image check: "
WARNING = "build-image warning: "  # each line of a warning (the build stage lists them after the build)
ELF_MAGIC = b"\x7fELF"
# Files never read as ELF (the same list as builder.resolve.scanner.TEXT_SUFFIXES).
TEXT_SUFFIXES = frozenset(
    ".py .pyc .pyi .pyx .pxd .txt .md .rst .json .toml .yaml .yml .cfg .ini .h .hpp .cuh .cu "
    ".c .cc .cpp .typed .html .js .css .csv .jinja .j2 .pem .lock .sh .bat .ps1 .svg .png .jpg".split()
)
# PEP 440 (packaging.version.VERSION_PATTERN): a version pip accepts after '=='; others get '==='.
_PEP440 = re.compile(
    r"^\s*v?(?:(?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*(?:[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?[0-9]*)?"
    r"(?:(?:-[0-9]+)|(?:[-_.]?(?:post|rev|r)[-_.]?[0-9]*))?(?:[-_.]?dev[-_.]?[0-9]*)?)"
    r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?\s*$",
    re.I,
)
_NOISE = ("No broken requirements found", "Checked ", "Found ", "All installed packages are compatible",
          "Using Python ")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------- pure: digests and comparisons
def _might_be_elf(name: str) -> bool:
    dot = name.rfind(".")
    return dot <= 0 or name[dot:].lower() not in TEXT_SUFFIXES


def record_files(dist_info: str) -> list[str]:
    """Paths a ``.dist-info`` RECORD lists, relative to its site-packages directory, that stay
    inside it (scripts in ``../../../bin`` are not part of the comparison)."""
    record = os.path.join(dist_info, "RECORD")
    root = os.path.dirname(os.path.abspath(dist_info))
    try:
        with open(record, newline="", encoding="utf-8", errors="replace") as fh:
            rows = [row[0] for row in csv.reader(fh) if row and row[0]]
    except OSError:
        return []
    out = []
    for rel in rows:
        full = os.path.normpath(os.path.join(root, rel))
        if full.startswith(root + os.sep):
            out.append(os.path.relpath(full, root).replace(os.sep, "/"))
    return sorted(set(out))


def native_digest(dist_info: str) -> str | None:
    """sha256 over ``relpath<TAB>sha256`` lines of the ELF files a distribution's RECORD lists
    (regular files only, symlinks skipped); None when it lists no ELF file."""
    root = os.path.dirname(os.path.abspath(dist_info))
    lines = []
    for rel in record_files(dist_info):
        if not _might_be_elf(rel.rsplit("/", 1)[-1]):
            continue
        path = os.path.join(root, rel)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        h = hashlib.sha256()
        try:
            with open(path, "rb") as fh:
                head = fh.read(4)
                if head != ELF_MAGIC:
                    continue
                h.update(head)
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
        except OSError:
            continue
        lines.append(f"{rel}\t{h.hexdigest()}\n")
    if not lines:
        return None
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def compare(expected: dict, observed: dict) -> list[str]:
    """Differences between the manifest's distributions (``expected``: its ``distributions``
    object) and the image's (``observed``: canonical name -> {"name", "version", "path"}), one
    line each, sorted by name.  A native digest is compared where the manifest records one."""
    out = []
    for key in sorted(set(expected) | set(observed)):
        want, have = expected.get(key), observed.get(key)
        if have is None:
            out.append(f"{want['name']} {want['version']}: in the manifest, not installed in the image")
        elif want is None:
            out.append(f"{have['name']} {have['version']}: installed in the image, not in the manifest")
        elif want["version"] != have["version"]:
            out.append(f"{want['name']}: the manifest has {want['version']}, the image has {have['version']}")
        elif want.get("native_sha256"):
            got = have.get("native_sha256") if "native_sha256" in have else native_digest(have.get("path") or "")
            if got != want["native_sha256"]:
                out.append(f"{want['name']} {want['version']}: its native files differ from the manifest's "
                           f"(ELF digest {str(got)[:12]}, the manifest records {want['native_sha256'][:12]})")
    return out


def problems(output: str) -> list[str]:
    """The problem lines of ``pip check`` / ``uv pip check`` output (summaries dropped), sorted."""
    lines = (line.strip() for line in output.splitlines())
    return sorted({ln for ln in lines if ln and not ln.startswith(_NOISE)})


def named(problem: str) -> str:
    """The distribution a problem line is about (pip: its first word; uv: the first `quoted` name)."""
    m = re.search(r"`([^`]+)`", problem)
    if problem.startswith("The package") and m:
        return m.group(1)
    return problem.split(" ", 1)[0]


def new_problems(found: list[str], allowed: list[str]) -> list[str]:
    allow = set(allowed)
    return [p for p in found if p not in allow]


def constraint_line(name: str, version: str) -> str:
    return f"{name}=={version}" if _PEP440.match(version) else f"{name}==={version}"


# ---------------------------------------------------------------- the running interpreter
def installed() -> dict:
    """canonical name -> {"name", "version", "path"} of every distribution on sys.path
    (the first one on the path wins, as at import time)."""
    import importlib.metadata as md

    seen: dict = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        key = canonical(name)
        if key in seen:
            continue
        path = getattr(dist, "_path", None)
        seen[key] = {"name": name, "version": dist.version, "path": str(path) if path is not None else ""}
    return seen


def run_check(tool: str) -> tuple[int, str]:
    if tool == "uv":
        argv = [sys.executable, "-m", "uv", "pip", "check", "--python", sys.executable]
    else:
        argv = [sys.executable, "-m", "pip", "check", "--disable-pip-version-check", "--no-input"]
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc.returncode, proc.stdout


def _fail(msg: str) -> None:
    print(PREFIX + msg, file=sys.stderr)
    sys.exit(1)


def _have_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _installer_present(tool: str) -> None:
    if not _have_module(tool):
        cmd = "python3 -m uv" if tool == "uv" else "python3 -m pip"
        _fail(f"the base image has no {tool} ({cmd} is not importable); the image installs the overlay "
              f"and checks the environment's consistency with it. Use a base that carries {tool}, or "
              "snapshot this one (`build-image base snapshot --image REF -o FILE`) and lock against it.")


def _load_manifest(path: str, sha256: str) -> dict:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        _fail(f"the base manifest copy {path} cannot be read: {exc}")
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        _fail(f"the base manifest copy in the context (checks/base-manifest.json) has sha256 {got}, the Dockerfile "
              f"expects {sha256}: it was edited after render. Re-render the context (`build-image render`).")
    return json.loads(data.decode("utf-8"))


def cmd_drift(opts) -> None:
    doc = _load_manifest(opts.manifest, opts.sha256)
    _installer_present(opts.tool)
    diffs = compare(doc.get("distributions") or {}, installed())
    report = []
    if diffs:
        head = (f"the base image differs from the base manifest the lock was made against "
                f"({len(diffs)} difference(s)):")
        report = [head] + [f"  - {d}" for d in diffs]
        way_out = ("  way out: snapshot the real base (`build-image base snapshot --image REF -o FILE`) and re-lock "
                   "against it (`build-image lock --base FILE`), or render with --allow-base-drift to build anyway.")
        if not opts.allow_drift:
            _fail("\n".join(report + [way_out]))
        report.append("  (allowed: --allow-base-drift)")
        for line in report:
            print(WARNING + line, file=sys.stderr)
    rec = doc.get("consistency")
    base_problems = []
    if not rec or rec.get("tool") != opts.tool:  # the manifest records none: measure the base's own
        _rc, out = run_check(opts.tool)
        base_problems = problems(out)
    os.makedirs(os.path.dirname(opts.out) or ".", exist_ok=True)
    with open(opts.out, "w", encoding="utf-8") as fh:
        json.dump({"drift": diffs, "allowed": bool(opts.allow_drift), "base_problems": base_problems,
                   "report": report}, fh, indent=1)
        fh.write("\n")
    print(f"base matches its manifest: {len(doc.get('distributions') or {})} distributions"
          if not diffs else f"base drift allowed: {len(diffs)} difference(s)")


def cmd_consistency(opts) -> None:
    doc = _load_manifest(opts.manifest, opts.sha256)
    rec = doc.get("consistency")
    if rec and rec.get("tool") == opts.tool:
        allowed, source = list(rec.get("problems") or []), "recorded in the base manifest"
    else:
        with open(opts.measured, encoding="utf-8") as fh:
            allowed, source = list(json.load(fh).get("base_problems") or []), "measured on the base in the checks stage"
    _rc, out = run_check(opts.tool)
    found = problems(out)
    new = new_problems(found, allowed)
    kept = [p for p in found if p not in new]
    if kept:
        print(f"the base's own dependency problems ({source}), allowed:\n" + "\n".join(f"  - {p}" for p in kept))
    if new:
        pkgs = sorted({named(p) for p in new})
        _fail(f"after the overlay install, `{'uv pip check' if opts.tool == 'uv' else 'pip check'}` finds "
              f"{len(new)} new problem(s) in {', '.join(pkgs)}:\n" + "\n".join(f"  - {p}" for p in new)
              + "\n  the lock does not fit this environment: re-lock against the base's real manifest "
              "(`build-image base snapshot --image REF -o FILE`, then `build-image lock --base FILE`).")
    os.makedirs(os.path.dirname(opts.out) or ".", exist_ok=True)
    with open(opts.out, "w", encoding="utf-8") as fh:
        fh.write("".join(f"allowed: {p}\n" for p in kept) or "no dependency problems\n")
    print(f"environment consistent ({len(kept)} allowed base problem(s))")


def cmd_constraints(opts) -> None:
    dists = installed()
    lines = [constraint_line(d["name"], d["version"]) for _k, d in sorted(dists.items())]
    os.makedirs(os.path.dirname(opts.out) or ".", exist_ok=True)
    tmp = opts.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("# Every distribution installed in this image, at its exact version (build-image).\n"
                 "# PIP_CONSTRAINT and UV_CONSTRAINT point here: pip/uv install cannot move these pins.\n"
                 "# Opt out deliberately for one command: env -u PIP_CONSTRAINT -u UV_CONSTRAINT pip install ...\n")
        fh.write("".join(line + "\n" for line in lines))
    os.replace(tmp, opts.out)
    print(f"constraints: {len(lines)} pins in {opts.out}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="base_check.py")
    sub = ap.add_subparsers(dest="mode", required=True)
    for mode in ("drift", "consistency"):
        p = sub.add_parser(mode)
        p.add_argument("--manifest", required=True)
        p.add_argument("--sha256", required=True)
        p.add_argument("--tool", choices=("pip", "uv"), required=True)
        p.add_argument("--out", required=True)
    sub.choices["drift"].add_argument("--allow-drift", action="store_true")
    sub.choices["consistency"].add_argument("--measured", required=True)
    sub.add_parser("constraints").add_argument("--out", required=True)
    opts = ap.parse_args(argv)
    {"drift": cmd_drift, "consistency": cmd_consistency, "constraints": cmd_constraints}[opts.mode](opts)


if __name__ == "__main__":
    main()
