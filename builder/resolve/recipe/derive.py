"""The derivation: walks the target's stage chain with the ARG/ENV values BuildKit would give, runs the
interpreter on each RUN, and returns the :class:`Recipe` with every value's provenance (pure)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from builder.errors import BadInput
from builder.platforms import DEFAULT, Platform
from builder.resolve.recipe.audit import AuditRow, accepted_lines, conclusion, install_texts, step_text
from builder.resolve.recipe.dockerfile import (
    Instruction,
    Stage,
    parse_dockerfile,
    release_step,
    split_arg,
    stage_chain,
)
from builder.resolve.recipe.harmless import HEREDOC_PATH
from builder.resolve.recipe.interpret import (
    ScriptContext,
    apt_packages,
    context_scripts,
    copy_targets,
    into_python_tree,
    run_mounts,
    run_text,
)
from builder.resolve.recipe.model import (
    DOCKERFILE,
    PIPELINE,
    TARGET,
    BuildFiles,
    Derived,
    Recipe,
    Step,
    Where,
)
from builder.resolve.recipe.publish import normalise_variant, publishing_step
from builder.resolve.recipe.shell import Unknown, Var, expand

# glibc of each Ubuntu release (the version of its libc6 package: jammy 2.35, noble 2.39, focal 2.31):
# the final base image's libc, which decides the manylinux platform the image can install.
UBUNTU_GLIBC = {"20.04": "2.31", "22.04": "2.35", "24.04": "2.39"}
UBUNTU_GLIBC_SOURCE = "Ubuntu's libc6 package of that release (focal 2.31, jammy 2.35, noble 2.39)"


# --------------------------------------------------------------------------- derive
def var_getter(table: Mapping[str, Var]) -> Callable[[str], str]:
    """``$NAME``'s value in ``table``, for :func:`expand`; an unknown name raises :class:`Unknown` (pure)."""

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
        for k, v in split_arg(ins.value):
            if k in build_args:
                glob[k] = Var(build_args[k].value, build_args[k].where)
            elif v is not None:
                try:
                    val = "".join(expand(v, var_getter(glob), split=False))
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
        image = "".join(expand(root.base, var_getter(glob), split=False))
    except Unknown as exc:
        raise BadInput(
            f"{dpath}:{root.line}: the base image {root.base} of stage {root.name!r} is not determined ({exc})."
        ) from None
    where = tuple(dict.fromkeys([Where(dpath, root.line), *_sources_of(root.base, glob)]))
    m = re.search(r"ubuntu(\d+\.\d+)", image)
    if not m:
        raise BadInput(f"{dpath}:{root.line}: the final base image {image} names no Ubuntu release.")
    ubuntu = m.group(1)
    if ubuntu not in UBUNTU_GLIBC:
        raise BadInput(
            f"{dpath}:{root.line}: Ubuntu {ubuntu} of {image} is not in the glibc table ({', '.join(UBUNTU_GLIBC)})."
        )
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
    accept_undecided: frozenset[str] = frozenset()  # "file:line" of RUN lines replayed as nothing
    keep_going: bool = False  # --audit: a refused line is recorded and the walk goes on
    audit: list[AuditRow] = field(default_factory=list)

    def arg(self, value: str, w: Where, local: dict[str, Var]) -> None:
        for k, v in split_arg(value):
            if k in self.build_args:
                local[k] = Var(self.build_args[k].value, self.build_args[k].where)
            elif v is None:
                local[k] = self.glob[k] if k in self.glob else local.get(k, Var("", (w,)))
            else:
                try:
                    local[k] = Var("".join(expand(v, var_getter(local), split=False)), (w,))
                except Unknown:
                    local[k] = Var("", (w,))

    def env(self, value: str, w: Where, local: dict[str, Var]) -> None:
        for k, v in _env_pairs(value):
            try:
                val = "".join(expand(v, var_getter(local), split=False))
            except Unknown:
                val = v
            local[k] = Var(val, (w,), env=True)
            if k == "UV_OVERRIDE":
                content = self.written.get(val)
                if content is None or content[0].startswith("\x00"):
                    raise BadInput(f"{w}: ENV UV_OVERRIDE={val} names a file the Dockerfile does not write.")
                self.overrides = (tuple(ln.strip() for ln in content[0].splitlines() if ln.strip()), (content[1], w))

    def run(self, st: Stage, ins: Instruction, w: Where, local: dict[str, Var], copies: Mapping[str, str]) -> None:
        """Every RUN of the chain is read: installs become steps, every other command must be known harmless
        (:mod:`builder.resolve.recipe.harmless`), else the line is refused (or, accepted, replayed as nothing).
        The line's decisions are kept only when the whole line is read."""
        script_mounts, binds, script = run_mounts(ins.value)
        for pkg in apt_packages(script, var_getter(local)):
            self.apt.setdefault(pkg, w)
        if re.search(r"update-alternatives --install /usr/bin/python3", script):
            self.python_line = w
        if re.search(r"curl[^|;&]*\$\{?GET_PIP_URL\}?[^|;&]*\|\s*python", script):
            url = local.get("GET_PIP_URL", Var("", ())).value or "GET_PIP_URL"
            self.fetches.append(Derived(f"pip (get-pip.py from {url})", (w,)))
        mounts = {**copies, **script_mounts}
        ctx = ScriptContext(
            vars=dict(local),
            files=dict(self.written),
            mounts=mounts,
            binds=binds,
            stage=st.name or "",
            where=w,
            steps=list(self.steps),
            overrides=self.overrides,
            fetches=list(self.fetches),
            sdist_files=frozenset(self.files.files),
            sdist_text=dict(self.files.files),
            script=context_scripts(mounts, self.files.files),
            at=str(w),
        )
        ctx.files.update({p: (b, w) for p, b in ins.heredocs})
        n0, f0 = len(self.steps), len(self.fetches)
        try:
            if ins.error:
                raise Unknown(ins.error)
            run_text(script, ctx, str(w))
        except (Unknown, RecursionError) as exc:
            why = str(exc) if isinstance(exc, Unknown) else "shell text nested deeper than the reader follows"
            self.undecided(st, ins, w, why, ctx)
            return
        except (ValueError, IndexError) as exc:
            self.undecided(st, ins, w, f"the RUN line cannot be read ({exc})", ctx)
            return
        self.audit.append(AuditRow(w, script, conclusion(ctx.steps[n0:], ctx.fetches[f0:], ctx.rows), tuple(ctx.rows)))
        self.steps[:], self.fetches[:] = ctx.steps, ctx.fetches
        self.written.clear()
        self.written.update((k, v) for k, v in ctx.files.items() if not k.startswith(HEREDOC_PATH))

    def undecided(self, st: Stage, ins: Instruction, w: Where, why: str, ctx: ScriptContext) -> None:
        """A RUN line the reader cannot decide: refused (exit 2 naming the line, the construct and the way
        through), or, accepted, one ``undecided`` step that records what the line decided before the
        construct, none of which the replay keeps."""
        kept = "; ".join(step_text(s) for s in ctx.steps[len(self.steps) :])
        lost = f"; the line also decides, not replayed: {kept}" if kept else ""
        written = install_texts(ins.value + "".join(r.command for r in ctx.rows) + "".join(b for _p, b in ins.heredocs))
        lost += f"; its text installs, not replayed: {' | '.join(written)}" if written else ""
        accepted = str(w) in self.accept_undecided
        said = ("accepted undecided: " if accepted else "refused: ") + why + lost
        self.audit.append(AuditRow(w, ins.value, said, tuple(ctx.rows)))
        if accepted:
            note = f"accepted undecided: {why}{lost}"
            self.steps.append(Step(len(self.steps) + 1, st.name or "", w, "undecided", note=note))
            return
        if self.keep_going:
            return
        raise BadInput(
            f"{self.files.sdist.filename}: {w}: cannot interpret the RUN line ({why}); the recipe reader "
            "does not guess what a command it does not know does to site-packages.",
            hint=f"`--accept-undecided {w}` replays the image without this line and records it in the "
            "manifest's lacks; or take the manifest from the real image "
            "(`build-image base snapshot --image REF -o FILE`).",
        )

    def stage(self, st: Stage, local: dict[str, Var]) -> None:
        copies: dict[str, str] = {}
        for ins in st.instructions:
            w = Where(self.dpath, ins.line)
            if ins.op == "ARG":
                self.arg(ins.value, w, local)
            elif ins.op == "ENV":
                self.env(ins.value, w, local)
            elif ins.op in ("COPY", "ADD", "WORKDIR") and into_python_tree(ins.op, ins.value, local):
                why = f"{ins.op} {' '.join(ins.value.split())[:160]} reaches a Python folder of the image"
                self.undecided(st, ins, w, why, ScriptContext({}, {}, {}, {}, "", w, list(self.steps), ((), ()), []))
            elif ins.op == "COPY" and "--from" not in ins.value:
                copies.update(copy_targets(ins.value))
            elif ins.op == "RUN":
                self.run(st, ins, w, local, copies)


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


