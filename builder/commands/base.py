"""``build-image base snapshot``: write a base manifest (the immovable floor)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import BadInput


def _progress():
    """A rich progress bar on stderr (quiet when stderr is not a terminal)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
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
    from .. import base

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
