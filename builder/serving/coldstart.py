"""Cold-start estimate: how long from a new node to vLLM's first token.

Three terms, each shown with its inputs, and their total:

* **image pull** = the image's compressed bytes / the pull bandwidth (``--image-size`` or the layers of an OCI
  manifest, ``--image-manifest``; ``--pull-bandwidth``, default :data:`DEFAULT_PULL_BANDWIDTH`, an assumption);
* **weights load** = the larger of (checkpoint bytes per GPU / the load rate) and (the bytes one node reads /
  the node's storage rate): the ranks of one node share its disk or link; the load rate is measured per load
  format and page-cache state (:data:`MEASURED_LOAD_RATES`) or given (``--load-rate``);
* **engine start** = everything from the process start to ``/health`` but the weights load (imports, engine
  core, torch.compile, CUDA graphs, KV cache, API server), measured per release and compile-cache state
  (:data:`MEASURED_ENGINE_START`) or given (``--engine-start``).

Pure functions over numbers; the defaults are the lent H200's measurements with vLLM 0.26.0 and a
21.8 GB synthetic Qwen3 checkpoint on its local disk (docs/cold-start.md, benchmarks/coldstart-h200/).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builder.errors import BadInput
from builder.validate import load_json, number, read_bounded

GiB = 1 << 30
GB = 10**9

#: Pull bandwidth when none is given: 1 Gbit/s (125 MB/s), an assumption (a registry reached over a node's
#: shared link), not a measurement; give ``--pull-bandwidth`` for your registry.
DEFAULT_PULL_BANDWIDTH = 125 * 10**6

MEASURED_ON = "measured on the lent H200 (ext4 local disk) with vLLM 0.26.0, 21.8 GB synthetic Qwen3, TP 1"

#: GiB/s of vLLM's "Model loading took X GiB and Y seconds", per (load format, page cache); one GPU.
#: cold: checkpoint pages evicted (drop_caches) before the boot; warm: every file read once before it.
#: None: not measured (give --load-rate).  runai_streamer bypasses the page cache (a warm cache did not help).
MEASURED_LOAD_RATES: dict[tuple[str, str], float | None] = {
    ("safetensors", "cold"): round(20.31 * 2 / (17.390204 + 15.140614), 3),  # 1.249 (st-cold-cc0, st-cold-ccw)
    ("safetensors", "warm"): round(20.31 / 5.236515, 3),  # 3.879 (st-warm-ccw)
    ("fastsafetensors", "cold"): round(20.31 / 15.879522, 3),  # 1.279 (fst-cold, no GDS: nogds copier)
    ("fastsafetensors", "warm"): None,
    ("runai_streamer", "cold"): round(20.31 / 17.744105, 3),  # 1.145 (run1 rs-cold)
    ("runai_streamer", "warm"): round(20.31 / 14.975023, 3),  # 1.356 (run1 rs-warm)
    ("instanttensor", "cold"): None,
    ("instanttensor", "warm"): None,
}
#: The formats that read a safetensors checkpoint through the default loader like ``safetensors``.
_AS_SAFETENSORS = {"auto": "safetensors", "hf": "safetensors"}

#: Seconds from the server's start to /health less the weights load (health_s - model_load_s), per release and
#: compile cache: empty (VLLM_CACHE_ROOT new, and a first start of the installed packages: bytecode, Triton JIT)
#: or warm (VLLM_CACHE_ROOT kept from a run before).  warm: the median of st-cold-ccw 65.45, st-warm-ccw 59.83,
#: fst-cold 72.72; empty: st-cold-cc0 158.67 - 17.39.
MEASURED_ENGINE_START: dict[str, dict[str, float]] = {
    "0.26.0": {"empty": round(158.67 - 17.390204, 1), "warm": round(80.59 - 15.140614, 1)},
}
MEASURED_RELEASE = "0.26.0"

PAGE_CACHES = ("cold", "warm")
COMPILE_CACHES = ("empty", "warm")
STORAGES = ("local", "object")


def parse_rate(text: str | float | int, *, what: str) -> float:
    """``"1.2GiB/s"`` / ``"10Gbit/s"`` / ``"125MB/s"`` / ``1.5`` (GiB/s) -> bytes per second, > 0 (else exit 2)."""
    if isinstance(text, bool):
        raise BadInput(f"{what}: expected a rate, got {text!r}.")
    if isinstance(text, (int, float)):
        value = float(text) * GiB
    else:
        s = str(text).strip()
        low = s.lower().replace(" ", "")
        units = (
            ("gibit/s", GiB / 8),
            ("mibit/s", (1 << 20) / 8),
            ("gbit/s", GB / 8),
            ("mbit/s", 10**6 / 8),
            ("gbps", GB / 8),
            ("mbps", 10**6 / 8),
            ("gib/s", GiB),
            ("mib/s", 1 << 20),
            ("gb/s", GB),
            ("mb/s", 10**6),
            ("b/s", 1),
        )
        for suffix, mult in units:
            if low.endswith(suffix):
                number = low[: -len(suffix)]
                break
        else:
            number, mult = low, GiB
        try:
            value = float(number) * mult
        except ValueError:
            raise BadInput(
                f"{what}: cannot read {text!r} as a rate (examples: 1.2GiB/s, 10Gbit/s, 125MB/s; "
                "a bare number is GiB/s)."
            ) from None
    if not math.isfinite(value) or not MIN_RATE <= value <= MAX_RATE:
        raise BadInput(
            f"{what}: must be a rate from 1 B/s to 1 PB/s, got {text!r:.60} (the estimate divides by it: "
            "a rate near zero gives no finite time)."
        )
    return value


#: the rates a cold-start estimate accepts, in bytes/s: every time it prints is then finite (valid JSON)
MIN_RATE, MAX_RATE = 1.0, 1e15
#: the largest image the estimate takes, in bytes (1 PiB: every size it prints stays finite)
MAX_IMAGE_BYTES = 1 << 50


def manifest_compressed_bytes(path: str | Path) -> int:
    """The compressed size of an image: the sum of its layers' ``size`` in an OCI/Docker manifest JSON
    (``crane manifest``, ``docker manifest inspect -v``, or the registry's answer), plus its config blob."""
    try:
        doc = load_json(read_bounded(path, "--image-manifest"), f"--image-manifest {path}")
    except ValueError as e:
        raise BadInput(f"--image-manifest {path}: not a readable JSON manifest ({e}).") from None
    if isinstance(doc, list) and doc:  # docker manifest inspect -v of one platform
        doc = doc[0].get("OCIManifest") or doc[0].get("SchemaV2Manifest") or doc[0]
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list) or not layers or not all(isinstance(x, dict) and "size" in x for x in layers):
        raise BadInput(f"--image-manifest {path}: no layers with sizes (an image index? give one platform's manifest).")
    config = doc.get("config") or {}
    if not isinstance(config, dict):
        raise BadInput(f"--image-manifest {path}: 'config' must be an object.")
    sizes = [
        number(
            x["size"], f"--image-manifest {path}: layers[{i}].size", minimum=0, maximum=MAX_IMAGE_BYTES, integral=True
        )
        for i, x in enumerate(layers)
    ]
    sizes.append(
        number(
            config.get("size", 0),
            f"--image-manifest {path}: config.size",
            minimum=0,
            maximum=MAX_IMAGE_BYTES,
            integral=True,
        )
    )
    return int(number(sum(sizes), f"--image-manifest {path}: the layers' sizes together", maximum=MAX_IMAGE_BYTES))


