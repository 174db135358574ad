"""A release's base recipe, derived from its own build files (the sdist's docker/Dockerfile,
release pipeline and requirements): what the published ``vllm/vllm-openai:vX`` image is built
from, and every install step it runs, each value with the file and line it came from.

Pure: :func:`derive` takes the files' text (a :class:`BuildFiles`) and returns a :class:`Recipe`;
nothing here reads the network or the disk (``builder.resolve.sdist`` brings the files).

How the files are read:

* ``docker/Dockerfile`` is split into instructions by ``dockerfile-parse`` (containerbuildsystem;
  instruction, value, start and end line, comment lines inside a continued RUN dropped the way
  BuildKit drops them).  Its own ARG/ENV substitution is not used: build args from the pipeline
  override ARG defaults, which it does not model.
* The release pipeline (``.buildkite/release-pipeline.yaml``): the step labelled
  :data:`RELEASE_STEP` builds the image that is published as ``vllm/vllm-openai:vX`` (x86_64);
  its ``docker build`` command gives the target and the ``--build-arg`` overrides, with the
  pipeline's ``env`` expanded.
* The final stage for the target and the stages it is built ``FROM`` are walked in order; ARG
  values are resolved as BuildKit does (global ARG defaults, build args win, a stage's bare
  ``ARG X`` brings the global value in).
* RUN lines that install, uninstall or freeze Python packages, or write the file an ``ENV
  UV_OVERRIDE`` names, are interpreted by a small shell reader (:func:`run_script`): ``;``,
  ``&&``, ``||`` (the left side; the right side is recorded as the fallback), ``( )``,
  ``if/elif/else/fi`` on ``[ ]`` tests, variable assignments, ``echo/touch > file``, ``uv pip
  freeze > f`` + ``grep -E '^(a|b)==' f > g`` (constraints from what is installed), and the
  ``$(...)`` forms in :data:`SUBSTITUTIONS`.  Anything else inside such a RUN that would decide an
  install is refused (:class:`builder.errors.BadInput` naming the file and line), never guessed.
"""

from __future__ import annotations

import io
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from builder.errors import BadInput
from builder.validate import load_toml

TARGET = "vllm-openai"
RELEASE_STEP = "Build release image - x86_64 - CUDA 13.0"
DOCKERFILE = "docker/Dockerfile"
PIPELINE = ".buildkite/release-pipeline.yaml"
ARCH = "x86_64"
TARGETPLATFORM = "linux/amd64"

# glibc of each Ubuntu release (the version of its libc6 package: jammy 2.35, noble 2.39, focal 2.31):
# the final base image's libc, which decides the manylinux platform the image can install.
UBUNTU_GLIBC = {"20.04": "2.31", "22.04": "2.35", "24.04": "2.39"}
UBUNTU_GLIBC_SOURCE = "Ubuntu's libc6 package of that release (focal 2.31, jammy 2.35, noble 2.39)"

# Wheels the image builds from source in another stage: the distributions they install.
SOURCE_BUILDS = {
    "ep_kernels/dist/*.whl": ("deep-ep", "DeepEP built from git in stage extensions-build "
                                         "(tools/ep_kernels/install_python_libraries.sh)"),
}
# Commands inside an interpreted RUN that bring files from outside the Python indexes.
OFF_INDEX_COMMANDS = {
    ("flashinfer", "download-kernels"): "FlashInfer's precompiled kernels (flashinfer download-kernels)",
}


