"""ray-check: the comparison (fast, pure), the in-container probe (fast, on this Python),
and a real two-node Ray cluster on the stand-in base image (slow + docker).

The docker tests build the image through the project's own path (base snapshot ->
lock with ray[serve] from a wheelhouse -> render -> build, via the ``built_overlay_image``
fixture), start a head and one worker, and expect PASS; then run the last worker
from a second image with one package version changed and expect FAIL naming it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from builder.resolve.lockfile import LockEntry, LockFile, WheelRef, load_lock, parse_lock
from builder.serving import raycheck
from builder.serving.raycheck import Finding, NodeReport, compare
from tests.fx_cache import cache_lock
from tests.fx_docker import DOCKER  # noqa: E402 - the CLI the tool itself runs

RAY_REQ = "ray[serve]==2.60.0"


def report(node="head", **kw) -> NodeReport:
    base = dict(
        node=node,
        image="img:1",
        joined=True,
        python="3.12.3",
        packages={"ray": "2.60.0", "numpy": "1.26.4", "torch": "2.11.0", "vllm": "0.26.0", "transformers": None},
        patched={"vllm/a.py": "a" * 64},
        patched_recorded={"vllm/a.py": "a" * 64},
        image_id="sha256:" + "1" * 64,
    )
    base.update(kw)
    return NodeReport(**base)


def lock_with(**pins: str) -> LockFile:
    header = {
        "build-image-lock": "1",
        "tool": "t",
        "vllm": "0.26.0",
        "base-ref": "b",
        "base-digest": "-",
        "base-manifest-sha256": "0" * 64,
        "python": "3.12",
        "platform": "x86_64-manylinux_2_35",
        "inputs-sha256": "1" * 64,
    }
    entries = [
        LockEntry(name=n, version=v, hashes=["c" * 64], wheel=WheelRef(url=f"https://x/{n}.whl", sha256="c" * 64))
        for n, v in pins.items()
    ]
    return parse_lock(LockFile(header=header, overlay=[], allow_abi_change={}, entries=entries).format())


def subjects(findings: list[Finding]) -> list[str]:
    return [f.subject for f in findings]


# --- compare(): pure ----------------------------------------------------------------------------


def test_identical_nodes_pass():
    assert compare([report("head"), report("worker-1"), report("worker-2")], lock_with(ray="2.60.0")) == []


def test_package_difference_is_named_with_each_node_value():
    findings = compare([report("head"), report("worker-1", packages={**report().packages, "numpy": "2.2.6"})])
    assert subjects(findings) == ["package numpy"]
    assert findings[0].values == {"head": "1.26.4", "worker-1": "2.2.6"}
    assert "head=1.26.4" in findings[0].message and "worker-1=2.2.6" in findings[0].message


def test_absent_package_on_one_node_differs():
    pk = dict(report().packages)
    pk["torch"] = None
    findings = compare([report("head"), report("worker-1", packages=pk)])
    assert subjects(findings) == ["package torch"]
    assert "worker-1=absent" in findings[0].message


def test_python_patch_version_and_image_differences():
    findings = compare([report("head"), report("worker-1", python="3.12.4", image_id="sha256:" + "2" * 64)])
    assert subjects(findings) == ["image", "python"]


def test_equal_versions_in_different_spelling_are_equal():
    pk = {**report().packages, "ray": "2.60"}
    assert compare([report("head", packages={**report().packages, "ray": "2.60.0"}), report("w", packages=pk)]) == []


def test_lock_mismatch_and_missing_locked_package():
    r = report("head", packages={**report().packages, "ray": "2.59.0", "pyarrow": None})
    findings = compare([r], lock_with(ray="2.60.0", pyarrow="21.0.0"))
    assert sorted(subjects(findings)) == ["package pyarrow", "package ray"]
    by = {f.subject: f for f in findings}
    assert by["package ray"].values == {"head": "2.59.0", "lock": "2.60.0"}
    assert "absent" in by["package pyarrow"].message
    assert all(f.kind == "lock" for f in findings)


def test_lock_python_minor_version():
    findings = compare([report("head", python="3.11.2")], lock_with(ray="2.60.0"))
    assert subjects(findings) == ["python"] and findings[0].kind == "lock"


def test_patched_file_differs_across_nodes_and_from_recorded_sum():
    worker = report("worker-1", patched={"vllm/a.py": "b" * 64})
    findings = compare([report("head"), worker])
    kinds = sorted((f.kind, f.subject) for f in findings)
    assert kinds == [("differs", "patched vllm/a.py"), ("patch", "patched vllm/a.py")]
    missing = compare([report("head", patched={"vllm/a.py": None})])
    assert [f.kind for f in missing] == ["patch"] and "absent" in missing[0].message


def test_node_that_did_not_join_fails_even_if_versions_match():
    findings = compare([report("head"), report("worker-1", joined=False, error="Version mismatch: Ray 2.59.0")])
    assert [f.kind for f in findings] == ["not-joined"]
    assert "Version mismatch" in findings[0].message


def test_render_text_and_json():
    res = raycheck.CheckResult(
        image="img:1",
        nodes=[report("head"), report("worker-1", python="3.12.4")],
        findings=compare([report("head"), report("worker-1", python="3.12.4")]),
    )
    text = raycheck.render_text(res)
    assert text.startswith("ray-check FAIL") and "python differs" in text
    doc = json.loads(res.to_json())
    assert doc["verdict"] == "FAIL" and doc["findings"][0]["subject"] == "python"
    assert [n["node"] for n in doc["nodes"]] == ["head", "worker-1"]


def test_explain_log_picks_rays_version_mismatch():
    log = (
        "2026-11-30 INFO scripts.py:1 -- Local node IP: 127.0.0.1\n"
        "Traceback (most recent call last):\n"
        "RuntimeError: Version mismatch: The cluster was started with:\n"
        "    Ray: 2.60.0\n    Python: 3.12.3\n"
        "This process on node 127.0.0.1 was started with:\n    Ray: 2.60.0\n    Python: 3.12.4\n"
    )
    why = raycheck.explain_log(log)
    assert why.startswith("RuntimeError: Version mismatch") and "Python: 3.12.4" in why
    assert raycheck.explain_log("") == "no output"


def test_allocated_ports_are_distinct_and_free():
    ports = raycheck.allocate_ports(3)
    singles = []
    for p in ports:
        singles += [p.node_manager, p.object_manager, p.agent_listen, p.agent_grpc, p.runtime_env_agent, p.metrics]
        singles += list(range(p.min_worker, p.max_worker + 1))
    singles += [ports[0].gcs, ports[0].client_server, ports[0].dashboard]
    assert len(singles) == len(set(singles))
    assert ports[1].gcs is None and "--port=" not in " ".join(ports[1].args())
    assert f"--port={ports[0].gcs}" in ports[0].args()
    for port in singles[:12]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


# --- the probe script, run for real on this interpreter ------------------------------------------------


def test_probe_script_reports_versions_and_patched_sums(tmp_path):
    good = tmp_path / "good.py"
    good.write_text("patched\n")
    changed = tmp_path / "changed.py"
    changed.write_text("changed after the build\n")
    import hashlib

    sums = tmp_path / "patched.sha256"
    good_sum = hashlib.sha256(b"patched\n").hexdigest()
    recorded_sum = hashlib.sha256(b"original\n").hexdigest()
    sums.write_text(f"{good_sum}  {good}\n{recorded_sum}  {changed}\n{'0' * 64}  {tmp_path / 'gone.py'}\n")
    arg = json.dumps({"mode": "local", "packages": ["pytest", "no-such-package-xyz"], "sums": str(sums)})
    env = dict(os.environ, BUILD_IMAGE_NODE="n1", BUILD_IMAGE_IMAGE_ID="sha256:" + "9" * 64)
    out = subprocess.run(
        [sys.executable, "-", arg], input=raycheck.PROBE_SCRIPT, capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    doc = raycheck._parse_marker(out.stdout)
    assert doc["node"] == "n1" and doc["image_id"] == "sha256:" + "9" * 64
    assert doc["python"] == ".".join(map(str, sys.version_info[:3]))
    assert doc["packages"]["pytest"] == pytest.__version__
    assert doc["packages"]["no-such-package-xyz"] is None
    assert doc["packages"]["click"]  # every installed distribution is reported
    rep = NodeReport.from_dict(doc, node="n1", image="x", joined=True)
    findings = compare([rep])
    assert sorted((f.kind, f.subject) for f in findings) == [
        ("patch", f"patched {changed}"),
        ("patch", f"patched {tmp_path / 'gone.py'}"),
    ]


# --- a real cluster (slow, docker) ----------------------------------------------------------------


def _labelled_containers() -> set[str]:
    out = subprocess.run(
        [DOCKER, "ps", "-aq", "--filter", f"label={raycheck.CONTAINER_LABEL}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return set(out.stdout.split())


def ray_wheelhouse() -> Path:
    """ray[serve] and its dependencies for the stand-in (CPython 3.11, manylinux x86_64), downloaded
    once from PyPI with pip (hash-checked by the lock and again by render), numpy held at the base's."""
    from builder.util import cache_dir
    from tests.fx_docker import _PIP_TARGET

    root = cache_dir() / "raycheck" / ("wheelhouse-" + RAY_REQ.replace("[", "-").replace("]", "").replace("==", "-"))
    if (root / ".complete").exists():
        return root
    with cache_lock(root.name):
        if (root / ".complete").exists():  # made by another process while this one waited
            return root
        return _download_ray_wheelhouse(root, _PIP_TARGET)


