"""The whole pipeline, composed in memory: lock -> ABI gate -> patch check -> render -> build
-> push -> smoke.

Each stage is a function of ``builder/`` that returns a frozen result the next one takes:
:func:`builder.resolve.lockstage.run_lock` -> :class:`~builder.resolve.lockstage.Locked` ->
:func:`builder.image.render.render_context` -> :class:`~builder.image.render.RenderResult` ->
:func:`builder.image.build.build_image` -> :class:`~builder.image.build.BuildResult` ->
:func:`builder.image.push.push_image` -> :class:`~builder.image.push.PushResult` ->
:func:`builder.serving.smoke.run_smoke` -> :class:`~builder.serving.smoke.SmokeReport`.  Nothing is read
back from disk between them (the lock, the manifest, the Dockerfile), and each wheel is
hashed once in a run.  Before any of them, :func:`release_context` resolves what the run is about
once (the version, the base's kind and manifest, the patch series) into a :class:`Release` the
stages take their part of.  Progress goes to one :class:`builder.events.Reporter` as events; each
stage's seconds are measured around it (the patch step's inside render, carried in its result).

Without a reachable engine (or without the base image in its store) the pipeline stops
after render and says how to build the context elsewhere; with ``--push``/``--smoke``,
which cannot be honoured then, :attr:`PipelineResult.error` carries the exit-8 (or 9)
error the command raises after printing the summary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

from builder import engine as engine_adapter
from builder.engine import ImageInfo
from builder.errors import BadInput, BuildFailed, BuildImageError, EngineUnavailable, VerdictFailure
from builder.events import Reporter
from builder.image.build import BuildResult, base_platform_mismatch, build_image, inspect_bases, missing_bases
from builder.image.multiplatform import build_platforms, push_platforms, read_multi_context
from builder.image.naming import lock_platform
from builder.image.platforms_render import build_plan, render_platforms
from builder.image.push import PushResult, push_image
from builder.image.render import RenderInputs, RenderResult, build_hint, render_context, render_inputs
from builder.patching.series import Series, load_series, shipped_series
from builder.platforms import DEFAULT, Platform, from_uv_platform
from builder.resolve import base as base_snapshot
from builder.resolve.baseref import ResolvedBase, classify, resolve_base
from builder.resolve.floor import compare
from builder.resolve.lockstage import Locked, run_lock
from builder.serving.kuberay import render_manifests, write_manifests
from builder.serving.smoke import (
    SmokeReport,
    checkpoint_ready,
    config_from_serving,
    preflight_plan,
    render_text,
    run_smoke,
)
from builder.spec import Spec, check_vllm_version
from builder.validate import version_string
from builder.values import split_ref


@dataclass(frozen=True)
class PipelineRequest:
    """What the pipeline was asked to do (the spec carries vllm, base, overlay, lock, repo, serving)."""

    spec: Spec  # flags applied
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
    allow_base_drift: bool = False
    platforms: tuple[Platform, ...] = (DEFAULT,)  # several: one context per platform, one index

    def check(self) -> None:
        """Contradictory or incomplete flags: BadInput before any work."""
        if len(self.platforms) > 1:
            given = [
                f
                for f, v in (
                    ("--lock", self.spec.lock),
                    ("--base", self.spec.base),
                    ("--smoke", self.smoke),
                    ("--kuberay", self.kuberay),
                )
                if v
            ]
            if given:
                raise BadInput(
                    f"{' and '.join(given)} apply to one platform's image, and {len(self.platforms)} "
                    "platforms were asked for.",
                    hint="drop " + " and ".join(given) + ", or run one --platform at a time (smoke "
                    "and KubeRay run the platform of the GPU nodes).",
                )
        if self.smoke and not self.model:
            raise BadInput("--smoke needs --model PATH (or serving.model in the spec).")
        if self.series and self.no_patches:
            raise BadInput("--series and --no-patches contradict each other.")
        if self.push and not self.spec.repo:
            raise BadInput("--push needs --tag HOST[:PORT]/REPO (or 'repo' in the spec).")


@dataclass(frozen=True)
class Release:
    """The release the pipeline builds, each fact resolved once before any stage runs and handed to
    the stages that need it: the version (validated), the base (classified; a manifest resolved and
    loaded, an image reference snapshotted later by the base stage), the patch series (located and
    loaded; None with ``--no-patches``)."""

    vllm: str
    base_kind: str  # default | manifest | image (builder.resolve.baseref.classify)
    base: ResolvedBase | None  # the shipped or given manifest; None for an image reference
    base_value: str | None  # the --base value (an image reference is snapshotted from it)
    series: Series | None


def release_context(req: PipelineRequest) -> Release:
    """The release of ``req``: a version (never a word or a path), and, on the shipped base (no ``--base``),
    one this checkout has a base manifest for: exit 2 naming the known releases; then its patch series
    (exit 6 for a release nobody ported patches to, unless ``--series``/``--no-patches``) and its base
    manifest -- all before anything is locked or downloaded."""
    spec = req.spec
    where = "--vllm" if not spec.source else f"--vllm / {spec.source} 'vllm'"
    vllm = version_string(spec.vllm, where=where)
    kind = classify(spec.base)
    if kind == "default":
        check_vllm_version(vllm, where=where, platform=spec.platform)
    series = None
    if not req.no_patches:
        series = load_series(req.series if req.series else shipped_series(vllm), vllm)
    base = resolve_base(spec.base, vllm, kind=kind, platform=spec.platform) if kind != "image" else None
    return Release(vllm=vllm, base_kind=kind, base=base, base_value=spec.base, series=series)


@dataclass(frozen=True)
class HeldBase:
    """The base manifest's image, held by the engine: what :func:`verify_base` snapshots."""

    resolved: ResolvedBase  # the shipped or given manifest
    ref: str  # the manifest's pinned reference, as the engine holds it
    image_id: str
    digest: str | None  # the registry digest the engine knows for it, if any
    replay: dict | None = None  # the image is a `base materialize` replay (builder.resolve.base.replay_of)


