"""`build-image checkpoint verify DIR`: is the downloaded checkpoint complete and intact?

Exit 0 READY, 1 NOT READY (the report names each file and what is wrong),
2 bad input (no such directory, an unreadable or malformed sums file, flags),
130 interrupted while hashing (the digests finished so far are kept).
Nothing is written except the digest cache under the user cache directory.
"""

from __future__ import annotations

import os
import sys

import click

from builder.errors import BadInput, VerdictFailure
from builder.report import emit_json
from builder.serving.checkpoint import inspect_checkpoint, render_text, scan_directory
from builder.serving.checkpoint_content import (
    ContentPlan,
    HashCache,
    Sha256Hasher,
    check_hf_small_files,
    content_plan_from_sums,
    hf_expected,
    hf_source,
    load_sums,
)

# What a command runs (its stage, the engine adapter, downloads, reports) is imported inside the command
# function, not here: `build-image --help` imports every command module to list it, and a stage
# (with its dependencies) loads only when its command runs.


def _default_jobs() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


@click.group("checkpoint")
def command():
    """Checkpoint readiness: prove a download complete and intact before any load."""


@command.command("verify")
@click.argument("directory", type=click.Path(file_okay=True, dir_okay=True))
@click.option(
    "--sha256",
    "sums_file",
    default=None,
    metavar="FILE",
    help="sha256sum-format sums (HEX  NAME, names relative to DIR); every shard must be listed.",
)
@click.option(
    "--hf-cache",
    "hf_cache",
    default=None,
    metavar="DIR",
    help="Compare with what a Hugging Face download recorded: the hub cache (or its models--* folder) "
    "whose blobs the snapshot DIR links to, or DIR itself for a --local-dir download.",
)
@click.option("--jobs", "-j", type=int, default=None, help="Files hashed at once (default: usable CPUs, at most 8).")
@click.option("--rehash", is_flag=True, help="Hash every file again, ignoring the cache of digests already verified.")
@click.option("--strict", is_flag=True, help="Warnings (a shard outside the index, ...) make it NOT READY too.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report on stdout.")
def verify(directory, sums_file, hf_cache, jobs, rehash, strict, as_json):
    """READY / NOT READY: headers, index, shapes, leftovers; with --sha256/--hf-cache, every shard's sha256.

    Exit codes: 0 READY; 1 NOT READY; 2 bad input; 130 interrupted.
    """
    if sums_file and hf_cache:
        raise BadInput("checkpoint verify: give --sha256 FILE or --hf-cache DIR, not both.")
    hasher = Sha256Hasher(jobs if jobs is not None else _default_jobs())  # BadInput for --jobs < 1
    sums = load_sums(sums_file) if sums_file else None  # bad input before any work
    inv = scan_directory(directory)
    rep = inspect_checkpoint(directory, inv)
    shard_names = [s["file"] for s in rep.shards if s["loaded"]]
    plan: ContentPlan | None = None
    if sums is not None:
        plan = content_plan_from_sums(inv, sums, sums_file, shard_names)
    elif hf_cache:
        rep.notes = [n for n in rep.notes if "--hf-cache" not in n]  # it is being done
        src = hf_source(inv, hf_cache)
        expected, problems = hf_expected(inv, src, shard_names)
        plan = ContentPlan(expected, problems, f"the Hugging Face download records ({hf_cache})")
    if plan is not None:
        if rep.errors:
            rep.content = {
                "checked": False,
                "skipped": "structural problems: fix those first (hashing would not make it ready)",
            }
        else:
            cache = HashCache()  # --rehash: nothing is read from it, every digest is still stored
            if rehash:
                cache.forget_all()
            try:
                content, problems = _hash(inv, plan, hasher, cache, quiet=as_json)
            except KeyboardInterrupt:
                click.echo(
                    "checkpoint verify: interrupted; the digests finished so far are kept, "
                    "a re-run hashes only the rest.",
                    err=True,
                )
                sys.exit(130)
            rep.problems += problems
            rep.content = content
            if hf_cache:
                checked, small = check_hf_small_files(inv, src, plan.expected)
                rep.problems += small
                rep.content["other_files_checked"] = checked
    if as_json:
        emit_json(rep.to_dict(strict=strict))
    else:
        click.echo(render_text(rep, strict=strict))
    if not rep.ready(strict=strict):
        raise VerdictFailure(not_ready_message(directory, rep, strict))


def not_ready_message(directory, rep, strict: bool) -> str:
    """The one-line verdict on stderr: how many problems, the first one shortened (the report above lists them)."""
    first = (rep.errors or rep.warnings)[0]
    n = len(rep.errors) + (len(rep.warnings) if strict else 0)
    text = f"{first.file}: {first.message}"
    text = text if len(text) <= 300 else text[:300] + "…"
    return (
        f"checkpoint {directory} is NOT READY: {n} problem(s), listed above; the first: {text}"
        if n > 1
        else f"checkpoint {directory} is NOT READY: {text}"
    )


def _hash(inv, plan, hasher, cache, *, quiet: bool):
    """Run the hashing with a rich progress bar on a terminal, plain lines otherwise."""
    from builder.serving.checkpoint_content import verify_content

    if sys.stderr.isatty():
        from rich.console import Console

        from builder.events import RichReporter

        return verify_content(inv, plan, hasher=hasher, cache=cache, reporter=RichReporter(Console(stderr=True)))

    def done(entry, digest, err):
        if quiet:
            return
        if err:
            verdict = f"unreadable ({err})"
        else:
            verdict = "ok" if digest == plan.expected.get(entry.name) else "MISMATCH"
        click.echo(f"sha256 {verdict}: {entry.name} ({entry.size / 1e9:.2f} GB)", err=True)

    def start(files, total):
        if not quiet and files:
            click.echo(f"sha256: hashing {files} file(s), {total / 1e9:.2f} GB, {hasher.jobs} job(s)", err=True)

    return verify_content(inv, plan, hasher=hasher, cache=cache, start=start, done=done)
