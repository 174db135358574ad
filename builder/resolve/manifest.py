"""Base manifest: what the official image already holds (the immovable floor).

File format (JSON, ``schema = "build-image/base-manifest/v1"``)::

    {
      "schema": "build-image/base-manifest/v1",
      "image": {"ref": "vllm/vllm-openai:v0.26.0", "digest": "sha256:..." | null},
      "os": "Ubuntu 22.04.5 LTS" | null,
      "glibc": "2.35",
      "python": {"version": "3.12", "abi": "cp312",
                 "site_packages": "/usr/local/lib/python3.12/dist-packages"},
      "cuda": "13.0" | null,
      "platform": "x86_64-manylinux_2_35",          # uv --python-platform
      "provenance": {"kind": "read-from-image" | "reconstructed",
                     "method": "free text: exactly how it was produced",
                     "recipe": {"sdist": {"filename", "sha256"}, "exclude_newer", "steps": [...]}},  # reconstructed
      "lacks": {"off_index": [...], "source_builds": [...], "other_indexes": [...], "os_packages": [...],
                "unversioned": {"name": "why the manifest cannot version it"}},          # optional
      "uv_overrides": ["nvidia-nccl-cu13==2.30.7"],  # optional: the image's ENV UV_OVERRIDE pins
      "distributions": {                           # keyed by canonical name
        "numpy": {"name": "numpy", "version": "1.26.4",
                  "binary": true, "extensions": 12,
                  "numpy_abi": {"1": 0, "2": 0},   # extensions referencing each C-API generation
                  "glibc": "2.17" | null,          # highest GLIBC_x.y needed by its ELF files
                  "python_abi": "cp312" | "abi3" | "none",
                  "native_sha256": "...",          # optional: digest of its ELF files (below)
                  "torch_exports": "v1:...",       # optional, torch's entry: its exported C++ symbols (below)
                  "cuda_sass": [80, 90, 100],      # optional: GPU architectures of its CUDA binaries (below)
                  "cuda_ptx": [120], "cuda_runtime": 13}
      },
      "consistency": {"tool": "pip" | "uv",        # optional: the base's own `pip check` problems
                      "problems": ["..."]}
    }

``native_sha256`` (optional, distributions with native code): sha256 over the lines
``relpath<TAB>sha256`` of the ELF files its RECORD lists (``templates/checks/base_check.py``
computes it, on the host for the manifest and in the image's checks stage).
``torch_exports`` (optional, the distribution shipping ``libtorch*.so``/``libc10*.so``): the
torch-namespace symbols those libraries export, as a compact set (:mod:`builder.resolve.elfsyms`:
sorted 32-bit keys of the names, delta-encoded, zlib'd, base64'd); the gate's ``torch-abi`` rule
checks an added extension's undefined torch symbols against it without the image.
``cuda_sass``/``cuda_ptx``/``cuda_runtime`` (optional, distributions with CUDA binaries): the
architectures (compute capability x 10) of the SASS and PTX entries of their ELF files' fat binaries,
and the CUDA runtime major they link (``libcudart.so.N``), read by :mod:`builder.resolve.fatbin`;
``plan`` refuses a GPU they do not cover.
``consistency`` (optional): what ``pip check`` (``uv pip check`` on a base whose
manifest lists uv but not pip) reports on the base itself, recorded when the manifest
is made; the image build allows exactly these.  Manifests without either field stay
readable: the build compares what the manifest has.

This module is pure data: load/validate/save, and the base's PEP 508 marker environment
(:func:`target_environment`).  The binary scan lives in ``builder.resolve.scanner``.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builder import values
from builder.credentials import credential_fields, redact_text
from builder.errors import BadInput
from builder.platforms import parse_python_platform
from builder.report import render_json
from builder.resolve.fatbin import ARCHS, MAX_ARCHS
from builder.util import atomic_write_text, canonical_name, refuse_foreign, write_target
from builder.validate import exclude_newer, load_json, read_bounded_text

SCHEMA = "build-image/base-manifest/v1"
_XY = re.compile(r"[0-9]{1,4}\.[0-9]{1,4}")  # glibc, python.version, cuda: X.Y in ASCII digits
PROVENANCE_KINDS = ("read-from-image", "reconstructed")


@dataclass
class DistFacts:
    """Binary facts of one distribution, read from its files (never from its name)."""

    binary: bool = False
    extensions: int = 0
    numpy_abi: dict[str, int] = field(default_factory=lambda: {"1": 0, "2": 0})
    glibc: str | None = None
    python_abi: str = "none"
    native_sha256: str | None = None  # digest of its ELF files (optional; see the module doc)
    # ELF files by the header's e_machine (EM_X86_64, EM_AARCH64): read by the gate from a wheel's files; neither
    # a manifest nor a lock records it (a base's files are its platform's by construction)
    machines: dict[str, int] = field(default_factory=dict, compare=False)
    # the torch-namespace symbols its ELF files leave undefined, by file name (only files linked against torch):
    # read by the gate from an added wheel (``torch-abi``); neither a manifest nor a lock records it
    torch_needs: dict[str, list[str]] = field(default_factory=dict, compare=False)
    # the torch-namespace symbols its libtorch*/libc10* libraries export, as the compact set of
    # builder.resolve.elfsyms.pack_symbols (torch's entry in a manifest; None elsewhere)
    torch_exports: str | None = field(default=None, compare=False)
    # the GPU architectures its CUDA binaries carry (90 = sm_90), as SASS (runs on that major's GPUs of the same
    # or a later minor) and as PTX (the driver compiles it for that and any later GPU), and the CUDA runtime
    # major they link (libcudart.so.N): read from each ELF file's .nv_fatbin (builder.resolve.fatbin)
    cuda_sass: list[int] = field(default_factory=list, compare=False)
    cuda_ptx: list[int] = field(default_factory=list, compare=False)
    cuda_runtime: int | None = field(default=None, compare=False)

    @property
    def numpy_generations(self) -> set[str]:
        return {gen for gen, n in self.numpy_abi.items() if n}


@dataclass
class Distribution:
    name: str
    version: str
    facts: DistFacts = field(default_factory=DistFacts)

    @property
    def key(self) -> str:
        return canonical_name(self.name)


@dataclass(frozen=True)
class Held:
    """What a base image holds of one distribution, as its manifest knows it: the scanned version (``reason``
    None), or for one the replay does not hold (``lacks.unversioned``) the version its recipe names (None
    where it names none) and the reason it is not replayed."""

    version: str | None
    reason: str | None = None

    @property
    def replayed(self) -> bool:
        return self.reason is None

    @property
    def kind(self) -> str:
        """``approximated``, ``off-index``, ``source-build``, ``relaxed``: the reason's first word."""
        if self.reason is None:
            return ""
        return self.reason.split(":", 1)[0].strip() or "not replayed"

    def text(self) -> str:
        """``0.7.2`` (replayed), ``0.7.3 (approximated, not replayed)``, ``unversioned (source-build, not
        replayed)``."""
        if self.replayed:
            return self.version or "-"
        return f"{self.version or 'unversioned'} ({self.kind}, not replayed)"


