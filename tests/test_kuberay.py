"""KubeRay manifests (builder/serving/kuberay.py) and the Serve application module.

The rendered YAML is validated against the KubeRay v1.7.0 CRDs' openAPIV3Schema
(openapi-schema-validator, OpenAPI 3.0 dialect, with Kubernetes' strict field
validation: unknown fields are errors) and the pod templates against the
Kubernetes core schemas (kubernetes-validate, strict).  The CRDs live in
../shared/kuberay-crds/ (or $BUILD_IMAGE_KUBERAY_CRDS); those tests skip without it.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from builder.errors import BadInput
from builder.resolve.lockfile import LockEntry, LockFile, WheelRef, parse_lock
from builder.resolve.manifest import BaseManifest, Distribution
from builder.serving import kuberay
from builder.spec import Serving, Spec, parse_spec
from builder.util import project_root

DIGEST_REF = "127.0.0.1:5000/serving/vllm@sha256:" + "ab" * 32
SERVE_MODULE_PATH = project_root() / "templates" / "serve" / "build_image_serve_app.py"
K8S_VERSION = "1.33.0"


def _crd_dir() -> Path | None:
    env = os.environ.get("BUILD_IMAGE_KUBERAY_CRDS")
    for cand in ([Path(env)] if env else []) + [project_root().parent / "shared" / "kuberay-crds"]:
        if (cand / "ray.io_rayclusters.yaml").exists() and (cand / "ray.io_rayservices.yaml").exists():
            return cand
    return None


def make_lock(ray: str | None = "2.60.0", extra: dict[str, str] | None = None) -> LockFile:
    header = {
        "build-image-lock": "1",
        "tool": "build-image 0.1.0 (uv 0.13.9)",
        "vllm": "0.26.0",
        "base-ref": "vllm/vllm-openai:v0.26.0",
        "base-digest": "-",
        "base-manifest-sha256": "0" * 64,
        "python": "3.12",
        "platform": "x86_64-manylinux_2_35",
        "inputs-sha256": "1" * 64,
    }
    entries = []
    for name, ver in ({"ray": ray} if ray else {}).items() | (extra or {}).items():
        h = (name.encode().hex() * 64)[:64]
        entries.append(
            LockEntry(name=name, version=ver, hashes=[h], wheel=WheelRef(url=f"https://example/{name}.whl", sha256=h))
        )
    # round-trip through the real format so the test uses what `lock` writes
    return parse_lock(LockFile(header=header, overlay=["ray[serve]"], allow_abi_change={}, entries=entries).format())


def make_spec(**serving) -> Spec:
    base = dict(model="/models/qwen", gpus=8, tp=8, max_model_len=4096, gpu_memory_utilization=0.96, max_num_seqs=16)
    base.update(serving)
    return Spec(serving=Serving(**base))


def render(**kw) -> dict[str, dict]:
    kw.setdefault("lock", make_lock())
    kw.setdefault("spec", make_spec())
    kw.setdefault("image", DIGEST_REF)
    return {name: yaml.safe_load(text) for name, text in kuberay.render_manifests(**kw).items()}


def cluster_spec(docs: dict, which: str) -> dict:
    return (
        docs["raycluster.yaml"]["spec"] if which == "cluster" else docs["rayservice.yaml"]["spec"]["rayClusterConfig"]
    )


def all_pod_templates(doc_cluster_spec: dict) -> list[dict]:
    return [doc_cluster_spec["headGroupSpec"]["template"]] + [
        g["template"] for g in doc_cluster_spec["workerGroupSpecs"]
    ]


def load_serve_module():
    spec = importlib.util.spec_from_file_location("build_image_serve_app_under_test", SERVE_MODULE_PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --- schema validation -------------------------------------------------------------------------


def _strict(schema):
    """Kubernetes' strict field validation: an object schema with declared properties rejects
    unknown fields unless it preserves them (what `kubectl apply --validate=strict` does)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def crd_validators():
    crds = _crd_dir()
    if crds is None:
        pytest.skip("KubeRay CRDs not found (../shared/kuberay-crds or $BUILD_IMAGE_KUBERAY_CRDS)")
    from openapi_schema_validator import OAS30Validator

    out = {}
    for kind, fname in (("RayCluster", "ray.io_rayclusters.yaml"), ("RayService", "ray.io_rayservices.yaml")):
        crd = yaml.load((crds / fname).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        schema = _strict(version["schema"]["openAPIV3Schema"])
        OAS30Validator.check_schema(schema)
        out[kind] = OAS30Validator(schema)
    return out


def _errors(validator, doc) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def _validate_pod_template(template: dict) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template},
        K8S_VERSION,
        strict=True,
    )