# --------------------------------------------------------------------------- provenance
@dataclass(frozen=True)
class Where:
    """A file inside the sdist and a 1-based line."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Derived:
    """One value of the recipe and where it came from (``rule``: how it was derived, when not read verbatim)."""

    value: str
    where: tuple[Where, ...]
    rule: str = ""

    def to_json(self) -> dict:
        d = {"value": self.value, "from": [str(w) for w in self.where]}
        if self.rule:
            d["rule"] = self.rule
        return d


@dataclass(frozen=True)
class SdistRef:
    filename: str
    sha256: str


@dataclass(frozen=True)
class BuildFiles:
    """The build files of one release: text by path inside the sdist (top folder stripped)."""

    vllm: str
    sdist: SdistRef
    files: Mapping[str, str]

    def text(self, path: str, what: str) -> str:
        if path not in self.files:
            raise BadInput(f"{self.sdist.filename} has no {path} ({what}).")
        return self.files[path]


# --------------------------------------------------------------------------- recipe
@dataclass(frozen=True)
class Step:
    """One install (or uninstall) the image runs, in Dockerfile order.

    ``replay``: ``index`` (resolved from the Python index), ``off-index`` (a wheel from another
    index or a URL: name and version known where the files say them, files unavailable),
    ``source-build`` (a wheel built from source inside the image build), ``uninstall``.
    """

    n: int
    stage: str
    where: Where
    replay: str
    installer: str = "uv"  # uv | pip
    requirements: tuple[str, ...] = ()
    requirement_files: tuple[str, ...] = ()
    constraint_files: tuple[str, ...] = ()
    constrain_installed: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    override_where: tuple[Where, ...] = ()
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    when_installed: str | None = None
    fallback: str | None = None
    names: tuple[str, ...] = ()  # off-index / source-build: the distributions it installs
    note: str = ""
    file_indexes: tuple[str, ...] = ()  # index options inside the requirement files: "URL (file:line)"

    def to_json(self) -> dict:
        d: dict = {"n": self.n, "stage": self.stage, "from": str(self.where), "replay": self.replay,
                   "installer": self.installer}
        for k in ("requirements", "requirement_files", "constraint_files", "constrain_installed", "overrides",
                  "extra_index_urls", "file_indexes", "flags", "names"):
            v = getattr(self, k)
            if v:
                d[k] = list(v)
        if self.override_where:
            d["overrides_from"] = [str(w) for w in self.override_where]
        for k in ("index_url", "when_installed", "fallback", "note"):
            v = getattr(self, k)
            if v:
                d[k] = v
        return d


@dataclass(frozen=True)
class Recipe:
    vllm: str
    sdist: SdistRef
    target: str
    pipeline_step: Derived
    stages: tuple[Derived, ...]  # "name FROM base" from the root of the chain to the target
    build_args: tuple[tuple[str, Derived], ...]
    final_base_image: Derived
    os: Derived
    glibc: Derived
    cuda: Derived
    python: Derived
    site_packages: Derived
    steps: tuple[Step, ...]
    os_packages: tuple[Derived, ...] = ()
    off_index_fetches: tuple[Derived, ...] = ()
    # the UV_OVERRIDE pins the published image keeps in its environment: every later `uv pip install` in it
    # (an overlay too) resolves with them
    image_overrides: tuple[Derived, ...] = ()

    @property
    def image(self) -> str:
        return f"vllm/vllm-openai:v{self.vllm}"

    @property
    def platform(self) -> str:
        return f"{ARCH}-manylinux_{self.glibc.value.replace('.', '_')}"

    @property
    def arch(self) -> str:
        return ARCH

    def lacks(self) -> dict[str, list[str]]:
        """What a replay from the Python index knowingly cannot hold (pure)."""
        off = [f"{', '.join(s.names) or '?'} ({s.note}; {self.sdist.filename} {s.where})"
               for s in self.steps if s.replay == "off-index"]
        src = [f"{', '.join(s.names) or '?'} ({s.note}; {s.where})" for s in self.steps if s.replay == "source-build"]
        idx = sorted({u for s in self.steps if s.replay == "index"
                      for u in (*s.extra_index_urls, *([s.index_url] if s.index_url else []),
                                *(x.split(" (")[0] for x in s.file_indexes))})
        return {
            "off_index": off + [f"{d.value} ({', '.join(map(str, d.where))})" for d in self.off_index_fetches],
            "source_builds": src,
            "other_indexes": [f"{u}: not asked (the replay resolves from the Python index only): a file only it "
                              "serves is absent, or replaced by the index's build of the same version" for u in idx],
            "os_packages": [d.value for d in self.os_packages],
        }

    def unversioned_names(self) -> dict[str, str]:
        """Distributions the image holds that a replay from the index cannot version: name → reason (pure)."""
        out: dict[str, str] = {}
        for s in self.steps:
            if s.replay in ("off-index", "source-build"):
                for n in s.names:
                    out[n] = f"{s.replay}: {s.note} ({self.sdist.filename} {s.where})"
        return out

    def to_json(self) -> dict:
        return {
            "vllm": self.vllm,
            "image": self.image,
            "sdist": {"filename": self.sdist.filename, "sha256": self.sdist.sha256},
            "target": self.target,
            "pipeline_step": self.pipeline_step.to_json(),
            "stages": [s.to_json() for s in self.stages],
            "build_args": {k: v.to_json() for k, v in self.build_args},
            "final_base_image": self.final_base_image.to_json(),
            "os": self.os.to_json(),
            "glibc": self.glibc.to_json(),
            "cuda": self.cuda.to_json(),
            "python": self.python.to_json(),
            "site_packages": self.site_packages.to_json(),
            "platform": self.platform,
            "steps": [s.to_json() for s in self.steps],
            "os_packages": [d.to_json() for d in self.os_packages],
            "off_index_fetches": [d.to_json() for d in self.off_index_fetches],
            "image_overrides": [d.to_json() for d in self.image_overrides],
            "lacks": self.lacks(),
        }


# --------------------------------------------------------------------------- pipeline
@dataclass(frozen=True)
class ReleaseStep:
    label: Derived
    target: str
    dockerfile: str
    build_args: dict[str, Derived]


def release_step(text: str, path: str = PIPELINE, label: str = RELEASE_STEP) -> ReleaseStep:
    """The release-image step of the pipeline: its target, Dockerfile and build args (pure)."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BadInput(f"{path} is not valid YAML: {exc}.") from None
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
    if isinstance(node, dict):
        if node.get("label") == label:
            return node
        for v in node.values():
            hit = _find_step(v, label)
            if hit is not None:
                return hit
    elif isinstance(node, list):
        for v in node:
            hit = _find_step(v, label)
            if hit is not None:
                return hit
    return None


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


