"""``build-image base materialize``: an OCI image of a release's replayed base, built from its manifest.

Where ``vllm/vllm-openai:vX`` cannot be pulled (no Docker Hub, a mirror of PyPI only), the replay that
``base reconstruct`` ran (:mod:`builder.resolve.reconstruct`) is made an image the pipeline can build on
(``--base REF``):

1. the manifest must be the replay of the release's recipe (:func:`recipe_mismatches`: the sdist, the
   image it stands for, Python, site-packages, platform, glibc, CUDA, the UV_OVERRIDE pins) -- else
   :class:`BadInput` naming each field;
2. each of the manifest's distributions, at its exact version, is taken from the indexes the replay asked
   (the Python index and the other indexes its steps recorded), the wheel an installer picks for the
   recipe's Python and platform, uploaded before the replay's exclude-newer instant
   (:func:`select_wheels`); downloaded with its sha256 (:func:`builder.fetch.fetch`);
3. the context (:func:`write_context`) installs them on a LOCAL floor image that holds the recipe's
   Python (``--from``; never pulled) with that Python's own installer, offline, hash-checked,
   ``--no-deps``, checks each landed in the recipe's site-packages, and sets the release Dockerfile's
   environment, working directory and entrypoint (:mod:`builder.image.replay_config`);
4. the engine adapter builds it (``--network=none``; podman with ``--pull=never``), labelled as a replay:
   ``org.build-image.base.replay=true``, the manifest's sha256, the image it stands for, and what the
   replay cannot hold (:data:`LACKS_LABEL`: the manifest's ``lacks`` and the floor it was laid on).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from packaging.version import Version

from builder.credentials import redact_text, redact_value
from builder.engine import builds_for
from builder.errors import BadInput, Unsatisfiable
from builder.events import SILENT, Reporter
from builder.fetch import fetch
from builder.image.naming import CLEAR_INSTALLER_ENV
from builder.image.replay_config import ImageConfig
from builder.platforms import Platform
from builder.resolve import index as ix
from builder.resolve.base import REPLAY_LABEL, REPLAY_MANIFEST_LABEL, REPLAYS_LABEL
from builder.resolve.index import IndexFile, parse_time
from builder.resolve.lock import select_wheel, target_tags
from builder.resolve.lockfile import WheelCandidate
from builder.resolve.manifest import BaseManifest
from builder.resolve.recipe import Recipe
from builder.util import canonical_name

MANIFEST_LABEL = REPLAY_MANIFEST_LABEL
LACKS_LABEL = "org.build-image.base.lacks"
FLOOR_LABEL = "org.build-image.base.floor"
MANIFEST_IN_IMAGE = "/usr/share/build-image/replay-manifest.json"


def default_tag(vllm: str, platform: Platform) -> str:
    """Where a materialized base goes unless ``--tag``: never the published name (pure)."""
    return f"build-image.local/vllm/vllm-openai:v{vllm}-replay{platform.file_suffix()}"


# --------------------------------------------------------------------------- the manifest against its recipe
def recipe_mismatches(manifest: BaseManifest, recipe: Recipe) -> list[str]:
    """Each field where ``manifest`` is not the replay of ``recipe`` (pure): "field: manifest X, recipe Y"."""
    out: list[str] = []
    if manifest.provenance_kind != "reconstructed" or not isinstance(manifest.provenance_recipe, dict):
        return [
            f"provenance.kind: manifest {manifest.provenance_kind!r}, a replay is 'reconstructed' "
            "(with provenance.recipe)"
        ]
    sdist = manifest.provenance_recipe.get("sdist") or {}
    want = {
        "provenance.recipe.sdist.sha256": (sdist.get("sha256"), recipe.sdist.sha256),
        "provenance.recipe.sdist.filename": (sdist.get("filename"), recipe.sdist.filename),
        "image.ref": (manifest.image_ref, recipe.image),
        "python.version": (manifest.python_version, recipe.python.value),
        "python.site_packages": (manifest.site_packages, recipe.site_packages.value),
        "platform": (manifest.platform, recipe.platform),
        "glibc": (manifest.glibc, recipe.glibc.value),
        "cuda": (manifest.cuda, recipe.cuda.value),
        "uv_overrides": (list(manifest.uv_overrides or []), [d.value for d in recipe.image_overrides]),
    }
    for field_name, (have, should) in want.items():
        if have != should:
            out.append(f"{field_name}: manifest {have!r}, recipe {should!r}")
    vllm = manifest.get("vllm")
    if vllm is not None and vllm.version != recipe.vllm:
        out.append(f"distributions.vllm.version: manifest {vllm.version!r}, recipe {recipe.vllm!r}")
    return out


def check_manifest(manifest: BaseManifest, recipe: Recipe, label: str) -> None:
    """:class:`BadInput` (exit 2) naming every field where the manifest is not its recipe's replay."""
    wrong = recipe_mismatches(manifest, recipe)
    if wrong:
        raise BadInput(
            f"base materialize: the manifest {label} does not match the recipe of vllm {recipe.vllm} "
            f"({recipe.sdist.filename}) in {len(wrong)} field(s): " + "; ".join(wrong) + ".",
            hint=f"materialize the manifest of that replay: `build-image base reconstruct --vllm {recipe.vllm} "
            "-o FILE`, then `--manifest FILE`.",
        )