@dataclass(frozen=True)
class BaseCheck:
    """What :func:`verify_base` found: ``verified`` (the manifest describes the image) or ``drift``
    (``differences``; the lock is then made against ``base``, the snapshot)."""

    status: str  # verified | drift
    base: ResolvedBase  # the base the lock uses
    ref: str
    image: str  # digest (or image ID) the manifest was compared with
    differences: tuple[str, ...]
    seconds: float
    reused: bool  # the snapshot came from the cache (same image ID)
    replay: dict | None = None  # compared against a `base materialize` replay, not the published image

    def to_dict(self, context: Path) -> dict:
        return {
            "status": self.status,
            "image": self.ref,
            "against": self.image,
            "against_replay": self.replay,
            "differences": list(self.differences),
            "snapshot_s": self.seconds,
            "snapshot_reused": self.reused,
            "manifest": str(Path(context) / "checks" / "base-manifest.json"),
        }


@dataclass(frozen=True)
class PipelineResult:
    """Every stage's result (None for a stage that did not run), the summary the command prints,
    and the error it raises after printing it (push/smoke asked for but impossible, a FAIL verdict)."""

    status: str  # rendered | built | pushed
    summary: dict
    locked: Locked | None = None
    rendered: RenderResult | None = None
    built: BuildResult | None = None
    pushed: PushResult | None = None
    smoke: SmokeReport | None = None
    error: BuildImageError | None = None
    notice: str | None = None  # why it stopped after render, with how to go on
    notice_lead: str = ""  # the notice's opening words, shown emphasised
    stages_s: dict[str, float] = field(default_factory=dict)  # each stage's seconds, in order