@dataclass(frozen=True)
class Stage:
    name: str | None
    base: str
    line: int
    instructions: tuple[Instruction, ...]


def parse_dockerfile(text: str) -> tuple[tuple[Instruction, ...], tuple[Stage, ...]]:
    """(instructions before the first FROM, the stages) of a Dockerfile (pure)."""
    from dockerfile_parse import DockerfileParser

    p = DockerfileParser(fileobj=io.BytesIO(text.encode()), env_replace=False)
    pre: list[Instruction] = []
    stages: list[list] = []
    for d in p.structure:
        if d["instruction"] == "COMMENT":
            continue
        ins = Instruction(d["instruction"].upper(), d["value"], d["startline"] + 1, d["endline"] + 1)
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
            raise BadInput(f"{path}:{cur.line}: stage {cur.name!r} is built FROM {cur.base!r}, which is no stage of "
                           f"{path} (stages: {names}).",
                           hint="a bare name without registry, tag or variable is read as a stage the target needs; "
                                "the release's image is built from nvidia/cuda:... through ${FINAL_BASE_IMAGE}.")
        cur = nxt
    return list(reversed(chain))


def _split_arg(value: str) -> list[tuple[str, str | None]]:
    out = []
    for tok in shlex.split(value):
        k, eq, v = tok.partition("=")
        out.append((k, v if eq else None))
    return out


# --------------------------------------------------------------------------- variables
@dataclass
class Var:
    value: str
    where: tuple[Where, ...]
    env: bool = False  # an ENV (inherited by the stages built FROM this one), not an ARG
    default: str | None = None  # a global ARG's default text (its provenance follows the ARGs it uses)


class Unknown(Exception):
    """A value the files do not determine."""


SUBSTITUTIONS: list[tuple[str, re.Pattern, Callable[[re.Match, Callable[[str], str]], str]]] = []


def _substitution(name: str, pattern: str):
    def deco(fn):
        SUBSTITUTIONS.append((name, re.compile(pattern), fn))
        return fn
    return deco


@_substitution("major", r"^echo \$\{?(\w+)\}? \| cut -d\. -f1$")
def _major(m, get):
    return get(m.group(1)).split(".")[0]


@_substitution("major.minor without the dot", r"^echo \$\{?(\w+)\}? \| cut -d\. -f1,2 \| tr -d '\.'$")
def _majmin_nodot(m, get):
    return "".join(get(m.group(1)).split(".")[:2])


