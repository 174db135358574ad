"""What a smoke run is asked to do: :class:`SmokeConfig`, its validation, and
the configuration built from a spec's ``[serving]`` table."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from builder.errors import BadInput
from builder.image.naming import SERVE_BACKENDS
from builder.serving.plan import check_load_format, parse_size, release_facts

EXECUTOR_BACKENDS = ("mp", "ray")  # vLLM --distributed-executor-backend values smoke accepts

# Set in every environment smoke starts (local server, docker -e, the Serve runner), always to
# these values: NVLink multicast (NVLS) stays off for NCCL, torch symmetric memory and NVSHMEM.
# Rented nodes often lack the fabric manager / IMEX setup multicast needs, and a TP>1 engine
# then fails or hangs in its first all-reduce; smoke never turns it on.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def with_multicast_off(env: dict[str, str]) -> dict[str, str]:
    """``env`` with :data:`MULTICAST_OFF` applied over it (a caller's value never enables multicast)."""
    return {**env, **MULTICAST_OFF}


# A smoke run sends a round's requests at once, one thread and one socket each: a documented bound
# (far above any engine's --max-num-seqs) refused up front, not a thread that cannot start mid-run.
MAX_CONCURRENCY = 4096
#: the most rounds, prompt tokens or output tokens one smoke run asks for
MAX_COUNT = 1 << 24
#: the longest --timeout / --boot-timeout: a week (1e308 seconds does not fit a socket's timeout)
MAX_TIMEOUT_S = 7 * 86400
_SPARE_FDS = 64  # the server log, the health checks, the interpreter's own files


def ensure_fd_room(concurrency: int) -> None:
    """Raise the soft open-files limit to fit ``concurrency`` sockets (up to the hard limit);
    :class:`BadInput` naming ``ulimit -n`` when even the hard limit is too small."""
    try:
        import resource
    except ImportError:  # not POSIX: nothing to check
        return
    need = concurrency + _SPARE_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return
    raise BadInput(
        f"smoke: --concurrency {concurrency} needs {need} open files, but this shell allows {hard} "
        f"(ulimit -n); lower --concurrency or raise the limit."
    )


@dataclass(frozen=True)
class SmokeConfig:
    model: str  # host path of the checkpoint directory
    image: str | None = None  # docker mode when set, else local mode
    tp: int = 1
    pp: int = 1
    # vLLM --distributed-executor-backend: mp | ray (None: vLLM's choice)
    distributed_executor_backend: str | None = None
    ray_address: str | None = None  # ray backend: join this Ray cluster (default local mode: start a loopback head)
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    kv_cache_dtype: str | None = None
    cpu_offload_gb: float | None = None  # vLLM --cpu-offload-gb (GiB per GPU)
    load_format: str | None = None  # vLLM --load-format (None: auto); checked against the release's LoadFormats
    concurrency: int = 16
    rounds: int = 3  # rounds of /v1/completions
    chat: bool = True  # then one round of /v1/chat/completions (off: a model without a chat template)
    max_tokens: int = 64
    prompt_tokens: int = 128
    timeout: float = 300.0  # per request (and per round) seconds
    boot_timeout: float = 900.0  # until /health answers 200
    extra_args: list[str] = field(default_factory=list)
    server_cmd: str | None = None  # full override ({port} {model} substituted); used by tests
    vllm_bin: str | None = None  # local mode: the vllm executable (default: PATH, else python -m)
    port: int | None = None  # default: a free port
    log_file: str | None = None  # default: a temp file, kept on failure
    plan: bool = True
    checkpoint_check: bool = True  # refuse a checkpoint that is not ready (builder.serving.checkpoint)
    gpu_memory_bytes: int | None = None  # default: nvidia-smi
    gpus: int | None = None  # default: tp
    docker_bin: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    stop_grace: float = 15.0  # SIGTERM -> SIGKILL delay when stopping the server
    docker_gpus: str | None = "all"  # docker mode: --gpus value (None: no --gpus, for CPU tests)
    serve: bool = False  # deploy the image's Ray Serve application on a local Ray head
    serve_backend: str | None = None  # auto | ray-serve-llm | vllm-server; None: the image's default (the lock's)
    serve_python: str | None = None  # local --serve: the Python that has ray (default: this one)
    serve_num_gpus: int | None = None  # --serve: GPUs the Ray head declares (default: Ray detects them)
    vllm: str | None = None  # --vllm X: the shipped release planned for (None: the plan's default)
    # --vllm X: builder.serving.smoke.release.Release.to_dict(), recorded in the report
    release: dict[str, Any] | None = None
    reference: str | None = None  # compare outputs with this reference file
    save_reference: str | None = None  # record the reference outputs into this file
    reference_logprob_tolerance: float | None = None  # default: equivalence.LOGPROB_TOLERANCE
    reference_tie_margin: float | None = None  # default: equivalence.TIE_MARGIN

    def _check_numbers(self, where: str) -> None:
        """The counts and the seconds, each in its range: a count of at least 1 and at most what one run can
        hold (a ``--prompt-tokens 10**17`` prompt is never built), a port a TCP port, a timeout finite and at most
        :data:`MAX_TIMEOUT_S` (``1e308`` seconds does not fit a socket's timeout: OverflowError)."""
        for name, value, lo, hi in (
            ("--tp", self.tp, 1, 4096),
            ("--pp", self.pp, 1, 4096),
            ("--concurrency", self.concurrency, 1, None),  # its bound below names why
            ("--rounds", self.rounds, 1, MAX_COUNT),
            ("--max-tokens", self.max_tokens, 1, MAX_COUNT),
            ("--prompt-tokens", self.prompt_tokens, 1, MAX_COUNT),
        ):
            if not isinstance(value, int) or value < lo or (hi is not None and value > hi):
                bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
                raise BadInput(f"{where}: {name} must be an integer {bound}, got {value!r}")
        if self.port is not None and not (isinstance(self.port, int) and 1 <= self.port <= 65535):
            raise BadInput(f"{where}: --port must be a TCP port in [1, 65535], got {self.port!r}")
        for name, value in (("--timeout", self.timeout), ("--boot-timeout", self.boot_timeout)):
            # nan/inf would make the deadlines never expire: a smoke run must stay bounded
            if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
                raise BadInput(
                    f"{where}: {name} must be a positive number of seconds (at most {MAX_TIMEOUT_S}), got {value!r}"
                )

    def validate(self) -> SmokeConfig:
        """Bad flags: BadInput naming the flag.  Returns the configuration with --load-format in the spelling the
        release accepts (:func:`check_load_format`)."""
        where = "smoke"
        if not self.model:
            raise BadInput(f"{where}: --model is required (the checkpoint directory to serve)")
        p = Path(self.model)
        if not p.exists():
            raise BadInput(f"{where}: --model {self.model}: no such file or directory")
        if self.image is None and self.server_cmd is None and not p.is_dir():
            raise BadInput(f"{where}: --model {self.model}: not a directory")
        self._check_numbers(where)
        self._validate_parallel(where)
        if self.concurrency > MAX_CONCURRENCY:
            raise BadInput(
                f"{where}: --concurrency {self.concurrency} is above the probe's bound of "
                f"{MAX_CONCURRENCY} simultaneous requests (one thread and one connection each); "
                "an engine admits at most --max-num-seqs at once, so a higher load only queues."
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise BadInput(f"{where}: --max-model-len must be >= 2, got {self.max_model_len}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise BadInput(f"{where}: --max-num-seqs must be >= 1, got {self.max_num_seqs}")
        if self.gpu_memory_utilization is not None and not (0.0 < self.gpu_memory_utilization <= 1.0):
            raise BadInput(f"{where}: --gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.cpu_offload_gb is not None and not (
            math.isfinite(self.cpu_offload_gb) and 0 <= self.cpu_offload_gb <= MAX_COUNT
        ):
            raise BadInput(
                f"{where}: --cpu-offload-gb must be a number in [0, {MAX_COUNT}], got {self.cpu_offload_gb!r}"
            )
        load_format = self.load_format
        if load_format is not None:
            load_format = check_load_format(load_format, release_facts(self.vllm), where="smoke: --load-format")
        if (
            self.reference
            and self.save_reference
            and Path(self.reference).resolve() == Path(self.save_reference).resolve()
        ):
            raise BadInput(f"{where}: --save-reference must name another file than --reference")
        if self.serve and self.server_cmd:
            raise BadInput(f"{where}: --serve deploys the Serve application; it does not take --server-cmd")
        if self.serve_backend is not None and self.serve_backend not in SERVE_BACKENDS:
            raise BadInput(
                f"{where}: --serve-backend must be one of {', '.join(SERVE_BACKENDS)}, got {self.serve_backend!r}"
            )
        for name, value in (
            ("--reference-logprob-tolerance", self.reference_logprob_tolerance),
            ("--reference-tie-margin", self.reference_tie_margin),
        ):
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise BadInput(f"{where}: {name} must be a finite number >= 0, got {value!r}")
        if self.max_model_len is not None and self.prompt_tokens + self.max_tokens > self.max_model_len:
            raise BadInput(
                f"{where}: --prompt-tokens ({self.prompt_tokens}) + --max-tokens ({self.max_tokens}) "
                f"exceeds --max-model-len ({self.max_model_len}); the requests could never be served"
            )
        return self if load_format == self.load_format else replace(self, load_format=load_format)

    def _validate_parallel(self, where: str) -> None:
        """The executor backend and the Ray cluster it joins (part of :meth:`validate`)."""
        if self.distributed_executor_backend is not None and self.distributed_executor_backend not in EXECUTOR_BACKENDS:
            raise BadInput(
                f"{where}: --distributed-executor-backend must be one of {', '.join(EXECUTOR_BACKENDS)}, "
                f"got {self.distributed_executor_backend!r}"
            )
        if self.ray_address is not None:
            if self.distributed_executor_backend != "ray":
                raise BadInput(
                    f"{where}: --ray-address joins a Ray cluster for vLLM's Ray executor; "
                    "give it with --distributed-executor-backend ray"
                )
            if self.serve:
                raise BadInput(
                    f"{where}: --serve starts its own Ray head for the Serve application; "
                    "it does not take --ray-address"
                )
            if not self.ray_address.strip():
                raise BadInput(f"{where}: --ray-address must name a Ray cluster (HOST:PORT or ray://...), got ''")


def check_gpus_visible(cfg: SmokeConfig, visible: int | None) -> None:
    """TP x PP GPUs must exist on this host when ``visible`` (nvidia-smi's count) is known:
    BadInput naming --tp/--pp, before anything starts."""
    need = cfg.tp * cfg.pp
    if visible is not None and need > visible:
        raise BadInput(
            f"smoke: --tp {cfg.tp} x --pp {cfg.pp} = {need} GPUs, but nvidia-smi reports {visible} "
            f"GPU{'s' if visible != 1 else ''} on this host; lower --tp/--pp or run on a node with "
            f"{need} GPUs."
        )


def config_from_serving(serving: Any, *, model: str, image: str | None = None, **overrides: Any) -> SmokeConfig:
    """A SmokeConfig from a spec's ``[serving]`` table (:class:`builder.spec.Serving`),
    for the pipeline's last stage: ``run_smoke(config_from_serving(spec.serving, model=..., image=ref))``."""
    gpu_mem = None
    if getattr(serving, "gpu_memory", None):
        gpu_mem = parse_size(serving.gpu_memory, what="serving.gpu_memory")
    kv = getattr(serving, "kv_cache_dtype", None)
    cfg = SmokeConfig(
        model=model,
        image=image,
        tp=getattr(serving, "tp", 1) or 1,
        pp=getattr(serving, "pp", 1) or 1,
        distributed_executor_backend=getattr(serving, "distributed_executor_backend", None),
        cpu_offload_gb=getattr(serving, "cpu_offload_gb", None) or None,
        load_format=None if getattr(serving, "load_format", "auto") in (None, "auto") else serving.load_format,
        max_model_len=getattr(serving, "max_model_len", None),
        gpu_memory_utilization=getattr(serving, "gpu_memory_utilization", None),
        max_num_seqs=getattr(serving, "max_num_seqs", None),
        kv_cache_dtype=None if kv in (None, "auto") else kv,
        gpu_memory_bytes=gpu_mem,
        gpus=getattr(serving, "gpus", None),
    )
    for k in overrides:
        if not hasattr(cfg, k):
            raise TypeError(f"SmokeConfig has no field {k!r}")
    return replace(cfg, **overrides)
