"""KubeRay manifests: a RayService (Ray Serve) and a RayCluster for one image.

Pure rendering from (lock, spec, image ref) to YAML text, plus one function that
writes the files atomically.  The rules the manifests follow:

* the head and every worker group run the *same* image, referenced **by digest**
  (``repo@sha256:...``); a tag-only reference is refused unless ``allow_tag``;
* ``rayVersion`` is the ray version of the lock (or of the base manifest when
  ray comes from the base image, not the overlay);
* GPU counts and serving settings come from ``Spec.serving``;
* every pod selects nodes of the image's platform (``nodeSelector: kubernetes.io/arch``): the
  lock's; of a multi-platform image, the one ``[serving] platform`` names (default linux/amd64),
  which must be one of the image's;
* nothing is installed at start-up: no ``runtime_env`` anywhere, no pip/conda/uv
  in any command.  The Serve application is ``build_image_serve_app`` which the
  image itself carries (``templates/serve/build_image_serve_app.py``).

``build-image render --kuberay [--allow-tag]`` calls :func:`write_manifests`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml

from builder import __version__, values
from builder.credentials import redact_text
from builder.data import path as data_path
from builder.errors import BadInput
from builder.image.naming import SERVE_MODULE, TRITON_CACHE_DIR, VLLM_CACHE_ROOT, lock_platform, serve_backend_of
from builder.platforms import DEFAULT, Platform, joined
from builder.platforms import parse as parse_platform
from builder.resolve.baseref import classify, resolve_base
from builder.resolve.lockfile import LockFile
from builder.resolve.manifest import BaseManifest
from builder.serving import gpus
from builder.serving.plan import check_kv_cache_dtype, check_load_format, release_facts
from builder.spec import Spec
from builder.util import atomic_write_text

TEMPLATE_DIR = data_path("templates/kuberay")
RAYSERVICE_FILE = "rayservice.yaml"
RAYCLUSTER_FILE = "raycluster.yaml"
SERVE_IMPORT_PATH = f"{SERVE_MODULE}:build_app"
DEFAULT_NAME = "vllm-serve"

# Resource requests of the pods.  The spec has no fields for these; they are
# documented (docs/ray.md) and can be overridden through render_manifests().
HEAD_CPU = "4"
HEAD_MEMORY = "16Gi"
WORKER_CPU_PER_GPU = 4
WORKER_MIN_CPU = 8
WORKER_MEMORY_PER_GPU_GI = 32

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")


@dataclass(frozen=True)
class NodeGroup:
    name: str
    replicas: int
    gpus: int
    cpu: str
    memory: str
    ray_start_params: dict[str, str] = field(default_factory=dict)
    min_replicas: int | None = None  # the autoscaler's bounds (None: fixed at ``replicas``)
    max_replicas: int | None = None


@dataclass(frozen=True)
class Layout:
    """How the model's GPUs are spread over pods (pure arithmetic on the spec)."""

    gpus_needed: int  # tensor parallel x pipeline parallel
    gpus_per_pod: int
    worker_pods: int


def check_image_ref(image: str, *, allow_tag: bool = False) -> str:
    """Return ``image`` if it is pinned by digest (or ``allow_tag``), else raise BadInput."""
    image = (image or "").strip()
    invalid = BadInput(f"kuberay: image reference {image!r} is not a valid image reference.")
    try:
        values.parse_ref(image.partition("@")[0])
    except BadInput:
        raise invalid from None
    try:
        ref = values.parse_ref(image)
    except BadInput:  # a digest that is not sha256:<64 hex> pins nothing
        ref = None
    if ref is not None and (ref.digest or allow_tag):
        return image
    if ref is None and allow_tag:
        raise invalid
    raise BadInput(
        f"kuberay: image {image!r} is not pinned by digest; the head and every worker must run the exact "
        "same image, which only a digest guarantees (a tag can move between the head's and a worker's pull).",
        hint="push the image first and pass REPO@sha256:<digest>, or give --allow-tag to accept a tag.",
    )