@_substitution("major-minor", r"^echo \$\{?(\w+)\}? \| cut -d\. -f1,2 \| tr '\.' '-'$")
def _majmin_dash(m, get):
    return "-".join(get(m.group(1)).split(".")[:2])


@_substitution("major.minor", r"^echo \$\{?(\w+)\}? \| cut -d\. -f1,2$")
def _majmin(m, get):
    return ".".join(get(m.group(1)).split(".")[:2])


@_substitution("installed version", r"""^python3 -c "import importlib\.metadata as m; """
                                    r"""print\(m\.version\('([\w.-]+)'\)\)"( 2>/dev/null)?( \|\| true)?$""")
def _installed(m, get):
    return INSTALLED.format(m.group(1))


INSTALLED = "{{installed:{}}}"
_INSTALLED_RE = re.compile(r"\{installed:([\w.-]+)\}")


def substitute(cmd: str, get: Callable[[str], str]) -> str:
    """The value of one ``$(cmd)`` among :data:`SUBSTITUTIONS` (pure); others raise :class:`Unknown`."""
    cmd = " ".join(cmd.split())
    for _name, pat, fn in SUBSTITUTIONS:
        m = pat.match(cmd)
        if m:
            return fn(m, get)
    raise Unknown(f"$({cmd})")


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
            cur.append(raw[i + 1:j])
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
        return substitute(raw[i + 2:j], get), j + 1
    if raw.startswith("${", i):
        j = raw.index("}", i)
        body = raw[i + 2:j]
        m = re.fullmatch(r"(\w+)(?:(:-|:\+|%%|%|-)(.*))?", body)
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
_OPS = ("&&", "||", ";;", "2>&1", "2>/dev/null", ">>", "2>", ";", "|", "(", ")", ">", "<", "&")
_KEYWORDS = {"if", "then", "elif", "else", "fi", "for", "while", "do", "done", "case", "esac", "{", "}", "!"}


def tokenize(script: str) -> list[str]:
    """Raw shell words and operators (quotes kept, for :func:`expand`); newlines are ``;`` (pure)."""
    toks: list[str] = []
    i, n = 0, len(script)
    cur: list[str] = []

    def flush():
        if cur:
            toks.append("".join(cur))
            cur.clear()

    while i < n:
        c = script[i]
        if c in " \t":
            flush()
            i += 1
            continue
        if c == "\n":
            flush()
            toks.append(";")
            i += 1
            continue
        if c == "\\" and i + 1 < n:
            if script[i + 1] == "\n":
                i += 2
                continue
            cur.append(script[i:i + 2])
            i += 2
            continue
        if c == "'":
            j = script.index("'", i + 1)
            cur.append(script[i:j + 1])
            i = j + 1
            continue
        if c == '"':
            j = i + 1
            while script[j] != '"':
                j += 2 if script[j] == "\\" else 1
            cur.append(script[i:j + 1])
            i = j + 1
            continue
        if script.startswith("$(", i):
            j = _close(script, i + 1)
            cur.append(script[i:j + 1])
            i = j + 1
            continue
        if script.startswith("${", i):
            j = script.index("}", i)
            cur.append(script[i:j + 1])
            i = j + 1
            continue
        if c == "#" and not cur:
            while i < n and script[i] != "\n":
                i += 1
            continue
        op = next((o for o in _OPS if script.startswith(o, i)), None)
        if op and not (op in ("2>", "2>&1", "2>/dev/null") and cur):
            flush()
            toks.append(op)
            i += len(op)
            continue
        cur.append(c)
        i += 1
    flush()
    return toks


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

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise Unknown(f"expected {want!r}, found {tok!r}")
        self.i += 1
        return tok

    def seq(self, stop: tuple[str, ...] = ()) -> Seq:
        items = []
        while True:
            while self.peek() == ";":
                self.i += 1
            tok = self.peek()
            if tok is None or tok in stop:
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
        if tok in ("for", "while", "case", "{"):
            end = {"for": "done", "while": "done", "case": "esac", "{": "}"}[tok]
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
            return Opaque(" ".join(self.t[start:self.i]))
        words, redirects = [], []
        while True:
            tok = self.peek()
            if tok is None or tok in ("&&", "||", ";", "|", ")", "&") or tok in stop and not words:
                break
            if tok in (">", ">>", "<", "2>"):
                self.take()
                redirects.append((tok, self.take()))
                continue
            if tok in ("2>&1", "2>/dev/null"):
                self.take()
                continue
            if tok in ("then", "fi", "else", "elif", "do", "done") and not words:
                break
            words.append(self.take())
        return Cmd(words, redirects)


