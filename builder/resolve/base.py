"""Base manifest stage, the snapshot: :func:`snapshot_site_packages` and :func:`snapshot_image` turn a
site-packages directory or a local container image into a :class:`builder.resolve.manifest.BaseManifest`
with the binary facts of :mod:`builder.resolve.scanner`; every engine call goes through the docker-CLI
adapter (:func:`_docker`), which never pulls.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from builder import __version__
from builder import engine as engine_adapter
from builder import platforms as P
from builder.errors import BadInput, EngineUnavailable, ExternalToolError
from builder.events import Reporter
from builder.platforms import Platform
from builder.resolve.floor import checker, consistency_tool
from builder.resolve.manifest import BaseManifest, Distribution, parse_manifest
from builder.resolve.scanner import ELF_MAGIC, GLIBC_VER, WARNINGS_ON_STDERR, might_be_elf, scan_site_packages
from builder.util import atomic_write_text, cache_dir, sha256_bytes
from builder.values import split_ref

# --------------------------------------------------------------------------- snapshot


_XY_EXAMPLE = {"--python": "3.12", "--glibc": "2.35", "--cuda": "13.0"}


def _check_xy(value: str, flag: str) -> str:
    if not re.fullmatch(r"\d+\.\d+", value or ""):
        raise BadInput(f"{flag} must look like X.Y (e.g. {_XY_EXAMPLE.get(flag, '3.12')}), got {value!r}.")
    return value


def platform_for(glibc: str, arch: str = P.DEFAULT.machine) -> str:
    """uv's ``--python-platform`` for a glibc: ``2.35`` -> ``x86_64-manylinux_2_35``."""
    return f"{arch}-manylinux_{glibc.replace('.', '_')}"


def _guess_python_version(site_packages: Path) -> str | None:
    for part in reversed(site_packages.resolve().parts):
        m = re.fullmatch(r"python(\d+\.\d+)", part)
        if m:
            return m.group(1)
    return None


def snapshot_site_packages(
    site_packages: Path,
    *,
    python: str | None,
    glibc: str,
    cuda: str | None = None,
    platform: str | None = None,
    image_ref: str | None = None,
    os_name: str | None = None,
    site_packages_label: str | None = None,
    method: str | None = None,
    native_digests: bool = True,
    reporter: Reporter = WARNINGS_ON_STDERR,
) -> BaseManifest:
    """A ``reconstructed`` manifest from a directory on this machine (``native_digests``, ``reporter``: see
    :func:`scan_site_packages`)."""
    site_packages = Path(site_packages)
    python = python or _guess_python_version(site_packages)
    if not python:
        raise BadInput(f"cannot tell the Python version of {site_packages} from its path; pass --python X.Y.")
    _check_xy(python, "--python")
    _check_xy(glibc, "--glibc")
    if cuda is not None:
        _check_xy(cuda, "--cuda")
    dists = scan_site_packages(site_packages, native_digests=native_digests, reporter=reporter)
    if not dists:  # an empty floor would pin nothing: almost always the wrong directory
        raise BadInput(
            f"site-packages directory {site_packages} holds no installed distribution (no *.dist-info or "
            "*.egg-info); point --site-packages at the site-packages/dist-packages directory itself.",
        )
    return BaseManifest(
        image_ref=image_ref,
        image_digest=None,
        os=os_name,
        glibc=glibc,
        python_version=python,
        python_abi="cp" + python.replace(".", ""),
        site_packages=site_packages_label or str(site_packages),
        cuda=cuda,
        platform=platform or platform_for(glibc),
        provenance_kind="reconstructed",
        provenance_method=method
        or f"scanned the directory {site_packages} with build-image base snapshot --site-packages",
        distributions=dists,
    )


# --------------------------------------------------------------------------- the engine (builder/engine.py)


