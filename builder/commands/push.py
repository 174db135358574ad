"""``build-image push``: push the tags, check the registry's digest, print it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..errors import BadInput, RegistryError, TagConflict


def push_tags(tags: list[str], *, force: bool = False, engine=None, console=None) -> dict:
    """Push every tag of one local image; verify the registry's manifest digest.

    Before pushing: a content-addressed tag (``…:vllm<v>-<12 hex>``) that already points at a
    different image in the registry -> TagConflict (unless ``force``).  The moving tag
    (``…:vllm<v>``) is meant to move to each new lock: it moves without ``force`` and is
    listed in ``moved_tags``.  After pushing: the registry's digest for each tag must
    equal the digest the engine pushed -> RegistryError otherwise.  Nothing is reported as
    pushed that the registry does not serve.
    """
    from ..engine import get_engine
    from ..registry import client_for, config_of
    from ..render import is_content_addressed

    engine = engine or get_engine()
    engine.ping()
    infos = {}
    for t in tags:
        info = engine.inspect(t)
        if info is None:
            raise BadInput(f"no local image tagged {t}.", hint="build it first: `build-image build`.")
        infos[t] = info
    ids = {i.id for i in infos.values()}
    if len(ids) != 1:
        raise BadInput(f"the tags {', '.join(tags)} point at different local images ({', '.join(sorted(ids))}).")
    image_id = ids.pop()
    clients = {}
    for t in tags:
        client, ref = client_for(t)
        if ref.registry == "docker.io" and "/" not in t.split(":")[0]:
            raise BadInput(f"tag {t} has no registry host; use --tag HOST[:PORT]/REPO.")
        client.ping()
        clients[t] = (client, ref)
    # conflict check before anything is pushed
    conflicts, moving = [], []
    for t, (client, ref) in clients.items():
        got = client.manifest(ref.repository, ref.tag or "latest")
        if got is None:
            continue
        cfg = config_of(got[1])
        if cfg != image_id:  # a manifest list / index (no single config) is a different image too
            what = f"image {cfg[:19]}…" if cfg else f"{got[1].get('mediaType') or 'a manifest without a config'} {got[0][:19]}…"
            (conflicts if is_content_addressed(t) else moving).append(f"{t} -> {what} (local {image_id[:19]}…)")
    if conflicts and not force:
        raise TagConflict(
            "tag(s) already point at a different image in the registry: " + "; ".join(conflicts) + ". Nothing was pushed.",
            hint="a content-addressed tag moving means the build is not the same; pass --force to move the tag(s).",
        )
    if console is not None:
        for m in moving:
            console.print(f"push: moving tag {m}", markup=False, highlight=False)
    pushed = []
    for t, (client, ref) in clients.items():
        if console is not None:
            console.print(f"push: {t}", markup=False, highlight=False)
        res = engine.push(t)
        got = client.manifest(ref.repository, ref.tag or "latest")
        remote, cfg = (got[0], config_of(got[1])) if got else (None, None)
        if remote != res.digest or cfg != image_id:
            raise RegistryError(
                f"after pushing {t} the registry serves manifest {remote or 'nothing'} (image {cfg or 'none'}), "
                f"but the engine pushed {res.digest} of the local image {image_id}.",
                details="pushed so far: " + (", ".join(p["ref"] for p in pushed) or "none"),
            )
        pushed.append({"ref": t, "digest": res.digest, "pinned": f"{ref.registry}/{ref.repository}@{res.digest}"})
    digests = {p["digest"] for p in pushed}
    return {
        "image_id": image_id,
        "digest": pushed[0]["digest"] if len(digests) == 1 else None,
        "pinned": pushed[0]["pinned"],
        "pushed": pushed,
        "moved_tags": [c.split(" ->")[0] for c in conflicts + moving],
    }


@click.command("push")
@click.argument("context", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--vllm", "vllm", default=None, metavar="VERSION", help="Picks the default context build/vllm-<v>.")
@click.option("--tag", "repo", metavar="REPO", help="Image repository, e.g. 127.0.0.1:5000/serving/vllm (default: spec 'repo').")
@click.option("--spec", "spec_file", metavar="FILE", type=click.Path(dir_okay=False), help="Spec file.")
@click.option("--force", is_flag=True, help="Move tags that already point at a different image.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result on stdout.")
def command(context, vllm, repo, spec_file, force, as_json):
    """Push the image built from CONTEXT (both tags) and verify the registry's manifest digest.

    Exit codes: 0 pushed and verified, 2 no such local image / bad tag, 8 engine unreachable,
    10 registry unreachable / push refused / digest mismatch, 11 a tag already points at a
    different image (use --force).  Credentials: only the engine's own store (docker login).
    """
    from ..render import tags_for_context
    from ..spec import load_spec
    from .render import default_out_dir, stderr_console

    spec = load_spec(spec_file).with_flags(vllm=vllm, repo=repo)
    if not spec.repo:
        raise BadInput("push needs a repository with a registry host: --tag HOST[:PORT]/REPO (or 'repo' in the spec).")
    context = context or default_out_dir(spec.vllm)
    _vllm, tags, _lock = tags_for_context(context, spec.repo)
    doc = push_tags(tags, force=force, console=stderr_console())
    from ..referrers import push_attestations, summary_line

    doc["attestations"] = push_attestations(context, doc["pinned"], tags)
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        for p in doc["pushed"]:
            click.echo(f"pushed {p['ref']}  {p['digest']}")
        click.echo(summary_line(doc["attestations"]), err=True)
        click.echo(doc["pinned"])
