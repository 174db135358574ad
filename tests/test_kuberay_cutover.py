"""KubeRay rendering for cutover: the upgrade strategy chosen from [serving] and stated with its cost, the
serve-config hash on every pod template, RayCluster's Recreate; validated against the v1.7.0 CRDs."""

from __future__ import annotations

import pytest
import yaml

from builder.errors import BadInput
from builder.serving import kuberay
from builder.spec import parse_spec
from tests.test_kuberay import DIGEST_REF, _crd_dir, _errors, _strict, all_pod_templates, make_lock, make_spec, render


@pytest.fixture(scope="module")
def validators():
    crds = _crd_dir()
    if crds is None:
        pytest.skip("KubeRay CRDs not found (../shared/kuberay-crds or $BUILD_IMAGE_KUBERAY_CRDS)")
    from openapi_schema_validator import OAS30Validator

    out = {}
    for kind, fname in (("RayCluster", "ray.io_rayclusters.yaml"), ("RayService", "ray.io_rayservices.yaml")):
        crd = yaml.load((crds / fname).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        out[kind] = OAS30Validator(_strict(version["schema"]["openAPIV3Schema"]))
    return out


INCREMENTAL = dict(replicas=3, autoscaler=True, gateway_class="istio", gpus=8, tp=8)


@pytest.mark.parametrize("serving", [{}, INCREMENTAL, {"replicas": 2, "tp": 4, "gpus": 4}])
def test_cutover_manifests_validate_against_the_v1_7_crds(validators, serving):
    docs = render(spec=make_spec(**serving))
    assert _errors(validators["RayService"], docs["rayservice.yaml"]) == []
    assert _errors(validators["RayCluster"], docs["raycluster.yaml"]) == []


def test_a_wrong_upgrade_field_fails_the_crd(validators):
    docs = render(spec=make_spec(**INCREMENTAL))
    docs["rayservice.yaml"]["spec"]["upgradeStrategy"]["clusterUpgradeOptions"].pop("gatewayClassName")
    assert _errors(validators["RayService"], docs["rayservice.yaml"])
    docs["raycluster.yaml"]["spec"]["upgradeStrategy"]["type"] = "NewCluster"  # not a RayCluster strategy
    assert _errors(validators["RayCluster"], docs["raycluster.yaml"])


def test_default_is_new_cluster_with_the_gpus_of_the_second_cluster_stated():
    plan = kuberay.upgrade_plan(make_spec(tp=8, gpus=8))
    assert plan.type == "NewCluster" and plan.extra_gpus == 8 and plan.options is None
    assert "needs 8 GPUs" in plan.cost and "a Gateway" in plan.cost
    text = kuberay.render_manifests(lock=make_lock(), spec=make_spec(tp=8, gpus=8), image=DIGEST_REF)
    doc = yaml.safe_load(text["rayservice.yaml"])
    assert doc["spec"]["upgradeStrategy"] == {"type": "NewCluster"}
    assert f"# Upgrade: {plan.cost}." in text["rayservice.yaml"]
    assert doc["metadata"]["annotations"]["build-image/upgrade"] == plan.cost  # kept by kubectl apply


@pytest.mark.parametrize("serving, gpus", [({"replicas": 2}, 16), ({"replicas": 2, "tp": 16, "gpus": 8}, 32)])
def test_new_cluster_counts_every_replica_and_worker_pod(serving, gpus):
    plan = kuberay.upgrade_plan(make_spec(**serving))
    assert plan.type == "NewCluster" and plan.extra_gpus == gpus


@pytest.mark.parametrize("missing", ["replicas", "autoscaler", "gateway_class"])
def test_incremental_only_with_gateway_autoscaler_and_two_replicas(missing):
    off = {"replicas": 1, "autoscaler": False, "gateway_class": None}
    plan = kuberay.upgrade_plan(make_spec(**dict(INCREMENTAL, **{missing: off[missing]})))
    assert plan.type == "NewCluster" and plan.options is None
    assert kuberay.upgrade_plan(make_spec(**INCREMENTAL)).type == "NewClusterWithIncrementalUpgrade"


@pytest.mark.parametrize("replicas", [2, 3, 4, 7, 100])
def test_the_surge_is_one_replica_whatever_their_number(replicas):
    from decimal import ROUND_HALF_UP, Decimal

    surge = kuberay.upgrade_plan(make_spec(**dict(INCREMENTAL, replicas=replicas))).options["maxSurgePercent"]
    # Ray Serve's get_capacity_adjusted_num_replicas: round half up, at least one replica
    serve = max(1, int((Decimal(replicas) * Decimal(surge) / 100).quantize(Decimal(1), rounding=ROUND_HALF_UP)))
    assert serve == 1 and surge / 100 <= 1 / replicas  # one replica, given at most its share of the traffic


def test_incremental_surges_one_replica_at_a_time():
    plan = kuberay.upgrade_plan(make_spec(**INCREMENTAL))
    assert plan.extra_gpus == 8
    assert plan.options == {
        "gatewayClassName": "istio",
        "maxSurgePercent": 33,
        "stepSizePercent": 33,
        "intervalSeconds": 60,
    }
    docs = render(spec=make_spec(**INCREMENTAL))
    spec = docs["rayservice.yaml"]["spec"]
    assert spec["upgradeStrategy"]["type"] == "NewClusterWithIncrementalUpgrade"
    assert spec["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    group = spec["rayClusterConfig"]["workerGroupSpecs"][0]
    assert (group["minReplicas"], group["replicas"], group["maxReplicas"]) == (1, 3, 3)
    assert yaml.safe_load(spec["serveConfigV2"])["applications"][0]["args"]["num_replicas"] == 3


def test_raycluster_recreates():
    docs = render()
    assert docs["raycluster.yaml"]["spec"]["upgradeStrategy"] == {"type": "Recreate"}


def test_serve_config_hash_is_on_every_pod_template_and_follows_engine_arguments():
    docs = render()
    want = kuberay.serve_config_sha256(make_spec(), make_lock())
    for doc, which in (
        (docs["raycluster.yaml"]["spec"], "cluster"),
        (docs["rayservice.yaml"]["spec"]["rayClusterConfig"], "service"),
    ):
        for tpl in all_pod_templates(doc):
            assert tpl["metadata"]["annotations"]["build-image/serve-config-sha256"] == want, which
            assert tpl["spec"]["containers"][0]["image"] == DIGEST_REF
    assert kuberay.serve_config_sha256(make_spec(max_model_len=8192), make_lock()) != want
    assert kuberay.serve_config_sha256(make_spec(), make_lock()) == want


def test_cutover_settings_parse_and_bad_values_are_bad_input():
    spec = parse_spec(
        '[serving]\nconcurrency = 16\ngpu_model = "NVIDIA H200"\nreplicas = 2\nautoscaler = true\n'
        f'gateway_class = "istio"\ncheckpoint_sha256 = "{"a" * 64}"\n',
        "s.toml",
    )
    s = spec.serving
    assert (s.concurrency, s.gpu_model, s.replicas, s.autoscaler, s.gateway_class) == (
        16,
        "NVIDIA H200",
        2,
        True,
        "istio",
    )
    for bad, says in (
        ('autoscaler = "yes"', "a boolean"),
        ("concurrency = 0", "serving.concurrency"),
        ('checkpoint_sha256 = "abc"', "64 lowercase hex"),
        ('gateway_class = "Bad Class"', "DNS-1123"),
        ("replicas = 1.5", "serving.replicas"),
    ):
        with pytest.raises(BadInput) as exc:
            parse_spec(f"[serving]\n{bad}\n", "s.toml")
        assert says in exc.value.message, exc.value.message
