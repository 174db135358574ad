"""The interpreter: runs a RUN script's command tree over known values and turns what it installs
into :class:`Step` records (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from builder.resolve.recipe.model import Derived, Step, Where
from builder.resolve.recipe.shell import (
    _INSTALLED_RE,
    AndOr,
    Cmd,
    Group,
    If,
    Opaque,
    Pipe,
    Seq,
    Unknown,
    Var,
    expand,
)

# Wheels the image builds from source in another stage: the distributions they install.
SOURCE_BUILDS = {
    "ep_kernels/dist/*.whl": ("deep-ep", "DeepEP built from git in stage extensions-build "
                                         "(tools/ep_kernels/install_python_libraries.sh)"),
}
# Commands inside an interpreted RUN that bring files from outside the Python indexes.
OFF_INDEX_COMMANDS = {
    ("flashinfer", "download-kernels"): "FlashInfer's precompiled kernels (flashinfer download-kernels)",
}




# --------------------------------------------------------------------------- interpretation
@dataclass
class _Ctx:
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
    when: str | None = None
    fallback: str | None = None

    def get(self, name: str) -> str:
        if name in self.vars:
            return self.vars[name].value
        raise Unknown(f"${name}")


_FREEZE = "\x00freeze\x00"


def _relevant(node) -> bool:
    """Whether a subtree installs, uninstalls or writes a file (a condition on it then matters)."""
    if isinstance(node, Cmd):
        s = " ".join(node.words)
        touches = len(node.words) >= 2 and node.words[0] == "touch"
        return bool(re.search(r"\bpip\b", s)) or bool(node.redirects) or touches
    if isinstance(node, Opaque):
        return bool(re.search(r"\bpip\b", node.text))
    if isinstance(node, (Seq,)):
        return any(_relevant(x) for x in node.items)
    if isinstance(node, AndOr):
        return _relevant(node.first) or any(_relevant(x) for _, x in node.rest)
    if isinstance(node, Pipe):
        return any(_relevant(x) for x in node.cmds)
    if isinstance(node, If):
        return any(_relevant(c) or _relevant(b) for c, b in node.branches) or (
            node.otherwise is not None and _relevant(node.otherwise))
    if isinstance(node, Group):
        return _relevant(node.body)
    return False


def _run(node, ctx: _Ctx) -> bool | str:
    """Execute a node; returns its status: True (success), False (failure) or an ``installed:NAME`` condition."""
    if isinstance(node, Seq):
        status: bool | str = True
        for x in node.items:
            status = _run(x, ctx)
        return status
    if isinstance(node, AndOr):
        status = _run(node.first, ctx)
        for op, x in node.rest:
            if op == "&&":
                if status is False:
                    continue
                if isinstance(status, str):
                    outer = ctx.when
                    ctx.when = status.split(":", 1)[1]
                    status2 = _run(x, ctx)
                    ctx.when = outer
                    status = status2 if status2 is not True else status
                    continue
                status = _run(x, ctx)
            else:  # || : the left side is taken; the right side is the documented fallback
                if status is False:
                    status = _run(x, ctx)
                elif _relevant(x) and ctx.steps and ctx.steps[-1].where == ctx.where:
                    text = _describe(x)
                    ctx.steps[-1] = replace(ctx.steps[-1], fallback=text)
        return status
    if isinstance(node, Group):
        return _run(node.body, ctx)
    if isinstance(node, Pipe):
        return True
    if isinstance(node, Opaque):
        if re.search(r"\bpip\b", node.text):
            raise Unknown(f"a compound command that installs ({node.text[:60]}...)")
        return True
    if isinstance(node, If):
        for cond, body in node.branches:
            try:
                c = _cond(cond, ctx)
            except Unknown:
                if not _relevant(body) and not (node.otherwise is not None and _relevant(node.otherwise)):
                    return True
                raise
            if c is True:
                return _run(body, ctx)
            if isinstance(c, str):
                outer = ctx.when
                ctx.when = c.split(":", 1)[1]
                _run(body, ctx)
                ctx.when = outer
                return True
        if node.otherwise is not None:
            return _run(node.otherwise, ctx)
        return True
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
    return "..."


def _cond(node, ctx: _Ctx) -> bool | str:
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


def _test(args: list[str], ctx: _Ctx) -> bool | str:
    if args and args[0] == "!":
        v = _test(args[1:], ctx)
        if isinstance(v, str):
            raise Unknown("a negated install-state test")
        return not v
    if len(args) == 2 and args[0] in ("-n", "-z"):
        m = _INSTALLED_RE.fullmatch(args[1])
        if m:
            if args[0] == "-z":
                raise Unknown("an install-state -z test")
            return "installed:" + m.group(1)
        return bool(args[1]) if args[0] == "-n" else not args[1]
    if len(args) == 3 and args[1] in ("=", "==", "!="):
        if _INSTALLED_RE.search(args[0] + args[2]):
            raise Unknown("a comparison with an installed version")
        eq = args[0] == args[2]
        return eq if args[1] != "!=" else not eq
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


def _command(cmd: Cmd, ctx: _Ctx) -> bool:
    words = cmd.words
    if not words:
        return True
    if all(re.match(r"^\w+=", w) for w in words):
        for w in words:
            k, _, v = w.partition("=")
            ctx.vars[k] = Var("".join(expand(v, ctx.get, split=False)), (ctx.where,))
        return True
    if words[0] == "export":
        for w in words[1:]:
            if "=" in w:
                k, _, v = w.partition("=")
                ctx.vars[k] = Var("".join(expand(v, ctx.get, split=False)), (ctx.where,))
        return True
    while len(words) > 1 and re.match(r"^\w+=", words[0]):
        words = words[1:]  # VAR=value cmd: the assignment only reaches cmd's environment
    argv = [w for raw in words for w in expand(raw, ctx.get)]
    out = next((t for op, t in cmd.redirects if op in (">", ">>")), None)
    out_path = "".join(expand(out, ctx.get, split=False)) if out else None
    prog = argv[0]
    if prog == "echo" and out_path:
        ctx.files[out_path] = (" ".join(argv[1:]) + "\n", ctx.where)
        return True
    if prog == "touch":
        for p in argv[1:]:
            ctx.files.setdefault(p, ("", ctx.where))
        return True
    pip_at = _pip_start(argv)
    if pip_at is not None:
        installer, sub, rest = pip_at
        if sub == "freeze":
            if out_path:
                ctx.files[out_path] = (_FREEZE, ctx.where)
            return True
        if sub == "uninstall":
            names = tuple(a for a in rest if not a.startswith("-"))
            ctx.steps.append(Step(len(ctx.steps) + 1, ctx.stage, ctx.where, "uninstall", installer, requirements=names,
                                  when_installed=ctx.when))
            return True
        if sub == "install":
            ctx.steps.append(_install_step(installer, rest, ctx))
            return True
        if sub in ("list", "show", "check"):
            return True
        raise Unknown(f"{installer} pip {sub}")
    if prog == "grep" and out_path and len(argv) >= 3:
        src = argv[-1]
        if ctx.files.get(src, ("",))[0] == _FREEZE:
            m = re.fullmatch(r"\^\(([\w.|-]+)\)==", argv[-2])
            if not m:
                raise Unknown(f"grep {argv[-2]!r} of a freeze")
            ctx.files[out_path] = ("\x00installed-pins:" + ",".join(m.group(1).split("|")), ctx.where)
            return True
    for key, what in OFF_INDEX_COMMANDS.items():
        if tuple(argv[:len(key)]) == key:
            ctx.fetches.append(Derived(what, (ctx.where,)))
    return True


def _pip_start(argv: list[str]) -> tuple[str, str, list[str]] | None:
    if len(argv) >= 3 and argv[0] == "uv" and argv[1] == "pip":
        return "uv", argv[2], argv[3:]
    if len(argv) >= 4 and re.fullmatch(r"python[\d.]*", argv[0]) and argv[1] == "-m" and argv[2] == "pip":
        return "pip", argv[3], argv[4:]
    if len(argv) >= 2 and re.fullmatch(r"pip[\d.]*", argv[0]):
        return "pip", argv[1], argv[2:]
    return None


_VALUE_OPTS = {"-r", "--requirement", "-c", "--constraint", "--override", "--index-url", "-i", "--extra-index-url",
               "--python", "-p", "--index-strategy", "--prerelease", "--target", "--prefix", "--find-links", "-f"}
_PASS_FLAGS = {"--no-deps", "--force-reinstall", "--reinstall", "--no-build", "--no-build-isolation", "--pre",
               "--upgrade", "-U"}


def _install_step(installer: str, args: list[str], ctx: _Ctx) -> Step:
    reqs, rfiles, cfiles, pins, flags, extra = [], [], [], [], [], []
    index_url = None
    overrides, owhere = ctx.overrides
    overrides, owhere = list(overrides), list(owhere)
    i = 0
    while i < len(args):
        a = args[i]
        if "=" in a and a.startswith("--") and a.split("=", 1)[0] in _VALUE_OPTS:
            a, v = a.split("=", 1)
            args = args[:i] + [a, v] + args[i + 1:]
        if a in _VALUE_OPTS:
            v = args[i + 1]
            i += 2
            if a in ("-r", "--requirement"):
                rfiles.append(_sdist_path(v, ctx))
            elif a in ("-c", "--constraint"):
                content = ctx.files.get(v)
                if content and content[0].startswith("\x00installed-pins:"):
                    pins.extend(content[0].split(":", 1)[1].split(","))
                else:
                    cfiles.append(_sdist_path(v, ctx))
            elif a == "--override":
                content = ctx.files.get(v)
                if content is None:
                    raise Unknown(f"--override {v} (not written by the Dockerfile)")
                overrides += [ln for ln in content[0].splitlines() if ln.strip()]
                owhere.append(content[1])
            elif a in ("--index-url", "-i"):
                index_url = v
            elif a == "--extra-index-url":
                extra.append(v)
            elif a == "--prerelease" and v == "allow":
                flags.append("--pre")
            continue
        if a.startswith("-"):
            if a in _PASS_FLAGS:
                flags.append(a)
            i += 1
            continue
        reqs.append(a)
        i += 1
    common = dict(n=len(ctx.steps) + 1, stage=ctx.stage, where=ctx.where, installer=installer,
                  index_url=index_url, extra_index_urls=tuple(extra), flags=tuple(flags), when_installed=ctx.when,
                  overrides=tuple(overrides), override_where=tuple(owhere))
    wheels = [r for r in reqs if r.endswith(".whl")]
    if wheels:
        w = wheels[0]
        if w in SOURCE_BUILDS:
            name, note = SOURCE_BUILDS[w]
            return Step(replay="source-build", names=(name,), note=note, requirements=(w,), **common)
        if w.startswith("dist/") and ctx.binds.get("dist", "").startswith("build:"):
            return Step(replay="index", requirements=(f"vllm=={ctx.get('VLLM_RELEASE')}",),
                        note="the vllm wheel the image builds from this source in stage build; the release's "
                             "wheel on the index stands for it", **common)
        if re.match(r"^https?://", w):
            fname = w.rsplit("/", 1)[-1]
            parts = fname[:-4].split("-")
            name = re.sub(r"[-_.]+", "-", parts[0]).lower()
            return Step(replay="off-index", names=(name,), requirements=(w,),
                        note=f"{name} {parts[1] if len(parts) > 1 else '?'} from a URL off the index ({fname})",
                        **common)
        raise Unknown(f"install of {w}")
    if index_url and not _is_python_index(index_url):
        names = tuple(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs)
        return Step(replay="off-index", names=names, requirements=tuple(reqs),
                    note=f"{', '.join(reqs)} from {index_url}", **common)
    return Step(replay="index", requirements=tuple(reqs), requirement_files=tuple(rfiles),
                constraint_files=tuple(cfiles), constrain_installed=tuple(pins), **common)


def _is_python_index(url: str) -> bool:
    return bool(re.match(r"^https://pypi\.org/simple/?$", url))


def _sdist_path(p: str, ctx: _Ctx) -> str:
    if p in ctx.mounts:
        return ctx.mounts[p]
    for dst, src in sorted(ctx.mounts.items(), key=lambda kv: -len(kv[0])):
        if p.startswith(dst.rstrip("/") + "/"):
            return src.rstrip("/") + "/" + p[len(dst.rstrip("/")) + 1:]
    if p.startswith("requirements/"):
        return p
    raise Unknown(f"the file {p} (not copied or mounted from the source)")


def _mounts(run_value: str) -> tuple[dict[str, str], dict[str, str], str]:
    """(--mount=type=bind from the context: target -> source, binds from stages: target -> stage:src, the script)."""
    ctx_m, stage_m = {}, {}
    rest = run_value
    while True:
        m = re.match(r"\s*--(\w+)=(\S+)", rest)
        if not m:
            break
        rest = rest[m.end():]
        if m.group(1) != "mount":
            continue
        kv = dict(x.split("=", 1) if "=" in x else (x, "true") for x in m.group(2).split(","))
        if kv.get("type") != "bind":
            continue
        src = kv.get("source", kv.get("src", "."))
        tgt = kv.get("target", kv.get("dst", kv.get("destination", "")))
        if "from" in kv:
            rel = tgt[len("/vllm-workspace/"):] if tgt.startswith("/vllm-workspace/") else tgt
            stage_m[rel] = f"{kv['from']}:{src}"
        else:
            ctx_m[tgt] = src
    return ctx_m, stage_m, rest


def _apt_packages(script: str, get) -> list[str]:
    """Package names of a RUN's ``apt-get install`` lines, with the RUN's own assignments expanded; a name
    that stays undetermined (a fallback's variable) is left out (pure)."""
    local: dict[str, str] = {}

    def get2(name: str) -> str:
        return local[name] if name in local else get(name)

    for m in re.finditer(r"(?:^|[;&|(\s])(\w+)=(\$\([^)]*\)|\"[^\"]*\"|'[^']*'|[^\s;&|]+)", script):
        try:
            local[m.group(1)] = "".join(expand(m.group(2), get2, split=False))
        except (Unknown, ValueError):
            pass
    out = []
    for m in re.finditer(r"apt-get install((?:\s+(?:\\\n)?\s*[^\s;&|\\]+)+)", script):
        for w in m.group(1).split():
            if w.startswith("-"):
                continue
            try:
                vals = expand(w, get2)
            except (Unknown, ValueError):
                continue
            for v in vals:
                if v and not v.startswith("-") and "$" not in v and "=" not in v and v not in out:
                    out.append(v)
    return out


