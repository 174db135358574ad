"""The whole pipeline, composed in memory: lock -> ABI gate -> patch check -> render -> build
-> push -> smoke.

Each stage is a function of ``builder/`` that returns a frozen result the next one takes:
:func:`builder.resolve.lockstage.run_lock` -> :class:`~builder.resolve.lockstage.Locked` ->
:func:`builder.image.render.render_context` -> :class:`~builder.image.render.RenderResult` ->
:func:`builder.image.build.build_image` -> :class:`~builder.image.build.BuildResult` ->
:func:`builder.image.push.push_image` -> :class:`~builder.image.push.PushResult` ->
:func:`builder.serving.smoke.run_smoke` -> :class:`~builder.serving.smoke.SmokeReport`.  Nothing is read
back from disk between them (the lock, the manifest, the Dockerfile), and each wheel is
hashed once in a run.

Without a reachable engine (or without the base image in its store) the pipeline stops
after render and says how to build the context elsewhere; with ``--push``/``--smoke``,
which cannot be honoured then, :attr:`PipelineResult.error` carries the exit-8 (or 9)
error the command raises after printing the summary.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import engine as engine_adapter
from builder.errors import BadInput, BuildFailed, BuildImageError, EngineUnavailable, VerdictFailure
from builder.image.build import build_image, missing_bases
from builder.image.push import push_image
from builder.image.render import build_hint, render_context, render_inputs
from builder.patching.series import require_series
from builder.resolve.baseref import classify, resolve_base
from builder.resolve.lockstage import run_lock
from builder.serving.kuberay import render_manifests, write_manifests
from builder.serving.smoke import checkpoint_ready, config_from_serving, preflight_plan, render_text, run_smoke


@dataclass(frozen=True)
class PipelineRequest:
    """What the pipeline was asked to do (the spec carries vllm, base, overlay, lock, repo, serving)."""

    spec: Any                       # builder.spec.Spec, flags applied
    out: Path
    push: bool = False
    force: bool = False
    series: Path | None = None
    no_patches: bool = False
    wheel: Path | None = None
    default_overlay: bool = True
    kuberay: bool = False
    smoke: bool = False
    model: str | None = None
    pull: bool = False

    def check(self) -> None:
        """Contradictory or incomplete flags: BadInput before any work."""
        if self.smoke and not self.model:
            raise BadInput("--smoke needs --model PATH (or serving.model in the spec).")
        if self.series and self.no_patches:
            raise BadInput("--series and --no-patches contradict each other.")
        if self.push and not self.spec.repo:
            raise BadInput("--push needs --tag HOST[:PORT]/REPO (or 'repo' in the spec).")


@dataclass(frozen=True)
class PipelineResult:
    """Every stage's result (None for a stage that did not run), the summary the command prints,
    and the error it raises after printing it (push/smoke asked for but impossible, a FAIL verdict)."""

    status: str                      # rendered | built | pushed
    summary: dict
    locked: Any = None               # builder.resolve.lockstage.Locked
    rendered: Any = None             # builder.image.render.RenderResult
    built: Any = None                # builder.image.build.BuildResult
    pushed: Any = None               # builder.image.push.PushResult
    smoke: Any = None                # builder.serving.smoke.SmokeReport
    error: BuildImageError | None = None
    notice: str | None = None        # why it stopped after render, with how to go on


class Stages:
    """``[n/N] name: what`` headers on the console and each stage's seconds."""

    def __init__(self, console, total: int):
        self.console = console
        self.total = total
        self.times: dict[str, float] = {}
        self._n = 0

    @contextlib.contextmanager
    def stage(self, name: str, what: str):
        self._n += 1
        self.console.print(f"[bold][{self._n}/{self.total}] {name}[/bold]: {what}", highlight=False)
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.times[name] = round(time.monotonic() - t0, 2)