def derive(
    files: BuildFiles, *, accept_undecided: Iterable[str] = (), platform: Platform = DEFAULT, variant: str = ""
) -> Recipe:
    """The recipe of ``files.vllm``'s image published for ``platform`` as ``vllm/vllm-openai:v<vllm><variant>``
    (pure; :class:`BadInput` on what the files lack, on a platform or variant the release does not publish,
    and on text the readers cannot take apart: an unbalanced quote, a malformed instruction)."""
    return audit_derive(files, accept_undecided=accept_undecided, platform=platform, variant=variant)[0]


def audit_derive(
    files: BuildFiles,
    *,
    accept_undecided: Iterable[str] = (),
    platform: Platform = DEFAULT,
    keep_going: bool = False,
    variant: str = "",
) -> tuple[Recipe, list[AuditRow]]:
    """:func:`derive` and what the reader concluded of each RUN line of the chain (``base recipe --audit``);
    ``keep_going``: a refused line is recorded and the walk goes on (the caller then refuses)."""
    try:
        return _derive(files, accepted_lines(accept_undecided), platform, keep_going, normalise_variant(variant))
    except (ValueError, IndexError, KeyError) as exc:
        raise BadInput(
            f"{files.sdist.filename}: its build files cannot be read ({type(exc).__name__}: {exc})."
        ) from None


