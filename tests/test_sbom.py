"""The CycloneDX SBOM render writes (and the image carries): contents, schema validity, label."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from builder.errors import IntegrityError
from builder.image import sbom as S
from builder.image.render import RenderPlan, oci_labels, render_dockerfile, verify_context
from builder.patching.series import PatchedFile, load_series
from builder.resolve.lockfile import LockEntry, WheelRef, load_lock
from builder.resolve.manifest import DistFacts, load_manifest
from builder.util import project_root

ROOT = project_root()


@pytest.fixture(scope="module")
def default_plan() -> RenderPlan:
    """The default 0.26.0 lock on its base manifest, with the real patch series (patched
    sha256s stand in: computing them needs the 400 MB vllm wheel)."""
    lock = load_lock(ROOT / "lockfiles" / "vllm-0.26.0" / "requirements.lock")
    base = load_manifest(ROOT / "lockfiles" / "base" / "vllm-openai-v0.26.0.json")
    series = load_series(ROOT / "patches" / "vllm" / "0.26.0", "0.26.0")
    patched = [
        PatchedFile(rel, sha, hashlib.sha256(rel.encode()).hexdigest()) for rel, sha in sorted(series.originals.items())
    ]
    names = [p.name for p in series.patches]
    return RenderPlan(
        vllm="0.26.0",
        base=base,
        lock=lock,
        patched=patched,
        patches=names,
        patch_texts={n: (series.dir / n).read_text() for n in names},
        vllm_wheel=(series.wheel_filename, series.wheel_sha256),
        repo="127.0.0.1:5000/serving/vllm",
    )


def test_default_sbom_validates_and_lists_every_base_distribution_and_the_overlay(default_plan):
    text = default_plan.sbom_text()
    assert S.validate(text) == []  # cyclonedx-python-lib's JSON validator, CycloneDX 1.6 schema
    doc = json.loads(text)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    comps = doc["components"]
    base, lock = default_plan.base, default_plan.lock
    assert len(comps) == len(base.distributions) + len(lock.entries) == 245 + 14  # the derived 0.26.0 floor
    by_ref = {c["bom-ref"]: c for c in comps}
    for d in base.distributions.values():
        c = by_ref[f"pkg:pypi/{d.key}@{d.version}"]
        assert c["purl"] == f"pkg:pypi/{d.key}@{d.version}"
        assert {"name": "build-image:source", "value": "base-image"} in c["properties"]
    for e in lock.entries:
        c = by_ref[f"pkg:pypi/{e.key}@{e.version}"]
        assert c["hashes"] == [{"alg": "SHA-256", "content": e.wheel.sha256}]
        assert c["purl"].startswith(f"pkg:pypi/{e.key}@{e.version}?file_name=")
        assert c["externalReferences"][0]["url"] == e.wheel.url
    # the base image is the image component's parent (ancestor)
    image = doc["metadata"]["component"]
    assert image["type"] == "container" and image["version"] == f"vllm0.26.0-{lock.lock_hash[:12]}"
    (parent,) = image["pedigree"]["ancestors"]
    assert parent["name"] == "vllm/vllm-openai" and parent["version"] == "v0.26.0" and parent["type"] == "container"
    # vllm: its patches and the patched files with their sha256
    vllm = by_ref["pkg:pypi/vllm@0.26.0"]
    assert [p["type"] for p in vllm["pedigree"]["patches"]] == ["unofficial"] * len(default_plan.patches)
    # (the library keeps patches as a sorted set; the series order is in the notes)
    assert sorted(p["diff"]["text"]["content"] for p in vllm["pedigree"]["patches"]) == sorted(
        default_plan.patch_texts.values()
    )
    assert ", ".join(default_plan.patches) in vllm["pedigree"]["notes"]
    assert vllm["pedigree"]["ancestors"][0]["hashes"][0]["content"] == default_plan.vllm_wheel[1]
    files = {f["name"]: f for f in vllm["components"]}
    for p in default_plan.patched:
        assert files[p.relpath]["type"] == "file"
        assert files[p.relpath]["hashes"] == [{"alg": "SHA-256", "content": p.patched_sha256}]
        assert {"name": "build-image:original-sha256", "value": p.original_sha256} in files[p.relpath]["properties"]
    # the image depends on every component
    (dep,) = [d for d in doc["dependencies"] if d["ref"] == image["bom-ref"]]
    assert len(dep["dependsOn"]) == 245 + 14


def test_sbom_is_deterministic_and_changes_with_what_the_image_holds(default_plan):
    a = default_plan.sbom_text()
    assert a == default_plan.sbom_text()
    doc = json.loads(a)
    assert doc["metadata"]["timestamp"].startswith("1970-01-01")  # SOURCE_DATE_EPOCH, not the clock
    plan = RenderPlan(**{**default_plan.__dict__, "patched": default_plan.patched[:1]})
    b = plan.sbom_text()
    assert b != a and json.loads(b)["serialNumber"] != doc["serialNumber"]


def test_a_distribution_the_overlay_moves_appears_once_with_the_base_version_as_ancestor(default_plan):
    lock = load_lock(ROOT / "lockfiles" / "vllm-0.26.0" / "requirements.lock")
    base_np = default_plan.base.get("numpy")
    h = "ab" * 32
    lock.entries.append(
        LockEntry(
            name="numpy",
            version="2.2.0",
            hashes=[h],
            base_version=base_np.version,
            wheel=WheelRef(url="https://files.example/numpy-2.2.0-cp312-cp312-manylinux_2_17_x86_64.whl", sha256=h),
            facts=DistFacts(binary=True, extensions=3),
        )
    )
    plan = RenderPlan(vllm="0.26.0", base=default_plan.base, lock=lock, repo="r.example/x")
    doc = json.loads(plan.sbom_text())
    nps = [c for c in doc["components"] if c["name"] == "numpy"]
    assert len(nps) == 1 and nps[0]["version"] == "2.2.0"
    assert nps[0]["pedigree"]["ancestors"][0]["version"] == base_np.version
    assert len(doc["components"]) == len(default_plan.base.distributions) + len(lock.entries) - 1


def test_the_image_carries_the_sbom_at_a_fixed_path_and_its_sha256_in_a_label(default_plan):
    text = default_plan.sbom_text()
    sha = hashlib.sha256(text.encode()).hexdigest()
    labels = dict(oci_labels(default_plan))
    assert labels["org.build-image.sbom-sha256"] == sha and labels["org.build-image.sbom"] == S.IMAGE_SBOM_PATH
    df = render_dockerfile(default_plan)
    assert f"COPY sbom.cdx.json {S.IMAGE_SBOM_PATH}" in df
    assert f'org.build-image.sbom-sha256="{sha}"' in df
    # the SBOM layer comes after the patched files (a patch change does not rebuild the dependency layer)
    assert df.index("source=patches") < df.index("COPY sbom.cdx.json") < df.rindex("LABEL")


def test_validator_catches_a_broken_document():
    bad = json.dumps(
        {
            "bomFormat": "CycloneDX",
            "specVersion": "1.6",
            "version": 1,
            "components": [{"type": "no-such-type", "name": "x"}],
        }
    )
    errors = S.validate(bad)
    assert errors and "no-such-type" in errors[0]


def test_verify_context_refuses_a_modified_sbom(tmp_path):
    from tests.test_render import _write

    out, plan = _write(tmp_path)
    assert verify_context(out).lock_hash == plan.lock.lock_hash
    sbom = out / "sbom.cdx.json"
    assert S.validate(sbom.read_text()) == []
    sbom.write_text(sbom.read_text().replace('"library"', '"framework"', 1))
    with pytest.raises(IntegrityError, match=re.escape("sbom.cdx.json has sha256")):
        verify_context(out)