def _named_version(name: str, reason: str) -> str | None:
    """The version a not-replayed distribution's reason names (``NAME==VERSION`` or ``NAME VERSION``), None when
    it names none."""
    spelled = r"[-_.]".join(re.escape(p) for p in re.split(r"[-_.]+", name))
    pattern = r"(?<![\w.-])" + spelled + r"(?:\[[^\]]*\])?(?:==|\s+)(\d[A-Za-z0-9.+!_-]*?)(?=[\s,;()]|$)"
    m = re.search(pattern, reason, re.I)
    return m.group(1) if m else None


@dataclass
class BaseManifest:
    image_ref: str | None
    image_digest: str | None
    os: str | None
    glibc: str
    python_version: str
    python_abi: str
    site_packages: str | None
    cuda: str | None
    platform: str
    provenance_kind: str
    provenance_method: str
    distributions: dict[str, Distribution]
    consistency: dict | None = None  # {"tool": "pip"|"uv", "problems": [...]}, when recorded
    # reconstructed from a recipe: the sdist and the replayed steps ({"sdist": {...}, "exclude_newer": ..., "steps":
    # [...]})
    provenance_recipe: dict | None = None
    # what the manifest knowingly lacks: off_index, source_builds, other_indexes, os_packages (lists of text) and
    # unversioned ({name: reason}: distributions the image holds whose version the manifest cannot give)
    lacks: dict | None = None
    # pins the image's environment applies to every `uv pip install` in it (ENV UV_OVERRIDE's file)
    uv_overrides: list[str] | None = None

    def __post_init__(self) -> None:
        # the image reference reaches FROM lines, labels, the SBOM and the provenance: a user:password@ in it
        # (an image reference holds none; `docker login` keeps registry credentials) is refused where it enters
        if isinstance(self.image_ref, str) and self.image_ref and redact_text(self.image_ref) != self.image_ref:
            raise BadInput(
                f"the base image reference {redact_text(self.image_ref)} carries a credential; an image "
                "reference holds none, and build-image writes it into the Dockerfile, labels, SBOM and "
                "provenance.",
                hint="log in to the registry with `docker login` and name the image without user:password@.",
            )
        self._check_values()

    def _check_values(self) -> None:
        """The grammar of every field that reaches a Dockerfile, a label, a lock line or a shell hint
        (:mod:`builder.values`): a newline or another control character in any of them is refused here, by
        construction, whether the manifest was read from a file or made by `base snapshot`."""
        where = "base manifest"
        if self.image_ref:
            self.image_ref = values.ImageRef(self.image_ref, f"{where}: 'image.ref'")
        if self.image_digest:
            self.image_digest = values.Digest(self.image_digest, f"{where}: 'image.digest'")
        for name in (
            "os",
            "glibc",
            "python_version",
            "python_abi",
            "cuda",
            "platform",
            "provenance_kind",
            "provenance_method",
        ):
            val = getattr(self, name)
            if val is not None:
                setattr(self, name, values.Line(val, f"{where}: '{name}'"))
        self.site_packages = values.PathText.optional(self.site_packages, f"{where}: 'python.site_packages'")
        for key, d in self.distributions.items():
            d.name = values.DistName(d.name, f"{where}: 'distributions.{key}.name'")
            d.version = values.Version(d.version, f"{where}: 'distributions.{key}.version'")
        for i, pin in enumerate(self.uv_overrides or ()):
            values.Line(pin, f"{where}: 'uv_overrides[{i}]'")

    @property
    def unversioned(self) -> dict[str, str]:
        """Canonical name → reason, for what the image holds but the manifest cannot version."""
        return {canonical_name(k): v for k, v in ((self.lacks or {}).get("unversioned") or {}).items()}

    def get(self, name: str) -> Distribution | None:
        return self.distributions.get(canonical_name(name))

    def held(self, name: str) -> Held | None:
        """What the image holds of ``name`` (:class:`Held`): the scanned version, or — for a distribution
        the replay approximates, relaxes or cannot build (``lacks.unversioned``) — the version its recipe names
        and why it is not replayed; None when the image holds none.  The one place a reviewer's view (diff,
        upgrade report, ``base list``) reads a base's version from, so that a left-out distribution is never
        shown as removed."""
        d = self.get(name)
        if d is not None:
            return Held(d.version)
        reason = self.unversioned.get(canonical_name(name))
        if reason is None:
            return None
        return Held(_named_version(name, reason), reason)

    @property
    def pinned_ref(self) -> str | None:
        """``ref@digest`` when the digest is known, else the ref."""
        if self.image_ref and self.image_digest:
            return f"{self.image_ref.split('@')[0]}@{self.image_digest}"
        return self.image_ref

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "image": {"ref": self.image_ref, "digest": self.image_digest},
            "os": self.os,
            "glibc": self.glibc,
            "python": {
                "version": self.python_version,
                "abi": self.python_abi,
                "site_packages": self.site_packages,
            },
            "cuda": self.cuda,
            "platform": self.platform,
            "provenance": {
                "kind": self.provenance_kind,
                "method": self.provenance_method,
                **({"recipe": self.provenance_recipe} if self.provenance_recipe else {}),
            },
            **({"lacks": self.lacks} if self.lacks else {}),
            **({"uv_overrides": self.uv_overrides} if self.uv_overrides else {}),
            "distributions": {
                key: {"name": d.name, "version": d.version, **_facts_doc(d.facts)}
                for key, d in sorted(self.distributions.items())
            },
        }
        if self.consistency is not None:
            doc["consistency"] = {"tool": self.consistency["tool"], "problems": list(self.consistency["problems"])}
        return render_json(doc, ensure_ascii=True)  # the one JSON writer: no credential in any value

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, self.to_json())


