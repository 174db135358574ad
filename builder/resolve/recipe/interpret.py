"""The interpreter: runs a RUN script's command tree over known values and turns what it installs
into :class:`Step` records (pure)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from builder.resolve import sedit
from builder.resolve.recipe.harmless import (
    HEREDOC_PATH,
    MAX_DEPTH,
    MAX_TEXT,
    PIP_QUERIES,
    SITE_PATH,
    Row,
    Scope,
    classify,
    command_substitutions,
    install_kind,
    installer_setting,
    lexical_command,
    lexical_read,
    lift_heredocs,
    python_text_installs,
    python_tree,
    unquote,
)
from builder.resolve.recipe.model import Derived, Step, Where
from builder.resolve.recipe.shell import (
    INSTALLED_RE,
    AndOr,
    Case,
    Cmd,
    Group,
    If,
    Opaque,
    Pipe,
    Seq,
    Unknown,
    Var,
    expand,
    parse_script,
)

# Wheels the image builds from source in another stage: the distributions they install.
SOURCE_BUILDS = {
    "ep_kernels/dist/*.whl": (
        "deep-ep",
        "DeepEP built from git in stage extensions-build (tools/ep_kernels/install_python_libraries.sh)",
    ),
}


# --------------------------------------------------------------------------- interpretation
@dataclass
class ScriptContext:
    vars: dict[str, Var]
    files: dict[str, tuple[str, Where]]  # image path -> content (or a marker), where it was written
    mounts: dict[str, str]  # image path (file or folder) -> sdist path
    binds: dict[str, str]  # image folder -> "stage:/path" (bind mounts from other stages)
    stage: str
    where: Where
    steps: list[Step]
    overrides: tuple[tuple[str, ...], tuple[Where, ...]]
    fetches: list[Derived]
    sdist_files: frozenset = frozenset()
    sdist_text: dict[str, str] = field(default_factory=dict)
    when: str | None = None
    fallback: str | None = None
    # sed edits of a copied file, by image path: (the sed script, -E, where), applied before a step reads it
    edits: dict[str, list[tuple[str, bool, Where]]] = field(default_factory=dict)
    # the build context's scripts: an image path -> (its path in the source, its text), or None
    script: Callable[[str], tuple[str, str] | None] = lambda _p: None
    rows: list[Row] = field(default_factory=list)  # every command classified, for `base recipe --audit`
    at: str = ""  # the text being read (the RUN line, or a script of the source)
    depth: int = 0  # shell texts deep (sh -c, a script run by a script …)

    def scope(self) -> Scope:
        tainted = {k for k, v in self.vars.items() if SITE_PATH.search(v.value)}
        return Scope(tainted, self.script, self.depth)

    def get(self, name: str) -> str:
        if name in self.vars and not self.vars[name].value.startswith(UNDETERMINED):
            return self.vars[name].value
        raise Unknown(f"${name}")

    def assign(self, name: str, raw: str) -> None:
        """``name=raw``: its value where the reader can decide it; else the variable is undetermined (a
        later use that decides an install is Unknown) and the commands its ``$(…)`` runs must be harmless."""
        try:
            self.vars[name] = Var("".join(expand(raw, self.get, split=False)), (self.where,))
        except Unknown:
            for inner in command_substitutions(raw):
                lexical_read(inner, self.at, self.scope(), self.rows)
            self.vars[name] = Var(UNDETERMINED + raw, (self.where,))


_FREEZE = "\x00freeze\x00"
UNDETERMINED = "\x00undetermined:"


def _writes(node) -> bool:
    """Whether a subtree installs, uninstalls or writes a file (a condition on it then matters)."""
    if isinstance(node, Cmd):
        s = " ".join(node.words)
        touches = len(node.words) >= 2 and node.words[0] in ("touch", "sed")
        return (
            bool(re.search(r"\bpip\b", s)) or any(op != "<" and t != "/dev/null" for op, t in node.redirects) or touches
        )
    if isinstance(node, Opaque):
        return bool(re.search(r"\bpip\b", node.text))
    return any(_writes(x) for x in _children(node))


def _children(node) -> list:
    if isinstance(node, Seq):
        return list(node.items)
    if isinstance(node, AndOr):
        return [node.first, *(x for _, x in node.rest)]
    if isinstance(node, Pipe):
        return list(node.cmds)
    if isinstance(node, If):
        return [x for c, b in node.branches for x in (c, b)] + ([node.otherwise] if node.otherwise is not None else [])
    if isinstance(node, Group):
        return [node.body]
    if isinstance(node, Case):
        return [b for _p, b in node.arms]
    return []


def _harmless(node, ctx: ScriptContext) -> bool:
    """Whether every command of a subtree the interpreter does not run is harmless (read lexically:
    :func:`builder.resolve.recipe.harmless.lexical_command`; an install or an unknown command is not)."""
    try:
        _lexical_node(node, ctx)
    except Unknown:
        return False
    return True


def _lexical_node(node, ctx: ScriptContext) -> None:
    if isinstance(node, Cmd):
        if node.words:
            stdin = next((ctx.files.get(t, ("",))[0] for op, t in node.redirects if op == "<"), None)
            lexical_command(node.words, stdin, ctx.at, ctx.scope(), [])
        return
    if isinstance(node, Opaque):
        lexical_read(node.text, ctx.at, ctx.scope(), [])
        return
    for x in _children(node):
        _lexical_node(x, ctx)


def _relevant(node, ctx: ScriptContext | None = None) -> bool:
    """Whether a subtree the interpreter does not run matters: it installs or writes a file, or holds a
    command that is not known harmless."""
    return _writes(node) or (ctx is not None and not _harmless(node, ctx))


def _run_seq(node: Seq, ctx: ScriptContext) -> bool | str:
    status: bool | str = True
    for x in node.items:
        status = run_script(x, ctx)
    return status


def _is_test(node) -> bool:
    return isinstance(node, Cmd) and bool(node.words) and node.words[0] in ("[", "test")


def _run_andor(node: AndOr, ctx: ScriptContext) -> bool | str:
    try:
        status = run_script(node.first, ctx)
    except Unknown as exc:
        if _is_test(node.first) and not any(_relevant(x, ctx) for _, x in node.rest):
            return True  # a test that decides nothing the reader must know
        if _is_test(node.first):
            raise Unknown(f"the test {_describe(node.first)!r} ({exc})") from None
        raise
    for op, x in node.rest:
        if op == "&&":
            if status is False:
                continue
            if isinstance(status, str):
                outer = ctx.when
                ctx.when = status.split(":", 1)[1]
                status2 = run_script(x, ctx)
                ctx.when = outer
                status = status2 if status2 is not True else status
                continue
            status = run_script(x, ctx)
        else:  # || : the left side is taken; the right side is the documented fallback
            if status is False:
                status = run_script(x, ctx)
            elif _writes(x) and ctx.steps and ctx.steps[-1].where == ctx.where:
                text = _describe(x)
                ctx.steps[-1] = replace(
                    ctx.steps[-1], fallback=text, fallback_steps=_fallback_steps(x, ctx, ctx.steps[-1])
                )
            elif not _is_test(node.first) and _relevant(x, ctx):
                raise Unknown(f"the fallback {_describe(x)[:120]!r}, which runs when the command before it fails")
    return status


def _fallback_steps(node, ctx: ScriptContext, failed: Step) -> tuple[Step, ...]:
    """The install steps the right side of ``a || b`` runs when ``a`` (the step ``failed``) fails: read in a
    copy of the context (its assignments and files do not leak), numbered after ``failed``.  A fallback the
    reader cannot decide is recorded as text only (the replay then cannot take it)."""
    scratch = replace(
        ctx,
        vars=dict(ctx.vars),
        files=dict(ctx.files),
        steps=[],
        fetches=[],
        edits={k: list(v) for k, v in ctx.edits.items()},
    )
    try:
        run_script(node, scratch)
    except Unknown:
        return ()
    return tuple(
        replace(s, n=failed.n, fallback=None, fallback_steps=())
        for s in scratch.steps
        if s.replay in ("index", "uninstall")
    )


def _run_opaque(node: Opaque, ctx: ScriptContext) -> bool:
    """A loop or ``{ }`` group: every command in it must be harmless (read lexically, not run)."""
    if re.search(r"\bpip\b", node.text):
        raise Unknown(f"a compound command that installs ({node.text[:60]}...)")
    lexical_read(node.text, ctx.at, ctx.scope(), ctx.rows)
    return True


def _run_if(node: If, ctx: ScriptContext) -> bool | str:
    for cond, body in node.branches:
        try:
            c = _cond(cond, ctx)
        except Unknown as exc:
            if not _relevant(node.otherwise, ctx) and not any(
                _relevant(c, ctx) or _relevant(b, ctx) for c, b in node.branches
            ):
                return True
            raise Unknown(f"the if condition {_describe(cond)!r} ({exc})") from None
        if c is True:
            return run_script(body, ctx)
        if isinstance(c, str):
            outer = ctx.when
            ctx.when = c.split(":", 1)[1]
            run_script(body, ctx)
            ctx.when = outer
            return True
    if node.otherwise is not None:
        return run_script(node.otherwise, ctx)
    return True


def _run_case(node: Case, ctx: ScriptContext) -> bool | str:
    try:
        word = "".join(expand(node.word, ctx.get, split=False))
    except Unknown as exc:
        if not _relevant(node, ctx):
            return True
        raise Unknown(f"the case word {node.word} ({exc})") from None
    for pats, body in node.arms:
        for pat in pats:
            try:
                p = "".join(expand(pat, ctx.get, split=False))
            except Unknown as exc:
                raise Unknown(f"the case pattern {pat} ({exc})") from None
            if fnmatch.fnmatchcase(word, p):
                return run_script(body, ctx)
    return True


def _run_pipe(node: Pipe, ctx: ScriptContext) -> bool | str:
    """``a | b``: each command in turn; a download piped into a shell or Python runs code the reader cannot
    see, except pip's own installer (``curl …get-pip… | python3``, recorded as an off-index fetch)."""
    first, last = node.cmds[0], node.cmds[-1]
    if isinstance(first, Cmd) and isinstance(last, Cmd) and first.words and last.words:
        try:
            kind = classify(resolved(last.words, ctx), ctx.scope()).kind
        except Unknown:
            kind = ""
        if kind in ("stdin-shell", "stdin-python") and not any(op == "<" for op, _t in last.redirects):
            if first.words[0] in ("curl", "wget") and re.search(r"GET_PIP_URL|get-pip", " ".join(first.words)):
                ctx.rows.append(Row(ctx.at, _describe(node), "installs pip (get-pip.py; in off_index_fetches)"))
                return True
            raise Unknown(f"{_describe(node)[:120]!r} pipes text into {last.words[0]}, which runs it unseen")
    status: bool | str = True
    for c in node.cmds:
        status = run_script(c, ctx)
    return status


