"""``build-image base snapshot``: write a base manifest (the immovable floor)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import click

from builder.commands import platform_option, stderr_console
from builder.errors import BadInput, VerdictFailure
from builder.report import emit_json
from builder.spec import default_base_manifest, default_lock_path, supported_vllm_versions
from builder.validate import load_json, read_bounded, read_bounded_text

# What a command runs (its stage, the engine adapter, downloads, reports) is imported inside the command
# function, not here: `build-image --help` imports every command module to list it, and a stage
# (with its dependencies) loads only when its command runs.


@contextmanager
def _reporter():
    """The snapshot's steps on a status line on stderr when it is a terminal; its warnings on stderr always."""
    from builder.events import RichReporter
    from builder.resolve.scanner import WARNINGS_ON_STDERR

    console = stderr_console(highlight=True)
    if not console.is_terminal:
        yield WARNINGS_ON_STDERR
        return
    with console.status("scanning") as status:
        yield RichReporter(console, status=status)


@click.group("base")
def command() -> None:
    """Base manifest: what the base image already holds (packages, Python, glibc, CUDA, binary facts)."""


_SNAPSHOT_OPTIONS = [
    click.option("--image", "image", metavar="REF", help="Read a LOCAL image through the engine (never pulled)."),
    click.option(
        "--site-packages",
        "site_packages",
        metavar="DIR",
        type=click.Path(path_type=Path),
        help="Scan a site-packages directory on this machine (provenance: reconstructed).",
    ),
    click.option("--python", "python", metavar="X.Y", help="Python version (default: read from the image / the path)."),
    click.option(
        "--glibc",
        "glibc",
        metavar="X.Y",
        help="glibc version (required with --site-packages; overrides the image's libc).",
    ),
    click.option(
        "--cuda", "cuda", metavar="X.Y", help="CUDA version (default: the image's CUDA_VERSION / nvidia-cuda-runtime)."
    ),
    click.option(
        "--platform",
        "platform",
        metavar="P",
        help="The base's platform: linux/amd64 or linux/arm64, or uv's --python-platform "
        "(x86_64|aarch64-manylinux_<major>_<minor>); default: the image's, x86_64-manylinux_<glibc> for a tree.",
    ),
    click.option(
        "--image-ref", "image_ref", metavar="REF", help="With --site-packages: the image this directory stands for."
    ),
    click.option("--os", "os_name", metavar="TEXT", help="With --site-packages: the OS of the image it stands for."),
    click.option(
        "--as-path",
        "as_path",
        metavar="PATH",
        help="With --site-packages: the directory's path inside the image (recorded as python.site_packages).",
    ),
    click.option(
        "--method",
        "method",
        metavar="TEXT",
        help="With --site-packages: exactly how the directory was produced (provenance).",
    ),
    click.option(
        "-o",
        "--output",
        "output",
        required=True,
        type=click.Path(path_type=Path, dir_okay=False),
        help="Manifest file to write (JSON, atomically).",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary on stdout."),
    click.option("--force", is_flag=True, help="Replace an -o file that is not a base manifest build-image wrote."),
]


def _with_snapshot_options(f):
    """base snapshot's options, in the order --help lists them."""
    for opt in reversed(_SNAPSHOT_OPTIONS):
        f = opt(f)
    return f


@command.command("snapshot")
@_with_snapshot_options
def snapshot(
    image,
    site_packages,
    python,
    glibc,
    cuda,
    platform,
    image_ref,
    os_name,
    as_path,
    method,
    output,
    as_json,
    force=False,
):
    """Write a base manifest from --image REF or --site-packages DIR.

    Exit codes: 0 written; 2 bad input (flags, a tree or image that is not readable, an -o file
    build-image did not write); 8 container engine unreachable or the image is not local;
    12 a helper tool failed; 14 another run holds -o."""
    from builder.resolve import base

    if bool(image) == bool(site_packages):
        raise BadInput("base snapshot: give exactly one of --image REF or --site-packages DIR.")
    if image and (image_ref or os_name or as_path or method):
        raise BadInput(
            "base snapshot: --image-ref, --os, --as-path and --method only apply to --site-packages "
            "(an image's facts are read from the image itself)."
        )
    if site_packages and not glibc:
        raise BadInput(
            f"base snapshot --site-packages {site_packages}: --glibc X.Y is required "
            "(a directory does not say which C library it will run on)."
        )

    from builder.resolve.manifest import refuse_foreign_manifest

    wanted, platform = _snapshot_platform(platform, glibc)
    refuse_foreign_manifest(output, force=force)
    with _reporter() as reporter:
        if image:
            manifest = base.snapshot_image(
                image, python=python, glibc=glibc, cuda=cuda, platform=platform, reporter=reporter
            )
        else:
            manifest = base.snapshot_site_packages(
                site_packages,
                python=python,
                glibc=glibc,
                cuda=cuda,
                platform=platform,
                image_ref=image_ref,
                os_name=os_name,
                site_packages_label=as_path,
                method=method,
                reporter=reporter,
            )
    _check_snapshot_platform(manifest, wanted, image)
    try:
        manifest.save(output)
    except OSError as exc:  # atomic: a manifest already there is untouched
        raise BadInput(f"cannot write the manifest {output}: {exc.strerror or exc}.") from None

    _print_summary(manifest, output, as_json)


def _snapshot_platform(text: str | None, glibc: str | None):
    """``--platform`` as :func:`builder.platforms.snapshot_platform` reads it (exit 2 for anything else, before
    the image or the tree is read): (the platform or None, uv's platform string or None to derive it)."""
    if text is None:
        return None, None
    from builder import platforms

    return platforms.snapshot_platform(text, glibc, where="base snapshot --platform")


def _check_snapshot_platform(manifest, wanted, image: str | None) -> None:
    """A manifest of an image of another platform than ``--platform`` says is refused (nothing written)."""
    if wanted is None or not image:
        return
    from builder.resolve.baseref import base_platform

    have = base_platform(manifest, image or "snapshot")
    if have != wanted:
        raise BadInput(
            f"base snapshot --platform {wanted.name}: the image {image} is a {have.name} image; a manifest never "
            "describes one platform's image as the other's. Nothing was written.",
            hint=f"snapshot the {wanted.name} image (or drop --platform).",
        )


def _print_summary(manifest, output: Path, as_json: bool) -> None:
    """What ``base snapshot`` wrote: one line, or (``--json``) the summary document on stdout."""
    dists = manifest.distributions.values()
    summary = {
        "output": str(output),
        "image": {"ref": manifest.image_ref, "digest": manifest.image_digest},
        "python": manifest.python_version,
        "glibc": manifest.glibc,
        "cuda": manifest.cuda,
        "platform": manifest.platform,
        "provenance": manifest.provenance_kind,
        "distributions": len(manifest.distributions),
        "binary": sum(1 for d in dists if d.facts.binary),
        "numpy_1x_built": sorted(d.name for d in dists if d.facts.numpy_abi.get("1")),
        "numpy_2x_built": sorted(d.name for d in dists if d.facts.numpy_abi.get("2")),
    }
    if as_json:
        emit_json(summary)
    else:
        click.echo(
            f"wrote {output}: {summary['distributions']} distributions ({summary['binary']} binary), "
            f"Python {manifest.python_version}, glibc {manifest.glibc}, CUDA {manifest.cuda or '-'}, "
            f"{manifest.platform}, provenance {manifest.provenance_kind}"
        )


def _local_build_files(vllm, sdist_path, source):
    """The build files of --sdist PATH or --source DIR (None when neither is given); both is bad input."""
    from builder.resolve import sdist

    if sdist_path and source:
        raise BadInput("--sdist and --source name two sources of the build files; give one.")
    if sdist_path:
        return sdist.load_local_sdist(sdist_path, vllm)
    if source:
        return sdist.load_source(source, vllm)
    if not vllm:
        raise BadInput("give --vllm X (the release's sdist on the index), --sdist PATH or --source DIR.")
    return None


def _local_recipe(vllm, sdist_path, source, accept_undecided, output, target, variant=None):
    """(build files, recipe) of --sdist/--source or --variant for reconstruct ((None, None) without them)."""
    from builder.resolve import sdist
    from builder.resolve.recipe import derive

    local = _local_build_files(vllm, sdist_path, source)
    if local is None and not variant:
        return None, None
    if output is None:
        what = "--variant" if variant else "--sdist/--source"
        verb = "needs" if variant else "need"
        raise BadInput(f"{what} {verb} -o FILE: the shipped manifest is the one of the release's plain tag.")
    local = local if local is not None else sdist.load(vllm)
    return local, derive(local, accept_undecided=accept_undecided, platform=target, variant=variant or "")


_LOCAL_SOURCES = [
    click.option(
        "--sdist",
        "sdist_path",
        type=click.Path(path_type=Path, dir_okay=False),
        default=None,
        help="Read the build files from this vLLM sdist (a nightly, a fork) instead of the index's; "
        "the provenance names its sha256.",
    ),
    click.option(
        "--source",
        "source",
        type=click.Path(path_type=Path, file_okay=False),
        default=None,
        help="Read the build files from the HEAD commit's tree of this vLLM git checkout (never its work tree; "
        "git runs none of the checkout's configured programs); the provenance names the commit and whether "
        "the work tree matches it, the version is its tag's (or a development version past it).",
    ),
    click.option(
        "--accept-undecided",
        "accept_undecided",
        multiple=True,
        metavar="FILE:LINE",
        help="Record this RUN line the reader cannot decide as a step replayed as nothing (in lacks) "
        "instead of exit 2.",
    ),
    click.option(
        "--variant",
        "variant",
        default=None,
        metavar="SUFFIX",
        help="The image the release publishes as vllm/vllm-openai:v<vllm>-SUFFIX (cu129, cu130, ...) instead of "
        "the plain tag: its build step is the one the release's publish commands put under that tag.",
    ),
]


def _with_local_sources(fn):
    for opt in reversed(_LOCAL_SOURCES):
        fn = opt(fn)
    return fn


@command.command("recipe")
@click.option(
    "--vllm",
    "vllm",
    default=None,
    metavar="VERSION",
    help="The vLLM release whose image recipe is derived (with --sdist/--source: checked against it).",
)
@_with_local_sources
@click.option("--json", "as_json", is_flag=True, help="The recipe with every value's provenance as JSON on stdout.")
@click.option("--write", is_flag=True, help="Write the release's table into the recipes file (generated, atomically).")
@click.option(
    "--recipes",
    "recipes",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Recipes file --write updates (default: lockfiles/base/recipes.toml).",
)
@click.option("--force", is_flag=True, help="With --write: replace a --recipes file that build-image did not write.")
@click.option(
    "--audit",
    is_flag=True,
    help="One row per RUN line of the target's stage chain (and per command of the scripts, sh -c strings and "
    "heredocs it runs) with the reader's conclusion: installs ..., harmless because ..., accepted undecided, "
    "refused.  Exit 2 after the rows when a line is refused.",
)
@platform_option(
    several=False,
    help_extra=" The recipe is the release pipeline's step for that platform's image; "
    "its table goes to lockfiles/base/recipes-linux-arm64.toml.",
)
def recipe_cmd(
    vllm,
    as_json,
    write,
    recipes,
    force=False,
    sdist_path=None,
    source=None,
    accept_undecided=(),
    platform=None,
    variant=None,
    audit=False,
):
    """Derive vllm/vllm-openai:v<vllm>'s recipe from the release's sdist (Dockerfile, release pipeline,
    requirements): base image, OS, glibc, CUDA, Python, and every install step, each value with its
    file and line.  --sdist PATH or --source DIR read a nightly's or a fork's files instead.
    Exit codes: 0; 2 the sdist is missing, foreign or lacks the target, stage or release step, or a
    RUN line that decides an install cannot be decided (the line named), or the release does not
    publish its image for --platform (what it publishes named); 7 index unreachable or a download
    failed its sha256; 14 another run holds the recipes file."""
    from builder import platforms
    from builder.resolve import sdist
    from builder.resolve.recipe import (
        check_recipes_output,
        read_recipes_file,
        recipe_table,
        write_recipe_table,
    )
    from builder.resolve.recipe.derive import audit_derive
    from builder.resolve.reconstruct import default_recipes_path

    target = platforms.parse(platform) if platform else platforms.DEFAULT
    path = recipes or default_recipes_path(target)
    local = _local_build_files(vllm, sdist_path, source)
    if (local is not None or variant) and write and recipes is None:
        raise BadInput(
            f"--write with {'--variant' if variant else '--sdist/--source'} needs --recipes FILE: the shipped "
            "recipes file holds the tables of the releases' own plain tags."
        )
    if write:
        check_recipes_output(path, force=force)  # before the sdist is fetched: a user's file is never replaced
    tables = read_recipes_file(path, target)  # another platform's recipes file: exit 2 before any download
    if local is not None:
        vllm = local.vllm
    files = local or sdist.load(vllm, sha256=(tables.get(vllm) or {}).get("sdist_sha256"))
    recipe, rows = audit_derive(
        files, accept_undecided=accept_undecided, platform=target, keep_going=audit, variant=variant or ""
    )
    if audit:
        _print_audit(recipe, rows, as_json)
    if write:
        write_recipe_table(path, vllm, recipe_table(recipe), force=force, platform=target)
    if audit and not write:
        return
    if as_json:
        emit_json(recipe.to_json())
        return
    click.echo(render_recipe_text(recipe) + (f"\nwrote the table of {vllm} into {path}" if write else ""))


def _print_audit(recipe, rows, as_json: bool) -> None:
    """``base recipe --audit``: the rows, then exit 2 (BadInput naming them) when a line was refused."""
    from builder.resolve.recipe.audit import render_audit

    refused = [a for a in rows if a.conclusion.startswith("refused")]
    if as_json:
        emit_json(
            {
                "vllm": recipe.vllm,
                "image": recipe.image,
                "sdist": recipe.sdist.filename,
                "platform": recipe.target_platform.name,
                "runs": [a.to_json() for a in rows],
                "refused": [str(a.where) for a in refused],
            }
        )
    else:
        click.echo(f"{recipe.image}: every RUN line of target {recipe.target} ({recipe.sdist.filename})")
        click.echo(render_audit(rows))
    if refused:
        raise BadInput(
            f"{recipe.sdist.filename}: {len(refused)} RUN line(s) refused: "
            + "; ".join(f"{a.where} ({a.conclusion[len('refused: ') :][:200]})" for a in refused),
            hint="`--accept-undecided FILE:LINE` replays the image without such a line and records it in the "
            "manifest's lacks; or take the manifest from the real image (`build-image base snapshot`).",
        )


def render_recipe_text(r) -> str:
    """The human-readable recipe (pure)."""

    def src(d) -> str:
        return ", ".join(map(str, d.where)) + (f"; {d.rule}" if d.rule else "")

    lines = [
        f"{r.image}: recipe from {r.sdist.filename} (sha256 {r.sdist.sha256})",
        *(f"  {k.replace('_', ' '):<17}{v}" for k, v in r.sdist.detail),
        f"  target {r.target}, pipeline step {r.pipeline_step.value!r} ({src(r.pipeline_step)})",
        *(
            [f"  published as {r.image} ({r.published.platform.name}) by " + ", ".join(map(str, r.published.where))]
            if r.published is not None
            else []
        ),
        "  stages: " + " <- ".join(s.value.split(" FROM ")[0] for s in reversed(r.stages)),
    ]
    for key in ("final_base_image", "os", "glibc", "cuda", "python", "site_packages"):
        d = getattr(r, key)
        lines.append(f"  {key:<17}{d.value}   [{src(d)}]")
    lines.append(f"  {'platform':<17}{r.platform}")
    if r.build_args:
        lines.append("  build args: " + ", ".join(f"{k}={d.value}" for k, d in r.build_args))
    lines.append("  install steps (Dockerfile order):")
    for s in r.steps:
        what = " ".join(
            [*s.requirements, *(f"-r {f}" for f in s.requirement_files), *(f"-c {f}" for f in s.constraint_files)]
        )
        extra = []
        if s.constrain_installed:
            extra.append("constrained to the installed " + ", ".join(s.constrain_installed))
        if s.overrides:
            extra.append("overrides " + ", ".join(s.overrides) + " (" + ", ".join(map(str, s.override_where)) + ")")
        if s.index_url:
            extra.append(f"index {s.index_url}")
        if s.extra_index_urls or s.file_indexes:
            extra.append("extra index " + ", ".join([*s.extra_index_urls, *s.file_indexes]))
        if s.index_strategy and (s.index_url or s.extra_index_urls):
            extra.append(f"index strategy {s.index_strategy}")
        for f, script, _ere, w in s.requirement_edits:
            extra.append(f"{f} edited first: sed {script!r} ({w})")
        if s.flags:
            extra.append(" ".join(s.flags))
        if s.when_installed:
            extra.append(f"only when {s.when_installed} is installed")
        if s.fallback:
            extra.append("on failure: " + s.fallback[:80] + ("..." if len(s.fallback) > 80 else ""))
        if s.note:
            extra.append(s.note)
        lines.append(
            f"   {s.n:>2}. [{s.replay}] {s.installer} {'uninstall' if s.replay == 'uninstall' else 'install'} "
            f"{what}   ({s.where}, stage {s.stage})"
        )
        lines += [f"       {e}" for e in extra]
    lacks = r.lacks()
    lines.append("  a replay from the index knowingly lacks:")
    for k in ("off_index", "source_builds", "other_indexes"):
        for x in lacks[k]:
            lines.append(f"    {k.replace('_', ' ')}: {x}")
    lines.append(f"    OS packages: {', '.join(lacks['os_packages']) or 'none'}")
    return "\n".join(lines)


@command.command("reconstruct")
@click.option(
    "--vllm",
    "vllm",
    default=None,
    metavar="VERSION",
    help="The vLLM release whose image is rebuilt (with --sdist/--source: checked against it).",
)
@_with_local_sources
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Manifest file (default: lockfiles/base/vllm-openai-v<vllm>.json).",
)
@click.option(
    "--recipes",
    "recipes",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Recipes file (default: lockfiles/base/recipes.toml).",
)
@click.option("--find-links", "find_links", multiple=True, metavar="DIR", help="Extra wheel folder (uv --find-links).")
@click.option("--no-index", is_flag=True, help="Only the --find-links folders (upload time = file modification time).")
@click.option(
    "--keep",
    "keep",
    type=click.Path(path_type=Path, file_okay=False),
    help="Install into this (empty) directory and keep it (default: a scratch dir, removed).",
)
@click.option(
    "--refresh",
    is_flag=True,
    help="Ask the index at every step (default: a release this uv cache already replayed online "
    "answers from that cache, asking the index only where it cannot).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Write nothing; exit 1 listing what differs when the replay is not the manifest file "
    "(-o or the shipped one), apart from the replay's day.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary on stdout.")