def parse_script(script: str) -> Seq:
    p = _Parser(tokenize(script))
    seq = p.seq()
    if p.peek() is not None:
        raise Unknown(f"unexpected {p.peek()!r}")
    return seq


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


# --------------------------------------------------------------------------- derive
def _getter(table: Mapping[str, Var]) -> Callable[[str], str]:
    def get(name: str) -> str:
        if name in table:
            return table[name].value
        raise Unknown(f"${name}")
    return get


def global_args(pre: Iterable[Instruction], build_args: Mapping[str, Derived], dpath: str) -> dict[str, Var]:
    """The ARGs before the first FROM: defaults (which may use earlier ARGs), a build arg wins (pure)."""
    glob: dict[str, Var] = {}
    for ins in pre:
        if ins.op != "ARG":
            continue
        for k, v in _split_arg(ins.value):
            if k in build_args:
                glob[k] = Var(build_args[k].value, build_args[k].where)
            elif v is not None:
                try:
                    val = "".join(expand(v, _getter(glob), split=False))
                except Unknown:
                    val = ""
                glob[k] = Var(val, (Where(dpath, ins.line),), default=v)
            else:
                glob.setdefault(k, Var("", (Where(dpath, ins.line),)))
    return glob


def _sources_of(expr: str, table: Mapping[str, Var]) -> list[Where]:
    """Where the variables of ``expr`` got their values, following ARG defaults that use other ARGs."""
    out: list[Where] = []
    for name in re.findall(r"\$\{?(\w+)", expr):
        if name in table:
            out += table[name].where
            out += _sources_of(table[name].default or "", table)
    return out


@dataclass(frozen=True)
class _BaseFacts:
    final_base_image: Derived
    os: Derived
    glibc: Derived
    cuda: Derived
    python: Derived


def base_facts(root: Stage, glob: Mapping[str, Var], dpath: str) -> _BaseFacts:
    """The final base image and what it decides: OS, glibc (:data:`UBUNTU_GLIBC`), CUDA, Python (pure)."""
    try:
        image = "".join(expand(root.base, _getter(glob), split=False))
    except Unknown as exc:
        raise BadInput(f"{dpath}:{root.line}: the base image {root.base} of stage {root.name!r} is not "
                       f"determined ({exc}).") from None
    where = tuple(dict.fromkeys([Where(dpath, root.line), *_sources_of(root.base, glob)]))
    m = re.search(r"ubuntu(\d+\.\d+)", image)
    if not m:
        raise BadInput(f"{dpath}:{root.line}: the final base image {image} names no Ubuntu release.")
    ubuntu = m.group(1)
    if ubuntu not in UBUNTU_GLIBC:
        raise BadInput(f"{dpath}:{root.line}: Ubuntu {ubuntu} of {image} is not in the glibc table "
                       f"({', '.join(UBUNTU_GLIBC)}).")
    for name in ("CUDA_VERSION", "PYTHON_VERSION"):
        if name not in glob:
            raise BadInput(f"{dpath} declares no global ARG {name}.")
    cv, pv = glob["CUDA_VERSION"], glob["PYTHON_VERSION"]
    return _BaseFacts(
        final_base_image=Derived(image, where),
        os=Derived(f"Ubuntu {ubuntu}", where, rule=f"the Ubuntu release in the tag of {image}"),
        glibc=Derived(UBUNTU_GLIBC[ubuntu], where, rule=UBUNTU_GLIBC_SOURCE),
        cuda=Derived(".".join(cv.value.split(".")[:2]), cv.where, rule=f"major.minor of CUDA_VERSION={cv.value}"),
        python=Derived(pv.value, pv.where),
    )