def _facts_doc(facts: DistFacts) -> dict:
    """The facts as the file holds them: an optional field that is None is left out (old files stay byte-identical)."""
    doc = asdict(facts)
    doc.pop("machines", None)
    doc.pop("torch_needs", None)
    for optional in ("native_sha256", "torch_exports", "cuda_sass", "cuda_ptx", "cuda_runtime"):
        if doc.get(optional) in (None, []):
            doc.pop(optional, None)
    return doc


def _consistency(doc: dict, path: str) -> dict | None:
    rec = _opt(doc, "consistency", dict, "", path)
    if rec is None:
        return None
    tool = _req(rec, "tool", str, "consistency.", path)
    if tool not in ("pip", "uv"):
        raise BadInput(f"base manifest {path}: 'consistency.tool' must be 'pip' or 'uv', got {tool!r:.60}.")
    probs = _req(rec, "problems", list, "consistency.", path)
    if not all(isinstance(p, str) for p in probs):
        raise BadInput(f"base manifest {path}: 'consistency.problems' must be a list of strings.")
    return {"tool": tool, "problems": list(probs)}


def refuse_foreign_manifest(path: str | Path, *, force: bool = False) -> None:
    """The output rule for a manifest ``-o``: an existing file that is not a base manifest build-image wrote
    (its second line is not the schema line :meth:`BaseManifest.to_json` writes) is not replaced without
    ``--force``; a device node or FIFO never is."""
    write_target(path)
    refuse_foreign(path, "base manifest", force=force, marks=(f'  "schema": "{SCHEMA}"',))


