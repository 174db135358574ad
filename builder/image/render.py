"""Render: (base manifest, lock, patched files) -> Dockerfile text + build context.

The decisions are pure functions of data (:class:`RenderPlan` -> Dockerfile text,
labels, tags, file list, sha256 lists) so they are tested as text.  Writing the
context (:func:`write_context`) is the only side effect: everything goes into a
temporary directory beside the target, which is renamed into place at the end,
so a failure leaves the previous context (or nothing) and never half of one.

Context layout (and nothing else)::

    Dockerfile
    requirements.lock           the lock, verbatim (pip/uv --require-hashes accept it; the image installs it)
    pylock.toml                 the same pins as PEP 751, each wheel by path into wheels/ (offline)
    sbom.cdx.json               CycloneDX 1.6 SBOM of the Python layer (copied into the image)
    provenance.intoto.json      in-toto statement, SLSA provenance v1 (subject: these files; build/push: the image)
    wheels/<file>.whl           exactly the locked wheels, sha256-verified
    patches/original.sha256     sha256 of each file the series touches, as in the vllm wheel
    patches/patched.sha256      sha256 of each patched file     (paths relative to site-packages)
    patches/files/<relpath>     the patched files
    app/build_image_serve_app.py  the Ray Serve application module
    checks/base_check.py        the floor checks the image build runs with the base's python (stdlib only)
    checks/base-manifest.json   the base manifest the lock was made against, byte for byte (sha256 in the Dockerfile)
    (+ rayservice.yaml / raycluster.yaml with --kuberay)
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from builder import __version__, values
from builder.credentials import redact_text  # a lock written before redaction keeps no secret in a context
from builder.data import path as data_path
from builder.errors import BadInput, IntegrityError
from builder.events import SILENT, Reporter
from builder.fetch import fetch
from builder.fetch import vllm_wheel as fetch_vllm_wheel
from builder.image import provenance
from builder.image.naming import (
    CHECKER_FILE,
    CHECKS_DIR,
    CLEAR_INSTALLER_ENV,
    CONSTRAINTS_PATH,
    LABEL_PREFIX,
    MANIFEST_COPY,
    PROVENANCE_FILE,
    SBOM_FILE,
    SERVE_APP_FILE,
    SERVE_BACKEND_ENV,
    SERVE_MODULE,
    TRITON_CACHE_DIR,
    VLLM_CACHE_ROOT,
    choose_installer,
    default_repo,
    image_tags,
    serve_app_source,
    serve_backend_of,
    tag_names,
)
from builder.image.sbom import IMAGE_SBOM_PATH, SbomInput, sbom_json
from builder.patching import series as P
from builder.patching.series import PatchedFile, sha256_list
from builder.platforms import DEFAULT, Platform
from builder.resolve.baseref import base_platform, resolve_base, vllm_on_base
from builder.resolve.floor import checker_path, consistency_tool
from builder.resolve.lockfile import (
    PYLOCK_NAME,
    LockFile,
    load_lock,
    parse_pylock_lock,
    read_lock_file,
    refuse_other_platform,
    same_pins,
    write_context_copies,
)
from builder.resolve.lockstage import Locked
from builder.resolve.manifest import BaseManifest
from builder.util import (
    file_digest,
    output_lock,
    remember_digest,
    sha256_bytes,
    sha256_file,
    temp_path,
    write_error,
)


@dataclass
class RenderPlan:
    """Everything the Dockerfile depends on (no paths to the host, no secrets)."""

    vllm: str
    base: BaseManifest
    lock: LockFile
    patched: list[PatchedFile] = field(default_factory=list)
    patches: list[str] = field(default_factory=list)  # patch names, series order
    repo: str | None = None
    serve_app: bool = True
    source_date_epoch: int = 0
    revision: str | None = None
    patch_texts: dict[str, str] = field(default_factory=dict)  # patch name -> its text (SBOM, provenance)
    vllm_wheel: tuple[str, str] | None = None  # (file name, sha256) of the wheel the series is made for
    base_data: bytes | None = None  # the base manifest's bytes as the lock hashed them (None: base.to_json())
    allow_base_drift: bool = False  # the checks stage lists base drift as a warning instead of failing
    base_note: str | None = None  # where the manifest came from when the pipeline replaced it (a snapshot)

    @property
    def manifest_bytes(self) -> bytes:
        """The base manifest the context ships (checks/base-manifest.json)."""
        return self.base_data if self.base_data is not None else self.base.to_json().encode("utf-8")

    @property
    def manifest_sha256(self) -> str:
        return sha256_bytes(self.manifest_bytes)

    @property
    def lock_hash(self) -> str:
        return self.lock.lock_hash

    @property
    def serve_backend(self) -> str:
        """The Serve application's default backend in the image: the lock's ``serve-backend``."""
        return serve_backend_of(self.lock)

    def sbom_text(self) -> str:
        """The image's CycloneDX SBOM (pure: a function of the plan)."""
        return sbom_json(
            SbomInput(
                vllm=self.vllm,
                base=self.base,
                lock=self.lock,
                image_name=self.repo or default_repo(),
                image_version=tag_names(self.vllm, self.lock_hash)[0],
                patched=list(self.patched),
                patches=list(self.patches),
                patch_texts=dict(self.patch_texts),
                vllm_wheel=self.vllm_wheel,
                source_date_epoch=self.source_date_epoch,
                base_manifest=self.base_note,
            )
        )


