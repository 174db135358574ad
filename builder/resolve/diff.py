"""Lock diff: two locks (+ their base manifests) -> a grouped, ABI-aware report.

Pure: no I/O, no subprocess.  ``builder.commands.diff`` reads files / git blobs
and renders the result with ``builder.report``.

Every changed package lands in exactly ONE group, the most dangerous that
applies (a numpy 1.x -> 2.x base move the gate rejects is in group 1, not also
in 2 and 4); the other facets are kept as ``tags``.

1 ``abi-rejected``  the ABI gate (``builder.resolve.abi.evaluate``, the same rules the
                    lock command applies) rejects the NEW lock for this package,
                    and the package changed or the finding is new or different
                    (e.g. the base moved under an unchanged entry, or new evidence).  Findings covered by the lock
                    header's ``allow-abi-change`` are listed here too, marked
                    ``allowed: <reason>``; they do not fail the diff unless
                    ``fail_on_allowed``.
2 ``base-moves``    an entry that moves a distribution the base image ships
                    (``base=X`` in its facts), whose move is new, changed or
                    reverted; with "newer/older than what vllm X shipped with".
3 ``native``        a binary (extension-carrying) distribution added or removed,
                    turning binary/pure, or rebuilt with different binary facts at
                    the same version.
4 ``major``         version bump across a major (for 0.y.z versions: across y).
5 ``minor``         any other version change (minor, patch, post, local label).
6 ``pure-python``   pure-Python distribution added or removed.
7 ``noise``         collapsed to one line: hash/wheel-only changes, ``# via``
                    changes, reordered entries, header churn (tool,
                    inputs-sha256, ...) and comment/whitespace-only edits.

The header changes that matter (vllm, base-ref, base-digest, python, platform,
overlay requirements, allow-abi-change lines, the lock appearing/disappearing)
are reported on top, outside the groups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from builder.errors import BadInput
from builder.report import Document, Section
from builder.resolve.abi import BINARY_MOVE, NEWER_THAN_BASE, OLDER_THAN_BASE, evaluate
from builder.resolve.lockfile import LockEntry, LockFile
from builder.resolve.manifest import BaseManifest, DistFacts, Distribution
from builder.util import canonical_name

SCHEMA = "build-image/lock-diff/v1"

GROUPS: tuple[tuple[int, str, str], ...] = (
    (1, "abi-rejected", "ABI-coupled changes the gate would reject"),
    (2, "base-moves", "base-image moves"),
    (3, "native", "native (binary) distributions added / removed / rebuilt"),
    (4, "major", "major bumps"),
    (5, "minor", "minor / patch bumps"),
    (6, "pure-python", "pure-Python packages added / removed"),
)
NOISE_TITLE = "noise"
TOP_KEYS = ("vllm", "base-ref", "base-digest", "python", "platform", "serve-backend")


@dataclass
class Change:
    """One package's change.  ``change`` is added | removed | upgraded |
    downgraded | rebuilt (same version, other wheel facts) | unchanged (the
    entry is the same but a gate finding is new, e.g. the base moved)."""

    name: str
    change: str
    old: str | None
    new: str | None
    group: int
    tags: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    chain: list[str] = field(default_factory=list)
    allowed: str | None = None
    base: str | None = None  # the base image's version of this distribution, if it ships one
    via: list[str] = field(default_factory=list)
    facts: str | None = None  # compact binary facts of the side that has them (new, else old)

    @property
    def key(self) -> str:
        return canonical_name(self.name)

    @property
    def versions(self) -> str:
        if self.change == "added":
            return f"{self.base} (base) → {self.new}" if self.base else f"+ {self.new}"
        if self.change == "removed":
            return f"{self.old} → {self.base} (base)" if self.base else f"- {self.old}"
        if self.old == self.new:
            return f"{self.new}"
        return f"{self.old} → {self.new}"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "change": self.change,
            "old": self.old,
            "new": self.new,
            "base": self.base,
            "tags": list(self.tags),
            "rules": list(self.rules),
            "evidence": list(self.evidence),
            "chain": list(self.chain),
            "allowed": self.allowed,
            "via": list(self.via),
            "facts": self.facts,
        }


@dataclass
class HeaderChange:
    key: str
    old: str | None
    new: str | None
    note: str = ""  # a base move: why a side's version is the one its recipe names, not a replayed one

    def text(self) -> str:
        if self.old is None:
            return f"{self.key}: + {self.new}"
        if self.new is None:
            return f"{self.key}: - {self.old}"
        return f"{self.key}: {self.old} → {self.new}"

    def to_dict(self) -> dict:
        return {"key": self.key, "old": self.old, "new": self.new, **({"note": self.note} if self.note else {})}


@dataclass
class Noise:
    hash_only: list[str] = field(default_factory=list)
    via_only: list[str] = field(default_factory=list)
    reordered: list[str] = field(default_factory=list)
    header_churn: list[str] = field(default_factory=list)
    comments_only: bool = False

    @property
    def count(self) -> int:
        return (
            len(self.hash_only)
            + len(self.via_only)
            + len(self.reordered)
            + len(self.header_churn)
            + int(self.comments_only)
        )

    def line(self) -> str:
        parts = []
        if self.hash_only:
            parts.append(f"{len(self.hash_only)} hash-only ({_names(self.hash_only)})")
        if self.via_only:
            parts.append(f"{len(self.via_only)} '# via' only ({_names(self.via_only)})")
        if self.reordered:
            parts.append(f"{len(self.reordered)} reordered ({_names(self.reordered)})")
        if self.header_churn:
            parts.append(f"header churn ({', '.join(self.header_churn)})")
        if self.comments_only:
            parts.append("comments/whitespace only")
        return "; ".join(parts) if parts else "none"

    def to_dict(self) -> dict:
        return {
            "count": self.count,
            "hash_only": list(self.hash_only),
            "via_only": list(self.via_only),
            "reordered": list(self.reordered),
            "header_churn": list(self.header_churn),
            "comments_only": self.comments_only,
        }


def _names(names: list[str], limit: int = 6) -> str:
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[:limit]) + f", … {len(names) - limit} more"


@dataclass
class LockDiff:
    path: str
    old_label: str
    new_label: str
    status: str  # modified | added | deleted | unchanged
    vllm: str | None
    header: list[HeaderChange]
    changes: list[Change]
    noise: Noise
    base_source: dict
    notes: list[str] = field(default_factory=list)
    old_count: int = 0
    new_count: int = 0
    fail_on_allowed: bool = False
    base_move: list[HeaderChange] = field(default_factory=list)  # what moved between the two base images
    # findings that a side is not a file `build-image lock` wrote as it stands (hand-edited, cut)
    hand_edited: list[str] = field(default_factory=list)

    def group(self, gid: int) -> list[Change]:
        return [c for c in self.changes if c.group == gid]

    @property
    def rejected(self) -> list[Change]:
        return [c for c in self.group(1) if c.allowed is None]

    @property
    def dangerous(self) -> bool:
        if self.hand_edited:  # what it installs no longer follows from its inputs: a reviewer must look
            return True
        g1 = self.group(1)
        return bool(g1) if self.fail_on_allowed else any(c.allowed is None for c in g1)

    @property
    def counts(self) -> dict[str, int]:
        out = {key: len(self.group(gid)) for gid, key, _ in GROUPS}
        out["noise"] = self.noise.count
        return out

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "old": {"label": self.old_label, "present": self.status != "added", "entries": self.old_count},
            "new": {"label": self.new_label, "present": self.status != "deleted", "entries": self.new_count},
            "status": self.status,
            "vllm": self.vllm,
            "dangerous": self.dangerous,
            "counts": self.counts,
            "header": [h.to_dict() for h in self.header],
            "groups": [
                {
                    "id": gid,
                    "key": key,
                    "title": title,
                    "count": len(self.group(gid)),
                    "changes": [c.to_dict() for c in self.group(gid)],
                }
                for gid, key, title in GROUPS
            ],
            "noise": self.noise.to_dict(),
            "base": dict(self.base_source),
            "notes": list(self.notes),
            **({"base_move": [h.to_dict() for h in self.base_move]} if self.base_move else {}),
            **({"hand_edited": list(self.hand_edited)} if self.hand_edited else {}),
        }


# ------------------------------------------------------------------ helpers

# the base-image facts a move between releases is summarised by: (label, distribution or None for a field)
BASE_MOVE_FIELDS = (
    ("image", None),
    ("torch", "torch"),
    ("torchvision", "torchvision"),
    ("CUDA", None),
    ("Python", None),
    ("glibc", None),
    ("numpy", "numpy"),
    ("transformers", "transformers"),
    ("flashinfer", "flashinfer-python"),
    ("vllm", "vllm"),
)


def base_move(old: BaseManifest | None, new: BaseManifest | None) -> list[HeaderChange]:
    """What moved between two base manifests (pure): the image, torch, torchvision, CUDA, Python, glibc,
    numpy, transformers, flashinfer and vllm, each when it differs; a distribution a side's replay does not
    hold (approximated, relaxed, built from source) is shown with the version its recipe names and the
    reason (:meth:`BaseManifest.held`), never as removed, and listed even when the versions agree."""
    if old is None or new is None:
        return []
    fields = {"image": (old.image_ref, new.image_ref), "CUDA": (old.cuda, new.cuda)}
    fields |= {"Python": (old.python_version, new.python_version), "glibc": (old.glibc, new.glibc)}
    out = []
    for label, dist in BASE_MOVE_FIELDS:
        if dist is None:
            a, b = fields[label]
            if a != b:
                out.append(HeaderChange(label, a, b))
            continue
        ha, hb = old.held(dist), new.held(dist)
        notes = [f"{side}: {h.reason}" for side, h in (("old", ha), ("new", hb)) if h is not None and not h.replayed]
        a, b = (h.text() if h is not None else None for h in (ha, hb))
        if a != b or notes:
            out.append(HeaderChange(label, a, b, "; ".join(notes)))
    return out


def glibc_from_platform(platform: str) -> str | None:
    """``x86_64-manylinux_2_35`` -> ``2.35``."""
    m = re.search(r"manylinux_?(\d+)_(\d+)", platform or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def base_from_lock(lock: LockFile) -> BaseManifest:
    """A stand-in base manifest rebuilt from what the lock itself records: its
    header (base-ref, python, platform -> glibc) and every entry's ``base=X``.
    Base distributions the overlay does not move, and the base's binary facts,
    are unknown: the numpy rule then only sees the lock's own entries."""
    h = lock.header
    py = h.get("python", "") or ""
    dists = {
        e.key: Distribution(name=e.name, version=e.base_version, facts=DistFacts())
        for e in lock.entries
        if e.base_version
    }
    return BaseManifest(
        image_ref=None if h.get("base-ref") in (None, "-") else h.get("base-ref"),
        image_digest=None if h.get("base-digest") in (None, "-") else h.get("base-digest"),
        os=None,
        glibc=glibc_from_platform(h.get("platform", "")) or "",
        python_version=py,
        python_abi="cp" + py.replace(".", "") if py else "none",
        site_packages=None,
        cuda=None,
        platform=h.get("platform", ""),
        provenance_kind="reconstructed",
        provenance_method="rebuilt by build-image diff from the lock header and its entries' base= facts",
        distributions=dists,
    )