def target_environment(python_version: str, platform: str) -> dict[str, str]:
    """PEP 508 marker environment of a CPython base on Linux, read from its Python version and
    platform (``3.12``, ``x86_64-manylinux_2_35``: the manifest's ``python.version`` and ``platform``)."""
    arch = platform.split("-", 1)[0]
    full = python_version if python_version.count(".") >= 2 else f"{python_version}.0"
    return {
        "implementation_name": "cpython",
        "implementation_version": full,
        "os_name": "posix",
        "platform_machine": arch,
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": full,
        "platform_python_implementation": "CPython",
        "python_version": ".".join(python_version.split(".")[:2]),
        "sys_platform": "linux",
    }


def _req(doc: dict, key: str, typ: type | tuple, where: str, path: str) -> Any:
    if key not in doc:
        raise BadInput(f"base manifest {path}: missing field '{where}{key}'.")
    val = doc[key]
    if not isinstance(val, typ):
        raise BadInput(
            f"base manifest {path}: field '{where}{key}' should be {getattr(typ, '__name__', typ)}, "
            f"got {type(val).__name__} ({val!r:.60})."
        )
    return val


def _opt(doc: dict, key: str, typ: type, where: str, path: str) -> Any:
    """An optional field: absent or null -> None; present -> of type ``typ`` (a bool is not an int)."""
    val = doc.get(key)
    if val is None:
        return None
    if not isinstance(val, typ) or (typ is int and isinstance(val, bool)):
        raise BadInput(
            f"base manifest {path}: field '{where}{key}' should be {typ.__name__}, "
            f"got {type(val).__name__} ({val!r:.60})."
        )
    return val