class Stages:
    """Each stage as two events on the reporter (started, ``[n/N] name: what``; finished, its seconds),
    and the seconds kept for the summary."""

    def __init__(self, reporter: Reporter, total: int):
        self.reporter = reporter
        self.total = total
        self.times: dict[str, float] = {}
        self._n = 0

    @contextlib.contextmanager
    def stage(self, name: str, what: str):
        self._n += 1
        self.reporter.stage_started(self._n, self.total, name, what)
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.times[name] = round(time.monotonic() - t0, 2)
            self.reporter.stage_finished(name, self.times[name])

    def split(self, name: str, first: str, first_s: float, rest: str) -> None:
        """One stage's seconds as two, in its place: ``first`` (``first_s``, which the stage's result
        measured) and ``rest`` (the remainder)."""
        whole = self.times.pop(name)
        self.times[first] = round(first_s, 2)
        self.times[rest] = round(whole - self.times[first], 2)


def preflight(req: PipelineRequest, reporter: Reporter) -> dict | None:
    """Before anything is locked, built or booted (``--smoke``): the checkpoint is ready and the
    memory plan fits the serving settings, else refused here with the plan's numbers (zero GPU
    and build time).  The plan is handed to the smoke stage, which does not compute it again."""
    cfg = config_from_serving(req.spec.serving, model=req.model, vllm=req.spec.vllm)  # the release's plan facts
    told = reporter.scoped("  preflight: ")
    checkpoint_ready(cfg, told)  # a checkpoint that is not ready: exit 13 before lock, build or boot
    plan = preflight_plan(cfg, told)
    if plan is None:
        return None
    told.step(plan["summary"])
    if not plan["fits"]:
        raise VerdictFailure(
            f"memory plan refuses the serving settings before any build or boot: {plan['summary']}",
            hint="change serving.max_model_len / max_num_seqs / gpu_memory_utilization (or the flags), "
            "or run `build-image plan` for the full table.",
        )
    return plan


def base_held_by_engine(release: Release, engine) -> HeldBase | None:
    """The release's base manifest (shipped or a file) and its image, when the engine is reachable and
    holds that image; None otherwise (no engine, image not there, a manifest without a reference)."""
    if release.base is None:
        return None
    ref = release.base.manifest.pinned_ref
    if not ref:
        return None
    try:
        engine.ping()
        info = engine.inspect(ref)
    except EngineUnavailable:
        return None
    if info is None:
        return None
    manifest_platform = release.base.manifest.platform
    want = (
        from_uv_platform(manifest_platform, where=f"base manifest {release.base.label}")
        if manifest_platform
        else DEFAULT
    )
    refused = base_platform_mismatch(
        [ref],
        want,
        engine,
        what=f"the base manifest {release.base.label} (and a lock made on it) is",
        inspected={ref: info},
    )
    if refused is not None:  # never snapshot another machine's image in its place: that would lock for it silently
        raise refused
    repo = split_ref(ref).familiar_name
    digest = (
        ref.split("@", 1)[1]
        if "@" in ref
        else next(
            (d.split("@", 1)[1] for d in info.repo_digests if "@" in d and split_ref(d).familiar_name == repo), None
        )
    )
    return HeldBase(
        resolved=release.base, ref=ref, image_id=info.id, digest=digest, replay=base_snapshot.replay_of(info.labels)
    )


def verify_base(held: HeldBase, reporter: Reporter) -> BaseCheck:
    """Snapshot the held base (cached by image ID) and compare it with its manifest: the same ->
    ``verified`` (a message on ``reporter``), the manifest kept; different -> ``drift``, each difference told
    in a warning, and the lock made against the snapshot (a ``ResolvedBase`` of kind ``image``)."""
    t0 = time.monotonic()
    snap, reused = base_snapshot.snapshot_cached(held.ref, image_id=held.image_id)
    seconds = round(time.monotonic() - t0, 2)
    against = held.digest or f"image {held.image_id}"
    if held.replay is not None:  # a materialized base under the published name is never taken for it
        against += f", {base_snapshot.replay_words(held.replay)}"
    diffs = tuple(compare(held.resolved.manifest, snap))
    how = f"snapshot {'reused' if reused else 'taken'} in {seconds}s"
    if not diffs:
        reporter.message(f"base manifest verified against {against} ({how})")
        return BaseCheck(
            status="verified",
            base=held.resolved,
            ref=held.ref,
            image=against,
            differences=(),
            seconds=seconds,
            reused=reused,
            replay=held.replay,
        )
    reporter.warning(
        f"base manifest {held.resolved.label} differs from the image {held.ref} ({against}; {how}) in "
        f"{len(diffs)} place(s):\n"
        + "\n".join(f"  - {d}" for d in diffs)
        + f"\nlocking against the snapshot of {'the replay' if held.replay else 'the real image'} (shipped in the "
        "context as checks/base-manifest.json)."
    )
    text = snap.to_json()
    snapshot = ResolvedBase(manifest=snap, data=text.encode("utf-8"), label=f"snapshot of {held.ref}", kind="image")
    return BaseCheck(
        status="drift",
        base=snapshot,
        ref=held.ref,
        image=against,
        differences=diffs,
        seconds=seconds,
        reused=reused,
        replay=held.replay,
    )