@dataclass
class _Walk:
    """What walking the stage chain collects."""

    files: BuildFiles
    dpath: str
    build_args: Mapping[str, Derived]
    glob: Mapping[str, Var]
    steps: list[Step] = field(default_factory=list)
    fetches: list[Derived] = field(default_factory=list)
    apt: dict[str, Where] = field(default_factory=dict)
    written: dict[str, tuple[str, Where]] = field(default_factory=dict)
    overrides: tuple[tuple[str, ...], tuple[Where, ...]] = ((), ())
    python_line: Where | None = None

    def arg(self, value: str, w: Where, local: dict[str, Var]) -> None:
        for k, v in _split_arg(value):
            if k in self.build_args:
                local[k] = Var(self.build_args[k].value, self.build_args[k].where)
            elif v is None:
                local[k] = self.glob[k] if k in self.glob else local.get(k, Var("", (w,)))
            else:
                try:
                    local[k] = Var("".join(expand(v, _getter(local), split=False)), (w,))
                except Unknown:
                    local[k] = Var("", (w,))

    def env(self, value: str, w: Where, local: dict[str, Var]) -> None:
        for k, v in _env_pairs(value):
            try:
                val = "".join(expand(v, _getter(local), split=False))
            except Unknown:
                val = v
            local[k] = Var(val, (w,), env=True)
            if k == "UV_OVERRIDE":
                content = self.written.get(val)
                if content is None:
                    raise BadInput(f"{w}: ENV UV_OVERRIDE={val} names a file the Dockerfile does not write.")
                self.overrides = (tuple(ln.strip() for ln in content[0].splitlines() if ln.strip()), (content[1], w))

    def run(self, st: Stage, value: str, w: Where, local: dict[str, Var], copies: Mapping[str, str]) -> None:
        script_mounts, binds, script = _mounts(value)
        for pkg in _apt_packages(script, _getter(local)):
            self.apt.setdefault(pkg, w)
        if re.search(r"update-alternatives --install /usr/bin/python3", script):
            self.python_line = w
        if re.search(r"curl[^|;&]*\$\{?GET_PIP_URL\}?[^|;&]*\|\s*python", script):
            url = local.get("GET_PIP_URL", Var("", ())).value or "GET_PIP_URL"
            self.fetches.append(Derived(f"pip (get-pip.py from {url})", (w,)))
        wants = bool(re.search(r"\b(uv pip|pip install|pip uninstall)\b", script)) or any(
            p in script for p in _override_targets(st.instructions))
        if not wants and not any(" ".join(k) in script for k in OFF_INDEX_COMMANDS):
            return
        ctx = _Ctx(vars=dict(local), files=self.written, mounts={**copies, **script_mounts}, binds=binds,
                   stage=st.name or "", where=w, steps=self.steps, overrides=self.overrides, fetches=self.fetches,
                   sdist_files=frozenset(self.files.files))
        try:
            _run(parse_script(script), ctx)
        except Unknown as exc:
            raise BadInput(f"{self.files.sdist.filename}: {w}: cannot interpret the RUN line ({exc}); the "
                           "recipe reader does not guess an install step.") from None
        except (ValueError, IndexError) as exc:
            raise BadInput(f"{self.files.sdist.filename}: {w}: cannot read the RUN line ({exc}).") from None

    def stage(self, st: Stage, local: dict[str, Var]) -> None:
        copies: dict[str, str] = {}
        for ins in st.instructions:
            w = Where(self.dpath, ins.line)
            if ins.op == "ARG":
                self.arg(ins.value, w, local)
            elif ins.op == "ENV":
                self.env(ins.value, w, local)
            elif ins.op == "COPY":
                parts = [p for p in shlex.split(ins.value) if not p.startswith("--")]
                if len(parts) == 2 and "--from" not in ins.value:
                    copies[parts[1]] = parts[0]
            elif ins.op == "RUN":
                self.run(st, ins.value, w, local, copies)


def _numbered(steps: list[Step], files: BuildFiles) -> tuple[Step, ...]:
    """Steps numbered in order, each with the index options of its requirement files (which must exist)."""
    out = []
    for i, s in enumerate(steps):
        opts = []
        for rf in (*s.requirement_files, *s.constraint_files):
            if rf not in files.files:
                raise BadInput(f"{files.sdist.filename} has no {rf} (step {i + 1}, {s.where}, installs it).")
            opts += [f"{v} ({w})" for _o, v, w in requirement_file_options(files.files, rf)]
        out.append(replace(s, n=i + 1, file_indexes=tuple(dict.fromkeys(opts))))
    return tuple(out)