def _download_ray_wheelhouse(root: Path, pip_target: list[str]) -> Path:
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "constraints.txt").write_text("numpy==1.24.2\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--disable-pip-version-check",
            "-d",
            str(tmp),
            *pip_target,
            "-c",
            str(tmp / "constraints.txt"),
            RAY_REQ,
            "packaging>=24.2",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (tmp / "constraints.txt").unlink()
    (tmp / ".complete").write_text("ok\n")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return root


@pytest.fixture(scope="session")
def ray_image(standin_base_image, standin_manifest, tmp_path_factory):
    """The stand-in base + ray[serve] from the lock's wheelhouse, through the project's own
    path: `build-image` (lock -> ABI gate -> render -> build), offline against the wheelhouse."""
    from tests.fx_docker import BuiltImage, run_pipeline, standin_findlinks

    work = tmp_path_factory.mktemp("ray-image")
    # ray needs packaging>=24.2: naming it releases the stand-in's Debian packaging 23.0 pin
    args = [
        "--vllm",
        "0.26.0",
        "--base",
        str(standin_manifest),
        "--lock",
        str(work / "requirements.lock"),
        "--no-default-overlay",
        "--with",
        RAY_REQ,
        "--with",
        "packaging>=24.2",
        "--no-index",
        "--find-links",
        str(standin_findlinks(())),
        "--find-links",
        str(ray_wheelhouse()),
        "-o",
        str(work / "ctx"),
        "--tag",
        "build-image-test/raycheck",
        "--json",
    ]
    args += ["--series", str(standin_base_image.series_dir), "--wheel", str(standin_base_image.vllm_wheel)]
    r = run_pipeline(args)
    assert r.returncode == 0, f"pipeline failed ({r.returncode}):\n{r.stderr[-4000:]}"
    summary = json.loads(r.stdout)
    return BuiltImage(
        tags=summary["tags"],
        image_id=summary["image_id"],
        context=work / "ctx",
        lock=work / "requirements.lock",
        summary=summary,
    )


def _derived_image(base: str, tag: str, requirements: list[str], ctx: Path) -> str:
    """``base`` plus ``requirements`` (wheels only, no dependencies) installed offline, past the image's
    pin guard on purpose (``env -u PIP_CONSTRAINT``: the derived image is meant to differ)."""
    from tests.fx_docker import _PIP_TARGET

    (ctx / "wh").mkdir()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            *_PIP_TARGET,
            "-d",
            str(ctx / "wh"),
            *requirements,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    (ctx / "Dockerfile").write_text(
        f"FROM {base}\n"
        "RUN --mount=type=bind,source=wh,target=/wh env -u PIP_CONSTRAINT \\\n"
        "    python3 -m pip install --break-system-packages "
        "--no-index --no-deps --disable-pip-version-check /wh/*.whl\n"
    )
    r = subprocess.run(
        [DOCKER, "build", "--network=none", "-q", "-t", tag, str(ctx)],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, DOCKER_BUILDKIT="1"),
    )
    assert r.returncode == 0, r.stderr
    return tag


