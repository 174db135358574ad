"""Cutover: the smoke verdict bound to a digest, promote / rollback / history against the real registry.

The statement tests are pure (no GPU: the statement is built from a SmokeReport).  The registry tests push
tiny FROM-scratch images with skopeo to 127.0.0.1:5000, attach verdicts, and run the real CLI; skopeo reads
the tags back independently.
"""

from __future__ import annotations

import json

import pytest

from builder.errors import BadInput
from builder.events import Recorder
from builder.image import referrers
from builder.image.registry import RegistryClient
from builder.serving import attestation
from tests.fx_cutover import (
    CHECKPOINT_SHA,
    GPU,
    attest,
    cli,
    make_world,
    push_image,
    signing_key,
    statement,
    tag_digest,
)

DIGEST = "sha256:" + "ab" * 32
TARGET = attestation.Target(concurrency=16, max_model_len=4096, tp=1, gpu_model=GPU, checkpoint_sha256=CHECKPOINT_SHA)


@pytest.fixture
def world(tmp_path, local_registry):
    return make_world(tmp_path, local_registry)


def _trusted() -> dict:
    from builder.signing import trusted_keys

    return trusted_keys([signing_key()[1]])


def verdict_of(doc: dict, digest: str = DIGEST) -> attestation.Verdict:
    return attestation.parse_statement(attestation.statement_bytes(doc), where="test", subject_digest=digest)


# --------------------------------------------------------------------------- the statement (no GPU, no registry)


def test_statement_is_an_in_toto_v1_statement_about_the_digest_with_the_whole_verdict():
    doc = statement("127.0.0.1:5000/app", DIGEST)
    assert doc["_type"] == "https://in-toto.io/Statement/v1"
    assert doc["subject"] == [{"name": "127.0.0.1:5000/app", "digest": {"sha256": "ab" * 32}}]
    p = doc["predicate"]
    assert p["verdict"] == "PASS" and p["load"] == {
        "rounds": 3,
        "concurrency": 16,
        "rounds_completed": 3,
        "prompt_tokens": 128,
        "max_tokens": 64,
    }
    assert p["engine_args"]["max_model_len"] == 4096 and p["engine_args"]["tensor_parallel_size"] == 1
    assert p["gpu"]["model"] == GPU and p["gpu"]["count"] == 1
    assert p["checkpoint"] == {
        "path": "/data/models/qwen",
        "size_bytes": 1234,
        "verify": "READY",
        "index_sha256": CHECKPOINT_SHA,
    }
    assert p["engine"] == {"vllm": "0.26.0"} and p["equivalence"] is None
    v = verdict_of(doc)
    assert v.passed and attestation.mismatches(v, TARGET) == []


def test_a_fail_verdict_is_a_statement_too_and_never_clears_a_target():
    v = verdict_of(statement("r/app", DIGEST, verdict="FAIL"))
    assert not v.passed
    assert any("verdict is FAIL" in m for m in attestation.mismatches(v, TARGET))


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"concurrency": 4}, "concurrency 4 < the target's 16"),
        ({"checkpoint_sha": "d" * 64}, "is not the target's"),
        ({"tp": 2}, "tensor-parallel size 2 != the target's 1"),
        ({"max_model_len": 8192}, "max-model-len 8192 != the target's 4096"),
        ({"gpu": "NVIDIA H100 80GB HBM3"}, "GPU model"),
    ],
)
def test_each_setting_that_differs_from_the_target_is_named(kw, says):
    miss = attestation.mismatches(verdict_of(statement("r/app", DIGEST, **kw)), TARGET)
    assert len(miss) == 1 and says in miss[0], miss


def test_a_run_that_stopped_early_does_not_clear_the_target():
    doc = statement("r/app", DIGEST)
    doc["predicate"]["load"]["rounds_completed"] = 2
    assert attestation.mismatches(verdict_of(doc), TARGET) == ["only 2 of 3 rounds completed"]


def test_a_higher_concurrency_than_the_target_clears_it():
    assert attestation.mismatches(verdict_of(statement("r/app", DIGEST, concurrency=32)), TARGET) == []


