"""``build-image push``: push the tags, check the registry's digest, print it."""

from __future__ import annotations

from pathlib import Path

import click

from builder.commands import stderr_console
from builder.errors import BadInput
from builder.report import emit_json
from builder.spec import load_spec

# What a command runs (its stage, the engine adapter, downloads, reports) is imported inside the command
# function, not here: `build-image --help` imports every command module to list it, and a stage
# (with its dependencies) loads only when its command runs.


@click.command("push")
@click.argument("context", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--vllm", "vllm", default=None, metavar="VERSION", help="Picks the default context build/vllm-<v>.")
@click.option(
    "--tag", "repo", metavar="REPO", help="Image repository, e.g. 127.0.0.1:5000/serving/vllm (default: spec 'repo')."
)
@click.option("--spec", "spec_file", metavar="FILE", type=click.Path(dir_okay=False), help="Spec file.")
@click.option("--force", is_flag=True, help="Move tags that already point at a different image.")
@click.option(
    "--platform",
    "platform",
    metavar="OS/ARCH[,OS/ARCH]",
    help="Of a multi-platform context, push only these (and an index of them; default: every platform).",
)
@click.option(
    "--sign-key",
    "sign_key",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Also attach the SBOM and the provenance as DSSE envelopes signed with this private key (ECDSA P-256 "
    "or Ed25519 PEM, mode 0600), where cosign stores key-signed attestations (single-platform contexts).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result on stdout.")
def command(context, vllm, repo, spec_file, force, platform, sign_key, as_json):
    """Push the image built from CONTEXT (both tags) and verify the registry's manifest digest.

    A multi-platform context (platforms.json): each platform's image is pushed under its own tags
    (-linux-amd64, -linux-arm64) with its SBOM and provenance attached to that platform's manifest,
    then an OCI image index listing each platform goes under REPO:vllm<v>-<12 hex> and REPO:vllm<v>;
    the index and every platform manifest are read back from the registry and their digests checked.
    Exit codes: 0 pushed and verified, 2 no such local image / bad tag / a platform the context was not
    rendered for, 8 engine unreachable, 10 registry unreachable / push refused / digest mismatch, 11 a
    tag already points at a different image (use --force).  Credentials: only the engine's own store
    (docker login).
    """
    from builder.events import reporter_for
    from builder.image.multiplatform import is_multi, select
    from builder.image.naming import lock_platform
    from builder.image.push import push_image
    from builder.image.render import default_out_dir, read_context

    spec = load_spec(spec_file).with_flags(vllm=vllm, repo=repo)
    if not spec.repo:
        raise BadInput("push needs a repository with a registry host: --tag HOST[:PORT]/REPO (or 'repo' in the spec).")
    out = context or default_out_dir(spec.vllm)
    console = stderr_console()
    from builder.signing import load_signer

    signer = load_signer(sign_key) if sign_key else None  # before anything is pushed
    if is_multi(out):
        if signer is not None:
            raise BadInput(
                "push --sign-key signs a single-platform context's SBOM and provenance; a multi-platform "
                "context is not signed yet (sign each platform's digest with cosign attest)."
            )
        push_multi(out, spec.repo, platform, force=force, as_json=as_json, console=console)
        return
    ctx = read_context(out, spec.repo)
    select((lock_platform(ctx.lock),), platform, ctx.out_dir)
    pushed = push_image(
        ctx.tags,
        force=force,
        context=ctx.out_dir,
        reporter=reporter_for(console, as_json=as_json).scoped("push: "),
        signer=signer,
    )
    if as_json:
        emit_json(pushed.to_dict())
    else:
        for p in pushed.pushed:
            click.echo(f"pushed {p.ref}  {p.digest}")
        click.echo(pushed.pinned)


def push_multi(out: Path, repo: str, platform: str | None, *, force: bool, as_json: bool, console) -> None:
    """Each selected platform's image, then the index of them."""
    from builder.events import reporter_for
    from builder.image.multiplatform import push_platforms, read_multi_context

    mc = read_multi_context(out, repo, wanted=platform)
    pushed = push_platforms(mc, force=force, reporter=reporter_for(console, as_json=as_json).scoped("push: "))
    if as_json:
        emit_json(pushed.to_dict())
        return
    for p, r in pushed.platforms:
        click.echo(f"pushed {p} {r.pinned}")
        for t in r.pushed:
            click.echo(f"  {t.ref}  {t.digest}")
    for t in pushed.tags:
        click.echo(f"index {t}  {pushed.digest}")
    click.echo(pushed.pinned)
