"""`build-image --vllm X ...`: the whole pipeline (owned by the render/build/push work).

lock (reused when up to date) -> ABI gate (inside lock) -> patch check -> render -> build
-> push -> smoke.  Without a reachable engine it stops after render, prints how to build
the context elsewhere and exits 0 -- unless --push/--smoke were asked for, which cannot be
honoured: then it exits 8 (the context is still written).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import click

from ..errors import BadInput, EngineUnavailable, VerdictFailure


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def _preflight_plan_or_refuse(spec, model: str, console) -> None:
    """Issue 7: plan the spec's serving settings before anything is locked, built or
    booted; an impossible configuration is refused here with the plan's numbers and
    suggestions (zero GPU time, zero build time).  The smoke stage plans again on the
    GPU host (where nvidia-smi knows the card); here the card size comes from
    ``serving.gpu_memory`` or nvidia-smi when present."""
    from ..smoke import checkpoint_ready, config_from_serving, preflight_plan

    cfg = config_from_serving(spec.serving, model=model)
    say = lambda m: console.print(f"  preflight: {m}", highlight=False, markup=False)  # noqa: E731
    checkpoint_ready(cfg, say)  # a checkpoint that is not ready: exit 13 before lock, build or boot
    plan = preflight_plan(cfg, say)
    if plan is None:
        return
    console.print(f"  preflight: {plan['summary']}", highlight=False, markup=False)
    if not plan["fits"]:
        raise VerdictFailure(
            f"memory plan refuses the serving settings before any build or boot: {plan['summary']}",
            hint="change serving.max_model_len / max_num_seqs / gpu_memory_utilization (or the flags), "
            "or run `build-image plan` for the full table.",
        )


class _Stages:
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


@click.command("pipeline")
@click.option("--vllm", "vllm", default=None, help="vLLM version (default: spec or 0.26.0).")
@click.option("--spec", "spec_file", default=None, type=click.Path(dir_okay=False), help="Spec file (default ./build-image.toml if present).")
@click.option("--with", "with_", multiple=True, metavar="REQ", help="Extra overlay requirement (repeatable).")
@click.option("--base", "base", default=None, metavar="MANIFEST|REF", help="Base manifest file, or a local image to snapshot.")
@click.option("--lock", "lock_file", default=None, metavar="FILE", help="Lock file (reused when up to date with its inputs).")
@click.option("-o", "--output", "out", default=None, metavar="DIR", type=click.Path(file_okay=False, path_type=Path),
              help="Build context directory (default build/vllm-<v>).")
@click.option("--tag", "repo", default=None, metavar="REPO", help="Image repository, e.g. 127.0.0.1:5000/serving/vllm.")
@click.option("--push", "push", is_flag=True, help="Push both tags and verify the registry's digest.")
@click.option("--force", "force", is_flag=True, help="Push: move tags that point at a different image.")
@click.option("--series", "series", default=None, metavar="DIR", type=click.Path(file_okay=False, path_type=Path),
              help="Patch series (default patches/vllm/<v>/).")
@click.option("--no-patches", "no_patches", is_flag=True, help="Apply no patch series.")
@click.option("--wheel", "wheel", default=None, metavar="VLLM_WHEEL", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="vllm wheel for the patch check (default: fetched, cached).")
@click.option("--find-links", "find_links", multiple=True, metavar="DIR", help="Extra wheel folder for the lock (uv --find-links).")
@click.option("--no-index", "no_index", is_flag=True, help="Lock from --find-links folders only.")
@click.option("--no-default-overlay", "no_default_overlay", is_flag=True, help="Do not add ray[serve] to the overlay.")
@click.option("--kuberay", "kuberay", is_flag=True, help="Write KubeRay manifests (by digest after --push, else by tag).")
@click.option("--smoke", "smoke", is_flag=True, help="After build (and push), boot the image and run the smoke test.")
@click.option("--model", "model", default=None, metavar="PATH", help="Smoke: checkpoint directory.")
@click.option("--pull", "pull", is_flag=True, help="Build: let the engine pull a base image it does not hold.")
@click.option("--json", "as_json", is_flag=True, help="Final summary as JSON on stdout.")
@click.pass_context
def run_pipeline(ctx, vllm, spec_file, with_=(), base=None, lock_file=None, out=None, repo=None, push=False, force=False,
                 series=None, no_patches=False, wheel=None, find_links=(), no_index=False, no_default_overlay=False, kuberay=False,
                 smoke=False, model=None, pull=False, as_json=False):
    """lock -> ABI gate -> patch check -> render -> build -> push -> smoke."""
    from rich.console import Console

    from ..render import render_context
    from ..spec import load_spec
    from .lock import command as lock_cmd
    from .render import default_out_dir, load_inputs

    console = Console(stderr=True, highlight=False)
    t_all = time.monotonic()
    spec = load_spec(spec_file).with_flags(vllm=vllm, repo=repo, lock=lock_file, model=model)
    if smoke and not model and not spec.serving.model:
        raise BadInput("--smoke needs --model PATH (or serving.model in the spec).")
    if series and no_patches:
        raise BadInput("--series and --no-patches contradict each other.")
    if push and not spec.repo:
        raise BadInput("--push needs --tag HOST[:PORT]/REPO (or 'repo' in the spec).")
    if not series and not no_patches:  # before any lock or download: a release nobody ported patches to
        from ..patches import require_series

        require_series(spec.vllm)
    if smoke:
        _preflight_plan_or_refuse(spec, model or spec.serving.model, console)
    out = out or default_out_dir(spec.vllm)
    stages = _Stages(console, 3 + int(push) + int(smoke))  # lock, patch+render, build [, push] [, smoke]
    summary: dict = {"vllm": spec.vllm, "context": str(out), "stages_s": stages.times}

    base_arg = base or spec.base
    from ..baseref import classify

    if classify(base_arg) == "image":  # the one rule (builder/baseref.py): snapshot once, beside the context
        from ..base import snapshot_image

        manifest_path = out.parent / f"base-{base_arg.replace('/', '_').replace(':', '_').replace('@', '_')}.json"
        stages.total += 1
        with stages.stage("base", f"snapshot {base_arg}"):
            snapshot_image(base_arg).save(manifest_path)
        base_arg = str(manifest_path)

    with stages.stage("lock", f"{spec.lock_path} (reused when up to date; ABI gate on a new resolution)"):
        with contextlib.redirect_stdout(sys.stderr):
            ctx.invoke(lock_cmd, vllm=spec.vllm, with_=tuple(with_), base=base_arg, spec_path=spec_file,
                       output=str(spec.lock_path), check=False, upgrade=False, allow_names=(), reasons=(),
                       find_links=tuple(find_links), no_index=no_index, exclude_newer=None,
                       no_default_overlay=no_default_overlay, as_json=False)
    manifest, lock, lock_text = load_inputs(spec, lock_file=str(spec.lock_path), base=base_arg)
    summary["lock"] = str(spec.lock_path)
    summary["lock_hash"] = lock.lock_hash

    if kuberay:  # bad serving settings fail here (exit 2, before the context is written), not after the build
        from ..kuberay import render_manifests

        render_manifests(lock=lock, spec=spec, image="build-image.invalid/check:kuberay", allow_tag=True, base=manifest)

    marks: dict[str, float] = {}

    def on_step(s: str) -> None:
        if s == "patch series" or s.startswith("wheelhouse") or s == "write context":
            marks[s.split(" ")[0]] = time.monotonic()
        console.print(f"  {s}", highlight=False)

    with stages.stage("patch+render", f"patch check, wheelhouse, context -> {out}"):
        t0 = time.monotonic()
        result = render_context(vllm=spec.vllm, base=manifest, lock=lock, lock_text=lock_text, out_dir=out,
                                series_dir=series, vllm_wheel=wheel, repo=spec.repo, spec=spec, no_patches=no_patches,
                                on_step=on_step)
    if "wheelhouse" in marks:  # split the stage: patch check+apply, then wheelhouse + context
        both = stages.times.pop("patch+render")
        stages.times["patch"] = round(marks["wheelhouse"] - marks.get("patch", t0), 2)
        stages.times["render"] = round(both - stages.times["patch"], 2)
    summary.update(tags=result.tags, patches=result.plan.patches, context_bytes=_dir_size(out),
                   base=manifest.pinned_ref)

    def write_kuberay(image: str, allow_tag: bool) -> None:
        from ..kuberay import write_manifests

        paths = write_manifests(out, lock=lock, spec=spec, image=image, allow_tag=allow_tag, base=manifest)
        summary["kuberay"] = [str(p) for p in paths]
        if allow_tag and "@sha256:" not in image:
            console.print(f"[yellow]kuberay: the manifests run {image} by tag[/yellow] (not pushed, so no registry "
                          "digest yet; --push pins them by digest).", highlight=False)

    from ..engine import get_engine

    engine = get_engine()
    try:
        engine.ping()
    except EngineUnavailable as exc:
        how = (f"build-image build {out}" + (f" --tag {spec.repo}" if spec.repo else "")
               + f"   (or: cd {out} && DOCKER_BUILDKIT=1 docker build --network=none"
               + "".join(f" -t {t}" for t in result.tags) + " .)")
        summary.update(status="rendered", engine=exc.message, build_command=how,
                       total_s=round(time.monotonic() - t_all, 2))
        if kuberay:
            write_kuberay(result.tags[0], allow_tag=True)
        if push or smoke:
            _emit(as_json, summary, console)
            raise EngineUnavailable(
                f"{exc.message} The context is complete in {out}, but --push/--smoke need an engine.",
                hint=f"build where an engine runs: {how}",
            ) from None
        console.print(f"[yellow]no container engine reachable[/yellow] ({exc.message})\n"
                      f"stopped after render; the context in {out} is self-contained. Build it where an engine runs:\n  {how}",
                      highlight=False)
        _emit(as_json, summary, console)
        return

    from .build import build_context, missing_bases

    missing = [] if pull else missing_bases(out, engine)
    if missing:
        how = (f"docker pull {missing[0]} && build-image build {out}" + (f" --tag {spec.repo}" if spec.repo else ""))
        summary.update(status="rendered", missing_base=missing, build_command=how,
                       total_s=round(time.monotonic() - t_all, 2))
        msg = (f"the base image {', '.join(missing)} is not in the engine's image store (build-image never pulls "
               f"it implicitly; --pull allows it).")
        if kuberay:
            write_kuberay(result.tags[0], allow_tag=True)
        if push or smoke:
            _emit(as_json, summary, console)
            from ..errors import BuildFailed

            raise BuildFailed(msg + f" The context is complete in {out}.", hint=how)
        console.print(f"[yellow]{msg}[/yellow]\nstopped after render; the context in {out} is self-contained. "
                      f"Build it:\n  {how}", highlight=False)
        _emit(as_json, summary, console)
        return

    with stages.stage("build", "BuildKit, --network=none"):
        built = build_context(out, spec.repo, engine=engine, console=console, pull=pull)
    summary.update(image_id=built["image_id"], image_bytes=built["size_bytes"], cached_steps=built["cached_steps"])
    image_for_later = result.tags[0]

    if push:
        from .push import push_tags

        with stages.stage("push", f"{', '.join(result.tags)}"):
            pushed = push_tags(result.tags, force=force, engine=engine, console=console)
        summary.update(digest=pushed["digest"], pinned=pushed["pinned"])
        image_for_later = pushed["pinned"]
        from ..referrers import push_attestations, summary_line

        summary["attestations"] = push_attestations(out, pushed["pinned"], result.tags)
        console.print(f"  push: {summary_line(summary['attestations'])}", highlight=False, markup=False)
    if kuberay:
        write_kuberay(image_for_later, allow_tag=not push)
    verdict_failed = None
    if smoke:
        from ..smoke import config_from_serving, render_text, run_smoke

        with stages.stage("smoke", f"{image_for_later} with {model or spec.serving.model}"):
            rep = run_smoke(config_from_serving(spec.serving, model=model or spec.serving.model, image=image_for_later),
                            progress=lambda m: console.print(f"  smoke: {m}", highlight=False, markup=False))
        console.print(render_text(rep), highlight=False, markup=False)
        summary.update(smoke=rep.to_dict(), smoke_verdict=rep.verdict)
        if rep.exit_code != 0:
            verdict_failed = rep
    summary.update(status="pushed" if push else "built", total_s=round(time.monotonic() - t_all, 2))
    _emit(as_json, summary, console)
    if verdict_failed is not None:
        from ..errors import VerdictFailure

        raise VerdictFailure(f"smoke test of {image_for_later}: {verdict_failed.verdict}.")


def _emit(as_json: bool, summary: dict, console) -> None:
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    lines = [f"vllm {summary['vllm']}  lock {summary.get('lock')} ({summary.get('lock_hash', '')[:12]})",
             f"context {summary['context']} ({summary.get('context_bytes', 0) / 1e6:.1f} MB)"]
    if summary.get("image_id"):
        lines.append(f"image {summary['image_id']} ({(summary.get('image_bytes') or 0) / 1e6:.1f} MB)")
    for t in summary.get("tags", []):
        lines.append(f"tag {t}")
    if summary.get("digest"):
        lines.append(f"pushed {summary['pinned']}")
    lines.append("time " + ", ".join(f"{k} {v}s" for k, v in summary["stages_s"].items())
                 + f"; total {summary.get('total_s')}s")
    click.echo("\n".join(lines))
