"""Build and push of a multi-platform context, without an engine: platforms.json read and verified,
the platform selection, the local tags, the base-platform refusal, the index document, KubeRay's
node selection and the ``[serving] platform`` setting.  The Docker runs are in test_platforms_e2e.py."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from builder.engine import ImageInfo
from builder.errors import BadInput, IntegrityError
from builder.image.build import base_platform_mismatch, build_image
from builder.image.multiplatform import (
    PLATFORMS_FILE,
    PLATFORMS_SCHEMA,
    index_document,
    index_lock_hash,
    is_multi,
    platform_tags,
    read_multi_context,
    select,
)
from builder.image.naming import is_content_addressed, lock_platform
from builder.platforms import AMD64, ARM64
from builder.resolve.lockfile import load_lock
from builder.spec import parse_spec
from tests.test_kuberay import (  # noqa: F401 - crd_validators is a fixture
    _errors,
    _validate_pod_template,
    all_pod_templates,
    cluster_spec,
    crd_validators,
    make_spec,
    render,
)
from tests.test_render import _write

REPO = "127.0.0.1:5000/platforms/vllm"


def as_platform(sub: Path, machine: str) -> None:
    """Make a rendered test context's lock one of ``machine`` (only the header's platform line differs)."""
    lock = sub / "requirements.lock"
    lock.write_text(re.sub(r"(?m)^# platform: \S+", f"# platform: {machine}-manylinux_2_35", lock.read_text()))


def multi_context(tmp_path: Path, platforms=(AMD64, ARM64)) -> Path:
    """A multi-platform context as render writes it: one rendered context per platform + platforms.json."""
    out = tmp_path / "multi"
    out.mkdir()
    entries = []
    for p in platforms:
        one, _ = _write(tmp_path / f"src-{p.slug}")
        shutil.move(str(one), str(out / p.slug))
        as_platform(out / p.slug, p.machine)
        dockerfile = (out / p.slug / "Dockerfile").read_text()
        froms = [ln.split()[1] for ln in dockerfile.splitlines() if ln.startswith("FROM ")]
        entries.append(
            {
                "platform": p.name,
                "context": p.slug,
                "base_ref": froms[0],
                "base_digest": None,
                "lock_sha256": hashlib.sha256((out / p.slug / "requirements.lock").read_bytes()).hexdigest(),
            }
        )
    (out / PLATFORMS_FILE).write_text(json.dumps({"schema": PLATFORMS_SCHEMA, "vllm": "0.26.0", "platforms": entries}))
    return out


def test_a_multi_platform_context_reads_back_with_per_platform_tags(tmp_path):
    out = multi_context(tmp_path)
    assert is_multi(out) and not is_multi(out / "linux-amd64")
    mc = read_multi_context(out, REPO)
    assert mc.held == (AMD64, ARM64) and [s.platform for s in mc.platforms] == [AMD64, ARM64]
    amd, arm = mc.platforms
    assert arm.tags == tuple(f"{t}-linux-arm64" for t in arm.context.tags)
    assert all(t.endswith("-linux-amd64") for t in amd.tags)
    # the index tags: content-addressed over each platform's lock, and the moving one
    want = index_lock_hash([(AMD64, amd.context.lock_hash), (ARM64, arm.context.lock_hash)])
    assert mc.tags == (f"{REPO}:vllm0.26.0-{want[:12]}", f"{REPO}:vllm0.26.0")
    assert is_content_addressed(arm.tags[0]) and not is_content_addressed(arm.tags[1])
    # a subset: its own index hash
    only = read_multi_context(out, REPO, wanted="linux/arm64")
    assert [s.platform for s in only.platforms] == [ARM64] and only.tags[0] != mc.tags[0]


def test_a_platform_the_context_was_not_rendered_for_is_exit_2_naming_what_it_holds(tmp_path):
    out = multi_context(tmp_path, platforms=(ARM64,))
    with pytest.raises(BadInput, match=r"rendered for linux/arm64 only") as exc:
        read_multi_context(out, REPO, wanted="linux/amd64")
    assert exc.value.exit_code == 2
    with pytest.raises(BadInput, match="linux/arm/v7"):
        select((AMD64,), "linux/arm/v7", out)
    assert select((AMD64, ARM64), "linux/arm64,linux/amd64", out) == (AMD64, ARM64)  # the context's order


def test_platforms_json_must_match_its_sub_contexts(tmp_path):
    out = multi_context(tmp_path)
    doc = json.loads((out / PLATFORMS_FILE).read_text())
    bad = json.loads(json.dumps(doc))
    bad["platforms"][1]["lock_sha256"] = "0" * 64
    (out / PLATFORMS_FILE).write_text(json.dumps(bad))
    with pytest.raises(IntegrityError):
        read_multi_context(out, REPO)
    bad = json.loads(json.dumps(doc))
    bad["platforms"][1]["context"] = "../elsewhere"
    (out / PLATFORMS_FILE).write_text(json.dumps(bad))
    with pytest.raises(BadInput, match="the linux/arm64 context is the folder linux-arm64"):
        read_multi_context(out, REPO)
    bad = json.loads(json.dumps(doc))
    bad["platforms"][1]["platform"] = "linux/amd64"  # the arm64 folder's lock under another name
    bad["platforms"][1]["context"] = "linux-amd64"
    bad["platforms"][0] = dict(doc["platforms"][1], platform="linux/amd64", context="linux-amd64")
    (out / PLATFORMS_FILE).write_text(json.dumps(bad))
    with pytest.raises((BadInput, IntegrityError)):
        read_multi_context(out, REPO)
    (out / PLATFORMS_FILE).write_text("{not json")
    with pytest.raises(BadInput, match="not JSON"):
        read_multi_context(out, REPO)


def test_the_lock_names_its_platform():
    out_lock = type("L", (), {"header": {"platform": "aarch64-manylinux_2_39"}})()
    assert lock_platform(out_lock) is ARM64
    assert lock_platform(type("L", (), {"header": {"platform": "x86_64-manylinux_2_35"}})()) is AMD64
    for header in ({}, {"platform": "riscv64-manylinux_2_39"}, {"platform": "linux/arm64"}, {"platform": 5}):
        with pytest.raises(BadInput, match="header 'platform'"):  # a lock of unknown platform is neither's
            lock_platform(type("L", (), {"header": header})())


class Engine:
    """Holds images of given platforms; records builds."""

    def __init__(self, images: dict[str, tuple[str, str, str]]):
        self.images, self.builds = images, []

    def ping(self):
        return "fake"

    def inspect(self, ref):
        if ref not in self.images:
            return None
        os_, arch, variant = self.images[ref]
        return ImageInfo(id="sha256:" + "1" * 64, size=1, os=os_, architecture=arch, variant=variant)

    def build(self, context, tags, **kw):
        self.builds.append((context, tags, kw.get("platform")))
        raise AssertionError("no build expected")


@pytest.mark.parametrize(
    ("held", "want", "named"),
    [
        (("linux", "arm64", "v8"), AMD64, "linux/arm64/v8"),
        (("linux", "amd64", ""), ARM64, "linux/amd64"),
        (("linux", "arm", "v7"), ARM64, "linux/arm/v7"),
    ],
)
def test_a_base_of_another_platform_than_the_lock_is_refused_before_building(tmp_path, held, want, named):
    eng = Engine({"base:1": held})
    with pytest.raises(BadInput) as exc:
        build_image(
            tmp_path, ["r:t"], vllm="0.26.0", lock_hash="0" * 64, base_refs=["base:1"], engine=eng, platform=want
        )
    assert exc.value.exit_code == 2 and eng.builds == []
    assert named in exc.value.message and want.name in exc.value.message
    assert "docker pull --platform" in (exc.value.hint or "")
    assert base_platform_mismatch(["base:1", "absent:2"], want, Engine({"base:1": ("linux", want.arch, "")})) is None


def test_image_info_platform():
    assert ImageInfo(id="x", size=0, os="linux", architecture="arm64", variant="v8").platform is ARM64
    assert ImageInfo(id="x", size=0, os="linux", architecture="arm", variant="v7").platform is None
    assert ImageInfo(id="x", size=0).platform is None and ImageInfo(id="x", size=0).platform_name == ""


def test_the_index_lists_each_platform_manifest():
    amd = {
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "digest": "sha256:" + "a" * 64,
        "size": 10,
    }
    arm = dict(amd, digest="sha256:" + "b" * 64, size=11)
    doc = json.loads(index_document([(AMD64, amd), (ARM64, arm)]))
    assert doc["mediaType"] == "application/vnd.oci.image.index.v1+json" and doc["schemaVersion"] == 2
    assert [(m["platform"], m["digest"], m["size"]) for m in doc["manifests"]] == [
        ({"architecture": "amd64", "os": "linux"}, amd["digest"], 10),
        ({"architecture": "arm64", "os": "linux"}, arm["digest"], 11),
    ]
    assert platform_tags(["r:vllm1-" + "c" * 12], ARM64) == ("r:vllm1-" + "c" * 12 + "-linux-arm64",)


# ------------------------------------------------------------------------------------------------- KubeRay
def _selectors(docs: dict) -> set[str]:
    """Every pod template's kubernetes.io/arch in both manifests."""
    out = set()
    for which in ("cluster", "service"):
        for template in all_pod_templates(cluster_spec(docs, which)):
            assert set(template["spec"]["nodeSelector"]) == {"kubernetes.io/arch"}
            out.add(template["spec"]["nodeSelector"]["kubernetes.io/arch"])
    return out


