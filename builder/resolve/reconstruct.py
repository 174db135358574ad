"""Reconstruct a base manifest for a vLLM release from its recipe (when the image cannot be pulled).

The official ``vllm/vllm-openai:vX`` image's Python layer is the vllm wheel's
closure plus the extras its ``docker/Dockerfile`` installs, on a CUDA base
image with a known OS, glibc and Python.  :func:`reconstruct` rebuilds that
layer on this machine and scans it like ``base snapshot --site-packages``:

1. the recipe (``lockfiles/base/recipes.toml``, :func:`load_recipes`) gives the
   base image, OS, glibc, Python, install location and extras of release X;
2. the exclude-newer instant is the upload time of the vllm X wheel for the
   platform **as the index reports it** (:func:`release_instant`), rounded up to
   the next second — the versions the image's build saw on its day;
3. ``uv pip install --target DIR`` for the described interpreter (never run), then
4. the binary scan of DIR (:func:`builder.resolve.base.snapshot_site_packages`), with a
   provenance text that says exactly how, and what is knowingly different from the
   real image.

Pure parts: :func:`parse_recipes`, :func:`recipe_for`, :func:`provenance_text`.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from builder.errors import BadInput, ExternalToolError, Unsatisfiable
from builder.resolve import index as ix
from builder.resolve.base import snapshot_site_packages
from builder.resolve.index import format_time
from builder.resolve.lock import Uv, _is_resolution_failure, target_tags, trim_derivation
from builder.resolve.manifest import BaseManifest
from builder.spec import lockfiles_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RECIPES_SCHEMA = "build-image/base-recipes/v1"
_KEYS = {"image": str, "python": str, "site_packages": str, "arch": str, "cuda": str, "final_base_image": str,
         "os": str, "glibc": str, "extras": list, "not_on_index": list, "source": str}


@dataclass(frozen=True)
class Recipe:
    vllm: str
    image: str
    python: str
    site_packages: str
    arch: str
    cuda: str
    final_base_image: str
    os: str
    glibc: str
    extras: tuple[str, ...]
    not_on_index: tuple[str, ...]
    source: str

    @property
    def platform(self) -> str:
        return f"{self.arch}-manylinux_{self.glibc.replace('.', '_')}"

    @property
    def requirements(self) -> list[str]:
        return [f"vllm=={self.vllm}", *self.extras]


def default_recipes_path() -> Path:
    return lockfiles_dir() / "base" / "recipes.toml"


def parse_recipes(text: str, path: str = "recipes.toml") -> dict[str, Recipe]:
    """Every release's recipe (defaults applied); a bad file is :class:`BadInput` naming the key (pure)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"recipes {path} is not valid TOML: {exc}.") from None
    if doc.get("schema") != RECIPES_SCHEMA:
        raise BadInput(f"recipes {path}: 'schema' must be {RECIPES_SCHEMA!r}, got {doc.get('schema')!r}.")
    unknown = set(doc) - {"schema", "defaults", "release"}
    if unknown:
        raise BadInput(f"recipes {path}: unknown top-level key(s) {', '.join(sorted(unknown))} "
                       "(known: schema, defaults, release).")
    defaults = doc.get("defaults", {})
    _check_table(defaults, path, "defaults")
    out: dict[str, Recipe] = {}
    for vllm, table in (doc.get("release") or {}).items():
        where = f'release."{vllm}"'
        try:
            Version(vllm)
        except InvalidVersion:
            raise BadInput(f"recipes {path}: [{where}] is not a version.") from None
        _check_table(table, path, where)
        merged: dict[str, Any] = {**defaults, **table}
        missing = sorted(k for k in _KEYS if k not in merged)
        if missing:
            raise BadInput(f"recipes {path}: [{where}] lacks {', '.join(missing)} (and [defaults] does not set it).")
        out[vllm] = Recipe(vllm=vllm, image=merged["image"].format(vllm=vllm), python=merged["python"],
                           site_packages=merged["site_packages"], arch=merged["arch"], cuda=merged["cuda"],
                           final_base_image=merged["final_base_image"], os=merged["os"], glibc=merged["glibc"],
                           extras=tuple(merged["extras"]), not_on_index=tuple(merged["not_on_index"]),
                           source=" ".join(merged["source"].split()))
    return out