@pytest.fixture(scope="session")
def changed_ray_image(ray_image, tmp_path_factory):
    """ray_image with one package (filelock) at another version, installed offline."""
    locked = load_lock(ray_image.lock).by_name()["filelock"].version
    other = "3.16.1" if locked != "3.16.1" else "3.15.4"
    tag = _derived_image(
        ray_image.tags[0],
        "build-image-test/raycheck-changed:1",
        [f"filelock=={other}"],
        tmp_path_factory.mktemp("changed-image"),
    )
    return tag, locked, other


@pytest.mark.slow
@pytest.mark.docker
def test_head_and_worker_from_one_image_pass(ray_image):
    before = _labelled_containers()
    lock = load_lock(ray_image.lock)
    result = raycheck.run_check(ray_image.tags[0], workers=1, lock=lock, timeout=150)
    assert result.ok, raycheck.render_text(result)
    assert [n.node for n in result.nodes] == ["head", "worker-1"]
    for n in result.nodes:
        assert n.joined and n.error is None
        assert n.packages["ray"] == lock.by_name()["ray"].version
        assert n.packages["vllm"] == "0.26.0"
        assert n.packages["torch"] is None  # absent in the stand-in: reported as null, not skipped
        assert n.image_id == ray_image.image_id
        assert n.patched == n.patched_recorded
        assert n.patched and all(n.patched.values())  # the image was built with the stand-in's patch series
    assert result.nodes[0].packages == result.nodes[1].packages
    assert _labelled_containers() == before  # the containers are gone


