"""`build-image plan [--vllm X]`: preflight memory plan for a shipped vLLM release (no GPU touched).

Exit 0: fits.  Exit 1: does not fit (the plan is printed first).  Exit 2: bad input.
"""

from __future__ import annotations

import math
from pathlib import Path

import click

from builder.errors import BadInput
from builder.report import emit_json
from builder.resolve.manifest import load_manifest
from builder.serving import coldstart, gpus
from builder.serving.plan import (
    GiB,
    check_load_format,
    parse_size,
    plan_from_model_dir,
    refuse_unless_fits,
    release_facts,
    render_text,
)
from builder.spec import default_base_manifest, load_spec

_OPTIONS = [
    click.option(
        "--vllm",
        "vllm",
        default=None,
        help="vLLM release to plan for (any shipped one; default: the spec's "
        "vllm, else 0.26.0): its default gpu_memory_utilization and "
        "accepted --kv-cache-dtype values.",
    ),
    click.option(
        "--model", "model", default=None, help="Model directory or its config.json (default: spec serving.model)."
    ),
    click.option(
        "--spec",
        "spec_file",
        default=None,
        type=click.Path(dir_okay=False),
        help="Spec file (default ./build-image.toml if present); flags win over its [serving] table.",
    ),
    click.option(
        "--weights-bytes",
        default=None,
        help="Checkpoint size (bytes, or with a unit: 600GB). Default: the "
        "exact tensor bytes from the safetensors headers (the index's "
        "metadata.total_size while shards are still missing).",
    ),
    click.option("--gpus", type=int, default=None, help="GPUs (default tp × pp)."),
    click.option(
        "--gpu-memory",
        default=None,
        help="Per-GPU memory as CUDA reports it: 80GiB, 80GB (10^9), or a preset: h100, h200.",
    ),
    click.option("--tp", type=int, default=None, help="Tensor-parallel size."),
    click.option("--pp", type=int, default=None, help="Pipeline-parallel size."),
    click.option("--gpu-memory-utilization", type=float, default=None, help="vLLM gpu_memory_utilization, in (0, 1]."),
    click.option(
        "--max-model-len", type=int, default=None, help="Context length (default: the model's max_position_embeddings)."
    ),
    click.option("--max-num-seqs", type=int, default=None, help="Concurrent full-length sequences that must fit."),
    click.option(
        "--kv-cache-dtype",
        type=click.Choice(["auto", "bf16", "bfloat16", "fp16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4"]),
        default=None,
        help="KV cache dtype (auto = the model's torch_dtype, or the ModelOpt checkpoint's KV quantization).",
    ),
    click.option(
        "--cpu-offload-gb",
        type=float,
        default=None,
        help="vLLM cpu_offload_gb (GiB of weights per GPU kept in host memory).",
    ),
    click.option(
        "--reserve-gib",
        type=float,
        default=None,
        help="Per-GPU reserve for activations, CUDA graphs and workspace (GiB); default: estimated, see docs/plan.md.",
    ),
    click.option(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="Tokens per forward step (drives the activation estimate; vLLM server default 8192 on >=70 GiB GPUs).",
    ),
    click.option(
        "--enforce-eager",
        is_flag=True,
        default=False,
        help="No CUDA graphs (drops the CUDA-graph part of the reserve).",
    ),
    click.option(
        "--load-format",
        "load_format",
        default=None,
        help="vLLM --load-format the cold-start estimate is for (default: spec serving.load_format, else auto); "
        "checked against the release's LoadFormats.",
    ),
    click.option(
        "--load-rate",
        default=None,
        help="Weights load rate per GPU (1.2GiB/s, 10Gbit/s, 500MB/s; bare: GiB/s). Default: measured on the "
        "H200 for the load format and page cache (docs/cold-start.md).",
    ),
    click.option(
        "--storage-rate",
        default=None,
        help="Read rate of one node's storage shared by its GPUs (default: the load rate).",
    ),
    click.option(
        "--pull-bandwidth", default=None, help="Image pull bandwidth (default 1 Gbit/s = 125 MB/s, an assumption)."
    ),
    click.option("--image-size", default=None, help="The image's compressed size (e.g. 12GB) for the pull term."),
    click.option(
        "--image-manifest",
        default=None,
        type=click.Path(dir_okay=False),
        help="The image's OCI manifest JSON (crane manifest IMAGE): its layers' sizes are the pull's bytes.",
    ),
    click.option(
        "--image-result",
        default=None,
        type=click.Path(dir_okay=False),
        help="The JSON of `build-image push --json`: its compressed_bytes (the pushed manifest's layers).",
    ),
    click.option(
        "--page-cache",
        type=click.Choice(["cold", "warm"]),
        default="cold",
        show_default=True,
        help="Checkpoint in the node's page cache (warm: a restart on the same node) or not (a new node).",
    ),
    click.option(
        "--storage",
        type=click.Choice(["local", "object"]),
        default="local",
        show_default=True,
        help="Where the weights come from: local disk / node-local model cache, or streamed from object "
        "storage (not measured: needs --load-rate).",
    ),
    click.option(
        "--compile-cache",
        type=click.Choice(["empty", "warm"]),
        default="empty",
        show_default=True,
        help="VLLM_CACHE_ROOT from a run before (warm: the compile-cache volume of the KubeRay manifests).",
    ),
    click.option(
        "--engine-start",
        type=float,
        default=None,
        help="Seconds from process start to /health without the weights load (default: measured).",
    ),
    click.option("--nodes", type=int, default=1, show_default=True, help="Nodes one replica spans (cold start)."),
    click.option(
        "--gpu-model",
        "gpu_model",
        default=None,
        help="Target GPU (nvidia-smi's name, \"NVIDIA H200\", or sm_XY; default: spec serving.gpu_model): refused "
        "before anything else when torch's or vllm's kernels in the base do not cover it.",
    ),
    click.option("--json", "as_json", is_flag=True, default=False, help="Machine-readable plan on stdout."),
]


