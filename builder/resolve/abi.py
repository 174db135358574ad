"""The ABI gate: pure rules deciding whether a lock may go on top of the base.

Everything here is pure (data in, data out, no I/O) so the rules are tested
directly and reused by ``diff`` to classify lock changes.

Rules (rule ids are stable; ``diff`` and the docs refer to them):

``exact-coupled``   a change (or addition) of torch / torchvision / torchaudio /
                    triton / vllm / flashinfer* / xformers / nvidia-* / cuda-*:
                    vllm's compiled kernels are built against those exact builds.
``cuda-variant``    a package built for another CUDA major than the base
                    (``nvidia-cublas-cu12``, ``cupy-cuda12x``, ``torch 2.x+cu126``
                    on a ``cu13`` base).
``numpy-abi``       numpy crosses a major version while an extension of the final
                    set (base ∪ overlay) was built against the other C-API
                    generation; or an overlay extension built against numpy 1.x
                    would run on numpy 2.x.  Binary evidence only (the scan of the
                    files), never names.
``glibc``           a wheel's ELF files need a ``GLIBC_x.y`` newer than the base's.
``python-abi``      a wheel's Python ABI tag does not match the base interpreter.
``elf-machine``     a wheel's ELF files are for another machine than the base's platform (an x86_64
                    ``.so`` in a lock for the aarch64 image, or the reverse), whatever its tags say:
                    read from each ELF header's ``e_machine``.
``torch-abi``       a distribution the lock adds or moves ships ELF files linked against torch
                    (``libtorch*``/``libc10*`` in DT_NEEDED, or undefined symbols of torch's C++
                    namespaces) that do not fit the base's torch: evidence in order (1) its undefined
                    torch symbols against the exports the base manifest records for torch
                    (``torch_exports``), (2) an exact ``torch==X`` pin in its requirements or a local
                    tag (``+pt214``, ``torch2.14``) naming another torch minor; (3) neither: the
                    notice ``torch-abi-unverified``.
``lockstep``        a family that must move together does not (:mod:`builder.resolve.lockstep`: the
                    shipped table with its sources, and a spec's ``[[lockstep]]``): the members of a
                    ``same-version`` family present in the final set differ (flashinfer-python /
                    flashinfer-cubin / flashinfer-jit-cache), or a ``requires`` entry's ``when``
                    holds and its ``needs`` does not; only when the lock adds or moves a member.
``cuda-arch``       a distribution the lock adds or moves ships CUDA binaries linking a CUDA runtime major
                    (``libcudart.so.N``, read from the files) other than the base's; with the base
                    torch's architectures recorded, an added CUDA binary that covers fewer of them is
                    the notice ``cuda-arch-gap`` (the GPUs it has no kernel for).
``unversioned-in-base`` the lock pins a distribution the image holds but the manifest cannot
                    version (a wheel from another index, one built from source in the image:
                    the manifest's ``lacks.unversioned``): installing it would replace the
                    image's own build, a conflict with the base whatever the version.
``newer-than-base`` (notice) a pure-Python base distribution moves up: allowed but
                    flagged "newer than what vllm X shipped with".
``older-than-base`` (notice) a pure-Python base distribution moves down.
``binary-move``     (notice) a binary base distribution moves and passed the
                    binary rules above.

A violation whose name appears in ``allow`` (``--allow-abi-change NAME --reason``)
is moved to ``allowed`` with the reason; the lock records it in its header.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from builder import platforms
from builder.errors import BadInput
from builder.resolve.elfsyms import symbol_key, unpack_symbols
from builder.resolve.fatbin import covers
from builder.resolve.lockfile import LockEntry
from builder.resolve.lockstep import Family, all_families, member_versions
from builder.resolve.manifest import BaseManifest, DistFacts, Distribution, target_environment
from builder.util import canonical_name, same_version

# rule ids
EXACT_COUPLED = "exact-coupled"
CUDA_VARIANT = "cuda-variant"
NUMPY_ABI = "numpy-abi"
GLIBC = "glibc"
PYTHON_ABI = "python-abi"
ELF_MACHINE = "elf-machine"
TORCH_ABI = "torch-abi"
TORCH_ABI_UNVERIFIED = "torch-abi-unverified"
LOCKSTEP = "lockstep"
CUDA_ARCH = "cuda-arch"
CUDA_ARCH_GAP = "cuda-arch-gap"
UNVERSIONED_IN_BASE = "unversioned-in-base"
NEWER_THAN_BASE = "newer-than-base"
OLDER_THAN_BASE = "older-than-base"
BINARY_MOVE = "binary-move"

VIOLATION_RULES = (
    EXACT_COUPLED,
    CUDA_VARIANT,
    NUMPY_ABI,
    GLIBC,
    PYTHON_ABI,
    ELF_MACHINE,
    TORCH_ABI,
    LOCKSTEP,
    CUDA_ARCH,
    UNVERSIONED_IN_BASE,
)
NEW_STACK = "new-vllm-stack"
NOTICE_RULES = (NEWER_THAN_BASE, OLDER_THAN_BASE, BINARY_MOVE, NEW_STACK, TORCH_ABI_UNVERIFIED, CUDA_ARCH_GAP)

_EXACT_NAMES = frozenset({"torch", "torchvision", "torchaudio", "triton", "vllm", "xformers"})
_EXACT_PREFIXES = ("flashinfer", "nvidia-", "cuda-")


def is_exact_coupled(name: str) -> bool:
    """True for distributions vllm's compiled kernels are coupled to exactly:
    torch, torchvision, torchaudio, triton, vllm, xformers, ``flashinfer*``,
    ``nvidia-*`` and ``cuda-*`` (any spelling: names are canonicalised)."""
    key = canonical_name(name)
    return key in _EXACT_NAMES or key.startswith(_EXACT_PREFIXES)


_NAME_CU = re.compile(r"(?:^|-)cu(?:da)?(\d{2,3})x?(?:-|$)")
_LOCAL_CU = re.compile(r"(?:^|[.+])cu(\d{2,3})(?:[.]|$)")


def _cuda_major(digits: str) -> str:
    """'12' -> '12', '126' -> '12', '130' -> '13', '118' -> '11', '92' -> '9'."""
    if len(digits) == 3:
        return digits[:2]
    if digits.startswith("1"):
        return digits
    return digits[0]


def cuda_variant(name: str, version: str | None = None) -> str | None:
    """The CUDA major a distribution is built for, as ``'cu12'``/``'cu13'``, or None.

    Read from the name (``nvidia-cublas-cu12``, ``cupy-cuda12x``,
    ``jax-cuda12-plugin``) or from the local version label (``2.9.0+cu126``).
    """
    m = _NAME_CU.search(canonical_name(name))
    if m:
        return "cu" + _cuda_major(m.group(1))
    if version and "+" in version:
        m = _LOCAL_CU.search(version.split("+", 1)[1].lower())
        if m:
            return "cu" + _cuda_major(m.group(1))
    return None


def base_cuda_variant(manifest: BaseManifest) -> str | None:
    """The base's CUDA major (``'cu13'``): from the manifest's ``cuda`` field, else
    from torch's local version, else the most common variant among its dists."""
    if manifest.cuda:
        major = manifest.cuda.strip().split(".")[0]
        if major.isdigit():
            return f"cu{major}"
    torch = manifest.get("torch")
    if torch is not None:
        v = cuda_variant(torch.name, torch.version)
        if v:
            return v
    counts: dict[str, int] = {}
    for d in manifest.distributions.values():
        v = cuda_variant(d.name, d.version)
        if v:
            counts[v] = counts.get(v, 0) + 1
    if not counts:
        return None
    return max(sorted(counts), key=lambda k: counts[k])


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v))


