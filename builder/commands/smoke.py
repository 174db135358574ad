"""`build-image smoke [IMAGE | --local] --model PATH ...`: boot + concurrent generation verdict.

Exit 0 PASS, 1 FAIL (or the plan refuses the configuration), 2 bad input,
13 the checkpoint is not ready (`checkpoint verify`'s structural checks; nothing started),
130 interrupted (the server is stopped first).
"""

from __future__ import annotations

import re
import shlex
import sys

import click

from builder.commands import stderr_console
from builder.errors import BadInput, VerdictFailure
from builder.events import SILENT, PlainReporter, Reporter, RichReporter
from builder.report import emit_json
from builder.serving.smoke import SmokeConfig, render_text, run_smoke

# What a command runs (its stage, the engine adapter, downloads, reports) is imported inside the command
# function, not here: `build-image --help` imports every command module to list it, and a stage
# (with its dependencies) loads only when its command runs.


def _parse_size(text: str | None) -> int | None:
    """--gpu-memory: the planner's size syntax (a unit is required; h100/h200 presets)."""
    if text is None:
        return None
    from builder.serving.plan import parse_size

    value = parse_size(text, what="smoke: --gpu-memory")
    if value <= 0:
        raise BadInput(f"smoke: --gpu-memory must be a positive size, got {text!r}.")
    return value