# --------------------------------------------------------------------------- the wheels
def replay_indexes(manifest: BaseManifest, default_index: str | None) -> list[str]:
    """The indexes the replay asked, in order: its Python index, then each other index a step recorded
    asking (pure; a step that could not reach an index did not ask it)."""
    urls = [default_index] if default_index else []
    for step in (manifest.provenance_recipe or {}).get("steps") or []:
        for u in step.get("indexes") or [] if isinstance(step, dict) else []:
            if isinstance(u, str):
                urls.append(u.rstrip("/"))
    return list(dict.fromkeys(urls))


def select_wheels(manifest: BaseManifest, index, *, before: datetime | None) -> tuple[dict[str, IndexFile], list[str]]:
    """(canonical name -> the wheel an installer picks for each distribution of the manifest at its exact
    version, uploaded before ``before``; the distributions no asked index serves so, each with why)."""
    tags = target_tags(manifest.python_version, manifest.python_abi, manifest.platform)
    chosen: dict[str, IndexFile] = {}
    missing: list[str] = []
    for key, dist in sorted(manifest.distributions.items()):
        try:
            want = Version(dist.version)
        except ValueError:  # InvalidVersion, or a part past int()'s digit limit
            missing.append(f"{dist.name} {dist.version} (not a version an index can serve)")
            continue
        files = [
            f
            for f in index.files(dist.name)
            if f.version == want and not f.yanked and not (before and f.upload_time and f.upload_time >= before)
        ]
        by_url = {f.url: f for f in files}
        pick = select_wheel([WheelCandidate(filename=f.filename, url=f.url, sha256=f.sha256) for f in files], tags, key)
        if pick is None:
            missing.append(
                f"{dist.name}=={dist.version} (no wheel for Python {manifest.python_version} on "
                f"{manifest.platform}" + (f" uploaded before {before.isoformat()}" if before else "") + ")"
            )
            continue
        chosen[key] = by_url[pick.url]
    return chosen, missing


def sources(manifest: BaseManifest, find_links: Iterable[str], no_index: bool, index_url: str | None):
    """The index the wheels come from (adapter): ``--find-links`` folders, then (unless ``--no-index``) the
    replay's indexes (:func:`replay_indexes`)."""
    chain: list = [ix.FindLinks(find_links)]
    if not no_index:
        chain += [ix.SimpleIndex(u) for u in replay_indexes(manifest, index_url or ix.index_url())]
    return ix.Chain(chain)


# --------------------------------------------------------------------------- the context
def _q(text: str) -> str:
    """A Dockerfile double-quoted word with no expansion (pure)."""
    return json.dumps(text, ensure_ascii=False).replace("$", "\\$")


def _env_line(name: str, value: str, from_floor: bool) -> str:
    """``ENV NAME="value"``: expanded by the engine only where the value uses the floor's variables (pure)."""
    return f"ENV {name}={json.dumps(value, ensure_ascii=False) if from_floor else _q(value)}"


def lacks_summary(manifest: BaseManifest, floor: str, recipe: Recipe) -> dict[str, list[str]]:
    """What the replay image cannot hold (pure): the manifest's ``lacks`` (each category's items), the
    distributions it cannot version, and the floor that stands for the release's final base image."""
    out: dict[str, list[str]] = {}
    for k, v in sorted((manifest.lacks or {}).items()):
        if k == "unversioned" and isinstance(v, dict):
            out[k] = sorted(v)
        elif isinstance(v, list) and v:
            out[k] = [str(x) for x in v]
    out["floor"] = [
        f"{recipe.final_base_image.value} (and the OS packages its steps install) is replaced by the local "
        f"image {floor}"
    ]
    return out