def _base_note(checked: BaseCheck | None) -> str | None:
    """What the SBOM and the provenance say about a manifest the pipeline replaced with its snapshot."""
    if checked is None or checked.status != "drift":
        return None
    return (
        f"snapshot of the local image {checked.ref} ({checked.image}) taken by the pipeline, which found the "
        f"base manifest differing from it in {len(checked.differences)} place(s)"
    )


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def run(req: PipelineRequest, reporter: Reporter, *, engine=None) -> PipelineResult:
    """Run the stages in order, each on the previous one's result (see the module doc); several platforms:
    :func:`run_platforms`."""
    req.check()
    if len(req.platforms) > 1:
        return run_platforms(req, reporter, engine=engine)
    release = release_context(req)  # before any lock or download: each fact of the release, once
    spec = req.spec
    t_all = time.monotonic()
    plan = preflight(req, reporter) if req.smoke else None
    engine = engine or engine_adapter.get_engine()
    held = base_held_by_engine(release, engine)
    base_stage = release.base_kind == "image" or held is not None
    stages = Stages(reporter, 3 + int(req.push) + int(req.smoke) + int(base_stage))
    r = _Run(
        req=req,
        release=release,
        reporter=reporter,
        stages=stages,
        t_all=t_all,
        summary={"vllm": spec.vllm, "context": str(req.out), "stages_s": stages.times},
    )
    r.lock(held)
    if req.kuberay:  # bad serving settings fail here (exit 2, before the context is written), not after the build
        render_manifests(
            lock=r.inputs.lock,
            spec=spec,
            image="build-image.invalid/check:kuberay",
            allow_tag=True,
            base=r.inputs.manifest,
        )
    rendered = r.render()
    stopped = r.reach_engine(engine)
    if stopped is not None:
        return stopped
    r.build(engine)
    image = rendered.tags[0]
    if req.push:
        image = r.push(engine)
    if req.kuberay:
        r.write_kuberay(image, allow_tag=not req.push)
    error = r.smoke(image, plan) if req.smoke else None
    status = "pushed" if req.push else "built"
    r.summary.update(status=status, total_s=round(time.monotonic() - t_all, 2))
    return PipelineResult(
        status=status,
        summary=r.summary,
        locked=r.locked,
        rendered=r.rendered,
        built=r.built,
        pushed=r.pushed,
        smoke=r.smoked,
        error=error,
        stages_s=stages.times,
    )


