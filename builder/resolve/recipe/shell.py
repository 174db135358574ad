"""The shell reader: words (quotes, ``$V``/``${V…}``, ``$(…)``) and the command tree of a RUN script
(``;``, ``&&``, ``||``, pipes, ``( )``, ``if``, ``case``) (pure)."""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from builder.resolve import sedit
from builder.resolve.recipe.model import Where


# --------------------------------------------------------------------------- variables
@dataclass
class Var:
    value: str
    where: tuple[Where, ...]
    env: bool = False  # an ENV (inherited by the stages built FROM this one), not an ARG
    default: str | None = None  # a global ARG's default text (its provenance follows the ARGs it uses)


class Unknown(Exception):
    """A value the files do not determine."""


# ``$(cmd)``: a pipeline over known values.  Its first command makes the text (SOURCES), each later one
# filters it (FILTERS); anything else is Unknown.  The one non-text form is the installed version of a
# distribution, which only the image knows: it becomes the {installed:NAME} mark a step carries.
_INSTALLED_CMD = re.compile(
    r"""^python3 -c "import importlib\.metadata as m; """
    r"""print\(m\.version\('([\w.-]+)'\)\)"( 2>/dev/null)?( \|\| true)?$"""
)
# ``uv pip show --system NAME | awk '/^Version:/{print $2}'``: the same installed version, as uv reports it
_INSTALLED_SHOW = re.compile(
    r"""^uv pip show --system ([\w.-]+)( 2>/dev/null)? \| awk '/\^Version:/\{print \$2\}'( \|\| true)?$"""
)
INSTALLED = "{{installed:{}}}"
INSTALLED_RE = re.compile(r"\{installed:([\w.-]+)\}")


def _fields(spec: str) -> list[tuple[int, int | None]]:
    """cut's field list (``1``, ``1,2``, ``2-``, ``1-3``) as 1-based (start, end) ranges (pure)."""
    out = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)?(-)?(\d+)?", part)
        if not m or not (m.group(1) or m.group(3)):
            raise Unknown(f"cut -f{spec}")
        a = int(m.group(1) or 1)
        b = int(m.group(3)) if m.group(3) else (None if m.group(2) else a)
        out.append((a, b))
    return out


def _cut(text: str, args: list[str]) -> str:
    delim, fields = "\t", None
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-d"):
            delim = a[2:] if len(a) > 2 else args[i + 1]
            i += 1 if len(a) > 2 else 2
        elif a.startswith("-f"):
            fields = _fields(a[2:] if len(a) > 2 else args[i + 1])
            i += 1 if len(a) > 2 else 2
        else:
            raise Unknown(f"cut {' '.join(args)}")
    if fields is None or len(delim) != 1:
        raise Unknown(f"cut {' '.join(args)}")
    lines = []
    for line in text.split("\n"):
        parts = line.split(delim)
        if len(parts) == 1:
            lines.append(line)
            continue
        keep = [p for n, p in enumerate(parts, 1) if any(a <= n and (b is None or n <= b) for a, b in fields)]
        lines.append(delim.join(keep))
    return "\n".join(lines)


def _tr_set(s: str) -> str:
    if re.search(r"\[:|\\|.-.", s.replace("\\.", "")):
        raise Unknown(f"tr set {s!r}")
    return s.replace("\\.", ".")


def _tr(text: str, args: list[str]) -> str:
    if len(args) == 2 and args[0] == "-d":
        gone = set(_tr_set(args[1]))
        return "".join(c for c in text if c not in gone)
    if len(args) == 2 and not args[0].startswith("-"):
        a, b = _tr_set(args[0]), _tr_set(args[1])
        if not b:
            raise Unknown(f"tr {args[0]} {args[1]}")
        b = b + b[-1] * max(0, len(a) - len(b))
        return text.translate(str.maketrans(a, b[: len(a)]))
    raise Unknown(f"tr {' '.join(args)}")


def _echo(args: list[str]) -> str:
    if args and args[0] in ("-n", "-e", "-E"):
        raise Unknown(f"echo {args[0]}")
    return " ".join(args)


def _sed(text: str, args: list[str]) -> str:
    """``sed [-E] SCRIPT`` (no file, no -i) over the text, by :mod:`builder.resolve.sedit`."""
    ere = bool(args) and args[0] in ("-E", "-r")
    rest = args[1:] if ere else args
    if len(rest) != 1 or rest[0].startswith("-"):
        raise Unknown(f"sed {' '.join(args)}")
    try:
        cmds = sedit.parse(rest[0], ere=ere)
    except sedit.SedUnknown as exc:
        raise Unknown(f"sed {rest[0]!r}: {exc}") from None
    return sedit.apply(text, cmds)


