"""``build-image build``: build a rendered context with BuildKit (no network inside the build)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from ..engine import get_engine


def missing_bases(context: Path, engine) -> list[str]:
    """Base images the context builds FROM that the engine does not hold locally."""
    from ..render import base_refs

    text = (Path(context) / "Dockerfile").read_text(encoding="utf-8")
    return [ref for ref in base_refs(text) if engine.inspect(ref) is None]


def build_context(context: Path, repo: str | None, *, engine=None, console=None, pull: bool = False) -> dict:
    """Verify the context, build it, tag it.  Returns a summary dict.

    Without ``pull`` a base image that is not in the engine's store is an error (exit 9)
    instead of an implicit multi-GB download from a registry."""
    from ..errors import BuildFailed
    from ..render import tags_for_context

    vllm, tags, lock = tags_for_context(context, repo)  # verifies every wheel's sha256 first
    engine = engine or get_engine()
    engine.ping()
    if not pull:
        missing = missing_bases(context, engine)
        if missing:
            raise BuildFailed(
                f"the base image {', '.join(missing)} is not in the engine's image store; "
                "build-image does not pull it implicitly.",
                hint=f"pull it first (`docker pull {missing[0]}`) or pass --pull to let the engine fetch it.",
            )
    t0 = time.monotonic()
    steps: list[str] = []

    def on_line(line: str) -> None:
        # BuildKit plain progress: "#7 [stage-1 2/5] RUN ..." headers; show them, keep the rest quiet
        if line.startswith("#") and "] " in line and "[internal]" not in line:
            head = line.split(" ", 1)[1] if " " in line else line
            if not steps or steps[-1] != head:
                steps.append(head)
                if console is not None:
                    console.print("build: " + " ".join(head.split())[:110], markup=False, highlight=False, soft_wrap=True)

    result = engine.build(Path(context), tags, network="none", on_line=on_line)
    from .. import provenance  # the statement's subject is now the image (its ID under each tag)

    provenance.record_subject(context, provenance.image_subject(tags, result.image_id), stage="build")
    info = engine.inspect(result.image_id)
    cached = sum(1 for l in result.log.splitlines() if l.rstrip().endswith("CACHED"))
    return {
        "image_id": result.image_id,
        "tags": tags,
        "vllm": vllm,
        "lock_hash": lock.lock_hash,
        "size_bytes": info.size if info else None,
        "seconds": round(time.monotonic() - t0, 2),
        "cached_steps": cached,
        "context": str(context),
    }


@click.command("build")
@click.argument("context", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--vllm", "vllm", default=None, metavar="VERSION", help="Picks the default context build/vllm-<v>.")
@click.option("--tag", "repo", metavar="REPO", help="Image repository (default: spec 'repo', else build-image/vllm-serving).")
@click.option("--spec", "spec_file", metavar="FILE", type=click.Path(dir_okay=False), help="Spec file.")
@click.option("--pull", is_flag=True, help="Let the engine pull a base image it does not have (default: refuse).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result on stdout.")
def command(context, vllm, repo, spec_file, pull, as_json):
    """Build CONTEXT (default build/vllm-<v>) with BuildKit, --network=none, and tag it.

    Tags: REPO:vllm<v>-<first 12 of the lock hash> and REPO:vllm<v>.
    Exit codes: 0 built, 2 bad/missing context or missing wheel, 7 wheel/patched file sha256
    mismatch, 8 engine unreachable, 9 build failed (incl. the Dockerfile's early checks, and a
    base image missing from the engine without --pull).
    """
    from ..spec import load_spec
    from .render import default_out_dir, stderr_console

    spec = load_spec(spec_file).with_flags(vllm=vllm, repo=repo)
    context = context or default_out_dir(spec.vllm)
    doc = build_context(context, spec.repo, console=stderr_console(), pull=pull)
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        click.echo(f"built {doc['image_id']} ({(doc['size_bytes'] or 0) / 1e6:.1f} MB) in {doc['seconds']}s")
        for t in doc["tags"]:
            click.echo(f"  tagged {t}")