@dataclass
class _Run:
    """One pipeline run: the stages, each filling its result and the summary."""

    req: PipelineRequest
    release: Release
    reporter: Reporter
    stages: Stages
    t_all: float
    summary: dict
    checked: BaseCheck | None = None  # the base manifest against the image the engine holds
    locked: Locked | None = None
    inputs: RenderInputs | None = None
    rendered: RenderResult | None = None
    built: BuildResult | None = None
    pushed: PushResult | None = None
    smoked: SmokeReport | None = None
    bases: dict[str, ImageInfo | None] | None = None  # the rendered context's bases as the engine holds them

    def lock(self, held: HeldBase | None) -> Locked:
        """The base (an image reference is snapshotted; a manifest whose image the engine holds is
        verified against it, and its snapshot used where they differ) and the lock on it."""
        spec, release = self.req.spec, self.release
        base = release.base
        if release.base_kind == "image":
            with self.stages.stage("base", f"snapshot {spec.base}"):
                base = resolve_base(release.base_value, release.vllm, kind="image", platform=spec.platform)
        elif held is not None:
            with self.stages.stage("base", f"verify the manifest against {held.ref} (the engine holds it)"):
                self.checked = verify_base(held, self.reporter)
                base = self.checked.base
                self.summary["base_check"] = self.checked.to_dict(self.req.out)
        with self.stages.stage("lock", f"{spec.lock_path} (reused when up to date; ABI gate on a new resolution)"):
            locked = run_lock(
                spec, default_overlay=self.req.default_overlay, base=base, reporter=self.reporter.scoped("lock: ")
            )
            self.reporter.message(locked.summary_line())
        self.locked = locked
        self.inputs = render_inputs(spec, locked=locked)
        self.summary["lock"] = str(locked.path)
        self.summary["lock_hash"] = locked.lock_hash
        return locked

    def render(self) -> RenderResult:
        """Patch check and the build context, timed as two stages (the patch step's seconds are in the result)."""
        req, spec, out, inputs = self.req, self.req.spec, self.req.out, self.inputs
        assert inputs is not None
        with self.stages.stage("patch+render", f"patch check, wheelhouse, context -> {out}"):
            rendered = render_context(
                vllm=spec.vllm,
                base=inputs.manifest,
                lock=inputs.lock,
                lock_text=inputs.lock_text,
                out_dir=out,
                series=self.release.series,
                vllm_wheel=req.wheel,
                repo=spec.repo,
                no_patches=req.no_patches,
                reporter=self.reporter.scoped("  "),
                base_data=inputs.base_data,
                allow_base_drift=req.allow_base_drift,
                base_note=_base_note(self.checked),
            )
        self.stages.split("patch+render", "patch", rendered.timings["patch"], "render")
        self.rendered = rendered
        self.summary.update(
            tags=list(rendered.tags),
            patches=rendered.plan.patches,
            context_bytes=_dir_size(out),
            base=inputs.manifest.pinned_ref,
        )
        return rendered

    def write_kuberay(self, image: str, allow_tag: bool) -> None:
        assert self.inputs is not None
        paths = write_manifests(
            self.req.out,
            lock=self.inputs.lock,
            spec=self.req.spec,
            image=image,
            allow_tag=allow_tag,
            base=self.inputs.manifest,
        )
        self.summary["kuberay"] = [str(p) for p in paths]
        if allow_tag and "@sha256:" not in image:
            self.reporter.warning(
                " (not pushed, so no registry digest yet; --push pins them by digest).",
                lead=f"kuberay: the manifests run {image} by tag",
            )

    def stop_after_render(
        self, why: str, detail: str, build_it: str, how: str, error: BuildImageError, **extra
    ) -> PipelineResult:
        req, out, rendered = self.req, self.req.out, self.rendered
        assert rendered is not None
        self.summary.update(
            status="rendered", **extra, build_command=how, total_s=round(time.monotonic() - self.t_all, 2)
        )
        if req.kuberay:
            self.write_kuberay(rendered.tags[0], allow_tag=True)
        wanted = req.push or req.smoke
        notice = (
            None
            if wanted
            else (f"{why}{detail}\nstopped after render; the context in {out} is self-contained. {build_it}:\n  {how}")
        )
        return PipelineResult(
            status="rendered",
            summary=self.summary,
            locked=self.locked,
            rendered=rendered,
            error=error if wanted else None,
            notice=notice,
            notice_lead=why if notice else "",
            stages_s=self.stages.times,
        )

    def reach_engine(self, engine) -> PipelineResult | None:
        """None when the engine answers and holds the base images; else the run stops after render."""
        out, spec, rendered = self.req.out, self.req.spec, self.rendered
        assert rendered is not None
        try:
            engine.ping()
        except EngineUnavailable as exc:
            how = build_hint(out, spec.repo, rendered.tags, spec.platform)
            return self.stop_after_render(
                "no container engine reachable",
                f" ({exc.message})",
                "Build it where an engine runs",
                how,
                EngineUnavailable(
                    f"{exc.message} The context is complete in {out}, but --push/--smoke need an engine.",
                    hint=f"build where an engine runs: {how}",
                ),
                engine=exc.message,
            )
        if not self.req.pull:
            self.bases = inspect_bases(rendered.base_refs, engine)  # asked once; the build reads it too
        missing = [] if self.req.pull else missing_bases(rendered.base_refs, engine, self.bases)
        if missing:
            how = f"docker pull {missing[0]} && build-image build {out}" + (f" --tag {spec.repo}" if spec.repo else "")
            msg = (
                f"the base image {', '.join(missing)} is not in the engine's image store (build-image never pulls "
                f"it implicitly; --pull allows it)."
            )
            return self.stop_after_render(
                msg,
                "",
                "Build it",
                how,
                BuildFailed(msg + f" The context is complete in {out}.", hint=how),
                missing_base=missing,
            )
        return None

    def build(self, engine) -> BuildResult:
        rendered = self.rendered
        assert rendered is not None
        with self.stages.stage(
            "build", f"{'podman' if getattr(engine, 'name', '') == 'podman' else 'BuildKit'}, --network=none"
        ):
            built = build_image(
                rendered.out_dir,
                rendered.tags,
                vllm=rendered.vllm,
                lock_hash=rendered.lock_hash,
                base_refs=rendered.base_refs,
                engine=engine,
                pull=self.req.pull,
                bases_checked=True,
                reporter=self.reporter.scoped("build: "),
                platform=lock_platform(rendered.lock),
                inspected=self.bases,
            )
        self.built = built
        self.summary.update(image_id=built.image_id, image_bytes=built.size_bytes, cached_steps=built.cached_steps)
        for line in built.warnings:  # allowed base drift, listed by the checks stage
            self.reporter.warning(f"build warning: {line}")
        if built.warnings:
            self.summary["build_warnings"] = list(built.warnings)
        return built

    def push(self, engine) -> str:
        """Push every tag; the image later stages use is the pushed digest."""
        rendered = self.rendered
        assert rendered is not None
        with self.stages.stage("push", f"{', '.join(rendered.tags)}"):
            pushed = push_image(
                rendered.tags,
                force=self.req.force,
                engine=engine,
                context=rendered.out_dir,
                reporter=self.reporter.scoped("push: "),
            )
        self.pushed = pushed
        self.summary.update(digest=pushed.digest, pinned=pushed.pinned, attestations=pushed.attestations)
        return pushed.pinned

    def smoke(self, image: str, plan: dict | None) -> BuildImageError | None:
        """Boot the image and generate; a verdict other than PASS is the error the command raises."""
        req, spec = self.req, self.req.spec
        with self.stages.stage("smoke", f"{image} with {req.model}"):
            smoked = run_smoke(
                config_from_serving(spec.serving, model=req.model, image=image, vllm=spec.vllm),
                reporter=self.reporter.scoped("  smoke: "),
                planned=plan,
            )
        self.smoked = smoked
        self.reporter.message(render_text(smoked))
        self.summary.update(smoke=smoked.to_dict(), smoke_verdict=smoked.verdict)
        if smoked.exit_code != 0:
            return VerdictFailure(f"smoke test of {image}: {smoked.verdict}.")
        return None