def ray_version(lock: LockFile, base: BaseManifest | None = None) -> str:
    """The ray version the image carries: the lock's ray entry, else the base manifest's."""
    entry = lock.by_name().get("ray")
    if entry is not None:
        return entry.version
    if base is not None and base.get("ray") is not None:
        return base.get("ray").version
    raise BadInput(
        "kuberay: neither the lock nor the base manifest has a 'ray' distribution, so the manifests "
        "cannot state a rayVersion (and the image could not run Ray).",
        hint="keep 'ray[serve]' in the overlay (it is in the default) and regenerate the lock.",
    )


def layout(spec: Spec) -> Layout:
    s = spec.serving
    for field_name in ("tp", "pp"):
        val = getattr(s, field_name)
        if not isinstance(val, int) or val < 1:
            raise BadInput(
                f"spec {spec.source or '<flags>'}: 'serving.{field_name}' must be a positive integer, got {val!r}."
            )
    needed = s.tp * s.pp
    if s.gpus is not None and s.gpus < 1:
        raise BadInput(f"spec {spec.source or '<flags>'}: 'serving.gpus' must be a positive integer, got {s.gpus!r}.")
    per_pod = s.gpus if s.gpus is not None else needed
    return Layout(gpus_needed=needed, gpus_per_pod=per_pod, worker_pods=max(1, math.ceil(needed / per_pod)))


def model_id(model: str) -> str:
    """The name clients use in OpenAI requests: the last path component of the model."""
    return model.rstrip("/").rsplit("/", 1)[-1] or model


def serve_args(spec: Spec, lock: LockFile | None = None) -> dict[str, Any]:
    """Arguments of ``build_image_serve_app.build_app`` (the ``args`` of the Serve application).

    ``backend`` is the lock's ``serve-backend`` (the image's default too, stated here so a reviewer
    of the manifest sees it); a model spanning worker pods needs ``ray-serve-llm``, and a lock that
    chose ``vllm-server`` for it is refused."""
    s = spec.serving
    if not s.model:
        raise BadInput(
            f"spec {spec.source or '<flags>'}: 'serving.model' is required to render the RayService "
            "(the model path or Hugging Face id the Serve application loads).",
        )
    if not 0.0 < float(s.gpu_memory_utilization) <= 1.0:
        raise BadInput(
            f"spec {spec.source or '<flags>'}: 'serving.gpu_memory_utilization' must be in (0, 1], "
            f"got {s.gpu_memory_utilization!r}."
        )
    # the one validator per setting that plan and smoke use: a value they refuse is refused here too
    check_kv_cache_dtype(
        values.control_free(s.kv_cache_dtype or "auto", "serving.kv_cache_dtype"), release_facts(spec.vllm)
    )
    values.control_free(s.model, f"spec {spec.source or '<flags>'}: serving.model")
    args: dict[str, Any] = {
        "model": s.model,
        "model_id": model_id(s.model),
        "tensor_parallel_size": s.tp,
        "pipeline_parallel_size": s.pp,
        "gpu_memory_utilization": float(s.gpu_memory_utilization),
        "kv_cache_dtype": s.kv_cache_dtype,
        "num_replicas": int(getattr(s, "replicas", 1) or 1),
    }
    if s.max_model_len is not None:
        args["max_model_len"] = s.max_model_len
    if s.max_num_seqs is not None:
        args["max_num_seqs"] = s.max_num_seqs
    if s.cpu_offload_gb:
        args["cpu_offload_gb"] = float(s.cpu_offload_gb)
    load_format = cold_start_settings(spec)["load_format"]
    if load_format != "auto":
        args["load_format"] = load_format
    if getattr(s, "distributed_executor_backend", None):
        args["distributed_executor_backend"] = s.distributed_executor_backend
    chosen = "auto"
    if lock is not None:
        chosen = serve_backend_of(lock)
    lay = layout(spec)
    if lay.worker_pods > 1:
        # The model spans worker pods: only ray.serve.llm places it across nodes. The module's fallback
        # (vLLM's server in one replica holding every GPU) would stay pending forever; forcing the
        # backend makes a ray without ray.serve.llm fail at deploy time with a message instead.
        if chosen == "vllm-server":
            raise BadInput(
                f"kuberay: the model spans {lay.worker_pods} worker pods (tp x pp = {lay.gpus_needed} GPUs, "
                f"{lay.gpus_per_pod} per pod), which only ray.serve.llm can place, but the lock's serve-backend is "
                f"vllm-server ({lock.header.get('ray', 'its ray')}): vLLM's server in one replica serves "
                "one node only.",
                hint="fit the model on one node (serving.gpus >= tp x pp), or lock a ray whose llm extra "
                "pins this vllm.",
            )
        chosen = "ray-serve-llm"
    if chosen != "auto":
        args["backend"] = chosen
    return args


