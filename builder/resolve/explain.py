"""Why a lock on top of the base does not resolve: uv's derivation trimmed, the base pins it involves with
their binary evidence, and the pins that would have to move (pure)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.version import Version

from builder.resolve.abi import is_exact_coupled
from builder.resolve.manifest import BaseManifest
from builder.util import (
    canonical_name,
)

ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def trim_derivation(stderr: str, max_lines: int = 30) -> str:
    lines = [ANSI_RE.sub("", ln).rstrip() for ln in stderr.splitlines()]
    lines = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith(("Resolved ", "Using ", "warning: "))]
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"  ... ({len(lines) - max_lines} more lines)"]
    return "\n".join(lines)


def involved_base_pins(derivation: str, base: BaseManifest, released: Iterable[str] = ()) -> list[str]:
    """Base distributions (canonical names) whose pin appears in uv's derivation."""
    released = {canonical_name(r) for r in released}
    text = ANSI_RE.sub("", derivation)
    names = set()
    for m in re.finditer(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([0-9][^\s,;)]*)", text):
        key = canonical_name(m.group(1))
        d = base.get(key)
        if d is not None and key not in released and m.group(2).rstrip(".") == d.version:
            names.add(key)
    return sorted(names)


def pin_evidence(key: str, base: BaseManifest) -> list[str]:
    """Why a base pin matters, from the binary facts of the base."""
    d = base.get(key)
    if d is None:
        return []
    out = []
    if key == "numpy":
        try:
            gen = "2" if Version(d.version).major >= 2 else "1"
        except ValueError:  # InvalidVersion, or a part past int()'s digit limit
            gen = "1"
        users = [
            (o.name, o.version, o.facts.numpy_abi.get(gen, 0))
            for k, o in sorted(base.distributions.items())
            if k != "numpy" and o.facts.numpy_abi.get(gen, 0) > 0 and (gen == "2" or not o.facts.numpy_abi.get("2", 0))
        ]
        for name, ver, n in users[:6]:
            out.append(f"{name} {ver} there has {n} extension{'s' if n != 1 else ''} built against numpy {gen}.x")
        if len(users) > 6:
            out.append(f"... and {len(users) - 6} more distributions with numpy {gen}.x extensions")

    if is_exact_coupled(key):
        out.append(f"{d.name} is exact-coupled to vllm's compiled kernels: it never moves on top of the base")
    elif d.facts.binary and key != "numpy":
        out.append(f"{d.name} {d.version} ships {d.facts.extensions} compiled file(s) in the base")
    return out


_COMPLEMENT = {">=": "<", ">": "<=", "<": ">=", "<=": ">"}


def wanted_specifier(derivation: str, name: str, pinned: str) -> str | None:
    """The specifier uv says is required of ``name`` other than the base pin
    (``tokenizers>=0.23.1,<0.24.0``), to suggest a concrete ``--with``.

    Only a specifier in *object* position ("... depends on X>=2", "you require X>=2") is
    what is wanted; one in *subject* position ("X>=5.0 depends on numpy>=2", "... and
    X>=5.0 are incompatible") is the range that conflicts, so its complement is suggested
    (``X<5.0``) when it is a single bound, else nothing."""
    text = ANSI_RE.sub("", derivation)
    name_pat = "[-_.]+".join(re.escape(p) for p in canonical_name(name).split("-"))
    pat = re.compile(
        r"(?<![A-Za-z0-9._-])" + name_pat + r"(?:\{[^}]*\})?((?:[<>=!~]=?[^\s,]+)(?:,[<>=!~]=?[^\s,]+)*)", re.I
    )
    complement = None
    for m in pat.finditer(text):
        spec = m.group(1).rstrip(".,")
        if spec == f"=={pinned}":
            continue
        before, after = text[max(0, m.start() - 24) : m.start()], text[m.end() : m.end() + 24]
        if re.search(r"(?:depends? on|requires?|require)\s+$", before):
            return spec
        sub = re.fullmatch(r"(>=|>|<=|<)([^,<>=!~]+)", spec)
        if (
            complement is None
            and sub
            and re.match(r"\s+(?:depends on|depend on|are incompatible|is incompatible)", after)
        ):
            complement = _COMPLEMENT[sub.group(1)] + sub.group(2)
    return complement