def _facts_text(f: DistFacts) -> str:
    if not f.binary:
        return "pure"
    parts = [f"ext={f.extensions}"]
    n1, n2 = f.numpy_abi.get("1", 0), f.numpy_abi.get("2", 0)
    if n1 or n2:
        parts.append(f"numpy-abi={n1}/{n2}")
    parts.append(f"glibc={f.glibc or '-'}")
    parts.append(f.python_abi or "none")
    return " ".join(parts)


def _facts_eq(a: DistFacts, b: DistFacts) -> bool:
    return (
        a.binary == b.binary
        and a.extensions == b.extensions
        and a.glibc == b.glibc
        and a.python_abi == b.python_abi
        and {k: v for k, v in a.numpy_abi.items() if v} == {k: v for k, v in b.numpy_abi.items() if v}
    )


def _parse_version(v: str):
    from packaging.version import Version

    try:
        return Version(v)
    except ValueError:  # InvalidVersion, or a part past int()'s digit limit
        return None


def bump_kind(old: str, new: str) -> tuple[str, bool]:
    """(``major`` | ``minor`` | ``patch`` | ``other``, is_downgrade).

    Major: the first release number differs, or for ``0.y`` versions the second
    (``0.9 -> 0.10`` breaks like a major under semver's 0.x rule).  Versions
    that do not parse (PEP 440) compare as strings and count as ``other``."""
    a, b = _parse_version(old), _parse_version(new)
    if a is None or b is None:
        return "other", new < old
    ra, rb = a.release + (0, 0), b.release + (0, 0)
    down = b < a
    if ra[0] != rb[0] or (ra[0] == 0 and ra[1] != rb[1]):
        return "major", down
    if ra[1] != rb[1]:
        return "minor", down
    if ra[:3] != rb[:3] or a.release != b.release:
        return "patch", down
    return "other", down  # pre/post/dev/local label only


