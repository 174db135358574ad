"""The smoke verdict bound to an image digest: an in-toto v1 Statement attached as an OCI referrer.

``smoke IMAGE --attest`` builds the statement from the smoke report (:func:`smoke_statement`, pure: it
needs no GPU to test), and attaches it to the image's manifest the way the SBOM and the provenance are
(:mod:`builder.image.referrers`); a FAIL is attached too, marked ``org.build-image.verdict: FAIL``.
``promote`` reads every verdict attached to a digest (:func:`read_verdicts`), refuses a statement that is
not one build-image could have written (:func:`parse_statement`: wrong subject, truncated, a predicate
missing a field, a blob whose digest is not the one the artifact names), and compares the PASS ones with
the target's ``[serving]`` settings (:func:`mismatches`, pure).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import __version__, signing
from builder.credentials import redact_value
from builder.errors import BadInput, RegistryError
from builder.image import referrers
from builder.image.registry import client_for, config_of
from builder.serving.checkpoint import INDEX_NAME
from builder.util import sha256_file
from builder.validate import load_typed_json, schema_errors

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://build-image.dev/attestation/smoke-verdict/v1"
KIND = "smoke-verdict"  # org.build-image.attestation of the artifact
VERDICT_ANNOTATION = "org.build-image.verdict"
SETTINGS_ANNOTATION = "org.build-image.smoke-settings"  # one verdict per settings: a re-run replaces its own
TITLE = "smoke-verdict.intoto.json"
MAX_STATEMENT_BYTES = 1 << 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


# --------------------------------------------------------------------------- facts gathered on the smoke host


def checkpoint_facts(model: str | os.PathLike, summary: dict[str, Any] | None) -> dict[str, Any]:
    """The checkpoint as the statement records it: path, size on disk (bytes of its files), the structural
    ``checkpoint verify`` result the smoke run got (``summary``: READY, or None when not checked) and the
    sha256 of its safetensors index (the checkpoint's identity ``[serving] checkpoint_sha256`` names)."""
    root = Path(model)
    size, index_sha = None, None
    if root.is_dir():
        size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        index = root / INDEX_NAME
        if not index.is_file():
            found = sorted(root.glob("*.safetensors.index.json"))
            index = found[0] if found else None
        if index is not None:
            index_sha = sha256_file(index)
        elif (root / "model.safetensors").is_file():  # a single-file checkpoint has no index: its file is it
            index_sha = sha256_file(root / "model.safetensors")
    verify = "not checked" if summary is None else ("READY" if summary.get("ready") else "NOT READY")
    return {"path": str(model), "size_bytes": size, "verify": verify, "index_sha256": index_sha}


# --------------------------------------------------------------------------- the statement (pure)


def smoke_statement(
    report: dict[str, Any],
    *,
    name: str,
    digest: str,
    checkpoint: dict[str, Any],
    gpu_names: list[str] | None,
    created: str,
) -> dict[str, Any]:
    """Pure: the in-toto Statement v1 of one smoke run (``report``: ``SmokeReport.to_dict()``) about the image
    ``name@digest``.  The predicate holds what ``promote`` compares and what a reviewer asks of a verdict."""
    if not _DIGEST.match(digest or ""):
        raise BadInput(f"smoke --attest: {digest!r} is not an image digest (sha256:<64 hex>).")
    st = report.get("settings") or {}
    eq = report.get("equivalence")
    rounds_run = [r for r in report.get("rounds") or [] if (r.get("kind") or "completion") == "completion"]
    gpus = report.get("gpu") or {}
    predicate = {
        "verdict": report["verdict"],
        "failures": [str(f)[:500] for f in (report.get("failures") or [])[:10]],
        "load": {
            "rounds": st.get("rounds"),
            "concurrency": st.get("concurrency"),
            "rounds_completed": sum(1 for r in rounds_run if not r.get("failed")),
            "prompt_tokens": st.get("prompt_tokens"),
            "max_tokens": st.get("max_tokens"),
        },
        "engine_args": {
            "max_model_len": st.get("max_model_len"),
            "tensor_parallel_size": st.get("tp"),
            "pipeline_parallel_size": st.get("pp"),
            "max_num_seqs": st.get("max_num_seqs"),
            "gpu_memory_utilization": st.get("gpu_memory_utilization"),
            "kv_cache_dtype": st.get("kv_cache_dtype"),
            "extra_args": list(st.get("extra_args") or []),
            **({"env": dict(st["env"])} if st.get("env") else {}),
        },
        "gpu": {
            "model": gpu_names[0] if gpu_names else None,
            "count": len(gpu_names) if gpu_names else gpus.get("gpus"),
            "memory_used_mib_peak": gpus.get("memory_used_mib_peak"),
        },
        "checkpoint": dict(checkpoint),
        "equivalence": None
        if not eq
        else {
            "verdict": eq.get("verdict"),
            "max_abs_dlogprob": eq.get("max_abs_dlogprob"),
            "first_diff": eq.get("first_diff"),
        },
        "engine": report.get("engine"),
        "smoke": {
            "mode": report.get("mode"),
            "serve": bool(st.get("serve")),
            "created": created,
            "tool": f"build-image {__version__}",
        },
    }
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": digest.split(":", 1)[1]}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }


def settings_key(predicate: dict[str, Any]) -> str:
    """Pure: what identifies a smoke configuration (a newer verdict at the same one replaces the older)."""
    load, args, gpu = predicate["load"], predicate["engine_args"], predicate["gpu"]
    return (
        f"c{load['concurrency']}-r{load['rounds']}-len{args['max_model_len']}-tp{args['tensor_parallel_size']}"
        f"-{(gpu['model'] or '-').replace(' ', '_')}-{(predicate['checkpoint']['index_sha256'] or '-')[:12]}"
    )


def statement_bytes(doc: dict[str, Any]) -> bytes:
    """The statement as attached: compact JSON, every string redacted (no credential in any value)."""
    return json.dumps(redact_value(doc), separators=(",", ":"), ensure_ascii=True).encode()


# --------------------------------------------------------------------------- reading one back (pure)

#: JSON Schema pieces (draft 2020-12) of what ``smoke --attest`` writes; every number is bounded, so no
#: reader after :func:`parse_statement` meets a value of another type or an integer too large to format.
_COUNT = {"type": "integer", "minimum": 0, "maximum": 2**31}
_POSITIVE = {"type": "integer", "minimum": 1, "maximum": 2**31}
_SIZE = {"type": "integer", "minimum": 0, "maximum": 2**62}
_REAL = {"type": "number", "minimum": -1e15, "maximum": 1e15}
_TEXT = {"type": "string", "maxLength": 4096}
_HEX64 = {"type": "string", "pattern": "^[0-9a-f]{64}$"}


def _obj(props: dict[str, Any], required: list[str] | None = None, *, nullable: bool = False) -> dict[str, Any]:
    """An object with exactly ``props`` (every one required unless ``required`` says which), nothing else."""
    return {
        "type": ["object", "null"] if nullable else "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [{"type": "null"}, schema]}


PREDICATE_SCHEMA: dict[str, Any] = _obj(
    {
        "verdict": {"enum": ["PASS", "FAIL"]},
        "failures": {"type": "array", "maxItems": 100, "items": _TEXT},
        "load": _obj(
            {
                "rounds": _POSITIVE,
                "concurrency": _POSITIVE,
                "rounds_completed": _COUNT,
                "prompt_tokens": _COUNT,
                "max_tokens": _COUNT,
            }
        ),
        "engine_args": _obj(
            {
                "max_model_len": _or_null(_POSITIVE),
                "tensor_parallel_size": _POSITIVE,
                "pipeline_parallel_size": _POSITIVE,
                "max_num_seqs": _or_null(_POSITIVE),
                "gpu_memory_utilization": _or_null(_REAL),
                "kv_cache_dtype": _or_null(_TEXT),
                "extra_args": {"type": "array", "maxItems": 1000, "items": _TEXT},
                "env": {"type": "object", "maxProperties": 200, "additionalProperties": _TEXT},
            },
            ["max_model_len", "tensor_parallel_size", "pipeline_parallel_size"],
        ),
        "gpu": _obj(
            {"model": _or_null(_TEXT), "count": _or_null(_COUNT), "memory_used_mib_peak": _or_null(_REAL)},
            ["model", "count"],
        ),
        "checkpoint": _obj(
            {"path": _TEXT, "size_bytes": _or_null(_SIZE), "verify": _TEXT, "index_sha256": _or_null(_HEX64)}
        ),
        "equivalence": _obj(
            {"verdict": _or_null(_TEXT), "max_abs_dlogprob": _or_null(_REAL), "first_diff": _or_null(_COUNT)},
            ["verdict"],
            nullable=True,
        ),
        "engine": {
            "type": ["object", "null"],
            "maxProperties": 100,
            "additionalProperties": {"anyOf": [_TEXT, _REAL]},
        },
        "smoke": _obj(
            {"mode": _or_null(_TEXT), "serve": {"type": "boolean"}, "created": _TEXT, "tool": _TEXT}, ["created"]
        ),
    }
)

#: The whole statement: in-toto Statement v1's envelope around :data:`PREDICATE_SCHEMA` (the in-toto
#: package then checks what is in-toto's own: ``_type`` and the subject's form).
STATEMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "_type": {"type": "string", "maxLength": 200},
        "subject": {
            "type": "array",
            "minItems": 1,
            "maxItems": 100,
            "items": {
                "type": "object",
                "properties": {"name": _TEXT, "digest": {"type": "object", "properties": {"sha256": _HEX64}}},
                "required": ["digest"],
            },
        },
        "predicateType": {"const": PREDICATE_TYPE},
        "predicate": PREDICATE_SCHEMA,
    },
    "required": ["_type", "subject", "predicateType", "predicate"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Verdict:
    """One smoke attestation read back from the registry, checked."""

    artifact: str  # the artifact manifest's digest (how a refusal names it)
    subject: str  # sha256:<hex> of the image it is about
    predicate: dict[str, Any]
    signers: tuple[str, ...] = ()  # fingerprints of the trusted keys whose DSSE signature verified

    @property
    def passed(self) -> bool:
        return self.predicate["verdict"] == "PASS"

    def summary(self) -> str:
        p = self.predicate
        ck, args = p["checkpoint"], p["engine_args"]
        return (
            f"{p['verdict']} at {p['load']['rounds']} x {p['load']['concurrency']} concurrent "
            f"({p['load']['prompt_tokens']}+{p['load']['max_tokens']} tokens), max-model-len "
            f"{args['max_model_len'] or 'model default'}, TP {args['tensor_parallel_size']}, "
            f"{p['gpu']['count'] or '?'} x {p['gpu']['model'] or 'unknown GPU'}, checkpoint {ck['path']} "
            f"(index sha256 {(ck['index_sha256'] or 'none')[:12]}…, {ck['verify']})"
        )


def parse_statement(blob: bytes, *, where: str, subject_digest: str) -> Verdict:
    """The statement in ``blob`` checked as one ``smoke --attest`` writes about ``subject_digest``: JSON, an in-toto
    Statement v1 (by the in-toto-attestation package's own validation), this predicate type, every predicate
    field present and typed, and a subject naming exactly that digest.  Anything else is BadInput naming
    ``where`` (the artifact) and what is wrong."""
    import google.protobuf.json_format as jf
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.statement import Statement

    def bad(why: str) -> BadInput:
        return BadInput(
            f"smoke attestation {where} is not a valid statement: {why}; nothing was moved.",
            hint="re-run `build-image smoke IMAGE --attest` to attach a verdict build-image wrote.",
        )

    if len(blob) > MAX_STATEMENT_BYTES:
        raise bad(f"it is {len(blob)} bytes, more than a statement can be")
    try:
        doc = load_typed_json(blob, "it", STATEMENT_SCHEMA)
    except BadInput as exc:
        raise bad(exc.message.rstrip(".")) from None
    try:
        Statement.copy_from_pb(jf.ParseDict(doc, statement_pb2.Statement())).validate()
    except (jf.ParseError, ValueError, TypeError, OverflowError) as exc:
        raise bad(f"in-toto: {str(exc)[:300]}") from None
    subjects = [s["digest"].get("sha256") for s in doc["subject"]]
    if subjects != [subject_digest.split(":", 1)[1]]:
        shown = ", ".join(f"sha256:{s}" for s in subjects if isinstance(s, str)) or "no digest"
        raise bad(f"its subject is {shown}, not the image {subject_digest}")
    pred = doc["predicate"]
    return Verdict(artifact=where, subject=subject_digest, predicate=pred)


# --------------------------------------------------------------------------- matching the target (pure)


@dataclass(frozen=True)
class Target:
    """What the deploy target's ``[serving]`` settings require of a verdict."""

    concurrency: int | None
    max_model_len: int | None
    tp: int
    gpu_model: str | None
    checkpoint_sha256: str | None

    @classmethod
    def from_spec(cls, spec) -> Target:
        s = spec.serving
        return cls(
            concurrency=getattr(s, "concurrency", None),
            max_model_len=s.max_model_len,
            tp=s.tp,
            gpu_model=getattr(s, "gpu_model", None),
            checkpoint_sha256=getattr(s, "checkpoint_sha256", None),
        )

    def unstated(self) -> list[str]:
        """The settings a promote needs that the spec does not state."""
        return [
            f"serving.{k}"
            for k, v in (
                ("concurrency", self.concurrency),
                ("gpu_model", self.gpu_model),
                ("checkpoint_sha256", self.checkpoint_sha256),
            )
            if v is None
        ]


def mismatches(v: Verdict, t: Target) -> list[str]:
    """Pure: why verdict ``v`` does not clear target ``t`` ([] when it does)."""
    p = v.predicate
    out = []
    if not v.passed:
        out.append(f"verdict is {p['verdict']}" + (f" ({p['failures'][0][:120]})" if p["failures"] else ""))
    load, args, ck = p["load"], p["engine_args"], p["checkpoint"]
    if load["rounds_completed"] < load["rounds"]:
        out.append(f"only {load['rounds_completed']} of {load['rounds']} rounds completed")
    if t.concurrency is not None and load["concurrency"] < t.concurrency:
        out.append(f"concurrency {load['concurrency']} < the target's {t.concurrency}")
    if args["max_model_len"] != t.max_model_len:
        out.append(
            f"max-model-len {args['max_model_len'] or 'model default'} != the target's "
            f"{t.max_model_len or 'model default'}"
        )
    if args["tensor_parallel_size"] != t.tp:
        out.append(f"tensor-parallel size {args['tensor_parallel_size']} != the target's {t.tp}")
    # compared as written, as the admission policies compare it (builder/serving/admission.py): what promote
    # admits, the cluster admits
    if t.gpu_model is not None and p["gpu"]["model"] != t.gpu_model:
        out.append(f"GPU model {p['gpu']['model'] or 'unknown'!r} != the target's {t.gpu_model!r}")
    if t.checkpoint_sha256 is not None and ck["index_sha256"] != t.checkpoint_sha256:
        out.append(
            f"checkpoint {ck['path']} (index sha256 {(ck['index_sha256'] or 'none')[:12]}…) is not the "
            f"target's (index sha256 {t.checkpoint_sha256[:12]}…)"
        )
    if ck["verify"] != "READY":
        out.append(f"checkpoint verify result is {ck['verify']}")
    eq = p.get("equivalence")
    if eq and eq.get("verdict") != "PASS":
        out.append(f"output-equivalence gate {eq.get('verdict')}")
    return out


# --------------------------------------------------------------------------- the registry side


def resolve_subject(image: str, local_id: str | None) -> tuple[str, str]:
    """(``HOST/REPO``, ``sha256:…``) of the image a smoke run boots: its digest as given, or its tag's digest in
    the registry; either way the registry's image must be the local one the run boots (``local_id``, the
    engine's image ID = the config digest), or the verdict would be bound to another image."""
    client, ref = client_for(image)
    if ref.registry == "docker.io" and "/" not in image.split("@")[0].split(":")[0]:
        raise BadInput(
            f"smoke --attest: {image} has no registry host; the verdict is attached in the registry "
            "the image is pushed to (HOST[:PORT]/REPO@sha256:… or HOST[:PORT]/REPO:TAG)."
        )
    name = f"{ref.registry}/{ref.repository}"
    client.ping()
    got = client.manifest(ref.repository, ref.digest or ref.tag or "latest")
    if got is None:
        raise BadInput(
            f"smoke --attest: the registry {ref.registry} does not hold {image}; push it first "
            "(`build-image push`), the verdict is attached to its digest there."
        )
    digest, doc = got
    if ref.digest and digest != ref.digest:
        raise RegistryError(f"registry {ref.registry} served {image} as {digest}.")
    if local_id is not None and config_of(doc) != local_id:
        raise BadInput(
            f"smoke --attest: {image} in the registry is image {config_of(doc) or 'an index'}, the local "
            f"engine's is {local_id}; the verdict must be about the image that runs.",
            hint="push the local image, or pull the registry's by digest first.",
        )
    return name, digest


SIGNER_ANNOTATION = referrers.SIGNER_ANNOTATION


def attach_statement(pinned: str, doc: dict[str, Any], signer: signing.Signer | None = None) -> referrers.Attached:
    """Attach the statement to ``HOST/REPO@sha256:…`` as an in-toto referrer; a newer verdict at the same
    settings replaces the older one in the referrers index, other settings' verdicts stay.  With ``signer``
    the layer is the statement's DSSE envelope (``application/vnd.dsse.envelope.v1+json``), and the same
    envelope is added to the digest's cosign attestation image (``sha256-<hex>.att``), where ``cosign
    verify-attestation --key`` and Kyverno find it."""
    client, ref = client_for(pinned)
    client.ping()
    subject = referrers.subject_descriptor(client, ref.repository, ref.digest)
    pred = doc["predicate"]
    ann = {
        referrers.KIND: f"{KIND}:{settings_key(pred)}",
        VERDICT_ANNOTATION: pred["verdict"],
        SETTINGS_ANNOTATION: settings_key(pred),
        "org.opencontainers.image.created": pred["smoke"]["created"],
    }
    blob = statement_bytes(doc)
    if signer is None:
        return referrers.attach(client, ref.repository, subject, blob, referrers.INTOTO_TYPE, TITLE, ann)
    envelope = signing.sign_envelope(blob, signer)
    ann[SIGNER_ANNOTATION] = signer.fingerprint
    layer_ann = {"predicateType": PREDICATE_TYPE, referrers.COSIGN_SIGNATURE: ""}
    att = referrers.attach(
        client,
        ref.repository,
        subject,
        envelope,
        referrers.INTOTO_TYPE,
        TITLE,
        ann,
        layer_type=signing.ENVELOPE_TYPE,
        layer_annotations=layer_ann,
    )
    referrers.attach_cosign_attestation(
        client,
        ref.repository,
        ref.digest,
        envelope,
        {"predicateType": PREDICATE_TYPE, SETTINGS_ANNOTATION: settings_key(pred)},
        replaces=(SETTINGS_ANNOTATION, settings_key(pred)),
    )
    return att


def referrer_descriptors(client, repository: str, digest: str) -> list[dict]:
    """The descriptors of every referrer of ``repository@digest`` (the referrers API or the referrers tag),
    each an OCI descriptor by :data:`referrers.REFERRERS_SCHEMA`; anything else is BadInput naming it."""
    where = f"the referrers of {client.registry}/{repository}@{digest}"
    try:
        _how, descs = referrers.list_referrers(client, repository, digest)
    except (ValueError, AttributeError):
        descs = None
    errs = schema_errors(descs, referrers.REFERRERS_SCHEMA)
    if errs:
        raise BadInput(
            f"{where} are not an OCI image index (the {referrers.referrers_tag(digest)} tag or the referrers "
            f"API answer): {'; '.join(errs)}; nothing was moved."
        )
    return descs


def fetch_artifact(client, repository: str, artifact: str, subject: str, where: str) -> tuple[dict, bytes]:
    """(the artifact manifest, its first layer's bytes) of the referrer ``repository@artifact``: both fetched
    by digest and verified, the manifest read by :data:`referrers.ARTIFACT_SCHEMA` and referring to
    ``subject``.  Anything else is BadInput naming ``where``."""
    manifest = fetch_verified(client, repository, artifact, where, accept=referrers.OCI_MANIFEST)
    try:
        doc = load_typed_json(manifest, f"the artifact manifest of {where}", referrers.ARTIFACT_SCHEMA)
    except BadInput as exc:
        raise BadInput(f"{exc.message.rstrip('.')}; nothing was moved.") from None
    if doc["subject"]["digest"] != subject:
        raise BadInput(
            f"{where} is indexed for {subject} but its artifact refers to {doc['subject']['digest']}; "
            "nothing was moved."
        )
    return doc, fetch_verified(client, repository, doc["layers"][0]["digest"], where, blob=True)


def read_verdicts(client, repository: str, digest: str, trusted: dict[str, Any]) -> tuple[list[Verdict], list[str]]:
    """(the verdicts attached to ``repository@digest`` that a key in ``trusted`` signed, why each other one
    does not count).  Each artifact and blob is verified by digest; a signed one's DSSE envelope is checked
    against every trusted key before its statement is read by :func:`parse_statement` (a bad one is BadInput
    naming its artifact); an unsigned statement, or one no trusted key signed, is never read as a verdict."""
    out, untrusted = [], []
    for d in referrer_descriptors(client, repository, digest):
        ann = d.get("annotations") or {}
        if not ann.get(referrers.KIND, "").startswith(KIND):
            continue
        where = f"smoke attestation {client.registry}/{repository}@{d['digest']}"
        doc, blob = fetch_artifact(client, repository, d["digest"], digest, where)
        short = f"{d['digest'][:19]}… ({ann.get(VERDICT_ANNOTATION, '?')})"
        if doc["layers"][0]["mediaType"] != signing.ENVELOPE_TYPE:
            untrusted.append(f"{short}: unsigned")
            continue
        opened = signing.open_envelope(blob, where, trusted)
        if not opened.signers:
            claim = ann.get(SIGNER_ANNOTATION)
            untrusted.append(
                f"{short}: {opened.signatures} signature(s), none by a trusted key"
                + (f" (it names signer {claim[:80]})" if claim else "")
            )
            continue
        v = parse_statement(opened.payload, where=where.removeprefix("smoke attestation "), subject_digest=digest)
        if ann.get(VERDICT_ANNOTATION) not in (None, v.predicate["verdict"]):
            raise BadInput(
                f"{where}: its annotation says {ann.get(VERDICT_ANNOTATION)}, the "
                f"statement says {v.predicate['verdict']}; nothing was moved."
            )
        out.append(Verdict(v.artifact, v.subject, v.predicate, opened.signers))
    return out, untrusted


def fetch_verified(
    client, repository: str, digest: Any, where: str, *, blob: bool = False, accept: str | None = None
) -> bytes:
    """A manifest or blob by digest, its content hashed and compared with the digest (exit 2 otherwise)."""
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise BadInput(f"{where}: names {digest!r:.80}, not a sha256 digest; nothing was moved.")
    kind = "blobs" if blob else "manifests"
    status, _h, body = client.request(
        "GET", f"/v2/{repository}/{kind}/{digest}", {"Accept": accept} if accept else None
    )
    if status == 404:
        raise BadInput(f"{where}: the registry {client.registry} does not hold {digest}; nothing was moved.")
    if status != 200:
        raise RegistryError(f"registry {client.registry}: GET {repository} {kind} {digest} answered HTTP {status}.")
    if referrers.digest_of(body) != digest:
        raise BadInput(
            f"{where}: the registry served {digest} with content of digest {referrers.digest_of(body)} "
            "(truncated or replaced); nothing was moved."
        )
    return body
