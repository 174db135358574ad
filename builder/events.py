"""Progress as events: what a running stage tells the person watching it.

A stage reports through one :class:`Reporter`: a stage started (``[n/N] name: what``) and finished
(its seconds), a step line, a download (one of N files; the bytes of one file), a line said as is (a
result or a verdict told on stderr), a notice (what a ``--json`` document carries as well), a warning.
Two implementations: :class:`RichReporter` for a terminal (bold stage headers, a coloured lead on a
warning, steps on a live status line where the command shows one, a transient bar a download) and
:class:`PlainReporter` for everything else (a pipe, a CI log, ``--json``): the same words, no
markup, one line a line.  :data:`SILENT` hears nothing (a stage called without a reporter);
:class:`Recorder` keeps the lines (a test, or a caller that hands them on).

A reporter only shows events; it never decides anything, and nothing reads its output back:
timings travel in the stage results.  ``scoped(prefix)`` is the same reporter with every step
and download line prefixed (``"build: "``, ``"  "``), so a stage never formats another's lines.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, TextIO

if TYPE_CHECKING:  # rich loads only when a terminal shows the events
    from rich.console import Console
    from rich.progress import Progress, TaskID
    from rich.status import Status


class Reporter(Protocol):
    """Where a stage's progress goes (see the module doc)."""

    def stage_started(self, index: int, total: int, name: str, what: str) -> None: ...

    def stage_finished(self, name: str, seconds: float) -> None: ...

    def step(self, text: str) -> None: ...

    def download(self, name: str, index: int, total: int) -> None: ...

    def transfer(self, name: str, done: int, total: int) -> None:
        """``done`` of ``total`` bytes of ``name`` (what a bar is labelled: ``fetch FILE``, ``sha256``);
        ``done == total`` ends it (sent however the transfer ends)."""

    def message(self, text: str) -> None: ...

    def notice(self, text: str) -> None:
        """A note a ``--json`` document carries too (the gate's notices)."""

    def warning(self, text: str, *, lead: str = "") -> None: ...

    def scoped(self, prefix: str) -> Reporter: ...


@dataclass(frozen=True)
class _Silent:
    def stage_started(self, index: int, total: int, name: str, what: str) -> None:
        pass

    def stage_finished(self, name: str, seconds: float) -> None:
        pass

    def step(self, text: str) -> None:
        pass

    def download(self, name: str, index: int, total: int) -> None:
        pass

    def transfer(self, name: str, done: int, total: int) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def notice(self, text: str) -> None:
        pass

    def warning(self, text: str, *, lead: str = "") -> None:
        pass

    def scoped(self, prefix: str) -> Reporter:
        return self


SILENT: Reporter = _Silent()


@dataclass(frozen=True)
class Recorder:
    """The events as plain lines in :attr:`lines` (stage headers, steps with their prefix, messages,
    notices, warnings with their lead); byte counts of a transfer are not lines."""

    lines: list[str] = field(default_factory=list)
    prefix: str = ""

    def stage_started(self, index: int, total: int, name: str, what: str) -> None:
        self.lines.append(f"[{index}/{total}] {name}: {what}")

    def stage_finished(self, name: str, seconds: float) -> None:
        pass

    def step(self, text: str) -> None:
        self.lines.append(self.prefix + text)

    def download(self, name: str, index: int, total: int) -> None:
        self.step(f"wheel {name}")

    def transfer(self, name: str, done: int, total: int) -> None:
        pass

    def message(self, text: str) -> None:
        self.lines.append(text)

    def notice(self, text: str) -> None:
        self.lines.append(text)

    def warning(self, text: str, *, lead: str = "") -> None:
        self.lines.append(lead + text)

    def scoped(self, prefix: str) -> Reporter:
        return replace(self, prefix=self.prefix + prefix)