def _moved_out_of_order(old_keys: list[str], new_keys: list[str]) -> list[str]:
    """Keys (common to both orders) that are not on a longest common ordered
    subsequence: the entries that a reader would see "moved"."""
    common = set(old_keys) & set(new_keys)
    pos = {k: i for i, k in enumerate(k for k in old_keys if k in common)}
    seq = [pos[k] for k in new_keys if k in common]
    order = [k for k in new_keys if k in common]
    # longest increasing subsequence (patience), keep indices to recover it
    import bisect

    tails: list[int] = []
    tails_idx: list[int] = []
    prev = [-1] * len(seq)
    for i, x in enumerate(seq):
        j = bisect.bisect_left(tails, x)
        if j == len(tails):
            tails.append(x)
            tails_idx.append(i)
        else:
            tails[j] = x
            tails_idx[j] = i
        prev[i] = tails_idx[j - 1] if j else -1
    keep = set()
    i = tails_idx[-1] if tails_idx else -1
    while i >= 0:
        keep.add(i)
        i = prev[i]
    return [order[i] for i in range(len(seq)) if i not in keep]


def _same_entry(a: LockEntry | None, b: LockEntry | None) -> bool:
    return (
        a is not None
        and b is not None
        and a.version == b.version
        and a.base_version == b.base_version
        and _facts_eq(a.facts, b.facts)
    )


def _finding_sig(fd) -> tuple:
    """What makes a gate finding "the same" across two locks: its evidence and
    whether (and why) the header allows it.  A finding on an unchanged entry is
    reported when this differs (new evidence, e.g. another extension built against
    the other numpy generation; or the escape hatch added/removed/reworded)."""
    return (tuple(fd.evidence), fd.reason)


def _gate(base: BaseManifest, lock: LockFile):
    return evaluate(base, lock.entries, lock.allow_abi_change, vllm=lock.header.get("vllm"), overlay=lock.overlay)


_EMPTY_HEADER_KEYS = ("vllm", "base-ref", "python", "platform")


# --------------------------------------------------------------------- diff


