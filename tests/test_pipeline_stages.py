"""The pipeline composes its stages in memory: lock -> render -> build -> push, each on the
previous stage's frozen result, offline on the fixture wheels with an in-memory engine and
registry.  Each wheel is hashed once in a run (counted by wrapping every hashing helper)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from builder.cli import main
from builder.engine import BuiltImage, ImageInfo, PushedRef, buildkit_step
from builder.events import SILENT, RichReporter
from tests.fx_wheels import install_into, write_wheel

IMAGE_ID = "sha256:" + "1" * 64
MANIFEST = "sha256:" + "2" * 64
BASE_REF = "example.org/vllm/vllm-openai:v0.26.0"


class MemoryEngine:
    """The engine protocol in memory: holds the base, builds by recording, pushes what it built."""

    name = "memory"

    def __init__(self):
        self.images = {BASE_REF: ImageInfo(id="sha256:" + "b" * 64, size=1)}
        self.builds: list[tuple[Path, list[str]]] = []
        self.pushes: list[str] = []
        self.inspected: list[str] = []

    def ping(self):
        return "memory"

    def inspect(self, ref):
        self.inspected.append(ref)
        return self.images.get(ref)

    def build(self, context, tags, *, network="none", build_args=None, reporter=SILENT, platform=None):
        assert network == "none"
        self.builds.append((Path(context), list(tags)))
        seen = []
        for line in ("#5 [stage-1 2/4] RUN install", "#5 CACHED"):
            step = buildkit_step(line, seen)
            if step is not None:
                reporter.step(step)
        for t in tags:
            self.images[t] = ImageInfo(id=IMAGE_ID, size=123)
        self.images[IMAGE_ID] = ImageInfo(id=IMAGE_ID, size=123)
        return BuiltImage(image_id=IMAGE_ID, tags=list(tags), log="#5 CACHED\n")

    def push(self, ref, *, reporter=SILENT):
        self.pushes.append(ref)
        return PushedRef(ref=ref, digest=MANIFEST)


class MemoryRegistry:
    def __init__(self):
        self.served: dict[str, tuple[str, dict]] = {}

    def ping(self):
        pass

    def manifest(self, repository, reference):
        return self.served.get(f"{repository}:{reference}")


@pytest.fixture
def world(tmp_path, monkeypatch, wheelhouse):
    """A base with vllm 0.26.0 (a fake wheel) and numpy 1.26.4; an overlay of a pure and an
    abi3 wheel from a find-links folder; a private cache; the engine and registry in memory."""
    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path / "cache"))
    house = tmp_path / "house"
    shutil.copytree(wheelhouse, house)
    write_wheel(house, "vllm", "0.26.0", "py3-none-any", {"vllm/__init__.py": "__version__ = '0.26.0'\n"})
    sp = install_into(tmp_path / "sp", ["vllm==0.26.0", "numpy==1.26.4"], house)
    manifest = tmp_path / "base.json"
    r = CliRunner().invoke(
        main,
        [
            "base",
            "snapshot",
            "--site-packages",
            str(sp),
            "--python",
            "3.12",
            "--glibc",
            "2.35",
            "--cuda",
            "13.0",
            "--image-ref",
            BASE_REF,
            "-o",
            str(manifest),
        ],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    engine, registry = MemoryEngine(), MemoryRegistry()
    import builder.image.registry as R

    def client_for(tag):
        ref = R.parse_ref(tag)
        real_push = engine.push

        def push(t, *, reporter=SILENT):  # the registry serves what the engine pushed
            res = real_push(t, reporter=reporter)
            pr = R.parse_ref(t)
            registry.served[f"{pr.repository}:{pr.tag}"] = (MANIFEST, {"config": {"digest": IMAGE_ID}})
            return res

        engine.push = push
        return registry, ref

    monkeypatch.setattr(R, "client_for", client_for)
    monkeypatch.setattr("builder.engine.get_engine", lambda: engine)
    attached = []  # the referrers upload is tested against a real registry (test_image_e2e); here: what it is handed

    def push_attestations(context, pinned, tags, signer=None):
        attached.append((Path(context), pinned, list(tags)))
        return {"subject": pinned, "pushed": False, "reason": "in-memory registry", "files": {}}

    monkeypatch.setattr("builder.image.referrers.push_attestations", push_attestations)
    engine.attached = attached
    from builder.resolve.manifest import load_manifest

    # what a snapshot of the held base reads (the real one is tested on the engine: test_floor_e2e)
    engine.snapshots, engine.snapshot_calls = {BASE_REF: load_manifest(manifest)}, []

    def snapshot_image(ref, **kw):
        engine.snapshot_calls.append(ref)
        return engine.snapshots[ref]

    monkeypatch.setattr("builder.resolve.base.snapshot_image", snapshot_image)
    world = dataclasses.make_dataclass("World", ["manifest", "house", "engine", "tmp"])
    return world(manifest, house, engine, tmp_path)


class _Counts(dict):
    """File name hashed -> times; ``of(wheel)`` also counts a download's temp file (``.NAME.<random>``)."""

    def of(self, wheels) -> dict[str, int]:
        return {w: sum(n for name, n in self.items() if name.lstrip(".").startswith(w)) for w in wheels}


