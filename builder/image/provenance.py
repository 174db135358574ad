"""Build provenance: an in-toto Statement v1 with a SLSA Provenance v1 predicate.

``render`` writes ``provenance.intoto.json`` into the build context: the inputs of the
build (the lock and its hash, the base manifest's sha256, the base image by digest, every
locked wheel by URL and sha256, the patch series with each patch's sha256 and the vllm
wheel it is made for, the Dockerfile template's sha256, the tool version), the builder,
and as subject the files render produced (Dockerfile, sbom.cdx.json, pylock.toml).
``build`` rewrites it with the image (its ID, under each tag) as the subject and
``push`` with the registry's manifest digest: the statement then names what a registry
serves.  :func:`statement` is a pure function; nothing host-specific (no paths, users,
credentials) goes into it.  The builder id comes from ``BUILD_IMAGE_BUILDER_ID``, else
the GitHub Actions workflow (``GITHUB_SERVER_URL``/``GITHUB_WORKFLOW_REF``), else a local id.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from builder import __version__
from builder.credentials import redact_url
from builder.image.naming import PROVENANCE_FILE, choose_installer, default_repo, image_tags
from builder.report import render_json
from builder.util import atomic_write_text, sha256_bytes
from builder.validate import load_json

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:build-image:build-type:container-image:v1"
LOCAL_BUILDER = "urn:build-image:builder:local"
MEDIA_TYPE = "application/vnd.in-toto+json"


@dataclass
class ProvenanceInput:
    vllm: str
    repository: str
    tags: list[str]
    lock_hash: str
    lock_sha256: str  # of the requirements.lock text in the context
    base_ref: str | None
    base_digest: str | None
    base_manifest_sha256: str
    overlay: list[str]
    allow_abi_change: dict[str, str]
    wheels: list[tuple[str, str, str]]  # (name==version, url, sha256)
    patches: list[tuple[str, str]]  # (name, sha256), series order
    patched_files: list[tuple[str, str]]  # (relpath, sha256 after the series)
    vllm_wheel: tuple[str, str] | None  # (file name, sha256)
    template_sha256: str
    installer: str
    source_date_epoch: int
    outputs: dict[str, str] = field(default_factory=dict)  # file name -> sha256 (render's subject)
    allow_base_drift: bool = False
    base_manifest_source: str | None = None  # the pipeline's snapshot of the base, when it replaced the manifest


def builder_id(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    if env.get("BUILD_IMAGE_BUILDER_ID"):
        return env["BUILD_IMAGE_BUILDER_ID"]
    if env.get("GITHUB_WORKFLOW_REF"):
        return f"{env.get('GITHUB_SERVER_URL', 'https://github.com')}/{env['GITHUB_WORKFLOW_REF']}"
    return LOCAL_BUILDER


def invocation_id(env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    if env.get("GITHUB_RUN_ID") and env.get("GITHUB_REPOSITORY"):
        attempt = env.get("GITHUB_RUN_ATTEMPT", "1")
        return (
            f"{env.get('GITHUB_SERVER_URL', 'https://github.com')}/{env['GITHUB_REPOSITORY']}"
            f"/actions/runs/{env['GITHUB_RUN_ID']}/attempts/{attempt}"
        )
    return None


def _hex(digest: str) -> str:
    return digest.split(":", 1)[1] if ":" in digest else digest


def statement(
    inp: ProvenanceInput,
    subject: list[dict] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    started: str | None = None,
    finished: str | None = None,
) -> dict:
    """The in-toto statement (pure given ``env`` and the times)."""
    deps: list[dict] = []
    if inp.base_ref:
        base = {"uri": f"oci://{inp.base_ref.split('@')[0]}", "annotations": {"role": "base-image"}}
        if inp.base_digest:
            base["digest"] = {"sha256": _hex(inp.base_digest)}
        deps.append(base)
    deps.append(
        {"name": "requirements.lock", "digest": {"sha256": inp.lock_sha256}, "annotations": {"lockHash": inp.lock_hash}}
    )
    manifest_dep: dict = {"name": "base-manifest", "digest": {"sha256": inp.base_manifest_sha256}}
    if inp.base_manifest_source:
        manifest_dep["annotations"] = {"source": inp.base_manifest_source}
    deps.append(manifest_dep)
    deps.append({"name": "templates/Dockerfile.j2", "digest": {"sha256": inp.template_sha256}})
    for name, sha in inp.patches:
        deps.append(
            {"name": f"patches/vllm/{inp.vllm}/{name}", "digest": {"sha256": sha}, "annotations": {"role": "patch"}}
        )
    if inp.vllm_wheel:
        fname, sha = inp.vllm_wheel
        deps.append({"name": fname, "digest": {"sha256": sha}, "annotations": {"role": "patched-wheel"}})
    for req, url, sha in inp.wheels:  # a local file:// wheel (--find-links DIR) is named, not located
        deps.append(
            {
                **({"uri": redact_url(url)} if not url.startswith("file:") else {}),
                "name": req,
                "digest": {"sha256": sha},
            }
        )
    metadata: dict = {}
    inv = invocation_id(env)
    if inv:
        metadata["invocationId"] = inv
    if started:
        metadata["startedOn"] = started
    if finished:
        metadata["finishedOn"] = finished
    run: dict = {"builder": {"id": builder_id(env), "version": {"build-image": __version__}}}
    if metadata:
        run["metadata"] = metadata
    run["byproducts"] = [{"name": n, "digest": {"sha256": d}} for n, d in sorted(inp.outputs.items())]
    if subject is None:
        subject = [{"name": n, "digest": {"sha256": d}} for n, d in sorted(inp.outputs.items())]
    return {
        "_type": STATEMENT_TYPE,
        "subject": subject,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "vllm": inp.vllm,
                    "repository": inp.repository,
                    "tags": list(inp.tags),
                    "overlay": list(inp.overlay),
                    "allowAbiChange": dict(sorted(inp.allow_abi_change.items())),
                    "allowBaseDrift": bool(inp.allow_base_drift),
                },
                "internalParameters": {
                    "tool": f"build-image {__version__}",
                    "templateSha256": inp.template_sha256,
                    "installer": inp.installer,
                    "sourceDateEpoch": int(inp.source_date_epoch),
                    "patchedFiles": [{"path": p, "sha256": s} for p, s in inp.patched_files],
                },
                "resolvedDependencies": deps,
            },
            "runDetails": run,
        },
    }


def image_subject(tags: list[str], digest: str) -> list[dict]:
    """Subject entries naming ``digest`` under each tag's repository (one per repository)."""
    out, seen = [], set()
    for t in tags:
        name = t.rsplit(":", 1)[0] if ":" in t.rsplit("/", 1)[-1] else t
        if name not in seen:
            seen.add(name)
            out.append({"name": name, "digest": {"sha256": _hex(digest)}})
    return out


