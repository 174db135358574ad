"""Every command's --help lists the exit codes it can give (scripts rely on them; builder/errors.py)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from builder.cli import main


def _commands(group: click.Group, prefix: tuple[str, ...] = ()):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))
        else:
            yield (*prefix, name)


@pytest.mark.parametrize("path", [(), *_commands(main)], ids=lambda p: " ".join(p) or "build-image")
def test_help_lists_the_exit_codes(path):
    r = CliRunner().invoke(main, [*path, "--help"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "Exit codes: 0" in text, f"`build-image {' '.join(path)} --help` lists no exit codes"
    assert " 2 " in text.split("Exit codes:", 1)[1], "bad input (2) is not among them"