@pytest.mark.slow
@pytest.mark.docker
def test_worker_on_a_different_image_fails_naming_the_package(ray_image, changed_ray_image):
    tag, locked, other = changed_ray_image
    before = _labelled_containers()
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "build-image"),
            "ray-check",
            ray_image.tags[0],
            "--worker-image",
            tag,
            "--lock",
            str(ray_image.lock),
            "--json",
            "--timeout",
            "150",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert doc["verdict"] == "FAIL"
    by = {(f["kind"], f["subject"]): f for f in doc["findings"]}
    assert by[("differs", "package filelock")]["values"] == {"head": locked, "worker-1": other}
    assert by[("lock", "package filelock")]["values"] == {"worker-1": other, "lock": locked}
    assert ("differs", "image") in by
    assert {n["node"]: n["joined"] for n in doc["nodes"]} == {"head": True, "worker-1": True}, (
        json.dumps([{k: n.get(k) for k in ("node", "joined", "error", "image")} for n in doc["nodes"]], indent=1)
        + "\n"
        + out.stderr[-3000:]
    )
    assert "package filelock" in out.stderr
    assert _labelled_containers() == before


@pytest.mark.slow
@pytest.mark.docker
def test_pipeline_push_kuberay_pins_the_pushed_digest(ray_image, standin_base_image, standin_manifest, local_registry):
    """`build-image ... --push --kuberay` (the ray_image inputs, so every layer is cached): both
    manifests run the image by the digest the registry serves."""
    from tests.fx_docker import run_pipeline, standin_findlinks

    args = [
        "--vllm",
        "0.26.0",
        "--base",
        str(standin_manifest),
        "--lock",
        str(ray_image.lock),
        "--no-default-overlay",
        "--with",
        RAY_REQ,
        "--with",
        "packaging>=24.2",
        "--no-index",
        "--find-links",
        str(standin_findlinks(())),
        "--find-links",
        str(ray_wheelhouse()),
        "-o",
        str(ray_image.context.parent / "ctx-push"),
        "--tag",
        f"{local_registry}/raycheck/vllm",
        "--push",
        "--force",
        "--kuberay",
        "--model",
        "/models/m",
        "--json",
    ]
    args += ["--series", str(standin_base_image.series_dir), "--wheel", str(standin_base_image.vllm_wheel)]
    r = run_pipeline(args)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["status"] == "pushed" and "@sha256:" in doc["pinned"]
    assert sorted(Path(p).name for p in doc["kuberay"]) == ["raycluster.yaml", "rayservice.yaml"]
    for path in doc["kuberay"]:
        text = Path(path).read_text()
        assert f'image: "{doc["pinned"]}"' in text and "pinned by digest" in text