# The constructs the interpreter knows: each node of the shell tree and the rule that runs it.  A node
# of another kind, or one whose value cannot be decided where it decides an install, is Unknown.
NODE_RULES: dict[type, Callable] = {
    Seq: _run_seq,  # a; b        each in order, the last one's status
    AndOr: _run_andor,  # a && b      b when a succeeds (or may, by install state)
    #                                                  a || b      a; b is recorded as the fallback
    Group: lambda node, ctx: run_script(node.body, ctx),  # ( a )       as a
    Pipe: lambda node, ctx: _run_pipe(node, ctx),  # a | b       each command in turn
    Opaque: _run_opaque,  # for/while/{ }  only when it installs nothing
    If: _run_if,  # if/elif/else on [ ] tests over known values
    Case: _run_case,  # case W in P) ...;; esac, glob patterns
}


def run_script(node, ctx: ScriptContext) -> bool | str:
    """Execute a node; returns its status: True (success), False (failure) or an ``installed:NAME`` condition."""
    rule = NODE_RULES.get(type(node))
    if rule is not None:
        return rule(node, ctx)
    assert isinstance(node, Cmd)
    return _command(node, ctx)


def _describe(node) -> str:
    if isinstance(node, Group):
        return _describe(node.body)
    if isinstance(node, Seq):
        return "; ".join(_describe(x) for x in node.items)
    if isinstance(node, AndOr):
        return " ".join([_describe(node.first)] + [f"{op} {_describe(x)}" for op, x in node.rest])
    if isinstance(node, Cmd):
        return " ".join(node.words)
    if isinstance(node, Pipe):
        return " | ".join(_describe(c) for c in node.cmds)
    if isinstance(node, If):
        return "if ..."
    if isinstance(node, Case):
        return f"case {node.word} in ..."
    return "..."