def _engine_error(args: list[str], stderr: str) -> Exception:
    if engine_adapter.engine_unreachable(stderr):  # the one classifier of the CLI's own connection errors
        return EngineUnavailable(
            f"the Docker engine did not answer `docker {args[0]}`: "
            f"{stderr.strip().splitlines()[-1] if stderr.strip() else 'no reply'}.",
            hint="start dockerd (or set DOCKER_HOST) and retry.",
        )
    return ExternalToolError(f"`docker {' '.join(args)}` failed: {stderr.strip()[-800:] or 'no message'}.")


def _docker(args: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    """One engine command through :mod:`builder.engine`, output captured.  Never pulls:
    callers pass ``--pull=never``."""
    proc = engine_adapter.get_engine().cli(args, timeout=1800)
    if check and proc.returncode != 0:
        raise _engine_error(args, proc.stderr)
    return proc


def _docker_stream(args: list[str]) -> subprocess.Popen:
    return engine_adapter.get_engine().popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# --------------------------------------------------------------------------- image reading

_LIBC_NAME = re.compile(r"^libc(-\d+(\.\d+)+)?\.so(\.6)?$")
_LIB_DIRS = ("lib/", "lib64/", "usr/lib/", "usr/lib64/")
_PY_LIB = re.compile(r"^(?P<prefix>(?:.*/)?)lib/python(?P<ver>\d+\.\d+)/(?:site|dist)-packages/")
_PY_DEB_SHARED = "usr/lib/python3/dist-packages/"
_PY_BIN = re.compile(r"^python(\d+\.\d+)$")
_GLIBC_RELEASE = re.compile(rb"release version (\d+\.\d+)")


def _norm(name: str) -> str:
    name = name.lstrip("./")
    while name.startswith("/"):
        name = name[1:]
    return name


def _is_metadata(name: str) -> bool:
    """Files the snapshot reads as text: distribution metadata and system facts."""
    parent, _, base = name.rpartition("/")
    return (
        parent.endswith((".dist-info", ".egg-info"))
        or base.endswith(".egg-info")
        or base in ("os-release", "pyvenv.cfg")
        or _LIBC_NAME.match(base) is not None
    )


def _wanted(name: str) -> bool:
    if name in ("etc/os-release", "usr/lib/os-release") or name.endswith("/pyvenv.cfg"):
        return True
    if name.startswith(_PY_DEB_SHARED) or _PY_LIB.match(name):
        return True
    base = name.rsplit("/", 1)[-1]
    return _LIBC_NAME.match(base) is not None and name.startswith(_LIB_DIRS)


@dataclass
class _ImageTree:
    root: Path
    links: dict[str, str]  # symlink path -> target (as stored)
    entries: set[str]  # every path in the image (names only)

    def resolve(self, path: str, depth: int = 0) -> str:
        """Follow symlinks (absolute or relative) inside the image."""
        path = _norm(path)
        if depth > 40:
            return path
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            head = "/".join(parts[:i])
            if head in self.links:
                target = self.links[head]
                base = "" if target.startswith("/") else "/".join(parts[: i - 1])
                joined = os.path.normpath(os.path.join("/", base, target)).lstrip("/")
                rest = "/".join(parts[i:])
                return self.resolve(f"{joined}/{rest}" if rest else joined, depth + 1)
        return path


def _reading(seen: int, said: str, reporter: Reporter) -> str:
    """``reading image X.XX GB`` as a step when the figure differs from the one ``said`` last; what is said now."""
    now = f"reading image {seen / 1e9:.2f} GB"
    if now != said:
        reporter.step(now)
    return now


def _read_image_tree(cid: str, dest: Path, reporter: Reporter, also: frozenset[str] = frozenset()) -> _ImageTree:
    """Stream ``docker export`` and keep only what the manifest needs (and the files ``also`` names, as paths
    in the image); the bytes read so far are a step on ``reporter`` (``reading image 1.23 GB``) each time their
    10 MB figure changes."""
    import tarfile

    proc = _docker_stream(["export", cid])
    links: dict[str, str] = {}
    entries: set[str] = set()
    seen, said = 0, ""
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                name = _norm(member.name)
                entries.add(name)
                seen += member.size
                said = _reading(seen, said, reporter)
                if member.issym():
                    links[name] = member.linkname
                    continue
                if not _wanted(name) and name not in also:
                    continue
                if member.isfile():
                    src = tar.extractfile(member)
                    if src is None:
                        continue
                    # Only metadata and ELF files are ever read: skip writing the rest
                    # (file creation dominates the cost on slow disks).
                    head = b""
                    if not _is_metadata(name) and name not in also:
                        if not might_be_elf(name):
                            continue
                        head = src.read(4)
                        if head != ELF_MAGIC:
                            continue
                    target = dest / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with open(target, "wb") as out:
                        out.write(head)
                        shutil.copyfileobj(src, out, 1 << 20)
                elif member.islnk():
                    src_path = dest / _norm(member.linkname)
                    if src_path.is_file():
                        target = dest / name
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(src_path, target)
    except tarfile.TarError as exc:
        proc.kill()
        raise ExternalToolError(f"`docker export {cid}` produced an unreadable stream: {exc}.") from None
    finally:
        if proc.stdout:
            proc.stdout.close()
        err = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
        rc = proc.wait()
    if rc != 0:
        raise _engine_error(["export", cid], err)
    return _ImageTree(root=dest, links=links, entries=entries)


def override_files(env: dict[str, str]) -> list[str]:
    """The files the image's ``UV_OVERRIDE`` names (uv reads it as a space-separated list of paths; pure)."""
    return [p for p in env.get("UV_OVERRIDE", "").split() if p]


def parse_override_pins(text: str, where: str) -> list[str]:
    """The requirements of a uv override file (pure): one PEP 508 requirement a line, ``#`` comments; an option
    line (``-r``, ``--index-url``) or anything unreadable is :class:`BadInput` naming ``where`` and the line --
    pins the lock cannot replay are refused, not dropped."""
    from packaging.requirements import InvalidRequirement, Requirement  # only snapshots with UV_OVERRIDE read one

    pins: list[str] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        try:
            if line.startswith("-"):
                raise InvalidRequirement("an option, not a requirement")
            pins.append(str(Requirement(line)))
        except (InvalidRequirement, ValueError) as exc:
            raise BadInput(
                f"{where}:{n}: {line[:200]!r} is not a requirement build-image can take as an override pin ({exc}); "
                "uv applies this file to every install in the image, so the lock cannot be made without it.",
                hint="make the image's UV_OVERRIDE file plain requirements (name==version), or lock on a manifest.",
            ) from None
    return pins


def _image_overrides(ref: str, tree: _ImageTree, env: dict[str, str]) -> list[str] | None:
    """The pins of the image's ``UV_OVERRIDE`` files, read from the exported tree; a named file the tree does
    not hold as a plain file is :class:`BadInput` (uv would fail on it, or read what build-image did not)."""
    files = override_files(env)
    if not files:
        return None
    pins: list[str] = []
    for path in files:
        name = _norm(path)
        got = tree.root / name
        if not got.is_file():
            what = "is a link" if name in tree.links else "is not in the image"
            raise BadInput(
                f"image {ref!r}: its UV_OVERRIDE names {path}, which {what}; build-image reads the override "
                "pins only from a plain file in the image.",
            )
        pins += parse_override_pins(got.read_text(encoding="utf-8", errors="replace"), f"{ref}:{path}")
    return pins


def _read_os_release(tree: _ImageTree) -> str | None:
    for cand in ("etc/os-release", "usr/lib/os-release"):
        p = tree.root / tree.resolve(cand)
        if p.is_file():
            fields = {}
            for line in p.read_text(errors="replace").splitlines():
                if "=" in line:
                    k, v = line.split("=", 1)
                    fields[k.strip()] = v.strip().strip('"')
            return (
                fields.get("PRETTY_NAME") or " ".join(filter(None, [fields.get("NAME"), fields.get("VERSION")])) or None
            )
    return None


def glibc_of_libc(path: Path) -> str | None:
    """glibc release of a ``libc.so.6``: its banner string, else its highest GLIBC_x.y version definition."""
    data = path.read_bytes()
    m = _GLIBC_RELEASE.search(data)
    if m:
        return m.group(1).decode()
    best: Version | None = None
    # why: pyelftools costs tens of ms to import; only a libc without its banner string needs it
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerDefSection

    with open(path, "rb") as fh:
        try:
            for section in ELFFile(fh).iter_sections():
                if isinstance(section, GNUVerDefSection):
                    for _vd, aux_iter in section.iter_versions():
                        for aux in aux_iter:
                            mm = GLIBC_VER.match(aux.name)
                            if mm and (best is None or Version(mm.group(1)) > best):
                                best = Version(mm.group(1))
        except ELFError:
            return None
    return str(best) if best else None


def _image_glibc(tree: _ImageTree) -> str | None:
    for d in (
        "lib/x86_64-linux-gnu",
        "usr/lib/x86_64-linux-gnu",
        "lib64",
        "usr/lib64",
        "lib",
        "usr/lib",
        "lib/aarch64-linux-gnu",
        "usr/lib/aarch64-linux-gnu",
    ):
        p = tree.root / tree.resolve(f"{d}/libc.so.6")
        if p.is_file():
            return glibc_of_libc(p)
    return None


def _python_candidates(tree: _ImageTree, env_path: str) -> list[tuple[str, str]]:
    """``(version, interpreter path)`` for each ``python3`` on the image's PATH, in PATH order."""
    found: list[tuple[str, str]] = []
    for d in [d for d in env_path.split(":") if d]:
        for exe in ("python3", "python"):
            p = _norm(f"{d}/{exe}")
            if p not in tree.entries:
                continue
            real = tree.resolve(p)
            m = _PY_BIN.match(real.rsplit("/", 1)[-1])
            if m:
                found.append((m.group(1), p))
                break  # python3 before python, one per directory
    return found


def _site_dirs(tree: _ImageTree, version: str, interpreter: str | None) -> list[str]:
    """Existing site directories that interpreter ``version`` puts on sys.path, in order."""
    order: list[str] = []
    prefix = _norm(interpreter.rsplit("/bin/", 1)[0]) if interpreter and "/bin/" in interpreter else ""
    if prefix and prefix not in ("usr", "usr/local"):
        # a venv or a self-contained prefix (/opt/venv, /opt/conda)
        order += [f"{prefix}/lib/python{version}/site-packages", f"{prefix}/lib/python{version}/dist-packages"]
        cfg = tree.root / tree.resolve(f"{prefix}/pyvenv.cfg")
        if cfg.is_file():
            text = cfg.read_text(errors="replace").lower().replace(" ", "")
            if "include-system-site-packages=true" not in text:
                order = order[:2]
                return [d for d in (tree.resolve(_norm(o)) for o in order) if (tree.root / d).is_dir()]
    # Debian/Ubuntu system or deadsnakes python, python.org builds under /usr/local: sys.path order
    order += [
        f"usr/local/lib/python{version}/dist-packages",
        f"usr/local/lib/python{version}/site-packages",
        "usr/lib/python3/dist-packages",
        f"usr/lib/python{version}/dist-packages",
        f"usr/lib/python{version}/site-packages",
    ]
    out: list[str] = []
    for d in order:
        d = _norm(d)
        real = tree.resolve(d)
        if real not in out and (tree.root / real).is_dir():
            out.append(real)
    return out


def _versions_from_lib_dirs(tree: _ImageTree) -> list[str]:
    vers = set()
    for e in tree.entries:
        m = _PY_LIB.match(e + "/") if not e.endswith("/") else _PY_LIB.match(e)
        if m:
            vers.add(m.group("ver"))
    return sorted(vers, key=Version)


#: labels of a base image built by ``build-image base materialize`` (builder/image/materialize.py): the replay
#: of a release's recipe, never the published image
REPLAY_LABEL = "org.build-image.base.replay"
REPLAY_MANIFEST_LABEL = "org.build-image.base.manifest-sha256"
REPLAYS_LABEL = "org.build-image.base.replays"


def replay_of(labels: dict | None) -> dict | None:
    """Pure: what an image's labels say of it being a materialized replay (``{"replays": the published image,
    "manifest_sha256": …}``), None for any other image."""
    labels = labels or {}
    if labels.get(REPLAY_LABEL) != "true":
        return None
    return {"replays": labels.get(REPLAYS_LABEL), "manifest_sha256": labels.get(REPLAY_MANIFEST_LABEL)}


def replay_words(replay: dict) -> str:
    """Pure: how a report names a materialized replay."""
    return (
        f"a REPLAY of {replay.get('replays') or 'the published image'} built by `build-image base materialize` "
        f"from the manifest sha256 {replay.get('manifest_sha256') or '?'}, not the published image"
    )


def snapshot_image(
    ref: str,
    *,
    python: str | None = None,
    glibc: str | None = None,
    cuda: str | None = None,
    platform: str | None = None,
    reporter: Reporter = WARNINGS_ON_STDERR,
) -> BaseManifest:
    """A ``read-from-image`` manifest of a LOCAL image (never pulled); the image read and each distribution
    scanned are steps on ``reporter``, a file the scan skips a warning (see :func:`scan_site_packages`)."""
    if python is not None:
        _check_xy(python, "--python")
    if glibc is not None:
        _check_xy(glibc, "--glibc")
    if cuda is not None:
        _check_xy(cuda, "--cuda")
    info = _inspect_local_image(ref)
    env = {}
    for kv in (info.get("Config") or {}).get("Env") or []:
        k, _, v = kv.partition("=")
        env[k] = v
    created = _docker(["create", "--pull=never", "--network=none", ref, "build-image-snapshot-never-started"])
    cid = created.stdout.strip().splitlines()[-1]
    tmp = tempfile.mkdtemp(prefix="bi-image-")
    try:
        scan = _scan_image_tree(ref, cid, Path(tmp), env, python, reporter)
    finally:
        _docker(["rm", "-f", cid], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    if glibc is None:
        glibc = scan.glibc
    if glibc is None:
        raise BadInput(
            f"image {ref!r}: no libc.so.6 found to read the glibc version from (musl or unusual layout?).",
            hint="pass --glibc X.Y explicitly.",
        )
    if cuda is None:
        cuda = _image_cuda(env, scan.dists)
    method = (
        f"read from the local image {ref} (image id {info.get('Id')}) through the Docker engine: "
        f"`docker create` + streamed `docker export`; scanned {', '.join('/' + d for d in scan.dirs)} "
        f"({sum(scan.counts.values())} dist-info), glibc from /lib libc.so.6, OS from /etc/os-release"
        + (", CUDA from the image's CUDA_VERSION" if env.get("CUDA_VERSION") else "")
        + (f", override pins from its UV_OVERRIDE ({env['UV_OVERRIDE']})" if scan.uv_overrides is not None else "")
        + "."
    )
    replay = replay_of((info.get("Config") or {}).get("Labels"))
    if replay is not None:
        method += f" The image is {replay_words(replay)}."
    return BaseManifest(
        image_ref=ref,
        image_digest=_local_image_digest(ref, info),
        os=scan.os_name,
        glibc=glibc,
        python_version=scan.python,
        python_abi="cp" + scan.python.replace(".", ""),
        site_packages="/" + max(scan.dirs, key=lambda d: scan.counts[d]),
        cuda=cuda,
        platform=_image_python_platform(ref, info, platform, glibc),
        provenance_kind="read-from-image",
        provenance_method=method,
        distributions=scan.dists,
        consistency=image_consistency(ref, scan.dists, scan.interpreter),
        uv_overrides=scan.uv_overrides or None,
    )


def _image_python_platform(ref: str, info: dict, platform: str | None, glibc: str) -> str:
    """uv's platform of a snapshot of ``ref``: ``platform`` as given (``--platform``) when it is the image's
    machine, else the image's machine at ``glibc``; a ``--platform`` of the other machine is BadInput."""
    actual = image_platform(ref, info)
    if platform is None:
        return platform_for(glibc, actual.machine)
    given = P.parse_python_platform(platform, where="base snapshot --platform")
    if given != actual:
        raise BadInput(
            f"base snapshot --platform {platform}: the image {ref!r} is a {actual.name} image; a manifest never "
            f"describes one platform's image as the other's.",
            hint=f"snapshot the {given.name} image, or drop --platform.",
        )
    return platform


def image_platform(ref: str, info: dict) -> Platform:
    """The platform of a local image, from its config (``Os``/``Architecture``/``Variant`` of ``docker image
    inspect``); one build-image does not build for (``linux/arm/v7``) is :class:`BadInput` naming it."""
    os_name, arch, variant = info.get("Os") or "linux", info.get("Architecture") or "amd64", info.get("Variant")
    found = P.from_oci(os_name, arch, variant)
    if found is None:
        shown = "/".join(x for x in (os_name, arch, variant) if x)
        raise BadInput(f"image {ref!r} is a {shown} image; build-image builds for {P.known_names()} only.")
    return found


def _inspect_local_image(ref: str) -> dict:
    """``docker image inspect`` of an image the engine holds; one it does not is BadInput."""
    import json as _json

    insp = _docker(["image", "inspect", ref], check=False)
    if insp.returncode != 0:
        err = insp.stderr.lower()
        if "no such image" in err or "no such object" in err:
            raise BadInput(
                f"image {ref!r} is not in the local engine; build-image never pulls implicitly.",
                hint=f"pull or load it first (`docker pull {ref}` / `docker load`), or snapshot a directory "
                "with --site-packages.",
            )
        raise _engine_error(["image", "inspect", ref], insp.stderr)
    return _json.loads(insp.stdout)[0]


def _local_image_digest(ref: str, info: dict) -> str | None:
    """The digest the reference names, else the image's repo digest in the reference's repository."""
    if "@sha256:" in ref:
        return ref.split("@", 1)[1]
    repo = split_ref(ref).familiar_name
    for rd in info.get("RepoDigests") or []:
        if split_ref(rd).familiar_name == repo:
            return rd.split("@", 1)[1]
    return None


@dataclass
class _TreeScan:
    """What an image's file tree says: its Python, site-packages and distributions, glibc, OS."""

    python: str
    interpreter: str | None  # the python3 found on the image's PATH, as a path in the image
    dirs: list[str]
    dists: dict[str, Distribution]
    counts: dict[str, int]  # site-packages directory -> dist-info found there
    glibc: str | None
    os_name: str | None
    uv_overrides: list[str] | None = None  # the pins of the image's UV_OVERRIDE files


def _scan_image_tree(
    ref: str, cid: str, tmp: Path, env: dict[str, str], python: str | None, reporter: Reporter
) -> _TreeScan:
    """Export the created container's file tree into ``tmp`` and read it."""
    tree = _read_image_tree(cid, tmp, reporter, frozenset(_norm(p) for p in override_files(env)))
    cands = _python_candidates(tree, env.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"))
    interpreter = None
    if python is None:
        if cands:
            python, interpreter = cands[0]
        else:
            lib_vers = _versions_from_lib_dirs(tree)
            if len(lib_vers) == 1:
                python = lib_vers[0]
    else:
        interpreter = next((p for v, p in cands if v == python), None)
    if not python:
        raise BadInput(
            f"image {ref!r} has no Python interpreter that build-image can identify "
            "(no python3 on its PATH, no lib/pythonX.Y/site-packages).",
            hint="is this really a Python image? pass --python X.Y if the layout is unusual.",
        )
    dirs = _site_dirs(tree, python, interpreter)
    if not dirs:
        raise BadInput(f"image {ref!r}: no site-packages directory for Python {python} found.")
    dists: dict[str, Distribution] = {}
    counts: dict[str, int] = {}
    for d in dirs:
        found = scan_site_packages(tmp / d, reporter=reporter)
        counts[d] = len(found)
        for k, v in found.items():
            dists.setdefault(k, v)  # first on sys.path wins, as at import time
    return _TreeScan(
        python=python,
        interpreter=interpreter,
        dirs=dirs,
        dists=dists,
        counts=counts,
        glibc=_image_glibc(tree),
        os_name=_read_os_release(tree),
        uv_overrides=_image_overrides(ref, tree, env),
    )


def _image_cuda(env: dict[str, str], dists: dict[str, Distribution]) -> str | None:
    """The image's CUDA X.Y: its CUDA_VERSION, else the CUDA runtime distribution's version."""
    m = re.match(r"^(\d+)\.(\d+)", env.get("CUDA_VERSION", ""))
    if m:
        return f"{m.group(1)}.{m.group(2)}"
    for key in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"):
        if key in dists:
            mv = re.match(r"^(\d+)\.(\d+)", dists[key].version)
            return f"{mv.group(1)}.{mv.group(2)}" if mv else None
    return None


def image_consistency(ref: str, dists: dict[str, Distribution], interpreter: str | None) -> dict | None:
    """The base's own dependency problems: ``pip check`` (``uv pip check`` on a base with uv and
    no pip) run in a throw-away container of the LOCAL image (``--pull=never --network=none``).
    None when the image has neither tool (the checks stage then refuses the base, naming it)."""
    tool = consistency_tool(dists)
    if tool not in dists:
        return None
    py = "/" + _norm(interpreter) if interpreter else "python3"
    argv = (
        [py, "-m", "uv", "pip", "check", "--python", py]
        if tool == "uv"
        else [py, "-m", "pip", "check", "--disable-pip-version-check", "--no-input"]
    )
    proc = _docker(
        ["run", "--rm", "--pull=never", "--network=none", "--entrypoint", argv[0], ref, *argv[1:]], check=False
    )
    out = proc.stdout + proc.stderr
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not checker().problems(proc.stdout)):
        raise ExternalToolError(
            f"`{' '.join(argv)}` in the image {ref} failed ({proc.returncode}): {out.strip()[-600:] or 'no output'}."
        )
    return {"tool": tool, "problems": checker().problems(proc.stdout)}


# --------------------------------------------------------------------------- snapshots cached by image


# what a snapshot reads from an image; a cached snapshot of an older reading is not reused (2: the override pins
# of the image's UV_OVERRIDE)
SNAPSHOT_READING = 2


def _snapshot_cache_path(ref: str, image_id: str) -> Path:
    key = sha256_bytes(f"{__version__}\n{SNAPSHOT_READING}\n{image_id}\n{ref}".encode())[:32]
    return cache_dir() / "snapshots" / f"{key}.json"


def snapshot_cached(ref: str, *, image_id: str) -> tuple[BaseManifest, bool]:
    """(manifest, reused) of a LOCAL image: the snapshot made earlier of the same image ID under
    the same reference (by this tool version), else a new :func:`snapshot_image`, kept for next time."""
    path = _snapshot_cache_path(ref, image_id)
    if path.is_file():
        try:
            return parse_manifest(path.read_text(encoding="utf-8"), str(path)), True
        except (BadInput, OSError, UnicodeDecodeError):
            pass  # a damaged cache entry is made again
    manifest = snapshot_image(ref)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, manifest.to_json())
    return manifest, False