def _refuse_credentials(doc: dict, path: str) -> None:
    """A manifest is copied byte for byte into every context (and the image): one carrying a credential
    (userinfo in an image reference or a URL, a token in a query) is refused, never shipped."""
    found = credential_fields(doc)
    if found:
        raise BadInput(
            f"base manifest {path}: {', '.join(found[:5])} carries a credential (a user:password@ or a "
            "token); a manifest is copied into every context and image, so it is refused.",
            hint="regenerate it with `build-image base snapshot` from a reference without credentials "
            "(log in to the registry with `docker login` instead).",
        )


def _distributions(dists_doc: dict, path: str) -> dict[str, Distribution]:
    """The manifest's ``distributions`` object, checked entry by entry: keyed by canonical name."""
    dists: dict[str, Distribution] = {}
    for key, d in dists_doc.items():
        if not isinstance(d, dict):
            raise BadInput(f"base manifest {path}: 'distributions.{key}' must be an object.")
        where = f"distributions.{key}."
        name = _req(d, "name", str, where, path)
        version = _req(d, "version", str, where, path)
        if canonical_name(name) != canonical_name(key):
            raise BadInput(
                f"base manifest {path}: 'distributions.{key}' holds {name!r}; the key must be "
                "the distribution's (canonical) name."
            )
        if canonical_name(name) in dists:
            raise BadInput(f"base manifest {path}: distribution {name!r} is listed twice.")
        facts = _facts(d, where, path)
        dists[canonical_name(name)] = Distribution(name=name, version=version, facts=facts)
    return dists


#: the highest count (ELF files, extensions per numpy generation) a reader takes
_COUNT_MAX = 1 << 31


def _count(d: dict, key: str, where: str, path: str, low: int = 0, high: int = _COUNT_MAX) -> int | None:
    """An optional integer field in ``[low, high]`` (a count of files, a CUDA runtime major)."""
    val = _opt(d, key, int, where, path)
    if val is not None and not low <= val <= high:
        raise BadInput(
            f"base manifest {path}: field '{where}{key}' must be an integer in [{low}, {high}], got {str(val)[:40]}."
        )
    return val


def check_facts(facts: DistFacts, where: str) -> DistFacts:
    """The one grammar of a distribution's binary facts, whichever file they are read from (a base manifest, a
    lock's ``# facts:`` line, a pylock's facts table): ``glibc`` :class:`~builder.values.Glibc` (ASCII digits: a
    ``²`` or a 5000-digit number reaches ``int()`` where the gate compares), ``python_abi``
    :class:`~builder.values.AbiTag`, counts in ``[0, 2**31]``; ``facts`` with the typed values, else BadInput
    naming ``where``."""
    counts = {"extensions": facts.extensions, **{f"numpy_abi.{g}": n for g, n in facts.numpy_abi.items()}}
    for key, n in counts.items():
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= _COUNT_MAX:
            raise BadInput(f"{where}: '{key}' must be a count in [0, {_COUNT_MAX}], got {str(n)[:40]}.")
    facts.glibc = values.Glibc.optional(facts.glibc, f"{where}: 'glibc'")
    facts.python_abi = values.AbiTag(facts.python_abi, f"{where}: 'python_abi'")
    return facts


def _facts(d: dict, where: str, path: str) -> DistFacts:
    """One distribution's binary facts from a manifest: each field of its JSON type, then :func:`check_facts`,
    :func:`_archs`, :func:`_torch_exports` and ``cuda_runtime`` in [1, 999]."""
    numpy_abi = _opt(d, "numpy_abi", dict, where, path) or {"1": 0, "2": 0}
    facts = DistFacts(
        binary=bool(_opt(d, "binary", bool, where, path)),
        extensions=_count(d, "extensions", where, path) or 0,
        numpy_abi={gen: _count(numpy_abi, gen, f"{where}numpy_abi.", path) or 0 for gen in ("1", "2")},
        glibc=_opt(d, "glibc", str, where, path),
        python_abi=_opt(d, "python_abi", str, where, path) or "none",
        native_sha256=_opt(d, "native_sha256", str, where, path),
        torch_exports=_torch_exports(d, where, path),
        cuda_sass=_archs(d, "cuda_sass", where, path),
        cuda_ptx=_archs(d, "cuda_ptx", where, path),
        cuda_runtime=_count(d, "cuda_runtime", where, path, low=1, high=999),
    )
    if facts.native_sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", facts.native_sha256):
        raise BadInput(
            f"base manifest {path}: field '{where}native_sha256' must be 64 lowercase hex digits, "
            f"got {facts.native_sha256!r:.60}."
        )
    return check_facts(facts, f"base manifest {path}: '{where.rstrip('.')}'")