# the commands a ``$(...)`` may run: a source makes text from its arguments, a filter transforms it
SOURCES: dict[str, Callable[[list[str]], str]] = {"echo": _echo}
FILTERS: dict[str, Callable[[str, list[str]], str]] = {"cut": _cut, "tr": _tr, "sed": _sed}


def substitute(cmd: str, get: Callable[[str], str]) -> str:
    """The value of one ``$(cmd)`` (pure): a pipeline whose first command is one of :data:`SOURCES` and
    whose others are :data:`FILTERS`, over known values; anything else raises :class:`Unknown`."""
    flat = " ".join(cmd.split())
    m = _INSTALLED_CMD.match(flat) or _INSTALLED_SHOW.match(flat)
    if m:
        return INSTALLED.format(m.group(1))
    try:
        tree = parse_script(cmd)
    except (Unknown, ValueError, IndexError):
        raise Unknown(f"$({flat})") from None
    node = tree.items[0] if len(tree.items) == 1 else None
    if isinstance(node, AndOr) and not node.rest:
        node = node.first
    cmds = node.cmds if isinstance(node, Pipe) else [node]
    if not cmds or not all(isinstance(c, Cmd) and c.words and not c.redirects for c in cmds):
        raise Unknown(f"$({flat})")
    argvs = [[w for raw in c.words for w in expand(raw, get)] for c in cmds]
    if argvs[0][0] not in SOURCES or any(a[0] not in FILTERS for a in argvs[1:]):
        raise Unknown(f"$({flat})")
    text = SOURCES[argvs[0][0]](argvs[0][1:])
    for a in argvs[1:]:
        text = FILTERS[a[0]](text, a[1:])
    return text.rstrip("\n")


def expand(raw: str, get: Callable[[str], str], *, split: bool = True) -> list[str]:
    """Shell expansion of one word (quotes, ``$V``, ``${V}``, ``${V:-d}``, ``${V:+a}``, ``${V%%p}``,
    ``${V%p}``, ``$(...)``); unquoted expansions are split on blanks (pure)."""
    words: list[str] = []
    cur: list[str] = []
    have = False
    i, n = 0, len(raw)

    def push_unquoted(s: str):
        nonlocal have
        if not split:
            cur.append(s)
            return
        parts = re.split(r"[ \t\n]+", s)
        for j, p in enumerate(parts):
            if j > 0:
                if cur or have:
                    words.append("".join(cur))
                cur.clear()
                have = False
            cur.append(p)

    while i < n:
        c = raw[i]
        if c == "'":
            j = raw.index("'", i + 1)
            cur.append(raw[i + 1 : j])
            have = True
            i = j + 1
        elif c == '"':
            j = i + 1
            buf = []
            while raw[j] != '"':
                if raw[j] == "\\" and raw[j + 1] in '"$`\\':
                    buf.append(raw[j + 1])
                    j += 2
                elif raw[j] == "$":
                    val, j = _dollar(raw, j, get)
                    buf.append(val)
                else:
                    buf.append(raw[j])
                    j += 1
            cur.append("".join(buf))
            have = True
            i = j + 1
        elif c == "\\" and i + 1 < n:
            cur.append(raw[i + 1])
            i += 2
        elif c == "$":
            val, i = _dollar(raw, i, get)
            push_unquoted(val)
        else:
            cur.append(c)
            i += 1
    if cur or have:
        words.append("".join(cur))
    return [w for w in words if w != "" or have]