def push_result_compressed_bytes(path: str | Path) -> int:
    """The compressed size from ``build-image push --json``'s result (``compressed_bytes``, the registry
    manifest's layer sizes), or from an OCI manifest JSON (:func:`manifest_compressed_bytes`)."""
    try:
        doc = load_json(read_bounded(path, "--image-result"), f"--image-result {path}")
    except ValueError as e:
        raise BadInput(f"--image-result {path}: not a readable JSON file ({e}).") from None
    if isinstance(doc, dict) and doc.get("compressed_bytes") is not None:
        return int(
            number(
                doc["compressed_bytes"],
                f"--image-result {path}: compressed_bytes",
                minimum=0,
                exclusive_minimum=True,
                maximum=MAX_IMAGE_BYTES,
                integral=True,
            )
        )
    if isinstance(doc, dict) and isinstance(doc.get("layers"), list):
        return manifest_compressed_bytes(path)
    raise BadInput(
        f"--image-result {path}: no compressed_bytes (the JSON of `build-image push --json`) and no manifest layers."
    )


@dataclass(frozen=True)
class ColdStartInputs:
    weights_bytes: int  # the whole checkpoint
    gpus: int = 1  # tp x pp of one replica
    nodes: int = 1  # the nodes those GPUs are on (the bytes one node reads: weights / nodes)
    load_format: str = "auto"
    page_cache: str = "cold"  # a new node: cold
    storage: str = "local"  # local disk / node-local model cache, or object storage (streamed)
    compile_cache: str = "empty"  # no VLLM_CACHE_ROOT volume: empty
    vllm: str = MEASURED_RELEASE
    image_bytes: int | None = None  # compressed; None: the pull term is not estimated
    image_source: str | None = None
    pull_bandwidth: float | None = None  # bytes/s (None: DEFAULT_PULL_BANDWIDTH)
    load_rate: float | None = None  # bytes/s per GPU (None: measured for the format and page cache)
    storage_rate: float | None = None  # bytes/s of one node's storage (None: the load rate: one GPU measured)
    engine_start_s: float | None = None  # None: measured for the release and compile cache