@click.option("--force", is_flag=True, help="Replace an -o file that is not a base manifest build-image wrote.")
@click.option(
    "--relax",
    "relax",
    multiple=True,
    metavar="NAME[EXTRA]",
    help="Replay without this requirement (NAME: dropped and excluded from resolution) or these extras "
    "of it (NAME[EXTRA,...]), where no reachable index serves what it needs; recorded in lacks.",
)
@platform_option(
    several=False,
    help_extra=" Replays the release pipeline's step for that platform's image with "
    "that platform's wheels (default -o: lockfiles/base/vllm-openai-v<vllm>-linux-arm64.json).",
)
def reconstruct_cmd(
    vllm,
    output,
    recipes,
    find_links,
    no_index,
    keep,
    as_json,
    force=False,
    refresh=False,
    check=False,
    relax=(),
    accept_undecided=(),
    sdist_path=None,
    source=None,
    platform=None,
    variant=None,
):
    """Rebuild the Python layer of vllm/vllm-openai:v<vllm> by replaying its recipe's install steps
    in order, and write its manifest.

    The recipe is derived from the release's sdist and must equal its table in recipes.toml; the
    exclude-newer instant is the vllm wheel's upload time on the index.  Each step asks the indexes
    its Dockerfile line names, in its order and index strategy, where they answer from here; the
    Python index stands in for one that does not, and the pins it does not serve are listed in the
    manifest's lacks.  Exit codes: 0 written (or, with --check, the same), 1 the replay differs
    (--check), 2 bad input (no recipe, a stale or bad recipes file, an sdist lacking its build files,
    an undecidable Dockerfile line, a platform the release does not publish), 4 a step does not
    resolve (the message names the missing distribution, what needs it, and --relax), 7 index
    unreachable, 12 uv failed, 14 another run holds -o.
    """
    from builder import platforms
    from builder.events import reporter_for
    from builder.resolve.reconstruct import reconstruct
    from builder.resolve.stepindex import parse_relaxations

    target = platforms.parse(platform) if platform else platforms.DEFAULT
    parse_relaxations(relax)  # bad input before any download
    local, recipe = _local_recipe(vllm, sdist_path, source, accept_undecided, output, target, variant)
    vllm = local.vllm if local is not None else vllm
    out = output or default_base_manifest(vllm, target)
    old_text = _reconstruct_inputs(out, recipes, check=check, force=force)
    reporter = reporter_for(stderr_console()).scoped("reconstruct: ")
    rec = reconstruct(
        vllm,
        recipes=recipes,
        find_links=list(find_links),
        no_index=no_index,
        keep=keep,
        reporter=reporter,
        refresh=refresh,
        relax=tuple(relax),
        accept_undecided=tuple(accept_undecided),
        recipe=recipe,
        files=local,
        platform=target,
    )
    if check:
        _reconstruct_check(rec, vllm, out, old_text, as_json)
        return
    try:
        rec.manifest.save(out)
    except OSError as exc:
        raise BadInput(f"cannot write the manifest {out}: {exc.strerror or exc}.") from None
    _reconstruct_summary(rec, vllm, out, as_json)