_INSTALL = """\
RUN --mount=type=bind,source=wheels,target=/build-image/wheels \\
    --mount=type=bind,source=requirements.txt,target=/build-image/requirements.txt \\
    --mount=type=bind,source=placed.py,target=/build-image/placed.py \\
    set -eu; \\
    py={py}; \\
    command -v "$py" >/dev/null || {{ \\
      echo "build-image check: the floor image {floor} has no $py (the recipe's Python {version})" >&2; exit 1; }}; \\
    {clear_env} \\
    if "$py" -c 'import pip' 2>/dev/null; then \\
      PIP_BREAK_SYSTEM_PACKAGES=1 "$py" -m pip install --no-cache-dir --no-index --no-deps --require-hashes \\
        --disable-pip-version-check --find-links /build-image/wheels -r /build-image/requirements.txt; \\
    elif "$py" -c 'import uv' 2>/dev/null; then \\
      UV_BREAK_SYSTEM_PACKAGES=1 "$py" -m uv pip install --system --python "$py" --no-cache --no-index --no-deps \\
        --require-hashes --find-links /build-image/wheels -r /build-image/requirements.txt; \\
    else echo "build-image check: the floor image {floor} has neither pip nor uv for $py" >&2; exit 1; fi; \\
    PYTHONDONTWRITEBYTECODE=1 "$py" /build-image/placed.py {site} /build-image/requirements.txt
"""

_PLACED = '''\
"""build-image check: every distribution of the replay is installed in the recipe's site-packages."""
import importlib.metadata as md
import os
import re
import sys

site, reqs = os.path.realpath(sys.argv[1]), sys.argv[2]
if site not in {os.path.realpath(p) for p in sys.path}:
    sys.exit(f"build-image check: {sys.argv[1]} (the recipe's site-packages) is not on sys.path of {sys.executable}")
wrong = []
for line in open(reqs, encoding="utf-8"):
    m = re.match(r"^([A-Za-z0-9._-]+)==(\\S+)", line)
    if not m:
        continue
    name, version = m.groups()
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        wrong.append(f"{name} (not installed)")
        continue
    where = os.path.realpath(str(dist.locate_file("")))
    if where != site or dist.version != version:
        wrong.append(f"{name} {dist.version} in {where}")
if wrong:
    sys.exit("build-image check: installed elsewhere than " + site + ": " + ", ".join(wrong))
'''


def dockerfile_text(
    manifest: BaseManifest,
    recipe: Recipe,
    config: ImageConfig,
    *,
    floor: str,
    labels: Mapping[str, str],
    overrides_path: str | None,
) -> str:
    """The replay image's Dockerfile (pure): the floor, the offline hash-checked install of the wheelhouse, the
    release's environment, working directory and entrypoint, the manifest in the image, the labels."""
    if not re.fullmatch(r"\d+\.\d+", recipe.python.value):  # it reaches a shell line of the build
        raise BadInput(f"the recipe's Python {recipe.python.value!r} is not X.Y.")
    py = f"python{recipe.python.value}"
    lines = [
        "# Rendered by build-image base materialize: the replay of "
        f"{recipe.image} ({recipe.sdist.filename}) on the local floor {floor}; do not edit by hand.",
        f"FROM {floor}",
        _INSTALL.format(
            py=py,
            floor=floor,
            version=recipe.python.value,
            site=_q(recipe.site_packages.value),
            clear_env=CLEAR_INSTALLER_ENV,
        ),
    ]
    if overrides_path:  # the image's ENV UV_OVERRIDE names a file its own steps write
        lines.append(f"COPY uv-overrides.txt {_q(overrides_path)}")
    lines.append(f"COPY replay-manifest.json {MANIFEST_IN_IMAGE}")
    lines += [_env_line(e.name, e.value, e.from_floor) for e in config.env]
    if config.workdir:
        lines.append(f"WORKDIR {_q(config.workdir)}")
    if config.entrypoint is not None:
        lines.append("ENTRYPOINT " + json.dumps(list(config.entrypoint)))
    if config.cmd is not None:
        lines.append("CMD " + json.dumps(list(config.cmd)))
    lines.append("LABEL " + " \\\n      ".join(f"{k}={_q(v)}" for k, v in sorted(labels.items())))
    return "\n".join(lines) + "\n"


