"""What one replayed install step asks of which index, and how the user may loosen a step no reachable
index satisfies.

* :func:`plan_indexes`: the indexes of the step's own Dockerfile line, in its order and with its index
  strategy (``--index-url``, ``--extra-index-url``, ``--index-strategy``, or the image's ``ENV
  UV_INDEX_STRATEGY``), each asked where it answers from here; the Python index stands for itself as the
  replay's index (a mirror in ``UV_DEFAULT_INDEX``); one that does not answer is named and left out.
* :class:`Relaxation` (``--relax NAME`` or ``--relax 'NAME[EXTRA,...]'``): replay without a requirement
  (dropped from the step's requirements and files, and excluded from resolution, so that no other
  distribution pulls it in) or without some extras of it; recorded in the manifest's ``lacks``.
* :func:`explain_unsatisfiable`: the distribution uv could not find, the requirement that needs it and
  the relaxation that replays the step without it (pure, from uv's message).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from builder.errors import BadInput
from builder.resolve.recipe import Step

_PYTHON_INDEX = re.compile(r"^https://pypi\.org/simple/?$")


def is_python_index(url: str) -> bool:
    return bool(_PYTHON_INDEX.match(url))


@dataclass(frozen=True)
class StepIndexes:
    """The indexes a step's replay asks: ``primary`` (uv's ``--index-url``) and ``extras``, in the line's
    order; ``unreachable``: those the line names that did not answer; ``named``: all the line names."""

    primary: str
    extras: tuple[str, ...]
    strategy: str | None
    unreachable: tuple[str, ...]
    named: tuple[str, ...]

    def args(self, base_args: list[str]) -> list[str]:
        """``base_args`` (the replay's own index options) with this step's indexes in place of its index:
        uv's ``--default-index`` and ``--index``, the same priorities as the line's ``--index-url`` and
        ``--extra-index-url`` (an ``--index`` is asked before the default index, earlier ones first), and
        unlike those not overridden by a ``UV_DEFAULT_INDEX`` in the environment."""
        out: list[str] = []
        i = 0
        while i < len(base_args):
            if base_args[i] in (
                "--index-url",
                "--extra-index-url",
                "--index-strategy",
                "--default-index",
                "--index",
            ) and i + 1 < len(base_args):
                i += 2
                continue
            out.append(base_args[i])
            i += 1
        out = ["--default-index", self.primary, *out]
        for e in self.extras:
            out += ["--index", e]
        if self.strategy and self.extras:
            out += ["--index-strategy", self.strategy]
        return out


def plan_indexes(step: Step, base_args: list[str], reachable: Callable[[str], bool]) -> StepIndexes | None:
    """The indexes ``step`` asks (None: the replay's own options unchanged: a ``--no-index`` replay, or a
    step whose line names no index) (pure but for ``reachable``, asked once per URL)."""
    named = tuple(u for u in ((step.index_url,) if step.index_url else ()) + step.extra_index_urls)
    if not named or "--no-index" in base_args or step.replay not in ("index",):
        return None
    own = base_args[base_args.index("--index-url") + 1] if "--index-url" in base_args else None
    if own is None:
        return None

    def mapped(u: str) -> str | None:
        if is_python_index(u):
            return own
        return u.rstrip("/") if reachable(u) else None

    unreachable = tuple(u for u in named if not is_python_index(u) and mapped(u) is None)
    primary = mapped(step.index_url) if step.index_url else own
    extras = [m for u in step.extra_index_urls for m in [mapped(u)] if m is not None]
    if primary is None:  # the line's first index does not answer: the Python index takes its place
        primary = own
    extras = tuple(dict.fromkeys(e for e in extras if e != primary))
    return StepIndexes(primary, extras, step.index_strategy, unreachable, named)


# --------------------------------------------------------------------------- relaxations
@dataclass(frozen=True)
class Relaxation:
    """``--relax NAME``: replay without NAME; ``--relax 'NAME[A,B]'``: without its extras A and B."""

    name: str
    extras: frozenset[str]
    text: str

    @classmethod
    def parse(cls, spec: str) -> Relaxation:
        try:
            r = Requirement(spec)
        except InvalidRequirement as exc:
            raise BadInput(f"--relax {spec!r} is not NAME or NAME[EXTRA,...] ({exc}).") from None
        if r.specifier or r.marker or r.url:
            raise BadInput(f"--relax {spec!r}: give only a name and, optionally, extras (NAME or NAME[EXTRA]).")
        extras = frozenset(canonicalize_name(e) for e in r.extras)
        name = canonicalize_name(r.name)
        text = name + (f"[{','.join(sorted(extras))}]" if extras else "")
        return cls(name, extras, text)

    @property
    def whole(self) -> bool:
        return not self.extras


def parse_relaxations(specs: Iterable[str]) -> tuple[Relaxation, ...]:
    return tuple(dict.fromkeys(Relaxation.parse(s) for s in specs))


def relax_requirement(req: str, relaxations: Iterable[Relaxation]) -> tuple[str | None, list[str]]:
    """(``req`` after the relaxations: None when dropped, what was done) (pure).  A requirement that is
    not PEP 508 (a wheel path, an ``{installed:…}`` mark) is left as it is."""
    try:
        r = Requirement(req)
    except InvalidRequirement:
        return req, []
    name = canonicalize_name(r.name)
    done: list[str] = []
    for rx in relaxations:
        if rx.name != name:
            continue
        if rx.whole:
            return None, [f"{req} dropped"]
        gone = {e for e in r.extras if canonicalize_name(e) in rx.extras}
        if gone:
            r.extras = {e for e in r.extras if e not in gone}
            done.append(f"{req}: extras {', '.join(sorted(gone))} dropped")
    return (str(r) if done else req), done


def relax_file(text: str, relaxations: Iterable[Relaxation], where: str) -> tuple[str, list[str]]:
    """A requirements file's text with the relaxations applied line by line (pure); what changed, with
    ``where:line``.  Option lines, includes and comments stay."""
    relaxations = tuple(relaxations)
    out: list[str] = []
    done: list[str] = []
    for i, line in enumerate(text.splitlines(keepends=True), 1):
        body, _, comment = line.rstrip("\n").partition(" #")
        s = body.strip()
        if not s or s.startswith(("#", "-")):
            out.append(line)
            continue
        new, what = relax_requirement(s, relaxations)
        if not what:
            out.append(line)
            continue
        done += [f"{w} ({where}:{i})" for w in what]
        out.append(f"# (relaxed) {line}" if new is None else new + "\n")
    return "".join(out), done


# --------------------------------------------------------------------------- unsatisfiable steps
_NOT_FOUND = (
    re.compile(r"\b([A-Za-z0-9][\w.-]*(?:\[[^\]]*\])?)(==[^\s,]+)? was not found in the package registry"),
    re.compile(r"there is no version of ([A-Za-z0-9][\w.-]*(?:\[[^\]]*\])?)(==[^\s,]+)?"),
    re.compile(r"\b([A-Za-z0-9][\w.-]*)(==[^\s,]+)? was not found in the provided package locations"),
    # "only foo<=0.3.13 is available and you require foo>=0.3.14": the version asked for is not there
    re.compile(
        r"only ([A-Za-z0-9][\w.-]*)[<>=!~][^\s,]* (?:is|are) available and (?:you require|[^,]*? depends "
        r"on) \1([<>=!~]=?[^\s,]+)"
    ),
    re.compile(r"(?:there (?:is|are) )?no versions? of ([A-Za-z0-9][\w.-]*(?:\[[^\]]*\])?)([<>=!~]=?[^\s,]+)?"),
)
_DEPENDS = re.compile(
    r"([A-Za-z0-9][\w.-]*(?:\[[^\]]*\])?)(?:[=<>!~]=?[^\s,]*)? depends? on "
    r"([A-Za-z0-9][\w.-]*(?:\[[^\]]*\])?)([=<>!~]=?[^\s,]*)?"
)


@dataclass(frozen=True)
class Missing:
    """A distribution no asked index serves, the requirement that needs it, the relaxation that drops it."""

    distribution: str
    needed_by: str
    relax: str


def explain_unsatisfiable(stderr: str, step: Step) -> Missing | None:
    """What uv's failure names as absent (pure; None when it names nothing absent)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", stderr)
    text = re.sub(r"\s+", " ", text)
    missing = None
    for pat in _NOT_FOUND:
        m = pat.search(text)
        if m:
            missing = (m.group(1), m.group(2) or "")
            break
    if missing is None:
        # a conflict rather than an absence: the step's own requirement at the root of uv's derivation
        req = re.findall(r"you require ([A-Za-z0-9][\w.-]*(?:\[[^\]]*\])?)([<>=!~]=?[^\s,]*)?", text)
        if not req:
            return None
        name, spec = req[-1]
        base = canonicalize_name(name.split("[")[0])
        needed_by = (
            next((r for r in step.requirements if _named(r, base)), None)
            or ", ".join(step.requirements + step.requirement_files)
            or f"step {step.n}"
        )
        return Missing(f"a {name}{spec} that fits what the earlier steps installed", needed_by, base)
    miss_name = canonicalize_name(missing[0].split("[")[0])
    needer = None
    for m in _DEPENDS.finditer(text):
        if canonicalize_name(m.group(2).split("[")[0]) == miss_name:
            needer = m.group(1)
    relax = miss_name
    if needer and "[" in needer:
        base, extras = needer.split("[", 1)
        extras = extras.rstrip("]")
        if miss_name.startswith(canonicalize_name(base)):
            relax = f"{canonicalize_name(base)}[{extras}]"
    direct = next((r for r in step.requirements if _named(r, (needer or missing[0]).split("[")[0])), None)
    needed_by = direct or needer or ", ".join(step.requirements + step.requirement_files) or f"step {step.n}"
    return Missing(missing[0] + missing[1], needed_by, relax)


def _named(req: str, name: str) -> bool:
    try:
        return canonicalize_name(Requirement(req).name) == canonicalize_name(name)
    except InvalidRequirement:
        return False