#: the longest ``torch_exports`` text a manifest may hold (torch 2.14's: ~140 KB)
MAX_TORCH_EXPORTS = 8 << 20


def _torch_exports(d: dict, where: str, path: str) -> str | None:
    """A distribution's ``torch_exports``: ``v1:`` and base64 (decoded only when the gate reads it)."""
    val = _opt(d, "torch_exports", str, where, path)
    if val is not None and (len(val) > MAX_TORCH_EXPORTS or not re.fullmatch(r"v1:[A-Za-z0-9+/]*={0,2}", val)):
        raise BadInput(
            f"base manifest {path}: field '{where}torch_exports' must be 'v1:' and base64 text of at most "
            f"{MAX_TORCH_EXPORTS} characters (the set `base snapshot` writes), got {val[:40]!r}..."
        )
    return val


def _archs(d: dict, key: str, where: str, path: str) -> list[int]:
    """``cuda_sass``/``cuda_ptx``: at most :data:`~builder.resolve.fatbin.MAX_ARCHS` architectures, each compute
    capability x 10 (``90``) in :data:`~builder.resolve.fatbin.ARCHS` (the scanner's rule)."""
    val = _opt(d, key, list, where, path) or []
    if len(val) > MAX_ARCHS or not all(isinstance(a, int) and not isinstance(a, bool) and a in ARCHS for a in val):
        raise BadInput(
            f"base manifest {path}: field '{where}{key}' must list GPU architectures as integers "
            f"(compute capability x 10: 90 for sm_90), got {val!r:.60}."
        )
    return sorted(set(val))


def parse_manifest(text: str, path: str = "<manifest>") -> BaseManifest:
    try:
        doc = load_json(text, f"base manifest {path}")
    except json.JSONDecodeError as exc:
        raise BadInput(
            f"base manifest {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}).",
            hint="regenerate it with `build-image base snapshot`.",
        ) from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise BadInput(
            f"base manifest {path}: field 'schema' must be {SCHEMA!r} "
            f"(got {doc.get('schema') if isinstance(doc, dict) else type(doc).__name__!r}).",
        )
    _refuse_credentials(doc, path)
    image = _req(doc, "image", dict, "", path)
    py = _req(doc, "python", dict, "", path)
    prov = _req(doc, "provenance", dict, "", path)
    kind = _req(prov, "kind", str, "provenance.", path)
    if kind not in PROVENANCE_KINDS:
        raise BadInput(f"base manifest {path}: 'provenance.kind' must be one of {PROVENANCE_KINDS}, got {kind!r}.")
    dists_doc = _req(doc, "distributions", dict, "", path)
    dists = _distributions(dists_doc, path)
    for field_, val, example in (
        ("glibc", _req(doc, "glibc", str, "", path), "2.35"),
        ("python.version", _req(py, "version", str, "python.", path), "3.12"),
        ("cuda", _opt(doc, "cuda", str, "", path) or "0.0", "13.0"),
    ):
        if not _XY.fullmatch(val):
            raise BadInput(f"base manifest {path}: field '{field_}' must look like {example}, got {val!r:.60}.")
    parse_python_platform(_req(doc, "platform", str, "", path), where=f"base manifest {path}: field 'platform'")
    return BaseManifest(
        image_ref=_opt(image, "ref", str, "image.", path),
        image_digest=_opt(image, "digest", str, "image.", path),
        os=_opt(doc, "os", str, "", path),
        glibc=_req(doc, "glibc", str, "", path),
        python_version=_req(py, "version", str, "python.", path),
        python_abi=(
            _opt(py, "abi", str, "python.", path) or "cp" + _req(py, "version", str, "python.", path).replace(".", "")
        ),
        site_packages=_opt(py, "site_packages", str, "python.", path),
        cuda=_opt(doc, "cuda", str, "", path),
        platform=_req(doc, "platform", str, "", path),
        provenance_kind=kind,
        provenance_method=_req(prov, "method", str, "provenance.", path),
        distributions=dists,
        provenance_recipe=_provenance_recipe(prov, path),
        lacks=_lacks(doc, path),
        uv_overrides=_overrides(doc, path),
        consistency=_consistency(doc, path),
    )