def _dollar(raw: str, i: int, get: Callable[[str], str]) -> tuple[str, int]:
    if raw.startswith("$(", i):
        j = _close(raw, i + 1)
        return substitute(raw[i + 2 : j], get), j + 1
    if raw.startswith("${", i):
        j = raw.index("}", i)
        body = raw[i + 2 : j]
        m = re.fullmatch(r"(\w+)(?:(:-|:\+|%%|%|-|,,|\^\^)(.*))?", body)
        if not m:
            raise Unknown("${" + body + "}")
        name, op, arg = m.group(1), m.group(2), m.group(3) or ""
        try:
            val = get(name)
        except Unknown:
            if op in (":-", "-"):
                return arg, j + 1
            raise
        if op == ":-":
            val = val or arg
        elif op == ":+":
            val = arg if val else ""
        elif op in (",,", "^^"):
            if arg:
                raise Unknown("${" + body + "}")
            val = val.lower() if op == ",," else val.upper()
        elif op in ("%%", "%"):
            pat = re.escape(arg).replace(r"\*", ".*" if op == "%%" else ".*?")
            m2 = re.match(r"^(.*?)" + pat + r"$", val) if op == "%%" else re.match(r"^(.*)" + pat + r"$", val)
            val = m2.group(1) if m2 else val
        return val, j + 1
    m = re.match(r"\$(\w+)", raw[i:])
    if m:
        return get(m.group(1)), i + len(m.group(0))
    return "$", i + 1


def _close(s: str, i: int) -> int:
    """Index of the ``)`` closing the ``(`` at ``i`` (quotes respected)."""
    depth, j, q = 0, i, None
    while j < len(s):
        c = s[j]
        if q:
            if c == q:
                q = None
        elif c in "'\"":
            q = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j
        j += 1
    raise Unknown("unbalanced $(")


# --------------------------------------------------------------------------- shell reader
_OPS = (
    "&&",
    "||",
    ";;",
    "2>&1",
    "1>&2",
    ">&2",
    "2>/dev/null",
    "&>",
    ">>",
    "2>",
    ";",
    "|",
    "(",
    ")",
    ">",
    "<",
    "&",
)
#: the redirections that only join or silence output streams (no file is named)
STREAM_JOINS = ("2>&1", "1>&2", ">&2", "2>/dev/null")
#: how deep ``if``/``( )``/``case`` may nest in one script: deeper text is refused, never followed to
#: Python's recursion limit
MAX_NESTING = 40
_KEYWORDS = {"if", "then", "elif", "else", "fi", "for", "while", "do", "done", "case", "esac", "{", "}", "!"}


def tokenize(script: str) -> list[str]:
    """Raw shell words and operators (quotes kept, for :func:`expand`); newlines are ``;`` (pure)."""
    return tokenize_lines(script)[0]


def tokenize_lines(script: str) -> tuple[list[str], list[int]]:
    """:func:`tokenize`'s tokens and the 1-based line each starts on (pure)."""
    toks: list[str] = []
    lines: list[int] = []
    i, n = 0, len(script)
    cur: list[str] = []
    start = [1]

    breaks = [k for k, ch in enumerate(script) if ch == "\n"]

    def line_at(k: int) -> int:
        return bisect.bisect_left(breaks, k) + 1

    def flush():
        if cur:
            toks.append("".join(cur))
            lines.append(start[0])
            cur.clear()

    while i < n:
        c = script[i]
        if c in " \t":
            flush()
            i += 1
            continue
        if not cur:
            start[0] = line_at(i)
        if c == "\n":
            flush()
            toks.append(";")
            lines.append(start[0])
            i += 1
            continue
        if c == "\\" and i + 1 < n:
            if script[i + 1] == "\n":
                i += 2
                continue
            cur.append(script[i : i + 2])
            i += 2
            continue
        if c == "'":
            j = script.index("'", i + 1)
            cur.append(script[i : j + 1])
            i = j + 1
            continue
        if c == '"':
            j = i + 1
            while script[j] != '"':
                j += 2 if script[j] == "\\" else 1
            cur.append(script[i : j + 1])
            i = j + 1
            continue
        if script.startswith("$(", i):
            j = _close(script, i + 1)
            cur.append(script[i : j + 1])
            i = j + 1
            continue
        if script.startswith("${", i):
            j = script.index("}", i)
            cur.append(script[i : j + 1])
            i = j + 1
            continue
        if c == "#" and not cur:
            while i < n and script[i] != "\n":
                i += 1
            continue
        op = next((o for o in _OPS if script.startswith(o, i)), None)
        if op and not (op in ("2>", "2>&1", "2>/dev/null", "1>&2") and cur):
            flush()
            toks.append(op)
            lines.append(line_at(i))
            i += len(op)
            continue
        cur.append(c)
        i += 1
    flush()
    return toks, lines


@dataclass
class Cmd:
    words: list[str]
    redirects: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Pipe:
    cmds: list[Cmd]


@dataclass
class AndOr:
    first: object
    rest: list[tuple[str, object]]


