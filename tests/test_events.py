"""Progress as events (builder/events.py): one reporter interface, shown plain (a pipe, CI, --json) or
through rich (a terminal) with the same words; nothing reads the output back."""

from __future__ import annotations

import io

from rich.console import Console

from builder.events import SILENT, PlainReporter, RichReporter, reporter_for


def _all_events(r) -> None:
    r.stage_started(1, 3, "lock", "build/requirements.lock [x]")
    r.scoped("lock: ").step("resolving ray[serve] on top of 2 base pins")
    r.scoped("  ").download("six-1.17.0-py2.py3-none-any.whl", 1, 2)
    r.message("wrote build/requirements.lock: 2 packages [y]")
    r.warning(" (not pushed; --push pins them by digest).", lead="kuberay: the manifests run x:1 by tag")
    r.warning("build warning: drift [z]")
    r.stage_finished("lock", 0.25)


EXPECTED = """[1/3] lock: build/requirements.lock [x]
lock: resolving ray[serve] on top of 2 base pins
  wheel six-1.17.0-py2.py3-none-any.whl
wrote build/requirements.lock: 2 packages [y]
kuberay: the manifests run x:1 by tag (not pushed; --push pins them by digest).
build warning: drift [z]
"""


def test_plain_and_rich_show_the_same_words_and_rich_takes_no_text_for_markup():
    plain = io.StringIO()
    _all_events(PlainReporter(plain))
    assert plain.getvalue() == EXPECTED
    shown = io.StringIO()
    _all_events(RichReporter(Console(file=shown, width=300)))  # brackets in a path or a line stay as they are
    assert shown.getvalue() == EXPECTED
    colour = io.StringIO()
    RichReporter(Console(file=colour, force_terminal=True, color_system="standard", width=300)).warning(
        " rest", lead="lead"
    )
    assert "\x1b[33mlead\x1b[0m rest" in colour.getvalue()  # the lead in yellow, the rest plain


def test_scoped_prefixes_nest_and_the_silent_reporter_says_nothing(capsys):
    out = io.StringIO()
    PlainReporter(out).scoped("  ").scoped("smoke: ").step("booted")
    assert out.getvalue() == "  smoke: booted\n"
    _all_events(SILENT)
    assert capsys.readouterr() == ("", "")


def test_a_command_shows_rich_only_on_a_terminal_and_never_with_json():
    terminal = Console(file=io.StringIO(), force_terminal=True)
    pipe = Console(file=io.StringIO())
    assert isinstance(reporter_for(terminal), RichReporter)
    assert isinstance(reporter_for(terminal, as_json=True), PlainReporter)
    assert isinstance(reporter_for(pipe), PlainReporter)


def test_notices_transfers_and_the_recorder():
    from builder.events import Recorder

    lines: list[str] = []
    rec = Recorder(lines)
    _all_events(rec)
    rec.notice("notices:\n  x")
    rec.transfer("vllm.whl", 10, 100)
    assert "".join(f"{x}\n" for x in lines) == EXPECTED + "notices:\n  x\n"  # bytes are not lines
    out = io.StringIO()
    PlainReporter(out, notices=False).notice("notices: kept in the --json document")
    PlainReporter(out).transfer("vllm.whl", 10, 100)
    assert out.getvalue() == ""
    PlainReporter(out).notice("notices: shown")
    assert out.getvalue() == "notices: shown\n"
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    rich = RichReporter(console)
    for done in (0, 50, 100):  # a transient bar: started, moved, gone when the file ends
        rich.scoped("  ").transfer("vllm.whl", done, 100)
    assert rich.bars.progress is None and not rich.bars.tasks


def test_a_plain_reporter_without_steps_keeps_the_warnings():
    out = io.StringIO()
    quiet = PlainReporter(out, steps=False).scoped("scan: ")
    quiet.step("scanning 1/2 numpy")
    quiet.download("numpy", 1, 2)
    quiet.warning("RECORD line skipped", lead="warning: ")
    quiet.message("done")
    assert out.getvalue() == "warning: RECORD line skipped\ndone\n"