def test_kuberay_pods_select_the_images_arch():
    assert _selectors(render()) == {"amd64"}  # the lock's own platform
    assert _selectors(render(platforms=(ARM64,))) == {"arm64"}
    # a multi-platform image: [serving] platform picks, linux/amd64 by default
    assert _selectors(render(platforms=(AMD64, ARM64))) == {"amd64"}
    assert _selectors(render(platforms=(AMD64, ARM64), spec=make_spec(platform="linux/arm64"))) == {"arm64"}


def test_kuberay_for_arm64_validates_against_the_crds(crd_validators):  # noqa: F811 - the imported fixture
    docs = render(platforms=(AMD64, ARM64), spec=make_spec(platform="linux/arm64"))
    assert _errors(crd_validators["RayCluster"], docs["raycluster.yaml"]) == []
    assert _errors(crd_validators["RayService"], docs["rayservice.yaml"]) == []
    for which in ("cluster", "service"):
        for template in all_pod_templates(cluster_spec(docs, which)):
            _validate_pod_template(template)


def test_kuberay_refuses_a_serving_arch_the_image_lacks():
    with pytest.raises(BadInput, match=r"linux/arm64 nodes .* built for linux/amd64 only") as exc:
        render(spec=make_spec(platform="linux/arm64"))
    assert exc.value.exit_code == 2
    with pytest.raises(BadInput, match="built for linux/arm64 only"):
        render(platforms=(ARM64,), spec=make_spec(platform="linux/amd64"))


def test_serving_platform_in_the_spec():
    spec = parse_spec('[serving]\nplatform = "linux/aarch64"\n', "s.toml")
    assert spec.serving.platform == "linux/arm64"
    with pytest.raises(BadInput, match=r"serving.platform.*linux/amd64, linux/arm64"):
        parse_spec('[serving]\nplatform = "linux/arm/v7"\n', "s.toml")


def test_single_platform_build_refuses_a_platform_the_context_was_not_rendered_for(tmp_path):
    from click.testing import CliRunner

    from builder.cli import main

    out, _ = _write(tmp_path)
    r = CliRunner().invoke(main, ["build", str(out), "--platform", "linux/arm64"])
    assert r.exit_code == 2, r.output
    assert "rendered for linux/amd64 only" in r.output
    assert load_lock(out / "requirements.lock").header["platform"].startswith("x86_64")


def test_the_stand_in_script_knows_two_platforms():
    import subprocess

    from tests.fx_docker import ROOT

    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "make-standin-base.sh"), "--platform", "linux/ppc64le"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "linux/amd64 or linux/arm64" in r.stderr
    for script in ("make-standin-base.sh", "services.sh"):
        assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], timeout=60).returncode == 0
