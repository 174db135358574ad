"""The release's build files as structure: the release pipeline's image step (target, Dockerfile,
build args) and the Dockerfile's instructions and stages (pure)."""

from __future__ import annotations

import io
import re
import shlex
from dataclasses import dataclass

from builder.errors import BadInput
from builder.resolve.recipe.harmless import heredoc_marks, lift_line
from builder.resolve.recipe.model import DOCKERFILE, PIPELINE, RELEASE_STEP, Derived, Where
from builder.resolve.recipe.shell import Unknown
from builder.validate import load_yaml, nodes_once


# --------------------------------------------------------------------------- pipeline
@dataclass(frozen=True)
class ReleaseStep:
    label: Derived
    target: str
    dockerfile: str
    build_args: dict[str, Derived]


def release_step(text: str, path: str = PIPELINE, label: str = RELEASE_STEP) -> ReleaseStep:
    """The release-image step of the pipeline: its target, Dockerfile and build args (pure)."""
    doc = load_yaml(text, path)
    env = {k: str(v) for k, v in ((doc or {}).get("env") or {}).items()} if isinstance(doc, dict) else {}
    step = _find_step(doc, label)
    if step is None:
        raise BadInput(f"{path} has no step labelled {label!r} (the step that builds the published image).")
    lines = text.splitlines()
    label_re = re.compile(r"label:\s*[\"']?" + re.escape(label) + r"[\"']?\s*$")
    label_line = next((i + 1 for i, ln in enumerate(lines) if label_re.search(ln)), 1)
    env.update({k: str(v) for k, v in (step.get("env") or {}).items()})
    cmds = step.get("commands") or step.get("command") or []
    if isinstance(cmds, str):
        cmds = [cmds]
    build = next((c for c in cmds if isinstance(c, str) and re.search(r"\bdocker\s+build\b", c)), None)
    if build is None:
        raise BadInput(f"{path}:{label_line}: step {label!r} runs no `docker build`.")
    joined = re.sub(r"\\\n", " ", build)
    joined = re.sub(r"\$\(bash [^)]*docker-build-metadata-args\.sh[^)]*\)", " ", joined)  # image labels only
    joined = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), m.group(0)), joined)
    try:
        argv = shlex.split(joined)
    except ValueError as exc:
        raise BadInput(f"{path}:{label_line}: cannot split the docker build command: {exc}.") from None
    args: dict[str, Derived] = {}
    target, dockerfile = None, "Dockerfile"
    i = argv.index("build") + 1 if "build" in argv else 0
    while i < len(argv):
        a = argv[i]
        if a in ("--build-arg", "--target", "-f", "--file") and i + 1 < len(argv):
            val = argv[i + 1]
            i += 2
        elif a.startswith("--build-arg=") or a.startswith("--target=") or a.startswith("--file="):
            a, val = a.split("=", 1)
            i += 1
        else:
            i += 1
            continue
        if a == "--build-arg":
            k, _, v = val.partition("=")
            ln = _line_after(lines, label_line, f"--build-arg {k}=")
            args[k] = Derived(v, (Where(path, ln),))
        elif a == "--target":
            target = val
        else:
            dockerfile = val
    if target is None:
        raise BadInput(f"{path}:{label_line}: step {label!r} gives no --target.")
    return ReleaseStep(Derived(label, (Where(path, label_line),)), target, dockerfile, args)


def _find_step(node, label: str):
    """The first mapping (depth first, in document order) whose ``label`` is ``label``."""
    return next((n for n, _ in nodes_once(node) if isinstance(n, dict) and n.get("label") == label), None)


def _line_after(lines: list[str], start: int, needle: str) -> int:
    for i in range(start - 1, len(lines)):
        if needle in lines[i]:
            return i + 1
    return start


# --------------------------------------------------------------------------- Dockerfile
@dataclass(frozen=True)
class Instruction:
    op: str
    value: str
    line: int  # 1-based start line
    end: int
    heredocs: tuple[tuple[str, str], ...] = ()  # a RUN's heredoc bodies: (the path its command reads, body)
    error: str = ""  # a RUN the file does not let the reader take apart (a heredoc never closed)


@dataclass(frozen=True)
class Stage:
    name: str | None
    base: str
    line: int
    instructions: tuple[Instruction, ...]


_SHELL_HEAD = re.compile(r"(ba)?sh( -\w*)*")