def _reconstruct_inputs(out: Path, recipes: Path | None, *, check: bool, force: bool) -> str | None:
    """The checks before a replay: the manifest to compare (``check``: its text, read bounded and refused when
    it is not JSON) or the -o output rule; the recipes file read bounded (a FIFO, a device, a huge file)."""
    from builder.resolve.manifest import refuse_foreign_manifest

    old_text = None
    if check:
        if not out.is_file():
            raise BadInput(f"reconstruct --check: there is no manifest {out} to compare the replay with.")
        old_text = read_bounded_text(out, "reconstruct --check: the manifest")
        try:  # refused before the replay, not after it: not JSON, nested too deep
            load_json(old_text, f"reconstruct --check: the manifest {out}")
        except ValueError as exc:
            raise BadInput(f"reconstruct --check: {out} is not JSON ({exc}).") from None
    else:
        refuse_foreign_manifest(out, force=force)
    if recipes is not None:
        read_bounded(recipes, "recipes file")  # exit 2 before the replay
    return old_text


def _reconstruct_check(rec, vllm: str, out: Path, old_text: str, as_json: bool) -> None:
    """``--check``: exit 1 listing what the replay changes in the manifest file, else say it is the same."""
    from builder.resolve.reconstruct import manifest_differences

    try:
        differs = manifest_differences(old_text, rec.manifest.to_json())
    except ValueError as exc:
        raise BadInput(f"reconstruct --check: {out} is not JSON ({exc}).") from None
    if as_json:
        emit_json(
            {
                "manifest": str(out),
                "vllm": vllm,
                "same": not differs,
                "differences": differs,
                "uv_steps": rec.uv_steps,
                "timings": {k: round(v, 2) for k, v in rec.timings.items()},
            },
            sort_keys=True,
        )
    if differs:
        raise VerdictFailure(
            f"the replay of vllm {vllm}'s image differs from {out} in {len(differs)} "
            f"place(s): " + "; ".join(differs[:20]) + ("; ..." if len(differs) > 20 else "") + ".",
            hint=f"build-image base reconstruct --vllm {vllm} rewrites it.",
        )
    if not as_json:
        click.echo(f"{out}: the replay of vllm {vllm}'s image gives this manifest (apart from the day)")


