"""smoke --env: the engine's extra environment (a replayed base without FlashInfer boots vLLM 0.34.0 only with
VLLM_USE_FLASHINFER_SAMPLER=0), given to the container or the local server, and recorded where a reviewer reads
the verdict -- a secret's value never."""

import json

import pytest

from builder.commands.smoke import engine_env
from builder.credentials import redact_env
from builder.errors import BadInput
from builder.serving.attestation import parse_statement, smoke_statement, statement_bytes
from builder.serving.smoke import SmokeConfig
from builder.serving.smoke.runner import settings_of
from builder.serving.smoke.server import build_docker_command
from tests.fx_cutover import smoke_report

DIGEST = "sha256:" + "ab" * 32


def test_env_pairs_are_read_and_bad_ones_refused_naming_them():
    assert engine_env(["VLLM_USE_FLASHINFER_SAMPLER=0", "A_B=x=y", "EMPTY="]) == {
        "VLLM_USE_FLASHINFER_SAMPLER": "0",
        "A_B": "x=y",
        "EMPTY": "",
    }
    assert engine_env(["X=1", "X=1"]) == {"X": "1"}
    for bad, said in (("NOVALUE", "NOVALUE"), ("1X=2", "1X=2"), ("A-B=1", "A-B=1"), ("=1", "=1")):
        with pytest.raises(BadInput, match="NAME=VALUE") as exc:
            engine_env([bad])
        assert said in str(exc.value)
    with pytest.raises(BadInput, match="twice"):
        engine_env(["X=1", "X=2"])
    with pytest.raises(BadInput, match="NUL"):
        engine_env(["X=a\0b"])


def test_a_secrets_value_is_never_shown():
    shown = redact_env(
        {"HF_TOKEN": "hf_abc", "AWS_SECRET_ACCESS_KEY": "s", "API_KEY": "k", "VLLM_X": "1", "KEYS": "k2"}
    )
    assert shown == {
        "API_KEY": "<redacted>",
        "AWS_SECRET_ACCESS_KEY": "<redacted>",
        "HF_TOKEN": "<redacted>",
        "KEYS": "<redacted>",
        "VLLM_X": "1",
    }


def test_the_container_gets_the_env_and_the_report_records_it(tmp_path):
    cfg = SmokeConfig(
        model=str(tmp_path), image="reg/x@" + DIGEST, env={"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_TOKEN": "t"}
    )
    argv = build_docker_command(cfg, 8000, "n", "podman")
    assert argv[argv.index("VLLM_USE_FLASHINFER_SAMPLER=0") - 1] == "-e"
    assert "HF_TOKEN=t" in argv  # the engine needs the value itself
    st = settings_of(cfg)
    assert st["env"] == {"HF_TOKEN": "<redacted>", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    assert "env" not in settings_of(SmokeConfig(model=str(tmp_path)))  # no --env: the settings as before


def test_the_attestation_carries_the_env_and_its_schema_takes_it():
    rep = smoke_report()
    rep["settings"]["env"] = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    ck = {"path": "/m", "size_bytes": 1, "verify": "READY", "index_sha256": "cd" * 32}
    doc = smoke_statement(
        rep,
        name="reg/x",
        digest=DIGEST,
        checkpoint=ck,
        gpu_names=["NVIDIA H100 80GB HBM3"],
        created="2026-12-06T06:40:00Z",
    )
    assert doc["predicate"]["engine_args"]["env"] == {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    v = parse_statement(statement_bytes(doc), where="test", subject_digest=DIGEST)
    assert v.predicate["engine_args"]["env"] == {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    rep["settings"]["env"] = {"X": 5}  # not text: the typed reader refuses it
    bad = smoke_statement(
        rep, name="reg/x", digest=DIGEST, checkpoint=ck, gpu_names=["G"], created="2026-12-06T06:40:00Z"
    )
    with pytest.raises(BadInput):
        parse_statement(json.dumps(bad).encode(), where="test", subject_digest=DIGEST)
