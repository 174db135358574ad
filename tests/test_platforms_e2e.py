"""linux/arm64 beside linux/amd64 on a real Docker engine and the local registry (127.0.0.1:5000).

The arm64 stand-in base is built under QEMU (scripts/make-standin-base.sh --platform linux/arm64,
cached like the amd64 one); a two-platform context is made the way ``render --platform`` lays one
out (one rendered context per platform + platforms.json) from both stand-ins with a one-wheel
pure-Python overlay (six), so the emulated steps stay small: pip installs one wheel, the checks
stage runs once per platform.  Then ``build-image build`` builds both, ``build-image push`` pushes
them and an OCI image index, read back with skopeo and the registry client (index, both children,
each child's SBOM and provenance referrers); a base of the other platform under a lock is refused
before building, both ways.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.fx_docker import BUILD_IMAGE, DOCKER, REGISTRY, run_pipeline, standin_findlinks

pytestmark = [pytest.mark.slow, pytest.mark.docker]

OVERLAY = ("six==1.17.0",)  # pure Python: the same wheel locks for both machines
#: a repository of this run's own: a registry that outlives a run (a developer's) may hold the tags of a
#: build made by other code, which a content-addressed push rightly refuses to move
RUN_ID = f"{os.getpid()}-{int(time.time())}"
REPO = f"{REGISTRY}/platforms-{RUN_ID}/vllm"
# test-only refs for the refusal: a tag of one stand-in under a name the other platform's lock builds FROM
MISMATCH_REF = {
    "amd64": "standin.local/mismatch/vllm-openai:v0.26.0-amd64-lock",
    "arm64": "standin.local/mismatch/vllm-openai:v0.26.0-arm64-lock",
}


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=600)
    if check:
        assert r.returncode == 0, f"docker {' '.join(args)}: {r.stderr}"
    return r


def cli(*args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([BUILD_IMAGE, *args], capture_output=True, text=True, timeout=timeout)


def snapshot(ref: str, out: Path, machine: str, image_ref: str | None = None) -> Path:
    """The base manifest of a local stand-in, for ``machine``'s lock; ``image_ref``: the ref its Dockerfile
    builds FROM (default ``ref``)."""
    r = cli("base", "snapshot", "--image", ref, "-o", str(out), timeout=900)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    # the snapshot names the machine from what it reads; the lock is made for the stand-in's own
    doc["platform"] = f"{machine}-{doc['platform'].split('-', 1)[1]}"
    if image_ref:
        doc["image"]["ref"] = image_ref
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return out


def one_context(manifest: Path, work: Path, out: Path, findlinks: Path) -> Path:
    """lock OVERLAY on ``manifest`` (offline), render it into ``out`` (no patches)."""
    lock = work / f"{out.name}.lock"
    platform = "linux/arm64" if json.loads(manifest.read_text())["platform"].startswith("aarch64") else "linux/amd64"
    args = [
        "lock",
        "--vllm",
        "0.26.0",
        "--base",
        str(manifest),
        "-o",
        str(lock),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(findlinks),
        "--platform",
        platform,
    ]
    for req in OVERLAY:
        args += ["--with", req]
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    r = cli(
        "render",
        "--vllm",
        "0.26.0",
        "--base",
        str(manifest),
        "--lock",
        str(lock),
        "--no-patches",
        "-o",
        str(out),
        "--tag",
        REPO,
        "--platform",
        platform,
    )
    assert r.returncode == 0, r.stderr
    return out


def write_platforms_json(out: Path, subs: dict[str, Path]) -> None:
    entries = []
    for name, sub in subs.items():
        froms = [ln.split()[1] for ln in (sub / "Dockerfile").read_text().splitlines() if ln.startswith("FROM ")]
        entries.append(
            {
                "platform": name,
                "context": sub.name,
                "base_ref": froms[0],
                "base_digest": None,
                "lock_sha256": hashlib.sha256((sub / "requirements.lock").read_bytes()).hexdigest(),
            }
        )
    doc = {"schema": "build-image/platforms/v1", "vllm": "0.26.0", "platforms": entries}
    (out / "platforms.json").write_text(json.dumps(doc, indent=2) + "\n")


@pytest.fixture(scope="module")
def manifests(standin_base_image, standin_arm64_base_image, tmp_path_factory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("platform-manifests")
    return {
        "amd64": snapshot(standin_base_image.ref, work / "amd64.json", "x86_64"),
        "arm64": snapshot(standin_arm64_base_image.ref, work / "arm64.json", "aarch64"),
    }


@pytest.fixture(scope="module")
def two_platform_context(manifests, tmp_path_factory) -> Path:
    fl = standin_findlinks(OVERLAY)
    work = tmp_path_factory.mktemp("two-platform")
    out = work / "ctx"
    out.mkdir()
    subs = {
        "linux/amd64": one_context(manifests["amd64"], work, out / "linux-amd64", fl),
        "linux/arm64": one_context(manifests["arm64"], work, out / "linux-arm64", fl),
    }
    write_platforms_json(out, subs)
    return out


def test_the_arm64_stand_in_is_an_arm64_image_that_runs_under_qemu(standin_arm64_base_image):
    doc = json.loads(docker("image", "inspect", standin_arm64_base_image.ref).stdout)[0]
    assert (doc["Os"], doc["Architecture"]) == ("linux", "arm64")
    code = "import platform, numpy, vllm; print(platform.machine(), numpy.__version__, vllm.__version__)"
    r = docker("run", "--rm", "--pull=never", "--network=none", standin_arm64_base_image.ref, "python3", "-c", code)
    assert r.stdout.split() == ["aarch64", "1.24.2", "0.26.0"]
    from builder.engine import DockerEngine
    from builder.platforms import ARM64

    assert DockerEngine().image_platform(standin_arm64_base_image.ref) is ARM64


def test_two_platforms_build_and_push_as_one_index_with_each_platforms_referrers(two_platform_context, local_registry):
    from builder.image import referrers
    from builder.image.registry import RegistryClient

    t0 = time.monotonic()
    r = cli("build", str(two_platform_context), "--tag", REPO, "--json")
    assert r.returncode == 0, r.stderr[-4000:]
    built = json.loads(r.stdout)
    print(
        f"\nbuild (both platforms): {time.monotonic() - t0:.1f}s;",
        ", ".join(f"{b['platform']} {b['seconds']}s" for b in built["platforms"]),
    )
    assert [b["platform"] for b in built["platforms"]] == ["linux/amd64", "linux/arm64"]
    for b in built["platforms"]:
        slug = b["platform"].replace("/", "-")
        assert all(t.endswith(slug) for t in b["tags"])
        doc = json.loads(docker("image", "inspect", b["tags"][0]).stdout)[0]
        assert doc["Architecture"] == b["platform"].split("/")[1] and doc["Id"] == b["image_id"]
        out = docker(
            "run",
            "--rm",
            "--pull=never",
            "--network=none",
            b["tags"][0],
            "python3",
            "-c",
            "import platform, six; print(platform.machine(), six.__version__)",
        ).stdout.split()
        assert out == [{"linux-amd64": "x86_64", "linux-arm64": "aarch64"}[slug], "1.17.0"]

    t0 = time.monotonic()
    r = cli("push", str(two_platform_context), "--tag", REPO, "--force", "--json")
    assert r.returncode == 0, r.stderr[-4000:]
    print(f"push (both platforms + index): {time.monotonic() - t0:.1f}s")
    pushed = json.loads(r.stdout)
    index = pushed["index"]
    assert index["media_type"] == "application/vnd.oci.image.index.v1+json" and index["tags"] == built["index_tags"]

    # read back with skopeo: the index under both tags, both platforms, each child's digest
    for tag in index["tags"]:
        raw = subprocess.run(
            ["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{tag}"], capture_output=True, timeout=120
        )
        assert raw.returncode == 0, raw.stderr
        assert "sha256:" + hashlib.sha256(raw.stdout).hexdigest() == index["digest"]
        doc = json.loads(raw.stdout)
        assert doc["mediaType"] == "application/vnd.oci.image.index.v1+json"
        listed = {(m["platform"]["os"], m["platform"]["architecture"]): m["digest"] for m in doc["manifests"]}
        assert listed == {tuple(p["platform"].split("/")): p["digest"] for p in pushed["platforms"]}

    client = RegistryClient(REGISTRY)
    repo = REPO.split("/", 1)[1]
    for p in pushed["platforms"]:
        att = p["attestations"]
        assert att["pushed"] and att["subject"].endswith(p["digest"])
        how, found = referrers.list_referrers(client, repo, p["digest"])
        assert how in ("api", "tag-schema")
        kinds = {(d.get("annotations") or {}).get(referrers.KIND): d["digest"] for d in found}
        assert kinds == {"sbom": att["sbom"]["digest"], "provenance": att["provenance"]["digest"]}
    # the same build pushed again: the same index
    r = cli("push", str(two_platform_context), "--tag", REPO, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["index"]["digest"] == index["digest"]


def test_one_platform_of_a_two_platform_context_and_one_it_lacks(two_platform_context):
    r = cli("build", str(two_platform_context), "--tag", REPO, "--platform", "linux/arm64", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert [b["platform"] for b in json.loads(r.stdout)["platforms"]] == ["linux/arm64"]
    sub = two_platform_context.parent / "amd64-only"
    shutil.copytree(two_platform_context / "linux-amd64", sub)
    r = cli("build", str(sub), "--tag", REPO, "--platform", "linux/arm64")
    assert r.returncode == 2 and "rendered for linux/amd64 only" in r.stderr, r.stderr
    r = cli("push", str(two_platform_context), "--tag", REPO, "--platform", "linux/ppc64le")
    assert r.returncode == 2 and "linux/amd64, linux/arm64" in r.stderr, r.stderr


@pytest.mark.parametrize(("lock_arch", "held_arch"), [("amd64", "arm64"), ("arm64", "amd64")])
def test_a_base_of_the_other_platform_is_refused_before_building(
    lock_arch, held_arch, standin_base_image, standin_arm64_base_image, manifests, tmp_path
):
    """The lock is for ``lock_arch``; the engine holds ``held_arch``'s stand-in under the ref its Dockerfile
    builds FROM: exit 2 naming both, nothing built."""
    held = {"amd64": standin_base_image.ref, "arm64": standin_arm64_base_image.ref}[held_arch]
    ref = MISMATCH_REF[lock_arch]
    docker("tag", held, ref)
    try:
        doc = json.loads(manifests[lock_arch].read_text())
        doc["image"]["ref"] = ref
        manifest = tmp_path / "manifest.json"
        manifest.write_text(json.dumps(doc, indent=2) + "\n")
        ctx = one_context(manifest, tmp_path, tmp_path / "ctx", standin_findlinks(OVERLAY))
        r = cli("build", str(ctx), "--tag", REPO)
        assert r.returncode == 2, r.stderr[-2000:]
        assert f"is linux/{held_arch}" in r.stderr and f"made for linux/{lock_arch}" in r.stderr, r.stderr
        assert "docker pull --platform" in r.stderr and "#1 " not in r.stderr  # refused before BuildKit started
        # the pipeline's build stage refuses it too (a single-platform run, the context rendered again)
        r = run_pipeline(
            [
                "--vllm",
                "0.26.0",
                "--base",
                str(manifest),
                "--lock",
                str(tmp_path / "ctx.lock"),
                "--no-default-overlay",
                "--no-index",
                "--find-links",
                str(standin_findlinks(OVERLAY)),
                "--with",
                OVERLAY[0],
                "--no-patches",
                "-o",
                str(tmp_path / "ctx2"),
                "--tag",
                REPO,
                "--platform",
                f"linux/{lock_arch}",
            ]
        )
        assert r.returncode == 2 and f"linux/{held_arch}" in r.stderr, r.stderr[-2000:]
    finally:
        docker("rmi", ref, check=False)


def test_the_main_job_locks_renders_builds_and_pushes_both_platforms_as_one_index(manifests, tmp_path, local_registry):
    """``build-image --vllm X --platform linux/amd64,linux/arm64 --push`` in a checkout whose lockfiles hold both
    stand-ins' manifests: each platform locked on its own base, one context per platform, both built, one index."""
    checkout = tmp_path / "checkout"
    (checkout / "lockfiles" / "base").mkdir(parents=True)
    shutil.copyfile(manifests["amd64"], checkout / "lockfiles" / "base" / "vllm-openai-v0.26.0.json")
    shutil.copyfile(manifests["arm64"], checkout / "lockfiles" / "base" / "vllm-openai-v0.26.0-linux-arm64.json")
    repo = f"{REGISTRY}/platforms-main-{RUN_ID}/vllm"
    t0 = time.monotonic()
    r = subprocess.run(
        [
            BUILD_IMAGE,
            "--vllm",
            "0.26.0",
            "--platform",
            "linux/amd64,linux/arm64",
            "--no-patches",
            "--no-default-overlay",
            "--no-index",
            "--find-links",
            str(standin_findlinks(OVERLAY)),
            "--with",
            OVERLAY[0],
            "-o",
            str(tmp_path / "ctx"),
            "--tag",
            repo,
            "--push",
            "--json",
        ],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    summary = json.loads(r.stdout)
    print(f"\nmain job, both platforms: {time.monotonic() - t0:.1f}s; stages {summary['stages_s']}")
    assert summary["status"] == "pushed" and summary["platforms"] == ["linux/amd64", "linux/arm64"]
    for name, machine in (("linux/amd64", "x86_64"), ("linux/arm64", "aarch64")):
        one = summary["per_platform"][name]
        lock = (checkout / one["lock"]) if not Path(one["lock"]).is_absolute() else Path(one["lock"])
        assert lock.is_file() and f"# platform: {machine}-" in lock.read_text()
        assert one["image_id"].startswith("sha256:")
    assert (tmp_path / "ctx" / "platforms.json").is_file()
    raw = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{summary['index_tags'][0]}"],
        capture_output=True,
        timeout=120,
    )
    assert raw.returncode == 0, raw.stderr
    index = json.loads(raw.stdout)
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert sorted(m["platform"]["architecture"] for m in index["manifests"]) == ["amd64", "arm64"]
    assert summary["digest"] == "sha256:" + hashlib.sha256(raw.stdout).hexdigest()