@pytest.mark.slow
@pytest.mark.docker
def test_serve_app_in_the_image_imports_and_accepts_the_rayservice_config(ray_image, tmp_path):
    """The module the image carries imports without GPU/vllm engine, builds a Serve application from
    the rendered serveConfigV2 args, and the serveConfigV2 passes Ray Serve's own config schema."""
    from builder.serving import kuberay
    from builder.spec import Serving, Spec

    lock = load_lock(ray_image.lock)
    spec = Spec(serving=Serving(model="/models/qwen", gpus=1, tp=1, max_model_len=2048, max_num_seqs=4))
    texts = kuberay.render_manifests(lock=lock, spec=spec, image=ray_image.tags[0], allow_tag=True)
    serve_config = yaml.safe_load(texts["rayservice.yaml"])["spec"]["serveConfigV2"]
    code = (
        "import json, sys, yaml\n"
        "from ray.serve.schema import ServeDeploySchema\n"
        "cfg = yaml.safe_load(sys.stdin.read())\n"
        "ServeDeploySchema.parse_obj(cfg)\n"
        "import build_image_serve_app as m\n"
        "app = m.build_app(cfg['applications'][0]['args'])\n"
        "print(json.dumps({'app': type(app).__name__, 'file': m.__file__}))\n"
    )
    out = subprocess.run(
        [
            DOCKER,
            "run",
            "--rm",
            "-i",
            "--pull=never",
            "--network=none",
            "--entrypoint",
            "python3",
            ray_image.tags[0],
            "-c",
            code,
        ],
        input=serve_config,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["app"] == "Application"
    assert doc["file"].endswith("site-packages/build_image_serve_app.py") or "dist-packages" in doc["file"]


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_containers_are_removed_when_interrupted(ray_image, sig):
    before = _labelled_containers()
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "build-image"),
            "ray-check",
            ray_image.tags[0],
            "--workers",
            "1",
            "--timeout",
            "150",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while len(_labelled_containers() - before) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert len(_labelled_containers() - before) == 2, "the head and the worker never started"
        proc.send_signal(sig)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert _labelled_containers() == before


def test_bad_flags_are_bad_input_before_anything_starts():
    from builder.errors import BadInput

    with pytest.raises(BadInput, match="--workers"):
        raycheck.run_check("img:1", workers=0, engine=object())
    with pytest.raises(BadInput, match="--timeout"):
        raycheck.run_check("img:1", timeout=0, engine=object())


@pytest.mark.slow
@pytest.mark.docker
def test_an_image_not_in_the_engine_is_bad_input_and_never_pulled(docker_engine):
    before = _labelled_containers()
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "build-image"),
            "ray-check",
            "127.0.0.1:5000/build-image-test/no-such-image:never",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "never pulls" in out.stderr
    assert _labelled_containers() == before