def _cond(node, ctx: ScriptContext) -> bool | str:
    """Truth of an ``if`` condition: True, False, or ``installed:NAME`` (true when the install state has NAME)."""
    if isinstance(node, Seq):
        if len(node.items) != 1:
            raise Unknown("a multi-command condition")
        return _cond(node.items[0], ctx)
    if isinstance(node, AndOr):
        val = _cond(node.first, ctx)
        for op, x in node.rest:
            if (op == "&&" and val is False) or (op == "||" and val is True):
                continue
            other = _cond(x, ctx)
            if op == "&&":
                if val is False or other is False:
                    val = False
                elif isinstance(val, str) or isinstance(other, str):
                    val = val if isinstance(val, str) else other
            else:
                if val is True or other is True:
                    val = True
                elif val is False:
                    val = other
        return val
    if isinstance(node, Cmd) and node.words and node.words[0] == "[" and node.words[-1] == "]":
        return _test([w for raw in node.words[1:-1] for w in (expand(raw, ctx.get, split=False) or [""])], ctx)
    raise Unknown(f"condition {_describe(node)!r}")


_NUMERIC = {
    "-eq": int.__eq__,
    "-ne": int.__ne__,
    "-gt": int.__gt__,
    "-ge": int.__ge__,
    "-lt": int.__lt__,
    "-le": int.__le__,
}


def _test(args: list[str], ctx: ScriptContext) -> bool | str:
    if args and args[0] == "!":
        v = _test(args[1:], ctx)
        if isinstance(v, str):
            raise Unknown("a negated install-state test")
        return not v
    if len(args) == 2 and args[0] in ("-n", "-z"):
        m = INSTALLED_RE.fullmatch(args[1])
        if m:
            if args[0] == "-z":
                raise Unknown("an install-state -z test")
            return "installed:" + m.group(1)
        return bool(args[1]) if args[0] == "-n" else not args[1]
    if len(args) == 3 and args[1] in ("=", "==", "!="):
        if INSTALLED_RE.search(args[0] + args[2]):
            raise Unknown("a comparison with an installed version")
        eq = args[0] == args[2]
        return eq if args[1] != "!=" else not eq
    if len(args) == 3 and args[1] in _NUMERIC:
        if not all(re.fullmatch(r"-?\d+", a) for a in (args[0], args[2])):
            raise Unknown(f"[ {' '.join(args)} ] (not whole numbers)")
        return _NUMERIC[args[1]](int(args[0]), int(args[2]))
    if len(args) == 2 and args[0] in ("-f", "-e", "-d"):
        if args[1] in ctx.files:
            return True
        try:
            return _sdist_path(args[1], ctx) in ctx.sdist_files
        except Unknown:
            pass
        raise Unknown(f"[ {args[0]} {args[1]} ] (a file of the image)")
    if len(args) == 1:
        return bool(args[0])
    raise Unknown(f"[ {' '.join(args)} ]")


# wrappers that run the command after them unchanged (``env`` with only VAR=value words before it)
_PLAIN_WRAPPERS = ("sudo", "env", "time", "nohup", "command")


def _assignments(words: list[str], ctx: ScriptContext) -> bool:
    """``A=1 B=2`` or ``export/readonly/local/declare A=1``: the variables set; False for another command."""
    if all(re.match(r"^\w+=", w) for w in words):
        assigned = words
    elif words[0] in ("export", "readonly", "local", "declare"):
        assigned = [w for w in words[1:] if re.match(r"^\w+=", w)]
    else:
        return False
    for w in assigned:
        k, _, v = w.partition("=")
        ctx.assign(k, v)
    return True


