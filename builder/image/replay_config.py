"""The published image's run configuration, as its recipe's Dockerfile sets it (pure).

``base materialize`` gives the replay image the environment, working directory and entrypoint the
release's own ``docker/Dockerfile`` gives ``vllm/vllm-openai:vX``: the ``ENV``, ``WORKDIR``,
``ENTRYPOINT`` and ``CMD`` instructions of the stages the target is built FROM (root first), with
the ARG values BuildKit would give (the pipeline step's build args, the ARG defaults) and the ENV each
stage inherits.  :func:`image_config` reads them with the recipe reader's own parsers; a value that
uses a variable only the final base image sets (``${PATH}``, ``${LD_LIBRARY_PATH}``) is kept as written,
so the engine expands it from the floor image's environment at build time.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from builder.errors import BadInput
from builder.resolve.recipe import BuildFiles, Recipe
from builder.resolve.recipe.derive import base_image_env, global_args, var_getter
from builder.resolve.recipe.dockerfile import parse_dockerfile, release_step, split_arg, stage_chain
from builder.resolve.recipe.model import DOCKERFILE, PIPELINE, TARGET, Where, release_step_label
from builder.resolve.recipe.shell import Unknown, Var, expand

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class EnvValue:
    name: str
    value: str
    where: str  # file:line
    from_floor: bool = False  # uses a variable only the final base image sets: the engine expands it


@dataclass(frozen=True)
class ImageConfig:
    """The run configuration of the published image (what ``docker image inspect`` would show of it)."""

    env: tuple[EnvValue, ...] = ()  # every ENV assignment in Dockerfile order (a later one may use an earlier)
    workdir: str | None = None
    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None
    where: dict[str, str] = field(default_factory=dict)  # workdir/entrypoint/cmd -> file:line


def _env_pairs(value: str) -> list[tuple[str, str]]:
    """``ENV K V`` (one pair, the rest of the line) or ``ENV K=V K2="V 2"`` (pure)."""
    value = value.strip()
    first = value.split()[0] if value.split() else ""
    if "=" not in first:
        k, _, v = value.partition(" ")
        return [(k, v.strip().strip('"'))]
    out = []
    for tok in shlex.split(value, posix=False):
        k, _, v = tok.partition("=")
        out.append((k, v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'" else v))
    return out


def _exec_form(value: str, where: str) -> tuple[str, ...]:
    """An ENTRYPOINT/CMD value as argv: the JSON form, or the shell form run by ``/bin/sh -c``."""
    text = value.strip()
    if text.startswith("["):
        try:
            argv = json.loads(text)
        except ValueError:
            argv = None
        if isinstance(argv, list) and all(isinstance(a, str) for a in argv):
            return tuple(argv)
    return ("/bin/sh", "-c", text)


def _checked(text: str, what: str, where: str) -> str:
    if _CONTROL.search(text):
        raise BadInput(f"{where}: {what} holds a control character; the replay image cannot carry it.")
    return text


def image_config(files: BuildFiles, recipe: Recipe) -> ImageConfig:
    """ENV, WORKDIR, ENTRYPOINT and CMD of the recipe's target stage chain (pure; later wins, ENTRYPOINT
    resets an inherited CMD as the engine does).  A name or value with a control character is
    :class:`BadInput` naming its line."""
    step = release_step(files.text(PIPELINE, "the release pipeline"), label=release_step_label(recipe.target_platform))
    dpath = step.dockerfile if step.dockerfile != "Dockerfile" else DOCKERFILE
    pre, stages = parse_dockerfile(files.text(dpath, "the Dockerfile"))
    chain = stage_chain(stages, TARGET, dpath)
    glob = global_args(pre, step.build_args, dpath)
    base_where = recipe.final_base_image.where
    inherited: dict[str, Var] = base_image_env(recipe.final_base_image.value, base_where)
    env: list[EnvValue] = [
        EnvValue(k, v.value, str(base_where[0]) if base_where else recipe.final_base_image.value)
        for k, v in inherited.items()
    ]
    cfg: dict[str, object] = {}
    where: dict[str, str] = {}
    for st in chain:
        local: dict[str, Var] = {**inherited, "TARGETPLATFORM": Var(recipe.target_platform.name, ())}
        for ins in st.instructions:
            w = f"{dpath}:{ins.line}"
            if ins.op == "ARG":
                _arg(ins.value, w, local, glob, step.build_args)
            elif ins.op == "ENV":
                for k, raw in _env_pairs(ins.value):
                    if not _NAME.match(k):
                        raise BadInput(f"{w}: ENV name {k!r} is not a variable name.")
                    try:
                        val = "".join(expand(raw, var_getter(local), split=False))
                        local[k] = Var(val, (Where(dpath, ins.line),), env=True)
                        env.append(EnvValue(k, _checked(val, f"ENV {k}", w), w))
                    except Unknown:  # the floor image's variable: the engine expands it, later uses too
                        local.pop(k, None)
                        inherited.pop(k, None)
                        env.append(EnvValue(k, _checked(raw, f"ENV {k}", w), w, from_floor=True))
            elif ins.op in ("WORKDIR", "ENTRYPOINT", "CMD"):
                key = ins.op.lower()
                try:
                    text = "".join(expand(ins.value, var_getter(local), split=False)) if key == "workdir" else ins.value
                except Unknown:
                    text = ins.value
                _checked(text, ins.op, w)
                cfg[key] = text if key == "workdir" else _exec_form(text, w)
                where[key] = w
                if key == "entrypoint":
                    cfg.pop("cmd", None)
                    where.pop("cmd", None)
        inherited = {**inherited, **{k: v for k, v in local.items() if v.env}}
    return ImageConfig(
        env=tuple(env),
        workdir=cfg.get("workdir"),  # type: ignore[arg-type]
        entrypoint=cfg.get("entrypoint"),  # type: ignore[arg-type]
        cmd=cfg.get("cmd"),  # type: ignore[arg-type]
        where=where,
    )


def _arg(value: str, w: str, local: dict[str, Var], glob: Mapping[str, Var], build_args: Mapping) -> None:
    """A stage's ``ARG``: a build arg wins, then the global value (``ARG X`` alone), then its default."""
    for k, v in split_arg(value):
        if k in build_args:
            local[k] = Var(build_args[k].value, build_args[k].where)
        elif v is None:
            local[k] = glob[k] if k in glob else local.get(k, Var("", ()))
        else:
            try:
                local[k] = Var("".join(expand(v, var_getter(local), split=False)), ())
            except Unknown:
                local[k] = Var("", ())