#: Where the worker pods keep vLLM's compile cache (VLLM_CACHE_ROOT) and Triton's kernels (TRITON_CACHE_DIR
#: below it): on the H200 a kept cache cut engine init from 56.9 s to 16.4 s (docs/cold-start.md).
COMPILE_CACHE_HOST_PATH = "/var/cache/build-image/vllm"
MODEL_CACHE_HOST_PATH = "/var/lib/build-image/models"
MODEL_CACHE_MOUNT = "/models"
_OBJECT_SCHEMES = ("s3://", "gs://", "az://")


def cold_start_settings(spec: Spec) -> dict[str, Any]:
    """The cold-start settings of ``[serving]``, checked: the load format against the release's LoadFormats,
    the compile cache (node | none | pvc:CLAIM) and the model cache (none | node | object: the model is an
    object-storage URI and the load format runai_streamer)."""
    s, where = spec.serving, f"spec {spec.source or '<flags>'}"
    fmt = check_load_format(
        getattr(s, "load_format", "auto") or "auto", release_facts(spec.vllm), where=f"{where}: serving.load_format"
    )
    cc = values.compile_cache(getattr(s, "compile_cache", "node"), f"{where}: serving.compile_cache")
    mc = values.model_cache(getattr(s, "model_cache", "none"), f"{where}: serving.model_cache")
    model = s.model or ""
    if mc == "object":
        if not model.startswith(_OBJECT_SCHEMES):
            raise BadInput(
                f"{where}: serving.model_cache = \"object\" streams the model from object storage; "
                f"serving.model must be an {', '.join(_OBJECT_SCHEMES)} URI, got {model!r}."
            )
        if fmt not in ("runai_streamer", "runai_streamer_sharded"):
            raise BadInput(
                f"{where}: serving.model_cache = \"object\" needs serving.load_format = "
                f"\"runai_streamer\" (vLLM's loader for object storage), got {fmt!r}."
            )
    if mc == "node" and not (model == MODEL_CACHE_MOUNT or model.startswith(MODEL_CACHE_MOUNT + "/")):
        raise BadInput(
            f"{where}: serving.model_cache = \"node\" mounts the node's model cache at "
            f"{MODEL_CACHE_MOUNT}; serving.model must be a path under it, got {model!r}."
        )
    return {"load_format": fmt, "compile_cache": cc, "model_cache": mc}


