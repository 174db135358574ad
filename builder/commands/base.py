"""``build-image base snapshot``: write a base manifest (the immovable floor)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from builder.errors import BadInput

# Stages are imported inside the command functions, not here: `build-image --help` imports every
# command module to list it, and a stage (with its dependencies) loads only when its command runs.


def _progress():
    """A rich progress bar on stderr (quiet when stderr is not a terminal)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from builder.commands import stderr_console

    console = stderr_console(highlight=True)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[current]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


@click.group("base")
def command() -> None:
    """Base manifest: what the base image already holds (packages, Python, glibc, CUDA, binary facts)."""


@command.command("snapshot")
@click.option("--image", "image", metavar="REF", help="Read a LOCAL image through the engine (never pulled).")
@click.option("--site-packages", "site_packages", metavar="DIR", type=click.Path(path_type=Path),
              help="Scan a site-packages directory on this machine (provenance: reconstructed).")
@click.option("--python", "python", metavar="X.Y", help="Python version (default: read from the image / the path).")
@click.option("--glibc", "glibc", metavar="X.Y", help="glibc version (required with --site-packages; overrides the image's libc).")
@click.option("--cuda", "cuda", metavar="X.Y", help="CUDA version (default: the image's CUDA_VERSION / nvidia-cuda-runtime).")
@click.option("--platform", "platform", metavar="P", help="uv --python-platform (default: x86_64-manylinux_<glibc>).")
@click.option("--image-ref", "image_ref", metavar="REF", help="With --site-packages: the image this directory stands for.")
@click.option("--os", "os_name", metavar="TEXT", help="With --site-packages: the OS of the image it stands for.")
@click.option("--as-path", "as_path", metavar="PATH",
              help="With --site-packages: the directory's path inside the image (recorded as python.site_packages).")
@click.option("--method", "method", metavar="TEXT", help="With --site-packages: exactly how the directory was produced (provenance).")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="Manifest file to write (JSON, atomically).")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary on stdout.")
def snapshot(image, site_packages, python, glibc, cuda, platform, image_ref, os_name, as_path, method, output, as_json):
    """Write a base manifest from --image REF or --site-packages DIR."""
    from builder.resolve import base

    if bool(image) == bool(site_packages):
        raise BadInput("base snapshot: give exactly one of --image REF or --site-packages DIR.")
    if image and (image_ref or os_name or as_path or method):
        raise BadInput("base snapshot: --image-ref, --os, --as-path and --method only apply to --site-packages "
                       "(an image's facts are read from the image itself).")
    if site_packages and not glibc:
        raise BadInput(f"base snapshot --site-packages {site_packages}: --glibc X.Y is required "
                       "(a directory does not say which C library it will run on).")

    with _progress() as bar:
        task = bar.add_task("scanning", total=None, current="")

        def on_dist(name: str, idx: int, total: int) -> None:
            bar.update(task, total=total, completed=idx, current=name)

        def on_export(nbytes: int) -> None:
            bar.update(task, description="reading image", current=f"{nbytes / 1e9:.2f} GB")

        if image:
            manifest = base.snapshot_image(image, python=python, glibc=glibc, cuda=cuda, platform=platform,
                                           progress=on_dist, export_progress=on_export)
        else:
            manifest = base.snapshot_site_packages(
                site_packages, python=python, glibc=glibc, cuda=cuda, platform=platform, image_ref=image_ref,
                os_name=os_name, site_packages_label=as_path, method=method, progress=on_dist)
    try:
        manifest.save(output)
    except OSError as exc:  # atomic: a manifest already there is untouched
        raise BadInput(f"cannot write the manifest {output}: {exc.strerror or exc}.") from None

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
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(
            f"wrote {output}: {summary['distributions']} distributions ({summary['binary']} binary), "
            f"Python {manifest.python_version}, glibc {manifest.glibc}, CUDA {manifest.cuda or '-'}, "
            f"{manifest.platform}, provenance {manifest.provenance_kind}"
        )


@command.command("reconstruct")
@click.option("--vllm", "vllm", required=True, metavar="VERSION", help="The vLLM release whose image is rebuilt.")
@click.option("-o", "--output", "output", type=click.Path(path_type=Path, dir_okay=False),
              help="Manifest file (default: lockfiles/base/vllm-openai-v<vllm>.json).")