# ---------------------------------------------------------------- pure decisions
def from_ref(base: BaseManifest) -> str:
    ref = base.pinned_ref
    if not ref:
        raise BadInput(
            "base manifest: 'image.ref' is empty; render needs the base image reference.",
            hint="snapshot the base with `build-image base snapshot --image REF`.",
        )
    return ref


def check_consistency(plan: RenderPlan) -> None:
    """The lock must have been made for this base and this vllm; every entry needs its wheel."""
    h = plan.lock.header
    problems = []
    if h.get("vllm") and h["vllm"] != plan.vllm:
        problems.append(f"the lock is for vllm {h['vllm']}, not {plan.vllm}")
    if h.get("python") and h["python"] != plan.base.python_version:
        problems.append(f"the lock is for Python {h['python']}, the base manifest has {plan.base.python_version}")
    ref = (plan.base.image_ref or "").split("@")[0]
    if h.get("base-ref") not in (None, "-", "") and ref and h["base-ref"].split("@")[0] != ref:
        problems.append(f"the lock's base-ref is {h['base-ref']}, the base manifest's is {ref}")
    lock_digest = h.get("base-digest")
    if lock_digest not in (None, "-", "") and plan.base.image_digest and lock_digest != plan.base.image_digest:
        problems.append(f"the lock's base-digest is {lock_digest}, the base manifest's is {plan.base.image_digest}")
    if problems:
        raise BadInput(
            "lock and base manifest do not belong together: " + "; ".join(problems) + ".",
            hint="re-run `build-image lock` against this base manifest.",
        )
    missing = [e.name for e in plan.lock.entries if e.wheel is None]
    if missing:
        raise BadInput(
            f"lock: {len(missing)} entr{'y has' if len(missing) == 1 else 'ies have'} no '# wheel:' line "
            f"({', '.join(missing[:5])}); render needs each locked wheel's URL and sha256.",
            hint="regenerate the lock with `build-image lock`.",
        )
    for e in plan.lock.entries:
        if e.wheel and e.wheel.sha256 not in e.hashes:
            raise BadInput(f"lock, line {e.line}: {e.name}'s wheel sha256 is not among its --hash lines.")
        if e.wheel and not e.wheel.filename.endswith(".whl"):
            raise BadInput(
                f"lock, line {e.line}: {e.name} is locked to {e.wheel.filename}, not a wheel; "
                "the image build installs wheels only (no compiler, no network)."
            )