def _command(cmd: Cmd, ctx: ScriptContext) -> bool:
    words = cmd.words
    if not words:
        return True
    if _is_test(cmd):  # [ ... ] / test ...: its status decides what && and || run
        args = [w for raw in words[1:] for w in (expand(raw, ctx.get, split=False) or [""])]
        if words[0] == "[":
            if not args or args[-1] != "]":
                raise Unknown(f"an unclosed [ in {_describe(cmd)!r}")
            args = args[:-1]
        return _test(args, ctx)
    if _assignments(words, ctx):
        return True
    prefix = []
    while len(words) > 1 and (re.match(r"^\w+=", words[0]) or words[0] in _PLAIN_WRAPPERS):
        if words[0] not in _PLAIN_WRAPPERS:
            prefix.append(words[0].split("=", 1)[0])
        elif words[1].startswith("-"):
            break  # a wrapper with options: classified as written
        words = words[1:]  # VAR=value cmd / sudo cmd / env VAR=value cmd: what runs is cmd
    setting = installer_setting(prefix)
    if setting and install_kind([w.strip("'\"") for w in words[:4]]) == "install":
        raise Unknown(f"{setting}=… before an install (it changes what the install resolves)")
    try:
        argv = [w for raw in words for w in expand(raw, ctx.get)]
    except Unknown:
        if _decides(words):
            raise
        for raw in words:  # the command's words are not all known: it must be harmless as written
            for inner in command_substitutions(raw):
                lexical_read(inner, ctx.at, ctx.scope(), ctx.rows)
        return _classified(Cmd(words, cmd.redirects), ctx)
    out = next(((op, t) for op, t in cmd.redirects if op in (">", ">>", "&>")), None)
    out_path = "".join(expand(out[1], ctx.get, split=False)) if out else None
    if out_path and SITE_PATH.search(out_path):
        raise Unknown(f"{_describe(cmd)[:120]!r} writes {out_path}, under a site directory")
    prog = argv[0]
    if prog in ("echo", "cat") and out_path:
        stdin = next((ctx.files.get(t) for op, t in cmd.redirects if op == "<"), None)
        text = stdin[0] if prog == "cat" and stdin else " ".join(argv[1:]) + "\n"
        if prog == "cat" and (stdin is None or len(argv) > 1):
            return _classified(cmd, ctx)
        _heredoc_substitutions(cmd, ctx)
        before = ctx.files.get(out_path, ("", ctx.where))[0] if out[0] == ">>" else ""
        ctx.files[out_path] = (before + text, ctx.where)
        return True
    if prog == "touch":
        if any(python_tree(p) for p in argv[1:]):
            raise Unknown(f"{_describe(cmd)[:120]!r} creates a file under a site directory")
        for p in argv[1:]:
            ctx.files.setdefault(p, ("", ctx.where))
        return True
    if prog == "sed":
        return _sed(argv[1:], ctx)
    pip_at = _pip_start(argv)
    if pip_at is not None:
        return _pip_command(*pip_at, out_path, ctx)
    if prog == "grep" and out_path and len(argv) >= 3:
        src = argv[-1]
        if ctx.files.get(src, ("",))[0] == _FREEZE:
            m = re.fullmatch(r"\^\(([\w.|-]+)\)==", argv[-2])
            if not m:
                raise Unknown(f"grep {argv[-2]!r} of a freeze")
            ctx.files[out_path] = ("\x00installed-pins:" + ",".join(m.group(1).split("|")), ctx.where)
            return True
    return _classified(cmd, ctx)


def _pip_command(installer: str, sub: str, rest: list[str], out_path: str | None, ctx: ScriptContext) -> bool:
    """``pip``/``uv pip`` SUB: an install or uninstall becomes a step; freeze, list, show … read only."""
    if sub == "freeze":
        if out_path:
            ctx.files[out_path] = (_FREEZE, ctx.where)
        return True
    if sub == "uninstall":
        names = tuple(a for a in rest if not a.startswith("-"))
        ctx.steps.append(
            Step(
                len(ctx.steps) + 1,
                ctx.stage,
                ctx.where,
                "uninstall",
                installer,
                requirements=names,
                when_installed=ctx.when,
            )
        )
        return True
    if sub == "install":
        setting = installer_setting(k for k, v in ctx.vars.items() if v.value)
        if setting:
            where = ", ".join(map(str, ctx.vars[setting].where)) or "the build"
            raise Unknown(f"{setting} ({where}) is set for this install and changes what it resolves")
        for args in _per_wheel(rest, ctx):
            ctx.steps.append(_install_step(installer, args, ctx))
        return True
    if sub in PIP_QUERIES:
        return True
    raise Unknown(f"{installer} pip {sub}")