def _with_options(f):
    """plan's options, in the order --help lists them."""
    for opt in reversed(_OPTIONS):
        f = opt(f)
    return f


# the flags that override the spec's [serving] table (and its vllm), in the order with_flags is given them
_SPEC_FLAGS = (
    "vllm",
    "model",
    "gpus",
    "gpu_memory",
    "tp",
    "pp",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "kv_cache_dtype",
    "cpu_offload_gb",
    "gpu_model",
)


#: the largest per-GPU reserve ``--reserve-gib`` takes (GiB; far above any GPU's memory)
MAX_RESERVE_GIB = 1 << 20


@click.command("plan")
@_with_options
def command(spec_file, weights_bytes, reserve_gib, max_num_batched_tokens, enforce_eager, as_json, **opts):
    """Predict vLLM's KV cache before paying for the weights load: fits / does not fit.

    Exit codes: 0 fits; 1 does not fit; 2 bad input (flags, spec, model
    config, image manifest or result); 7 a download failed its sha256.
    """
    spec = load_spec(spec_file).with_flags(**{k: opts.pop(k) for k in _SPEC_FLAGS})
    serving = spec.serving
    gpu = gpu_check(spec)
    gpus.refuse_uncovered(gpu)  # before the model is read: a GPU the kernels do not cover is the first answer
    if not serving.model:
        raise BadInput("no model: pass --model DIR_OR_CONFIG_JSON or set serving.model in the spec.")
    wb = (
        None if weights_bytes is None else parse_size(weights_bytes, what="--weights-bytes", bare_unit=1, presets=False)
    )
    if reserve_gib is not None and not (math.isfinite(reserve_gib) and 0 <= reserve_gib <= MAX_RESERVE_GIB):
        raise BadInput(f"--reserve-gib must be a number in [0, {MAX_RESERVE_GIB}], got {reserve_gib}.")
    reserve = None if reserve_gib is None else int(reserve_gib * GiB)
    if max_num_batched_tokens is not None and max_num_batched_tokens < 1:
        raise BadInput(f"--max-num-batched-tokens must be >= 1, got {max_num_batched_tokens}.")
    plan = plan_from_model_dir(
        serving.model,
        serving,
        weights_bytes=wb,
        reserve_bytes=reserve,
        max_num_batched_tokens=max_num_batched_tokens,
        enforce_eager=enforce_eager,
        vllm=spec.vllm,
    )
    cold = cold_start_of(plan, serving, spec.vllm, **opts)  # the rest of the flags are the cold start's
    if as_json:
        doc = plan.to_dict()
        doc["cold_start"] = {**cold["model"].to_dict(), "reference_600gb": cold["reference_600gb"].to_dict()}
        doc["gpu"] = gpu.to_dict()
        emit_json(doc, sort_keys=True)
    else:
        click.echo(render_text(plan))
        click.echo("\n".join(gpus.render(gpu)))
        click.echo("\n".join(coldstart.render_text(cold["model"], f"cold start of {serving.model}")))
        reference = coldstart.render_text(cold["reference_600gb"], "cold start of 600 GB over 8 GPUs of one node")
        click.echo("\n".join(reference))
    refuse_unless_fits(plan, show_plan=False)  # the plan is already on stdout