def epoch_iso(epoch: int) -> str:
    return _dt.datetime.fromtimestamp(epoch, tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def oci_labels(plan: RenderPlan, sbom_sha256: str | None = None) -> list[tuple[str, str]]:
    """Image labels, in a stable order.  Nothing host- or user-specific, no credentials.
    ``sbom_sha256``: of the SBOM the image carries (computed from the plan when not given)."""
    if sbom_sha256 is None:
        sbom_sha256 = sha256_bytes(plan.sbom_text().encode())
    tags = tag_names(plan.vllm, plan.lock_hash)
    labels = [
        ("org.opencontainers.image.title", "vllm-serving"),
        (
            "org.opencontainers.image.description",
            f"vLLM {plan.vllm} serving image with a hash-locked overlay on {plan.base.image_ref}",
        ),
        ("org.opencontainers.image.version", tags[0]),
        ("org.opencontainers.image.created", epoch_iso(plan.source_date_epoch)),
        ("org.opencontainers.image.base.name", (plan.base.image_ref or "").split("@")[0]),
        ("org.opencontainers.image.base.digest", plan.base.image_digest or ""),
        ("org.opencontainers.image.vendor", "build-image"),
    ]
    if plan.revision:
        labels.append(("org.opencontainers.image.revision", plan.revision))
    labels += [
        (f"{LABEL_PREFIX}.vllm", plan.vllm),
        (f"{LABEL_PREFIX}.lock-hash", plan.lock_hash),
        (f"{LABEL_PREFIX}.base-digest", plan.base.image_digest or "-"),
        (f"{LABEL_PREFIX}.python", plan.base.python_version),
        (f"{LABEL_PREFIX}.packages", str(len(plan.lock.entries))),
        (f"{LABEL_PREFIX}.patches", ",".join(plan.patches) or "-"),
        (f"{LABEL_PREFIX}.patched-files", str(len(plan.patched))),
        (f"{LABEL_PREFIX}.serve-backend", plan.serve_backend if plan.serve_app else "-"),
        (f"{LABEL_PREFIX}.tool", f"build-image {__version__}"),
        (f"{LABEL_PREFIX}.sbom", IMAGE_SBOM_PATH),
        (f"{LABEL_PREFIX}.sbom-sha256", sbom_sha256),
        (f"{LABEL_PREFIX}.base-manifest-sha256", plan.manifest_sha256),
        (f"{LABEL_PREFIX}.allow-base-drift", "true" if plan.allow_base_drift else "false"),
        (f"{LABEL_PREFIX}.constraints", CONSTRAINTS_PATH),
    ]
    return labels


def context_files(plan: RenderPlan) -> list[str]:
    """Every file of the context, relative, sorted (the test of 'nothing else')."""
    files = [
        "Dockerfile",
        "requirements.lock",
        PYLOCK_NAME,
        SBOM_FILE,
        PROVENANCE_FILE,
        f"{CHECKS_DIR}/{CHECKER_FILE}",
        f"{CHECKS_DIR}/{MANIFEST_COPY}",
    ]
    files += [f"wheels/{e.wheel.filename}" for e in plan.lock.entries if e.wheel]
    if plan.patched:
        files += ["patches/original.sha256", "patches/patched.sha256"]
        files += [f"patches/files/{p.relpath}" for p in plan.patched]
    if plan.serve_app:
        files.append(f"app/{SERVE_APP_FILE}")
    return sorted(files)


def _dq(value: str) -> str:
    """A Dockerfile double-quoted word: escape backslash, quote and $ (no variable expansion)."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("\n", " ") + '"'


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_path("templates"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=values.guard,  # every {{ value }}: a typed value, or a string without a line break
    )
    env.filters["dq"] = _dq
    # Only the patched modules' own stale bytecode (`<stem>.*.pyc`), quoted up to the glob.
    env.filters["pyc_glob"] = lambda rel: f'"{Path(rel).parent / "__pycache__" / Path(rel).stem}".*.pyc'
    return env


def render_dockerfile(plan: RenderPlan, sbom_sha256: str | None = None) -> str:
    """The Dockerfile text: a pure function of the plan (``sbom_sha256``: of ``plan.sbom_text()``,
    computed when not given)."""
    for p in plan.patched:
        if p.relpath.startswith("/") or ".." in Path(p.relpath).parts or any(c.isspace() for c in p.relpath):
            raise BadInput(
                f"patched file path {p.relpath!r} must be relative to site-packages, without '..' or spaces."
            )
    repo = plan.repo or default_repo()
    return redact_text(
        _env()
        .get_template("Dockerfile.j2")
        .render(
            manifest_file=MANIFEST_COPY,
            manifest_sha256=plan.manifest_sha256,
            checker_file=CHECKER_FILE,
            checker_sha256=sha256_file(checker_path()),
            check_tool=consistency_tool(plan.base),
            allow_base_drift=plan.allow_base_drift,
            constraints_path=CONSTRAINTS_PATH,
            vllm_cache_root=VLLM_CACHE_ROOT,
            triton_cache_dir=TRITON_CACHE_DIR,
            tool_version=__version__,
            vllm=plan.vllm,
            python=plan.base.python_version,
            from_ref=from_ref(plan.base),
            installer=choose_installer(plan.base),
            clear_installer_env=CLEAR_INSTALLER_ENV,
            patched=sorted(plan.patched, key=lambda p: p.relpath),
            patches=plan.patches,
            serve_app=SERVE_APP_FILE if plan.serve_app else None,
            serve_module=SERVE_MODULE,
            serve_backend=plan.serve_backend,
            serve_backend_env=SERVE_BACKEND_ENV,
            source_date_epoch=int(plan.source_date_epoch),
            labels=oci_labels(plan, sbom_sha256),
            sbom_file=SBOM_FILE,
            sbom_path=IMAGE_SBOM_PATH,
            tags=image_tags(repo, plan.vllm, plan.lock_hash),
        )
    )  # the file rule: no credential in any generated text


# ---------------------------------------------------------------- side effects
def default_source_date_epoch() -> int:
    """``SOURCE_DATE_EPOCH`` from the environment, else 0 (stable across commits, so a
    no-op rebuild is a cache hit and the same inputs give the same image)."""
    raw = os.environ.get("SOURCE_DATE_EPOCH")
    if raw is None or raw == "":
        return 0
    try:
        return int(raw)
    except ValueError:
        raise BadInput(f"SOURCE_DATE_EPOCH={raw!r} is not an integer number of seconds.") from None


def fetch_wheels(lock: LockFile, *, reporter: Reporter = SILENT) -> dict[str, Path]:
    """Download (or take from the cache) every locked wheel, sha256-verified by :func:`builder.fetch.fetch`.
    filename -> path; each wheel is a download event on ``reporter``."""
    out: dict[str, Path] = {}
    entries = sorted(lock.entries, key=lambda e: e.key)
    for i, e in enumerate(entries, 1):
        assert e.wheel is not None
        reporter.download(e.wheel.filename, i, len(entries))
        out[e.wheel.filename] = Path(fetch(e.wheel.url, e.wheel.sha256))
    return out


def _place(src: Path, dst: Path, sha256: str) -> None:
    """Copy a cached wheel into the context: its own inode (never a hard link into the cache,
    so damage to a cache entry cannot reach a rendered context), a reflink where the file
    system shares blocks copy-on-write, a byte copy elsewhere.

    The source is checked against the lock right before the copy (:func:`file_digest`: no
    second hash of a file this run already verified, a new one if it changed since), the
    copy against the source's size; the copy's digest is then known without hashing it."""
    got = file_digest(src)
    if got != sha256:
        raise IntegrityError(f"{dst.name}: sha256 {got} does not match the lock's {sha256}.")
    dst.parent.mkdir(parents=True, exist_ok=True)
    copy_or_reflink(src, dst)
    size, want = dst.stat().st_size, src.stat().st_size
    if size != want:
        raise IntegrityError(f"{dst.name}: the copy in the context has {size} bytes, the verified wheel {want}.")
    remember_digest(dst, sha256)


_FICLONE = 0x40049409  # linux/fs.h: clone src's extents into dst (btrfs, xfs, bcachefs)


def copy_or_reflink(src: Path, dst: Path) -> None:
    """``dst`` becomes an independent copy of ``src`` (a copy-on-write clone when supported)."""
    import fcntl

    with open(src, "rb") as fin, open(dst, "wb") as fout:
        try:
            fcntl.ioctl(fout.fileno(), _FICLONE, fin.fileno())
            return
        except OSError:
            pass
        shutil.copyfileobj(fin, fout, 1 << 20)


RENDERED_MARK = "# Rendered by build-image"
#: Files besides :func:`context_files` a render may put in a context (``builder.serving.kuberay`` writes them).
EXTRA_CONTEXT_FILES = ("rayservice.yaml", "raycluster.yaml")
#: Folders of a context whose whole content is the render's (wheels, patched files, the Serve app).
OWN_CONTEXT_DIRS = ("wheels", "patches", "app", CHECKS_DIR)


def foreign_entries(out: Path) -> list[str]:
    """What ``out`` (an existing context) holds that no render writes: a user's NOTES.md, a data folder.
    Sorted, relative; folders of the render (:data:`OWN_CONTEXT_DIRS`) are the render's whole."""
    own = {"Dockerfile", "requirements.lock", PYLOCK_NAME, SBOM_FILE, PROVENANCE_FILE, *EXTRA_CONTEXT_FILES}
    return sorted(
        p.name + ("/" if p.is_dir() and not p.is_symlink() else "")
        for p in out.iterdir()
        if not (p.name in own and p.is_file() and not p.is_symlink())
        and not (p.name in OWN_CONTEXT_DIRS and p.is_dir() and not p.is_symlink())
    )


def sweep_leftovers(out: Path) -> list[Path]:
    """Remove the temp and old directories an interrupted render of ``out`` left beside it
    (``.NAME.XXXX.tmp``, ``.NAME.old-PID``).  Called with the output lock held: no other run is
    writing ``out``, so every such sibling is abandoned."""
    removed = []
    if not out.parent.is_dir():
        return removed
    pat = re.compile(rf"^\.{re.escape(out.name)}\.(?:old-\d+(?:-\d+)?|[A-Za-z0-9_]+\.tmp)$")
    for p in out.parent.iterdir():
        if pat.match(p.name) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def check_replaceable(out: Path) -> None:
    """``out`` may be replaced only when absent, empty, or a context rendered by this tool."""
    if not out.exists():
        return
    if not out.is_dir():
        raise BadInput(f"-o {out}: exists and is not a directory.")
    if not any(out.iterdir()):
        return
    df = out / "Dockerfile"
    try:
        ours = df.is_file() and df.read_text(encoding="utf-8", errors="replace").startswith(RENDERED_MARK)
    except OSError:
        ours = False
    added = foreign_entries(out) if ours else []
    if added:
        more = f" and {len(added) - 5} more" if len(added) > 5 else ""
        raise BadInput(
            f"-o {out}: the context holds {', '.join(added[:5])}{more}, which render did not write; render replaces "
            "a context as a whole, so it refuses rather than delete them. Nothing was changed.",
            hint="move them out of the context (keep notes and data beside it), or render into a new directory.",
        )
    if not ours:
        raise BadInput(
            f"-o {out}: the directory exists and is not a build context rendered by build-image; "
            "render replaces its output directory as a whole, so it refuses to touch this one.",
            hint="choose a new or empty directory (default build/vllm-<version>).",
        )


def write_context(
    out_dir: str | Path,
    plan: RenderPlan,
    *,
    wheels: dict[str, Path],
    patched_root: Path | None = None,
    lock_text: str | None = None,
    extra: Callable[[Path], Iterable[Path]] | None = None,
    sbom_text: str | None = None,
) -> list[str]:
    """Write the context for ``plan`` into ``out_dir`` atomically (temp dir + rename).

    ``patched_root`` holds the patched files at their site-packages-relative paths;
    ``extra(tmp_dir)`` may add files (KubeRay manifests) before the rename; ``sbom_text``:
    ``plan.sbom_text()`` when the caller made it already (it is not made twice).
    Returns the relative paths written.
    """
    out = Path(out_dir)
    if out.is_symlink():  # the output rule: a link is written through (its directory replaced), never replaced
        out = Path(os.path.realpath(out))
    check_consistency(plan)
    sbom = sbom_text if sbom_text is not None else plan.sbom_text()
    dockerfile = render_dockerfile(plan, sha256_bytes(sbom.encode()))

    with output_lock(out):  # two renders to one -o: the second waits, then replaces the first's whole
        sweep_leftovers(out)
        try:
            return _write_context_locked(
                out, plan, dockerfile, sbom, wheels=wheels, patched_root=patched_root, lock_text=lock_text, extra=extra
            )
        except OSError as exc:  # a full or read-only file system: exit 2 naming it; the previous context is intact
            err = write_error(out, exc)
            if err is None:
                raise
            raise err from None


def write_checks(ctx: Path, plan: RenderPlan) -> None:
    """checks/: the checker script and the manifest copy whose sha256 the Dockerfile names."""
    (ctx / CHECKS_DIR).mkdir()
    shutil.copyfile(checker_path(), ctx / CHECKS_DIR / CHECKER_FILE)
    (ctx / CHECKS_DIR / MANIFEST_COPY).write_bytes(plan.manifest_bytes)


def _write_context_locked(
    out: Path, plan: RenderPlan, dockerfile: str, sbom: str, *, wheels, patched_root, lock_text, extra
) -> list[str]:
    check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(out)  # made inside the try: an interrupt just after the mkdir still removes it
    try:
        tmp.mkdir(mode=0o700)  # under the output lock, after the sweep: no other run's temp has this name
        (tmp / "Dockerfile").write_text(dockerfile, encoding="utf-8")

        lock_copy, pylock_text = write_context_copies(tmp, plan.lock, lock_text)
        (tmp / SBOM_FILE).write_text(sbom, encoding="utf-8")

        prov = provenance.for_render(
            plan,
            lock_text=lock_copy,
            outputs={"Dockerfile": dockerfile, PYLOCK_NAME: pylock_text, SBOM_FILE: sbom},
            template_text=_env().loader.get_source(_env(), "Dockerfile.j2")[0],
        )
        (tmp / PROVENANCE_FILE).write_text(provenance.dumps(prov), encoding="utf-8")
        (tmp / "wheels").mkdir()
        for e in plan.lock.entries:
            assert e.wheel is not None
            src = wheels.get(e.wheel.filename)
            if src is None:
                raise IntegrityError(f"no downloaded file for locked wheel {e.wheel.filename}.")
            _place(Path(src), tmp / "wheels" / e.wheel.filename, e.wheel.sha256)
        if plan.patched:
            if patched_root is None:
                raise BadInput("render: patched files were listed but no directory holding them was given.")
            (tmp / "patches").mkdir()
            (tmp / "patches" / "original.sha256").write_text(sha256_list(plan.patched, "original"))
            (tmp / "patches" / "patched.sha256").write_text(sha256_list(plan.patched, "patched"))
            for p in plan.patched:
                src = Path(patched_root) / p.relpath
                dst = tmp / "patches" / "files" / p.relpath
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
                if sha256_file(dst) != p.patched_sha256:
                    raise IntegrityError(f"patched file {p.relpath}: its sha256 differs from the patch result's.")
        write_checks(tmp, plan)
        if plan.serve_app:
            (tmp / "app").mkdir()
            shutil.copyfile(serve_app_source(), tmp / "app" / SERVE_APP_FILE)
        written = context_files(plan)
        if extra is not None:
            written += [str(Path(p).relative_to(tmp)) for p in extra(tmp)]
        for dp, _dn, fn in os.walk(tmp):
            for f in fn:
                os.chmod(os.path.join(dp, f), 0o644)
        for dp, dn, _fn in os.walk(tmp):
            for d in dn:
                os.chmod(os.path.join(dp, d), 0o755)
        os.chmod(tmp, 0o755)
        swap_into_place(tmp, out)
        return sorted(written)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def swap_into_place(tmp: Path, out: Path) -> None:
    """Put the finished folder ``tmp`` at ``out`` by two renames, the previous ``out`` (if any) removed after;
    interrupted between the two renames, the previous one comes back (the caller removes ``tmp``)."""
    old: Path | None = None
    try:
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
        os.replace(tmp, out)
    except BaseException:
        if old is not None and old.exists() and not out.exists():
            os.replace(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------- context verification (build time)
def base_refs(dockerfile_text: str) -> list[str]:
    """The images a Dockerfile builds FROM (stage names excluded), in order, unique."""
    refs: list[str] = []
    stages: set[str] = set()
    for line in dockerfile_text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].upper() == "FROM":
            args = [p for p in parts[1:] if not p.startswith("--")]
            ref = args[0]
            if ref not in stages and ref not in refs:
                refs.append(ref)
            if len(args) >= 3 and args[1].upper() == "AS":
                stages.add(args[2])
    return refs


def verify_context(context: str | Path) -> LockFile:
    """Before building: the context is complete and every wheel / patched file matches its sha256.

    Missing Dockerfile/lock -> BadInput; missing wheel -> BadInput; hash mismatch -> IntegrityError.
    """
    ctx = Path(context)
    if not (ctx / "Dockerfile").is_file():
        raise BadInput(f"build context {ctx} has no Dockerfile.", hint="create it with `build-image render`.")
    if not (ctx / "requirements.lock").is_file():
        raise BadInput(f"build context {ctx} has no requirements.lock.", hint="re-run `build-image render`.")
    lock = load_lock(ctx / "requirements.lock")
    missing, bad = [], []
    for e in lock.entries:
        if e.wheel is None:
            raise BadInput(f"{ctx}/requirements.lock: {e.name} has no '# wheel:' line.")
        p = ctx / "wheels" / e.wheel.filename
        if not p.is_file():
            missing.append(e.wheel.filename)
        elif (got := file_digest(p)) != e.wheel.sha256:
            bad.append(f"{e.wheel.filename} (sha256 {got[:16]}..., lock says {e.wheel.sha256[:16]}...)")
    if missing:
        raise BadInput(
            f"build context {ctx}: wheels/ lacks {len(missing)} locked wheel(s): {', '.join(missing[:5])}.",
            hint="re-run `build-image render` to rebuild the context.",
        )
    if bad:
        raise IntegrityError(
            f"build context {ctx}: wheel(s) whose sha256 does not match requirements.lock: {'; '.join(bad[:5])}.",
            hint="the context was modified or corrupted; re-run `build-image render`.",
        )
    locked = {e.wheel.filename for e in lock.entries if e.wheel is not None}
    extra = (
        sorted(p.name for p in (ctx / "wheels").iterdir() if p.name not in locked) if (ctx / "wheels").is_dir() else []
    )
    if extra:
        raise IntegrityError(
            f"build context {ctx}: wheels/ holds file(s) the lock does not list: {', '.join(extra[:5])}; "
            "the wheelhouse is exactly the locked wheels.",
            hint="the context was modified; re-run `build-image render`.",
        )
    _verify_twins(ctx, lock)
    _verify_checks(ctx)
    sums = ctx / "patches" / "patched.sha256"
    files_dir = ctx / "patches" / "files"
    listed: set[str] = set()
    if sums.is_file():
        for line in sums.read_text().splitlines():
            if not line.strip():
                continue
            digest, _, rel = line.partition("  ")
            listed.add(rel)
            f = ctx / "patches" / "files" / rel
            if not f.is_file():
                raise BadInput(f"build context {ctx}: patched file patches/files/{rel} is missing.")
            if sha256_file(f) != digest:
                raise IntegrityError(f"build context {ctx}: patches/files/{rel} does not match patches/patched.sha256.")
    # the image copies all of patches/files/ over vllm, but sha256sum -c checks only the listed files
    unlisted = (
        sorted(
            str(p.relative_to(files_dir))
            for p in files_dir.rglob("*")
            if not p.is_dir() and str(p.relative_to(files_dir)) not in listed
        )
        if files_dir.is_dir()
        else []
    )
    if unlisted:
        raise IntegrityError(
            f"build context {ctx}: patches/files/ holds file(s) patches/patched.sha256 does not list: "
            f"{', '.join(unlisted[:5])}; they would be copied into the image unverified.",
            hint="the context was modified; re-run `build-image render`.",
        )
    return lock


def _verify_checks(ctx: Path) -> None:
    """checks/: present when the Dockerfile runs them (their sha256 is checked in the image's checks
    stage, so a context built without the tool fails the same way)."""
    text = (ctx / "Dockerfile").read_text(encoding="utf-8")
    missing = [
        f"{CHECKS_DIR}/{name}"
        for name in (CHECKER_FILE, MANIFEST_COPY)
        if f"{CHECKS_DIR}/{name}" in text and not (ctx / CHECKS_DIR / name).is_file()
    ]
    if missing:
        raise BadInput(
            f"build context {ctx} has no {' or '.join(missing)}, which its Dockerfile's checks run.",
            hint="re-run `build-image render`.",
        )


def _verify_twins(ctx: Path, lock: LockFile) -> None:
    """pylock.toml pins what requirements.lock pins; sbom.cdx.json is the one the Dockerfile's label names."""
    py = ctx / PYLOCK_NAME
    if py.is_file():
        diffs = same_pins(lock, parse_pylock_lock(py.read_text(encoding="utf-8"), str(py)))
        if diffs:
            raise IntegrityError(
                f"build context {ctx}: {PYLOCK_NAME} pins other packages than requirements.lock "
                f"({'; '.join(diffs[:3])}).",
                hint="the context was modified; re-run `build-image render`.",
            )
    sbom = ctx / SBOM_FILE
    m = re.search(
        rf'{re.escape(LABEL_PREFIX)}\.sbom-sha256="([0-9a-f]{{64}})"', (ctx / "Dockerfile").read_text(encoding="utf-8")
    )
    if m and not sbom.is_file():
        raise BadInput(
            f"build context {ctx} has no {SBOM_FILE}, which its Dockerfile copies into the image.",
            hint="re-run `build-image render`.",
        )
    if m and sha256_file(sbom) != m.group(1):
        raise IntegrityError(
            f"build context {ctx}: {SBOM_FILE} has sha256 {sha256_file(sbom)[:16]}..., the "
            "Dockerfile's "
            f"{LABEL_PREFIX}.sbom-sha256 label says {m.group(1)[:16]}....",
            hint="the context was modified; re-run `build-image render`.",
        )


# ---------------------------------------------------------------- the render stage (render command / pipeline)
@dataclass(frozen=True)
class RenderInputs:
    """What render works from: the base manifest and the lock (read once), and the lock's text
    (copied verbatim into the context; None for a pylock.toml)."""

    manifest: BaseManifest
    lock: LockFile
    lock_text: str | None
    lock_path: Path | None = None
    base_data: bytes | None = None  # the manifest's bytes (what the context ships)


@dataclass(frozen=True)
class RenderResult:
    """The render stage's result: what build, push and the KubeRay manifests need.

    ``wheel_digests`` (wheel file name -> sha256) are the digests of the wheels placed in
    the context, verified this run; ``base_refs`` are the images the Dockerfile builds
    FROM (so build never re-reads the Dockerfile it was handed)."""

    out_dir: Path
    files: tuple[str, ...]
    tags: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]
    wheel_digests: Mapping[str, str]
    base_refs: tuple[str, ...]
    plan: RenderPlan
    timings: Mapping[str, float] = field(default_factory=dict)  # "patch": seconds of the patch check and apply

    @property
    def vllm(self) -> str:
        return self.plan.vllm

    @property
    def lock(self) -> LockFile:
        return self.plan.lock

    @property
    def lock_hash(self) -> str:
        return self.plan.lock_hash