def _classified(cmd: Cmd, ctx: ScriptContext) -> bool:
    """A command that is no install the interpreter reads: shell text and the build context's scripts are
    run in turn, a fetch recorded, a command of the harmless table passed; anything else is Unknown."""
    v = classify(resolved(cmd.words, ctx), ctx.scope())
    shown = _describe(cmd)[:160]
    if v.kind != "stdin-shell":
        _heredoc_substitutions(cmd, ctx)
    for op, target in cmd.redirects:  # a file this command writes holds what the reader cannot say
        if op in (">", ">>", "&>") and target != "/dev/null":
            path = "".join(_soft(target, ctx))
            if SITE_PATH.search(path) or ctx.scope().site(target):
                raise Unknown(f"{shown!r} writes {target}, under a site directory")
            ctx.files[path] = (UNDETERMINED + shown, ctx.where)
    if v.kind == "installs":
        raise Unknown(f"{v.reason[:120]!r}, an install the reader does not interpret")
    if v.kind == "fetch":
        ctx.fetches.append(Derived(v.reason, (ctx.where,)))
    elif v.kind == "shell":
        run_text(v.text, ctx, f"{ctx.at} ({v.reason})", child=True)
    elif v.kind in ("script", "python"):
        path = "".join(expand(v.text, ctx.get, split=False)) if "$" in v.text else v.text
        found = _context_file(path, ctx)
        if found is None:
            raise Unknown(f"{path} ({v.reason}) is not a file of the build context the reader has")
        name, body = found
        ctx.rows.append(Row(ctx.at, shown, f"{name} ({v.reason}), read"))
        if v.kind == "python":
            bad = python_text_installs(body)
            if bad:
                raise Unknown(f"the Python file {name} may install or write ({bad!r})")
            return True
        sourced = cmd.words[0] in (".", "source")
        at = next((i for i, w in enumerate(cmd.words) if unquote(w) == v.text), len(cmd.words))
        args = [] if sourced else [w for raw in cmd.words[at + 1 :] for w in _soft(raw, ctx)]
        run_text(body, ctx, name, child=not sourced, args=args)
        return True
    elif v.kind in ("stdin-shell", "stdin-python"):
        body = next((ctx.files.get(t, (None,))[0] for op, t in cmd.redirects if op == "<"), None)
        if body is None:
            raise Unknown(f"{shown!r}: {v.reason}, which the reader cannot see")
        if v.kind == "stdin-python":
            bad = python_text_installs(body)
            if bad:
                raise Unknown(f"the Python heredoc of {shown!r} may install or write ({bad!r})")
            ctx.rows.append(Row(ctx.at, shown, "harmless: a Python heredoc with no install"))
            return True
        run_text(body, ctx, f"{ctx.at} (heredoc)", child=True)
        return True
    ctx.rows.append(Row(ctx.at, shown, f"{'fetches' if v.kind == 'fetch' else 'harmless'}: {v.reason}"))
    return True


def _decides(words: list[str]) -> bool:
    """Whether a command's exact words decide what the recipe holds (an install, a sed of a requirements
    file, a file written by echo): such a command with a word the reader cannot decide is Unknown."""
    head = [w.strip("'\"") for w in words[:4]]
    return install_kind(head) is not None or head[0] in ("sed", "touch", "grep")


def resolved(words: list[str], ctx: ScriptContext) -> list[str]:
    """A command's raw words with each one the reader can expand to exactly one word replaced by it (quoted),
    the others as written: what :func:`builder.resolve.recipe.harmless.classify` judges."""
    import shlex

    out = []
    for raw in words:
        if "$" not in raw and "`" not in raw:
            out.append(raw)
            continue
        try:
            vals = expand(raw, ctx.get)
        except (Unknown, ValueError, IndexError):
            out.append(raw)
            continue
        out.append(shlex.quote(vals[0]) if len(vals) == 1 else raw)
    return out


def _heredoc_substitutions(cmd: Cmd, ctx: ScriptContext) -> None:
    """The ``$(…)`` of a heredoc a command reads run before it does: each must be harmless."""
    for op, target in cmd.redirects:
        body = ctx.files.get(target, ("",))[0] if op == "<" and target.startswith(HEREDOC_PATH) else ""
        for inner in command_substitutions(body):
            lexical_read(inner, ctx.at, ctx.scope(), ctx.rows)


def _soft(raw: str, ctx: ScriptContext) -> list[str]:
    try:
        return expand(raw, ctx.get)
    except Unknown:
        return ["\x00undetermined"]


def _context_file(path: str, ctx: ScriptContext) -> tuple[str, str] | None:
    """(name, text) of a file a command runs: one an earlier line of the image wrote, or one of the build
    context (copied or mounted; :attr:`ScriptContext.script`)."""
    if path in ctx.files and not ctx.files[path][0].startswith(("\x00", _FREEZE)):
        return f"{path} (written at {ctx.files[path][1]})", ctx.files[path][0]
    return ctx.script(path)


def run_text(text: str, ctx: ScriptContext, name: str, *, child: bool = False, args: list[str] | None = None) -> None:
    """Read shell text (a RUN line, ``sh -c``, a script, a heredoc) with the interpreter; text it cannot parse
    (arrays, ``[[``) is read lexically, where every command must be harmless.  ``child``: a new shell (its
    assignments do not reach the caller); ``args``: its positional parameters."""
    if len(text) > MAX_TEXT:
        raise Unknown(f"{name} is {len(text)} bytes, more than a build script holds ({MAX_TEXT} at most)")
    if ctx.depth >= MAX_DEPTH:
        raise Unknown(f"{name}: shell texts nested more than {MAX_DEPTH} deep")
    text, bodies = lift_heredocs(text, name)
    outer = (ctx.vars, ctx.at, ctx.depth)
    if child:
        ctx.vars = dict(ctx.vars)
    for k, a in enumerate(args or [], 1):
        if a != "\x00undetermined":
            ctx.vars[str(k)] = Var(a, (ctx.where,))
        else:
            ctx.vars.pop(str(k), None)
    ctx.files.update({p: (b, ctx.where) for p, b in bodies.items()})
    ctx.at, ctx.depth = name, ctx.depth + 1
    try:
        try:
            if re.search(r"`|[<>]\(", text):  # backquotes and process substitutions: read lexically only
                raise Unknown("backquotes or a process substitution")
            tree = parse_script(text)
        except (Unknown, ValueError, IndexError):
            rows: list[Row] = []
            lexical_read(text, name, ctx.scope(), rows)
            ctx.rows.extend(rows)
            done = {d.value for d in ctx.fetches if ctx.where in d.where}
            for r in rows:
                what = r.conclusion.split(": ", 1)[1] if r.conclusion.startswith("fetches: ") else None
                if what and what not in done:
                    ctx.fetches.append(Derived(what, (ctx.where,)))
                    done.add(what)
            return
        try:
            run_script(tree, ctx)
        except Unknown as exc:
            if name == str(ctx.where) or str(exc).startswith(name):
                raise
            raise Unknown(f"{name}: {exc}") from None
    finally:
        if child:
            ctx.vars = outer[0]
        ctx.at, ctx.depth = outer[1], outer[2]