def _reconstruct_summary(rec, vllm: str, out: Path, as_json: bool) -> None:
    """What a written manifest holds and how long the replay took (``--json``: the same as a document)."""
    m = rec.manifest
    summary = {
        "output": str(out),
        "vllm": vllm,
        "exclude_newer": rec.exclude_newer,
        "vllm_uploaded": rec.uploaded.isoformat(),
        **({"vllm_wheel": rec.recipe.wheel} if rec.recipe.wheel else {}),
        "distributions": len(m.distributions),
        "binary": sum(1 for d in m.distributions.values() if d.facts.binary),
        "sdist": rec.recipe.sdist.filename,
        "sdist_sha256": rec.recipe.sdist.sha256,
        "steps": rec.steps,
        "unversioned": sorted(m.unversioned),
        "timings": {k: round(v, 2) for k, v in rec.timings.items()},
        "uv_steps": rec.uv_steps,
        **_row(m),
    }
    if as_json:
        emit_json(summary, sort_keys=True)
        return
    done = sum(1 for s in rec.steps if s["action"] != "skip")
    click.echo(
        f"wrote {out}: {summary['distributions']} distributions ({summary['binary']} binary); torch "
        f"{summary['torch']}, numpy {summary['numpy']}, CUDA {m.cuda}, Python {m.python_version}, glibc "
        f"{m.glibc}; {done} of {len(rec.steps)} steps replayed; exclude-newer {rec.exclude_newer} (vllm "
        f"{rec.recipe.wheel_version} uploaded {rec.uploaded.isoformat()}); install {rec.timings['install']:.1f} s "
        f"({rec.uv_steps.get('offline', 0)} step(s) from uv's cache, {rec.uv_steps.get('online', 0)} "
        f"asking the index), scan {rec.timings['scan']:.1f} s"
    )