def diff_locks(
    old: LockFile | None,
    new: LockFile | None,
    *,
    old_base: BaseManifest | None = None,
    new_base: BaseManifest | None = None,
    path: str = "",
    old_label: str = "old",
    new_label: str = "new",
    old_text: str | None = None,
    new_text: str | None = None,
    fail_on_allowed: bool = False,
    base_source: dict | None = None,
) -> LockDiff:
    """Compare two parsed locks.  ``None`` for a side means the lock does not
    exist there (added / deleted between revisions).  ``old_base``/``new_base``
    are the base manifests each lock was made against; when missing they are
    rebuilt from the lock (:func:`base_from_lock`).  ``old_text``/``new_text``
    (the raw files) only serve to detect comment/whitespace-only edits."""
    if old is None and new is None:
        raise BadInput(f"diff {path or '<locks>'}: neither side has a lock to compare.")
    status = "added" if old is None else "deleted" if new is None else "modified"
    empty = LockFile(header={}, overlay=[], allow_abi_change={}, entries=[])
    o, n = old or empty, new or empty
    vllm = n.header.get("vllm") or o.header.get("vllm")
    header = _header_changes(status, o, n, path)
    noise = Noise()
    if status == "modified":
        noise.header_churn = _header_churn(o, n)
    moved_base = base_move(old_base, new_base) if old is not None and new is not None else []
    gated = _gate_sides(old, new, old_base, new_base)
    changes = _changes(o, n, gated, vllm, noise)
    if status == "modified":
        _order_noise(o, n, noise, unchanged=not header and not changes, old_text=old_text, new_text=new_text)
    src = dict(base_source or {})
    src.setdefault("kind", gated.new_base.provenance_kind if gated.new_base is not None else "none")
    return LockDiff(
        path=path,
        old_label=old_label,
        new_label=new_label,
        status=status if (status != "modified" or header or changes or noise.count) else "unchanged",
        vllm=vllm,
        header=header,
        changes=changes,
        noise=noise,
        base_source=src,
        notes=gated.notes,
        old_count=len(o.entries),
        new_count=len(n.entries),
        fail_on_allowed=fail_on_allowed,
        base_move=moved_base,
        hand_edited=[
            f"{label}: {msg}"
            for label, side in ((old_label, old), (new_label, new))
            if side is not None
            for msg in getattr(side, "problems", [])
        ],
    )


def _header_changes(status: str, o: LockFile, n: LockFile, path: str) -> list[HeaderChange]:
    """The header changes reported on top: the top keys (or, for a lock that appears or
    disappears, the lock itself and its identifying keys), overlay requirements and
    allow-abi-change lines."""
    header: list[HeaderChange] = []
    if status == "modified":
        for key in TOP_KEYS:
            a, b = o.header.get(key), n.header.get(key)
            if a != b:
                header.append(HeaderChange(key, a, b))
    else:
        side = n if status == "added" else o
        name = path or "lock"
        header.append(HeaderChange("lock", None, name) if status == "added" else HeaderChange("lock", name, None))
        for key in _EMPTY_HEADER_KEYS:
            v = side.header.get(key)
            if v:
                header.append(HeaderChange(key, None if status == "added" else v, v if status == "added" else None))
    for req in sorted(set(o.overlay) - set(n.overlay)):
        header.append(HeaderChange("overlay", req, None))
    for req in sorted(set(n.overlay) - set(o.overlay)):
        header.append(HeaderChange("overlay", None, req))
    for name in sorted(set(o.allow_abi_change) | set(n.allow_abi_change)):
        a, b = o.allow_abi_change.get(name), n.allow_abi_change.get(name)
        if a != b:
            header.append(
                HeaderChange(
                    "allow-abi-change",
                    f"{name}: {a}" if a is not None else None,
                    f"{name}: {b}" if b is not None else None,
                )
            )
    return header


def _header_churn(o: LockFile, n: LockFile) -> list[str]:
    """The other header keys that differ (tool, inputs-sha256, ...): noise."""
    return sorted(
        k
        for k in set(o.header) | set(n.header)
        if k not in TOP_KEYS and k != "entries" and o.header.get(k) != n.header.get(k)
    )


@dataclass
class _Gated:
    """The gate's findings on both sides, indexed for classification."""

    new_base: BaseManifest | None
    new_find: dict[str, list] = field(default_factory=dict)  # canonical name -> violations + allowed (new lock)
    old_rules: dict[tuple[str, str], tuple] = field(default_factory=dict)  # (name, rule) -> signature (old lock)
    notices: dict[str, list] = field(default_factory=dict)  # canonical name -> notices (new lock)
    notes: list[str] = field(default_factory=list)


