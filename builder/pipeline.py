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
    spec = req.spec
    if not req.series and not req.no_patches:  # before any lock or download: a release nobody ported patches to
        require_series(spec.vllm)
    t_all = time.monotonic()
    plan = preflight(req, console) if req.smoke else None
    stages = Stages(console, 3 + int(req.push) + int(classify(spec.base) == "image") + int(req.smoke))
    r = _Run(req=req, console=console, stages=stages, t_all=t_all,
             summary={"vllm": spec.vllm, "context": str(req.out), "stages_s": stages.times})
    r.lock()
    if req.kuberay:  # bad serving settings fail here (exit 2, before the context is written), not after the build
        render_manifests(lock=r.inputs.lock, spec=spec, image="build-image.invalid/check:kuberay", allow_tag=True,
                         base=r.inputs.manifest)
    r.render()
    engine, stopped = r.reach_engine(engine)
    if stopped is not None:
        return stopped
    r.build(engine)
    image = r.rendered.tags[0]
    if req.push:
        image = r.push(engine)
    if req.kuberay:
        r.write_kuberay(image, allow_tag=not req.push)
    error = r.smoke(image, plan) if req.smoke else None
    status = "pushed" if req.push else "built"
    r.summary.update(status=status, total_s=round(time.monotonic() - t_all, 2))
    return PipelineResult(status=status, summary=r.summary, locked=r.locked, rendered=r.rendered, built=r.built,
                          pushed=r.pushed, smoke=r.smoked, error=error)