def explain_unsatisfiable(stderr: str, base: BaseManifest, overlay: Iterable[str]) -> tuple[str, str]:
    """(message, details) of an :class:`Unsatisfiable` from uv's stderr."""
    overlay = list(overlay)
    released = [Requirement(r).name for r in overlay]
    derivation = trim_derivation(stderr)
    pins = involved_base_pins(stderr, base, released)
    lines = ["uv's derivation:", *("  " + ln for ln in derivation.splitlines())]
    if pins:
        lines.append("base pins involved:")
        for key in pins:
            d = base.get(key)
            ev = pin_evidence(key, base)
            lines.append(f"  {d.name}=={d.version} is pinned by the base" + (f"; {ev[0]}" if ev else ""))
            lines.extend(f"    {e}" for e in ev[1:])

    ways = []
    for key in pins:
        d = base.get(key)
        if not is_exact_coupled(key):
            wanted = wanted_specifier(stderr, d.name, d.version)
            ways.append(f"--with '{d.name}{wanted or ''}' releases the {d.name} pin (then the ABI gate decides)")
    ways.append("drop or loosen the overlay requirement that needs the conflicting version")
    lines.append("ways out: " + "; or ".join(ways))
    for name in [r for r in released if is_exact_coupled(r) and base.get(r) is not None]:
        lines.append(
            f"note: {name} is exact-coupled to vllm's kernels — even when it resolves, the gate rejects "
            f"moving it unless --allow-abi-change {canonical_name(name)} --reason TEXT"
        )
    names = ", ".join(f"{base.get(k).name}=={base.get(k).version}" for k in pins)
    msg = f"no resolution of the overlay ({', '.join(overlay)}) fits on top of the base" + (
        f": it conflicts with the base pin(s) {names}." if pins else "."
    )
    return msg, "\n".join(lines)


MAX_MOVE_ROUNDS = 8


@dataclass
class PinMoves:
    """Every base pin that must move for the overlay to resolve, found in one pass."""

    moves: list[tuple[str, str, str | None]]  # (name, base version, resolved version or None)
    resolves: bool  # releasing them all makes the overlay resolve
    blocked: list[str]  # exact-coupled pins that would have to move (never on this base)
    rounds: int = 0

    @property
    def with_line(self) -> str:
        return " ".join(f"--with '{n}=={v}'" for n, _b, v in self.moves if v)


def find_pin_moves(
    stderr: str, base: BaseManifest, overlay: list[str], attempt: Callable[[list[str]], tuple[bool, str, dict]]
) -> PinMoves:
    """Release the base pins uv's derivation names, resolve again, repeat until it resolves
    (or nothing more can be released): every pin that must move, not only the first one.

    ``attempt(extra)`` resolves ``overlay + extra`` with the named pins released: (ok, stderr, resolved).
    Exact-coupled pins are never released (the gate would refuse them anyway): they stop the search."""
    released = [Requirement(r).name for r in overlay]
    extra: list[str] = []
    names: list[str] = []
    rounds = 0
    while rounds < MAX_MOVE_ROUNDS:
        pins = involved_base_pins(stderr, base, released)
        coupled = [p for p in pins if is_exact_coupled(p)]
        if not pins or coupled:
            return PinMoves([(base.get(k).name, base.get(k).version, None) for k in names], False, coupled, rounds)
        for key in pins:
            d = base.get(key)
            extra.append(d.name + (wanted_specifier(stderr, d.name, d.version) or ""))
            released.append(d.name)
            names.append(key)
        rounds += 1
        ok, stderr, resolved = attempt(extra)
        if ok:
            return PinMoves(
                [(base.get(k).name, base.get(k).version, resolved.get(k, (None, None))[1]) for k in names],
                True,
                [],
                rounds,
            )
    return PinMoves([(base.get(k).name, base.get(k).version, None) for k in names], False, [], rounds)


def format_pin_moves(moves: PinMoves, base: BaseManifest) -> tuple[str, str]:
    """(sentence for the message, lines for the details) of :func:`find_pin_moves`'s result (pure)."""
    if not moves.moves and not moves.blocked:
        return "", ""
    lines = ["", "every base pin that must move (found in one pass):"]
    for name, old, new in moves.moves:
        lines.append(f"  {name} {old} -> {new or '?'}")
    if moves.resolves:
        lines.append(f"one line that moves them all (then the ABI gate decides): {moves.with_line}")
        return (
            f" Releasing {len(moves.moves)} base pin(s) makes it resolve: "
            + ", ".join(f"{n} {o} -> {v}" for n, o, v in moves.moves)
            + f"; add {moves.with_line}."
        ), "\n".join(lines)
    if moves.blocked:
        lines.append(
            "and exact-coupled pins that would have to move (never on this base): "
            + ", ".join(f"{base.get(k).name}=={base.get(k).version}" for k in moves.blocked)
        )
    else:
        lines.append("releasing them does not make it resolve: the overlay itself needs to change")
    return "", "\n".join(lines)