def test_equivalence_failure_blocks_the_promotion():
    doc = statement("r/app", DIGEST)
    doc["predicate"]["equivalence"] = {"verdict": "FAIL", "max_abs_dlogprob": 0.2, "first_diff": 3}
    assert any("equivalence" in m for m in attestation.mismatches(verdict_of(doc), TARGET))


@pytest.mark.parametrize(
    "mutate, says",
    [
        (lambda b: b[: len(b) // 2], "not JSON"),
        (lambda b: b.replace(b'"ab', b'"cd', 1), "subject is sha256:cd"),
        (lambda b: b.replace(b'"PASS"', b'"MAYBE"'), "$.predicate.verdict: 'MAYBE' is not one of"),
        (
            lambda b: b.replace(b'"concurrency":16', b'"concurrency":"16"'),
            "$.predicate.load.concurrency: '16' is not of type 'integer'",
        ),
        (lambda b: b.replace(b'"rounds_completed":3,', b''), "'rounds_completed' is a required property"),
        (lambda b: b.replace(b"smoke-verdict/v1", b"smoke-verdict/v9"), "predicateType"),
        (lambda b: b.replace(b"Statement/v1", b"Statement/v0.1"), "in-toto"),
    ],
)
def test_a_forged_or_truncated_statement_is_bad_input_naming_it(mutate, says):
    blob = mutate(attestation.statement_bytes(statement("r/app", DIGEST)))
    with pytest.raises(BadInput) as exc:
        attestation.parse_statement(blob, where="REG/app@sha256:feed", subject_digest=DIGEST)
    assert "REG/app@sha256:feed" in exc.value.message and says in exc.value.message, exc.value.message


def test_checkpoint_facts_hash_the_index_and_report_the_verify_result(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    (tmp_path / "model-00001.safetensors").write_bytes(b"x" * 100)
    facts = attestation.checkpoint_facts(tmp_path, {"ready": True})
    import hashlib

    assert facts["index_sha256"] == hashlib.sha256(b'{"weight_map": {}}').hexdigest()
    assert facts["size_bytes"] == 118 and facts["verify"] == "READY"
    assert attestation.checkpoint_facts(tmp_path, None)["verify"] == "not checked"


# --------------------------------------------------------------------------- against the registry

docker = [pytest.mark.slow, pytest.mark.docker]


def promote(w, digest: str, *extra: str, spec=None):
    return cli(
        "promote",
        f"{w.base}@{digest}",
        "--to",
        w.tag,
        "--spec",
        str(spec or w.spec),
        "--history",
        str(w.history),
        *extra,
    )


@pytest.mark.slow
@pytest.mark.docker
def test_promote_is_refused_without_an_attestation_and_nothing_moves(world):
    r = promote(world, world.new)
    assert r.returncode == 1, r.stderr
    assert "promote refused" in r.stderr and "no smoke attestation is attached" in r.stderr
    assert tag_digest(world.tag) == world.old
    assert not world.history.exists()


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize(
    "kw, says",
    [({"concurrency": 4}, "concurrency 4 < the target's 16"), ({"checkpoint_sha": "d" * 64}, "is not the target's")],
)
def test_promote_is_refused_with_a_mismatching_attestation(world, kw, says):
    attest(world.registry, world.repo, world.new, **kw)
    r = promote(world, world.new)
    assert r.returncode == 1 and says in r.stderr, r.stderr
    assert tag_digest(world.tag) == world.old


@pytest.mark.slow
@pytest.mark.docker
def test_promote_with_a_matching_pass_records_the_way_back_and_rollback_takes_it(world):
    attest(world.registry, world.repo, world.new, concurrency=4)  # another configuration's verdict stays
    attest(world.registry, world.repo, world.new)  # the matching one
    out = world.tmp / "apply"
    r = promote(world, world.new, "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["status"] == "done" and res["previous"] == world.old and res["digest"] == world.new
    assert tag_digest(world.tag) == world.new
    assert "NewCluster: the second cluster needs 1 GPUs" in res["upgrade"]["cost"]
    # the manifests to apply run the new image by digest on every pod
    text = (out / "rayservice.yaml").read_text()
    assert f"{world.base}@{world.new}" in text and ":prod" not in text

    hist = json.loads(world.history.read_text())
    (e,) = hist["entries"]
    assert e["from"] == world.old and e["to"] == world.new and e["status"] == "done" and not e["forced"]
    cfg = e["previous"]["config"]
    assert cfg["Env"] == ["APP=old", "PATH=/bin"] and cfg["Cmd"] == ["--name", "old"]
    assert cfg["Entrypoint"] == ["/app/serve"] and cfg["Labels"] == {"org.example.image": "old"}
    assert f"{world.base}@{world.old}" in e["manifests"]["previous"]["rayservice.yaml"]
    assert "PASS at 3 x 16" in e["verdict"]["summary"]

    # the rollback record is an artifact referring to the new digest, with the same content
    client = RegistryClient(world.registry)
    _how, descs = referrers.list_referrers(client, world.repo, world.new)
    (rec,) = [d for d in descs if d.get("artifactType") == "application/vnd.build-image.rollback-record.v1+json"]
    assert rec["digest"] == e["record"] and rec["annotations"]["org.build-image.previous"] == world.old
    man = json.loads(
        client.request("GET", f"/v2/{world.repo}/manifests/{rec['digest']}", {"Accept": referrers.OCI_MANIFEST})[2]
    )
    assert man["subject"]["digest"] == world.new
    blob = json.loads(client.request("GET", f"/v2/{world.repo}/blobs/{man['layers'][0]['digest']}")[2])
    assert blob["previous"] == e["previous"]

    back = world.tmp / "back"
    r = cli("rollback", world.tag, "--history", str(world.history), "-o", str(back))
    assert r.returncode == 0, r.stderr
    assert tag_digest(world.tag) == world.old
    assert (back / "rayservice.yaml").read_text() == e["manifests"]["previous"]["rayservice.yaml"]
    r = cli("history", world.tag, "--history", str(world.history), "--json")
    entries = json.loads(r.stdout)["entries"]
    assert [(x["action"], x["status"], x["to"]) for x in entries] == [
        ("promote", "done", world.new),
        ("rollback", "done", world.old),
    ]
    # nothing left to undo: the first promotion's predecessor was not promoted by build-image
    r = cli("rollback", world.tag, "--history", str(world.history))
    assert r.returncode == 2 and "no promotion" in r.stderr and tag_digest(world.tag) == world.old


@pytest.mark.slow
@pytest.mark.docker
def test_force_needs_a_reason_and_records_it(world):
    r = promote(world, world.new, "--force")
    assert r.returncode == 2 and "--reason" in r.stderr and tag_digest(world.tag) == world.old
    r = promote(world, world.new, "--force", "--reason", "hotfix for CVE-2026-1")
    assert r.returncode == 0, r.stderr
    (e,) = json.loads(world.history.read_text())["entries"]
    assert e["forced"] and e["reason"] == "hotfix for CVE-2026-1" and e["verdict"] is None
    _how, descs = referrers.list_referrers(RegistryClient(world.registry), world.repo, world.new)
    (rec,) = [d for d in descs if "org.build-image.reason" in (d.get("annotations") or {})]
    assert rec["annotations"]["org.build-image.reason"] == "hotfix for CVE-2026-1"
    r = cli("history", world.tag, "--history", str(world.history))
    assert "FORCED: hotfix for CVE-2026-1" in r.stdout


@pytest.mark.slow
@pytest.mark.docker
def test_an_attestation_about_another_digest_is_bad_input(world):
    from builder.serving.attestation import attach_statement
    from builder.signing import load_signer

    other = statement(world.base, world.old)  # a PASS about the old image, signed, attached to the new one
    attach_statement(f"{world.base}@{world.new}", other, load_signer(signing_key()[0]))
    r = promote(world, world.new)
    assert r.returncode == 2, r.stderr
    assert f"its subject is {world.old}, not the image {world.new}" in r.stderr
    assert tag_digest(world.tag) == world.old


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("cut", ["the signed statement", "the envelope"])
def test_a_truncated_statement_in_the_registry_is_bad_input(world, cut):
    from builder import signing
    from builder.image.referrers import INTOTO_TYPE, KIND, attach, subject_descriptor

    client = RegistryClient(world.registry)
    blob = attestation.statement_bytes(statement(world.base, world.new))
    signer = signing.load_signer(signing_key()[0])
    envelope = (
        signing.sign_envelope(blob[:200], signer)
        if cut == "the signed statement"
        else signing.sign_envelope(blob, signer)[:200]
    )
    subject = subject_descriptor(client, world.repo, world.new)
    att = attach(
        client,
        world.repo,
        subject,
        envelope,
        INTOTO_TYPE,
        "x.json",
        {KIND: "smoke-verdict:x"},
        layer_type=signing.ENVELOPE_TYPE,
    )
    r = promote(world, world.new)
    assert r.returncode == 2 and att.digest in r.stderr and "not JSON" in r.stderr, r.stderr
    assert tag_digest(world.tag) == world.old


@pytest.mark.slow
@pytest.mark.docker
def test_bad_input_moves_nothing(world):
    attest(world.registry, world.repo, world.new)
    missing = "sha256:" + "0" * 64
    r = promote(world, missing)
    assert r.returncode == 2 and "does not hold" in r.stderr and missing in r.stderr
    r = cli("rollback", f"{world.base}:nosuchtag", "--history", str(world.history))
    assert r.returncode == 2 and "no cutover history" in r.stderr
    assert promote(world, world.new).returncode == 0
    # a hand-edited history: refused, naming the file; the tag stays
    doc = json.loads(world.history.read_text())
    doc["entries"][0]["from"] = world.new
    world.history.write_text(json.dumps(doc))
    for r in (
        cli("rollback", world.tag, "--history", str(world.history)),
        promote(world, world.old),
        cli("history", world.tag, "--history", str(world.history)),
    ):
        assert r.returncode == 2 and str(world.history) in r.stderr and "edited by hand" in r.stderr, r.stderr
    assert tag_digest(world.tag) == world.new
    # a tag that does not exist (the history is of another tag)
    r = cli("history", f"{world.base}:nosuchtag", "--history", str(world.history))
    assert r.returncode == 2


@pytest.mark.slow
@pytest.mark.docker
def test_credentials_in_the_references_reach_no_output_history_or_annotation(world):
    attest(world.registry, world.repo, world.new)
    secret = "s3cr3tPW"
    r = cli(
        "promote",
        f"deployer:{secret}@{world.base}@{world.new}",
        "--to",
        f"https://deployer:{secret}@{world.tag}",
        "--spec",
        str(world.spec),
        "--history",
        str(world.history),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    assert "credentials in the reference are ignored" in r.stderr
    assert secret not in r.stdout + r.stderr and secret not in world.history.read_text()
    client = RegistryClient(world.registry)
    _how, descs = referrers.list_referrers(client, world.repo, world.new)
    assert secret not in json.dumps(descs)
    for d in descs:
        man = client.request("GET", f"/v2/{world.repo}/manifests/{d['digest']}", {"Accept": referrers.OCI_MANIFEST})[2]
        blob = client.request("GET", f"/v2/{world.repo}/blobs/{json.loads(man)['layers'][0]['digest']}")[2]
        assert secret.encode() not in man + blob
    r = cli("history", f"deployer:{secret}@{world.tag}", "--history", str(world.history))
    assert r.returncode == 0 and secret not in r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.docker
def test_two_promotes_at_once_serialize(world):
    import subprocess

    from tests.fx_cutover import BUILD_IMAGE

    third = push_image(world.tmp, f"{world.base}:other", "third")
    for d in (world.new, third):
        attest(world.registry, world.repo, d)
    procs = [
        subprocess.Popen(
            [
                BUILD_IMAGE,
                "promote",
                f"{world.base}@{d}",
                "--to",
                world.tag,
                "--spec",
                str(world.spec),
                "--history",
                str(world.history),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for d in (world.new, third)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    a, b = json.loads(world.history.read_text())["entries"]
    assert a["from"] == world.old and b["from"] == a["to"] and {a["to"], b["to"]} == {world.new, third}
    assert tag_digest(world.tag) == b["to"]
    assert [e["previous"]["digest"] for e in (a, b)] == [world.old, a["to"]]


# --------------------------------------------------------------------------- history (pure) and the smoke subject


def _e(i, action, frm, to, status="done", **kw):
    return {"id": i, "action": action, "time": "2026-12-06T00:00:00Z", "from": frm, "to": to, "status": status, **kw}


def test_rollback_target_walks_back_one_promotion_at_a_time():
    from builder.serving import history

    a, b, c = ("sha256:" + x * 64 for x in "abc")
    entries = [_e(1, "promote", a, b), _e(2, "promote", b, c)]
    assert history.rollback_target(entries, c)["id"] == 2
    assert history.rollback_target(entries, b) is None  # the tag is not where the last promotion put it
    entries.append(_e(3, "rollback", c, b, undoes=2))
    assert history.rollback_target(entries, b)["id"] == 1
    entries.append(_e(4, "rollback", b, a, undoes=1))
    assert history.rollback_target(entries, a) is None
    # a promotion that did not move the tag is never a rollback target
    assert history.rollback_target([_e(1, "promote", a, b, "not-moved")], a) is None


def test_reconcile_says_where_an_unconfirmed_move_left_the_tag():
    from builder.serving import history

    a, b = ("sha256:" + x * 64 for x in "ab")
    for at, status in ((b, "done"), (a, "not-moved")):
        entries = [_e(1, "promote", a, b, "unconfirmed")]
        assert history.reconcile(entries, at) and entries[0]["status"] == status and entries[0]["tag_at"] == at
    entries = [_e(1, "promote", a, b, "unconfirmed")]
    assert not history.reconcile(entries, "sha256:" + "9" * 64) and entries[0]["status"] == "unconfirmed"


def test_history_file_checksum_catches_any_edit(tmp_path):
    from builder.serving import history

    a, b = ("sha256:" + x * 64 for x in "ab")
    p = tmp_path / "h.json"
    history.save(p, "r/app:prod", [_e(1, "promote", a, b, reason="why")])
    assert history.load(p, "r/app:prod")[0]["reason"] == "why"
    with pytest.raises(BadInput, match="history of 'r/app:prod', not of r/app:dev"):
        history.load(p, "r/app:dev")
    p.write_text(p.read_text().replace('"why"', '"who"'))
    with pytest.raises(BadInput, match="edited by hand"):
        history.load(p, "r/app:prod")
    p.write_text(p.read_text()[:100])
    with pytest.raises(BadInput, match="not JSON"):
        history.load(p, "r/app:prod")


@pytest.mark.slow
@pytest.mark.docker
def test_two_promotions_roll_back_in_order(world):
    third = push_image(world.tmp, f"{world.base}:other", "third")
    for d in (world.new, third):
        attest(world.registry, world.repo, d)
        assert promote(world, d).returncode == 0
    assert tag_digest(world.tag) == third
    for want in (world.new, world.old):
        r = cli("rollback", world.tag, "--history", str(world.history))
        assert r.returncode == 0, r.stderr
        assert tag_digest(world.tag) == want
    # the tag moved outside build-image: rollback refuses (exit 11) instead of guessing
    attest(world.registry, world.repo, third)
    assert promote(world, third).returncode == 0
    push_image(world.tmp, world.tag, "pushed-by-hand")
    r = cli("rollback", world.tag, "--history", str(world.history))
    assert r.returncode == 11 and "moved outside build-image" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.docker
def test_smoke_subject_is_the_registry_digest_of_the_local_image(world):
    from builder.image.registry import client_for

    client, ref = client_for(f"{world.base}@{world.new}")
    cfg = client.config_digest(ref.repository, world.new)
    assert attestation.resolve_subject(f"{world.base}:candidate", cfg) == (world.base, world.new)
    assert attestation.resolve_subject(f"{world.base}@{world.new}", cfg) == (world.base, world.new)
    with pytest.raises(BadInput, match="the verdict must be about the image that runs"):
        attestation.resolve_subject(f"{world.base}:prod", cfg)
    with pytest.raises(BadInput, match="does not hold"):
        attestation.resolve_subject(f"{world.base}:nosuchtag", cfg)


def test_smoke_attest_needs_an_image():
    from click.testing import CliRunner

    from builder import cli as cli_mod

    r = CliRunner().invoke(cli_mod.main, ["smoke", "--local", "--model", "/nonexistent", "--attest"])
    assert r.exit_code == 2 and "--attest binds the verdict to an image digest" in r.output


@pytest.mark.slow
@pytest.mark.docker
def test_the_smoke_commands_attestation_is_what_promote_reads(world, tmp_path, monkeypatch):
    """The command's own attach step (after run_smoke) on a report from a run, with a real checkpoint
    directory: promote then finds a PASS naming that checkpoint's index."""
    import hashlib

    from builder.commands import smoke as smoke_cmd
    from builder.serving.smoke import SmokeConfig
    from builder.serving.smoke import gpu as gpu_mod
    from tests.fx_cutover import smoke_report_obj

    ck = tmp_path / "ckpt"
    ck.mkdir()
    (ck / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    monkeypatch.setattr(gpu_mod, "nvidia_smi_names", lambda: [GPU])  # the one thing only a GPU host has
    rep = smoke_report_obj()
    said = []
    cfg = SmokeConfig(model=str(ck), image=f"{world.base}@{world.new}", checkpoint_check=False)
    from builder.signing import load_signer

    signer = load_signer(signing_key()[0])
    smoke_cmd._attest(rep, cfg, (world.base, world.new), Recorder(said), signer)
    assert said and said[0].startswith(f"attested: PASS attached to {world.base}@{world.new}")
    assert f"signed by {signer.fingerprint}" in said[0]
    verdicts, untrusted = attestation.read_verdicts(RegistryClient(world.registry), world.repo, world.new, _trusted())
    assert untrusted == []
    (v,) = verdicts
    ckp = v.predicate["checkpoint"]
    assert ckp["path"] == str(ck) and ckp["verify"] == "not checked"
    assert ckp["index_sha256"] == hashlib.sha256(b'{"weight_map": {}}').hexdigest()
    assert v.predicate["gpu"] == {"model": GPU, "count": 1, "memory_used_mib_peak": 120000}
    # not READY (the structural check was skipped) and another checkpoint: promote names both
    r = promote(world, world.new)
    assert r.returncode == 1 and "verify result is not checked" in r.stderr and "is not the target's" in r.stderr


@pytest.mark.parametrize(
    "name, codes",
    [
        ("promote", ("0 moved", "1 refused", "2 bad input", "10 registry", "14")),
        ("rollback", ("0 moved back", "2 bad input", "10 registry", "11 the tag", "14")),
        ("history", ("0 listed", "2 bad input", "14")),
        ("smoke", ("0 PASS", "1 FAIL", "2 bad input", "10 registry", "13")),
    ],
)
def test_every_cutover_command_lists_its_exit_codes(name, codes):
    from click.testing import CliRunner

    from builder import cli as cli_mod

    out = " ".join(CliRunner().invoke(cli_mod.main, [name, "--help"], terminal_width=400).output.split())
    assert "Exit codes:" in out and all(c in out for c in codes), out


@pytest.mark.slow
@pytest.mark.docker
def test_a_promote_waits_for_the_run_holding_the_tag(world):
    """Deterministic half of the serialization: while another run holds the tag's history, a promote waits
    (and says so) and moves nothing; once it is released, the promote completes."""
    import subprocess
    import time

    from builder.util import output_lock
    from tests.fx_cutover import BUILD_IMAGE

    attest(world.registry, world.repo, world.new)
    with output_lock(world.history):
        p = subprocess.Popen(
            [
                BUILD_IMAGE,
                "promote",
                f"{world.base}@{world.new}",
                "--to",
                world.tag,
                "--spec",
                str(world.spec),
                "--history",
                str(world.history),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(3)
        assert p.poll() is None and tag_digest(world.tag) == world.old
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "waiting: another build-image run is writing" in err
    assert tag_digest(world.tag) == world.new


@pytest.mark.slow
@pytest.mark.docker
def test_a_target_that_states_no_concurrency_gpu_or_checkpoint_is_bad_input(world):
    attest(world.registry, world.repo, world.new)
    bare = world.tmp / "bare.toml"
    bare.write_text(world.spec.read_text().replace("concurrency = 16\n", "").replace(f'gpu_model = "{GPU}"\n', ""))
    r = promote(world, world.new, spec=bare)
    assert r.returncode == 2 and f"the spec {bare} does not set serving.concurrency, serving.gpu_model," in r.stderr
    assert tag_digest(world.tag) == world.old and not world.history.exists()


@pytest.mark.slow
@pytest.mark.docker
def test_promote_across_repositories_of_one_registry_mounts_the_image(world):
    """The verdict is attached where the image was smoked (the candidate's repository); the deploy tag lives in
    another repository of the same registry."""
    from tests.fx_cutover import unique_repo

    staging = f"{world.registry}/{unique_repo('staging')}"
    cand = push_image(world.tmp, f"{staging}:rc1", "release-candidate")
    attest(world.registry, staging.split("/", 1)[1], cand)
    r = cli(
        "promote", f"{staging}@{cand}", "--to", world.tag, "--spec", str(world.spec), "--history", str(world.history)
    )
    assert r.returncode == 0, r.stderr
    assert tag_digest(world.tag) == cand
    # the deploy repository holds the whole image now (skopeo copies it out of there by digest)
    from tests.fx_cutover import skopeo

    c = skopeo("copy", "--quiet", "--src-tls-verify=false", f"docker://{world.base}@{cand}", f"dir:{world.tmp / 'out'}")
    assert c.returncode == 0, c.stderr
    assert cli("rollback", world.tag, "--history", str(world.history)).returncode == 0
    assert tag_digest(world.tag) == world.old


@pytest.mark.slow
@pytest.mark.docker
def test_a_later_fail_at_the_same_settings_replaces_the_pass(world):
    attest(world.registry, world.repo, world.new)
    attest(world.registry, world.repo, world.new, verdict="FAIL")
    (v,), _ = attestation.read_verdicts(RegistryClient(world.registry), world.repo, world.new, _trusted())
    assert v.predicate["verdict"] == "FAIL"
    r = promote(world, world.new)
    assert r.returncode == 1 and "verdict is FAIL (round 2: 3 of 16 requests failed)" in r.stderr, r.stderr
    assert tag_digest(world.tag) == world.old


@pytest.mark.slow
@pytest.mark.docker
def test_an_output_directory_that_cannot_take_the_manifests_moves_nothing(world):
    attest(world.registry, world.repo, world.new)
    out = world.tmp / "apply"
    out.mkdir()
    (out / "rayservice.yaml").write_text("apiVersion: v1\nkind: ConfigMap  # the user's own file\n")
    r = promote(world, world.new, "-o", str(out))
    assert r.returncode == 2 and "rayservice.yaml exists and is not a KubeRay manifest" in r.stderr, r.stderr
    assert tag_digest(world.tag) == world.old and not world.history.exists()
    assert "the user's own file" in (out / "rayservice.yaml").read_text()
    assert promote(world, world.new, "-o", str(world.tmp / "fresh")).returncode == 0
    r = cli("rollback", world.tag, "--history", str(world.history), "-o", str(out))
    assert r.returncode == 2 and tag_digest(world.tag) == world.new, r.stderr


@pytest.mark.slow
@pytest.mark.docker
def test_a_history_that_cannot_be_written_moves_nothing(world):
    attest(world.registry, world.repo, world.new)
    blocker = world.tmp / "not-a-dir"
    blocker.write_text("x")
    r = cli(
        "promote",
        f"{world.base}@{world.new}",
        "--to",
        world.tag,
        "--spec",
        str(world.spec),
        "--history",
        str(blocker / "h.json"),
    )
    assert r.returncode == 2 and "its folder cannot be made" in r.stderr, r.stderr
    assert tag_digest(world.tag) == world.old