_OPTIONS = [
    click.argument("image", required=False),
    click.option(
        "--vllm",
        "vllm",
        default=None,
        help="Shipped vLLM release X (`build-image base list`): without IMAGE or --local, smoke the image the "
        "pipeline tags from X's default lock; plan with X's defaults and --kv-cache-dtype values; an IMAGE "
        "labelled with another vllm is refused; the report records X, its lock, image and patch series.",
    ),
    click.option(
        "--local", "local", is_flag=True, help="Start `vllm serve` from the current environment instead of an image."
    ),
    click.option("--model", required=True, help="Checkpoint directory (mounted read-only in docker mode)."),
    click.option("--tp", default=1, show_default=True, type=int, help="Tensor-parallel size."),
    click.option("--pp", default=1, show_default=True, type=int, help="Pipeline-parallel size."),
    click.option(
        "--distributed-executor-backend",
        "distributed_executor_backend",
        type=click.Choice(["mp", "ray"]),
        default=None,
        help="vLLM's executor across the TP x PP GPUs (default: vLLM's choice). ray: --local "
        "starts a loopback-only Ray head (stopped by PID) unless --ray-address is given.",
    ),
    click.option(
        "--ray-address",
        default=None,
        help="With --distributed-executor-backend ray: join this Ray cluster (RAY_ADDRESS) instead of starting a head.",
    ),
    click.option(
        "--cpu-offload-gb",
        type=float,
        default=None,
        help="vLLM --cpu-offload-gb (GiB of weights per GPU kept in host memory; also planned).",
    ),
    click.option(
        "--max-model-len",
        type=int,
        default=None,
        help="vLLM --max-model-len: context length per sequence (default: the model's; also planned).",
    ),
    click.option(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="vLLM --gpu-memory-utilization in (0, 1] (default: vLLM's 0.9; also planned).",
    ),
    click.option(
        "--max-num-seqs",
        type=int,
        default=None,
        help="vLLM --max-num-seqs: sequences the engine admits at once (default: vLLM's).",
    ),
    click.option("--kv-cache-dtype", default=None, help="vLLM --kv-cache-dtype (auto, fp8, ...; also planned)."),
    click.option(
        "--load-format",
        "load_format",
        default=None,
        help="vLLM --load-format (safetensors, runai_streamer, fastsafetensors, ...; default: vLLM's auto); "
        "checked against the release's LoadFormats (--vllm X, else the default release): exit 2 otherwise. "
        "The report's cold_start records the weights load it gave (docs/cold-start.md).",
    ),
    click.option(
        "--concurrency", default=16, show_default=True, type=int, help="Simultaneous requests per round (1..4096)."
    ),
    click.option(
        "--rounds",
        default=3,
        show_default=True,
        type=int,
        help="Rounds of --concurrency simultaneous /v1/completions requests (half of them streamed); stops at "
        "the first failure.",
    ),
    click.option(
        "--no-chat",
        "no_chat",
        is_flag=True,
        help="Skip the /v1/chat/completions round (a base model without a chat template).",
    ),
    click.option("--max-tokens", default=64, show_default=True, type=int, help="Output tokens per request."),
    click.option("--prompt-tokens", default=128, show_default=True, type=int, help="Approximate prompt length."),
    click.option("--timeout", default=300.0, show_default=True, type=float, help="Seconds per request / round."),
    click.option(
        "--boot-timeout", default=900.0, show_default=True, type=float, help="Seconds until /health must answer."
    ),
    click.option("--extra-arg", "extra_args", multiple=True, help="Extra `vllm serve` argument (repeatable)."),
    click.option(
        "--env",
        "engine_env",
        multiple=True,
        metavar="NAME=VALUE",
        help="An environment variable for the engine: the container's -e, or the local server's environment "
        "(repeatable). Recorded in the report's settings and the attestation, a value whose name reads as a "
        "secret (TOKEN, SECRET, PASSWORD, KEY, CREDENTIAL, AUTH) as <redacted>.",
    ),
    click.option("--no-plan", is_flag=True, help="Boot even if the memory plan says the configuration cannot fit."),
    click.option(
        "--skip-checkpoint-check",
        is_flag=True,
        help="Boot even if the checkpoint's structural check (checkpoint verify) says NOT READY.",
    ),
    click.option(
        "--gpu-memory",
        default=None,
        help="Per-GPU memory for the plan (default: nvidia-smi): 141GiB, 80GB (10^9), or h100/h200.",
    ),
    click.option(
        "--vllm-bin", default=None, help="Local mode: command that runs vllm (default: `vllm` on PATH, else python -m)."
    ),
    click.option(
        "--server-cmd", default=None, hidden=True, help="Replace the server command ({port}, {model}); for tests."
    ),
    click.option("--port", type=int, default=None, help="Port the server listens on (default: a free one)."),
    click.option(
        "--log-file",
        default=None,
        help="Write the server log here (default: <cache>/logs/smoke-server-*.log, the newest 20 kept).",
    ),
    click.option(
        "--serve",
        "serve",
        is_flag=True,
        help="Deploy the image's Ray Serve application (build_image_serve_app) on a local Ray head "
        "(loopback, stopped by PID) and probe it through Serve's HTTP proxy.",
    ),
    click.option(
        "--serve-backend",
        type=click.Choice(["auto", "ray-serve-llm", "vllm-server"]),
        default=None,
        help="--serve: the application's backend (default: the one the lock chose, its `serve-backend` line, "
        "which the image carries as BUILD_IMAGE_SERVE_BACKEND; auto: ray.serve.llm when ray's llm "
        "extra pins the installed vllm, else vLLM's server in the replica).",
    ),
    click.option(
        "--serve-python",
        default=None,
        help="--local --serve: the Python that has ray and vllm (default: the one running build-image).",
    ),
    click.option(
        "--serve-num-gpus",
        type=int,
        default=None,
        hidden=True,
        help="--serve: GPUs the Ray head declares (default: Ray detects them); for CPU tests.",
    ),
    click.option(
        "--save-reference",
        default=None,
        metavar="FILE",
        help="After a PASS, record greedy outputs with per-token logprobs of a fixed prompt set into FILE.",
    ),
    click.option(
        "--reference",
        default=None,
        metavar="FILE",
        help="Compare greedy outputs and logprobs with FILE (from --save-reference); FAIL beyond the thresholds.",
    ),
    click.option(
        "--reference-logprob-tolerance",
        type=float,
        default=None,
        help="Largest |Δ logprob| (nats) of a reference token that passes (default: measured H200 noise, see "
        "docs/smoke.md).",
    ),
    click.option(
        "--reference-tie-margin",
        type=float,
        default=None,
        help="A greedy token may differ where the reference's top-2 margin is at most this (nats).",
    ),
    click.option(
        "--attest",
        "attest",
        is_flag=True,
        help="Bind the verdict to the image's digest: an in-toto statement (verdict, load, engine arguments, "
        "GPU, checkpoint, equivalence, engine versions) attached in the registry as an OCI referrer; a "
        "FAIL is attached too. IMAGE must be HOST/REPO@sha256:… or a tag the registry resolves to the "
        "local image.",
    ),
    click.option(
        "--sign-key",
        "sign_key",
        metavar="FILE",
        type=click.Path(dir_okay=False),
        help="With --attest: sign the statement (a DSSE envelope, stored where cosign stores a key-signed "
        "attestation) with this private key: ECDSA P-256 or Ed25519 PEM, mode 0600; an encrypted one opens "
        "with $BUILD_IMAGE_SIGN_KEY_PASSPHRASE. promote counts only signed verdicts.",
    ),
    click.option(
        "--gpu-model",
        "gpu_model",
        default=None,
        metavar="NAME",
        help="The GPU the smoke is for (a name from lockfiles/gate/gpus.toml, e.g. 'NVIDIA H200', or sm_XY): with "
        "--vllm X, a GPU X's torch or vLLM kernels do not cover is exit 1 before anything starts; the driver "
        "floor of X's CUDA is printed.",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout."),
]


def _with_options(f):
    """smoke's argument and options, in the order --help lists them."""
    for opt in reversed(_OPTIONS):
        f = opt(f)
    return f


@click.command("smoke")
@_with_options
def command(**opts):
    """Boot the engine and generate at target concurrency: PASS or FAIL.

    Exit codes: 0 PASS; 1 FAIL (or the equivalence gate failed); 2 bad input (with --attest: an IMAGE the
    registry does not hold, or not the local image); 8 container engine unreachable; 10 registry unreachable
    or refused the attestation (--attest); 12 a helper tool failed; 13 the checkpoint is
    not ready (no server started); 130/143 interrupted.
    """
    image, release, env = _target(opts)
    env.update(engine_env(opts["engine_env"]))
    _gpu_preflight(opts["gpu_model"], opts["vllm"])
    cfg = _config(opts, image, release, env)
    reporter = _reporter()
    signer = _signer(opts)
    subject = _attest_subject(image, opts["server_cmd"]) if opts["attest"] else None
    rep = run_smoke(cfg, reporter=reporter)
    if opts["as_json"]:
        emit_json(rep.to_dict(), stringify=True)
    else:
        click.echo(render_text(rep))
    if subject is not None and not rep.interrupted:  # after the report: a registry failure here loses no result
        _attest(rep, cfg, subject, reporter, signer)
    if rep.interrupted:
        sys.exit(130)
    if not rep.passed:
        # exit 1 through the CLI's error handler
        raise VerdictFailure(f"smoke FAIL: {rep.failures[0] if rep.failures else 'see the report'}")
    return rep


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")


def engine_env(pairs) -> dict[str, str]:
    """``--env NAME=VALUE`` values as a mapping (pure); a value without ``=``, a name that is not an environment
    variable's, or one name given twice with two values is exit 2 naming it."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not _ENV_NAME.fullmatch(name):
            raise BadInput(
                f"smoke --env {pair[:200]!r}: give NAME=VALUE, NAME a variable name ([A-Za-z_][A-Za-z0-9_]*)."
            )
        if "\0" in value:
            raise BadInput(f"smoke --env {name}: the value holds a NUL byte, which no environment can carry.")
        if name in out and out[name] != value:
            raise BadInput(f"smoke --env {name} is given twice with two values; give it once.")
        out[name] = value
    return out


def _target(opts: dict) -> tuple:
    """(image, release, env): the image to run (IMAGE, or the tag of --vllm X's default lock), X's shipped
    release (None without --vllm) and the server's extra environment; exit 2 for no target or two."""
    image, local, server_cmd, vllm = opts["image"], opts["local"], opts["server_cmd"], opts["vllm"]
    if image and local:
        raise BadInput("smoke: give either IMAGE or --local, not both")
    if server_cmd and (image or local):
        raise BadInput("smoke: --server-cmd replaces the server; give it without IMAGE or --local")
    release = None
    env: dict[str, str] = {}
    if vllm:
        from builder.serving.smoke.release import resolve_release

        release = resolve_release(vllm)
        if opts["kv_cache_dtype"]:
            from builder.serving.plan import check_kv_cache_dtype, release_facts

            check_kv_cache_dtype(opts["kv_cache_dtype"], release_facts(vllm))
        if not image and not local and not server_cmd:
            if release.image is None:
                raise BadInput(
                    f"smoke --vllm {vllm}: no default lock (lockfiles/vllm-{vllm}/requirements.lock) names "
                    "an image; give IMAGE or --local."
                )
            image = release.image
        if image:
            _check_release_image(image, vllm, release)
        elif opts["serve"] and opts["serve_backend"] is None and release.serve_backend:
            # no image carries the lock's choice here: give the application the lock's default
            env["BUILD_IMAGE_SERVE_BACKEND"] = release.serve_backend
    if not image and not local and not server_cmd:
        raise BadInput(
            "smoke: give an IMAGE to run with docker, or --local to start `vllm serve` here"
            " (or --vllm X for the image of X's default lock)"
        )
    return image, release, env


def _gpu_preflight(model: str | None, vllm: str | None) -> None:
    """--gpu-model: the GPU against the kernels of --vllm X's shipped base (its manifest's fat-binary facts),
    before the checkpoint or a server is touched; exit 1 naming the binaries that do not cover it. The
    driver floor goes to stderr; without --vllm the image's kernels are not known here: said, not assumed."""
    if model is None:
        return
    from builder.platforms import DEFAULT
    from builder.resolve.manifest import load_manifest
    from builder.serving import gpus
    from builder.spec import default_base_manifest

    target = gpus.capability_of(model, "smoke --gpu-model")
    path = default_base_manifest(vllm, DEFAULT) if vllm else None
    if path is None or not path.is_file():
        click.echo("smoke --gpu-model: no --vllm release with a shipped base manifest: kernels not checked", err=True)
        return
    check = gpus.check(load_manifest(path), target)
    for line in gpus.render(check):
        click.echo(f"smoke: {line}", err=True)
    gpus.refuse_uncovered(check)


def _check_release_image(image: str, vllm: str, release) -> None:
    """--vllm X with an image: it is in the local engine and its labels name X (exit 2 otherwise)."""
    from builder.engine import DockerEngine
    from builder.serving.smoke.release import check_image_release

    info = DockerEngine().inspect(image)
    if info is None:
        raise BadInput(
            f"smoke: image {image} is not in the local engine (the smoke test runs it with "
            "--pull=never)"
            + (
                f"; it is the tag of vllm {vllm}'s default lock "
                f"({release.lock}): build it with `build-image --vllm {vllm}`"
                if image == release.image
                else ""
            )
            + "."
        )
    check_image_release(info.labels, image, vllm)


def _config(opts: dict, image: str | None, release, env: dict[str, str]) -> SmokeConfig:
    """The run's configuration from the flags (exit 2 for a bad --gpu-memory)."""
    extra: list[str] = []
    for a in opts["extra_args"]:  # "--extra-arg '--max-num-batched-tokens 4096'" or one token per flag
        extra.extend(shlex.split(a)) if a.startswith("-") and " " in a else extra.append(a)
    return SmokeConfig(
        model=opts["model"],
        image=image,
        tp=opts["tp"],
        pp=opts["pp"],
        distributed_executor_backend=opts["distributed_executor_backend"],
        ray_address=opts["ray_address"],
        cpu_offload_gb=opts["cpu_offload_gb"],
        max_model_len=opts["max_model_len"],
        gpu_memory_utilization=opts["gpu_memory_utilization"],
        max_num_seqs=opts["max_num_seqs"],
        kv_cache_dtype=opts["kv_cache_dtype"],
        load_format=opts["load_format"],
        concurrency=opts["concurrency"],
        rounds=opts["rounds"],
        chat=not opts["no_chat"],
        max_tokens=opts["max_tokens"],
        prompt_tokens=opts["prompt_tokens"],
        timeout=opts["timeout"],
        boot_timeout=opts["boot_timeout"],
        extra_args=extra,
        server_cmd=opts["server_cmd"],
        vllm_bin=opts["vllm_bin"],
        port=opts["port"],
        log_file=opts["log_file"],
        plan=not opts["no_plan"],
        checkpoint_check=not opts["skip_checkpoint_check"],
        gpu_memory_bytes=_parse_size(opts["gpu_memory"]),
        serve=opts["serve"],
        serve_backend=opts["serve_backend"],
        serve_python=opts["serve_python"],
        serve_num_gpus=opts["serve_num_gpus"],
        reference=opts["reference"],
        save_reference=opts["save_reference"],
        reference_logprob_tolerance=opts["reference_logprob_tolerance"],
        reference_tie_margin=opts["reference_tie_margin"],
        vllm=opts["vllm"],
        release=release.to_dict() if release else None,
        env=env,
    )


def _attest_subject(image: str | None, server_cmd: str | None) -> tuple[str, str]:
    """Before any GPU time: the registry name and digest the verdict will be bound to."""
    if not image:
        raise BadInput("smoke --attest binds the verdict to an image digest: give IMAGE (not --local).")
    from builder.engine import DockerEngine
    from builder.serving.attestation import resolve_subject

    info = DockerEngine().inspect(image) if not server_cmd else None
    return resolve_subject(image, info.id if info else None)


def _signer(opts: dict):
    """Before any GPU time: the --sign-key signer (its file checked), or None."""
    if not opts.get("sign_key"):
        return None
    if not opts["attest"]:
        raise BadInput("smoke --sign-key signs the attestation: give --attest too.")
    from builder.signing import load_signer

    return load_signer(opts["sign_key"])


def _attest(rep, cfg, subject: tuple[str, str], reporter: Reporter, signer=None) -> None:
    from builder.image.provenance import now_iso
    from builder.image.referrers import referrers_tag
    from builder.serving.attestation import attach_statement, checkpoint_facts, smoke_statement
    from builder.serving.smoke import checkpoint_ready
    from builder.serving.smoke.gpu import nvidia_smi_names

    name, digest = subject
    summary = checkpoint_ready(cfg, SILENT)  # the structural pass the run made (well under a second)
    doc = smoke_statement(
        rep.to_dict(),
        name=name,
        digest=digest,
        checkpoint=checkpoint_facts(cfg.model, summary),
        gpu_names=nvidia_smi_names(),
        created=now_iso(),
    )
    att = attach_statement(f"{name}@{digest}", doc, signer)
    how = "listed by the referrers API" if att.referrers == "api" else f"indexed under {name}:{referrers_tag(digest)}"
    signed = f"signed by {signer.fingerprint}" if signer else "UNSIGNED: promote will not count it"
    reporter.step(f"attested: {rep.verdict} attached to {name}@{digest} as {att.digest} ({how}; {signed})")


def _reporter() -> Reporter:
    """Steps as timestamped log lines on stderr (plain ``smoke: `` lines where rich is absent)."""
    try:
        return RichReporter(stderr_console(log_path=False, highlight=True), log=True)
    except ImportError:  # the probe also runs on bare GPU hosts
        return PlainReporter().scoped("smoke: ")
