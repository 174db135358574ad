"""``build-image patch check|port|apply|sums``: the versioned vllm patch series (docs/patches.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from builder.commands import mark_direction
from builder.errors import BadInput, PatchFailed
from builder.patching import series as P
from builder.report import emit_json, emit_text
from builder.util import atomic_write_text, check_writable_dir, sha256_file
from builder.validate import release_direction, same_directory

# What a command runs (its stage, the engine adapter, downloads, reports) is imported inside the command
# function, not here: `build-image --help` imports every command module to list it, and a stage
# (with its dependencies) loads only when its command runs.


def _series(vllm: str, series_dir: str | None) -> P.Series:
    if series_dir:  # --series overrides --vllm; still refuse a series made for another version when both are given
        return P.load_series(series_dir, vllm if vllm else None)
    return P.load_series(P.series_dir_for(vllm), vllm)


def _wheel(series: P.Series, wheel: str | None, progress: bool) -> Path:
    if wheel:
        path = Path(wheel)
        if series.wheel_sha256 and path.is_file() and sha256_file(path) != series.wheel_sha256:
            raise PatchFailed(
                f"--wheel {path}: sha256 differs from the wheel the series was made for "
                f"({series.wheel_filename} {series.wheel_sha256})."
            )
        return path
    from builder.events import SILENT
    from builder.fetch import vllm_wheel

    return vllm_wheel(series.version, series.wheel_sha256, reporter=None if progress else SILENT)


_series_opts = [
    click.option("--vllm", "vllm", default=None, help="vllm version whose series to use (patches/vllm/<v>/)."),
    click.option(
        "--series",
        "series_dir",
        type=click.Path(file_okay=False),
        default=None,
        help="Patch series directory (overrides --vllm's default location).",
    ),
]


def _with_series_opts(f):
    for opt in reversed(_series_opts):
        f = opt(f)
    return f


def _need_version(vllm: str | None, series_dir: str | None) -> None:
    if not vllm and not series_dir:
        raise click.UsageError("give --vllm VERSION or --series DIR.")


@click.group("patch")
def command():
    """Check or apply the versioned vllm patch series (patches/vllm/<version>/)."""


@command.command("check")
@_with_series_opts
@click.option(
    "--wheel",
    type=click.Path(dir_okay=True, exists=True),
    default=None,
    help="vllm wheel (or a directory holding vllm/) to check against; default: fetched from PyPI, cached.",
)
@click.option(
    "--probe",
    "run_probes",
    is_flag=True,
    help="Also run each patch's probe through the package's own code on CPU, unpatched and patched.",
)
@click.option(
    "--probe-python",
    default=None,
    type=click.Path(dir_okay=False, exists=True),
    help="Interpreter for the probes (default: a cached venv from the series' probe-env.txt).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result on stdout.")
def check_cmd(vllm, series_dir, wheel, run_probes, probe_python, as_json):
    """Apply the series in memory to the exact vllm wheel: no fuzz, no offset.

    Reports per patch: applied / already-applied / does-not-apply (with the failing hunk).
    With --probe, per patch also: needed (its probe fails on the unpatched code) and
    works (it passes on the patched code).
    Exit codes: 0 every patch applies (and, with --probe, every probe is needed and
    works), 6 a patch does not apply or is refused, 1 a probe does not pass patched,
    passes unpatched (the patch is not needed: retire it) or errors, 2 bad input,
    7 download/sha256 failure.
    """
    _need_version(vllm, series_dir)
    series = _series(vllm, series_dir)
    source = _wheel(series, wheel, progress=not as_json)
    results = P.check(series, source, raise_on_failure=False)
    ok = all(r.status != P.DOES_NOT_APPLY for r in results)
    probes = []
    if run_probes and ok:
        from builder.events import SILENT, PlainReporter
        from builder.patching import probe as PR

        for p in series.patches:
            PR.probe_path(series.dir, p)  # every patch names an existing probe, before any work
        probes = PR.probe_series(
            series,
            source,
            runner=PR.runner_for(series.dir, probe_python),
            reporter=PlainReporter() if not as_json else SILENT,
        )
    probes_ok = all(pr.needed is True and pr.works is True for pr in probes)
    if as_json:
        by = {pr.patch: pr.to_dict() for pr in probes}
        emit_json(
            {
                "series": str(series.dir),
                "vllm": series.version,
                "source": str(source),
                "ok": ok and probes_ok,
                "patches": [{**r.to_dict(), **({"probe": by[r.name]} if r.name in by else {})} for r in results],
            }
        )
    else:
        click.echo(f"series {series.dir} (vllm=={series.version}) against {source}:")
        by = {pr.patch: pr for pr in probes}
        for r in results:
            click.echo(f"  {r.status:16} {r.name}  {r.subject}")
            if r.detail:
                for line in r.detail.rstrip().splitlines():
                    click.echo(f"      {line}")
            pr = by.get(r.name)
            if pr is not None:
                word = {True: "yes", False: "NO", None: "error"}
                click.echo(
                    f"      probe {pr.probe}: needed {word[pr.needed]} (unpatched: {pr.unpatched.summary()}); "
                    f"works {word[pr.works]} (patched: {pr.patched.summary()})"
                )
                if pr.needed is False:
                    click.echo("      the unpatched code already passes: propose retiring this patch.")
    if not ok:
        sys.exit(PatchFailed.exit_code)
    if not probes_ok:
        sys.exit(1)


@command.command("port")
@click.option("--from", "from_version", required=True, help="Release the series is made for (patches/vllm/<A>/).")
@click.option("--to", "to_version", required=True, help="Release to port it to.")
@click.option(
    "--series",
    "series_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="A's series directory (default: patches/vllm/<A>/).",
)
@click.option(
    "--from-wheel",
    type=click.Path(exists=True),
    default=None,
    help="A's wheel or a directory holding the package (default: fetched, sha256-pinned).",
)
@click.option(
    "--to-wheel",
    type=click.Path(exists=True),
    default=None,
    help="B's wheel or a directory holding the package (default: fetched from PyPI, cached).",
)
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write B's series here (nothing is written without it).",
)
@click.option(
    "--probe-python",
    default=None,
    type=click.Path(dir_okay=False, exists=True),
    help="Interpreter for the probes on B (default: a venv from B's probe-env.txt when "
    "patches/vllm/<B>/ has one, else A's).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "markdown", "json"]),
    default="text",
    help="Report format (markdown for a pull request comment).",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--allow-downgrade", is_flag=True, help="Port to an older release (refused, exit 2, without it).")
@click.option("--force", is_flag=True, help="Write into an -o folder holding a series build-image did not port.")
def port_cmd(
    from_version,
    to_version,
    series_dir,
    from_wheel,
    to_wheel,
    out_dir,
    probe_python,
    fmt,
    as_json,
    allow_downgrade=False,
    force=False,
):
    """Port A's patch series to release B, patch by patch (docs/patches.md).

    Status per patch: applies (exact context on B, offsets regenerated), merged (a
    three-way merge with A's original as the ancestor: review it), conflict (the
    regions that did not merge are shown), upstream (B unpatched passes the probe:
    retire it).  Every changed line must land in the same function/class as in A and
    the probe must pass on the ported tree.
    Exit codes: 0 every patch applies or is upstream, 1 something needs review
    (merged/conflict), 2 bad input, 7 download/sha256 failure.
    """
    from builder.events import SILENT, PlainReporter
    from builder.fetch import vllm_wheel
    from builder.patching import port as PO
    from builder.patching import probe as PR

    fmt = "json" if as_json else fmt
    direction = release_direction(from_version, to_version, allow_downgrade=allow_downgrade, what="port")
    series = _series(from_version, series_dir)
    _check_port_output(out_dir, series.dir)
    if out_dir is not None:
        check_writable_dir(out_dir)  # a read-only -o: exit 2 now, not after the port's work
        PO.refuse_foreign_series(out_dir, force=force)
    for p in series.patches:
        PR.probe_path(series.dir, p)
    bars = None if fmt == "text" else SILENT  # a download's bar on a terminal, none under a machine format
    a_src = Path(from_wheel) if from_wheel else vllm_wheel(from_version, series.wheel_sha256, reporter=bars)
    b_src = Path(to_wheel) if to_wheel else vllm_wheel(to_version, reporter=bars)
    report = PO.port(
        series,
        a_src,
        b_src,
        to_version,
        out_dir=out_dir,
        probe_python=probe_python,
        reporter=PlainReporter() if fmt == "text" else SILENT,
    )
    emit_text(mark_direction(PO.render(report, fmt), fmt, direction, from_version, to_version))
    if report.needs_review:
        sys.exit(1)


def _check_port_output(out_dir: str | None, series_dir: Path) -> None:
    """``-o`` naming A's own series folder would rewrite the series being read: refused before anything is written."""
    if out_dir is not None and Path(out_dir).exists() and same_directory(out_dir, series_dir):
        raise BadInput(
            f"-o {out_dir} is the series being ported (--series {series_dir}); writing B's series there "
            "would overwrite A's. Nothing was written.",
            hint="write B's series to its own folder, e.g. -o patches/vllm/<B>.",
        )