@click.option("--recipes", "recipes", type=click.Path(path_type=Path, dir_okay=False),
              help="Recipes file (default: lockfiles/base/recipes.toml).")
@click.option("--find-links", "find_links", multiple=True, metavar="DIR", help="Extra wheel folder (uv --find-links).")
@click.option("--no-index", is_flag=True, help="Only the --find-links folders (upload time = file modification time).")
@click.option("--keep", "keep", type=click.Path(path_type=Path, file_okay=False),
              help="Install into this (empty) directory and keep it (default: a scratch dir, removed).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary on stdout.")
def reconstruct_cmd(vllm, output, recipes, find_links, no_index, keep, as_json):
    """Rebuild the Python layer of vllm/vllm-openai:v<vllm> from its recipe and write its manifest.

    The exclude-newer instant is the vllm wheel's upload time on the index.  Exit codes: 0 written,
    2 bad input (no recipe, bad recipes file), 4 the recipe does not resolve, 7 index unreachable,
    12 uv failed.
    """
    from builder.commands import stderr_console
    from builder.resolve.reconstruct import default_recipes_path, load_recipes, recipe_for, reconstruct
    from builder.spec import default_base_manifest

    path = recipes or default_recipes_path()
    recipe = recipe_for(load_recipes(path), vllm, str(path))
    out = output or default_base_manifest(vllm)
    console = stderr_console()

    def say(msg: str) -> None:
        console.print(f"reconstruct: {msg}", markup=False, soft_wrap=True)

    rec = reconstruct(recipe, find_links=list(find_links), no_index=no_index, keep=keep, progress=say)
    try:
        rec.manifest.save(out)
    except OSError as exc:
        raise BadInput(f"cannot write the manifest {out}: {exc.strerror or exc}.") from None
    m = rec.manifest
    summary = {"output": str(out), "vllm": vllm, "exclude_newer": rec.exclude_newer,
               "vllm_uploaded": rec.uploaded.isoformat(), "distributions": len(m.distributions),
               "binary": sum(1 for d in m.distributions.values() if d.facts.binary),
               "timings": {k: round(v, 2) for k, v in rec.timings.items()}, **_row(m)}
    if as_json:
        click.echo(json.dumps(summary, indent=2, sort_keys=True))
    else:
        click.echo(f"wrote {out}: {summary['distributions']} distributions ({summary['binary']} binary); torch "
                   f"{summary['torch']}, CUDA {m.cuda}, Python {m.python_version}, glibc {m.glibc}; exclude-newer "
                   f"{rec.exclude_newer} (vllm {vllm} uploaded {rec.uploaded.isoformat()}); install "
                   f"{rec.timings['install']:.1f} s, scan {rec.timings['scan']:.1f} s")


def _row(m) -> dict:
    def v(name: str) -> str | None:
        d = m.get(name)
        return d.version if d is not None else None

    return {"torch": v("torch"), "torchvision": v("torchvision"), "cuda": m.cuda, "python": m.python_version,
            "glibc": m.glibc, "numpy": v("numpy"), "transformers": v("transformers"),
            "flashinfer": v("flashinfer-python"), "os": m.os}


@command.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list on stdout.")
def list_cmd(as_json):
    """The shipped base manifests: vllm, torch, CUDA, Python, glibc, transformers, and the default lock's ray."""
    from packaging.version import Version

    from builder.resolve.lockfile import load_lock
    from builder.resolve.manifest import load_manifest
    from builder.spec import default_base_manifest, default_lock_path, supported_vllm_versions

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
        rows.append({"vllm": vllm, **_row(m), "ray": ray, "serve_backend": backend, "lock_entries": entries,
                     "provenance": m.provenance_kind, "manifest": str(default_base_manifest(vllm)),
                     "lock": str(lock_path) if lock_path.exists() else None})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    cols = [("vllm", "vllm"), ("torch", "torch"), ("cuda", "CUDA"), ("python", "Python"), ("glibc", "glibc"),
            ("transformers", "transformers"), ("ray", "default ray"), ("serve_backend", "Serve backend")]
    table = [[h for _, h in cols]] + [[str(r[k] or "-") for k, _ in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
