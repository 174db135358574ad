"""Which image the release publishes as ``vllm/vllm-openai:vX``: read from the release pipeline's steps and the
``.buildkite/`` scripts they call, never from a step's label (pure).

The publish commands are ``docker tag SRC DEST``, ``docker manifest create DEST SRC…`` (a multi-arch join) and
``docker buildx imagetools create -t DEST SRC…``, wherever the pipeline or a script it calls runs them (a
script's functions and ``for`` loops are unrolled; both branches of an ``if`` are read; a heredoc's lines are
read like the script's own, since the release scripts hand the publish commands to the release manager that
way).  ``vllm/vllm-openai:v<X><variant>`` is followed back through those commands to the images a build step
pushed (``docker push``, ``docker tag``, ``docker build -t``); the machine a step runs on (its
``$(uname -m)``) is its ``--platform``, else the machine its label names, which its agent queue must not
contradict.  The published platforms are the machines of the joined images; the recipe of a platform is the
build step that pushed its image.

Anything the files do not decide (no command publishes the tag, two commands define one tag differently, a
tag no build step pushes, a value only the running pipeline knows) is :class:`BadInput` naming the lines.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from builder import platforms as P
from builder.errors import BadInput
from builder.platforms import Platform
from builder.resolve.recipe.model import PIPELINE, BuildFiles, Where
from builder.validate import load_yaml, nodes_once

REPOSITORY = "vllm/vllm-openai"
COMMIT = "{commit}"  # $BUILDKITE_COMMIT: the same value in every step of one build
MACHINE = "{machine}"  # $(uname -m): the machine of the step that runs the command
MAX_DEPTH = 8  # scripts calling scripts, functions calling functions
MAX_LINES = 200_000  # the lines read after unrolling loops and calls (a release's scripts: a few thousand)
_VERSION_VARS = ("RELEASE_VERSION",)
_COMMIT_VARS = ("BUILDKITE_COMMIT", "COMMIT")
_MACHINE_WORDS = {"x86_64": "x86_64", "x86": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


@dataclass(frozen=True)
class Op:
    kind: str  # tag | join | push | built
    dest: str
    srcs: tuple[str, ...]
    where: Where


@dataclass
class _Step:
    label: str
    where: Where
    machine: str | None
    machine_why: str
    ops: list[Op] = field(default_factory=list)
    builds: bool = False


@dataclass(frozen=True)
class Published:
    """The image published as :attr:`tag` for one platform: the pipeline step that builds it and the lines
    that say so (the publish commands from the tag back to the step's push)."""

    tag: str
    platform: Platform
    step: str
    step_where: Where
    where: tuple[Where, ...]

    def to_json(self) -> dict:
        return {
            "tag": self.tag,
            "platform": self.platform.name,
            "step": self.step,
            "from": [str(self.step_where), *(str(w) for w in self.where)],
        }


# --------------------------------------------------------------------------- the shell text of the publish
def _logical_lines(text: str, first: int = 1) -> list[tuple[int, str]]:
    """(1-based line, text) of each logical line: continuations joined, comment and blank lines dropped."""
    out: list[tuple[int, str]] = []
    buf, start = "", None
    for i, raw in enumerate(text.split("\n")):
        line = raw.rstrip()
        start = first + i if start is None else start
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        s = (buf + line).strip()
        if s and not s.startswith("#"):
            out.append((start, s))
        buf, start = "", None
    return out


def _split_commands(line: str) -> list[str]:
    """The simple commands of a line: split at ``;``, ``&&``, ``||`` and ``|`` outside quotes."""
    out, cur, quote, i = [], "", None, 0
    while i < len(line):
        c = line[i]
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == ";" or line.startswith(("&&", "||"), i) or c == "|":
            out.append(cur)
            cur = ""
            i += 2 if line.startswith(("&&", "||"), i) else 1
            continue
        cur += c
        i += 1
    out.append(cur)
    return [c.strip() for c in out if c.strip()]


def _subst_commands(s: str) -> str:
    """``$(uname -m)`` → :data:`MACHINE`; any other ``$(…)`` or backquote → ``{?}`` (a value only the running
    pipeline knows)."""
    out, i = "", 0
    while i < len(s):
        if s.startswith("$(", i):
            depth, j = 1, i + 2
            while j < len(s) and depth:
                depth += {"(": 1, ")": -1}.get(s[j], 0)
                j += 1
            body = s[i + 2 : j - 1].strip()
            out += MACHINE if body == "uname -m" else "{?}"
            i = j
            continue
        out += s[i]
        i += 1
    return out


_VAR = re.compile(r"\$\$?(?:\{([#]?)(\w+)(?:([:]?[-#%])([^}]*))?\}|(\w+))")


class _Reader:
    """Unrolls the publish text of one build: functions, ``for`` loops, ``if`` bodies, script calls."""

    def __init__(self, files: Mapping[str, str], version: str) -> None:
        self.files = files
        self.version = version
        self.missing: list[tuple[str, Where]] = []
        self.funcs: dict[str, list[tuple[int, str]]] = {}
        self.budget = MAX_LINES

    def expand(self, s: str, scope: Mapping[str, str | None]) -> str:
        def one(m: re.Match) -> str:
            length, name, op, arg, bare = m.groups()
            name = name or bare
            if name in _VERSION_VARS:
                val: str | None = self.version
            elif name in _COMMIT_VARS:
                val = COMMIT
            else:
                val = scope.get(name)
            if length:
                return "{?}"
            if op in (":-", "-") and not val:
                val = arg
            elif op == "#" and val is not None and val.startswith(arg):
                val = val[len(arg) :]
            elif op == "%" and val is not None and val.endswith(arg):
                val = val[: -len(arg)]
            return val if val is not None else "{?" + name + "}"

        return _VAR.sub(one, _subst_commands(s))

    def run(self, lines: list[tuple[int, str]], path: str, scope: dict, ops: list[Op], depth: int) -> None:
        self.budget -= len(lines)
        if self.budget < 0:
            raise BadInput(f"{path}: the publish commands unroll to more than {MAX_LINES} lines; they are not read.")
        if depth > MAX_DEPTH:
            raise BadInput(f"{path}: scripts or functions call each other deeper than {MAX_DEPTH} levels.")
        i = 0
        while i < len(lines):
            ln, s = lines[i]
            fn = re.match(r"^(?:function\s+)?([A-Za-z_][\w-]*)\s*\(\)\s*\{?$|^function\s+([A-Za-z_][\w-]*)\s*\{?$", s)
            loop = re.match(r"^for\s+(\w+)\s+in\s+(.*?)\s*(?:;\s*do)?$", s)
            if fn or loop:
                end = _block_end(lines, i, path)
                body = lines[i + 1 : end]
                if fn:
                    self.funcs[fn.group(1) or fn.group(2)] = body
                else:
                    for w in self.words(loop.group(2), scope):
                        self.run(body, path, {**scope, loop.group(1): w}, ops, depth + 1)
                i = end + 1
                continue
            for cmd in _split_commands(s):
                self.command(cmd, Where(path, ln), scope, ops, depth)
            i += 1

    def words(self, text: str, scope: Mapping[str, str | None]) -> list[str]:
        try:
            return shlex.split(self.expand(text, scope))
        except ValueError:
            return []

    def command(self, cmd: str, w: Where, scope: dict, ops: list[Op], depth: int) -> None:
        cmd = re.sub(r"^(?:(?:if|then|elif|else|do|!)\s+)+", "", cmd)
        words = self.words(cmd, scope)
        if not words or words[0] in ("fi", "done", "}", "{", "then", "else", "esac"):
            return
        if words[0] in ("local", "export", "readonly", "declare") or re.match(r"^\w+=", words[0]):
            for tok in words[1:] if words[0] in ("local", "export", "readonly", "declare") else words:
                k, eq, v = tok.partition("=")
                if re.fullmatch(r"\w+", k) and k not in _VERSION_VARS + _COMMIT_VARS:
                    scope[k] = v if eq and "{?" not in v else None
                elif not eq:
                    break
            return
        if words[0] in self.funcs:
            args = {str(n): a for n, a in enumerate(words[1:], 1)}
            self.run(self.funcs[words[0]], w.file, {**scope, **args}, ops, depth + 1)
            return
        script = next((x for x in words if re.fullmatch(r"(?:\./)?\.buildkite/[\w./-]+\.sh", x)), None)
        if script is not None:
            self.script(posixpath.normpath(script), words[words.index(script) + 1 :], w, ops, depth)
            return
        if "docker" in words:
            op = _docker_op(words[words.index("docker") + 1 :], w)
            ops += op

    def script(self, path: str, args: list[str], w: Where, ops: list[Op], depth: int) -> None:
        if path not in self.files:
            self.missing.append((path, w))
            return
        scope: dict[str, str | None] = {str(n): a for n, a in enumerate(args, 1)}
        try:
            self.run(_logical_lines(self.files[path]), path, scope, ops, depth + 1)
        except BadInput:
            # a script this reader cannot take apart publishes nothing to the repository unless its text names it
            if re.search(re.escape(REPOSITORY) + r"(?![\w-])", self.files[path]):
                raise


def _block_end(lines: list[tuple[int, str]], i: int, path: str) -> int:
    """The index of the line closing the block (function body or loop) that opens at ``lines[i]``."""
    depth = 0
    for j in range(i, len(lines)):
        s = lines[j][1]
        if re.search(r"(\{|\bdo)$", s) or (re.search(r";\s*do\b", s) and not re.search(r"\bdone$", s)):
            depth += 1
        if re.match(r"^(\}|done)(?![\w-])", s):
            depth -= 1
            if depth == 0:
                return j
    raise BadInput(f"{path}:{lines[i][0]}: the block opened here is never closed.")


def _docker_op(args: list[str], w: Where) -> list[Op]:
    """The publish operation of ``docker ARGS`` (tag, manifest create, imagetools create, push, build -t)."""
    pos = [a for a in args if not a.startswith("-")]
    if args[:1] == ["tag"] and len(pos) == 3:
        return [Op("tag", pos[2], (pos[1],), w)]
    if args[:2] == ["manifest", "create"] and len(pos) >= 3:
        return [Op("join", pos[2], tuple(pos[3:]), w)]
    if args[:1] == ["push"] and len(pos) == 2:
        return [Op("push", pos[1], (), w)]
    if args[:3] == ["buildx", "imagetools", "create"] or args[:1] == ["build"] or args[:2] == ["buildx", "build"]:
        tags, srcs, i = [], [], 0
        while i < len(args):
            a = args[i]
            if a in ("-t", "--tag") and i + 1 < len(args):
                tags.append(args[i + 1])
                i += 2
                continue
            if a.startswith("--tag="):
                tags.append(a.split("=", 1)[1])
            elif not a.startswith("-") and args[0] == "buildx" and i >= 3:
                srcs.append(a)
            i += 1
        if args[0] == "buildx" and args[1] == "imagetools":
            return [Op("join" if len(srcs) > 1 else "tag", t, tuple(srcs), w) for t in tags]
        return [Op("built", t, (), w) for t in tags]
    return []


# --------------------------------------------------------------------------- the pipeline's steps
def _steps(text: str, reader: _Reader) -> list[_Step]:
    doc = load_yaml(text, PIPELINE)  # nesting bounded, aliases walked once
    lines = text.splitlines()
    env = _mapping(doc.get("env")) if isinstance(doc, dict) else {}
    out: list[_Step] = []
    for node in _step_nodes(doc):
        label = str(node.get("label"))
        ln = _label_line(lines, label, out)
        cmds = node.get("commands") or node.get("command") or []
        cmds = [cmds] if isinstance(cmds, str) else [c for c in cmds if isinstance(c, str)]
        step = _Step(label, Where(PIPELINE, ln), *_machine(node, label, cmds))
        scope = {**env, **_mapping(node.get("env"))}
        for c in cmds:
            first = _line_of(lines, c.strip().splitlines()[0] if c.strip() else c, ln)
            step.builds |= bool(re.search(r"\bdocker\s+(?:buildx\s+)?build\b", c))
            reader.run(_logical_lines(c.replace("$$", "$"), first), PIPELINE, dict(scope), step.ops, 0)
        out.append(step)
    return out


def _mapping(value) -> dict[str, str | None]:
    """A YAML ``env:`` as text by name (anything but a mapping: none)."""
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _step_nodes(node):
    """The step mappings of the pipeline document, in document order, each once."""
    for n, _ in nodes_once(node):
        if isinstance(n, dict) and "label" in n and ("commands" in n or "command" in n):
            yield n


def _label_line(lines: list[str], label: str, before: list[_Step]) -> int:
    after = max((s.where.line for s in before if s.label == label), default=0)
    label_re = re.compile(r"label:\s*[\"']?" + re.escape(label) + r"[\"']?\s*$")
    return next((i + 1 for i, ln in enumerate(lines) if i >= after and label_re.search(ln)), 1)


def _line_of(lines: list[str], needle: str, start: int) -> int:
    needle = needle.strip()[:60]
    return next((i + 1 for i in range(start - 1, len(lines)) if needle and needle in lines[i]), start)


def _machine(node: dict, label: str, cmds: list[str]) -> tuple[str | None, str]:
    """(the machine a step's ``$(uname -m)`` is, why): its build's ``--platform``, else the machine its label
    names unless its agent queue names another; None when neither says."""
    m = re.search(r"--platform[ =]linux/(amd64|arm64)", " ".join(cmds))
    if m:
        return _MACHINE_WORDS[m.group(1)], f"its --platform linux/{m.group(1)}"
    queue = str((node.get("agents") or {}).get("queue", "")) if isinstance(node.get("agents"), dict) else ""
    named = [_MACHINE_WORDS[w] for w in re.findall(r"[A-Za-z0-9_]+", label.lower()) if w in _MACHINE_WORDS]
    in_queue = [_MACHINE_WORDS[w] for w in re.split(r"[^a-z0-9]+|_", queue.lower()) if w in _MACHINE_WORDS]
    if len(set(named)) == 1 and not (in_queue and set(in_queue) != set(named)):
        return named[0], f"its label names {named[0]}" + (f" and its agent queue {queue}" if in_queue else "")
    if not named and len(set(in_queue)) == 1:
        return in_queue[0], f"its agent queue {queue}"
    return None, f"neither its label nor its agent queue {queue or '(none)'} names one machine"


# --------------------------------------------------------------------------- from the tag to the build step
def published_images(files: BuildFiles, variant: str = "") -> tuple[Published, ...]:
    """Every platform's image published as ``vllm/vllm-openai:v<files.vllm><variant>`` (see the module doc)."""
    reader = _Reader(files.files, files.vllm)
    steps = _steps(files.text(PIPELINE, "the release pipeline"), reader)
    defs: dict[str, list[Op]] = {}
    for s in steps:
        for op in s.ops:
            if op.kind in ("tag", "join"):
                dest = op.dest.replace(MACHINE, s.machine) if s.machine else op.dest
                srcs = tuple(x.replace(MACHINE, s.machine) if s.machine else x for x in op.srcs)
                defs.setdefault(dest, []).append(Op(op.kind, dest, srcs, op.where))
    tag = f"{REPOSITORY}:v{files.vllm}{variant}"
    if tag not in defs:
        raise _not_published(tag, defs, reader, files.vllm)
    leaves = _leaves(tag, defs, (), 0)
    out: dict[Platform, Published] = {}
    for image, chain in leaves:
        step = _builder_of(image, chain, steps)
        platform = P.from_machine(step.machine or "", where=str(step.where))
        if platform in out and out[platform].step != step.label:
            raise BadInput(
                f"{tag} joins two {platform.name} images: {out[platform].step!r} ({out[platform].step_where}) "
                f"and {step.label!r} ({step.where}), through {', '.join(map(str, chain))}."
            )
        out[platform] = Published(tag, platform, step.label, step.where, chain)
    return tuple(out[p] for p in sorted(out))


def _leaves(tag: str, defs: Mapping[str, list[Op]], chain: tuple[Where, ...], depth: int):
    """(image, the lines from the published tag to it) of each image ``tag`` is made of."""
    if depth > MAX_DEPTH * 4:
        raise BadInput(f"{tag}: the publish commands tag images in a cycle ({', '.join(map(str, chain))}).")
    ops = defs.get(tag)
    if not ops:
        return [(tag, chain)]
    found = {}
    for op in ops:
        got = tuple(x for src in op.srcs for x in _leaves(src, defs, (*chain, op.where), depth + 1))
        found.setdefault(frozenset(img for img, _ in got), (op, got))
    if len(found) > 1:
        lines = "; ".join(f"{op.where}: {' + '.join(sorted(k))}" for k, (op, _g) in found.items())
        raise BadInput(
            f"the release files make {tag} in {len(found)} different ways ({lines}); which one the release "
            "published is not decided by the files.",
            hint="take the manifest from the real image (`build-image base snapshot --image REF -o FILE`).",
        )
    return list(next(iter(found.values()))[1])


def _builder_of(image: str, chain: tuple[Where, ...], steps: list[_Step]) -> _Step:
    """The one build step that pushes ``image``."""
    hits, unsure = [], []
    for s in steps:
        if not s.builds:
            continue
        made = {op.dest for op in s.ops if op.kind in ("push", "built", "tag")}
        if s.machine and image in {m.replace(MACHINE, s.machine) for m in made}:
            hits.append(s)
        elif not s.machine and any(re.fullmatch(re.escape(m).replace(re.escape(MACHINE), r"\w+"), image) for m in made):
            unsure.append(s)
    where = ", ".join(map(str, chain))
    if len(hits) == 1 and not unsure:
        return hits[0]
    if unsure:
        s = unsure[0]
        raise BadInput(
            f"{s.where}: the step {s.label!r} may build {image} (published through {where}), but the machine "
            f"its $(uname -m) names is not decided: {s.machine_why}."
        )
    if not hits:
        raise BadInput(
            f"the release publishes {image} (through {where}), but no build step of {PIPELINE} pushes it; which "
            "image that is is not decided by the files."
        )
    raise BadInput(
        f"{image} (published through {where}) is pushed by {len(hits)} build steps: "
        + ", ".join(f"{s.label!r} ({s.where})" for s in hits)
        + "; which one the release published is not decided by the files."
    )


def _not_published(tag: str, defs: Mapping[str, list[Op]], reader: _Reader, vllm: str) -> BadInput:
    prefix = f"{REPOSITORY}:v{vllm}"
    variants = sorted(
        {
            t[len(prefix) :]
            for t in defs
            if t.startswith(prefix) and not re.search(r"-(x86_64|aarch64)", t[len(prefix) :])
        }
    )
    said = f" It publishes {', '.join(prefix + v for v in variants)}." if variants else ""
    missing = "".join(f" {w} calls {p}, which the files lack." for p, w in reader.missing)
    return BadInput(
        f"no command in {PIPELINE} or the scripts it calls publishes {tag}.{said}{missing}",
        hint=(
            f"pick one with --variant ({', '.join(v.lstrip('-') for v in variants if v)})."
            if any(variants)
            else "take the manifest from the real image (`build-image base snapshot --image REF -o FILE`)."
        ),
    )


def normalise_variant(variant: str | None) -> str:
    """``cu129``/``-cu129`` → ``-cu129``; None or empty → ``""`` (the plain tag)."""
    v = (variant or "").strip()
    if not v:
        return ""
    if not re.fullmatch(r"-?[A-Za-z0-9][A-Za-z0-9._-]{0,63}", v):
        raise BadInput(f"--variant {v[:80]!r} is not a tag suffix (letters, digits, '.', '_', '-'; e.g. cu129).")
    return v if v.startswith("-") else f"-{v}"


def publishing_step(files: BuildFiles, platform: Platform, variant: str = "") -> Published:
    """The build step whose image is published for ``platform`` under the release's tag (+ ``variant``), or
    :class:`BadInput` naming what the release publishes."""
    pubs = published_images(files, variant)
    for p in pubs:
        if p.platform == platform:
            return p
    tag = f"{REPOSITORY}:v{files.vllm}{variant}"
    said = ", ".join(f"{p.platform.name} ({p.step_where}, through {', '.join(map(str, p.where))})" for p in pubs)
    raise BadInput(
        f"vllm {files.vllm} does not publish {tag} for {platform.name}: its release pipeline publishes it for {said}.",
        hint="build for a platform the release publishes (--platform " + ",".join(p.platform.name for p in pubs) + ").",
    )