@pytest.mark.slow
@pytest.mark.docker
def test_serve_app_llm_config_is_accepted_by_ray_serve_llm(ray_image, tmp_path):
    """The LLMConfig the module hands to ray.serve.llm.build_openai_app validates against the locked
    ray's own pydantic model (ray's llm config needs pyarrow, added here; numpy stays 1.x)."""
    tag = _derived_image(ray_image.tags[0], "build-image-test/raycheck-pyarrow:1", ["pyarrow==17.0.0"], tmp_path)
    args = {
        "model": "/models/qwen",
        "tensor_parallel_size": 2,
        "max_model_len": 4096,
        "max_num_seqs": 8,
        "gpu_memory_utilization": 0.9,
        "kv_cache_dtype": "fp8",
    }
    code = (
        "import json, sys\n"
        "import build_image_serve_app as m\n"
        "from ray.llm._internal.serve.core.configs.llm_config import LLMConfig\n"
        "c = LLMConfig(**m.llm_config(m.parse_args(json.loads(sys.argv[1]))))\n"
        "print(json.dumps({'id': c.model_loading_config.model_id, 'source': c.model_loading_config.model_source,\n"
        "                  'engine': c.engine_kwargs, 'deployment': c.deployment_config, 'runtime_env': "
        "c.runtime_env}))\n"
    )
    out = subprocess.run(
        [
            DOCKER,
            "run",
            "--rm",
            "--pull=never",
            "--network=none",
            "--entrypoint",
            "python3",
            tag,
            "-c",
            code,
            json.dumps(args),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["id"] == "qwen" and doc["source"] == "/models/qwen"
    assert doc["engine"] == {
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 1,
        "gpu_memory_utilization": 0.9,
        "kv_cache_dtype": "fp8",
        "max_model_len": 4096,
        "max_num_seqs": 8,
    }
    assert doc["deployment"] == {"num_replicas": 1}
    assert not doc["runtime_env"]


def test_default_lock_is_the_one_whose_hash_the_image_carries(tmp_path, monkeypatch):
    """Without --lock, ray-check compares with lockfiles/vllm-<v>/requirements.lock, but only when its
    hash equals the image's lock-hash label (so a stale lock never produces false findings)."""
    import shutil

    from builder.commands.raycheck import image_lock
    from builder.engine import ImageInfo
    from builder.resolve.lockfile import load_lock
    from builder.util import project_root

    src = project_root() / "lockfiles" / "vllm-0.26.0" / "requirements.lock"
    (tmp_path / "lockfiles" / "vllm-0.26.0").mkdir(parents=True)
    shutil.copy(src, tmp_path / "lockfiles" / "vllm-0.26.0" / "requirements.lock")
    monkeypatch.chdir(tmp_path)
    h = load_lock(src).lock_hash

    class Eng:
        def __init__(self, labels):
            self.labels = labels

        def inspect(self, ref):
            return ImageInfo(id="sha256:" + "0" * 64, size=0, labels=self.labels)

    assert (
        image_lock("img", Eng({"org.build-image.vllm": "0.26.0", "org.build-image.lock-hash": h}))
        == "lockfiles/vllm-0.26.0/requirements.lock"
    )
    assert image_lock("img", Eng({"org.build-image.vllm": "0.26.0", "org.build-image.lock-hash": "f" * 64})) is None
    assert image_lock("img", Eng({})) is None
    assert image_lock("img", Eng({"org.build-image.vllm": "9.9.9", "org.build-image.lock-hash": h})) is None


def test_nodes_share_one_loopback_only_namespace(monkeypatch):
    """Ray binds 0.0.0.0 whatever --node-ip-address says: with --network=host its GCS, raylets and agents
    listened on every host interface. The head gets --network=none, the workers join its namespace."""
    from builder.serving import raycheck as RC

    started = []

    class Stop(Exception):
        pass

    def fake_start(self, node, argv, run_id, *, network="none"):
        started.append((node.name, network))
        if len(started) == 3:
            raise Stop
        return f"cid-{node.name}"

    class Eng:
        def ping(self):
            return "fake"

        def cli(self, args, **kw):  # the GCS probe: the head is gone, join now
            import subprocess

            return subprocess.CompletedProcess(args, 1, "", "")

    monkeypatch.setattr(RC.Containers, "start", fake_start)
    monkeypatch.setattr(RC.Containers, "remove_all", lambda self, run_id=None: None)
    monkeypatch.setattr(
        RC,
        "node_specs",
        lambda image, workers, worker_image, containers: [
            RC.NodeSpec(name=n, image="img", image_id="sha256:" + "0" * 64, image_digest=None, sums="")
            for n in ("head", "worker-1", "worker-2")
        ],
    )
    with pytest.raises(Stop):
        RC.run_check("img", workers=2, engine=Eng())
    assert started == [("head", "none"), ("worker-1", "container:cid-head"), ("worker-2", "container:cid-head")]