def worker_storage(spec: Spec) -> dict[str, Any]:
    """The worker container's env, volume mounts and pod volumes for the cold-start settings."""
    cs = cold_start_settings(spec)
    env: list[dict[str, str]] = []
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if cs["compile_cache"] != "none":
        env += [
            {"name": "VLLM_CACHE_ROOT", "value": VLLM_CACHE_ROOT},
            {"name": "TRITON_CACHE_DIR", "value": TRITON_CACHE_DIR},
        ]
        mounts.append({"name": "vllm-compile-cache", "mountPath": VLLM_CACHE_ROOT})
        if cs["compile_cache"] == "node":
            src = {"hostPath": {"path": COMPILE_CACHE_HOST_PATH, "type": "DirectoryOrCreate"}}
        else:
            src = {"persistentVolumeClaim": {"claimName": cs["compile_cache"][4:]}}
        volumes.append({"name": "vllm-compile-cache", **src})
    if cs["model_cache"] == "node":
        mounts.append({"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT, "readOnly": True})
        volumes.append({"name": "model-cache", "hostPath": {"path": MODEL_CACHE_HOST_PATH, "type": "Directory"}})
    return {"env": env, "volume_mounts": mounts, "volumes": volumes, **cs}


def serve_config(spec: Spec, lock: LockFile | None = None) -> dict[str, Any]:
    """The Ray Serve config (``serveConfigV2``) as data."""
    return {
        "applications": [
            {
                "name": "llm",
                "route_prefix": "/",
                "import_path": SERVE_IMPORT_PATH,
                "args": serve_args(spec, lock),
            }
        ]
    }


def serve_config_sha256(spec: Spec, lock: LockFile | None = None) -> str:
    """sha256 of the Serve configuration (canonical JSON).  It is a pod-template annotation: an engine-argument
    change changes the pod template, so KubeRay takes it through the upgrade path (a new cluster), never in place."""
    text = json.dumps(serve_config(spec, lock), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


#: KubeRay's RayService upgrade types (v1.7.0): a full second cluster, or the Gateway-routed incremental one
NEW_CLUSTER = "NewCluster"
INCREMENTAL = "NewClusterWithIncrementalUpgrade"
INCREMENTAL_INTERVAL_S = 60


@dataclass(frozen=True)
class UpgradePlan:
    """How a RayService moves to a new image or Serve config, and what it costs in GPUs meanwhile."""

    type: str  # NewCluster | NewClusterWithIncrementalUpgrade
    extra_gpus: int  # GPUs needed beside the running cluster during the upgrade
    cost: str  # one sentence for the manifest's header, the annotation and `promote`
    options: dict[str, Any] | None = None  # clusterUpgradeOptions of the incremental upgrade

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "extra_gpus": self.extra_gpus, "cost": self.cost, "options": self.options}


def upgrade_plan(spec: Spec) -> UpgradePlan:
    """Pure: the RayService ``upgradeStrategy`` for the serving settings, with its cost.

    The incremental upgrade needs a Gateway API controller (``serving.gateway_class``), the autoscaler
    (``serving.autoscaler``) and at least two replicas (with one, its surge is a whole second replica:
    NewCluster's cost with more moving parts); anything else is ``NewCluster``, whose second cluster needs
    every worker GPU again until traffic moves (the old cluster is deleted about 60 s later)."""
    s = spec.serving
    lay = layout(spec)
    replicas = int(getattr(s, "replicas", 1) or 1)
    per_replica = lay.worker_pods * lay.gpus_per_pod
    gateway, autoscaler = getattr(s, "gateway_class", None), bool(getattr(s, "autoscaler", False))
    if gateway and autoscaler and replicas >= 2:
        # Serve runs round-half-up(replicas x target_capacity), at least 1; KubeRay routes target_capacity of the
        # traffic there.  100 // replicas: one replica, never more than its share of the traffic.
        step = 100 // replicas
        return UpgradePlan(
            type=INCREMENTAL,
            extra_gpus=per_replica,
            cost=(
                f"{INCREMENTAL} through Gateway class {gateway}: the new cluster grows by one replica at a time "
                f"(maxSurgePercent {step}: {per_replica} GPUs beside the old cluster), traffic moves {step}% every "
                f"{INCREMENTAL_INTERVAL_S} s"
            ),
            options={
                "gatewayClassName": gateway,
                "maxSurgePercent": step,
                "stepSizePercent": step,
                "intervalSeconds": INCREMENTAL_INTERVAL_S,
            },
        )
    missing = [
        w
        for w, ok in (
            ("a Gateway (serving.gateway_class)", gateway),
            ("the autoscaler (serving.autoscaler)", autoscaler),
            ("replicas >= 2", replicas >= 2),
        )
        if not ok
    ]
    total = per_replica * replicas
    return UpgradePlan(
        type=NEW_CLUSTER,
        extra_gpus=total,
        cost=(
            f"{NEW_CLUSTER}: the second cluster needs {total} GPUs ({replicas} replica(s) x {lay.worker_pods} worker "
            f"pod(s) x {lay.gpus_per_pod} GPUs) beside the old one until its Serve application is RUNNING; the old "
            f"cluster is deleted about 60 s later (incremental needs " + ", ".join(missing) + ")"
        ),
    )


def serving_platform(spec: Spec, image_platforms: tuple[Platform, ...]) -> Platform:
    """The platform the pods run: ``[serving] platform`` when set (it must be one the image has), else the
    image's one platform, else (a multi-platform image) the default, linux/amd64, when the image has it."""
    where = f"spec {spec.source or '<flags>'}: serving.platform"
    named = getattr(spec.serving, "platform", None)
    chosen = (
        parse_platform(named, where=where) if named else (image_platforms[0] if len(image_platforms) == 1 else DEFAULT)
    )
    if chosen not in image_platforms:
        raise BadInput(
            f"kuberay: the pods would run on {chosen.name} nodes ({where} = "
            f"{named or 'unset: the default'}), but the image is built for {joined(image_platforms)} only.",
            hint=f"set [serving] platform to one of {joined(image_platforms)}, or build the image for "
            f"{chosen.name} too (--platform).",
        )
    return chosen


def _context(
    *,
    lock: LockFile,
    spec: Spec,
    image: str,
    allow_tag: bool,
    base: BaseManifest | None,
    name: str,
    platforms: tuple[Platform, ...] | None = None,
) -> dict:
    if not _DNS1123.fullmatch(name) or len(name) > 40:
        raise BadInput(f"kuberay: name {name!r} must be a DNS-1123 label of at most 40 characters.")
    image = check_image_ref(image, allow_tag=allow_tag)
    arch = serving_platform(spec, tuple(platforms) if platforms else (lock_platform(lock),)).arch
    lay = layout(spec)
    replicas = int(getattr(spec.serving, "replicas", 1) or 1)
    autoscaler = bool(getattr(spec.serving, "autoscaler", False))
    worker = NodeGroup(
        name="gpu-workers",
        replicas=lay.worker_pods * replicas,
        min_replicas=lay.worker_pods if autoscaler else None,
        max_replicas=lay.worker_pods * replicas if autoscaler else None,
        gpus=lay.gpus_per_pod,
        cpu=str(max(WORKER_MIN_CPU, WORKER_CPU_PER_GPU * lay.gpus_per_pod)),
        memory=f"{WORKER_MEMORY_PER_GPU_GI * lay.gpus_per_pod}Gi",
        ray_start_params={"num-gpus": str(lay.gpus_per_pod)},
    )
    head = NodeGroup(
        name="head",
        replicas=1,
        gpus=0,
        cpu=HEAD_CPU,
        memory=HEAD_MEMORY,
        # No GPUs and no CPUs for tasks on the head: the model replicas go to the GPU workers.
        ray_start_params={"dashboard-host": "0.0.0.0", "num-gpus": "0", "num-cpus": "0"},
    )
    labels = {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/managed-by": "build-image",
        "build-image/vllm": lock.header.get("vllm", spec.vllm).replace("+", "_")[:63],
    }
    annotations = {
        "build-image/image": image,
        "build-image/lock-hash": lock.lock_hash,
        "build-image/ray-version": ray_version(lock, base),
        "build-image/serve-backend": serve_backend_of(lock),
        "build-image/serve-config-sha256": serve_config_sha256(spec, lock),
    }
    upgrade = upgrade_plan(spec)
    return {
        "upgrade": upgrade,
        "autoscaler": autoscaler,
        "tool_version": __version__,
        "name": name,
        "image": image,
        "node_selector": {"kubernetes.io/arch": arch},
        "worker_affinity": gpu_affinity(spec) if getattr(spec.serving, "gpu_node_affinity", False) else None,
        "ray_version": ray_version(lock, base),
        "head": head,
        "worker_groups": [worker],
        "labels": labels,
        "annotations": annotations,
        "worker_storage": worker_storage(spec),
        "serve_config": yaml.safe_dump(serve_config(spec, lock), sort_keys=False, default_flow_style=False).rstrip(
            "\n"
        ),
    }


def gpu_affinity(spec: Spec) -> dict[str, Any]:
    """The GPU workers' required node affinity (``[serving] gpu_node_affinity``): the node's driver major
    (``nvidia.com/cuda.driver.major``, a GPU feature discovery label) at least the floor of the image's CUDA
    (:func:`builder.serving.gpus.driver_floor`), and with ``gpu_model`` the GPU product
    (``nvidia.com/gpu.product``: nvidia-smi's name with '-' for spaces). A floor that cannot be read (a base
    given as an image, a CUDA major not in the table) is refused, never left out."""
    manifest = None if classify(spec.base) == "image" else resolve_base(spec.base, spec.vllm).manifest
    floor = gpus.driver_floor(gpus.image_cuda_major(manifest)) if manifest is not None else None
    if floor is None:
        raise BadInput(
            "[serving] gpu_node_affinity: the driver floor of the image's CUDA is not known "
            + (
                "(the base is an image reference: give its manifest file as 'base')."
                if manifest is None
                else f"(CUDA {gpus.image_cuda_major(manifest)} is not in lockfiles/gate/cuda-drivers.toml)."
            )
        )
    major = int(floor.split(".")[0])
    terms = [{"key": "nvidia.com/cuda.driver.major", "operator": "Gt", "values": [str(major - 1)]}]
    if spec.serving.gpu_model:
        product = gpus.product_label(spec.serving.gpu_model, "[serving] gpu_model (with gpu_node_affinity)")
        terms.append({"key": "nvidia.com/gpu.product", "operator": "In", "values": [product]})
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": terms}]}
        }
    }


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_manifests(
    *,
    lock: LockFile,
    spec: Spec,
    image: str,
    allow_tag: bool = False,
    base: BaseManifest | None = None,
    name: str = DEFAULT_NAME,
    platforms: tuple[Platform, ...] | None = None,
) -> dict[str, str]:
    """Pure: file name -> YAML text for the RayService and the RayCluster.  ``platforms``: the image's
    (None: the lock's one platform); the pods select nodes of :func:`serving_platform`'s arch."""
    ctx = _context(lock=lock, spec=spec, image=image, allow_tag=allow_tag, base=base, name=name, platforms=platforms)
    env = _env()
    out = {  # the file rule: no credential in any generated text (redacted like every file build-image writes)
        RAYSERVICE_FILE: redact_text(env.get_template("rayservice.yaml.j2").render(**ctx)),
        RAYCLUSTER_FILE: redact_text(env.get_template("raycluster.yaml.j2").render(**ctx)),
    }
    for fname, text in out.items():  # a template bug must never reach a cluster
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as exc:  # pragma: no cover - guards the templates
            raise RuntimeError(f"template for {fname} produced invalid YAML: {exc}") from exc
    return out


def _base_for(lock: LockFile, spec: Spec) -> BaseManifest | None:
    if lock.by_name().get("ray") is not None:
        return None

    if classify(spec.base) == "image":  # only a manifest file is read here; an image is not snapshotted again
        return None
    try:
        return resolve_base(spec.base, spec.vllm).manifest
    except BadInput:
        return None


def write_manifests(
    out_dir: str | Path,
    *,
    lock: LockFile,
    spec: Spec,
    image: str,
    allow_tag: bool = False,
    base: BaseManifest | None = None,
    name: str = DEFAULT_NAME,
    platforms: tuple[Platform, ...] | None = None,
) -> list[Path]:
    """Render both manifests and write them into ``out_dir`` (beside the Dockerfile).

    Everything is rendered before anything is written: on bad input no file changes.
    """
    if base is None:
        base = _base_for(lock, spec)
    texts = render_manifests(
        lock=lock, spec=spec, image=image, allow_tag=allow_tag, base=base, name=name, platforms=platforms
    )
    out = Path(out_dir)
    paths = []
    for fname, text in texts.items():
        atomic_write_text(out / fname, text)
        paths.append(out / fname)
    return paths