@dataclass
class _Run:
    """One pipeline run: the stages, each filling its result and the summary."""

    req: PipelineRequest
    console: Any
    stages: Stages
    t_all: float
    summary: dict
    locked: Any = None
    inputs: Any = None      # builder.image.render.RenderInputs
    rendered: Any = None
    built: Any = None
    pushed: Any = None
    smoked: Any = None

    def tell(self, msg: str) -> None:
        self.console.print(msg, highlight=False, markup=False, soft_wrap=True)

    def lock(self) -> None:
        """The base (an image reference is snapshotted) and the lock on it."""
        spec = self.req.spec
        base = None
        if classify(spec.base) == "image":
            with self.stages.stage("base", f"snapshot {spec.base}"):
                base = resolve_base(spec.base, spec.vllm)
        with self.stages.stage("lock", f"{spec.lock_path} (reused when up to date; ABI gate on a new resolution)"):
            self.locked = run_lock(spec, default_overlay=self.req.default_overlay, base=base,
                                   progress=lambda m: self.tell(f"lock: {m}"), on_message=self.tell)
            self.tell(self.locked.summary_line())
        self.inputs = render_inputs(spec, locked=self.locked)
        self.summary["lock"] = str(self.locked.path)
        self.summary["lock_hash"] = self.locked.lock_hash

    def render(self) -> None:
        """Patch check and the build context, timed as two stages when the wheelhouse step is seen."""
        req, spec, out, inputs = self.req, self.req.spec, self.req.out, self.inputs
        marks: dict[str, float] = {}

        def on_step(s: str) -> None:
            if s == "patch series" or s.startswith("wheelhouse") or s == "write context":
                marks[s.split(" ")[0]] = time.monotonic()
            self.console.print(f"  {s}", highlight=False)

        with self.stages.stage("patch+render", f"patch check, wheelhouse, context -> {out}"):
            t0 = time.monotonic()
            self.rendered = render_context(vllm=spec.vllm, base=inputs.manifest, lock=inputs.lock,
                                           lock_text=inputs.lock_text, out_dir=out, series_dir=req.series,
                                           vllm_wheel=req.wheel, repo=spec.repo,
                                           no_patches=req.no_patches, on_step=on_step)
        times = self.stages.times
        if "wheelhouse" in marks:  # split the stage: patch check+apply, then wheelhouse + context
            both = times.pop("patch+render")
            times["patch"] = round(marks["wheelhouse"] - marks.get("patch", t0), 2)
            times["render"] = round(both - times["patch"], 2)
        self.summary.update(tags=list(self.rendered.tags), patches=self.rendered.plan.patches,
                            context_bytes=_dir_size(out), base=inputs.manifest.pinned_ref)

    def write_kuberay(self, image: str, allow_tag: bool) -> None:
        paths = write_manifests(self.req.out, lock=self.inputs.lock, spec=self.req.spec, image=image,
                                allow_tag=allow_tag, base=self.inputs.manifest)
        self.summary["kuberay"] = [str(p) for p in paths]
        if allow_tag and "@sha256:" not in image:
            self.console.print(f"[yellow]kuberay: the manifests run {image} by tag[/yellow] (not pushed, so no "
                               "registry digest yet; --push pins them by digest).", highlight=False)

    def stop_after_render(self, why: str, build_it: str, how: str, error: BuildImageError,
                          **extra) -> PipelineResult:
        req, out = self.req, self.req.out
        self.summary.update(status="rendered", **extra, build_command=how,
                            total_s=round(time.monotonic() - self.t_all, 2))
        if req.kuberay:
            self.write_kuberay(self.rendered.tags[0], allow_tag=True)
        wanted = req.push or req.smoke
        notice = None if wanted else (f"{why}\nstopped after render; the context in {out} is self-contained. "
                                      f"{build_it}:\n  {how}")
        return PipelineResult(status="rendered", summary=self.summary, locked=self.locked, rendered=self.rendered,
                              error=error if wanted else None, notice=notice)

    def reach_engine(self, engine) -> tuple[Any, PipelineResult | None]:
        """The engine, with the base images in its store; else the run stops after render."""
        out, spec, rendered = self.req.out, self.req.spec, self.rendered
        engine = engine or engine_adapter.get_engine()
        try:
            engine.ping()
        except EngineUnavailable as exc:
            how = build_hint(out, spec.repo, rendered.tags)
            return engine, self.stop_after_render(
                f"[yellow]no container engine reachable[/yellow] ({exc.message})", "Build it where an engine runs",
                how, EngineUnavailable(f"{exc.message} The context is complete in {out}, but --push/--smoke need "
                                       "an engine.", hint=f"build where an engine runs: {how}"),
                engine=exc.message)
        missing = [] if self.req.pull else missing_bases(rendered.base_refs, engine)
        if missing:
            how = f"docker pull {missing[0]} && build-image build {out}" + (f" --tag {spec.repo}" if spec.repo else "")
            msg = (f"the base image {', '.join(missing)} is not in the engine's image store (build-image never pulls "
                   f"it implicitly; --pull allows it).")
            return engine, self.stop_after_render(f"[yellow]{msg}[/yellow]", "Build it", how,
                                                  BuildFailed(msg + f" The context is complete in {out}.", hint=how),
                                                  missing_base=missing)
        return engine, None

    def build(self, engine) -> None:
        rendered = self.rendered
        with self.stages.stage("build", "BuildKit, --network=none"):
            self.built = build_image(rendered.out_dir, rendered.tags, vllm=rendered.vllm,
                                     lock_hash=rendered.lock_hash, base_refs=rendered.base_refs, engine=engine,
                                     pull=self.req.pull, bases_checked=True,
                                     on_step=lambda s: self.console.print("build: " + s, markup=False,
                                                                          highlight=False, soft_wrap=True))
        self.summary.update(image_id=self.built.image_id, image_bytes=self.built.size_bytes,
                            cached_steps=self.built.cached_steps)

    def push(self, engine) -> str:
        """Push every tag; the image later stages use is the pushed digest."""
        rendered = self.rendered
        with self.stages.stage("push", f"{', '.join(rendered.tags)}"):
            self.pushed = push_image(rendered.tags, force=self.req.force, engine=engine, context=rendered.out_dir,
                                     on_step=lambda s: self.console.print(f"push: {s}", markup=False,
                                                                          highlight=False))
        self.summary.update(digest=self.pushed.digest, pinned=self.pushed.pinned,
                            attestations=self.pushed.attestations)
        return self.pushed.pinned

    def smoke(self, image: str, plan: dict | None) -> BuildImageError | None:
        """Boot the image and generate; a verdict other than PASS is the error the command raises."""
        req, spec = self.req, self.req.spec
        with self.stages.stage("smoke", f"{image} with {req.model}"):
            self.smoked = run_smoke(
                config_from_serving(spec.serving, model=req.model, image=image, vllm=spec.vllm),
                progress=lambda m: self.console.print(f"  smoke: {m}", highlight=False, markup=False),
                planned=plan)
        self.console.print(render_text(self.smoked), highlight=False, markup=False)
        self.summary.update(smoke=self.smoked.to_dict(), smoke_verdict=self.smoked.verdict)
        if self.smoked.exit_code != 0:
            return VerdictFailure(f"smoke test of {image}: {self.smoked.verdict}.")
        return None