@command.command("apply")
@_with_series_opts
@click.option(
    "--site-packages",
    "site_packages",
    type=click.Path(file_okay=False, exists=True),
    required=True,
    help="site-packages holding the installed vllm/ to patch in place.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list of patched files.")
def apply_cmd(vllm, series_dir, site_packages, as_json):
    """Patch an installed vllm in place, all or nothing.

    First checks every target file's sha256 equals the wheel's original
    (sha256sums.orig): a base with a different vllm is refused before anything
    changes.  Prints each patched file with its new sha256 (sha256sum format).
    Exit codes: 0 patched (or already patched by this series), 6 refused, 2 bad input.
    """
    _need_version(vllm, series_dir)
    series = _series(vllm, series_dir)
    done = P.apply_site_packages(series, site_packages)
    if as_json:
        emit_json(
            {
                "series": str(series.dir),
                "vllm": series.version,
                "site_packages": site_packages,
                "patches": [p.name for p in series.patches],
                "files": [vars(f) for f in done],
            }
        )
    else:
        click.echo(P.sha256_list(done, "patched"), nl=False)


@command.command("sums")
@_with_series_opts
@click.option(
    "--wheel",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="The vllm wheel the series is made against; default: fetched from PyPI.",
)
def sums_cmd(vllm, series_dir, wheel):
    """(Re)write the series' sha256sums.orig and wheel.sha256 from the wheel.

    Run once when creating or porting a series; review and commit both files.

    Exit codes: 0 written; 2 bad input (no such series, a wheel that is not vllm's); 7 the wheel's
    download failed its sha256; 14 another run holds the series folder.
    """
    _need_version(vllm, series_dir)
    series = _series(vllm, series_dir)
    source = (
        Path(wheel)
        if wheel
        else _wheel(P.Series(series.dir, series.package, series.version, series.patches), None, True)
    )
    sums = P.original_sums(series, source)
    atomic_write_text(series.dir / P.ORIG_SUMS, P.format_sums(sums))
    atomic_write_text(series.dir / P.WHEEL_SUM, f"{sha256_file(source)}  {source.name}\n")
    click.echo(f"wrote {series.dir / P.ORIG_SUMS} ({len(sums)} files) and {series.dir / P.WHEEL_SUM}")
