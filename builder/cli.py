"""Command-line entry point: thin — parse, call a stage, print, exit.

Every subcommand lives in ``builder/commands/<name>.py`` and exposes a click
object named ``command``.  Errors derived from ``BuildImageError`` are printed
as one paragraph on stderr and mapped to their documented exit code.
"""

from __future__ import annotations

import importlib
import sys

import click

from . import __version__
from .errors import BuildImageError

COMMAND_MODULES = (
    "base",      # build-image base snapshot
    "lock",      # build-image lock
    "patch",     # build-image patch check|apply
    "render",    # build-image render
    "build",     # build-image build
    "push",      # build-image push
    "diff",      # build-image diff
    "plan",      # build-image plan
    "smoke",     # build-image smoke
    "raycheck",  # build-image ray-check
)


class ErrorHandlingGroup(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BuildImageError as exc:
            click.echo(exc.render(), err=True)
            ctx.exit(exc.exit_code)


@click.group(cls=ErrorHandlingGroup, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="build-image")
@click.pass_context
def main(ctx: click.Context, **kwargs):
    """Build dependency-consistent vLLM + Ray serving images.

    Without a subcommand, runs the whole pipeline:
    lock -> ABI gate -> patch check -> render -> build -> push -> smoke.
    """
    if ctx.invoked_subcommand is not None:
        return
    from .commands import pipeline

    ctx.invoke(pipeline.run_pipeline, **kwargs)


def _register() -> None:
    from .commands import pipeline

    # The pipeline's options live on the group itself (`build-image --vllm 0.26.0 ...`).
    for param in pipeline.run_pipeline.params:
        main.params.append(param)
    for name in COMMAND_MODULES:
        mod = importlib.import_module(f"{__package__}.commands.{name}")
        cmd = getattr(mod, "command", None)
        if cmd is not None:
            main.add_command(cmd)


_register()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