def _sed(args: list[str], ctx: ScriptContext) -> bool:
    """``sed -i [-E] SCRIPT FILE...`` on a file copied from the source: the edit is recorded for the steps
    that read the file (the replay applies it with :func:`builder.resolve.sedit.apply`); ``sed`` without
    ``-i`` writes nothing the reader must know."""
    inplace, ere, scripts, paths = False, False, [], []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-e" and i + 1 < len(args):
            scripts.append(args[i + 1])
            i += 2
            continue
        if a.startswith("-") and len(a) > 1 and not a.startswith("--"):
            for c in a[1:]:
                if c == "i":
                    inplace = True
                elif c in "Er":
                    ere = True
                else:
                    raise Unknown(f"sed option -{c}")
        elif a.startswith("--"):
            raise Unknown(f"sed option {a}")
        elif not scripts:
            scripts.append(a)
        else:
            paths.append(a)
        i += 1
    if not inplace:
        return True
    for s in scripts:
        try:
            sedit.parse(s, ere=ere)
        except sedit.SedUnknown as exc:
            raise Unknown(f"sed -i {s!r}: {exc}") from None
    for path in paths:
        _sdist_path(path, ctx)  # a file the source does not provide is Unknown
        for s in scripts:
            ctx.edits.setdefault(path, []).append((s, ere, ctx.where))
    return True


def _pip_start(argv: list[str]) -> tuple[str, str, list[str]] | None:
    if len(argv) >= 3 and argv[0] == "uv" and argv[1] == "pip":
        return "uv", argv[2], argv[3:]
    if len(argv) >= 4 and re.fullmatch(r"python[\d.]*", argv[0]) and argv[1] == "-m" and argv[2] == "pip":
        return "pip", argv[3], argv[4:]
    if len(argv) >= 2 and re.fullmatch(r"pip[\d.]*", argv[0]):
        return "pip", argv[1], argv[2:]
    return None


_VALUE_OPTS = {
    "-r",
    "--requirement",
    "-c",
    "--constraint",
    "--override",
    "--index-url",
    "-i",
    "--extra-index-url",
    "--index-strategy",
    "--prerelease",
    # options that only change how, not what or where (their value is read and dropped)
    "--cache-dir",
    "--link-mode",
    "--root-user-action",
    "--progress-bar",
    "--keyring-provider",
    "--color",
}
# options that change where an install puts its files or what it takes them from, which the reader does
# not model: an install with one is Unknown
_UNMODELED_OPTS = {
    "--python",
    "-p",
    "--target",
    "-t",
    "--prefix",
    "--root",
    "--user",
    "--find-links",
    "-f",
    "--no-index",
    "--editable",
    "-e",
    "--only-binary",
    "--no-binary",
    "--python-version",
    "--python-platform",
    "--config-file",
    "--exclude-newer",
    "--resolution",
}
# flags that change nothing about what is installed or where
_NOOP_FLAGS = {
    "--system",
    "--verbose",
    "-v",
    "-vv",
    "-q",
    "--quiet",
    "--no-cache",
    "--no-cache-dir",
    "--break-system-packages",
    "--compile",
    "--compile-bytecode",
    "--disable-pip-version-check",
    "--no-progress",
    "--no-color",
    "--no-warn-script-location",
    "--strict",
}
_PASS_FLAGS = {
    "--no-deps",
    "--force-reinstall",
    "--reinstall",
    "--no-build",
    "--no-build-isolation",
    "--pre",
    "--upgrade",
    "-U",
}


def _install_options(args: list[str], ctx: ScriptContext) -> _InstallOptions:
    """The options and requirements of a ``pip install`` / ``uv pip install`` argument list (pure)."""
    reqs, rfiles, cfiles, pins, flags, extra = [], [], [], [], [], []
    index_url = strategy = None
    edits: list[tuple[str, str, bool, str]] = []
    overrides, owhere = ctx.overrides
    overrides, owhere = list(overrides), list(owhere)
    i = 0
    while i < len(args):
        a = args[i]
        if "=" in a and a.startswith("--") and a.split("=", 1)[0] in _VALUE_OPTS:
            a, v = a.split("=", 1)
            args = args[:i] + [a, v] + args[i + 1 :]
        if a.split("=", 1)[0] in _UNMODELED_OPTS:
            raise Unknown(f"the install option {a} (where or from what it installs, which the reader does not model)")
        if a in _VALUE_OPTS:
            if i + 1 >= len(args):
                raise Unknown(f"{a} without its value")
            v = args[i + 1]
            i += 2
            if a in ("-r", "--requirement"):
                rfiles.append(_sdist_path(v, ctx))
                edits += [(rfiles[-1], s, ere, str(w)) for s, ere, w in ctx.edits.get(v, ())]
            elif a in ("-c", "--constraint"):
                content = ctx.files.get(v)
                if content and content[0].startswith("\x00installed-pins:"):
                    pins.extend(content[0].split(":", 1)[1].split(","))
                else:
                    cfiles.append(_sdist_path(v, ctx))
                    edits += [(cfiles[-1], s, ere, str(w)) for s, ere, w in ctx.edits.get(v, ())]
            elif a == "--override":
                content = ctx.files.get(v)
                if content is None or content[0].startswith(UNDETERMINED):
                    raise Unknown(f"--override {v} (not written by the Dockerfile in text the reader can say)")
                overrides += [ln for ln in content[0].splitlines() if ln.strip()]
                owhere.append(content[1])
            elif a in ("--index-url", "-i"):
                index_url = v
            elif a == "--extra-index-url":
                extra.append(v)
            elif a == "--index-strategy":
                strategy = v
            elif a == "--prerelease" and v == "allow":
                flags.append("--pre")
            elif a == "--prerelease" and v != "disallow":
                raise Unknown(f"--prerelease {v}")
            continue
        if a.startswith("-"):
            if a in _PASS_FLAGS:
                flags.append(a)
            elif a not in _NOOP_FLAGS:
                raise Unknown(f"the install option {a}")
            i += 1
            continue
        reqs.append(a)
        i += 1
    return _InstallOptions(
        reqs, rfiles, cfiles, pins, flags, extra, index_url, strategy, edits, tuple(overrides), tuple(owhere)
    )