def _derive(
    files: BuildFiles, accept_undecided: frozenset[str], platform: Platform, keep_going: bool, variant: str = ""
) -> tuple[Recipe, list[AuditRow]]:
    pipeline = files.text(PIPELINE, "the release pipeline")
    published = publishing_step(files, platform, variant)  # the build step whose image the release publishes
    label = published.step
    step = release_step(pipeline, label=label)
    if step.target != TARGET:
        raise BadInput(
            f"{PIPELINE}:{step.label.where[0].line}: step {label!r} builds target {step.target!r}, not {TARGET!r}."
        )
    dpath = step.dockerfile if step.dockerfile != "Dockerfile" else DOCKERFILE
    pre, stages = parse_dockerfile(files.text(dpath, f"the Dockerfile the step {label!r} builds"))
    chain = stage_chain(stages, TARGET, dpath)
    glob = global_args(pre, step.build_args, dpath)
    facts = base_facts(chain[0], glob, dpath)
    walk = _Walk(files, dpath, step.build_args, glob, accept_undecided=accept_undecided, keep_going=keep_going)
    inherited: dict[str, Var] = base_image_env(facts.final_base_image.value, facts.final_base_image.where)
    label_where = (step.label.where[0],)
    for st in chain:
        local: dict[str, Var] = {
            **inherited,
            "TARGETPLATFORM": Var(platform.name, label_where),
            "TARGETARCH": Var(platform.arch, label_where),
            "VLLM_RELEASE": Var(files.wheel or files.vllm, ()),  # the wheel a replay installs
        }
        walk.stage(st, local)
        inherited = {**inherited, **{k: v for k, v in local.items() if v.env}}  # ENV carries to the next stage
    py = facts.python.value
    site = Derived(
        f"/usr/local/lib/python{py}/dist-packages",
        tuple(x for x in (walk.python_line,) if x) + facts.python.where,
        rule=f"python3 is Ubuntu's python{py} (update-alternatives); `uv pip install --system` and pip "
        "install into its /usr/local/lib/pythonX.Y/dist-packages",
    )
    recipe = Recipe(
        vllm=files.vllm,
        sdist=files.sdist,
        target=TARGET,
        pipeline_step=step.label,
        stages=tuple(Derived(f"{st.name} FROM {st.base}", (Where(dpath, st.line),)) for st in chain),
        build_args=tuple(sorted(step.build_args.items())),
        final_base_image=facts.final_base_image,
        os=facts.os,
        glibc=facts.glibc,
        cuda=facts.cuda,
        python=facts.python,
        site_packages=site,
        steps=_numbered(walk.steps, files),
        os_packages=tuple(Derived(p, (w,)) for p, w in walk.apt.items()),
        off_index_fetches=tuple(walk.fetches),
        image_overrides=tuple(Derived(pin, walk.overrides[1]) for pin in walk.overrides[0]),
        target_platform=platform,
        published=published,
        wheel=files.wheel,
    )
    return recipe, walk.audit


def requirement_lines(
    files: Mapping[str, str], paths: Iterable[str], *, constraints: bool = False
) -> Iterator[tuple[str, int, str]]:
    """(file, 1-based line, text without its comment) of each line of requirement files and of the files
    they include (``-r``; with ``constraints`` also ``-c``), each file once, includes resolved relative to
    the including file; files the sdist lacks are skipped (pure)."""
    import posixpath

    include = ("-r", "--requirement", "-c", "--constraint") if constraints else ("-r", "--requirement")
    seen: set[str] = set()

    def walk(p: str) -> Iterator[tuple[str, int, str]]:
        if p in seen or p not in files:
            return
        seen.add(p)
        for i, line in enumerate(files[p].splitlines(), 1):
            body = re.split(r"\s+#|^#", line, maxsplit=1)[0].strip()
            m = re.match(r"^(\S+)[\s=]+(\S+)", body)
            if m and m.group(1) in include:
                yield from walk(posixpath.normpath(posixpath.join(posixpath.dirname(p), m.group(2))))
                continue
            yield p, i, body

    for path in paths:
        yield from walk(path)


def requirement_file_options(files: Mapping[str, str], path: str) -> list[tuple[str, str, Where]]:
    """Index options (``--extra-index-url`` ...) inside a requirements file and the files it includes (pure)."""
    out: list[tuple[str, str, Where]] = []
    for p, i, body in requirement_lines(files, (path,), constraints=True):
        m = re.match(r"^(--extra-index-url|--index-url|-i|--find-links|-f)[\s=]+(\S+)", body)
        if m:
            out.append((m.group(1), m.group(2), Where(p, i)))
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
