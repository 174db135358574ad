"""The CLI shell: lazy command loading and exit-code mapping."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from builder import cli
from builder.errors import EXIT_CODES


def test_every_command_loads_and_has_help():
    runner = CliRunner()
    for name in cli.COMMANDS:
        r = runner.invoke(cli.main, [name, "--help"])
        assert r.exit_code == 0, (name, r.output)
        assert "Usage:" in r.output


def test_unknown_command_is_a_usage_error():
    r = CliRunner().invoke(cli.main, ["no-such-command"])
    assert r.exit_code == 2
    assert "No such command" in r.output


def test_uncaught_exception_exits_70_not_a_verdict(monkeypatch):
    # An unexpected exception inside a command must not exit 1 (which CI reads as
    # "dangerous change" / "does not fit" / "FAIL").
    import builder.commands.diff as diff_cmd

    def boom(*a, **k):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(diff_cmd.command, "callback", boom)
    r = CliRunner().invoke(cli.main, ["diff", "a", "b"])
    assert r.exit_code == cli.INTERNAL_ERROR == 70
    assert "internal error: ZeroDivisionError: boom" in r.output
    assert 70 in EXIT_CODES


def test_startup_does_not_import_every_stage():
    code = (
        "import sys, builder.cli; "
        "heavy = [m for m in ('builder.serving.smoke', 'builder.serving.plan', 'builder.engine', "
        "'builder.patching.series', 'builder.image.render') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
