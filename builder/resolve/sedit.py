"""The ``sed -i`` subset release Dockerfiles use to edit a copied requirements file before installing it
(``s/^nvidia-cutlass-dsl\\[cu13\\]/nvidia-cutlass-dsl/``, ``/^[[:space:]]*(torch|torchvision)[[:space:]]*==/Id``):
parsed once by the recipe reader (a form outside the subset is :class:`Unknown`, so the recipe never records
an edit the replay cannot make) and applied by the replay to the file the step reads (pure).

The subset: one or more commands separated by ``;`` or newlines, each ``s<d>RE<d>REPLACEMENT<d>[g][I][N]``
or ``[/RE/[I]]d``, with an optional ``/RE/[I]`` address before ``s``.  RE is POSIX basic (``sed``) or
extended (``sed -E``/``-r``) syntax with the bracket classes ``[:space:]``, ``[:alpha:]``, ``[:digit:]``,
``[:alnum:]``, ``[:upper:]``, ``[:lower:]`` and ``[:blank:]``; the replacement knows ``&`` and ``\\1``–``\\9``.
A hand-written reader: no maintained Python package implements sed's semantics (``python-sed`` is an
unmaintained GPL script), and the subset above is what the release files need.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class SedUnknown(ValueError):
    """A sed script outside the subset."""


_CLASSES = {
    "space": r" \t\n\r\f\v",
    "blank": r" \t",
    "alpha": "a-zA-Z",
    "digit": "0-9",
    "alnum": "a-zA-Z0-9",
    "upper": "A-Z",
    "lower": "a-z",
}


@dataclass(frozen=True)
class SedCommand:
    op: str  # "s" | "d"
    address: re.Pattern | None
    pattern: re.Pattern | None = None
    replacement: str = ""
    count: int = 1  # 0: every match on the line (g)


def _regex(src: str, ere: bool, icase: bool) -> re.Pattern:
    out: list[str] = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if c == "[":
            j = i + 1
            if j < n and src[j] == "^":
                j += 1
            if j < n and src[j] == "]":
                j += 1
            body: list[str] = []
            start = j
            while j < n and src[j] != "]":
                m = re.match(r"\[:(\w+):\]", src[j:])
                if m:
                    if m.group(1) not in _CLASSES:
                        raise SedUnknown(f"bracket class [:{m.group(1)}:]")
                    body.append(_CLASSES[m.group(1)])
                    j += m.end()
                    continue
                if src[j] in "\\[":
                    body.append("\\" + src[j])
                else:
                    body.append(src[j])
                j += 1
            if j >= n:
                raise SedUnknown(f"an unclosed bracket in {src!r}")
            neg = "^" if src[i + 1 : i + 2] == "^" else ""
            lead = src[i + 1 + len(neg) : start]
            out.append("[" + neg + ("\\]" if lead == "]" else "") + "".join(body) + "]")
            i = j + 1
            continue
        if c == "\\" and i + 1 < n:
            d = src[i + 1]
            if not ere and d in "(){}|+?":
                out.append(d)  # BRE: \( \) \{ \} \| \+ \? are the operators
            elif d.isdigit():
                out.append("\\" + d)
            elif d in "nt":
                out.append("\\" + d)
            elif d.isalnum():
                raise SedUnknown(f"the escape \\{d}")
            else:
                out.append(re.escape(d))
            i += 2
            continue
        if not ere and c in "(){}|+?":
            out.append("\\" + c)  # BRE: literal
        else:
            out.append(c)
        i += 1
    try:
        return re.compile("".join(out), re.IGNORECASE if icase else 0)
    except re.error as exc:
        raise SedUnknown(f"the expression {src!r} ({exc})") from None


def _split(script: str, i: int, delim: str) -> tuple[str, int]:
    """The text up to the next unescaped ``delim`` from ``i`` and the index after it."""
    buf: list[str] = []
    while i < len(script):
        c = script[i]
        if c == "\\" and i + 1 < len(script):
            buf.append(script[i + 1] if script[i + 1] == delim else script[i : i + 2])
            i += 2
            continue
        if c == delim:
            return "".join(buf), i + 1
        buf.append(c)
        i += 1
    raise SedUnknown(f"an unterminated expression in {script!r}")


def _replacement(rep: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(rep):
        c = rep[i]
        if c == "\\" and i + 1 < len(rep):
            d = rep[i + 1]
            out.append("\\g<" + d + ">" if d.isdigit() else ("&" if d == "&" else d.replace("\\", "\\\\")))
            i += 2
            continue
        out.append("\\g<0>" if c == "&" else c.replace("\\", "\\\\"))
        i += 1
    return "".join(out)


def parse(script: str, *, ere: bool = False) -> tuple[SedCommand, ...]:
    """The commands of a sed script (pure); :class:`SedUnknown` for anything outside the subset."""
    cmds: list[SedCommand] = []
    i, n = 0, len(script)
    while i < n:
        while i < n and script[i] in " \t\n;":
            i += 1
        if i >= n:
            break
        address = None
        if script[i] == "/":
            src, i = _split(script, i + 1, "/")
            icase = i < n and script[i] == "I"
            i += 1 if icase else 0
            address = _regex(src, ere, icase)
        if i >= n:
            raise SedUnknown(f"an address without a command in {script!r}")
        op = script[i]
        if op == "d":
            cmds.append(SedCommand("d", address))
            i += 1
        elif op == "s" and i + 1 < n:
            delim = script[i + 1]
            if delim.isalnum() or delim in "\\\n ":
                raise SedUnknown(f"the s delimiter {delim!r}")
            src, i = _split(script, i + 2, delim)
            rep, i = _split(script, i, delim)
            flags = re.match(r"[gIi\d]*", script[i:]).group(0)
            i += len(flags)
            if re.search(r"\d", flags):
                raise SedUnknown(f"the s flag {flags!r}")
            cmds.append(
                SedCommand(
                    "s",
                    address,
                    _regex(src, ere, "I" in flags or "i" in flags),
                    _replacement(rep),
                    0 if "g" in flags else 1,
                )
            )
        else:
            raise SedUnknown(f"the sed command {script[i : i + 12]!r}")
        if i < n and script[i] not in " \t\n;":
            raise SedUnknown(f"text after a command in {script!r}")
    if not cmds:
        raise SedUnknown("an empty sed script")
    return tuple(cmds)


def apply(text: str, commands: tuple[SedCommand, ...]) -> str:
    """``text`` after the commands, line by line as sed runs them (pure)."""
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        body, nl = (line[:-1], "\n") if line.endswith("\n") else (line, "")
        deleted = False
        for c in commands:
            if c.address is not None and not c.address.search(body):
                continue
            if c.op == "d":
                deleted = True
                break
            body = c.pattern.sub(c.replacement, body, count=c.count)
        if not deleted:
            out.append(body + nl)
    return "".join(out)