def _check_table(table: dict, path: str, where: str) -> None:
    import re

    for k, v in table.items():
        if k not in _KEYS:
            raise BadInput(f"recipes {path}: [{where}] unknown key '{k}' (known: {', '.join(sorted(_KEYS))}).")
        if not isinstance(v, _KEYS[k]) or (isinstance(v, list) and not all(isinstance(x, str) for x in v)):
            raise BadInput(f"recipes {path}: [{where}] '{k}' must be a "
                           f"{'list of strings' if _KEYS[k] is list else 'string'}, got {v!r:.60}.")
        if k in ("python", "glibc", "cuda") and not re.fullmatch(r"\d+\.\d+", v):
            raise BadInput(f"recipes {path}: [{where}] '{k}' must look like X.Y, got {v!r}.")


def load_recipes(path: Path | None = None) -> dict[str, Recipe]:
    p = Path(path) if path else default_recipes_path()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"recipes file {p} cannot be read: {exc.strerror or exc}.") from None
    return parse_recipes(text, str(p))


def recipe_for(recipes: dict[str, Recipe], vllm: str, path: str = "lockfiles/base/recipes.toml") -> Recipe:
    if vllm not in recipes:
        known = ", ".join(sorted(recipes, key=Version)) or "none"
        raise BadInput(f"no recipe for vllm {vllm} in {path} (known: {known}).",
                       hint=f'add a [release."{vllm}"] table (see the file\'s header), then run '
                            f"`build-image base reconstruct --vllm {vllm}`.")
    return recipes[vllm]


def release_instant(index, recipe: Recipe) -> tuple[datetime, str]:
    """(the vllm wheel's upload time, the exclude-newer instant: the next whole second after it)."""
    tags = set(target_tags(recipe.python, "cp" + recipe.python.replace(".", ""), recipe.platform))
    want = Version(recipe.vllm)
    files = [f for f in index.files("vllm") if f.version == want and f.filename.endswith(".whl")
             and not tags.isdisjoint(f.tags)]
    if not files:
        raise Unsatisfiable(f"the index has no vllm {recipe.vllm} wheel for {recipe.platform} (Python {recipe.python}).")
    times = [f.upload_time for f in files if f.upload_time is not None]
    if not times:
        raise BadInput(f"the index reports no upload time for the vllm {recipe.vllm} wheel "
                       f"({files[0].filename}); the exclude-newer instant cannot be derived.")
    t = max(times)
    after = t.replace(microsecond=0) + timedelta(seconds=1)  # uv excludes a file uploaded at the instant itself
    return t, format_time(after)


def provenance_text(recipe: Recipe, *, command: str, uv_version: str, uploaded: datetime, instant: str,
                    cuda_found: str | None, day: str) -> str:
    """What the manifest's ``provenance.method`` says (pure)."""
    diff = [
        f"OS packages ({recipe.os} debs, the system Python's dist-packages) are not scanned",
        "pip and uv, which the Dockerfile puts into the same dist-packages, are absent",
        f"glibc {recipe.glibc} and CUDA {recipe.cuda} are the recipe's values for {recipe.final_base_image}, "
        "not read from a libc",
        f"versions are those the index served up to {instant} (the vllm wheel's upload time), so a package "
        "released later on the image's build day would differ",
        "the image digest is unknown (null)",
    ]
    if recipe.not_on_index:
        diff.append(f"{', '.join(recipe.not_on_index)} (installed by the Dockerfile from another index) is absent")
    if cuda_found and cuda_found != recipe.cuda:
        diff.append(f"the tree's nvidia-cuda-runtime says CUDA {cuda_found}, the recipe {recipe.cuda}")
    return (
        f"Reconstructed, not read from the image ({recipe.image} cannot be pulled here). On {day} with "
        f"{uv_version}: `{command}` (the closure the release's docker/Dockerfile installs into {recipe.site_packages}: "
        f"the vllm wheel's requirements plus {', '.join(recipe.extras) or 'nothing else'}), exclude-newer = the "
        f"vllm {recipe.vllm} wheel's upload time on the index ({uploaded.isoformat()}, rounded up); then the "
        f"binary scan of `build-image base snapshot --site-packages DIR --python {recipe.python} --glibc "
        f"{recipe.glibc} --cuda {recipe.cuda}`. Recipe: {recipe.source}. Knowingly different from the real image: "
        + "; ".join(diff) + "."
    )