def preflight(req: PipelineRequest, console) -> dict | None:
    """Before anything is locked, built or booted (``--smoke``): the checkpoint is ready and the
    memory plan fits the serving settings, else refused here with the plan's numbers (zero GPU
    and build time).  The plan is handed to the smoke stage, which does not compute it again."""
    cfg = config_from_serving(req.spec.serving, model=req.model, vllm=req.spec.vllm)  # the release's plan facts

    def say(m: str) -> None:
        console.print(f"  preflight: {m}", highlight=False, markup=False)

    checkpoint_ready(cfg, say)  # a checkpoint that is not ready: exit 13 before lock, build or boot
    plan = preflight_plan(cfg, say)
    if plan is None:
        return None
    say(plan["summary"])
    if not plan["fits"]:
        raise VerdictFailure(
            f"memory plan refuses the serving settings before any build or boot: {plan['summary']}",
            hint="change serving.max_model_len / max_num_seqs / gpu_memory_utilization (or the flags), "
            "or run `build-image plan` for the full table.",
        )
    return plan


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def run(req: PipelineRequest, console, *, engine=None) -> PipelineResult:
    """Run the stages in order, each on the previous one's result (see the module doc)."""
    req.check()
    spec, out = req.spec, req.out
    if not req.series and not req.no_patches:  # before any lock or download: a release nobody ported patches to

        require_series(spec.vllm)
    t_all = time.monotonic()
    plan = preflight(req, console) if req.smoke else None
    stages = Stages(console, 3 + int(req.push) + int(req.smoke) + int(classify(spec.base) == "image"))
    summary: dict = {"vllm": spec.vllm, "context": str(out), "stages_s": stages.times}

    def tell(msg: str) -> None:
        console.print(msg, highlight=False, markup=False, soft_wrap=True)

    base = None
    if classify(spec.base) == "image":
        with stages.stage("base", f"snapshot {spec.base}"):
            base = resolve_base(spec.base, spec.vllm)
    with stages.stage("lock", f"{spec.lock_path} (reused when up to date; ABI gate on a new resolution)"):
        locked = run_lock(spec, default_overlay=req.default_overlay, base=base,
                          progress=lambda m: tell(f"lock: {m}"), on_message=tell)
        tell(locked.summary_line())
    inputs = render_inputs(spec, locked=locked)
    manifest, lock = inputs.manifest, inputs.lock
    summary["lock"] = str(locked.path)
    summary["lock_hash"] = locked.lock_hash

    if req.kuberay:  # bad serving settings fail here (exit 2, before the context is written), not after the build

        render_manifests(lock=lock, spec=spec, image="build-image.invalid/check:kuberay", allow_tag=True, base=manifest)

    marks: dict[str, float] = {}

    def on_step(s: str) -> None:
        if s == "patch series" or s.startswith("wheelhouse") or s == "write context":
            marks[s.split(" ")[0]] = time.monotonic()
        console.print(f"  {s}", highlight=False)

    with stages.stage("patch+render", f"patch check, wheelhouse, context -> {out}"):
        t0 = time.monotonic()
        rendered = render_context(vllm=spec.vllm, base=manifest, lock=lock, lock_text=inputs.lock_text, out_dir=out,
                                  series_dir=req.series, vllm_wheel=req.wheel, repo=spec.repo,
                                  no_patches=req.no_patches, on_step=on_step)
    if "wheelhouse" in marks:  # split the stage: patch check+apply, then wheelhouse + context
        both = stages.times.pop("patch+render")
        stages.times["patch"] = round(marks["wheelhouse"] - marks.get("patch", t0), 2)
        stages.times["render"] = round(both - stages.times["patch"], 2)
    summary.update(tags=list(rendered.tags), patches=rendered.plan.patches, context_bytes=_dir_size(out),
                   base=manifest.pinned_ref)

    def write_kuberay(image: str, allow_tag: bool) -> None:
        paths = write_manifests(out, lock=lock, spec=spec, image=image, allow_tag=allow_tag, base=manifest)
        summary["kuberay"] = [str(p) for p in paths]
        if allow_tag and "@sha256:" not in image:
            console.print(f"[yellow]kuberay: the manifests run {image} by tag[/yellow] (not pushed, so no registry "
                          "digest yet; --push pins them by digest).", highlight=False)

    def stop_after_render(why: str, build_it: str, how: str, error: BuildImageError, **extra) -> PipelineResult:
        summary.update(status="rendered", **extra, build_command=how, total_s=round(time.monotonic() - t_all, 2))
        if req.kuberay:
            write_kuberay(rendered.tags[0], allow_tag=True)
        wanted = req.push or req.smoke
        notice = None if wanted else f"{why}\nstopped after render; the context in {out} is self-contained. {build_it}:\n  {how}"
        return PipelineResult(status="rendered", summary=summary, locked=locked, rendered=rendered,
                              error=error if wanted else None, notice=notice)

    engine = engine or engine_adapter.get_engine()
    try:
        engine.ping()
    except EngineUnavailable as exc:
        how = build_hint(out, spec.repo, rendered.tags)
        return stop_after_render(
            f"[yellow]no container engine reachable[/yellow] ({exc.message})", "Build it where an engine runs", how,
            EngineUnavailable(f"{exc.message} The context is complete in {out}, but --push/--smoke need an engine.",
                              hint=f"build where an engine runs: {how}"),
            engine=exc.message)

    missing = [] if req.pull else missing_bases(rendered.base_refs, engine)
    if missing:
        how = f"docker pull {missing[0]} && build-image build {out}" + (f" --tag {spec.repo}" if spec.repo else "")
        msg = (f"the base image {', '.join(missing)} is not in the engine's image store (build-image never pulls "
               f"it implicitly; --pull allows it).")
        return stop_after_render(f"[yellow]{msg}[/yellow]", "Build it", how,
                                 BuildFailed(msg + f" The context is complete in {out}.", hint=how),
                                 missing_base=missing)

    with stages.stage("build", "BuildKit, --network=none"):
        built = build_image(rendered.out_dir, rendered.tags, vllm=rendered.vllm, lock_hash=rendered.lock_hash,
                            base_refs=rendered.base_refs, engine=engine, pull=req.pull, bases_checked=True,
                            on_step=lambda s: console.print("build: " + s, markup=False, highlight=False,
                                                            soft_wrap=True))
    summary.update(image_id=built.image_id, image_bytes=built.size_bytes, cached_steps=built.cached_steps)
    image_for_later = rendered.tags[0]

    pushed = None
    if req.push:
        with stages.stage("push", f"{', '.join(rendered.tags)}"):
            pushed = push_image(rendered.tags, force=req.force, engine=engine, context=rendered.out_dir,
                                on_step=lambda s: console.print(f"push: {s}", markup=False, highlight=False))
        summary.update(digest=pushed.digest, pinned=pushed.pinned, attestations=pushed.attestations)
        image_for_later = pushed.pinned
    if req.kuberay:
        write_kuberay(image_for_later, allow_tag=not req.push)
    rep, error = None, None
    if req.smoke:
        with stages.stage("smoke", f"{image_for_later} with {req.model}"):
            rep = run_smoke(config_from_serving(spec.serving, model=req.model, image=image_for_later, vllm=spec.vllm),
                            progress=lambda m: console.print(f"  smoke: {m}", highlight=False, markup=False),
                            planned=plan)
        console.print(render_text(rep), highlight=False, markup=False)
        summary.update(smoke=rep.to_dict(), smoke_verdict=rep.verdict)
        if rep.exit_code != 0:
            error = VerdictFailure(f"smoke test of {image_for_later}: {rep.verdict}.")
    status = "pushed" if req.push else "built"
    summary.update(status=status, total_s=round(time.monotonic() - t_all, 2))
    return PipelineResult(status=status, summary=summary, locked=locked, rendered=rendered, built=built,
                          pushed=pushed, smoke=rep, error=error)