def glibc_too_new(need: str | None, have: str | None) -> bool:
    """True when ELF files needing ``GLIBC_<need>`` cannot run on glibc ``have``.
    Unknown needs (no ELF files) are never too new; an unknown base is assumed old
    enough only for nothing (any need is too new)."""
    if not need:
        return False
    if not have:
        return True
    return _vtuple(need) > _vtuple(have)


def python_abi_ok(tag: str | None, base_abi: str) -> bool:
    """Can a wheel whose Python ABI tag is ``tag`` load in the base interpreter?

    ``none``/``abi3``/``py*`` are interpreter-independent; ``cpXY`` must equal the
    base's ABI (``cp312``); a free-threaded ``cp312t`` or another minor does not.
    """
    if not tag or tag in ("none", "abi3") or tag.startswith("py"):
        return True
    tags = {t for t in re.split(r"[.,\s]+", tag) if t}
    if len(tags) > 1:  # compressed tag sets: one compatible member suffices
        return any(python_abi_ok(t, base_abi) for t in tags)
    return tag == base_abi


@dataclass
class Finding:
    """One verdict of the gate about one distribution."""

    name: str
    rule: str
    old: str | None  # base version (None: not in the base)
    new: str | None  # version in the lock
    message: str
    evidence: list[str] = field(default_factory=list)
    chain: list[str] = field(default_factory=list)  # ["numpy 2.3.5", "opencv 4.13 (numpy>=2)", "vllm 0.26.0"]
    reason: str | None = None  # set on allowed findings: the --reason text

    @property
    def change(self) -> str:
        if self.old and self.new and self.old != self.new:
            return f"{self.name} {self.old} -> {self.new}"
        if self.new and not self.old:
            return f"{self.name} {self.new} (new, not in the base)"
        return f"{self.name} {self.new or self.old}"

    @property
    def chain_text(self) -> str:
        return " ← ".join(self.chain)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "rule": self.rule,
            "old": self.old,
            "new": self.new,
            "message": self.message,
            "evidence": list(self.evidence),
            "chain": list(self.chain),
            "reason": self.reason,
        }