@dataclass
class Reconstruction:
    manifest: BaseManifest
    recipe: Recipe
    exclude_newer: str
    uploaded: datetime
    timings: dict[str, float] = field(default_factory=dict)
    files: int = 0


def _cuda_of(manifest: BaseManifest) -> str | None:
    for name in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"):
        d = manifest.get(name)
        if d is not None:
            parts = d.version.split(".")
            return ".".join(parts[:2]) if len(parts) >= 2 else None
    return None


def reconstruct(recipe: Recipe, *, index=None, uv=None, find_links: list[str] | None = None, no_index: bool = False,
                index_url: str | None = None, keep: Path | None = None,
                progress: Callable[[str], None] | None = None) -> Reconstruction:
    """Install the recipe's closure into a scratch tree, scan it, return the manifest (nothing written)."""
    say = progress or (lambda _m: None)
    uv = uv or Uv()
    find_links = list(find_links or [])
    index = index or ix.for_request(find_links, no_index)
    if index_url is None and not no_index:
        index_url = ix.index_url()  # named on the command line: the provenance shows where files came from
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    uploaded, instant = release_instant(index, recipe)
    timings["index"] = time.monotonic() - t0
    scratch = Path(tempfile.mkdtemp(prefix="bi-reconstruct-")) if keep is None else Path(keep)
    if keep is not None:
        if scratch.exists() and any(scratch.iterdir()):
            raise BadInput(f"--keep {scratch}: the directory is not empty.")
        scratch.mkdir(parents=True, exist_ok=True)
    target = scratch / "dist-packages"
    try:
        say(f"installing vllm=={recipe.vllm} + {len(recipe.extras)} extras for {recipe.platform} "
            f"(exclude-newer {instant}; uv)")
        t0 = time.monotonic()
        cmd, r = uv.install_target(target, recipe.requirements, python_version=recipe.python,
                                   platform=recipe.platform, exclude_newer=instant, find_links=find_links,
                                   no_index=no_index, index_url=index_url)
        timings["install"] = time.monotonic() - t0
        if r.returncode != 0:
            if _is_resolution_failure(r.stderr):
                raise Unsatisfiable(f"the recipe for vllm {recipe.vllm} does not resolve:\n{trim_derivation(r.stderr)}")
            raise ExternalToolError(f"uv pip install --target failed (exit {r.returncode}):\n{trim_derivation(r.stderr)}")
        say(f"scanning {target}")
        t0 = time.monotonic()
        count = [0]

        def on_dist(name: str, idx: int, total: int) -> None:
            count[0] = total

        manifest = snapshot_site_packages(
            target, python=recipe.python, glibc=recipe.glibc, cuda=recipe.cuda, platform=recipe.platform,
            image_ref=recipe.image, os_name=f"{recipe.os} ({recipe.final_base_image})",
            site_packages_label=recipe.site_packages, method="-", progress=on_dist)
        timings["scan"] = time.monotonic() - t0
        shown = ["uv", "pip", "install", "--target", "DIR", *cmd[cmd.index("--python-version"):]]
        drop = {"--python", "--color", "--link-mode"}
        cleaned: list[str] = []
        skip = False
        for a in shown:
            if skip:
                skip = False
                continue
            if a in drop:
                skip = True
                continue
            cleaned.append(a)
        manifest.provenance_method = provenance_text(
            recipe, command=shlex.join(cleaned), uv_version=f"uv {uv.version()}", uploaded=uploaded, instant=instant,
            cuda_found=_cuda_of(manifest), day=datetime.now(timezone.utc).strftime("%Y-%m-%d"))
        files = sum(1 for _ in target.rglob("*")) if keep is not None else 0
        return Reconstruction(manifest=manifest, recipe=recipe, exclude_newer=instant, uploaded=uploaded,
                              timings=timings, files=files)
    finally:
        if keep is None:
            t0 = time.monotonic()
            shutil.rmtree(scratch, ignore_errors=True)
            timings["cleanup"] = time.monotonic() - t0
