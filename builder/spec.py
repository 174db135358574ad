"""The build spec: ``build-image.toml`` (optional) + command-line flags (flags win).

Example ``build-image.toml``::

    vllm = "0.26.0"
    base = "lockfiles/base/vllm-openai-v0.26.0.json"   # manifest file or image ref
    with = ["ray[serve]", "pyarrow>=15"]               # overlay requirements (added to the default)
    lock = "lockfiles/vllm-0.26.0/requirements.lock"
    repo = "127.0.0.1:5000/serving/vllm"               # image repository for tags
    find-links = ["wheels/"]                           # lock: extra wheel folders (added to --find-links)
    no-index = false                                   # lock: only the find-links folders (--no-index wins)
    exclude-newer = "2026-07-25"                       # lock: uv --exclude-newer (the flag wins)

    [allow-abi-change]
    numpy = "reason text, recorded in the lock header"

    [[lockstep]]                       # lock: a family the gate's lockstep rule adds to its shipped table
    name = "lmcache-vllm"
    kind = "requires"                  # or "same-version" with members = ["a", "b"]
    when = "lmcache>=0.3.10"
    needs = "vllm>=0.11.1"
    source = "where the rule comes from"

    [serving]
    model = "/models/qwen"
    gpus = 8                 # GPUs per node
    gpu_memory = "80GiB"
    tp = 8
    pp = 1
    distributed_executor_backend = "mp"   # or "ray" (vLLM's executor across the TP x PP GPUs)
    max_model_len = 131072
    gpu_memory_utilization = 0.90
    max_num_seqs = 16
    kv_cache_dtype = "auto"
    load_format = "auto"                  # vLLM --load-format (checked against the release's LoadFormats)
    compile_cache = "node"                # VLLM_CACHE_ROOT on a hostPath of the node ("none", or "pvc:CLAIM")
    model_cache = "none"                  # "node": the checkpoint from a node-local cache (hostPath at /models);
                                          # "object": streamed from object storage (s3://..., runai_streamer)
    concurrency = 16                      # promote: the smoke attestation ran at least this many requests at once
    gpu_model = "NVIDIA H200"             # promote: the attestation's GPU model (nvidia-smi's name)
    checkpoint_sha256 = "<64 hex>"        # promote: sha256 of the checkpoint's model.safetensors.index.json
    replicas = 2                          # Serve replicas (each tp x pp GPUs)
    autoscaler = true                     # KubeRay's in-tree autoscaler
    gateway_class = "istio"               # with autoscaler and replicas >= 2: incremental RayService upgrade
    gpu_node_affinity = true              # KubeRay: GPU workers on nodes whose driver meets the image's CUDA
                                          # (nvidia.com/cuda.driver.major) and, with gpu_model, of that GPU
    platform = "linux/arm64"              # KubeRay: the pods' kubernetes.io/arch (of a multi-platform image;
                                          # default: the image's one platform, linux/amd64 for both)

Unknown keys are rejected (a typo must not be silently ignored).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from builder import values
from builder.data import path as data_path
from builder.errors import BadInput
from builder.platforms import DEFAULT, KNOWN, Platform
from builder.platforms import parse as parse_platform
from builder.util import canonical_name
from builder.validate import check_release, exclude_newer, load_toml, number, read_bounded_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_SPEC_FILE = "build-image.toml"
DEFAULT_OVERLAY = ("ray[serve]",)
EXECUTOR_BACKENDS = ("mp", "ray")  # serving.distributed_executor_backend (vLLM --distributed-executor-backend)


def lockfiles_dir() -> Path:
    """``./lockfiles`` of the checkout the command runs in; else (run from elsewhere) the
    package's own ``lockfiles`` (:func:`builder.data.path`).  Base manifests and default
    locks are both found here, so they never come from two different places."""
    local = Path("lockfiles")
    return local if local.is_dir() else data_path("lockfiles")


def supported_vllm_versions(platform: Platform = DEFAULT) -> list[str]:
    """vLLM versions this checkout has a base manifest for (of ``platform``'s image)."""
    from packaging.version import Version

    def key(v: str):
        try:
            return (0, Version(v))
        except ValueError:  # InvalidVersion, or a part past int()'s digit limit
            return (1, v)

    base = lockfiles_dir() / "base"
    suffix = platform.file_suffix()
    others = tuple(p.file_suffix() for p in KNOWN if p != platform and not p.is_default)
    names = (p.name[len("vllm-openai-v") : -len(".json")] for p in base.glob("vllm-openai-v*.json"))
    return sorted(
        (
            n[: len(n) - len(suffix)] if suffix else n
            for n in names
            if (n.endswith(suffix) if suffix else True) and not n.endswith(others)
        ),
        key=key,
    )


def _release_part(vllm: str) -> str:
    """``vllm`` as it names a shipped file: a PEP 440 version of at most 200 characters (:class:`values.Version`),
    so a path (``../x``) or a 5000-digit text never becomes a file name (``File name too long``)."""
    return str(values.Version(vllm, "vLLM release"))


def default_base_manifest(vllm: str, platform: Platform = DEFAULT) -> Path:
    """``lockfiles/base/vllm-openai-vX.json`` (linux/amd64) or ``vllm-openai-vX-linux-arm64.json``."""
    return lockfiles_dir() / "base" / f"vllm-openai-v{_release_part(vllm)}{platform.file_suffix()}.json"


def default_lock_path(vllm: str, platform: Platform = DEFAULT) -> Path:
    """``lockfiles/vllm-X/requirements.lock`` (linux/amd64) or ``lockfiles/vllm-X/linux-arm64/requirements.lock``."""
    folder = lockfiles_dir() / f"vllm-{_release_part(vllm)}"
    return (folder if platform.is_default else folder / platform.slug) / "requirements.lock"


@dataclass
class Serving:
    model: str | None = None
    gpus: int | None = None
    gpu_memory: str | None = None
    tp: int = 1
    pp: int = 1
    distributed_executor_backend: str | None = None  # mp | ray (None: vLLM's choice)
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.90
    max_num_seqs: int | None = None
    kv_cache_dtype: str = "auto"
    cpu_offload_gb: float = 0.0
    load_format: str = "auto"  # vLLM --load-format (docs/cold-start.md)
    compile_cache: str = "node"  # KubeRay: VLLM_CACHE_ROOT volume: node (hostPath) | none | pvc:CLAIM
    model_cache: str = "none"  # KubeRay: none | node (hostPath mounted at /models) | object (runai_streamer)
    # cutover (docs/cutover.md): what `promote` requires of a smoke attestation, and the KubeRay upgrade path
    concurrency: int | None = None  # target concurrency: the smoke must have run at least this many at once
    gpu_model: str | None = None  # GPU model the smoke must have run on (nvidia-smi's name, e.g. "NVIDIA H200")
    checkpoint_sha256: str | None = None  # sha256 of the checkpoint's safetensors index (smoke --attest records it)
    replicas: int = 1  # Serve replicas of the model (each tp x pp GPUs)
    autoscaler: bool = False  # KubeRay in-tree autoscaler enabled
    # KubeRay: the GPU workers require nodes whose driver meets the image's CUDA floor (and, with gpu_model, of
    # that GPU), as GPU feature discovery labels them (nvidia.com/cuda.driver.major, nvidia.com/gpu.product)
    gpu_node_affinity: bool = False
    gateway_class: str | None = None  # Gateway API class; with autoscaler and replicas >= 2: incremental upgrade
    platform: str | None = None  # KubeRay: the image platform the pods run on (node selector kubernetes.io/arch)
    # promote: public keys (PEM files, relative to the spec's folder) whose signed verdicts count
    trusted_keys: tuple[str, ...] = ()


@dataclass
class Spec:
    vllm: str = "0.26.0"
    base: str | None = None  # manifest path or image ref; None -> lockfiles/base/vllm-openai-v{vllm}.json
    with_: list[str] = field(default_factory=list)
    lock: str | None = None
    repo: str | None = None
    allow_abi_change: dict[str, str] = field(default_factory=dict)
    # [[lockstep]] tables as written (checked by builder.resolve.lockstep.parse_families when a lock is made)
    lockstep: list = field(default_factory=list)
    find_links: list[str] = field(default_factory=list)  # extra wheel folders (uv --find-links)
    no_index: bool = False
    exclude_newer: str | None = None
    serving: Serving = field(default_factory=Serving)
    source: str | None = None  # the spec file read, if any
    vllm_given: bool = False  # vllm named by a flag or the spec file (not the built-in default)
    platform: Platform = DEFAULT  # the image platform this spec is locked, gated and rendered for

    @property
    def overlay(self) -> list[str]:
        return list(DEFAULT_OVERLAY) + list(self.with_)

    @property
    def lock_path(self) -> Path:
        return Path(self.lock) if self.lock else default_lock_path(self.vllm, self.platform)

    def for_platforms(self, platforms: tuple[Platform, ...]) -> list[Spec]:
        """One spec per platform (pure): each locks into its platform's default lock; a ``--lock``/``lock`` file
        names one lock, so with several platforms it is :class:`BadInput`."""
        if len(platforms) > 1 and self.lock:
            raise BadInput(
                f"--lock/-o {self.lock} names one lock file, but {len(platforms)} platforms were asked "
                f"for ({', '.join(p.name for p in platforms)}): each platform has its own lock.",
                hint="leave the lock path out (each platform's lock is lockfiles/vllm-X[/linux-arm64]/"
                "requirements.lock), or give one --platform.",
            )
        return [replace(self, platform=p) for p in platforms]

    def with_flags(self, **flags: Any) -> Spec:
        """Return a copy where every flag that is not None overrides the spec."""
        top = {k: v for k, v in flags.items() if v is not None and k in {f.name for f in fields(Spec)}}
        if "vllm" in top:
            top["vllm_given"] = True
        if isinstance(top.get("repo"), str):  # --tag: its grammar is image_tags'; no line break gets that far
            top["repo"] = values.control_free(top["repo"].strip(), "--tag")
        serving = {k: v for k, v in flags.items() if v is not None and k in {f.name for f in fields(Serving)}}
        check_serving_numbers(serving, lambda key: f"--{key.replace('_', '-')}")
        if "with_" in top:  # a --with naming a package replaces the spec's requirement on it (flags win)
            named = {_req_key(w) for w in top["with_"]} - {None}
            kept = [w for w in self.with_ if _req_key(w) not in named]
            top["with_"] = kept + [w for w in top["with_"] if w not in kept]
        if "find_links" in top:
            top["find_links"] = list(self.find_links) + [f for f in top["find_links"] if f not in self.find_links]
        if "allow_abi_change" in top:
            top["allow_abi_change"] = {**self.allow_abi_change, **top["allow_abi_change"]}
        return replace(self, **top, serving=replace(self.serving, **serving))


def _req_key(req: str) -> str | None:
    """Canonical package name of a requirement string (None when it does not parse)."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        return canonical_name(Requirement(req).name)
    except InvalidRequirement:
        return None


_TOP_KEYS = {
    "vllm": str,
    "base": str,
    "with": list,
    "lock": str,
    "repo": str,
    "allow-abi-change": dict,
    "lockstep": list,
    "serving": dict,
    "find-links": list,
    "no-index": bool,
    "exclude-newer": str,
}
_TOML_TYPE = {str: "string", list: "array", dict: "table", int: "integer", float: "float", bool: "boolean"}
_SERVING_TYPES = {f.name: f.type for f in fields(Serving)}


def _serving_value(key: str, val: Any, path: str) -> Any:
    """``serving.KEY``'s value when it has its field's TOML type (a list of strings for a tuple field, kept
    as a tuple), else BadInput naming the key, the type wanted and the value."""
    typ = str(_SERVING_TYPES[key])
    listed = "tuple" in typ
    ok = (
        (listed and isinstance(val, list) and all(isinstance(x, str) for x in val))
        or (not listed and "int" in typ and isinstance(val, int) and not isinstance(val, bool))
        or (not listed and "float" in typ and isinstance(val, (int, float)) and not isinstance(val, bool))
        or (not listed and "str" in typ and isinstance(val, str))
        or (not listed and "bool" in typ and isinstance(val, bool))
    )
    if not ok:
        want = (
            "a list of strings"
            if listed
            else "an integer"
            if "int" in typ
            else "a number"
            if "float" in typ
            else "a boolean"
            if "bool" in typ
            else "a string"
        )
        raise BadInput(
            f"spec {path}: 'serving.{key}' has the wrong type: it must be {want}, "
            f"got {_TOML_TYPE.get(type(val), type(val).__name__)} {val!r:.60}."
        )
    return tuple(val) if listed else val


def parse_spec(text: str, path: str) -> Spec:
    try:
        doc = load_toml(text, f"spec {path}")
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"spec {path} is not valid TOML: {exc}.") from None
    for key, val in doc.items():
        if key not in _TOP_KEYS:
            raise BadInput(f"spec {path}: unknown key '{key}' (known: {', '.join(sorted(_TOP_KEYS))}).")
        if not isinstance(val, _TOP_KEYS[key]):
            raise BadInput(
                f"spec {path}: '{key}' must be a TOML {_TOML_TYPE[_TOP_KEYS[key]]}, "
                f"got {_TOML_TYPE.get(type(val), type(val).__name__)} {val!r:.60}."
            )
    with_ = doc.get("with", [])
    if not all(isinstance(w, str) for w in with_):
        raise BadInput(f"spec {path}: 'with' must be a list of requirement strings.")
    if not all(isinstance(f, str) for f in doc.get("find-links", [])):
        raise BadInput(f"spec {path}: 'find-links' must be a list of folder paths or URLs (strings).")
    allow = doc.get("allow-abi-change", {})
    if not all(isinstance(v, str) and v.strip() for v in allow.values()):
        raise BadInput(f"spec {path}: every 'allow-abi-change' entry needs a non-empty reason string.")
    serving_doc = doc.get("serving", {})
    serving_kwargs: dict[str, Any] = {}
    for key, val in serving_doc.items():
        if key not in _SERVING_TYPES:
            raise BadInput(f"spec {path}: unknown key 'serving.{key}' (known: {', '.join(sorted(_SERVING_TYPES))}).")
        serving_kwargs[key] = _serving_value(key, val, path)
    for key in ("tp", "pp"):
        if key in serving_kwargs and serving_kwargs[key] < 1:
            raise BadInput(f"spec {path}: 'serving.{key}' must be a positive integer, got {serving_kwargs[key]!r}.")
    _check_values(doc, serving_kwargs, path)
    backend = serving_kwargs.get("distributed_executor_backend")
    if backend is not None and backend not in EXECUTOR_BACKENDS:
        raise BadInput(
            f"spec {path}: 'serving.distributed_executor_backend' must be one of "
            f"{', '.join(EXECUTOR_BACKENDS)}, got {backend!r}."
        )
    _check_cutover(serving_kwargs, path)
    if "platform" in serving_kwargs:  # one spelling from here on: linux/arm64
        serving_kwargs["platform"] = parse_platform(
            serving_kwargs["platform"], where=f"spec {path}: 'serving.platform'"
        ).name
    return Spec(
        vllm=doc.get("vllm", "0.26.0"),
        base=doc.get("base"),
        with_=list(with_),
        lock=doc.get("lock"),
        repo=doc.get("repo"),
        allow_abi_change=dict(allow),
        lockstep=list(doc.get("lockstep", [])),
        find_links=list(doc.get("find-links", [])),
        no_index=doc.get("no-index", False),
        exclude_newer=doc.get("exclude-newer"),
        serving=Serving(**serving_kwargs),
        source=path,
        vllm_given="vllm" in doc,
    )


#: serving numbers: (lowest, highest, whole number); a count is integral, a fraction is in (0, 1]
_SERVING_BOUNDS = {
    "gpus": (1, 4096, True),
    "concurrency": (1, 4096, True),
    "replicas": (1, 4096, True),
    "tp": (1, 4096, True),
    "pp": (1, 4096, True),
    "max_model_len": (1, 1 << 40, True),
    "max_num_seqs": (1, 1 << 20, True),
    "gpu_memory_utilization": (0, 1, False),
    "cpu_offload_gb": (0, 1 << 20, False),
}


def check_serving_numbers(serving: dict, where: Callable[[str], str]) -> None:
    """The one rule for the serving numbers (:data:`_SERVING_BOUNDS`), whether a spec's ``[serving]`` table or a
    command's flags give them (``where(key)`` names the field or flag): finite, in range, counts whole; a
    ``--cpu-offload-gb 1e308`` is refused here, not turned into an infinite byte count later."""
    for key, (low, high, whole) in _SERVING_BOUNDS.items():
        if serving.get(key) is not None:
            number(
                serving[key],
                where(key),
                minimum=low,
                maximum=high,
                integral=whole,
                exclusive_minimum=key == "gpu_memory_utilization",
            )


def _check_values(doc: dict, serving: dict, path: str) -> None:
    """The spec's values through :mod:`builder.validate`: serving numbers finite and in range, counts whole,
    ``exclude-newer`` a real date or instant."""
    check_serving_numbers(serving, lambda key: f"spec {path}: 'serving.{key}'")
    exclude_newer(doc.get("exclude-newer"), where=f"spec {path}: 'exclude-newer'")
    # every string reaches a Dockerfile, a lock line, a YAML document or a hint: none holds a line break
    for key, val in [*((f"serving.{k}", v) for k, v in serving.items()), *doc.items()]:
        for i, item in enumerate(val if isinstance(val, (list, tuple)) else [val]):
            if isinstance(item, str):
                values.control_free(
                    item, f"spec {path}: '{key}'" + (f"[{i}]" if isinstance(val, (list, tuple)) else "")
                )
    for name, reason in (doc.get("allow-abi-change") or {}).items():
        values.control_free(name, f"spec {path}: 'allow-abi-change' key")
        values.control_free(reason, f"spec {path}: 'allow-abi-change.{name}'")
    if isinstance(doc.get("repo"), str):
        values.Repository(doc["repo"], f"spec {path}: 'repo'")
    if "compile_cache" in serving:
        values.compile_cache(serving["compile_cache"], f"spec {path}: 'serving.compile_cache'")
    if "model_cache" in serving:
        values.model_cache(serving["model_cache"], f"spec {path}: 'serving.model_cache'")


def _check_cutover(serving: dict, path: str) -> None:
    """The cutover settings' shapes: a 64-hex checkpoint sha256, a DNS-1123 gateway class, a GPU model name."""
    import re

    sha = serving.get("checkpoint_sha256")
    if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise BadInput(
            f"spec {path}: 'serving.checkpoint_sha256' must be 64 lowercase hex digits (the sha256 of the "
            f"checkpoint's safetensors index), got {sha!r:.80}."
        )
    gw = serving.get("gateway_class")
    if gw is not None and not (len(gw) <= 253 and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", gw)):
        raise BadInput(
            f"spec {path}: 'serving.gateway_class' must be a Gateway API class name (DNS-1123), got {gw!r:.80}."
        )
    gm = serving.get("gpu_model")
    if gm is not None and not (0 < len(gm.strip()) <= 128 and gm.isprintable()):
        raise BadInput(
            f"spec {path}: 'serving.gpu_model' must be a GPU model name such as \"NVIDIA H200\", got {gm!r:.80}."
        )


def load_spec(path: str | Path | None) -> Spec:
    """Load ``path``; with ``None``, ``./build-image.toml`` if present, else defaults."""
    if path is None:
        p = Path(DEFAULT_SPEC_FILE)
        if not p.exists():
            return Spec()
    else:
        p = Path(path)
        if not p.exists():
            raise BadInput(f"spec file {p} does not exist.")
    return parse_spec(read_bounded_text(p, "spec file"), str(p))


def check_vllm_version(vllm: str, where: str = "--vllm", platform: Platform = DEFAULT) -> None:
    """BadInput (exit 2, "no base manifest", the known releases named) for a release this checkout
    has no base manifest for (:func:`builder.validate.check_release`); for another platform than the default,
    also one whose image of that platform has no manifest here (the releases that have one named, and the
    commands that add it)."""
    check_release(vllm, supported_vllm_versions(), where=where)
    if platform.is_default:
        return
    have = supported_vllm_versions(platform)
    if vllm not in have:
        raise BadInput(
            f"there is no {platform.name} base manifest for vllm {vllm} in this checkout ({platform.name}: "
            f"{', '.join(have) or 'none'}; the lock and the gate of one platform never stand in for another's).",
            hint=f"`build-image base reconstruct --vllm {vllm} --platform {platform.name}` writes it from the "
            f"release's own {platform.machine} build step, then `build-image lock --vllm {vllm} --platform "
            f"{platform.name}`.",
        )