@pytest.mark.parametrize(
    "spec_kw",
    [
        {},
        {"tp": 16, "gpus": 8, "pp": 1},
        {"tp": 1, "gpus": None, "max_model_len": None, "max_num_seqs": None},
        {"gpu_node_affinity": True, "gpu_model": "NVIDIA H100 80GB HBM3"},
    ],
)
def test_manifests_validate_against_kuberay_crds_and_k8s_schemas(crd_validators, spec_kw):
    docs = render(spec=make_spec(**spec_kw))
    assert _errors(crd_validators["RayCluster"], docs["raycluster.yaml"]) == []
    assert _errors(crd_validators["RayService"], docs["rayservice.yaml"]) == []
    for which in ("cluster", "service"):
        for template in all_pod_templates(cluster_spec(docs, which)):
            _validate_pod_template(template)


def test_validators_reject_a_broken_manifest(crd_validators):
    """The validation is real: the same documents with one field broken fail it."""
    docs = render()
    bad = copy.deepcopy(docs["raycluster.yaml"])
    bad["spec"]["workerGroupSpecs"][0]["replicas"] = "one"
    assert _errors(crd_validators["RayCluster"], bad)
    typo = copy.deepcopy(docs["rayservice.yaml"])
    typo["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParam"] = {}
    assert _errors(crd_validators["RayService"], typo)
    import kubernetes_validate

    pod = copy.deepcopy(docs["raycluster.yaml"]["spec"]["headGroupSpec"]["template"])
    pod["spec"]["containers"][0]["imagePullPolicy"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate_pod_template(pod)


# --- content rules -----------------------------------------------------------------------------


def test_every_node_uses_the_image_by_digest():
    docs = render()
    for which in ("cluster", "service"):
        templates = all_pod_templates(cluster_spec(docs, which))
        assert len(templates) == 2
        for t in templates:
            assert [c["image"] for c in t["spec"]["containers"]] == [DIGEST_REF]


@pytest.mark.parametrize(
    "image",
    ["127.0.0.1:5000/serving/vllm:0.26.0", "vllm/vllm-openai:latest", "repo@sha256:abc", "repo:tag@sha256:" + "x" * 64],
)
def test_image_without_digest_is_refused_and_nothing_is_written(tmp_path, image):
    with pytest.raises(BadInput, match="digest"):
        kuberay.write_manifests(tmp_path, lock=make_lock(), spec=make_spec(), image=image)
    assert list(tmp_path.iterdir()) == []


def test_allow_tag_accepts_a_tag_but_not_garbage(tmp_path):
    docs = render(image="127.0.0.1:5000/serving/vllm:0.26.0", allow_tag=True)
    head = cluster_spec(docs, "cluster")["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["image"].endswith(":0.26.0")
    with pytest.raises(BadInput, match="'not an image' is not a valid image reference"):
        render(image="not an image", allow_tag=True)


def test_header_comment_does_not_claim_a_digest_for_a_tag():
    tagged = kuberay.render_manifests(lock=make_lock(), spec=make_spec(), image="127.0.0.1:5000/s/v:1", allow_tag=True)
    pinned = kuberay.render_manifests(lock=make_lock(), spec=make_spec(), image=DIGEST_REF)
    for name in ("raycluster.yaml", "rayservice.yaml"):
        head = [ln for ln in tagged[name].splitlines() if ln.startswith("#")]
        assert not any("pinned by digest" in ln for ln in head) and any("BY TAG" in ln for ln in head)
        assert any("pinned by digest" in ln for ln in pinned[name].splitlines() if ln.startswith("#"))


def test_digest_with_tag_is_accepted():
    ref = "127.0.0.1:5000/serving/vllm:0.26.0@sha256:" + "cd" * 32
    docs = render(image=ref)
    assert docs["raycluster.yaml"]["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"] == ref


@pytest.mark.parametrize("ray", ["2.60.0", "2.52.1"])
def test_ray_version_comes_from_the_lock(ray):
    docs = render(lock=make_lock(ray=ray))
    assert cluster_spec(docs, "cluster")["rayVersion"] == ray
    assert cluster_spec(docs, "service")["rayVersion"] == ray


def _base_with_ray(version: str | None) -> BaseManifest:
    dists = {"ray": Distribution(name="ray", version=version)} if version else {}
    return BaseManifest(
        image_ref="vllm/vllm-openai:v0.26.0",
        image_digest=None,
        os=None,
        glibc="2.35",
        python_version="3.12",
        python_abi="cp312",
        site_packages=None,
        cuda=None,
        platform="x86_64-manylinux_2_35",
        provenance_kind="reconstructed",
        provenance_method="test",
        distributions=dists,
    )


def test_ray_version_from_base_manifest_when_lock_has_no_ray(tmp_path):
    docs = render(lock=make_lock(ray=None, extra={"pyarrow": "21.0.0"}), base=_base_with_ray("2.49.2"))
    assert cluster_spec(docs, "service")["rayVersion"] == "2.49.2"
    # the lock wins over the base when both have ray
    docs = render(lock=make_lock(ray="2.60.0"), base=_base_with_ray("2.49.2"))
    assert cluster_spec(docs, "service")["rayVersion"] == "2.60.0"
    # write_manifests finds the base through the spec's `base` manifest path
    manifest = tmp_path / "base.json"
    _base_with_ray("2.48.0").save(manifest)
    spec = make_spec()
    spec.base = str(manifest)
    out = tmp_path / "out"
    kuberay.write_manifests(out, lock=make_lock(ray=None), spec=spec, image=DIGEST_REF)
    assert yaml.safe_load((out / "raycluster.yaml").read_text())["spec"]["rayVersion"] == "2.48.0"


def test_no_ray_anywhere_is_bad_input():
    with pytest.raises(BadInput, match="rayVersion"):
        render(lock=make_lock(ray=None), base=_base_with_ray(None))


@pytest.mark.parametrize(
    "serving, pods, gpus_per_pod",
    [
        ({"tp": 8, "gpus": 8}, 1, 8),
        ({"tp": 8, "pp": 2, "gpus": 8}, 2, 8),
        ({"tp": 4, "gpus": 8}, 1, 8),
        ({"tp": 2, "gpus": None}, 1, 2),
        ({"tp": 8, "pp": 3, "gpus": 4}, 6, 4),
    ],
)
def test_gpu_counts_come_from_the_spec(serving, pods, gpus_per_pod):
    docs = render(spec=make_spec(**serving))
    for which in ("cluster", "service"):
        cs = cluster_spec(docs, which)
        (group,) = cs["workerGroupSpecs"]
        assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == pods
        res = group["template"]["spec"]["containers"][0]["resources"]
        assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == gpus_per_pod
        assert group["rayStartParams"]["num-gpus"] == str(gpus_per_pod)
        head = cs["headGroupSpec"]
        assert head["rayStartParams"]["num-gpus"] == "0"
        assert "nvidia.com/gpu" not in head["template"]["spec"]["containers"][0]["resources"]["limits"]


@pytest.mark.parametrize(
    "serving, backend",
    [
        ({"tp": 8, "gpus": 8}, None),
        ({"tp": 8, "pp": 2, "gpus": 8}, "ray-serve-llm"),
        ({"tp": 16, "gpus": 8}, "ray-serve-llm"),
    ],
)
def test_a_model_spanning_pods_forces_ray_serve_llm(serving, backend):
    """The module's fallback backend holds every GPU in one replica (one node): across pods it would stay
    pending forever. A multi-pod layout asks for ray.serve.llm, so a ray without it fails at deploy."""
    docs = render(spec=make_spec(**serving))
    args = yaml.safe_load(docs["rayservice.yaml"]["spec"]["serveConfigV2"])["applications"][0]["args"]
    assert args.get("backend") == backend
    mod = load_serve_module()
    if backend:
        with pytest.raises(RuntimeError, match="ray-serve-llm' requested"):
            mod.backend(mod.parse_args(args), has_ray_serve_llm=False)


def test_serving_settings_come_from_the_spec_and_the_serve_module_accepts_them():
    spec = parse_spec(
        '[serving]\nmodel = "/models/inkling"\ngpus = 8\ntp = 8\nmax_model_len = 4096\n'
        'gpu_memory_utilization = 0.96\nmax_num_seqs = 24\nkv_cache_dtype = "fp8"\n',
        "spec.toml",
    )
    docs = render(spec=spec)
    serve = yaml.safe_load(docs["rayservice.yaml"]["spec"]["serveConfigV2"])
    (app,) = serve["applications"]
    assert app["import_path"] == "build_image_serve_app:build_app"
    assert app["args"]["model"] == "/models/inkling"
    assert app["args"]["tensor_parallel_size"] == 8
    assert app["args"]["max_model_len"] == 4096
    assert app["args"]["gpu_memory_utilization"] == 0.96
    assert app["args"]["max_num_seqs"] == 24
    assert app["args"]["kv_cache_dtype"] == "fp8"
    mod = load_serve_module()
    engine = mod.engine_kwargs(mod.parse_args(app["args"]))
    assert engine == {
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": 1,
        "gpu_memory_utilization": 0.96,
        "kv_cache_dtype": "fp8",
        "max_model_len": 4096,
        "max_num_seqs": 24,
    }


def _walk(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield f"{path}/{k}", k, v
            yield from _walk(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}/{i}")


INSTALLERS = ("pip", "conda", "uv ", "uv\n", "apt-get", "pip_packages", "py_modules", "working_dir")


def _no_installs(doc) -> list[str]:
    bad = []
    for path, key, value in _walk(doc):
        if str(key).lower().replace("_", "").replace("-", "") in ("runtimeenv", "pip", "conda", "uv"):
            bad.append(path)
        if isinstance(value, str):
            text = value
            if path.endswith("serveConfigV2"):
                bad += [f"{path}{p}" for p in _no_installs(yaml.safe_load(text))]
                continue
            if any(tok in text for tok in ("pip install", "conda install", "uv pip", "uv sync", "apt-get")):
                bad.append(path)
    return bad


def test_no_runtime_env_installs_anywhere():
    for spec_kw in ({}, {"tp": 16, "pp": 2, "gpus": 8}):
        docs = render(spec=make_spec(**spec_kw))
        for name, doc in docs.items():
            assert _no_installs(doc) == [], name
    mod = load_serve_module()
    cfg = mod.llm_config(mod.parse_args(render_args()))
    assert _no_installs(cfg) == []
    # the check itself is not vacuous
    assert _no_installs({"a": {"runtime_env": {"pip": ["numpy"]}}})
    assert _no_installs({"spec": {"serveConfigV2": "applications:\n- runtime_env: {pip: [vllm]}\n"}})


def render_args() -> dict:
    docs = render()
    return yaml.safe_load(docs["rayservice.yaml"]["spec"]["serveConfigV2"])["applications"][0]["args"]


def test_model_is_required_for_the_rayservice():
    with pytest.raises(BadInput, match="serving.model"):
        render(spec=make_spec(model=None))


@pytest.mark.parametrize("field, value", [("tp", 0), ("gpus", 0), ("gpu_memory_utilization", 1.5)])
def test_bad_serving_values_are_bad_input(field, value):
    with pytest.raises(BadInput, match=f"serving.{field}"):
        render(spec=make_spec(**{field: value}))


def test_bad_name_is_bad_input():
    with pytest.raises(BadInput, match="DNS-1123"):
        render(name="Not_A_Name")


def test_write_manifests_writes_both_files_atomically(tmp_path):
    paths = kuberay.write_manifests(tmp_path, lock=make_lock(), spec=make_spec(), image=DIGEST_REF)
    assert sorted(p.name for p in paths) == ["raycluster.yaml", "rayservice.yaml"]
    kinds = sorted(yaml.safe_load(p.read_text())["kind"] for p in paths)
    assert kinds == ["RayCluster", "RayService"]
    before = {p.name: p.read_text() for p in paths}
    with pytest.raises(BadInput, match="image 'repo:tag' is not pinned by digest"):
        kuberay.write_manifests(tmp_path, lock=make_lock(), spec=make_spec(), image="repo:tag")
    assert {p.name: p.read_text() for p in paths} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raycluster.yaml", "rayservice.yaml"]


def test_rendering_is_deterministic():
    a = kuberay.render_manifests(lock=make_lock(), spec=make_spec(), image=DIGEST_REF)
    b = kuberay.render_manifests(lock=make_lock(), spec=make_spec(), image=DIGEST_REF)
    assert a == b


# --- the Serve application module ----------------------------------------------------------------


def test_serve_module_imports_without_ray_vllm_or_gpu():
    code = (
        "import importlib.util, sys\n"
        f"s = importlib.util.spec_from_file_location('build_image_serve_app', {str(SERVE_MODULE_PATH)!r})\n"
        "m = importlib.util.module_from_spec(s); s.loader.exec_module(m)\n"
        "heavy = sorted(n for n in sys.modules if n.split('.')[0] in ('ray', 'vllm', 'torch', 'fastapi'))\n"
        "assert not heavy, heavy\n"
        "print(m.backend(m.parse_args({'model': '/m'}), has_ray_serve_llm=True))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ray-serve-llm"


def test_serve_module_args_validation_and_backends():
    mod = load_serve_module()
    with pytest.raises(ValueError, match="'model' is required"):
        mod.parse_args({})
    with pytest.raises(ValueError, match="unknown arg"):
        mod.parse_args({"model": "/m", "tensor_parallel": 8})
    with pytest.raises(ValueError, match="wrong type"):
        mod.parse_args({"model": "/m", "tensor_parallel_size": "8"})
    with pytest.raises(ValueError, match="wrong type"):
        mod.parse_args({"model": "/m", "max_num_seqs": True})
    cfg = mod.parse_args({"model": "/models/qwen/", "tensor_parallel_size": 2})
    assert cfg["model_id"] == "qwen"
    assert mod.backend(cfg, has_ray_serve_llm=True) == "ray-serve-llm"
    assert mod.backend(cfg, has_ray_serve_llm=False) == "vllm-server"
    with pytest.raises(RuntimeError, match="ray.serve.llm"):
        mod.backend(mod.parse_args({"model": "/m", "backend": "ray-serve-llm"}), has_ray_serve_llm=False)
    with pytest.raises(RuntimeError, match="one node"):
        mod.backend(mod.parse_args({"model": "/m", "pipeline_parallel_size": 2}), has_ray_serve_llm=False)
    argv = mod.vllm_cli_args(
        mod.parse_args({"model": "/m", "tensor_parallel_size": 4, "max_model_len": 4096, "enforce_eager": True}), 8123
    )
    assert argv[:2] == ["serve", "/m"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert argv[argv.index("--max-model-len") + 1] == "4096"
    assert argv[argv.index("--port") + 1] == "8123"
    assert "--enforce-eager" in argv
    sa = mod.serving_args(cfg)
    assert sa["llm_configs"][0]["model_loading_config"] == {"model_id": "qwen", "model_source": "/models/qwen/"}
    assert "runtime_env" not in sa["llm_configs"][0]


def test_serve_fallback_forwards_the_query_string():
    mod = load_serve_module()
    assert mod.upstream_url("http://127.0.0.1:9", "v1/models", "") == "http://127.0.0.1:9/v1/models"
    assert mod.upstream_url("http://127.0.0.1:9", "v1/models", "a=1&b=2") == "http://127.0.0.1:9/v1/models?a=1&b=2"


@pytest.mark.parametrize("lock_backend", ["ray-serve-llm", "vllm-server", "auto", None])
def test_the_serve_application_gets_the_locks_backend(lock_backend):
    """On one node the RayService states the lock's serve-backend (the image's default too) and
    annotates it; `auto` (or a lock without the line) leaves the arg out."""
    lock = make_lock()
    if lock_backend:
        lock.header["serve-backend"] = lock_backend
    docs = render(lock=lock, spec=make_spec(tp=8, gpus=8))
    args = yaml.safe_load(docs["rayservice.yaml"]["spec"]["serveConfigV2"])["applications"][0]["args"]
    want = None if lock_backend in (None, "auto") else lock_backend
    assert args.get("backend") == want
    for pod in all_pod_templates(cluster_spec(docs, "cluster")):
        assert pod["metadata"]["annotations"]["build-image/serve-backend"] == (lock_backend or "auto")
    mod = load_serve_module()
    if want:
        assert mod.parse_args(args)["backend"] == want


def test_a_multi_pod_model_on_a_vllm_server_lock_is_refused(tmp_path):
    """vLLM's server in one replica cannot span pods; the lock chose it (its ray's llm extra does not
    pin this vllm), so the manifests would never serve: refused, naming the layout and the lock's ray."""
    lock = make_lock()
    lock.header["serve-backend"] = "vllm-server"
    lock.header["ray"] = "2.60.0 (newest ray; its llm extra pins vllm==0.29.0, not 0.26.0)"
    with pytest.raises(BadInput, match=r"spans 2 worker pods .*serve-backend is vllm-server \(2.60.0 \(newest ray"):
        kuberay.write_manifests(tmp_path, lock=lock, spec=make_spec(tp=16, gpus=8), image=DIGEST_REF)
    assert list(tmp_path.iterdir()) == []
    lock.header["serve-backend"] = "ray-serve-llm"
    docs = render(lock=lock, spec=make_spec(tp=16, gpus=8))
    assert (
        yaml.safe_load(docs["rayservice.yaml"]["spec"]["serveConfigV2"])["applications"][0]["args"]["backend"]
        == "ray-serve-llm"
    )


def test_gpu_node_affinity_requires_the_driver_floor_and_the_gpu_product():
    from dataclasses import replace

    docs = render(spec=make_spec(gpu_node_affinity=True, gpu_model="NVIDIA H100 80GB HBM3"))
    for which in ("cluster", "service"):
        spec = cluster_spec(docs, which)
        assert "affinity" not in spec["headGroupSpec"]["template"]["spec"]
        [worker] = spec["workerGroupSpecs"]
        [term] = worker["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        # the 0.26.0 base runs CUDA 13.0: driver >= 580 (lockfiles/gate/cuda-drivers.toml)
        assert term["matchExpressions"] == [
            {"key": "nvidia.com/cuda.driver.major", "operator": "Gt", "values": ["579"]},
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]},
        ]
    plain = render(spec=make_spec(gpu_model="NVIDIA H200"))
    assert "affinity" not in cluster_spec(plain, "cluster")["workerGroupSpecs"][0]["template"]["spec"]
    on_image = replace(make_spec(gpu_node_affinity=True), base="vllm/vllm-openai:v0.26.0")
    with pytest.raises(BadInput, match="driver floor"):
        render(spec=on_image)