@dataclass
class GateResult:
    violations: list[Finding] = field(default_factory=list)
    notices: list[Finding] = field(default_factory=list)
    allowed: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "violations": [f.to_dict() for f in self.violations],
            "notices": [f.to_dict() for f in self.notices],
            "allowed": [f.to_dict() for f in self.allowed],
        }


# ---------------------------------------------------------------- evidence


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def numpy_evidence(name: str, version: str, facts: DistFacts, generation: str) -> str:
    """'pyarrow 14.0.2: 1 extension built against numpy 1.x'."""
    n = facts.numpy_abi.get(generation, 0)
    return f"{name} {version}: {_plural(n, 'extension')} built against numpy {generation}.x"


def _major(version: str | None) -> str | None:
    if not version:
        return None
    try:
        return str(Version(version).major)
    except ValueError:  # InvalidVersion, or a part past int()'s digit limit
        m = re.match(r"\d+", version)
        return m.group(0) if m else None


# ---------------------------------------------------------------- chains


#: the marker environment a chain is read on when no base is given: the official image's
#: (CPython 3.12 on x86_64 Linux); the gate reads the base's own (its Python and platform)
DEFAULT_TARGET = target_environment("3.12", "x86_64-manylinux_2_35")


def _requirement_on(parent_reqs: Iterable[str], child: str, env: Mapping[str, str] | None = None) -> str | None:
    """The requirement in ``parent_reqs`` naming ``child`` whose marker holds on the
    target (``env``; default :data:`DEFAULT_TARGET`), without its marker."""
    key = canonical_name(child)
    env = dict(env or DEFAULT_TARGET)
    for raw in parent_reqs:
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            continue
        if req.marker is not None:
            try:
                if not req.marker.evaluate(env):
                    continue
            except Exception:  # noqa: BLE001 - undefined marker variable: keep the requirement
                pass
        if canonical_name(req.name) == key:
            extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
            return f"{req.name}{extras}{req.specifier}" if str(req.specifier) else None
    return None


