"""The in-toto / SLSA v1 provenance render writes, build and push rewrite; the referrers index logic."""

from __future__ import annotations

import hashlib
import json

from builder.image import provenance as PV
from builder.image.referrers import EMPTY, OCI_INDEX, artifact_manifest, digest_of, merge_index, referrers_tag


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_render_writes_a_valid_statement_naming_every_input(tmp_path, monkeypatch):
    from tests.test_render import _write

    for var in ("BUILD_IMAGE_BUILDER_ID", "GITHUB_WORKFLOW_REF", "GITHUB_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    out, plan = _write(tmp_path)
    text = (out / "provenance.intoto.json").read_text()
    doc = json.loads(text)
    assert PV.validate(doc) == []  # in-toto-attestation's Statement + SLSA Provenance v1 messages
    assert (
        doc["_type"] == "https://in-toto.io/Statement/v1" and doc["predicateType"] == "https://slsa.dev/provenance/v1"
    )
    # subject at render time: the files render produced
    subj = {s["name"]: s["digest"]["sha256"] for s in doc["subject"]}
    assert subj == {n: _sha((out / n).read_bytes()) for n in ("Dockerfile", "pylock.toml", "sbom.cdx.json")}
    bd = doc["predicate"]["buildDefinition"]
    deps = {d.get("name") or d.get("uri"): d for d in bd["resolvedDependencies"]}
    assert deps["requirements.lock"]["digest"]["sha256"] == _sha((out / "requirements.lock").read_bytes())
    assert deps["requirements.lock"]["annotations"]["lockHash"] == plan.lock.lock_hash
    assert deps["base-manifest"]["digest"]["sha256"] == plan.lock.header["base-manifest-sha256"]
    from builder.image.render import _env

    template = _env().loader.get_source(_env(), "Dockerfile.j2")[0].encode()
    assert (
        deps["templates/Dockerfile.j2"]["digest"]["sha256"]
        == _sha(template)
        == bd["internalParameters"]["templateSha256"]
    )
    base = deps["oci://vllm/vllm-openai:v0.26.0"]
    assert base["digest"]["sha256"] == plan.base.image_digest.split(":")[1]
    for e in plan.lock.entries:
        assert deps[f"{e.name}=={e.version}"]["digest"]["sha256"] == e.wheel.sha256
    assert bd["internalParameters"]["tool"].startswith("build-image ")
    assert [f["path"] for f in bd["internalParameters"]["patchedFiles"]] == sorted(p.relpath for p in plan.patched)
    assert doc["predicate"]["runDetails"]["builder"]["id"] == PV.LOCAL_BUILDER
    assert str(tmp_path) not in text  # nothing host-specific


def test_patch_series_and_its_sums_are_inputs():
    inp = PV.ProvenanceInput(
        vllm="0.26.0",
        repository="r.example/x",
        tags=["r.example/x:a"],
        lock_hash="1" * 64,
        lock_sha256="2" * 64,
        base_ref="vllm/vllm-openai:v0.26.0",
        base_digest=None,
        base_manifest_sha256="3" * 64,
        overlay=["ray[serve]"],
        allow_abi_change={},
        wheels=[],
        patches=[("0001-a.patch", "4" * 64), ("0002-b.patch", "5" * 64)],
        patched_files=[("vllm/a.py", "6" * 64)],
        vllm_wheel=("vllm-0.26.0-x.whl", "7" * 64),
        template_sha256="8" * 64,
        installer="uv",
        source_date_epoch=0,
        outputs={"Dockerfile": "9" * 64},
    )
    doc = PV.statement(
        inp,
        env={
            "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_REPOSITORY": "o/r",
            "GITHUB_WORKFLOW_REF": "o/r/.github/workflows/image.yml@refs/heads/main",
            "GITHUB_RUN_ID": "42",
        },
    )
    assert PV.validate(doc) == []
    deps = doc["predicate"]["buildDefinition"]["resolvedDependencies"]
    patches = [(d["name"], d["digest"]["sha256"]) for d in deps if d.get("annotations", {}).get("role") == "patch"]
    assert patches == [("patches/vllm/0.26.0/0001-a.patch", "4" * 64), ("patches/vllm/0.26.0/0002-b.patch", "5" * 64)]
    assert {
        "name": "vllm-0.26.0-x.whl",
        "digest": {"sha256": "7" * 64},
        "annotations": {"role": "patched-wheel"},
    } in deps
    base = next(d for d in deps if d.get("uri", "").startswith("oci://"))
    assert "digest" not in base  # a reconstructed base has no digest: none is invented
    run = doc["predicate"]["runDetails"]
    assert run["builder"]["id"] == "https://github.com/o/r/.github/workflows/image.yml@refs/heads/main"
    assert run["metadata"]["invocationId"] == "https://github.com/o/r/actions/runs/42/attempts/1"


def test_build_and_push_make_the_image_the_subject(tmp_path):
    from tests.test_render import _write

    out, _plan = _write(tmp_path)
    image_id = "sha256:" + "c" * 64
    doc = PV.record_subject(
        out,
        PV.image_subject(["127.0.0.1:5000/s/v:vllm0.26.0-abc", "127.0.0.1:5000/s/v:vllm0.26.0"], image_id),
        stage="build",
    )
    assert doc["subject"] == [{"name": "127.0.0.1:5000/s/v", "digest": {"sha256": "c" * 64}}]
    again = json.loads((out / "provenance.intoto.json").read_text())
    assert again == doc and PV.validate(again) == [] and again["predicate"]["runDetails"]["metadata"]["finishedOn"]
    assert again["predicate"]["buildDefinition"]["internalParameters"]["stage"] == "build"
    assert PV.record_subject(tmp_path / "no-such-context", [], stage="push") is None


def test_validator_catches_a_mistyped_or_missing_field():
    doc = {
        "_type": PV.STATEMENT_TYPE,
        "subject": [{"name": "x", "digest": {"sha256": "a" * 64}}],
        "predicateType": PV.PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {"buildType": "urn:x", "externalParameters": {}},
            "runDetails": {"builder": {"id": "urn:b"}},
        },
    }
    assert PV.validate(doc) == []
    bad = json.loads(json.dumps(doc))
    bad["predicate"]["buildDefinition"]["buildTyp"] = bad["predicate"]["buildDefinition"].pop("buildType")
    assert any("buildTyp" in e for e in PV.validate(bad))
    bad = json.loads(json.dumps(doc))
    bad["subject"] = []
    assert any("subject" in e.lower() for e in PV.validate(bad))
    bad = json.loads(json.dumps(doc))
    del bad["predicate"]["runDetails"]["builder"]["id"]
    assert any("builder.id" in e for e in PV.validate(bad))