def _row(m) -> dict:
    def v(name: str) -> str | None:  # a distribution the replay leaves out: its recipe's version, marked
        h = m.held(name)
        return h.text() if h is not None else None

    return {
        "torch": v("torch"),
        "torchvision": v("torchvision"),
        "cuda": m.cuda,
        "python": m.python_version,
        "glibc": m.glibc,
        "numpy": v("numpy"),
        "transformers": v("transformers"),
        "flashinfer": v("flashinfer-python"),
        "os": m.os,
    }


@command.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list on stdout.")
def list_cmd(as_json):
    """The shipped base manifests: vllm, torch, CUDA, Python, OS and glibc (derived from the release's own
    build files), numpy, transformers, and the default lock's ray.  A release added with
    `build-image upgrade --to X -o .` is listed with what its reconstruction approximates.

    Exit codes: 0 listed; 2 a shipped manifest or lock cannot be read."""
    from packaging.version import Version

    from builder.resolve.lockfile import load_lock
    from builder.resolve.manifest import load_manifest

    rows = []
    for vllm in sorted(supported_vllm_versions(), key=Version):
        m = load_manifest(default_base_manifest(vllm))
        lock_path = default_lock_path(vllm)
        ray = backend = entries = None
        if lock_path.exists():
            lock = load_lock(lock_path)
            e = lock.by_name().get("ray")
            ray = e.version if e is not None else None
            backend = lock.header.get("serve-backend")
            entries = len(lock.entries)
        recipe = m.provenance_recipe or {}
        rows.append(
            {
                "vllm": vllm,
                **_row(m),
                "ray": ray,
                "serve_backend": backend,
                "lock_entries": entries,
                "provenance": m.provenance_kind,
                "manifest": str(default_base_manifest(vllm)),
                "lock": str(lock_path) if lock_path.exists() else None,
                "sdist": (recipe.get("sdist") or {}).get("filename"),
                "sdist_sha256": (recipe.get("sdist") or {}).get("sha256"),
                "steps": len(recipe.get("steps") or []),
                "unversioned": sorted(m.unversioned),
                "not_replayed": _not_replayed(m),
            }
        )
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        r["os_short"] = (r["os"] or "").split(" (")[0] or None
    cols = [
        ("vllm", "vllm"),
        ("torch", "torch"),
        ("cuda", "CUDA"),
        ("python", "Python"),
        ("os_short", "OS"),
        ("glibc", "glibc"),
        ("numpy", "numpy"),
        ("transformers", "transformers"),
        ("ray", "default ray"),
        ("serve_backend", "Serve backend"),
    ]
    table = [[h for _, h in cols]] + [[str(r[k] or "-") for k, _ in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    left = [(r["vllm"], name, x) for r in rows for name, x in r["not_replayed"].items()]
    if left:
        click.echo("\nin the image but not in its replayed floor (the version its recipe names, and why):")
    for vllm, name, x in left:
        click.echo(f"  {vllm}  {name} {x['version'] or 'unversioned'}: {x['reason']}")


def _not_replayed(m) -> dict[str, dict]:
    """{name: {version, reason}} of what the image holds that its replayed floor does not (pure)."""
    out = {}
    for name in sorted(m.unversioned):
        h = m.held(name)
        if h is not None and not h.replayed:
            out[name] = {"version": h.version, "reason": h.reason}
    return out


def _register_materialize() -> None:
    """``base materialize`` (builder/commands/materialize.py)."""
    from builder.commands.materialize import command as materialize

    command.add_command(materialize)


_register_materialize()