@dataclass
class _InstallOptions:
    reqs: list[str]
    rfiles: list[str]
    cfiles: list[str]
    pins: list[str]
    flags: list[str]
    extra: list[str]
    index_url: str | None
    strategy: str | None
    edits: list[tuple[str, str, bool, str]]
    overrides: tuple[str, ...]
    override_where: tuple[Where, ...]


def _per_wheel(args: list[str], ctx: ScriptContext) -> list[list[str]]:
    """One install's arguments split so that each wheel file is a step of its own (``uv pip install a/*.whl
    b/*.whl`` installs both), the other requirements one more step, each with the install's options."""
    reqs = _install_options(args, ctx).reqs
    wheels = [r for r in reqs if r.endswith(".whl")]
    if not wheels or len(reqs) == 1:
        return [args]
    opts = [a for a in args if a not in set(reqs)]
    others = [r for r in reqs if not r.endswith(".whl")]
    return [[*opts, w] for w in wheels] + ([[*opts, *others]] if others else [])


def _install_step(installer: str, args: list[str], ctx: ScriptContext) -> Step:
    o = _install_options(args, ctx)
    reqs, rfiles, cfiles, pins, flags, extra = o.reqs, o.rfiles, o.cfiles, o.pins, o.flags, o.extra
    index_url, strategy, edits = o.index_url, o.strategy, o.edits
    if (
        strategy is None
        and (index_url or extra)
        and installer == "uv"
        and "UV_INDEX_STRATEGY" in ctx.vars
        and ctx.vars["UV_INDEX_STRATEGY"].env
    ):
        strategy = ctx.vars["UV_INDEX_STRATEGY"].value or None  # the image's ENV, which this uv reads
    common = dict(
        n=len(ctx.steps) + 1,
        stage=ctx.stage,
        where=ctx.where,
        installer=installer,
        index_url=index_url,
        extra_index_urls=tuple(extra),
        flags=tuple(flags),
        when_installed=ctx.when,
        overrides=o.overrides,
        override_where=o.override_where,
        index_strategy=strategy,
        requirement_edits=tuple(edits),
    )
    wheels = [r for r in reqs if r.endswith(".whl")]
    if wheels:
        w = wheels[0]
        if w in SOURCE_BUILDS:
            name, note = SOURCE_BUILDS[w]
            return Step(replay="source-build", names=(name,), note=note, requirements=(w,), **common)
        if w.startswith("dist/") and ctx.binds.get("dist", "").startswith("build:"):
            return Step(
                replay="index",
                requirements=(f"vllm=={ctx.get('VLLM_RELEASE')}",),
                note="the vllm wheel the image builds from this source in stage build; the release's "
                "wheel on the index stands for it",
                **common,
            )
        if re.match(r"^https?://", w):
            fname = w.rsplit("/", 1)[-1]
            parts = fname[:-4].split("-")
            name = re.sub(r"[-_.]+", "-", parts[0]).lower()
            return Step(
                replay="off-index",
                names=(name,),
                requirements=(w,),
                note=f"{name} {parts[1] if len(parts) > 1 else '?'} from a URL off the index ({fname})",
                **common,
            )
        raise Unknown(f"install of {w}")
    if not reqs and not rfiles:
        raise Unknown(f"{installer} pip install with nothing nameable to install")
    indexes = [index_url] if index_url else []
    if index_url and not any(_is_python_index(u) for u in (*indexes, *extra)):
        # every index the step names is another one: what it installs is not on the Python index
        names = tuple(_requirement_name(r) for r in reqs) + tuple(n for f in rfiles for n in _file_names(f, ctx))
        if not names:
            raise Unknown(f"an install from {index_url} that names no distribution")
        shown = ", ".join(reqs + [f"-r {f}" for f in rfiles])
        return Step(
            replay="off-index",
            names=names,
            requirements=tuple(reqs),
            requirement_files=tuple(rfiles),
            note=f"{shown} from {index_url}",
            **common,
        )
    return Step(
        replay="index",
        requirements=tuple(reqs),
        requirement_files=tuple(rfiles),
        constraint_files=tuple(cfiles),
        constrain_installed=tuple(pins),
        **common,
    )


def _requirement_name(req: str) -> str:
    try:
        return canonicalize_name(Requirement(req).name)
    except InvalidRequirement:
        raise Unknown(f"the requirement {req!r}") from None


def _file_names(path: str, ctx: ScriptContext) -> list[str]:
    """The distributions a requirements file of the source names (pure; includes are not followed)."""
    text = ctx.sdist_text.get(path)
    if text is None:
        raise Unknown(f"the file {path} (not in the source)")
    out = []
    for line in text.splitlines():
        body = re.split(r"\s+#|^#", line, maxsplit=1)[0].strip()
        if body and not body.startswith("-"):
            out.append(_requirement_name(body))
    return out


