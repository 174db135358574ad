"""The families the ``lockstep`` rule of the gate reads: distributions that must share a version, or whose
versions constrain each other beyond what their metadata says.

The shipped table is data (``lockfiles/gate/lockstep.toml``, each entry with its ``source``); a spec adds
entries as ``[[lockstep]]`` tables of the same shape (:func:`parse_families`)::

    [[lockstep]]
    name = "lmcache-vllm"
    kind = "requires"            # or "same-version" with members = [...]
    when = "lmcache>=0.3.10"
    needs = "vllm>=0.11.1"
    source = "LMCache's compatibility table, ..."
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement

from builder import data, values
from builder.errors import BadInput
from builder.util import canonical_name
from builder.validate import load_toml, read_bounded_text, tomllib

KINDS = ("same-version", "requires")
_KEYS = {"name": str, "kind": str, "members": list, "when": str, "needs": str, "source": str}


@dataclass(frozen=True)
class Family:
    """One row of the table: ``members`` for ``same-version``; ``when``/``needs`` for ``requires``."""

    name: str
    kind: str
    source: str
    members: tuple[str, ...] = ()
    when: str | None = None
    needs: str | None = None

    def doc(self) -> dict:
        """The row as a spec or the inputs hash holds it."""
        out = {"name": self.name, "kind": self.kind, "source": self.source}
        if self.kind == "same-version":
            out["members"] = list(self.members)
        else:
            out.update(when=self.when or "", needs=self.needs or "")
        return out


def _requirement(text: str, where: str) -> str:
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise BadInput(f"{where}: {text!r:.80} is not a PEP 508 requirement ({exc}).") from None
    if req.url or req.marker is not None or req.extras:
        raise BadInput(f"{where}: {text!r:.80} must be a name and a version range only (no URL, marker or extras).")
    return str(req)


def _family(row: object, where: str) -> Family:
    if not isinstance(row, dict):
        raise BadInput(f"{where} must be a table (name, kind, members or when/needs, source).")
    for key, val in row.items():
        if key not in _KEYS:
            raise BadInput(f"{where}: unknown key '{key}' (known: {', '.join(sorted(_KEYS))}).")
        if not isinstance(val, _KEYS[key]):
            raise BadInput(f"{where}: '{key}' must be a {_KEYS[key].__name__}, got {val!r:.60}.")
    name, kind, source = row.get("name"), row.get("kind"), row.get("source")
    if not name or kind not in KINDS or not source or not str(source).strip():
        raise BadInput(
            f"{where}: every entry needs a 'name', a 'kind' ({' or '.join(KINDS)}) and a non-empty 'source' "
            "saying where the rule comes from."
        )
    for key in ("name", "source"):
        values.control_free(row[key], f"{where}: '{key}'", max_len=2000)
    if kind == "same-version":
        members = row.get("members") or []
        if len(members) < 2 or not all(isinstance(m, str) for m in members) or set(row) & {"when", "needs"}:
            raise BadInput(f"{where}: a 'same-version' family lists two or more 'members' (names), no when/needs.")
        names = tuple(str(values.DistName(m, f"{where}: 'members'")) for m in members)
        return Family(name, kind, source, members=names)
    if "members" in row or not row.get("when") or not row.get("needs"):
        raise BadInput(f"{where}: a 'requires' entry gives 'when' and 'needs' (requirements), no members.")
    when, needs = _requirement(row["when"], f"{where}: 'when'"), _requirement(row["needs"], f"{where}: 'needs'")
    return Family(name, kind, source, when=when, needs=needs)


def parse_families(rows: object, where: str) -> tuple[Family, ...]:
    """The entries of a ``[[lockstep]]`` array (a spec) or the shipped file's ``[[family]]``; BadInput names
    the entry of anything else."""
    if not isinstance(rows, list):
        raise BadInput(f"{where} must be an array of tables ([[...]]).")
    if len(rows) > 1000:
        raise BadInput(f"{where}: {len(rows)} entries; at most 1000.")
    return tuple(_family(row, f"{where}[{i}]") for i, row in enumerate(rows))


SHIPPED = "lockfiles/gate/lockstep.toml"


@functools.cache
def shipped() -> tuple[Family, ...]:
    """The families build-image ships (:data:`SHIPPED`)."""
    path = data.path(SHIPPED)
    try:
        doc = load_toml(read_bounded_text(path, "lockstep table"), str(path))
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{path} is not valid TOML: {exc}.") from None
    return parse_families(doc.get("family", []), f"{path}: 'family'")


def member_versions(family: Family, final: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """The members of a ``same-version`` family present in ``final`` (canonical -> (name, version)): name ->
    version."""
    return {final[k][0]: final[k][1] for k in (canonical_name(m) for m in family.members) if k in final}


def all_families(extra: Iterable[Family] = ()) -> tuple[Family, ...]:
    """The shipped table and a spec's entries (a spec entry of the same name replaces the shipped one)."""
    extra = tuple(extra)
    names = {f.name for f in extra}
    return tuple(f for f in shipped() if f.name not in names) + extra