def _lift_heredocs(text: str, path: str = DOCKERFILE) -> tuple[str, dict[int, Instruction]]:
    """BuildKit's heredocs (``RUN <<EOF``, ``RUN python3 <<'EOF'``, ``RUN cmd <<-EOF``, ``COPY <<EOF``), which
    dockerfile-parse reads as one instruction per line: each body is lifted out (its lines left blank, so
    every later line keeps its number).  A RUN's is returned by its 1-based line: a bare or shell heredoc
    becomes the script the RUN runs; another command gets the body as its input (``< /dev/heredoc/…``).  A
    heredoc never closed is recorded on its RUN (refused where the walk reaches it, acceptable) (pure)."""
    lines = text.split("\n")
    runs: dict[int, Instruction] = {}
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*(RUN|COPY|ADD)\s", lines[i], re.IGNORECASE)
        if m is None or not heredoc_marks(lines[i]):
            i += 1
            continue
        first = i
        try:
            i, bodies = lift_line(lines, i, path)
        except Unknown as exc:
            bodies, error = {}, str(exc)
            for j in range(first + 1, len(lines)):
                lines[j] = ""
            i = len(lines)
        else:
            error = ""
        head = lines[first]
        if m.group(1).upper() != "RUN":
            continue
        cmd = re.sub(r"^\s*RUN\s+", "", head, flags=re.IGNORECASE)
        flags = " ".join(w for w in cmd.split() if w.startswith("--"))
        rest = " ".join(w for w in cmd.split() if not w.startswith("--"))
        shell = re.fullmatch(r"(?:" + _SHELL_HEAD.pattern + r"\s+)?<\s+(\S+)", rest)
        if shell and len(bodies) == 1:
            value, docs = bodies[shell.group(3)], ()
        else:
            value, docs = rest, tuple(bodies.items())
        runs[first + 1] = Instruction("RUN", (flags + " " if flags else "") + value, first + 1, first + 1, docs, error)
        lines[first] = head[: len(head) - len(cmd)] + (flags + " " if flags else "") + "true"
    return "\n".join(lines), runs


def parse_dockerfile(text: str) -> tuple[tuple[Instruction, ...], tuple[Stage, ...]]:
    """(instructions before the first FROM, the stages) of a Dockerfile (pure)."""
    from dockerfile_parse import DockerfileParser

    text, heredocs = _lift_heredocs(text)
    p = DockerfileParser(fileobj=io.BytesIO(text.encode()), env_replace=False)
    pre: list[Instruction] = []
    stages: list[list] = []
    for d in p.structure:
        if d["instruction"] == "COMMENT":
            continue
        ins = Instruction(d["instruction"].upper(), d["value"], d["startline"] + 1, d["endline"] + 1)
        if ins.op == "RUN" and ins.line in heredocs:
            ins = heredocs[ins.line]
        if ins.op == "FROM":
            parts = [x for x in ins.value.split() if not x.startswith("--")]  # FROM --platform=... is not the base
            name = parts[2] if len(parts) >= 3 and parts[1].lower() == "as" else None
            stages.append([name, parts[0] if parts else "", ins.line, []])
        elif stages:
            stages[-1][3].append(ins)
        else:
            pre.append(ins)
    return tuple(pre), tuple(Stage(n, b, ln, tuple(i)) for n, b, ln, i in stages)


# a FROM operand with no registry path, tag, digest or variable (`vllm-openai-base`): in a release Dockerfile it
# names a stage; one that the file lacks is a missing stage, not an image on Docker Hub's library
_BARE_STAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


def stage_chain(stages: tuple[Stage, ...], target: str, path: str = DOCKERFILE) -> list[Stage]:
    """The target stage and the stages it is built FROM, root first (pure)."""
    by = {s.name: s for s in stages if s.name}
    if target not in by:
        names = ", ".join(s.name for s in stages if s.name) or "none"
        raise BadInput(f"{path} has no stage {target!r} (stages: {names}).")
    chain: list[Stage] = []
    cur: Stage | None = by[target]
    while cur is not None:
        if cur in chain:
            raise BadInput(f"{path}:{cur.line}: stage {cur.name!r} is built from itself.")
        chain.append(cur)
        nxt = by.get(cur.base)
        if nxt is None and _BARE_STAGE_NAME.match(cur.base):
            names = ", ".join(s.name for s in stages if s.name)
            raise BadInput(
                f"{path}:{cur.line}: stage {cur.name!r} is built FROM {cur.base!r}, which is no stage of "
                f"{path} (stages: {names}).",
                hint="a bare name without registry, tag or variable is read as a stage the target needs; "
                "the release's image is built from nvidia/cuda:... through ${FINAL_BASE_IMAGE}.",
            )
        cur = nxt
    return list(reversed(chain))


def split_arg(value: str) -> list[tuple[str, str | None]]:
    out = []
    for tok in shlex.split(value):
        k, eq, v = tok.partition("=")
        out.append((k, v if eq else None))
    return out