def _is_python_index(url: str) -> bool:
    return bool(re.match(r"^https://pypi\.org/simple/?$", url))


def _sdist_path(p: str, ctx: ScriptContext) -> str:
    if p in ctx.mounts:
        return ctx.mounts[p]
    for dst, src in sorted(ctx.mounts.items(), key=lambda kv: -len(kv[0])):
        if p.startswith(dst.rstrip("/") + "/"):
            return src.rstrip("/") + "/" + p[len(dst.rstrip("/")) + 1 :]
    if p.startswith("requirements/"):
        return p
    raise Unknown(f"the file {p} (not copied or mounted from the source)")


def run_mounts(run_value: str) -> tuple[dict[str, str], dict[str, str], str]:
    """(--mount=type=bind from the context: target -> source, binds from stages: target -> stage:src, the script)."""
    ctx_m, stage_m = {}, {}
    rest = run_value
    while True:
        m = re.match(r"\s*--(\w+)=(\S+)", rest)
        if not m:
            break
        rest = rest[m.end() :]
        if m.group(1) != "mount":
            continue
        kv = dict(x.split("=", 1) if "=" in x else (x, "true") for x in m.group(2).split(","))
        if kv.get("type") != "bind":
            continue
        src = kv.get("source", kv.get("src", "."))
        tgt = kv.get("target", kv.get("dst", kv.get("destination", "")))
        if "from" in kv:
            rel = tgt[len("/vllm-workspace/") :] if tgt.startswith("/vllm-workspace/") else tgt
            stage_m[rel] = f"{kv['from']}:{src}"
        else:
            ctx_m[tgt] = src
    return ctx_m, stage_m, rest


def apt_packages(script: str, get) -> list[str]:
    """Package names of a RUN's ``apt-get install`` lines, with the RUN's own assignments expanded; a name
    that stays undetermined (a fallback's variable) is left out (pure)."""
    local: dict[str, str] = {}

    def get2(name: str) -> str:
        return local[name] if name in local else get(name)

    for m in re.finditer(r"(?:^|[;&|(\s])(\w+)=(\$\([^)]*\)|\"[^\"]*\"|'[^']*'|[^\s;&|]+)", script):
        try:
            local[m.group(1)] = "".join(expand(m.group(2), get2, split=False))
        except (Unknown, ValueError, IndexError):
            pass
    out = []
    for m in re.finditer(r"apt-get install((?:\s+(?:\\\n)?\s*[^\s;&|\\]+)+)", script):
        for w in m.group(1).split():
            if w.startswith("-"):
                continue
            try:
                vals = expand(w, get2)
            except (Unknown, ValueError, IndexError):
                continue
            for v in vals:
                if v and not v.startswith("-") and "$" not in v and "=" not in v and v not in out:
                    out.append(v)
    return out


def copy_targets(value: str) -> dict[str, str]:
    """``COPY SRC... DST`` from the build context: image path -> path in the source, one per source (a DST
    ending in ``/``, or several sources, is a folder that receives each by its base name) (pure)."""
    import posixpath
    import shlex

    parts = [p for p in shlex.split(value) if not p.startswith("--")]
    if len(parts) < 2:
        return {}
    *srcs, dst = parts
    if len(srcs) == 1 and not dst.endswith("/"):
        return {dst: srcs[0]}
    return {posixpath.join(dst, posixpath.basename(src.rstrip("/"))): src for src in srcs}


def context_scripts(mounts: dict[str, str], files: dict[str, str]) -> Callable[[str], tuple[str, str] | None]:
    """The resolver of a path a RUN line runs to (its path in the source, its text): through the stage's
    COPYs and the line's bind mounts of the build context; a path that leaves the context is Unknown, one
    the reader has no text for gives None (pure)."""
    import posixpath

    def resolve(path: str) -> tuple[str, str] | None:
        p = posixpath.normpath(path)
        for dst, src in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            d = dst.rstrip("/") or "/"
            if p == d:
                rel = src
            elif p.startswith(d.rstrip("/") + "/"):
                rel = src.rstrip("/") + "/" + p[len(d.rstrip("/")) + 1 :]
            else:
                continue
            rel = posixpath.normpath(rel)
            if rel == ".." or rel.startswith(("../", "/")):
                raise Unknown(f"{path} is {rel} of the build context, which leaves it")
            text = files.get(rel)
            if text is not None and text.startswith(OVERSIZE):
                raise Unknown(f"{rel} is {text[len(OVERSIZE) :]} bytes, more than a build script holds")
            return None if text is None else (rel, text)
        return None

    return resolve


#: the text a source reader stores for a script too large to read: this prefix and its size
OVERSIZE = "\x00oversize:"


def into_python_tree(op: str, value: str, local: dict[str, Var]) -> bool:
    """Whether a COPY/ADD's destination or a WORKDIR may be under one of Python's site directories (or, for
    WORKDIR, inside a ``lib/python…`` folder, where later relative paths may reach one): the instruction
    changes what the replay cannot see, so it is refused like an undecided RUN line (pure)."""
    import shlex

    try:
        parts = [p for p in shlex.split(value) if not p.startswith("--")]
    except ValueError:
        return True
    if not parts:
        return False
    get = ScriptContext(dict(local), {}, {}, {}, "", Where("", 0), [], ((), ()), []).get
    try:
        dest = "".join(expand(parts[-1], get, split=False))
    except (Unknown, ValueError, IndexError):
        dest = parts[-1]
    return python_tree(dest) or (op == "WORKDIR" and "lib/python" in dest)
