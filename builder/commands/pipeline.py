"""`build-image --vllm X ...`: the whole pipeline (owned by the render/build/push work)."""

from __future__ import annotations

import click


@click.command("pipeline")
@click.option("--vllm", "vllm", default=None, help="vLLM version (default: spec or 0.26.0).")
@click.option("--spec", "spec_file", default=None, type=click.Path(dir_okay=False), help="Spec file (default ./build-image.toml if present).")
def run_pipeline(vllm, spec_file):
    raise click.UsageError("the pipeline is not implemented yet")