def _count_hashes(monkeypatch) -> _Counts:
    """Wrap every module-level sha256 helper of the package: file name -> times hashed."""
    import builder.util as U

    counts = _Counts()
    real = U.sha256_file

    def counting(path, *a, **kw):
        counts[Path(path).name] = counts.get(Path(path).name, 0) + 1
        return real(path, *a, **kw)

    for name, mod in list(sys.modules.items()):
        if (name == "builder" or name.startswith("builder.")) and getattr(mod, "sha256_file", None) is real:
            monkeypatch.setattr(mod, "sha256_file", counting)
    U._DIGESTS.clear()  # a fresh process
    return counts


def _request(world, **kw):
    from builder.pipeline import PipelineRequest
    from builder.spec import Spec

    spec = Spec().with_flags(
        base=str(world.manifest),
        lock=str(world.tmp / "overlay.lock"),
        with_=["purepkg==1.0.0", "stableabi==1.0.0"],
        find_links=[str(world.house)],
        no_index=True,
        repo="127.0.0.1:5000/serving/vllm",
    )
    return PipelineRequest(spec=spec, out=world.tmp / "ctx", default_overlay=False, no_patches=True, **kw)


def test_the_pipeline_hands_each_stage_the_previous_result_and_hashes_each_wheel_once(world, monkeypatch):
    from builder.pipeline import run

    counts = _count_hashes(monkeypatch)
    res = run(_request(world, push=True), RichReporter(Console(file=io.StringIO())), engine=world.engine)
    assert res.status == "pushed" and res.error is None
    wheels = [e.wheel.filename for e in res.locked.entries]
    assert sorted(w.split("-")[0] for w in wheels) == ["purepkg", "stableabi"]
    # one hash per wheel in the whole run: lock (the abi3 wheel's facts), fetch, copy, build, push
    assert counts.of(wheels) == {w: 1 for w in wheels}, counts
    # each stage's result is frozen and carries what the next one used
    for r in (res.locked, res.rendered, res.built, res.pushed):
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.status = "x"  # type: ignore[misc]
    assert res.rendered.lock is res.locked.lock  # render used the lock object, not a re-read
    assert dict(res.rendered.wheel_digests) == {e.wheel.filename: e.wheel.sha256 for e in res.locked.entries}
    assert res.rendered.base_refs == (BASE_REF,)
    assert ("org.build-image.lock-hash", res.locked.lock_hash) in res.rendered.labels
    labels = dict(res.rendered.labels)  # the labels the Dockerfile sets, the SBOM's digest among them
    sbom = (res.rendered.out_dir / "sbom.cdx.json").read_bytes()
    assert labels["org.build-image.sbom-sha256"] == hashlib.sha256(sbom).hexdigest()
    assert (
        f'org.build-image.sbom-sha256="{labels["org.build-image.sbom-sha256"]}"'
        in (res.rendered.out_dir / "Dockerfile").read_text()
    )
    assert world.engine.builds == [(res.rendered.out_dir, list(res.rendered.tags))]
    assert res.built.tags == res.rendered.tags and res.built.image_id == IMAGE_ID
    assert world.engine.pushes == list(res.rendered.tags)
    assert res.pushed.digest == MANIFEST and res.pushed.pinned == f"127.0.0.1:5000/serving/vllm@{MANIFEST}"
    # the base is asked of the engine twice in the run: held? (before the lock), and before the build; the
    # platform checks read those answers
    assert world.engine.inspected.count(BASE_REF) == 2, world.engine.inspected
    assert world.engine.attached == [(res.rendered.out_dir, res.pushed.pinned, list(res.rendered.tags))]
    assert res.summary["digest"] == MANIFEST and res.summary["lock_hash"] == res.locked.lock_hash

    # the same run again in this process: the lock is up to date, the verified wheels unchanged
    again = run(_request(world, push=True, force=True), RichReporter(Console(file=io.StringIO())), engine=world.engine)
    assert again.locked.status == "up-to-date" and again.rendered.tags == res.rendered.tags
    assert counts.of(wheels) == {w: 1 for w in wheels}, counts