def render_inputs(
    spec, *, lock_file: str | Path | None = None, base: str | None = None, locked: Locked | None = None
) -> RenderInputs:
    """The base manifest and the lock render works from.

    ``locked`` (a :class:`builder.resolve.lockstage.Locked` the pipeline just made) is used as is;
    otherwise the base comes from :func:`builder.resolve.baseref.resolve_base` (the one rule for
    every command) and the lock from ``lock_file`` or the spec, each read once.  A base
    with another vllm than ``spec.vllm`` is exit 2 naming both; BadInput naming the file
    for a missing or malformed one."""
    if locked is not None:
        resolved, lock, text, lock_path = locked.base, locked.lock, locked.text, locked.path
    else:
        resolved = resolve_base(base or spec.base, spec.vllm, platform=spec.platform)
        lock_path = Path(lock_file) if lock_file else spec.lock_path
        lock, text = None, None
    want = base_platform(resolved.manifest, resolved.label)
    doing = f"rendering on base {resolved.label}"
    if lock is None:  # BadInput naming the file/line when missing, malformed or another platform's
        lock, text = read_lock_file(lock_path, want, doing=doing)
    else:
        refuse_other_platform(lock, want, lock_path, doing=doing)
    vllm_on_base(resolved, spec.vllm)  # a base with another vllm: exit 2 naming both
    manifest = resolved.manifest
    return RenderInputs(manifest=manifest, lock=lock, lock_text=text, lock_path=lock_path, base_data=resolved.data)