@dataclass
class Seq:
    items: list[object]


@dataclass
class If:
    branches: list[tuple[object, object]]  # (condition, body)
    otherwise: object | None


@dataclass
class Case:
    word: str
    arms: list[tuple[list[str], object]]  # (patterns, body)


@dataclass
class Group:
    body: object


@dataclass
class Opaque:
    """A compound command the reader does not interpret (for/while/case): allowed only when it installs nothing."""

    text: str


class _Parser:
    def __init__(self, toks: list[str]):
        self.t = toks
        self.i = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise Unknown(
                f"expected {repr(want) if want else 'a word'}, found "
                f"{repr(tok) if tok is not None else 'the end of the script'}"
            )
        self.i += 1
        return tok

    def seq(self, stop: tuple[str, ...] = ()) -> Seq:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise Unknown(f"commands nested more than {MAX_NESTING} deep (if, ( ), case)")
        items = []
        while True:
            while self.peek() == ";":
                self.i += 1
            tok = self.peek()
            if tok is None or tok in stop:
                self.depth -= 1
                return Seq(items)
            items.append(self.andor(stop))
            if self.peek() in (";", "&"):
                self.i += 1

    def andor(self, stop) -> AndOr:
        first = self.pipe(stop)
        rest = []
        while self.peek() in ("&&", "||"):
            op = self.take()
            while self.peek() == ";":
                self.i += 1
            rest.append((op, self.pipe(stop)))
        return AndOr(first, rest)

    def pipe(self, stop):
        node = self.unit(stop)
        if self.peek() == "|":
            cmds = [node]
            while self.peek() == "|":
                self.take()
                cmds.append(self.unit(stop))
            return Pipe(cmds)
        return node

    def unit(self, stop):
        tok = self.peek()
        if tok == "if":
            self.take()
            branches = []
            cond = self.seq(("then",))
            self.take("then")
            body = self.seq(("elif", "else", "fi"))
            branches.append((cond, body))
            otherwise = None
            while self.peek() == "elif":
                self.take()
                cond = self.seq(("then",))
                self.take("then")
                branches.append((cond, self.seq(("elif", "else", "fi"))))
            if self.peek() == "else":
                self.take()
                otherwise = self.seq(("fi",))
            self.take("fi")
            return If(branches, otherwise)
        if tok == "(":
            self.take()
            body = self.seq((")",))
            self.take(")")
            return Group(body)
        if tok == "case":
            return self.case()
        if tok in ("for", "while", "{"):
            end = {"for": "done", "while": "done", "{": "}"}[tok]
            depth, start = 0, self.i
            while self.i < len(self.t):
                x = self.t[self.i]
                if x == tok:
                    depth += 1
                elif x == end:
                    depth -= 1
                    if depth == 0:
                        break
                self.i += 1
            self.take(end)
            return Opaque(" ".join(self.t[start : self.i]))
        words, redirects = [], []
        while True:
            tok = self.peek()
            if tok is None or tok in ("&&", "||", ";", ";;", "|", ")", "&") or tok in stop and not words:
                break
            if tok in (">", ">>", "<", "2>", "&>"):
                self.take()
                redirects.append((tok, self.take()))
                continue
            if tok in STREAM_JOINS:
                self.take()
                continue
            if tok in ("then", "fi", "else", "elif", "do", "done") and not words:
                break
            words.append(self.take())
        if not words and not redirects:  # nothing was read: a stray ')', 'fi', 'then' ... (never loop on it)
            raise Unknown(f"unexpected {self.peek()!r}" if self.peek() is not None else "a command missing at the end")
        return Cmd(words, redirects)

    def case(self) -> Case:
        self.take("case")
        word = self.take()
        self.take("in")
        arms: list[tuple[list[str], object]] = []
        while True:
            while self.peek() == ";":
                self.i += 1
            if self.peek() == "esac":
                self.take()
                return Case(word, arms)
            if self.peek() == "(":
                self.take()
            pats = [self.take()]
            while self.peek() == "|":
                self.take()
                pats.append(self.take())
            self.take(")")
            body = self.seq((";;", "esac"))
            if self.peek() == ";;":
                self.take()
            arms.append((pats, body))


def parse_script(script: str) -> Seq:
    p = _Parser(tokenize(script))
    seq = p.seq()
    if p.peek() is not None:
        raise Unknown(f"unexpected {p.peek()!r}")
    return seq
