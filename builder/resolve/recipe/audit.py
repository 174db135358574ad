"""What the recipe reader concluded of each RUN line of the target's stage chain (``base recipe --audit``):
installs …, harmless because …, accepted undecided, refused (pure data and text)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from builder.errors import BadInput
from builder.resolve.recipe.harmless import Row
from builder.resolve.recipe.model import Derived, Step, Where


@dataclass(frozen=True)
class AuditRow:
    """One RUN line: where, its text, the conclusion, and the rows of every command read on the way (the
    scripts, ``sh -c`` strings and heredocs it runs, line by line where the lexical reader read them)."""

    where: Where
    text: str
    conclusion: str
    commands: tuple[Row, ...] = ()

    def to_json(self) -> dict:
        return {
            "from": str(self.where),
            "run": " ".join(self.text.split())[:400],
            "conclusion": self.conclusion,
            "commands": [{"from": r.where, "command": r.command, "conclusion": r.conclusion} for r in self.commands],
        }


_INSTALL_TEXT = re.compile(
    r"(?:\buv\s+pip|\bpython[\d.]*\s+-m\s+pip|\bpip[\d.]*)\s+(?:install|uninstall)\b[^;&|\n)]*|"
    r"\bflashinfer\s+download-\w+|\bsetup\.py\s+\w+"
)


def install_texts(text: str) -> list[str]:
    """The install commands written in a line's text (and the scripts it runs), as written: what an accepted
    undecided line would have installed, for its note (pure; a listing, not an interpretation)."""
    out: list[str] = []
    for m in _INSTALL_TEXT.finditer(text):
        t = " ".join(m.group(0).replace("\\\n", " ").split())[:200]
        if t not in out:
            out.append(t)
    return out


def step_text(s: Step) -> str:
    """One install step in a few words (pure)."""
    what = ", ".join((*s.requirements, *(f"-r {f}" for f in s.requirement_files), *s.names)) or "?"
    return f"{s.replay} {what}"[:200]


def conclusion(steps: Sequence[Step], fetches: Sequence[Derived], rows: Sequence[Row]) -> str:
    """The conclusion of a RUN line the reader read whole (pure)."""
    parts = [f"installs: {step_text(s)} (step {s.n})" for s in steps]
    parts += [f"fetches: {d.value}" for d in fetches]
    if parts:
        return "; ".join(parts)
    reasons = {r.conclusion for r in rows}
    if not reasons:
        return "harmless: assignments and tests only"
    return "harmless: every command is known not to change site-packages"


_STEP_NO = re.compile(r" \(step \d+\)")


def _key(a: AuditRow, version: str) -> tuple:
    """What makes two RUN lines the same for a reviewer: the line's text (whitespace folded), what the reader
    concluded, and each command read on the way with its conclusion (a script whose text changed changes it);
    the step numbers (a line added earlier renumbers the rest) and the release's own version (the vllm wheel
    each release installs) left out."""

    def norm(text: str) -> str:
        folded = _STEP_NO.sub("", " ".join(text.split()))
        return folded.replace(version, "{release}") if version else folded

    return (norm(a.text), norm(a.conclusion), tuple((norm(r.command), norm(r.conclusion)) for r in a.commands))


def changed_runs(
    a_rows: Sequence[AuditRow], b_rows: Sequence[AuditRow], a_version: str = "", b_version: str = ""
) -> list[AuditRow]:
    """The RUN lines of B's chain that A's chain does not have as they are (new, or changed in their text,
    in what a script they run holds, or in the reader's conclusion), in B's order: the part of a release's
    build a reviewer must read (pure; a line that only moved, or that differs only by the release's own
    version, is not listed)."""
    seen = {_key(a, a_version) for a in a_rows}
    return [b for b in b_rows if _key(b, b_version) not in seen]


def render_audit(rows: Sequence[AuditRow]) -> str:
    """The text of ``base recipe --audit`` (pure)."""
    out = []
    for a in rows:
        out.append(f"{a.where}: {a.conclusion}")
        out.append(f"    RUN {' '.join(a.text.split())[:160]}")
        for r in a.commands:
            out.append(f"      {r.where}: {r.command[:100]}  -> {r.conclusion}")
    return "\n".join(out)


_FILE_LINE = re.compile(r"^[^\s:][^\s]*:[1-9]\d{0,8}$")


def accepted_lines(values: Iterable[str]) -> frozenset[str]:
    """The ``--accept-undecided`` values, each ``FILE:LINE`` as a refusal names it; anything else is
    :class:`BadInput` (exit 2), never ignored (pure)."""
    out = set()
    for v in values:
        if not isinstance(v, str) or not _FILE_LINE.match(v):
            raise BadInput(
                f"--accept-undecided {str(v)[:200]!r} is not FILE:LINE; give the RUN line a refusal names "
                "(e.g. docker/Dockerfile:957)."
            )
        out.add(v)
    return frozenset(out)