def _gate_sides(
    old: LockFile | None, new: LockFile | None, old_base: BaseManifest | None, new_base: BaseManifest | None
) -> _Gated:
    """Run the gate on the new lock, and on the old one when a finding sits on an
    unchanged entry; a missing base manifest is rebuilt from its lock."""
    notes: list[str] = []
    if new is not None and new_base is None:
        new_base = base_from_lock(new)
        notes.append(
            "no base manifest for the new lock: the base was rebuilt from the lock itself "
            "(binary facts of base distributions unknown; CUDA-variant rule not applied)."
        )
    if old is not None and old_base is None:
        old_base = base_from_lock(old)
    gated = _Gated(new_base=new_base, notes=notes)
    new_res = _gate(new_base, new) if new is not None else None
    if new_res is None:
        return gated
    for fd in new_res.violations + new_res.allowed:
        gated.new_find.setdefault(canonical_name(fd.name), []).append(fd)
    for fd in new_res.notices:
        gated.notices.setdefault(canonical_name(fd.name), []).append(fd)
    # The old lock's findings only matter for entries that did not change (is the
    # finding news?); skip the second evaluation when no such finding exists.
    if old is not None:
        ob0, nb0 = old.by_name(), new.by_name()
        if any(
            _same_entry(ob0.get(canonical_name(fd.name)), nb0.get(canonical_name(fd.name)))
            for fd in new_res.violations + new_res.allowed
        ):
            old_res = _gate(old_base, old)
            gated.old_rules = {
                (canonical_name(fd.name), fd.rule): _finding_sig(fd) for fd in old_res.violations + old_res.allowed
            }
    return gated


def _changes(o: LockFile, n: LockFile, gated: _Gated, vllm: str | None, noise: Noise) -> list[Change]:
    """Every package that changed (or has a new finding), classified; the rest feeds the noise."""
    ob, nb = o.by_name(), n.by_name()
    changes: list[Change] = []
    for key in sorted(set(ob) | set(nb)):
        a, b = ob.get(key), nb.get(key)
        c = _classify(
            key,
            a,
            b,
            gated.new_find.get(key, []),
            gated.old_rules,
            gated.notices.get(key, []),
            gated.new_base,
            vllm,
            noise,
        )
        if c is not None:
            changes.append(c)
    return changes


def _order_noise(
    o: LockFile, n: LockFile, noise: Noise, *, unchanged: bool, old_text: str | None, new_text: str | None
) -> None:
    """Reordered entries, and an edit that only touched comments or whitespace."""
    moved = _moved_out_of_order(
        [e.key for e in sorted(o.entries, key=lambda e: e.line)],
        [e.key for e in sorted(n.entries, key=lambda e: e.line)],
    )
    nb = n.by_name()
    noise.reordered = [nb[k].name for k in moved]
    if unchanged and noise.count == 0 and old_text is not None and new_text is not None and old_text != new_text:
        noise.comments_only = True


def _classify(
    key: str,
    a: LockEntry | None,
    b: LockEntry | None,
    findings: list,
    old_rules: dict[tuple[str, str], tuple],
    notices: list,
    base: BaseManifest | None,
    vllm: str | None,
    noise: Noise,
) -> Change | None:
    """The group of one package's change (the most dangerous that applies), or None
    when the entry did not change in a way that matters (noise)."""
    c = _new_change(a, b, base)
    # group 1: gate findings on the new lock, for a changed package or a new finding
    relevant = [fd for fd in findings if c.change != "unchanged" or old_rules.get((key, fd.rule)) != _finding_sig(fd)]
    if relevant:
        return _abi_rejected(c, relevant)
    if c.change == "unchanged":
        _unchanged_noise(a, b, noise)
        return None
    # group 2: base moves that are new, changed or reverted
    if "base-move" in c.tags:
        return _base_moved(c, b, notices, vllm)
    # group 3: native distributions added / removed / flipped / rebuilt
    a_bin = a is not None and a.facts.binary
    b_bin = b is not None and b.facts.binary
    if (
        c.change == "rebuilt"
        or (c.change in ("added", "removed") and (b or a).facts.binary)
        or (a is not None and b is not None and a_bin != b_bin)
    ):
        return _native(c, a, b)
    if c.change in ("added", "removed"):
        c.group = 6
        return c
    c.group = 4 if "major" in c.tags else 5
    if b_bin and a is not None and not _facts_eq(a.facts, b.facts):
        c.evidence.append(f"{_facts_text(a.facts)} → {_facts_text(b.facts)}")
    return c


def _change_kind(a: LockEntry | None, b: LockEntry | None) -> str:
    if a is None:
        return "added"
    if b is None:
        return "removed"
    if a.version != b.version:
        down = bump_kind(a.version, b.version)[1]
        return "downgraded" if down else "upgraded"
    if not _facts_eq(a.facts, b.facts) or a.base_version != b.base_version:
        return "rebuilt"
    return "unchanged"


def _new_change(a: LockEntry | None, b: LockEntry | None, base: BaseManifest | None) -> Change:
    """The change of one entry, not yet grouped, with its tags (bump magnitude,
    downgrade, binary, base-move)."""
    e = b or a
    assert e is not None
    kind = _change_kind(a, b)
    base_dist = base.get(e.name) if base is not None else None
    # the base's version: what the new entry records (base=), for a removed entry what the old one did
    base_v = b.base_version if b is not None else a.base_version
    if base_v is None and base_dist is not None:
        base_v = base_dist.version
    c = Change(
        name=e.name,
        change=kind,
        old=a.version if a else None,
        new=b.version if b else None,
        group=0,
        base=base_v,
        via=list(e.via),
        facts=_facts_text(e.facts),
    )
    if kind in ("upgraded", "downgraded"):
        mag, down = bump_kind(a.version, b.version)
        c.tags.append(mag)
        if down:
            c.tags.append("downgrade")
    if e.facts.binary:
        c.tags.append("binary")
    if (a is not None and a.base_version) or (b is not None and b.base_version):
        c.tags.append("base-move")
    return c


