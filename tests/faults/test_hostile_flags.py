"""Hostile flags are refused up front as bad input (exit 2), naming the flag and the bound."""

from __future__ import annotations

import time

import pytest

from builder.errors import BadInput
from builder.serving.smoke.config import MAX_CONCURRENCY, SmokeConfig

from .conftest import cli


@pytest.mark.parametrize("n", ["100000", "1000000000"])
def test_smoke_concurrency_beyond_the_probe_bound_is_bad_input(tmp_path, n):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    t0 = time.monotonic()
    r = cli(
        ["smoke", "--local", "--model", str(model), "--concurrency", n, "--no-plan", "--skip-checkpoint-check"],
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert f"--concurrency {n}" in r.stderr and str(MAX_CONCURRENCY) in r.stderr
    assert "This is a bug" not in r.stderr and time.monotonic() - t0 < 30  # refused before any server starts


def test_the_bound_itself_is_accepted(tmp_path):
    SmokeConfig(model=str(tmp_path), concurrency=MAX_CONCURRENCY).validate()
    with pytest.raises(BadInput, match="bound"):
        SmokeConfig(model=str(tmp_path), concurrency=MAX_CONCURRENCY + 1).validate()


def test_every_option_of_every_command_has_help_text():
    import click

    from builder.cli import main

    ctx = click.Context(main)
    missing = []

    def walk(cmd, name):
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden and not p.help and "--help" not in p.opts:
                missing.append(f"{name} {p.opts[0]}")
        if isinstance(cmd, click.Group):
            for sub in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, sub), f"{name} {sub}")

    walk(main, "build-image")
    assert missing == []