def derive(files: BuildFiles) -> Recipe:
    """The recipe of ``files.vllm``'s published image (pure; :class:`BadInput` on what the files lack, and on
    text the readers cannot take apart: an unbalanced quote, a malformed instruction)."""
    try:
        return _derive(files)
    except (ValueError, IndexError, KeyError) as exc:
        raise BadInput(f"{files.sdist.filename}: its build files cannot be read "
                       f"({type(exc).__name__}: {exc}).") from None


def _derive(files: BuildFiles) -> Recipe:
    step = release_step(files.text(PIPELINE, "the release pipeline"))
    if step.target != TARGET:
        raise BadInput(f"{PIPELINE}:{step.label.where[0].line}: step {RELEASE_STEP!r} builds target {step.target!r}, "
                       f"not {TARGET!r}.")
    dpath = step.dockerfile if step.dockerfile != "Dockerfile" else DOCKERFILE
    pre, stages = parse_dockerfile(files.text(dpath, f"the Dockerfile the step {RELEASE_STEP!r} builds"))
    chain = stage_chain(stages, TARGET, dpath)
    glob = global_args(pre, step.build_args, dpath)
    facts = base_facts(chain[0], glob, dpath)
    walk = _Walk(files, dpath, step.build_args, glob)
    inherited: dict[str, Var] = base_image_env(facts.final_base_image.value, facts.final_base_image.where)
    label_where = (step.label.where[0],)
    for st in chain:
        local: dict[str, Var] = {**inherited, "TARGETPLATFORM": Var(TARGETPLATFORM, label_where),
                                 "TARGETARCH": Var("amd64", label_where), "VLLM_RELEASE": Var(files.vllm, ())}
        walk.stage(st, local)
        inherited = {**inherited, **{k: v for k, v in local.items() if v.env}}  # ENV carries to the next stage
    py = facts.python.value
    site = Derived(f"/usr/local/lib/python{py}/dist-packages",
                   tuple(x for x in (walk.python_line,) if x) + facts.python.where,
                   rule=f"python3 is Ubuntu's python{py} (update-alternatives); `uv pip install --system` and pip "
                        "install into its /usr/local/lib/pythonX.Y/dist-packages")
    return Recipe(vllm=files.vllm, sdist=files.sdist, target=TARGET, pipeline_step=step.label,
                  stages=tuple(Derived(f"{st.name} FROM {st.base}", (Where(dpath, st.line),)) for st in chain),
                  build_args=tuple(sorted(step.build_args.items())), final_base_image=facts.final_base_image,
                  os=facts.os, glibc=facts.glibc, cuda=facts.cuda, python=facts.python, site_packages=site,
                  steps=_numbered(walk.steps, files),
                  os_packages=tuple(Derived(p, (w,)) for p, w in walk.apt.items()),
                  off_index_fetches=tuple(walk.fetches),
                  image_overrides=tuple(Derived(pin, walk.overrides[1]) for pin in walk.overrides[0]))


def requirement_file_options(files: Mapping[str, str], path: str) -> list[tuple[str, str, Where]]:
    """Index options (``--extra-index-url`` ...) inside a requirements file and the files it includes (pure)."""
    import posixpath

    seen: set[str] = set()
    out: list[tuple[str, str, Where]] = []

    def walk(p: str) -> None:
        if p in seen or p not in files:
            return
        seen.add(p)
        for i, line in enumerate(files[p].splitlines(), 1):
            s = re.split(r"\s+#", line, maxsplit=1)[0].strip()
            m = re.match(r"^(-r|--requirement|-c|--constraint)[\s=]+(\S+)", s)
            if m:
                walk(posixpath.normpath(posixpath.join(posixpath.dirname(p), m.group(2))))
                continue
            m = re.match(r"^(--extra-index-url|--index-url|-i|--find-links|-f)[\s=]+(\S+)", s)
            if m:
                out.append((m.group(1), m.group(2), Where(p, i)))

    walk(path)
    return out


def base_image_env(image: str, where: tuple[Where, ...]) -> dict[str, Var]:
    """The ENV a final base image is known to set (pure): ``nvidia/cuda:X.Y.Z-...`` sets CUDA_VERSION=X.Y.Z."""
    m = re.match(r"^(?:docker\.io/)?nvidia/cuda:(\d+\.\d+(?:\.\d+)?)-", image)
    return {"CUDA_VERSION": Var(m.group(1), where, env=True)} if m else {}