@dataclass(frozen=True)
class PlainReporter:
    """Plain lines on ``stream`` (default: stderr at the time of each event): no markup, no colour."""

    stream: TextIO | None = None
    prefix: str = ""
    notices: bool = True  # False: the notices are in the --json document only
    steps: bool = True  # False: no step or download lines (what only a terminal shows)

    def _line(self, text: str) -> None:
        out = self.stream if self.stream is not None else sys.stderr
        out.write(text + "\n")
        out.flush()

    def stage_started(self, index: int, total: int, name: str, what: str) -> None:
        self._line(f"[{index}/{total}] {name}: {what}")

    def stage_finished(self, name: str, seconds: float) -> None:
        pass  # the seconds are in the stage's result and the summary

    def step(self, text: str) -> None:
        if self.steps:
            self._line(self.prefix + text)

    def download(self, name: str, index: int, total: int) -> None:
        self.step(f"wheel {name}")

    def transfer(self, name: str, done: int, total: int) -> None:
        pass  # no bar in a log: the file's name is in the step that asked for it

    def message(self, text: str) -> None:
        self._line(text)

    def notice(self, text: str) -> None:
        if self.notices:
            self._line(text)

    def warning(self, text: str, *, lead: str = "") -> None:
        self._line(lead + text)

    def scoped(self, prefix: str) -> Reporter:
        return replace(self, prefix=self.prefix + prefix)


@dataclass(frozen=True)
class RichReporter:
    """A rich console (a terminal): bold stage headers, a yellow lead on a warning; with ``status``
    (a ``console.status`` spinner the command shows) steps and downloads update it in place."""

    console: Console
    prefix: str = ""
    status: Status | None = field(default=None)
    notices: bool = True
    log: bool = False  # steps and messages as timestamped log lines (console.log)
    bars: _Bars = field(default_factory=lambda: _Bars())  # shared by the scoped copies

    def stage_started(self, index: int, total: int, name: str, what: str) -> None:
        from rich.markup import escape

        self.console.print(f"[bold][{index}/{total}] {escape(name)}[/bold]: {escape(what)}", highlight=False)

    def stage_finished(self, name: str, seconds: float) -> None:
        pass  # the seconds are in the stage's result and the summary

    def step(self, text: str) -> None:
        if self.status is not None:
            self.status.update(self.prefix + text)
        else:
            self._print(self.prefix + text)

    def _print(self, text: str) -> None:
        if self.log:
            self.console.log(text, markup=False, highlight=False)
        else:
            self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def download(self, name: str, index: int, total: int) -> None:
        self.step(f"wheel {name}")

    def transfer(self, name: str, done: int, total: int) -> None:
        self.bars.update(self.console, name, done, total)

    def message(self, text: str) -> None:
        self._print(text)

    def notice(self, text: str) -> None:
        if self.notices:
            self.message(text)

    def warning(self, text: str, *, lead: str = "") -> None:
        from rich.markup import escape

        head = f"[yellow]{escape(lead)}[/yellow]" if lead else ""
        self.console.print(head + escape(text), highlight=False, soft_wrap=True)

    def scoped(self, prefix: str) -> Reporter:
        return replace(self, prefix=self.prefix + prefix)


@dataclass
class _Bars:
    """The transient download bars of a rich reporter: one bar a file, gone when it ends."""

    progress: Progress | None = None
    tasks: dict[str, TaskID] = field(default_factory=dict)

    def update(self, console: Console, name: str, done: int, total: int) -> None:
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

        if self.progress is None:
            self.progress = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            )
            self.progress.start()
        task = self.tasks.get(name)
        if task is None:
            task = self.tasks[name] = self.progress.add_task(name, total=total)
        self.progress.update(task, completed=done)
        if done >= total:
            self.progress.remove_task(task)
            del self.tasks[name]
            if not self.tasks:
                self.progress.stop()
                self.progress = None


def stderr_reporter() -> Reporter:
    """:func:`reporter_for` a console on stderr (a download's bar where no command handed a reporter on)."""
    from rich.console import Console

    return reporter_for(Console(file=sys.stderr))


def reporter_for(console: Console, *, as_json: bool = False) -> Reporter:
    """The reporter a command shows progress with: rich on a terminal, plain otherwise (a pipe, a CI
    log) and always with ``--json`` (stdout holds the document; stderr stays plain words)."""
    if not as_json and getattr(console, "is_terminal", False):
        return RichReporter(console)
    return PlainReporter(getattr(console, "file", None))