def test_artifact_manifest_and_referrers_tag_index():
    subject = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + "d" * 64, "size": 10}
    blob = b'{"bomFormat":"CycloneDX"}'
    m = json.loads(artifact_manifest("application/vnd.cyclonedx+json", blob, "sbom.cdx.json", subject))
    assert m["artifactType"] == "application/vnd.cyclonedx+json" and m["subject"] == subject
    assert m["config"]["digest"] == digest_of(EMPTY) and m["layers"][0]["digest"] == digest_of(blob)
    assert referrers_tag(subject["digest"]) == "sha256-" + "d" * 64
    a = {"mediaType": "m", "digest": "sha256:" + "1" * 64, "size": 1, "artifactType": "t1"}
    b = {"mediaType": "m", "digest": "sha256:" + "2" * 64, "size": 1, "artifactType": "t2"}
    idx = merge_index(merge_index(None, a), b)
    assert idx["mediaType"] == OCI_INDEX and [x["digest"] for x in idx["manifests"]] == [a["digest"], b["digest"]]
    assert merge_index(idx, a)["manifests"] == [b, a]  # pushing the same artifact again lists it once
    # a re-push's provenance replaces build-image's previous one; other referrers (a signature) stay
    p1 = {**a, "annotations": {"org.build-image.attestation": "provenance"}}
    p2 = {**b, "digest": "sha256:" + "3" * 64, "annotations": {"org.build-image.attestation": "provenance"}}
    sig = {"mediaType": "m", "digest": "sha256:" + "4" * 64, "size": 1, "artifactType": "application/vnd.dev.cosign"}
    assert merge_index(merge_index(merge_index(None, p1), sig), p2)["manifests"] == [sig, p2]