def load_release_series(series_dir: Path | None, vllm: str) -> P.Series:
    """The series render applies: ``series_dir``, or the one shipped for ``vllm`` (patches/vllm/<v>/; a release
    without one stops here, naming how to port one), located and loaded once."""
    return P.load_series(series_dir if series_dir is not None else P.require_series(vllm), vllm)


def apply_series(
    series: P.Series, vllm: str, vllm_wheel: Path | None, out_dir: Path
) -> tuple[list[PatchedFile], list[str]]:
    """Check and apply ``series`` to the vllm wheel on the host; patched files land in ``out_dir``."""
    names = [p.name for p in series.patches]
    if not names:
        return [], []
    if vllm_wheel is None:
        vllm_wheel = Path(fetch_vllm_wheel(vllm, series.wheel_sha256))
    P.check(series, vllm_wheel)  # raises PatchFailed with the failing hunk
    return P.apply_to_dir(series, vllm_wheel, out_dir), names


def series_texts(series: P.Series, vllm: str) -> tuple[dict[str, str], tuple[str, str] | None]:
    """(patch name -> text, (wheel file name, sha256) the series is made for) of the series render applied."""
    texts = {p.name: p.text for p in series.patches}
    wheel = (series.wheel_filename or f"vllm-{vllm}.whl", series.wheel_sha256) if series.wheel_sha256 else None
    return texts, wheel