def requirements_text(chosen: Mapping[str, IndexFile], manifest: BaseManifest) -> str:
    """``name==version --hash=sha256:…`` for each chosen wheel (pure)."""
    return "".join(
        f"{canonical_name(manifest.distributions[k].name)}=={manifest.distributions[k].version} "
        f"--hash=sha256:{f.sha256}\n"
        for k, f in sorted(chosen.items())
    )


@dataclass(frozen=True)
class Materialized:
    """What ``base materialize`` built."""

    tag: str
    image_id: str
    vllm: str
    platform: str
    floor: str
    manifest_sha256: str
    distributions: int
    lacks: dict[str, list[str]]
    labels: dict[str, str]
    seconds: dict[str, float]

    def to_dict(self) -> dict:
        return {
            "tag": self.tag,
            "image_id": self.image_id,
            "vllm": self.vllm,
            "platform": self.platform,
            "floor": self.floor,
            "replay": True,
            "manifest_sha256": self.manifest_sha256,
            "distributions": self.distributions,
            "lacks": self.lacks,
            "labels": self.labels,
            "seconds": self.seconds,
        }


def replay_labels(
    manifest: BaseManifest, recipe: Recipe, *, manifest_sha256: str, floor: str, floor_id: str
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(the labels that say the image is a replay, what it lacks) (pure)."""
    lacks = lacks_summary(manifest, floor, recipe)
    labels = {
        REPLAY_LABEL: "true",
        MANIFEST_LABEL: manifest_sha256,
        REPLAYS_LABEL: recipe.image,
        FLOOR_LABEL: redact_text(f"{floor} ({floor_id})"),
        # a label is read by anyone who can pull the image: every string in it redacted, as a report is
        LACKS_LABEL: json.dumps(redact_value(lacks), sort_keys=True, separators=(",", ":")),
        "org.build-image.base.recipe-sdist-sha256": recipe.sdist.sha256,
        "org.opencontainers.image.title": f"replay of {recipe.image} (build-image base materialize; not the "
        "published image)",
    }
    return labels, lacks


def write_context(
    ctx: Path,
    manifest: BaseManifest,
    manifest_bytes: bytes,
    recipe: Recipe,
    config: ImageConfig,
    wheels: Mapping[str, Path],
    chosen: Mapping[str, IndexFile],
    *,
    floor: str,
    labels: Mapping[str, str],
) -> None:
    """The build context of the replay image in ``ctx`` (an empty scratch folder): Dockerfile, wheels/ (hard
    links to the verified downloads where the file system allows), requirements.txt, placed.py, the manifest."""
    (ctx / "wheels").mkdir()
    for key, path in wheels.items():
        dest = ctx / "wheels" / chosen[key].filename
        try:
            os.link(path, dest)
        except OSError:
            shutil.copyfile(path, dest)
    (ctx / "requirements.txt").write_text(requirements_text(chosen, manifest), encoding="utf-8")
    (ctx / "placed.py").write_text(_PLACED, encoding="utf-8")
    (ctx / "replay-manifest.json").write_bytes(manifest_bytes)
    overrides_path = next((e.value for e in config.env if e.name == "UV_OVERRIDE" and not e.from_floor), None)
    if overrides_path and manifest.uv_overrides:
        (ctx / "uv-overrides.txt").write_text("".join(p + "\n" for p in manifest.uv_overrides), encoding="utf-8")
    else:
        overrides_path = None
    (ctx / "Dockerfile").write_text(
        dockerfile_text(manifest, recipe, config, floor=floor, labels=labels, overrides_path=overrides_path),
        encoding="utf-8",
    )


# --------------------------------------------------------------------------- the command's work
def check_platform(engine, platform: Platform) -> None:
    """The engine on this host must be able to build ``platform``'s image; else :class:`BadInput` (exit 2)
    naming the platform (:func:`builder.engine.builds_for`)."""
    if not builds_for(platform):
        raise BadInput(
            f"base materialize --platform {platform.name}: the {engine.name} engine on this {os.uname().machine} "
            f"host cannot build {platform.name} images (no qemu-{platform.machine} handler in binfmt_misc).",
            hint="build on a host of that platform, or register QEMU's binfmt handlers "
            "(scripts/services.sh install does it here).",
        )


def check_floor(engine, floor: str, platform: Platform) -> str:
    """The floor image's ID: the engine must hold it (never pulled) and it must be ``platform``'s; else
    :class:`BadInput` (exit 2) naming it."""
    check_platform(engine, platform)
    engine.ping()
    info = engine.inspect(floor)
    if info is None:
        raise BadInput(
            f"base materialize: the floor image {floor} is not in the local {engine.name} store; build-image never "
            "pulls.",
            hint="load it first (`docker load` / `podman load`), or name a local image holding the recipe's Python "
            "with --from.",
        )
    if info.platform is not None and info.platform != platform:
        raise BadInput(
            f"base materialize: the floor image {floor} is a {info.platform_name} image, the replay is for "
            f"{platform.name}."
        )
    return info.id


def download_wheels(chosen: Mapping[str, IndexFile], reporter: Reporter) -> dict[str, Path]:
    """Each chosen wheel, downloaded and sha256-verified into the download cache (adapter)."""
    out = {}
    for key, f in sorted(chosen.items()):
        reporter.step(f"fetching {f.filename}")
        out[key] = fetch(f.url, f.sha256, filename=f.filename, reporter=reporter)
    return out


def pick_wheels(manifest: BaseManifest, index) -> dict[str, IndexFile]:
    """The wheels of the manifest's distributions (:func:`select_wheels`); a distribution no asked index serves
    at its version is :class:`Unsatisfiable` (exit 4) naming each."""
    before = parse_time((manifest.provenance_recipe or {}).get("exclude_newer"))
    chosen, missing = select_wheels(manifest, index, before=before)
    if missing:
        raise Unsatisfiable(
            f"base materialize: {len(missing)} distribution(s) of the manifest are on none of the indexes the "
            "replay asked: " + "; ".join(missing) + ".",
            hint="run it where the replay ran (the same indexes), or give the wheels with --find-links DIR.",
        )
    return chosen


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_replay(
    engine,
    manifest: BaseManifest,
    manifest_bytes: bytes,
    recipe: Recipe,
    config: ImageConfig,
    index,
    *,
    floor: str,
    tag: str,
    platform: Platform,
    reporter: Reporter = SILENT,
) -> Materialized:
    """Select and fetch the wheels, write the context into a scratch folder, build it through ``engine``
    (``--network=none``), and say what was built (adapter)."""
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    floor_id = check_floor(engine, floor, platform)
    chosen = pick_wheels(manifest, index)
    wheels = download_wheels(chosen, reporter)
    seconds["wheels"] = round(time.monotonic() - t0, 2)
    digest = sha256_hex(manifest_bytes)
    labels, lacks = replay_labels(manifest, recipe, manifest_sha256=digest, floor=floor, floor_id=floor_id)
    with tempfile.TemporaryDirectory(prefix="bi-materialize-") as tmp:
        ctx = Path(tmp)
        write_context(ctx, manifest, manifest_bytes, recipe, config, wheels, chosen, floor=floor, labels=labels)
        t0 = time.monotonic()
        built = engine.build(ctx, [tag], network="none", reporter=reporter, platform=platform)
        seconds["build"] = round(time.monotonic() - t0, 2)
    return Materialized(
        tag=tag,
        image_id=built.image_id,
        vllm=recipe.vllm,
        platform=platform.name,
        floor=floor,
        manifest_sha256=digest,
        distributions=len(chosen),
        lacks=lacks,
        labels=labels,
        seconds=seconds,
    )


def render_summary(built: Materialized) -> str:
    """What ``base materialize`` says (pure): the image, that it is a replay, and what it lacks."""
    lines = [
        f"built {built.tag} (image {built.image_id}): a REPLAY of vllm/vllm-openai:v{built.vllm} for "
        f"{built.platform}, not the published image; {built.distributions} distributions from manifest "
        f"sha256 {built.manifest_sha256} on {built.floor} (wheels {built.seconds.get('wheels', 0):.1f} s, "
        f"build {built.seconds.get('build', 0):.1f} s)",
        f"  labels: {REPLAY_LABEL}=true, {MANIFEST_LABEL}={built.manifest_sha256}, {LACKS_LABEL}=<below>",
        "  the replay lacks:",
    ]
    for k, items in built.lacks.items():
        lines += [f"    {k.replace('_', ' ')}: {x}" for x in items]
    lines.append(f"  use it as the base: build-image --vllm {built.vllm} --base {built.tag} ...")
    return "\n".join(lines)
