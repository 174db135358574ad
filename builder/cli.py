"""Command-line entry point: thin — parse, call a stage, print, exit.

Every subcommand lives in ``builder/commands/<name>.py`` and exposes a click
object named ``command``.  Errors derived from ``BuildImageError`` are printed
as one paragraph on stderr and mapped to their documented exit code.
"""

from __future__ import annotations

import errno
import importlib
import sys

import click

from builder import __version__
from builder.commands import pipeline
from builder.credentials import redact_text
from builder.errors import BuildImageError, printable
from builder.scratch import scratch, scratch_home
from builder.signals import SIGINT_EXIT, SIGTERM_EXIT, Terminated, signals_unwind
from builder.util import cache_dir, name_error, write_error

INTERNAL_ERROR = 70

# command name -> module under builder/commands/ exposing ``command``.  Modules are
# imported only when their command runs (or for --help), so `build-image diff`
# does not pay for importing the smoke probe, the docker adapter, etc.
COMMANDS = {
    "base": "base",  # build-image base snapshot
    "lock": "lock",  # build-image lock
    "patch": "patch",  # build-image patch check|apply|sums
    "render": "render",  # build-image render
    "build": "build",  # build-image build
    "push": "push",  # build-image push
    "diff": "diff",  # build-image diff
    "plan": "plan",  # build-image plan
    "smoke": "smoke",  # build-image smoke
    "ray-check": "raycheck",  # build-image ray-check
    "upgrade": "upgrade",  # build-image upgrade
    "checkpoint": "checkpoint",  # build-image checkpoint verify
    "promote": "promote",  # build-image promote IMAGE@DIGEST --to REPO:TAG
    "rollback": "rollback",  # build-image rollback REPO:TAG
    "history": "history",  # build-image history REPO:TAG
}


class ErrorHandlingGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = COMMANDS.get(name)
        if module is None:
            return None
        return importlib.import_module(f"{__package__}.commands.{module}").command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.ClickException as exc:  # the group's own options (the pipeline's)
            _redact_usage_error(exc)
            raise

    def invoke(self, ctx: click.Context):
        try:
            # temp files under the cache (a killed run's litter is swept here); SIGTERM unwinds like SIGINT
            with signals_unwind(), scratch(scratch_home(cache_dir(create=False))):
                return super().invoke(ctx)
        except BuildImageError as exc:
            click.echo(exc.render(), err=True)
            ctx.exit(exc.exit_code)
        except click.ClickException as exc:  # usage errors keep click's form and code, with no credential
            _redact_usage_error(exc)
            raise
        except (click.exceptions.Exit, click.Abort):
            raise  # click's own exits keep their codes
        except KeyboardInterrupt:  # not click's "Aborted!" (exit 1, the negative-verdict code)
            click.echo("interrupted (SIGINT): stopped; every output is as it was before this run.", err=True)
            ctx.exit(SIGINT_EXIT)
        except Terminated:
            click.echo("terminated (SIGTERM): stopped; every output is as it was before this run.", err=True)
            ctx.exit(SIGTERM_EXIT)
        except OSError as exc:
            err = write_error(exc.filename or "an output", exc) if exc.errno in OUTPUT_ERRNOS else name_error(exc)
            if err is None:
                _internal_error(ctx, exc)
            click.echo(err.render(), err=True)  # a full or read-only file system is the user's, not a bug
            ctx.exit(err.exit_code)
        except Exception as exc:  # a bug: never let it read as a verdict (exit 1)
            _internal_error(ctx, exc)


#: errors of the file system an output is written to (full, over quota, read-only): exit 2 naming the file
#: wherever a write meets them, never an internal error
OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def _redact_usage_error(exc: click.ClickException) -> None:
    """A usage error quotes the value it refuses (``'https://user:PW@…' is not a valid integer``): redacted."""
    exc.message = printable(redact_text(exc.message))


def _internal_error(ctx: click.Context, exc: BaseException) -> None:
    import traceback

    click.echo(redact_text(traceback.format_exc()).rstrip(), err=True)
    click.echo(
        f"internal error: {type(exc).__name__}: {redact_text(str(exc))}\n"
        "This is a bug in build-image; please report it with the traceback above.",
        err=True,
    )
    ctx.exit(INTERNAL_ERROR)


@click.group(
    cls=ErrorHandlingGroup, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, prog_name="build-image")
@click.option(
    "--engine",
    type=click.Choice(["docker", "podman"]),
    default=None,
    expose_value=False,
    is_eager=True,
    callback=lambda _ctx, _param, value: _use_engine(value),
    help="Container engine for every command (default: BUILD_IMAGE_ENGINE, else docker; a CLI named "
    "podman in BUILD_IMAGE_DOCKER means podman).",
)
@click.pass_context
def main(ctx: click.Context, **kwargs):
    """Build dependency-consistent vLLM + Ray serving images.

    Without a subcommand, runs the whole pipeline:
    lock -> ABI gate -> patch check -> render -> build -> push -> smoke.

    Exit codes: 0 done; 1 smoke FAIL; 2 bad input (an unshipped --vllm names the
    command that adds it); 3 ABI gate rejected; 4 unsatisfiable on the base; 6 patch
    series refused; 7 download/sha256; 8 engine unreachable; 9 build failed; 10
    registry; 11 tag moved elsewhere; 12 helper tool failed; 13 checkpoint not
    ready; 14 output held by another run; 130/143 interrupted.
    """
    if ctx.invoked_subcommand is not None:
        return

    pipeline.run_pipeline.callback(**kwargs)  # the command's function itself: its options are the group's


def _use_engine(value: str | None) -> None:
    """``--engine``: the engine every command of this run drives (``BUILD_IMAGE_ENGINE``, read by
    :func:`builder.engine.engine_kind`)."""
    if value:
        import os

        from builder.engine import ENGINE_ENV  # only when --engine is given: startup stays light

        os.environ[ENGINE_ENV] = value


def _register() -> None:
    # The pipeline's options live on the group itself (`build-image --vllm 0.26.0 ...`).
    for param in pipeline.run_pipeline.params:
        main.params.append(param)


_register()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