def _abi_rejected(c: Change, relevant: list) -> Change:
    c.group = 1
    c.rules = sorted({fd.rule for fd in relevant})
    for fd in relevant:
        c.evidence.append(fd.message)
        c.evidence.extend(fd.evidence)
    c.chain = list(relevant[0].chain)
    reasons = [fd.reason for fd in relevant]
    if all(r is not None for r in reasons):
        c.allowed = "; ".join(sorted(set(reasons)))
    return c


def _unchanged_noise(a: LockEntry, b: LockEntry, noise: Noise) -> None:
    """An unchanged entry whose hashes, wheel or ``# via`` changed: noise."""
    wa = (a.wheel.url, a.wheel.sha256) if a.wheel else None
    wb = (b.wheel.url, b.wheel.sha256) if b.wheel else None
    if sorted(set(a.hashes)) != sorted(set(b.hashes)) or wa != wb:
        noise.hash_only.append(b.name)
    elif a.via != b.via:
        noise.via_only.append(b.name)


def _base_moved(c: Change, b: LockEntry | None, notices: list, vllm: str | None) -> Change:
    c.group = 2
    ev = []
    shipped = f"what vllm {vllm} shipped with" if vllm else "the base image"
    if b is None:
        ev.append(f"back to the base image's {c.base}")
    elif not b.base_version:  # still installed, but the base no longer ships it
        ev.append("no longer moves a base distribution")
    else:
        rules = {fd.rule for fd in notices}
        c.rules = sorted(rules)
        mag, down = bump_kind(b.base_version, b.version)
        if OLDER_THAN_BASE in rules or (NEWER_THAN_BASE not in rules and down):
            ev.append(f"older than {shipped} ({b.base_version})")
        else:
            ev.append(f"newer than {shipped} ({b.base_version})")
        if mag == "major":
            ev.append(
                "a 0.x minor bump (breaking under semver)"
                if _major0(b.base_version, b.version)
                else "across a major version"
            )
        if BINARY_MOVE in rules:
            ev.append("binary: passed the gate's binary checks")
    ev += [fd.message for fd in notices if fd.rule not in ("newer-than-base", "older-than-base", "binary-move")]
    c.evidence = ev
    return c


def _native(c: Change, a: LockEntry | None, b: LockEntry | None) -> Change:
    c.group = 3
    a_bin = a is not None and a.facts.binary
    b_bin = b is not None and b.facts.binary
    if a is not None and b is not None and a_bin != b_bin:
        c.evidence.append("becomes native (ships extensions)" if b_bin else "no longer native (pure Python now)")
    if c.change == "rebuilt":
        c.evidence.append(f"same version, other wheel: {_facts_text(a.facts)} → {_facts_text(b.facts)}")
    elif a is not None and b is not None and b_bin and not _facts_eq(a.facts, b.facts):
        c.evidence.append(f"{_facts_text(a.facts)} → {_facts_text(b.facts)}")
    return c


def _major0(a: str, b: str) -> bool:
    """Both versions 0.y.z: a "major" bump between them is a 0.x minor bump."""
    return a.split(".")[0].lstrip("v") == "0" and b.split(".")[0].lstrip("v") == "0"


# ---------------------------------------------------------------- rendering


_GROUP_STYLE = {1: "danger", 2: "warn", 3: "notice", 4: "info", 5: "info", 6: "info"}
_SUMMARY_WORDS = {
    1: ("change the ABI gate would reject", "changes the ABI gate would reject"),
    2: ("base-image move", "base-image moves"),
    3: ("native change", "native changes"),
    4: ("major bump", "major bumps"),
    5: ("minor/patch bump", "minor/patch bumps"),
    6: ("pure-Python add/remove", "pure-Python adds/removes"),
}


def _short(v: str | None) -> str | None:
    if v and v.startswith("sha256:") and len(v) > 19:
        return v[:19] + "…"
    return v


def summary_line(d: LockDiff) -> str:
    parts = []
    for gid, _key, _title in GROUPS:
        n = len(d.group(gid))
        if n:
            one, many = _SUMMARY_WORDS[gid]
            text = f"{n} {one if n == 1 else many}"
            if gid == 1:
                allowed = sum(1 for c in d.group(1) if c.allowed is not None)
                if allowed:
                    text += f" ({allowed} allowed by the lock header)"
            parts.append(text)
    if d.noise.count:
        parts.append(f"{d.noise.count} noise")
    if d.hand_edited:
        parts.insert(0, f"hand-edited lock ({len(d.hand_edited)} finding{'s' if len(d.hand_edited) != 1 else ''})")
    if not parts:
        return "no package changes" + (" (header only)" if d.header else "")
    return ", ".join(parts)


def _join(items: list[str]) -> str:
    return "; ".join(i.rstrip(". ") for i in items if i)