def run_platforms(req: PipelineRequest, reporter: Reporter, *, engine=None) -> PipelineResult:
    """Several platforms: each platform's release context and lock (the gate on its own base), then one context
    per platform and ``platforms.json`` (:func:`builder.image.multiplatform.render_platforms`), then the build of
    each platform and the push of one index where the engine holds every platform's base; else it stops after
    render with the commands that finish the job."""

    t_all = time.monotonic()
    stages = Stages(reporter, len(req.platforms) + 2 + int(req.push))
    summary: dict = {
        "vllm": req.spec.vllm,
        "context": str(req.out),
        "platforms": [p.name for p in req.platforms],
        "per_platform": {},
        "stages_s": stages.times,
    }
    locked: dict[Platform, Locked] = {}
    series = None
    for p in req.platforms:
        spec = dataclasses.replace(req.spec, platform=p)
        release = release_context(dataclasses.replace(req, spec=spec, platforms=(p,)))
        series = release.series
        with stages.stage(f"lock {p.name}", f"{spec.lock_path} (reused when up to date; ABI gate on its own base)"):
            one = run_lock(
                spec,
                default_overlay=req.default_overlay,
                base=release.base,
                reporter=reporter.scoped(f"lock {p.name}: "),
            )
            reporter.message(f"{p.name}: {one.summary_line()}")
        locked[p] = one
        summary["per_platform"][p.name] = {
            "lock": str(one.path),
            "lock_hash": one.lock_hash,
            "base": one.manifest.pinned_ref,
        }
    with stages.stage("patch+render", f"one context per platform -> {req.out}"):
        ctx = render_platforms(
            req.spec,
            req.platforms,
            req.out,
            series=series,
            vllm_wheel=req.wheel,
            no_patches=req.no_patches,
            reporter=reporter.scoped("  "),
            allow_base_drift=req.allow_base_drift,
            locked=locked,
        )
    summary.update(index_tags=list(ctx.index_tags), build_plan=build_plan(ctx))
    for c in ctx.platforms:
        summary["per_platform"][c.platform.name].update(context=str(req.out / c.context), tags=list(c.tags))
    stopped = _multi_needs_engine(req, ctx, summary, engine or engine_adapter.get_engine(), t_all, stages)
    if stopped is not None:
        return stopped
    engine = engine or engine_adapter.get_engine()
    mc = read_multi_context(req.out, req.spec.repo)
    with stages.stage("build", f"{', '.join(p.name for p in req.platforms)} (BuildKit, --network=none)"):
        built = build_platforms(mc, engine=engine, pull=req.pull, reporter=reporter.scoped("build: "))
    for b in built.builds:
        summary["per_platform"][b.platform.name].update(image_id=b.image_id, image_bytes=b.size_bytes)
    status = "built"
    if req.push:
        with stages.stage("push", f"each platform, then the index {mc.tags[0]}"):
            pushed = push_platforms(mc, force=req.force, engine=engine, reporter=reporter.scoped("push: "))
        summary.update(digest=pushed.digest, pinned=pushed.pinned, index=pushed.to_dict())
        status = "pushed"
    summary.update(status=status, total_s=round(time.monotonic() - t_all, 2))
    return PipelineResult(status=status, summary=summary, stages_s=stages.times)


def _multi_needs_engine(
    req: PipelineRequest, ctx, summary: dict, engine, t_all: float, stages: Stages
) -> PipelineResult | None:
    """None when the engine answers and holds every platform's base; else the run stops after render, with the
    commands that finish the job (exit 8 when --push was asked for)."""
    how = "\n  ".join(build_plan(ctx))
    try:
        engine.ping()
        missing = [] if req.pull else missing_bases(sorted({c.base_ref for c in ctx.platforms}), engine)
        why = f"the base image {', '.join(missing)} is not in the engine's image store" if missing else None
    except EngineUnavailable as exc:
        why = f"no container engine reachable ({exc.message})"
    if why is None:
        return None
    summary.update(status="rendered", total_s=round(time.monotonic() - t_all, 2))
    notice = (
        f"{why}\nstopped after render; each platform's context in {req.out} is self-contained. Build and "
        f"push them:\n  {how}"
    )
    error = (
        EngineUnavailable(f"{why}; the multi-platform context is complete in {req.out}.", hint=how)
        if req.push
        else None
    )
    return PipelineResult(
        status="rendered",
        summary=summary,
        error=error,
        notice=None if req.push else notice,
        notice_lead=why if not req.push else "",
        stages_s=stages.times,
    )