def build_chain(
    name: str,
    final: Mapping[str, tuple[str, str]],
    via: Mapping[str, list[str]],
    requires: Mapping[str, list[str]] | None = None,
    overlay: Iterable[str] = (),
    max_len: int = 8,
    base_versions: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """The chain that pulled ``name``: ``["numpy 2.3.5", "opencv-python-headless
    4.13.0.90 (numpy>=2)", "vllm 0.26.0"]`` — each link after the first is a
    parent, with (when known) the requirement it has on the previous link.

    ``final`` maps canonical name -> (display name, version) for the final set;
    ``via`` maps canonical name -> its ``# via`` parents (``-r overlay`` for a
    top-level requirement); ``requires`` (optional) maps canonical parent -> its
    requirement strings; ``base_versions`` maps canonical name -> base version.
    At each step the culprit is preferred: a parent whose requirement excludes
    the base's version of the child; then an overlay requirement that does; then
    the overlay; then any parent.  Cycles are cut.
    """
    requires = requires or {}
    base_versions = base_versions or {}
    overlay_reqs = list(overlay)
    key = canonical_name(name)
    disp, ver = final.get(key, (name, ""))
    chain = [f"{disp} {ver}".strip()]
    seen = {key}
    cur = key
    while len(chain) < max_len:
        parents = via.get(cur, [])
        if not parents:
            break
        child_name = final.get(cur, (cur, ""))[0]
        old = base_versions.get(cur)
        roots = [p for p in parents if p.startswith("-r")]
        cands = [canonical_name(p) for p in parents if not p.startswith("-")]
        cands = [p for p in cands if p not in seen]

        def excludes_old(spec: str | None) -> bool:
            if not spec or not old:
                return False
            try:
                return not Requirement(spec).specifier.contains(old, prereleases=True)
            except ValueError:  # InvalidRequirement, InvalidVersion, a part past int()'s digit limit
                return False

        specs = {p: _requirement_on(requires.get(p, []), child_name, env) for p in cands}
        ospec = _requirement_on(overlay_reqs, child_name, env) if any("overlay" in r for r in roots) else None
        culprits = [p for p in cands if excludes_old(specs[p])]
        if culprits:
            nxt = culprits[0]
        elif any("overlay" in r for r in roots) and (excludes_old(ospec) or not cands or old is None):
            chain.append(f"overlay ({ospec or child_name})")
            break
        elif cands:
            nxt = cands[0]
        else:
            if roots:
                chain.append("overlay" if "overlay" in roots[0] else ("base pin" if "base" in roots[0] else roots[0]))
            break
        pdisp, pver = final.get(nxt, (nxt, ""))
        spec = specs[nxt]
        chain.append(f"{pdisp} {pver}".strip() + (f" ({spec})" if spec else ""))
        seen.add(nxt)
        cur = nxt
    return chain


# ---------------------------------------------------------------- the gate


@dataclass
class _Gate:
    """What the rules read while judging one lock: the base, the final set of
    distributions (base + lock), and what builds the chains."""

    base: BaseManifest
    vllm: str
    requires: Mapping[str, list[str]] | None
    overlay: list[str]
    final: dict[str, tuple[str, str]] = field(default_factory=dict)  # canonical -> (display name, version)
    final_facts: dict[str, DistFacts] = field(default_factory=dict)
    via: dict[str, list[str]] = field(default_factory=dict)
    base_versions: dict[str, str] = field(default_factory=dict)
    base_cu: str | None = None
    fresh_stack: bool = False
    demangle: Callable[[list[str]], list[str]] = list
    _torch_keys: frozenset[int] | None = None

    def torch_keys(self) -> frozenset[int] | None:
        """The keys of the base torch's exported symbols (None: the manifest records none)."""
        torch = self.base.get("torch")
        if self._torch_keys is None and torch is not None and torch.facts.torch_exports:
            self._torch_keys = unpack_symbols(torch.facts.torch_exports, "base manifest: 'distributions.torch'")
        return self._torch_keys

    def chain(self, name: str) -> list[str]:
        return build_chain(
            name,
            self.final,
            self.via,
            self.requires,
            self.overlay,
            base_versions=self.base_versions,
            env=target_environment(self.base.python_version, self.base.platform),
        )

    def finding(
        self, rule: str, e: LockEntry, old: str | None, message: str, evidence: list[str] | None = None
    ) -> Finding:
        return Finding(e.name, rule, old, e.version, message, evidence or [], self.chain(e.name))


def evaluate(
    base: BaseManifest,
    entries: list[LockEntry],
    allow: Mapping[str, str] | None = None,
    *,
    vllm: str | None = None,
    requires: Mapping[str, list[str]] | None = None,
    overlay: Iterable[str] = (),
    demangle: Callable[[list[str]], list[str]] | None = None,
    lockstep: Iterable[Family] | None = None,
) -> GateResult:
    """Judge ``entries`` (packages installed on top of ``base``) against the rules.

    ``allow`` maps a distribution name to the reason given with
    ``--allow-abi-change``; ``vllm`` is the version named in messages (default:
    the base's vllm); ``requires``/``overlay`` enrich the chains (``requires``: also the
    torch pins ``torch-abi`` reads); ``demangle`` turns the few symbol names a message shows
    into C++ (default: shown mangled); ``lockstep`` the families the ``lockstep`` rule reads
    (default: the shipped table, :func:`builder.resolve.lockstep.all_families`).
    """
    allow = {canonical_name(k): v for k, v in (allow or {}).items()}
    gate = _gate_of(base, entries, vllm, requires, overlay)
    if demangle is not None:
        gate.demangle = demangle
    findings: list[Finding] = []
    for e in sorted(entries, key=lambda x: x.key):
        b: Distribution | None = base.get(e.name)
        findings += _unversioned_findings(gate, e, b)
        findings += _stack_findings(gate, e, b)
        findings += _binary_findings(gate, e, b.version if b else None)
        findings += _torch_findings(gate, e, b)
        findings += _cuda_arch_findings(gate, e, b)
        findings += _move_findings(gate, e, b)
    findings.extend(_numpy_findings(base, entries, gate.final, gate.final_facts, gate.chain))
    families = all_families() if lockstep is None else tuple(lockstep)
    findings.extend(_lockstep_findings(gate, entries, families))
    return _sorted_out(findings, allow)


def _gate_of(
    base: BaseManifest,
    entries: list[LockEntry],
    vllm: str | None,
    requires: Mapping[str, list[str]] | None,
    overlay: Iterable[str],
) -> _Gate:
    gate = _Gate(
        base=base,
        vllm=vllm or (base.get("vllm").version if base.get("vllm") else "?"),
        requires=requires,
        overlay=list(overlay),
    )
    gate.final = {k: (d.name, d.version) for k, d in base.distributions.items()}
    gate.final_facts = {k: d.facts for k, d in base.distributions.items()}
    for e in entries:
        gate.final[e.key] = (e.name, e.version)
        gate.final_facts[e.key] = e.facts
        gate.via[e.key] = list(e.via)
    gate.base_versions = {k: d.version for k, d in base.distributions.items()}
    gate.base_cu = base_cuda_variant(base)
    # A base with no member of the exact-coupled family (a ray or python image) that gets vllm in the
    # lock takes the whole family as vllm pins it: nothing of the base is coupled to it.
    gate.fresh_stack = not any(is_exact_coupled(k) for k in base.distributions) and any(
        e.key == "vllm" for e in entries
    )
    return gate


def _unversioned_findings(gate: _Gate, e: LockEntry, b: Distribution | None) -> list[Finding]:
    """A distribution the image holds but its manifest cannot version: installing the lock's
    would replace the image's own build."""
    unversioned = gate.base.unversioned
    if b is not None or e.key not in unversioned:
        return []
    return [
        gate.finding(
            UNVERSIONED_IN_BASE,
            e,
            None,
            f"the lock pins {e.name} {e.version}, but the image already holds its own {e.name}, which the base "
            "manifest cannot version; installing this one on top would replace the image's build: a conflict "
            "with the base.",
            [f"{e.name}: {unversioned[e.key]}"],
        )
    ]


def _stack_findings(gate: _Gate, e: LockEntry, b: Distribution | None) -> list[Finding]:
    """The exact-coupled family (torch, triton, vllm, CUDA libraries): never moved or added on top of the base."""
    if not is_exact_coupled(e.name):
        return []
    old = b.version if b else None
    moved = b is not None and not same_version(b.version, e.version)
    vllm = gate.vllm
    if b is None and gate.fresh_stack:
        return [
            Finding(
                e.name,
                NEW_STACK,
                None,
                e.version,
                f"{e.name} {e.version} is new on this base, which ships none of vllm's exact-coupled family: "
                f"installed with vllm {vllm} at the version its requirements pin.",
                [],
                gate.chain(e.name),
            )
        ]
    if not (moved or b is None):
        return []
    what = (
        f"moves {e.name} {old} -> {e.version}" if moved else f"adds {e.name} {e.version}, which the base does not ship"
    )
    return [
        gate.finding(
            EXACT_COUPLED,
            e,
            old,
            f"the lock {what}; vllm {vllm}'s compiled kernels are built against the exact "
            "torch/triton/CUDA-library builds of the base, so this family may never change on top of it.",
            [
                f"{e.name} is in the exact-coupled family (torch, torchvision, torchaudio, triton, vllm, "
                "flashinfer*, xformers, nvidia-*, cuda-*)"
            ],
        )
    ]


def _binary_findings(gate: _Gate, e: LockEntry, old: str | None) -> list[Finding]:
    """The wheel's binary facts against the base: CUDA variant, glibc, Python ABI."""
    base, f = gate.base, e.facts
    out: list[Finding] = []
    cu = cuda_variant(e.name, e.version)
    if cu and gate.base_cu and cu != gate.base_cu:
        out.append(
            gate.finding(
                CUDA_VARIANT,
                e,
                old,
                f"{e.name} {e.version} is built for CUDA {cu[2:]} but the base runs CUDA {gate.base_cu[2:]}.",
                [
                    f"{e.name} {e.version}: variant {cu} (from its name/version); base: {gate.base_cu}"
                    + (f" (cuda {base.cuda})" if base.cuda else "")
                ],
            )
        )
    if glibc_too_new(f.glibc, base.glibc):
        out.append(
            gate.finding(
                GLIBC,
                e,
                old,
                f"{e.name} {e.version} needs GLIBC_{f.glibc} but the base has glibc {base.glibc}.",
                [
                    f"{e.name} {e.version}: ELF files require GLIBC_{f.glibc} (highest symbol version); "
                    f"base glibc {base.glibc}"
                ],
            )
        )
    if not python_abi_ok(f.python_abi, base.python_abi):
        out.append(
            gate.finding(
                PYTHON_ABI,
                e,
                old,
                f"{e.name} {e.version} is built for Python ABI {f.python_abi}, the base interpreter is "
                f"{base.python_abi} (Python {base.python_version}).",
                [f"{e.name} {e.version}: python-abi={f.python_abi}; base: {base.python_abi}"],
            )
        )
    out += _machine_findings(gate, e, old)
    return out


def foreign_machines(facts: DistFacts, base_platform: str) -> dict[str, int]:
    """ELF files of ``facts`` built for another machine than the base's (``aarch64-manylinux_2_39``): {e_machine:
    count} (pure; {} for a platform build-image does not know, which the manifest's reader refuses first)."""
    try:
        want = platforms.from_uv_platform(base_platform).elf
    except BadInput:
        return {}
    return {m: n for m, n in sorted(facts.machines.items()) if m != want}


def _machine_findings(gate: _Gate, e: LockEntry, old: str | None) -> list[Finding]:
    foreign = foreign_machines(e.facts, gate.base.platform)
    if not foreign:
        return []
    machine = gate.base.platform.split("-", 1)[0]
    files = ", ".join(f"{n} for {m}" for m, n in foreign.items())
    return [
        gate.finding(
            ELF_MACHINE,
            e,
            old,
            f"{e.name} {e.version} holds ELF files built for another machine ({files}) than the base's {machine} "
            f"({gate.base.platform}): it cannot load there, whatever its wheel tags say.",
            [f"{e.name} {e.version}: ELF e_machine {files}; base platform {gate.base.platform}"],
        )
    ]


_TORCH_TAG = re.compile(r"(?:^|[^a-z])(?:pt|torch)(\d)\.?(\d{1,2})(?!\d)")


def torch_claim(name: str, version: str, requires: Iterable[str] = ()) -> str | None:
    """The torch a build says it is for: an exact ``torch==X`` in its requirements, else its local
    version tag (``0.3.0+pt214`` -> ``2.14``, ``+cu130torch2.10`` -> ``2.10``); None when it says neither."""
    for raw in requires:
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            continue
        pins = [s.version for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
        if canonical_name(req.name) == "torch" and req.marker is None and pins:
            return pins[0]
    if "+" in version:
        m = _TORCH_TAG.search(version.split("+", 1)[1].lower())
        if m:
            return f"{m.group(1)}.{m.group(2)}"
    return None


def _same_minor(a: str, b: str) -> bool:
    return _vtuple(a.split("+")[0])[:2] == _vtuple(b.split("+")[0])[:2]


def _torch_findings(gate: _Gate, e: LockEntry, b: Distribution | None) -> list[Finding]:
    """``torch-abi``: an added or moved distribution whose ELF files are linked against torch, against the base's
    torch — by symbols when the manifest records torch's exports, else by its pins or tags, else a notice."""
    torch = gate.base.get("torch")
    if torch is None or not e.facts.torch_needs or is_exact_coupled(e.name):
        return []
    if b is not None and same_version(b.version, e.version):
        return []
    old = b.version if b else None
    claim = torch_claim(e.name, e.version, (gate.requires or {}).get(e.key, []))
    keys = gate.torch_keys()
    if keys is not None:
        missing = {f: [s for s in syms if symbol_key(s) not in keys] for f, syms in sorted(e.facts.torch_needs.items())}
        missing = {f: m for f, m in missing.items() if m}
        if not missing:
            return []
        env = target_environment(gate.base.python_version, gate.base.platform)
        asked = _requirement_on((gate.requires or {}).get(e.key, []), "torch", env)
        return [_torch_rejection(gate, e, old, torch.version, missing, claim, asked)]
    if claim is not None and not _same_minor(claim, torch.version):
        files = ", ".join(sorted(e.facts.torch_needs)[:3])
        return [
            gate.finding(
                TORCH_ABI,
                e,
                old,
                f"{e.name} {e.version} ships extensions linked against torch ({files}) and is built for torch "
                f"{claim}, but the base runs torch {torch.version}: it fails at import with 'undefined symbol'.",
                [f"{e.name} {e.version}: built for torch {claim} (its torch pin or local version tag)"],
            )
        ]
    if claim is not None:
        return []
    return [
        Finding(
            e.name,
            TORCH_ABI_UNVERIFIED,
            old,
            e.version,
            f"{e.name} {e.version} ships extensions linked against torch, and neither the base manifest (no "
            "torch_exports: made before build-image recorded them) nor the wheel (no torch==X pin, no +ptXY tag) "
            f"says which torch it was built for; it cannot be verified against torch {torch.version}.",
            [],
            gate.chain(e.name),
        )
    ]


def _torch_rejection(
    gate: _Gate,
    e: LockEntry,
    old: str | None,
    torch: str,
    missing: dict[str, list[str]],
    claim: str | None,
    asked: str | None,
) -> Finding:
    """The ``torch-abi`` rejection by symbols: ``claim`` the torch its pin or tag names, ``asked`` its torch
    requirement (a range)."""
    total = sum(len(m) for m in missing.values())
    first = next(iter(missing))
    shown = gate.demangle(missing[first][:3])
    if claim:
        need = f"torch {claim}"
    else:
        need = "another torch than the base's" + (f" (it requires {asked})" if asked else "")
    evidence = [
        f"{f}: {len(m)} undefined torch symbol(s) not exported by the base's torch {torch}, e.g. "
        + "; ".join(gate.demangle(m[:3]))
        for f, m in list(missing.items())[:4]
    ]
    return gate.finding(
        TORCH_ABI,
        e,
        old,
        f"{e.name} {e.version} was built for {need}: {first} needs {total} torch symbol(s) the base's torch "
        f"{torch} does not export ({'; '.join(shown)}), so importing it fails with 'undefined symbol'.",
        evidence,
    )


def _public(version: str) -> str:
    try:
        return Version(version).public
    except ValueError:  # InvalidVersion, or a part past int()'s digit limit
        return version.split("+", 1)[0]


def _lockstep_findings(gate: _Gate, entries: list[LockEntry], families: Iterable[Family]) -> list[Finding]:
    """``lockstep``: each family the lock touches (adds or moves a member of) against the final set; the finding
    is on the member that moved (the first in the lock), naming the others and the rule's source."""
    moved = {e.key: e for e in entries if not same_version(gate.base_versions.get(e.key, ""), e.version)}
    out: list[Finding] = []
    for fam in families:
        if fam.kind == "same-version":
            have = member_versions(fam, gate.final)
            touched = [moved[canonical_name(m)] for m in have if canonical_name(m) in moved]
            if not touched or len({_public(v) for v in have.values()}) < 2:
                continue
            e = touched[0]
            state = "; ".join(
                f"{n} {v}" + (" (the lock)" if canonical_name(n) in moved else " (the base)") for n, v in have.items()
            )
            what = f"the lock moves {e.name} to {e.version}"
            out.append(
                _lockstep_finding(gate, e, fam, f"{what}, but family {fam.name} must share one version: {state}")
            )
            continue
        when, needs = Requirement(fam.when or ""), Requirement(fam.needs or "")
        w, n = gate.final.get(canonical_name(when.name)), gate.final.get(canonical_name(needs.name))
        if w is None or not when.specifier.contains(w[1], prereleases=True):
            continue
        if n is not None and needs.specifier.contains(n[1], prereleases=True):
            continue
        e = moved.get(canonical_name(when.name)) or moved.get(canonical_name(needs.name))
        if e is None:
            continue
        got = f"{n[0]} {n[1]}" if n else f"no {needs.name}"
        out.append(
            _lockstep_finding(
                gate,
                e,
                fam,
                f"the lock moves {e.name} to {e.version}: {w[0]} {w[1]} needs {needs}, the final set has {got}",
            )
        )
    return out


def _cuda_arch_findings(gate: _Gate, e: LockEntry, b: Distribution | None) -> list[Finding]:
    """``cuda-arch``: an added or moved distribution's CUDA binaries against the base's CUDA major (their
    ``libcudart.so.N``) and, as a notice, against the GPUs the base torch's kernels cover."""
    f = e.facts
    if (b is not None and same_version(b.version, e.version)) or not (f.cuda_sass or f.cuda_ptx or f.cuda_runtime):
        return []
    old = b.version if b else None
    base_major = gate.base_cu[2:] if gate.base_cu else None
    if f.cuda_runtime and base_major and str(f.cuda_runtime) != base_major:
        return [
            gate.finding(
                CUDA_ARCH,
                e,
                old,
                f"{e.name} {e.version}'s CUDA binaries link the CUDA {f.cuda_runtime} runtime "
                f"(libcudart.so.{f.cuda_runtime}), but the base runs CUDA {base_major}.",
                [f"{e.name} {e.version}: libcudart.so.{f.cuda_runtime} in DT_NEEDED; base: CUDA {base_major}"],
            )
        ]
    torch = gate.base.get("torch")
    if torch is None or not torch.facts.cuda_sass or not (f.cuda_sass or f.cuda_ptx):
        return []
    gaps = [a for a in torch.facts.cuda_sass if not covers(f.cuda_sass, f.cuda_ptx, a)]
    if not gaps:
        return []
    return [
        Finding(
            e.name,
            CUDA_ARCH_GAP,
            old,
            e.version,
            f"{e.name} {e.version} has no kernels for {' '.join(f'sm_{a}' for a in gaps)}, which the base's torch "
            f"{torch.version} runs on: on those GPUs it fails with 'no kernel image is available'.",
            [],
            gate.chain(e.name),
        )
    ]


def _lockstep_finding(gate: _Gate, e: LockEntry, fam: Family, text: str) -> Finding:
    return gate.finding(
        LOCKSTEP,
        e,
        gate.base_versions.get(e.key),
        text + ".",
        [f"lockstep family {fam.name} ({fam.kind}): {fam.source}"],
    )


def _move_findings(gate: _Gate, e: LockEntry, b: Distribution | None) -> list[Finding]:
    """A base distribution outside the exact-coupled family that moves: a notice, binary or pure Python."""
    if b is None or same_version(b.version, e.version) or is_exact_coupled(e.name):
        return []
    old, vllm = b.version, gate.vllm
    if b.facts.binary or e.facts.binary:
        return [
            Finding(
                e.name,
                BINARY_MOVE,
                old,
                e.version,
                f"binary base distribution {e.name} moves {old} -> {e.version}: "
                f"{'newer' if _newer(e.version, old) else 'older'} than what vllm {vllm} shipped with; "
                "passed the binary checks — test it with this vllm before shipping.",
                [],
                gate.chain(e.name),
            )
        ]
    newer = _newer(e.version, old)
    rule = NEWER_THAN_BASE if newer else OLDER_THAN_BASE
    word = "newer" if newer else "older"
    return [
        Finding(
            e.name,
            rule,
            old,
            e.version,
            f"{e.name} {e.version} is {word} than what vllm {vllm} shipped with ({old}); "
            "pure Python, allowed — test it with this vllm before shipping.",
            [],
            gate.chain(e.name),
        )
    ]


def _sorted_out(findings: list[Finding], allow: Mapping[str, str]) -> GateResult:
    """Notices, findings the header allows (with its reason), violations."""
    result = GateResult()
    for fd in findings:
        if fd.rule in NOTICE_RULES:
            result.notices.append(fd)
        elif canonical_name(fd.name) in allow:
            fd.reason = allow[canonical_name(fd.name)]
            result.allowed.append(fd)
        else:
            result.violations.append(fd)
    return result


def _newer(new: str, old: str | None) -> bool:
    try:
        return old is None or Version(new) > Version(old)
    except ValueError:  # InvalidVersion, or a part past int()'s digit limit
        return new > (old or "")


def _numpy_findings(base, entries, final, final_facts, chain) -> list[Finding]:
    out: list[Finding] = []
    by_key = {e.key: e for e in entries}
    base_np = base.get("numpy")
    final_np = final.get("numpy")
    if final_np is None:
        return out
    old_v = base_np.version if base_np else None
    new_v = final_np[1]
    old_major, new_major = _major(old_v), _major(new_v)
    gen_new = "2" if new_major and int(new_major) >= 2 else "1"
    moved_across = old_major is not None and new_major is not None and (int(old_major) >= 2) != (int(new_major) >= 2)
    if moved_across:
        other = "1" if gen_new == "2" else "2"
        evidence = [
            numpy_evidence(final[k][0], final[k][1], facts, other)
            for k, facts in sorted(final_facts.items())
            if k != "numpy" and facts.numpy_abi.get(other, 0) > 0 and facts.numpy_abi.get(gen_new, 0) == 0
        ]
        if evidence:
            e = by_key["numpy"]
            out.append(
                Finding(
                    "numpy",
                    NUMPY_ABI,
                    old_v,
                    new_v,
                    f"numpy would move {old_v} -> {new_v} (across a major version) while "
                    f"{_plural(len(evidence), 'distribution')} of the final set "
                    f"{'ships' if len(evidence) == 1 else 'ship'} extensions built against "
                    f"numpy {other}.x, which cannot be loaded by numpy {new_v}.",
                    evidence,
                    chain(e.name),
                )
            )
    elif gen_new == "2":
        # numpy stays 2.x: an overlay extension built against 1.x cannot load.
        for e in sorted(entries, key=lambda x: x.key):
            if e.key == "numpy":
                continue
            if e.facts.numpy_abi.get("1", 0) > 0 and e.facts.numpy_abi.get("2", 0) == 0:
                b = base.get(e.name)
                out.append(
                    Finding(
                        e.name,
                        NUMPY_ABI,
                        b.version if b else None,
                        e.version,
                        f"{e.name} {e.version} ships extensions built against numpy 1.x, the final set has numpy "
                        f"{new_v}.",
                        [numpy_evidence(e.name, e.version, e.facts, "1")],
                        chain(e.name),
                    )
                )
    return out


# ---------------------------------------------------------------- messages


def format_finding(fd: Finding) -> str:
    lines = [f"- [{fd.rule}] {fd.change}: {fd.message}"]
    for ev in fd.evidence:
        lines.append(f"    evidence: {ev}")
    if len(fd.chain) > 1:
        lines.append(f"    pulled by: {fd.chain_text}")
    if fd.reason:
        lines.append(f"    allowed: {fd.reason}")
    return "\n".join(lines)


def ways_out(fd: Finding) -> list[str]:
    outs = []
    if len(fd.chain) == 2 and fd.chain[-1].startswith("overlay"):
        req = fd.chain[-1][len("overlay") :].strip(" ()") or fd.name
        outs.append(f"drop or loosen the overlay requirement {req!r}")
    elif len(fd.chain) > 2 and fd.chain[-1].startswith("overlay"):
        outs.append(
            f"drop the overlay requirement that pulls it ({fd.chain[-1][len('overlay') :].strip(' ()')}) or pin "
            f"an older {fd.chain[1].split(' ')[0]} with --with"
        )
    elif len(fd.chain) > 1:
        outs.append(
            f"pin an older version of the package that pulls it ({fd.chain[1].split(' (')[0]})"
            " with --with so it fits the base"
        )
    if fd.rule == TORCH_ABI:
        outs.append(
            f"use a build of {fd.name} made for the base's torch (a release whose requirements pin that torch, "
            "or a wheel with its local tag, +ptXY), or build it from source against the image's torch"
        )
    if fd.rule == LOCKSTEP:
        outs.append("move the other members with it (--with NAME==VERSION for each) or keep this one at the base's")
    if fd.rule == NUMPY_ABI and canonical_name(fd.name) == "numpy" and _major(fd.new) not in (None, "0", "1"):
        # numpy goes to 2.x: the distributions in the evidence (built against 1.x) can move to a
        # release built against numpy 2 — naming them in --with releases their base pins
        olds = [ev.split(":", 1)[0].split(" ") for ev in fd.evidence if ev.endswith("numpy 1.x")]
        olds = [o for o in olds if len(o) == 2]
        if olds:
            names = ", ".join(n for n, _ in olds[:4]) + (", ..." if len(olds) > 4 else "")
            reqs = " ".join(f"--with '{n}>{v}'" for n, v in olds[:4])
            outs.append(f"move {names} to a release built against numpy 2 ({reqs}; the gate checks the new files)")
    outs.append(f"--allow-abi-change {fd.name} --reason TEXT (recorded in the lock header; you own the risk)")
    return outs


def format_rejection(result: GateResult) -> str:
    """The multi-line explanation printed with exit 3."""
    parts = []
    for fd in result.violations:
        parts.append(format_finding(fd))
        parts.append("    ways out: " + "; or ".join(ways_out(fd)))
    return "\n".join(parts)


def format_notices(result: GateResult) -> str:
    return "\n".join(format_finding(fd) for fd in result.notices + result.allowed)