def test_build_of_a_context_read_from_disk_hashes_each_wheel_once(world, monkeypatch):
    """`build-image build CTX` (a new process: nothing verified yet) verifies every wheel once."""
    from builder.pipeline import run

    res = run(_request(world), RichReporter(Console(file=io.StringIO())), engine=world.engine)
    assert res.status == "built"
    counts = _count_hashes(monkeypatch)
    r = CliRunner().invoke(
        main,
        ["build", str(res.rendered.out_dir), "--tag", "127.0.0.1:5000/serving/vllm", "--json"],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    wheels = [e.wheel.filename for e in res.locked.entries]
    assert counts.of(wheels) == {w: 1 for w in wheels}, counts
    # a wheel changed on disk after it was verified is hashed again and refused
    victim = res.rendered.out_dir / "wheels" / wheels[0]
    victim.write_bytes(victim.read_bytes() + b"x")
    r = CliRunner().invoke(main, ["build", str(res.rendered.out_dir)])
    assert r.exit_code == 7, r.output


def test_the_pipeline_stops_after_render_without_an_engine(world, monkeypatch):
    from builder.errors import EngineUnavailable
    from builder.pipeline import run

    class Down(MemoryEngine):
        def ping(self):
            raise EngineUnavailable("the Docker engine at unix:///nowhere is not reachable: no")

    res = run(_request(world), RichReporter(Console(file=io.StringIO())), engine=Down())
    assert res.status == "rendered" and res.built is None and res.error is None
    assert "stopped after render" in res.notice and "build-image build" in res.summary["build_command"]
    pushed = run(_request(world, push=True), RichReporter(Console(file=io.StringIO())), engine=Down())
    assert isinstance(pushed.error, EngineUnavailable) and pushed.notice is None


def test_a_held_base_is_verified_against_its_manifest_once_per_image(world):
    """The engine holds the manifest's image: the pipeline snapshots it before locking, says it is
    verified, and a repeat reuses the snapshot (same image ID) instead of reading the image again."""
    from builder.pipeline import run

    out = io.StringIO()
    res = run(_request(world), RichReporter(Console(file=out, width=300)), engine=world.engine)
    check = res.summary["base_check"]
    assert check["status"] == "verified" and check["differences"] == [] and not check["snapshot_reused"]
    assert f"base manifest verified against image {world.engine.images[BASE_REF].id}" in out.getvalue()
    assert "[1/4] base" in out.getvalue()
    assert (res.rendered.out_dir / "checks" / "base-manifest.json").read_bytes() == world.manifest.read_bytes()
    again = run(_request(world), RichReporter(Console(file=io.StringIO())), engine=world.engine)
    assert again.summary["base_check"]["snapshot_reused"] is True
    assert world.engine.snapshot_calls == [BASE_REF]
    world.engine.images[BASE_REF] = ImageInfo(id="sha256:" + "c" * 64, size=1)  # rebuilt under the same tag
    run(_request(world), RichReporter(Console(file=io.StringIO())), engine=world.engine)
    assert world.engine.snapshot_calls == [BASE_REF, BASE_REF]


def test_a_held_base_that_drifted_is_locked_against_its_snapshot(world):
    """The image holds numpy 2.1.0 where the manifest says 1.26.4: the differences are listed and the
    lock, the context's manifest copy, the SBOM and the provenance all name the snapshot."""
    import copy

    from builder.pipeline import run
    from builder.resolve.lockfile import load_lock

    snap = copy.deepcopy(world.engine.snapshots[BASE_REF])
    snap.distributions["numpy"].version = "2.1.0"
    snap.provenance_kind = "read-from-image"
    world.engine.snapshots[BASE_REF] = snap
    out = io.StringIO()
    res = run(_request(world), RichReporter(Console(file=out, width=300)), engine=world.engine)
    check = res.summary["base_check"]
    assert check["status"] == "drift"
    assert check["differences"] == ["numpy: the manifest has 1.26.4, the image has 2.1.0"]
    assert "numpy: the manifest has 1.26.4, the image has 2.1.0" in out.getvalue()
    assert "locking against the snapshot" in out.getvalue()
    ctx = res.rendered.out_dir
    shipped = (ctx / "checks" / "base-manifest.json").read_bytes()
    assert shipped == snap.to_json().encode() and check["manifest"] == str(ctx / "checks" / "base-manifest.json")
    lock = load_lock(world.tmp / "overlay.lock")
    assert lock.header["base-manifest-sha256"] == hashlib.sha256(shipped).hexdigest()
    assert json.loads(shipped)["distributions"]["numpy"]["version"] == "2.1.0"
    prov = json.loads((ctx / "provenance.intoto.json").read_text())
    deps = prov["predicate"]["buildDefinition"]["resolvedDependencies"]
    dep = next(d for d in deps if d.get("name") == "base-manifest")
    assert dep["digest"]["sha256"] == hashlib.sha256(shipped).hexdigest() and "snapshot" in dep["annotations"]["source"]
    sbom = json.loads((ctx / "sbom.cdx.json").read_text())
    props = {p["name"]: p["value"] for p in sbom["metadata"]["component"]["properties"]}
    assert "snapshot of the local image" in props["build-image:base-manifest"]
    dockerfile = (ctx / "Dockerfile").read_text()
    assert f"--sha256 {hashlib.sha256(shipped).hexdigest()}" in dockerfile


def test_a_base_the_engine_does_not_hold_is_not_snapshotted(world):
    from builder.pipeline import run

    del world.engine.images[BASE_REF]
    res = run(_request(world), RichReporter(Console(file=io.StringIO())), engine=world.engine)
    assert "base_check" not in res.summary and world.engine.snapshot_calls == []


def test_allow_base_drift_reaches_the_rendered_context(world):
    from builder.pipeline import run

    res = run(_request(world, allow_base_drift=True), RichReporter(Console(file=io.StringIO())), engine=world.engine)
    dockerfile = (res.rendered.out_dir / "Dockerfile").read_text()
    assert "--out /build-image/drift.json --allow-drift;" in dockerfile
    assert dict(res.rendered.labels)["org.build-image.allow-base-drift"] == "true"
    default = run(_request(world), RichReporter(Console(file=io.StringIO())), engine=world.engine)
    assert "--allow-drift" not in (default.rendered.out_dir / "Dockerfile").read_text()


@dataclasses.dataclass
class Recorder:
    """A reporter that keeps the events (the pipeline's progress is events, not text)."""

    events: list = dataclasses.field(default_factory=list)
    prefix: str = ""

    def stage_started(self, index, total, name, what):
        self.events.append(("started", index, total, name))

    def stage_finished(self, name, seconds):
        self.events.append(("finished", name, seconds))

    def step(self, text):
        self.events.append(("step", self.prefix + text))

    def download(self, name, index, total):
        self.events.append(("download", self.prefix + name, index, total))

    def message(self, text):
        self.events.append(("message", text))

    def warning(self, text, *, lead=""):
        self.events.append(("warning", lead + text))

    def scoped(self, prefix):
        return Recorder(self.events, self.prefix + prefix)


def test_progress_is_events_and_the_stage_seconds_come_from_the_stages_and_their_results(world):
    from builder.pipeline import run

    rec = Recorder()
    res = run(_request(world, push=True), rec, engine=world.engine)
    started = [e[1:] for e in rec.events if e[0] == "started"]
    assert started == [(1, 5, "base"), (2, 5, "lock"), (3, 5, "patch+render"), (4, 5, "build"), (5, 5, "push")]
    finished = {e[1]: e[2] for e in rec.events if e[0] == "finished"}
    times = res.summary["stages_s"]
    assert list(times) == ["base", "lock", "patch", "render", "build", "push"] and times == res.stages_s
    assert all(times[s] == finished[s] for s in ("base", "lock", "build", "push"))
    # the render stage's seconds split by what its result measured, not by its printed steps
    assert times["patch"] == round(res.rendered.timings["patch"], 2)
    assert abs(times["patch"] + times["render"] - finished["patch+render"]) < 0.011
    wheels = sorted(e.wheel.filename for e in res.locked.entries)
    assert [e[1:] for e in rec.events if e[0] == "download"] == [(f"  {w}", i, 2) for i, w in enumerate(wheels, 1)]
    steps = [e[1] for e in rec.events if e[0] == "step"]
    assert ["  patch series", "  wheelhouse (2 wheels)", "  write context"] == [s for s in steps if s.startswith("  ")]
    assert "build: [stage-1 2/4] RUN install" in steps and any(s.startswith("push: ") for s in steps)
    assert any(e[0] == "message" and e[1].startswith("base manifest verified against") for e in rec.events)


def test_the_release_is_resolved_before_any_stage_a_bad_series_writes_no_lock(world, tmp_path):
    """The series is located and loaded with the release, before the lock: a folder that is not a series
    is exit 2 with nothing locked, rendered or built."""
    from builder.errors import BadInput
    from builder.pipeline import run

    req = dataclasses.replace(_request(world), no_patches=False, series=tmp_path / "not-a-series")
    (tmp_path / "not-a-series").mkdir()
    rec = Recorder()
    with pytest.raises(BadInput, match="is not a patch series"):
        run(req, rec, engine=world.engine)
    assert rec.events == [] and not (world.tmp / "overlay.lock").exists() and world.engine.builds == []


def test_a_lock_that_is_up_to_date_is_read_and_parsed_once_per_run(world, monkeypatch):
    """Freshness, the twin's check, the base check and the render inputs share one parse of the lock."""
    import builder.resolve.lockfile as LF
    from builder.pipeline import run

    run(_request(world), Recorder(), engine=world.engine)  # writes the lock
    parsed = []
    real = LF.parse_lock

    def counting(text, path="<lock>", **kw):
        parsed.append(path)
        return real(text, path, **kw)

    monkeypatch.setattr(LF, "parse_lock", counting)  # the one reader of a lock file
    again = run(_request(world), Recorder(), engine=world.engine)
    assert again.locked.status == "up-to-date"
    assert parsed == [str(world.tmp / "overlay.lock")]


def test_the_series_is_located_and_loaded_once_and_its_text_reaches_the_sbom(world, monkeypatch):
    import difflib

    import builder.patching.series as P
    import builder.pipeline as PL

    old = "__version__ = '0.26.0'\n"
    diff = "".join(
        difflib.unified_diff(
            [old], ["__version__ = '0.26.0'  # patched\n"], "a/vllm/__init__.py", "b/vllm/__init__.py", n=3
        )
    )
    series = world.tmp / "series"
    series.mkdir()
    patch = (
        "Subject: mark the version\nWhy: test\nApplies-To: vllm==0.26.0\nUpstream-Status: Inappropriate [test]\n"
        "Risk: none\n\n" + diff
    )
    (series / "0001-mark.patch").write_text(patch)
    (series / "series").write_text("0001-mark.patch\n")
    (series / P.ORIG_SUMS).write_text(P.format_sums({"vllm/__init__.py": P.sha256_bytes(old.encode())}))
    loads = []
    real = P.load_series

    def counting(d, v=None):
        loads.append(str(d))
        return real(d, v)

    monkeypatch.setattr(P, "load_series", counting)
    monkeypatch.setattr(PL, "load_series", counting)
    (wheel,) = world.house.glob("vllm-0.26.0-*.whl")
    req = dataclasses.replace(_request(world), no_patches=False, series=series, wheel=wheel)
    res = run_pipeline(req)
    assert loads == [str(series)]
    assert res.rendered.plan.patches == ["0001-mark.patch"]
    assert res.rendered.plan.patch_texts == {"0001-mark.patch": patch}  # what the SBOM and provenance hash


def run_pipeline(req):
    from builder.pipeline import run

    return run(req, Recorder(), engine=MemoryEngine())