def render_context(
    *,
    vllm: str,
    base: BaseManifest,
    lock: LockFile,
    out_dir: Path,
    lock_text: str | None = None,
    series_dir: Path | None = None,
    series: P.Series | None = None,
    vllm_wheel: Path | None = None,
    repo: str | None = None,
    no_patches: bool = False,
    revision: str | None = None,
    reporter: Reporter = SILENT,
    extra: Callable[[Path, list[str]], Iterable[Path]] | None = None,
    base_data: bytes | None = None,
    allow_base_drift: bool = False,
    base_note: str | None = None,
) -> RenderResult:
    """Patch on the host, fetch the wheels, write the context atomically.

    ``extra(tmp_dir, tags)`` may add files to the context before it is renamed into place
    (``render --kuberay``: the KubeRay manifests); it returns the paths it wrote.
    ``base_data``: the manifest's bytes as the lock hashed them (shipped in checks/);
    ``allow_base_drift``: the checks stage warns about base drift instead of failing;
    ``base_note``: the manifest is the pipeline's snapshot of the base (SBOM, provenance);
    ``series``: the series the caller loaded already (else ``series_dir``'s, or the shipped one, loaded here);
    ``reporter``: the steps and wheel downloads as events.  The result carries the patch step's seconds."""
    step = reporter.step
    plan = RenderPlan(
        vllm=vllm,
        base=base,
        lock=lock,
        repo=repo,
        source_date_epoch=default_source_date_epoch(),
        revision=revision,
        serve_app=serve_app_source().is_file(),
        base_data=base_data,
        allow_base_drift=allow_base_drift,
        base_note=base_note,
    )
    check_consistency(plan)
    tags = image_tags(repo or default_repo(), vllm, lock.lock_hash)
    with tempfile.TemporaryDirectory(prefix="build-image-patched.") as ptmp:
        t_patch = time.monotonic()
        step("patch series")
        if not no_patches:
            series = series or load_release_series(series_dir, vllm)
            plan.patched, plan.patches = apply_series(series, vllm, vllm_wheel, Path(ptmp))
            if plan.patches:
                plan.patch_texts, plan.vllm_wheel = series_texts(series, vllm)
        patch_s = time.monotonic() - t_patch
        step(f"wheelhouse ({len(lock.entries)} wheels)")
        wheels = fetch_wheels(lock, reporter=reporter)

        step("write context")
        sbom = plan.sbom_text()  # once: the context's file and the label's sha256
        files = write_context(
            out_dir,
            plan,
            wheels=wheels,
            patched_root=Path(ptmp),
            lock_text=lock_text,
            extra=None if extra is None else (lambda tmp: extra(tmp, tags)),
            sbom_text=sbom,
        )
    from types import MappingProxyType

    return RenderResult(
        out_dir=Path(out_dir),
        files=tuple(files),
        tags=tuple(tags),
        labels=tuple(oci_labels(plan, sha256_bytes(sbom.encode()))),
        wheel_digests=MappingProxyType({e.wheel.filename: e.wheel.sha256 for e in lock.entries if e.wheel}),
        base_refs=(from_ref(base),),
        plan=plan,
        timings=MappingProxyType({"patch": patch_s}),
    )