@dataclass
class ColdStart:
    inputs: dict[str, Any]
    pull_s: float | None
    weights_load_s: float
    engine_start_s: float
    total_s: float
    terms: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema"] = "build-image/cold-start/v1"
        return d


def _check(inp: ColdStartInputs) -> None:
    if inp.page_cache not in PAGE_CACHES:
        raise BadInput(f"--page-cache must be one of {', '.join(PAGE_CACHES)}, got {inp.page_cache!r}.")
    if inp.compile_cache not in COMPILE_CACHES:
        raise BadInput(f"--compile-cache must be one of {', '.join(COMPILE_CACHES)}, got {inp.compile_cache!r}.")
    if inp.storage not in STORAGES:
        raise BadInput(f"--storage must be one of {', '.join(STORAGES)}, got {inp.storage!r}.")
    if inp.gpus < 1 or inp.nodes < 1 or inp.nodes > inp.gpus:
        raise BadInput(f"cold start: {inp.gpus} GPU(s) on {inp.nodes} node(s) is not a layout.")
    if inp.weights_bytes < 0:
        raise BadInput(f"cold start: weights bytes must be >= 0, got {inp.weights_bytes}.")
    for name, v in (
        ("--pull-bandwidth", inp.pull_bandwidth),
        ("--load-rate", inp.load_rate),
        ("--storage-rate", inp.storage_rate),
    ):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise BadInput(f"{name} must be a positive, finite rate, got {v!r}.")
    if inp.engine_start_s is not None and not (math.isfinite(inp.engine_start_s) and inp.engine_start_s >= 0):
        raise BadInput(f"--engine-start must be a finite number of seconds >= 0, got {inp.engine_start_s!r}.")
    if inp.image_bytes is not None and inp.image_bytes < 0:
        raise BadInput(f"--image-size must be >= 0, got {inp.image_bytes}.")


def load_rate_of(inp: ColdStartInputs) -> tuple[float, str]:
    """Bytes/s per GPU and where it comes from: --load-rate, else the measurement for the format and page
    cache (object storage and unmeasured formats need --load-rate: exit 2 saying so)."""
    if inp.load_rate is not None:
        return inp.load_rate, "given (--load-rate)"
    fmt = _AS_SAFETENSORS.get(inp.load_format, inp.load_format)
    if inp.storage == "object":
        raise BadInput(
            "cold start: streaming from object storage was not measured (the lent H200 reaches no "
            "object store); give --load-rate for your store and link (e.g. --load-rate 2GiB/s)."
        )
    rate = MEASURED_LOAD_RATES.get((fmt, inp.page_cache))
    if rate is None:
        measured = sorted(f"{f} ({pc})" for (f, pc), r in MEASURED_LOAD_RATES.items() if r is not None)
        raise BadInput(
            f"cold start: no measured load rate for load format {inp.load_format!r} with a "
            f"{inp.page_cache} page cache (measured: {', '.join(measured)}); give --load-rate."
        )
    return rate * GiB, f"{MEASURED_ON}: {fmt}, {inp.page_cache} page cache, {rate:.3f} GiB/s"


def engine_start_of(inp: ColdStartInputs) -> tuple[float, str]:
    if inp.engine_start_s is not None:
        return inp.engine_start_s, "given (--engine-start)"
    rel = inp.vllm if inp.vllm in MEASURED_ENGINE_START else MEASURED_RELEASE
    s = MEASURED_ENGINE_START[rel][inp.compile_cache]
    src = f"{MEASURED_ON}: {inp.compile_cache} compile cache"
    if rel != inp.vllm:
        src += f" (vLLM {inp.vllm} not measured: {rel}'s figure)"
    return s, src