def _provenance_recipe(prov: dict, path: str) -> dict | None:
    """``provenance.recipe`` (a reconstructed base): ``sdist`` {filename, sha256}, ``exclude_newer`` (an
    instant), ``steps`` (objects; their ``indexes`` URLs) and ``unmet_requirements`` (text), each of its
    type here, so ``base list``, ``base materialize`` and the replay read them without checking."""
    recipe = _opt(prov, "recipe", dict, "provenance.", path)
    if recipe is None:
        return None
    where = "provenance.recipe."
    sdist = _opt(recipe, "sdist", dict, where, path)
    if sdist is not None:
        _opt(sdist, "filename", str, f"{where}sdist.", path)
        sha = _opt(sdist, "sha256", str, f"{where}sdist.", path)
        if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise BadInput(f"base manifest {path}: field '{where}sdist.sha256' must be 64 lowercase hex digits.")
    exclude_newer(recipe.get("exclude_newer"), where=f"base manifest {path}: field '{where}exclude_newer'")
    for i, step in enumerate(_opt(recipe, "steps", list, where, path) or ()):
        if not isinstance(step, dict):
            raise BadInput(f"base manifest {path}: '{where}steps[{i}]' must be an object.")
        for key in ("indexes", "unreachable_indexes"):
            if not all(isinstance(u, str) for u in _opt(step, key, list, f"{where}steps[{i}].", path) or ()):
                raise BadInput(f"base manifest {path}: '{where}steps[{i}].{key}' must be a list of URLs.")
    if not all(isinstance(r, str) for r in _opt(recipe, "unmet_requirements", list, where, path) or ()):
        raise BadInput(f"base manifest {path}: '{where}unmet_requirements' must be a list of strings.")
    return recipe


def _overrides(doc: dict, path: str) -> list[str] | None:
    val = _opt(doc, "uv_overrides", list, "", path)
    if val is not None and not all(isinstance(x, str) for x in val):
        raise BadInput(f"base manifest {path}: 'uv_overrides' must be a list of requirement strings.")
    return val


def _lacks(doc: dict, path: str) -> dict | None:
    lacks = _opt(doc, "lacks", dict, "", path)
    if lacks is None:
        return None
    for k, v in lacks.items():
        if k == "unversioned":
            if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
                raise BadInput(f"base manifest {path}: 'lacks.unversioned' must map names to reasons.")
            for name, reason in v.items():  # a name reaches labels and reports; a reason is one line of text
                values.DistName(name, f"base manifest {path}: 'lacks.unversioned' key")
                values.Line(reason, f"base manifest {path}: 'lacks.unversioned.{name}'")
        elif not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise BadInput(f"base manifest {path}: 'lacks.{k}' must be a list of strings.")
        else:
            for i, item in enumerate(v):
                values.Line(item, f"base manifest {path}: 'lacks.{k[:40]}[{i}]'")
    return lacks


def load_manifest(path: str | Path) -> BaseManifest:
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise BadInput(f"base manifest {p} does not exist.", hint="pass --base with a manifest file or an image ref.")
    return parse_manifest(read_bounded_text(p, "base manifest"), str(p))
