"""Rendering helpers shared by the verdict commands (diff, lock, plan, smoke).

A command builds a :class:`Document` (pure data: a title, a status, a few top
lines and a list of :class:`Section` tables) and hands it to one of the
renderers:

* :func:`render_text`  -- terminal text; coloured through ``rich`` only when
  ``color=True`` (the caller decides with :func:`use_color`), plain otherwise,
  so piping or CI logs never get escape codes and never pay for importing rich;
* :func:`render_markdown` -- GitHub-flavoured markdown for a PR comment: a
  summary line, a table per non-empty section, folded sections in
  ``<details>``;
* :func:`render_json` -- stable JSON (fixed key order, two-space indent, a
  trailing newline) for any JSON-able object.

Nothing here knows about locks: the vocabulary is "document / section / row".
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from builder.credentials import redact_text, redact_value

# Section styles, most severe first.  They select the colour in text output and
# the marker in markdown.
STYLES = ("danger", "warn", "notice", "info", "dim")
_RICH_STYLE = {"danger": "bold red", "warn": "yellow", "notice": "magenta", "info": "cyan", "dim": "dim"}
_MD_MARK = {"danger": "🛑", "warn": "⚠️", "notice": "🔶", "info": "ℹ️", "dim": "·"}
_STATUS_MARK = {"fail": "🛑", "warn": "⚠️", "ok": "✅"}
_TEXT_STATUS = {"fail": "FAIL", "warn": "REVIEW", "ok": "OK"}


@dataclass
class Section:
    """One titled table.  ``rows`` are lists of cell strings, one per column.

    ``line`` replaces the table with a single line of text (used for collapsed
    content such as "noise").  ``folded`` asks markdown to put the table inside
    ``<details>``.  ``max_rows`` caps markdown tables (a PR comment has a size
    limit); text output always shows every row.
    """

    title: str
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    style: str = "info"
    count: int | None = None
    line: str | None = None
    folded: bool = False
    max_rows: int = 150

    @property
    def n(self) -> int:
        return self.count if self.count is not None else len(self.rows)


@dataclass
class Document:
    """A report: ``title`` (one line), ``status`` (ok | warn | fail), ``summary``
    (one sentence), ``top`` (bullet lines shown before the sections), sections,
    and ``notes`` (footnotes: provenance, caveats)."""

    title: str
    status: str = "ok"
    summary: str = ""
    top: list[str] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def use_color(stream: TextIO | None = None, force: bool | None = None) -> bool:
    """Colour when writing to a terminal, unless ``NO_COLOR`` is set
    (https://no-color.org); ``force`` overrides (``--color/--no-color``)."""
    if force is not None:
        return force
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):
        return False


# --------------------------------------------------------------------- text