def estimate(inp: ColdStartInputs) -> ColdStart:
    """The three terms and their total (seconds).  The pull term is None without an image size."""
    _check(inp)
    notes: list[str] = []
    bw = inp.pull_bandwidth or DEFAULT_PULL_BANDWIDTH
    pull_s = None if inp.image_bytes is None else inp.image_bytes / bw
    rate, rate_src = load_rate_of(inp)
    per_gpu = math.ceil(inp.weights_bytes / inp.gpus)
    per_node = math.ceil(inp.weights_bytes / inp.nodes)
    storage = inp.storage_rate or rate
    per_gpu_s, per_node_s = per_gpu / rate, per_node / storage
    load_s = max(per_gpu_s, per_node_s)
    engine_s, engine_src = engine_start_of(inp)
    terms = [
        {
            "term": "image pull",
            "seconds": None if pull_s is None else round(pull_s, 1),
            "inputs": {
                "image_bytes": inp.image_bytes,
                "image_source": inp.image_source,
                "pull_bandwidth_Bps": bw,
                "bandwidth_source": "given (--pull-bandwidth)"
                if inp.pull_bandwidth
                else f"default {DEFAULT_PULL_BANDWIDTH / 1e6:g} MB/s (1 Gbit/s, an assumption)",
            },
        },
        {
            "term": "weights load",
            "seconds": round(load_s, 1),
            "inputs": {
                "weights_bytes": inp.weights_bytes,
                "bytes_per_gpu": per_gpu,
                "bytes_per_node": per_node,
                "load_format": inp.load_format,
                "page_cache": inp.page_cache,
                "storage": inp.storage,
                "load_rate_Bps": rate,
                "load_rate_source": rate_src,
                "storage_rate_Bps": storage,
                "per_gpu_s": round(per_gpu_s, 1),
                "per_node_s": round(per_node_s, 1),
                "bound": "per GPU" if per_gpu_s >= per_node_s else "node storage",
            },
        },
        {
            "term": "engine start",
            "seconds": round(engine_s, 1),
            "inputs": {"vllm": inp.vllm, "compile_cache": inp.compile_cache, "source": engine_src},
        },
    ]
    if pull_s is None:
        notes.append("image pull not estimated: give --image-size (compressed) or --image-manifest FILE")
    if inp.gpus > 1:
        notes.append(
            f"{inp.gpus} GPUs: not measured (one GPU was lent); the load assumes the GPUs of a node "
            "read from one storage at the single-GPU rate (--storage-rate for a faster one), and the "
            "engine start is the TP 1 figure (tensor-parallel start-up and sharded_state not measured)"
        )
    total = (pull_s or 0.0) + load_s + engine_s
    inputs = asdict(inp)
    return ColdStart(
        inputs=inputs,
        pull_s=None if pull_s is None else round(pull_s, 1),
        weights_load_s=round(load_s, 1),
        engine_start_s=round(engine_s, 1),
        total_s=round(total, 1),
        terms=terms,
        notes=notes,
    )


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "–"
    return f"{s:.0f} s" if s < 120 else f"{s:.0f} s ({s / 60:.1f} min)"


def render_text(cs: ColdStart, title: str = "cold start") -> list[str]:
    """The estimate as report lines: each term with its inputs, then the total."""
    t = {x["term"]: x for x in cs.terms}
    pull, load, eng = t["image pull"], t["weights load"], t["engine start"]
    pi, li, ei = pull["inputs"], load["inputs"], eng["inputs"]
    lines = [f"{title} (estimate):"]
    if pi["image_bytes"] is None:
        lines.append("  image pull    –  (no image size: --image-size or --image-manifest)")
    else:
        lines.append(
            f"  image pull    {_fmt_s(pull['seconds'])} = {pi['image_bytes'] / GB:.2f} GB compressed"
            f" / {pi['pull_bandwidth_Bps'] / 1e6:g} MB/s [{pi['bandwidth_source']}]"
        )
    bound = (
        f"{li['bytes_per_gpu'] / GiB:.2f} GiB per GPU / {li['load_rate_Bps'] / GiB:.3f} GiB/s"
        if li["bound"] == "per GPU"
        else f"{li['bytes_per_node'] / GiB:.2f} GiB per node / {li['storage_rate_Bps'] / GiB:.3f} GiB/s node storage"
    )
    lines.append(
        f"  weights load  {_fmt_s(load['seconds'])} = {bound} ({li['load_format']}, {li['page_cache']} page "
        f"cache, {li['storage']} storage) [{li['load_rate_source']}]"
    )
    lines.append(
        f"  engine start  {_fmt_s(eng['seconds'])} (vLLM {ei['vllm']}, {ei['compile_cache']} compile cache) "
        f"[{ei['source']}]"
    )
    lines.append(f"  total         {_fmt_s(cs.total_s)}" + ("" if cs.pull_s is not None else " (without the pull)"))
    lines += [f"  note: {n}" for n in cs.notes]
    return lines


#: The reference case (docs/plan.md): 600 GB of weights over 8 GPUs of one node.
REFERENCE_600GB = {"weights_bytes": 600 * GB, "gpus": 8, "nodes": 1}


def reference_600gb(**kw: Any) -> ColdStart:
    """600 GB over 8 GPUs of one node, with the same format, caches, rates and image as the user's estimate."""
    return estimate(ColdStartInputs(**{**kw, **REFERENCE_600GB}))