def build_hint(context: str | Path, repo: str | None, tags: Iterable[str], platform: Platform = DEFAULT) -> str:
    """How to build a rendered context, with the tool or without it (one line, copy-pasteable); another platform
    than the default is named to docker (the tool reads it from the lock)."""
    q = shlex.quote  # the repository and tags are image_tags' (checked); the context is any path
    plat = "" if platform.is_default else f" --platform {platform.name}"
    return (
        f"build-image build {q(str(context))}"
        + (f" --tag {q(repo)}" if repo else "")
        + f"   (or: cd {q(str(context))} && DOCKER_BUILDKIT=1 docker build{plat} --network=none"
        + "".join(f" -t {q(t)}" for t in tags)
        + " .)"
    )


def default_out_dir(vllm: str) -> Path:
    """``build/vllm-<v>``: where render writes and build/push look by default."""
    return Path("build") / f"vllm-{vllm}"


@dataclass(frozen=True)
class ContextOnDisk:
    """A rendered context read back from disk (``build``/``push`` without the pipeline), verified."""

    out_dir: Path
    vllm: str
    tags: tuple[str, ...]
    lock: LockFile
    base_refs: tuple[str, ...]

    @property
    def lock_hash(self) -> str:
        return self.lock.lock_hash


def read_context(context: str | Path, repo: str | None) -> ContextOnDisk:
    """Verify a context (every wheel, patched file and twin against its sha256: each file hashed
    once) and read what build and push need from it: tags from its lock, bases from its Dockerfile."""
    ctx = Path(context)
    vllm, tags, lock = tags_for_context(ctx, repo)
    refs = base_refs((ctx / "Dockerfile").read_text(encoding="utf-8"))
    return ContextOnDisk(out_dir=ctx, vllm=vllm, tags=tuple(tags), lock=lock, base_refs=tuple(refs))


def tags_for_context(context: str | Path, repo: str | None) -> tuple[str, list[str], LockFile]:
    """(vllm, tags, lock) of a rendered context (tags recomputed from its requirements.lock)."""
    lock = verify_context(context)
    vllm = lock.header.get("vllm") or "-"
    return vllm, image_tags(repo or default_repo(), vllm, lock.lock_hash), lock
