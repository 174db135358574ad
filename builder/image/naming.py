"""The image's names: its tags and repository (references are parsed by :func:`builder.values.parse_ref`), the
installer and serve backend it is rendered for, and the names of the files a build context holds.

Pure functions and constants, one definition each; :mod:`builder.image.render`,
:mod:`builder.image.provenance`, :mod:`builder.image.push`, :mod:`builder.image.referrers`,
:mod:`builder.serving.kuberay` and the smoke test read them from here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from builder import values
from builder.data import path as data_path
from builder.errors import BadInput
from builder.platforms import KNOWN, Platform
from builder.resolve.lockfile import lock_platform as header_lock_platform

if TYPE_CHECKING:  # types only: the smoke test imports this module, which stays light
    from builder.resolve.lockfile import LockFile
    from builder.resolve.manifest import BaseManifest

# the shell an install runs first: the image's own UV_*/PIP_* settings cleared for that install alone (a base's
# UV_OVERRIDE, as vllm/vllm-openai pins NCCL, would enter --require-hashes as an unhashed requirement); the
# overlay's install (templates/Dockerfile.j2) and materialize's install on its floor both run it
CLEAR_INSTALLER_ENV = (
    "for var in $(env | sed -n 's/^\\(UV_[A-Za-z0-9_]*\\)=.*/\\1/p; s/^\\(PIP_[A-Za-z0-9_]*\\)=.*/\\1/p'); "
    'do unset "$var"; done;'
)

# files of a build context (its pylock.toml: builder.resolve.lockfile.PYLOCK_NAME)
SBOM_FILE = "sbom.cdx.json"
PROVENANCE_FILE = "provenance.intoto.json"
CHECKS_DIR = "checks"  # the floor checks the image build runs (templates/checks/)
CHECKER_FILE = "base_check.py"
MANIFEST_COPY = "base-manifest.json"  # the base manifest the lock was made against, byte for byte
CONSTRAINTS_PATH = "/etc/build-image/constraints.txt"  # in the image: its constraint set (PIP_/UV_CONSTRAINT)

# the Ray Serve application the image carries (templates/serve/build_image_serve_app.py)
SERVE_MODULE = "build_image_serve_app"
SERVE_APP_FILE = f"{SERVE_MODULE}.py"
SERVE_BACKENDS = ("auto", "ray-serve-llm", "vllm-server")
#: In the image: vLLM's compile cache (VLLM_CACHE_ROOT) with Triton's kernels below it, one directory for a volume
#: to keep across pod restarts (docs/cold-start.md: a kept cache cut engine init from 56.9 s to 16.4 s on the H200).
VLLM_CACHE_ROOT = "/var/cache/vllm"
TRITON_CACHE_DIR = f"{VLLM_CACHE_ROOT}/triton"
SERVE_BACKEND_ENV = "BUILD_IMAGE_SERVE_BACKEND"  # what build_image_serve_app reads as its default backend

LABEL_PREFIX = "org.build-image"


def serve_app_source() -> Path:
    """The Serve application module the image carries (package data)."""
    return data_path(f"templates/serve/{SERVE_APP_FILE}")


def serve_backend_of(lock: LockFile) -> str:
    """The lock header's ``serve-backend`` (``auto`` for a lock without one); anything else is refused."""
    value = (lock.header.get("serve-backend") or "auto").strip()
    if value not in SERVE_BACKENDS:
        raise BadInput(
            f"lock{f' {lock.path}' if getattr(lock, 'path', None) else ''}: header 'serve-backend' is "
            f"{value!r}; it must be one of {', '.join(SERVE_BACKENDS)}.",
            hint="regenerate the lock with `build-image lock`.",
        )
    return value


def lock_platform(lock: LockFile) -> Platform:
    """The platform a lock was made for (:func:`builder.resolve.lockfile.lock_platform`: its header's
    ``platform``; a lock naming none or another is refused)."""
    return header_lock_platform(lock)


def tag_names(vllm: str, lock_hash: str) -> list[str]:
    """The two tag names: content-addressed first, then the moving one."""
    return [f"vllm{vllm}-{lock_hash[:12]}", f"vllm{vllm}"]


def is_content_addressed(tag: str) -> bool:
    """``REPO:vllm<v>-<12 hex>`` (names one lock; a platform's image of a multi-platform build carries
    ``-<slug>`` after it) as opposed to the moving ``REPO:vllm<v>`` (``REPO:vllm<v>-linux-arm64``)."""
    slugs = "|".join(re.escape(p.slug) for p in KNOWN)
    return re.search(rf":vllm[^:/]*-[0-9a-f]{{12}}(-({slugs}))?$", tag) is not None


def image_tags(repo: str, vllm: str, lock_hash: str) -> list[str]:
    """``REPO:<tag>`` for both :func:`tag_names`; a repository with a tag or digest, or one the
    registry would refuse, is :class:`BadInput` here rather than at ``docker build``."""
    repo = repo.strip()
    if not repo or "@" in repo or repo.rsplit("/", 1)[-1].count(":"):
        raise BadInput(
            f"--tag {repo!r}: give an image repository without a tag or digest (e.g. 127.0.0.1:5000/serving/vllm)."
        )
    repo = values.Repository(repo, "--tag")  # the registry part too: a host[:port], nothing a shell or terminal reads
    tags = tag_names(vllm, lock_hash)
    bad = [t for t in tags if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", t)]
    if bad:
        raise BadInput(
            f"vllm version {vllm!r} gives the tag(s) {', '.join(bad)}, which are not valid image tags "
            "(letters, digits, '_', '.', '-'; at most 128)."
        )
    return [values.ImageRef(f"{repo}:{t}", "an image tag") for t in tags]


def default_repo() -> str:
    """The repository the tags are made for when neither ``--tag`` nor the spec names one (the same
    for every release)."""
    return "build-image/vllm-serving"


def choose_installer(base: BaseManifest) -> str:
    """uv when the base image carries it (the official vLLM image does), else pip."""
    return "uv" if base.get("uv") is not None else "pip"