def now_iso() -> str:
    return _dt.datetime.now(tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def dumps(doc: dict) -> str:
    """The statement's text, through the one JSON writer (redacted: no credential in any value)."""
    return render_json(doc, ensure_ascii=True)


def validate(doc: dict) -> list[str]:
    """Errors of ``doc`` as an in-toto Statement v1 with a SLSA Provenance v1 predicate, by the
    in-toto attestation framework's own bindings (``in-toto-attestation``: its protobuf messages
    reject unknown or mistyped fields; its validators check the required ones); [] when valid."""
    import google.protobuf.json_format as jf
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
    from in_toto_attestation.v1.statement import Statement

    errs = []
    try:
        st = Statement.copy_from_pb(jf.ParseDict(doc, statement_pb2.Statement()))
        st.validate()
    except (jf.ParseError, ValueError, TypeError) as exc:
        errs.append(f"statement: {exc}")
    if doc.get("predicateType") != PREDICATE_TYPE:
        errs.append(f"predicateType is {doc.get('predicateType')!r}, not {PREDICATE_TYPE}")
    try:
        prov = jf.ParseDict(doc.get("predicate") or {}, provenance_pb2.Provenance())
    except (jf.ParseError, TypeError) as exc:
        return errs + [f"predicate: {exc}"]
    if not prov.build_definition.build_type:
        errs.append("predicate.buildDefinition.buildType is required")
    if not prov.build_definition.HasField("external_parameters"):
        errs.append("predicate.buildDefinition.externalParameters is required")
    if not prov.run_details.builder.id:
        errs.append("predicate.runDetails.builder.id is required")
    for i, rd in enumerate(prov.build_definition.resolved_dependencies):
        try:
            ResourceDescriptor.copy_from_pb(rd).validate()
        except ValueError as exc:
            errs.append(f"resolvedDependencies[{i}]: {exc}")
    return errs


def for_render(plan, *, lock_text: str, outputs: Mapping[str, str], template_text: str) -> dict:
    """The statement render writes: ``plan`` is the :class:`~builder.image.render.RenderPlan`,
    ``outputs`` the files render produced (name -> text), the subject until build/push."""
    lock = plan.lock
    repo = plan.repo or default_repo()
    inp = ProvenanceInput(
        vllm=plan.vllm,
        repository=repo,
        tags=image_tags(repo, plan.vllm, lock.lock_hash),
        lock_hash=lock.lock_hash,
        lock_sha256=sha256_text(lock_text),
        base_ref=plan.base.image_ref,
        base_digest=plan.base.image_digest,
        base_manifest_sha256=lock.header.get("base-manifest-sha256", ""),
        overlay=list(lock.overlay),
        allow_abi_change=dict(lock.allow_abi_change),
        wheels=[
            (f"{e.name}=={e.version}", e.wheel.url, e.wheel.sha256)
            for e in sorted(lock.entries, key=lambda e: e.key)
            if e.wheel is not None
        ],
        patches=[(n, sha256_text(plan.patch_texts[n])) for n in plan.patches if n in plan.patch_texts],
        patched_files=[(p.relpath, p.patched_sha256) for p in sorted(plan.patched, key=lambda p: p.relpath)],
        vllm_wheel=plan.vllm_wheel,
        template_sha256=sha256_text(template_text),
        installer=choose_installer(plan.base),
        source_date_epoch=plan.source_date_epoch,
        outputs={n: sha256_text(t) for n, t in outputs.items()},
        allow_base_drift=plan.allow_base_drift,
        base_manifest_source=plan.base_note,
    )
    return statement(inp)


# ---------------------------------------------------------------- the context's file (side effects)


def write(context: str | Path, doc: dict) -> Path:
    path = Path(context) / PROVENANCE_FILE
    atomic_write_text(path, dumps(doc))
    return path


def load(context: str | Path) -> dict | None:
    path = Path(context) / PROVENANCE_FILE
    try:
        return load_json(path.read_text(encoding="utf-8"), str(path), error=ValueError)
    except (OSError, ValueError):
        return None


def record_subject(context: str | Path, subject: list[dict], *, stage: str) -> dict | None:
    """Rewrite the context's statement with ``subject`` (after build / push); None when the
    context has no statement (rendered by an older tool)."""
    doc = load(context)
    if doc is None:
        return None
    doc["subject"] = subject
    run = doc["predicate"].setdefault("runDetails", {})
    meta = run.setdefault("metadata", {})
    meta["finishedOn"] = now_iso()
    run.setdefault("byproducts", [])
    doc["predicate"]["buildDefinition"].setdefault("internalParameters", {})["stage"] = stage
    write(context, doc)
    return doc


def sha256_text(text: str) -> str:
    return sha256_bytes(text.encode("utf-8"))