def _override_targets(instructions: Iterable[Instruction]) -> list[str]:
    out = []
    for ins in instructions:
        if ins.op == "ENV":
            for k, v in _env_pairs(ins.value):
                if k == "UV_OVERRIDE":
                    out.append(v)
    return out


def _env_pairs(value: str) -> list[tuple[str, str]]:
    value = value.strip()
    if "=" not in value.split()[0]:
        k, _, v = value.partition(" ")
        return [(k, v.strip().strip('"'))]
    out = []
    for tok in shlex.split(value, posix=False):
        k, _, v = tok.partition("=")
        out.append((k, v))
    return out


# --------------------------------------------------------------------------- recipes.toml
RECIPES_SCHEMA = "build-image/base-recipes/v2"
RECIPES_HEADER = """\
# GENERATED FILE: do not edit.  Written by `build-image base recipe --vllm X --write` (one release's
# table; builder/resolve/recipe.py) from the release's sdist on the index (vllm-X.tar.gz, sha256 below):
# its docker/Dockerfile (final stage of target vllm-openai and the stages it is built FROM), the release
# pipeline's step "Build release image - x86_64 - CUDA 13.0" (.buildkite/release-pipeline.yaml; its
# --build-arg values override the Dockerfile's ARG defaults) and requirements/*.txt.
# Each value's provenance is under `from` (file:line inside the sdist) and, where the value is derived
# rather than read verbatim, `rules`.  `steps` are the image's install steps in Dockerfile order, which
# `build-image base reconstruct --vllm X` replays.  A slow test re-derives every release from its sdist
# and requires equality with this file.
"""


def recipe_table(r: Recipe) -> dict:
    """The recipes.toml table of one release (pure; TOML-serialisable: no None)."""
    values = {"final_base_image": r.final_base_image, "os": r.os, "glibc": r.glibc, "cuda": r.cuda,
              "python": r.python, "site_packages": r.site_packages, "pipeline_step": r.pipeline_step}
    lacks = {k: v for k, v in r.lacks().items() if v}
    return {
        "sdist": r.sdist.filename,
        "sdist_sha256": r.sdist.sha256,
        "image": r.image,
        "target": r.target,
        "platform": r.platform,
        **{k: d.value for k, d in values.items()},
        "from": {k: [str(w) for w in d.where] for k, d in values.items()},
        "rules": {k: d.rule for k, d in values.items() if d.rule},
        "stages": [s.value for s in r.stages],
        "build_args": {k: d.value for k, d in r.build_args},
        "build_args_from": {k: str(d.where[0]) for k, d in r.build_args},
        "steps": [s.to_json() for s in r.steps],
        "unversioned": r.unversioned_names(),
        "image_overrides": [d.value for d in r.image_overrides],
        "image_overrides_from": sorted({str(w) for d in r.image_overrides for w in d.where}),
        "lacks": lacks,
    }


def render_recipes(tables: Mapping[str, dict]) -> str:
    """The whole recipes.toml text (pure): header, schema, one table per release in version order."""
    import tomli_w
    from packaging.version import Version

    doc = {"schema": RECIPES_SCHEMA, "release": {v: tables[v] for v in sorted(tables, key=Version)}}
    return RECIPES_HEADER + tomli_w.dumps(doc, multiline_strings=False)


def parse_recipes(text: str, path: str = "recipes.toml") -> dict[str, dict]:
    """The release tables of a recipes.toml (pure); a file of another schema is :class:`BadInput`."""
    doc = load_toml(text, f"recipes {path}")
    if doc.get("schema") != RECIPES_SCHEMA:
        raise BadInput(f"recipes {path}: 'schema' must be {RECIPES_SCHEMA!r}, got {doc.get('schema')!r}.",
                       hint="the file is generated: `build-image base recipe --vllm X --write` for each release.")
    rel = doc.get("release") or {}
    if not isinstance(rel, dict) or not all(isinstance(v, dict) for v in rel.values()):
        raise BadInput(f"recipes {path}: 'release' must be a table of release tables.")
    return rel