def _g1_cell(c: Change) -> str:
    text = _join(c.evidence)
    if c.chain and len(c.chain) > 1:
        text += f"; pulled by: {' ← '.join(c.chain)}"
    if c.allowed is not None:
        text = f"allowed: {c.allowed} — {text}"
    return text


def _via(c: Change) -> str:
    return ", ".join(c.via)


def to_document(d: LockDiff):
    """The report document (``builder.report.Document``) for one lock diff."""
    status = (
        "fail"
        if d.dangerous
        else (
            "warn"
            if d.group(1) or d.group(2) or d.group(3) or any(h.key in TOP_KEYS or h.key == "lock" for h in d.header)
            else "ok"
        )
    )
    if d.path and d.path != d.new_label:
        title = f"{d.path} ({d.old_label} → {d.new_label})"
    else:
        title = f"{d.old_label} → {d.new_label}"
    top = [HeaderChange(h.key, _short(h.old), _short(h.new)).text() for h in d.header]
    sections = []
    if d.hand_edited:  # before everything: the file itself is not what `build-image lock` wrote
        sections.append(
            Section(
                title="0. not produced by `build-image lock` (hand-edited or truncated)",
                columns=["finding"],
                rows=[[h] for h in d.hand_edited],
                style="danger",
            )
        )
    if d.base_move:  # a release upgrade: what the new base image moves, before any package of the lock
        noted = any(h.note for h in d.base_move)
        sections.append(
            Section(
                title="0. base move (from the two base manifests)",
                columns=["", "old", "new", *(["not replayed because"] if noted else [])],
                rows=[[h.key, h.old or "-", h.new or "-", *([h.note] if noted else [])] for h in d.base_move],
                style="warn",
            )
        )
    for gid, _key, gtitle in GROUPS:
        rows_c = d.group(gid)
        if not rows_c:
            continue
        if gid == 1:
            cols = ["package", "change", "rule", "evidence"]
            rows = [[c.name, c.versions, ",".join(c.rules), _g1_cell(c)] for c in rows_c]
        elif gid == 2:
            cols = ["package", "change", "base", "note"]
            rows = [[c.name, c.versions, c.base or "-", _join(c.evidence)] for c in rows_c]
        elif gid == 3:
            cols = ["package", "change", "facts", "note"]
            rows = [[c.name, c.versions, c.facts or "", _join(c.evidence) or f"via {_via(c)}"] for c in rows_c]
        elif gid in (4, 5):
            cols = ["package", "change", "note"]
            rows = [
                [
                    c.name,
                    c.versions,
                    _join([t for t in c.tags if t == "downgrade"] + c.evidence + ([f"via {_via(c)}"] if c.via else [])),
                ]
                for c in rows_c
            ]
        else:
            cols = ["package", "change", "via"]
            rows = [[c.name, c.versions, _via(c)] for c in rows_c]
        style = _GROUP_STYLE[gid]
        if gid == 1 and not d.fail_on_allowed and all(c.allowed is not None for c in rows_c):
            style = "warn"  # every change here is allowed by the lock header: shown, but it fails nothing
        sections.append(Section(title=f"{gid}. {gtitle}", columns=cols, rows=rows, style=style, folded=gid >= 4))
    if d.noise.count:
        sections.append(Section(title=f"7. {NOISE_TITLE}", line=d.noise.line(), style="dim", count=d.noise.count))
    return Document(
        title=title, status=status, summary=summary_line(d), top=top, sections=sections, notes=list(d.notes)
    )


def to_json_doc(diffs: list[LockDiff]) -> dict:
    """The ``--format json`` document (schema ``build-image/lock-diff/v1``)."""
    total = {key: 0 for _gid, key, _t in GROUPS}
    total["noise"] = 0
    for d in diffs:
        for k, v in d.counts.items():
            total[k] += v
    dangerous = any(d.dangerous for d in diffs)
    return {
        "schema": SCHEMA,
        "dangerous": dangerous,
        "exit_code": 1 if dangerous else 0,
        "counts": total,
        "locks": [d.to_dict() for d in diffs],
    }


def textconv(lock: LockFile) -> str:
    """A stable one-line-per-package summary of a lock, for ``git diff`` (textconv):
    header fields, overlay and escape hatches, then ``name==version  facts  base=
    wheel=<sha256 prefix>  via ...``.  Hash changes show as a changed 12-hex prefix."""
    out = []
    for key in sorted(k for k in lock.header if k != "entries"):  # the count is derived from the entries
        out.append(f"# {key}: {lock.header[key]}")
    for req in lock.overlay:
        out.append(f"# overlay: {req}")
    for name, reason in sorted(lock.allow_abi_change.items()):
        out.append(f"# allow-abi-change: {name}: {reason}")
    for e in sorted(lock.entries, key=lambda x: x.key):
        sha = e.wheel.sha256 if e.wheel else (sorted(e.hashes)[0] if e.hashes else "-")
        line = f"{e.name}=={e.version}  [{_facts_text(e.facts)}]"
        if e.base_version:
            line += f"  base={e.base_version}"
        line += f"  sha256={sha[:12]}"
        if len(e.hashes) > 1:
            line += f"(+{len(e.hashes) - 1})"
        if e.via:
            line += f"  via {', '.join(e.via)}"
        out.append(line)
    return "\n".join(out) + "\n"