def _align(columns: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns; the last column is never padded (it may be long)."""
    if not rows:
        return []
    ncol = max(len(r) for r in rows)
    widths = [0] * ncol
    for r in rows:
        for i, cell in enumerate(r[:-1]):
            widths[i] = max(widths[i], len(cell))
    out = []
    for r in rows:
        cells = [c.ljust(widths[i]) if i < len(r) - 1 else c for i, c in enumerate(r)]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def render_text(doc: Document, color: bool = False, width: int | None = None) -> str:
    """Plain text (``color=False``) or rich-coloured text for a terminal."""
    if color:
        return _render_rich(doc, width)
    lines = [f"{doc.title}", f"  {_TEXT_STATUS.get(doc.status, doc.status.upper())}: {doc.summary}"]
    lines += [f"  {t}" for t in doc.top]
    for s in doc.sections:
        head = f"{s.title} ({s.n})" if s.line is None else f"{s.title}: {s.line}"
        lines.append(head)
        if s.line is None:
            lines += _align(s.columns, s.rows)
    lines += [f"  note: {n}" for n in doc.notes]
    return "\n".join(lines) + "\n"


def _render_rich(doc: Document, width: int | None) -> str:
    from io import StringIO

    from rich.console import Console
    from rich.markup import escape

    buf = StringIO()
    con = Console(file=buf, force_terminal=True, width=width or 160, highlight=False, soft_wrap=True)
    status_style = {"fail": "bold red", "warn": "yellow", "ok": "green"}.get(doc.status, "")
    con.print(f"[bold]{escape(doc.title)}[/]")
    con.print(f"  [{status_style}]{_TEXT_STATUS.get(doc.status, doc.status.upper())}[/]: {escape(doc.summary)}")
    for t in doc.top:
        con.print(f"  [bold]{escape(t)}[/]")
    for s in doc.sections:
        st = _RICH_STYLE.get(s.style, "")
        if s.line is not None:
            con.print(f"[{st}]{escape(s.title)}[/]: [dim]{escape(s.line)}[/]")
            continue
        con.print(f"[{st}]{escape(s.title)} ({s.n})[/]")
        row_style = "red" if s.style == "danger" else ""
        for ln in _align(s.columns, s.rows):
            con.print(f"[{row_style}]{escape(ln)}[/]" if row_style else escape(ln))
    for n in doc.notes:
        con.print(f"  [dim]note: {escape(n)}[/]")
    return buf.getvalue()


# ----------------------------------------------------------------- markdown


def md_escape(cell: str) -> str:
    """Escape a table cell: pipes, newlines, and HTML-ish angle brackets."""
    return (
        cell.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", "<br>")
    )


def md_table(columns: list[str], rows: list[list[str]], max_rows: int | None = None) -> str:
    shown = rows if max_rows is None else rows[:max_rows]
    out = ["| " + " | ".join(md_escape(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    for r in shown:
        cells = list(r) + [""] * (len(columns) - len(r))
        out.append("| " + " | ".join(md_escape(c) for c in cells) + " |")
    if max_rows is not None and len(rows) > max_rows:
        out.append(f"\n… {len(rows) - max_rows} more rows (run the command locally for all of them)")
    return "\n".join(out)


def render_markdown(doc: Document, heading_level: int = 3) -> str:
    h = "#" * heading_level
    out = [f"{h} {_STATUS_MARK.get(doc.status, '')} {md_escape(doc.title)}".replace("  ", " "), ""]
    out.append(f"**{_TEXT_STATUS.get(doc.status, doc.status.upper())}**: {md_escape(doc.summary)}")
    out.append("")
    if doc.top:
        out += [f"- **{md_escape(t)}**" for t in doc.top]
        out.append("")
    for s in doc.sections:
        mark = _MD_MARK.get(s.style, "")
        if s.line is not None:
            out.append(f"{mark} **{md_escape(s.title)}**: {md_escape(s.line)}")
            out.append("")
            continue
        title = f"{mark} {md_escape(s.title)} ({s.n})"
        table = md_table(s.columns, s.rows, s.max_rows)
        if s.folded:
            out += ["<details>", f"<summary>{title}</summary>", "", table, "", "</details>", ""]
        else:
            out += [f"**{title}**", "", table, ""]
    if doc.notes:
        out += [f"<sub>{md_escape(n)}</sub>  " for n in doc.notes]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


# --------------------------------------------------------------------- json


def render_json(obj: Any, *, sort_keys: bool = False, ensure_ascii: bool = False, stringify: bool = False) -> str:
    """Stable JSON: insertion-ordered keys (build dicts in schema order, or ``sort_keys``), two-space
    indent, UTF-8 kept readable, trailing newline.

    The one place a JSON document build-image prints (``--json``) or writes as a report is made:
    every string in it, keys included, is redacted first (:func:`builder.credentials.redact_value`:
    userinfo in any URL-like form, token-like query values), so no credential reaches stdout or a
    file whatever command or stage built the document.  ``stringify``: values JSON cannot hold
    (paths, datetimes) become their ``str()``, redacted too."""
    default = (lambda o: redact_text(str(o))) if stringify else None
    return (
        json.dumps(redact_value(obj), indent=2, ensure_ascii=ensure_ascii, sort_keys=sort_keys, default=default) + "\n"
    )


def emit_json(obj: Any, *, sort_keys: bool = False, stringify: bool = False, out: TextIO | None = None) -> None:
    """Print a command's ``--json`` document on stdout through :func:`render_json` (redacted; ASCII, as
    the commands always printed it, so a non-UTF-8 terminal cannot fail on it)."""
    stream = out if out is not None else sys.stdout
    stream.write(render_json(obj, sort_keys=sort_keys, stringify=stringify, ensure_ascii=True))
    stream.flush()


def emit_text(text: str, *, out: TextIO | None = None) -> None:
    """Print a command's result text (a report, a summary) on stdout, redacted like a JSON document:
    a credential in any value the text quotes (a URL, an image reference) never reaches stdout."""
    import click  # click's writer: a misconfigured (ASCII) stdout is rewrapped, not an encoding error

    # color=True: escapes the caller chose (diff --color) are kept, never stripped
    click.echo(redact_text(text), nl=False, file=out, color=True)