def gpu_check(spec) -> gpus.GpuCheck:
    """The target GPU (``serving.gpu_model``) and the driver floor against the base manifest of ``spec``: its
    ``base`` when that is a manifest file, else the release's shipped one; none (a base given as an image
    reference, a release without a manifest): the floor and the architectures are not known."""
    model = spec.serving.gpu_model
    target = gpus.capability_of(model, "--gpu-model / serving.gpu_model") if model is not None else None
    path = None
    if spec.base and not _looks_like_image_ref(spec.base):
        path = Path(spec.base)
    elif not spec.base and default_base_manifest(spec.vllm, spec.platform).is_file():
        path = default_base_manifest(spec.vllm, spec.platform)
    if path is None:
        out = gpus.GpuCheck(target=target, cuda_major=None, floor=None)
        out.notes.append("no base manifest to read the image's CUDA and kernels from: not checked")
        return out
    return gpus.check(load_manifest(path), target)


def _looks_like_image_ref(base: str) -> bool:
    return not (base.endswith(".json") or Path(base).exists())


def cold_start_of(
    plan,
    serving,
    vllm,
    *,
    load_format,
    load_rate,
    storage_rate,
    pull_bandwidth,
    image_size,
    image_manifest,
    image_result,
    page_cache,
    storage,
    compile_cache,
    engine_start,
    nodes,
) -> dict:
    """The cold-start estimate of the planned model and of 600 GB over 8 GPUs, from the flags (exit 2 on bad ones)."""
    fmt = check_load_format(
        load_format or getattr(serving, "load_format", None) or "auto", release_facts(vllm), where="--load-format"
    )
    if sum(x is not None for x in (image_size, image_manifest, image_result)) > 1:
        raise BadInput("give one of --image-size, --image-manifest and --image-result.")
    image_bytes, image_source = None, None
    if image_size is not None:
        image_bytes = parse_size(image_size, what="--image-size", presets=False)
        if image_bytes <= 0:
            raise BadInput(f"--image-size must be a positive size, got {image_size!r}.")
        image_source = "given (--image-size)"
    elif image_manifest is not None:
        image_bytes, image_source = coldstart.manifest_compressed_bytes(image_manifest), f"manifest {image_manifest}"
    elif image_result is not None:
        image_bytes = coldstart.push_result_compressed_bytes(image_result)
        image_source = f"push result {image_result}"
    rate = lambda v, what: None if v is None else coldstart.parse_rate(v, what=what)  # noqa: E731
    kw = dict(
        load_format=fmt,
        page_cache=page_cache,
        storage=storage,
        compile_cache=compile_cache,
        vllm=vllm,
        image_bytes=image_bytes,
        image_source=image_source,
        pull_bandwidth=rate(pull_bandwidth, "--pull-bandwidth"),
        load_rate=rate(load_rate, "--load-rate"),
        storage_rate=rate(storage_rate, "--storage-rate"),
        engine_start_s=engine_start,
    )
    model = coldstart.estimate(
        coldstart.ColdStartInputs(weights_bytes=plan.weights_bytes, gpus=plan.tp * plan.pp, nodes=nodes, **kw)
    )
    return {"model": model, "reference_600gb": coldstart.reference_600gb(**kw)}