# ------------------------------------------------------------- JSON schema

_STR_OR_NULL = {"type": ["string", "null"]}
_STR_LIST = {"type": "array", "items": {"type": "string"}}

JSON_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://build-image.invalid/schemas/lock-diff/v1",
    "title": "build-image lock diff (build-image diff --format json)",
    "type": "object",
    "required": ["schema", "dangerous", "exit_code", "counts", "locks"],
    "additionalProperties": False,
    "properties": {
        "schema": {"const": SCHEMA},
        "dangerous": {"type": "boolean", "description": "true when some lock has a group-1 change that fails the diff"},
        "exit_code": {"enum": [0, 1]},
        "counts": {"$ref": "#/$defs/counts"},
        "locks": {"type": "array", "items": {"$ref": "#/$defs/lock"}},
    },
    "$defs": {
        "counts": {
            "type": "object",
            "required": [key for _g, key, _t in GROUPS] + ["noise"],
            "additionalProperties": False,
            "properties": {k: {"type": "integer", "minimum": 0} for k in [key for _g, key, _t in GROUPS] + ["noise"]},
        },
        "side": {
            "type": "object",
            "required": ["label", "present", "entries"],
            "additionalProperties": False,
            "properties": {
                "label": {"type": "string"},
                "present": {"type": "boolean"},
                "entries": {"type": "integer", "minimum": 0},
            },
        },
        "change": {
            "type": "object",
            "required": [
                "name",
                "change",
                "old",
                "new",
                "base",
                "tags",
                "rules",
                "evidence",
                "chain",
                "allowed",
                "via",
                "facts",
            ],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string"},
                "change": {"enum": ["added", "removed", "upgraded", "downgraded", "rebuilt", "unchanged"]},
                "old": _STR_OR_NULL,
                "new": _STR_OR_NULL,
                "base": _STR_OR_NULL,
                "tags": {
                    "type": "array",
                    "items": {"enum": ["major", "minor", "patch", "other", "downgrade", "binary", "base-move"]},
                },
                "rules": _STR_LIST,
                "evidence": _STR_LIST,
                "chain": _STR_LIST,
                "allowed": _STR_OR_NULL,
                "via": _STR_LIST,
                "facts": _STR_OR_NULL,
            },
        },
        "lock": {
            "type": "object",
            "required": [
                "path",
                "old",
                "new",
                "status",
                "vllm",
                "dangerous",
                "counts",
                "header",
                "groups",
                "noise",
                "base",
                "notes",
            ],
            "additionalProperties": False,
            "properties": {
                "path": {"type": "string"},
                "old": {"$ref": "#/$defs/side"},
                "new": {"$ref": "#/$defs/side"},
                "status": {"enum": ["modified", "added", "deleted", "unchanged"]},
                "vllm": _STR_OR_NULL,
                "dangerous": {"type": "boolean"},
                "counts": {"$ref": "#/$defs/counts"},
                "header": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["key", "old", "new"],
                        "additionalProperties": False,
                        "properties": {"key": {"type": "string"}, "old": _STR_OR_NULL, "new": _STR_OR_NULL},
                    },
                },
                "groups": {
                    "type": "array",
                    "minItems": len(GROUPS),
                    "maxItems": len(GROUPS),
                    "items": {
                        "type": "object",
                        "required": ["id", "key", "title", "count", "changes"],
                        "additionalProperties": False,
                        "properties": {
                            "id": {"type": "integer", "minimum": 1, "maximum": len(GROUPS)},
                            "key": {"enum": [key for _g, key, _t in GROUPS]},
                            "title": {"type": "string"},
                            "count": {"type": "integer", "minimum": 0},
                            "changes": {"type": "array", "items": {"$ref": "#/$defs/change"}},
                        },
                    },
                },
                "noise": {
                    "type": "object",
                    "required": ["count", "hash_only", "via_only", "reordered", "header_churn", "comments_only"],
                    "additionalProperties": False,
                    "properties": {
                        "count": {"type": "integer", "minimum": 0},
                        "hash_only": _STR_LIST,
                        "via_only": _STR_LIST,
                        "reordered": _STR_LIST,
                        "header_churn": _STR_LIST,
                        "comments_only": {"type": "boolean"},
                    },
                },
                "base": {
                    "type": "object",
                    "required": ["kind"],
                    "properties": {
                        "kind": {"enum": ["manifest", "read-from-image", "reconstructed", "none"]},
                        "manifest": {"type": "string"},
                    },
                },
                "notes": _STR_LIST,
                "base_move": {
                    "type": "array",
                    "description": "what moved between the two base images (only when it differs)",
                    "items": {
                        "type": "object",
                        "required": ["key", "old", "new"],
                        "additionalProperties": False,
                        "properties": {"key": {"type": "string"}, "old": _STR_OR_NULL, "new": _STR_OR_NULL},
                    },
                },
                "hand_edited": {
                    "type": "array",
                    "description": "findings that a side is not what `build-image lock` wrote (hand-edited or "
                    "truncated), each naming the side, file and line; present only when any",
                    "items": {"type": "string"},
                    "minItems": 1,
                },
            },
        },
    },
}
