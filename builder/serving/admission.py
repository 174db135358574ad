"""Admission policies that let a cluster run only an image with a signed smoke PASS at the target's settings.

``promote -o DIR`` writes two policies beside the KubeRay manifests, both from one list of conditions
(:func:`conditions`, the same ones :func:`builder.serving.attestation.mismatches` applies):

* ``policy-kyverno.yaml``: a Kyverno ``ClusterPolicy`` (kyverno.io/v1) whose ``verifyImages`` rule, for the
  repository's images, requires an attestation of the smoke-verdict predicate type signed by one of the
  trusted keys (``publicKeys``; no transparency log: the key is the trust) and whose ``conditions`` hold on
  the statement's predicate;
* ``policy-sigstore.yaml``: a Sigstore policy-controller ``ClusterImagePolicy`` (policy.sigstore.dev
  v1alpha1) with one ``key`` authority per trusted key and a CUE policy over the statement.

Kyverno and the policy-controller read the attestation where cosign stores it (``sha256-<hex>.att``, see
:func:`builder.image.referrers.attach_cosign_attestation`) and verify the DSSE signature before they read
the statement.  :func:`kyverno_admits` and :func:`cip_admits` are a local evaluator of exactly what these
two documents say -- the keys, the predicate type, the subject and each condition, read back from the
written policy -- so the tests check that a policy admits and refuses the same statements ``promote`` does.
Two conditions are narrower in the cluster than in ``promote``: the GPU model is compared as written
(promote ignores case and spacing), and an unset ``max_model_len`` adds no condition.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

from builder import signing
from builder.errors import BadInput
from builder.serving.attestation import PREDICATE_TYPE, Target
from builder.util import GENERATED_MARK

KYVERNO_FILE = "policy-kyverno.yaml"
SIGSTORE_FILE = "policy-sigstore.yaml"
POLICY_FILES = (KYVERNO_FILE, SIGSTORE_FILE)
_OPS = {"Equals": "==", "GreaterThanOrEquals": ">="}


@dataclass(frozen=True)
class Condition:
    """One requirement on the statement's predicate: ``path`` (dotted) ``op`` (Equals, GreaterThanOrEquals)
    ``value``."""

    path: str
    op: str
    value: Any


def conditions(target: Target) -> list[Condition]:
    """Pure: what the target requires of a verdict, as the policies state it."""
    out = [Condition("verdict", "Equals", "PASS"), Condition("checkpoint.verify", "Equals", "READY")]
    if target.concurrency is not None:
        out.append(Condition("load.concurrency", "GreaterThanOrEquals", target.concurrency))
    if target.max_model_len is not None:
        out.append(Condition("engine_args.max_model_len", "Equals", target.max_model_len))
    out.append(Condition("engine_args.tensor_parallel_size", "Equals", target.tp))
    if target.gpu_model is not None:
        out.append(Condition("gpu.model", "Equals", target.gpu_model))
    if target.checkpoint_sha256 is not None:
        out.append(Condition("checkpoint.index_sha256", "Equals", target.checkpoint_sha256))
    return out


def _name(repository: str, tag: str) -> str:
    """A DNS-1123 name for the policy of one repository and tag."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{repository}-{tag}".lower()).strip("-")
    return f"build-image-verdict-{slug}"[:63].rstrip("-")


def kyverno_policy(image_glob: str, name: str, keys: dict[str, Any], target: Target) -> dict:
    """Pure: the Kyverno ClusterPolicy (see the module docstring)."""
    entries = [
        {"keys": {"publicKeys": signing.public_pem(k), "rekor": {"ignoreTlog": True}, "ctlog": {"ignoreSCT": True}}}
        for k in keys.values()
    ]
    conds = [
        {
            "key": "{{ " + c.path + " }}",
            "operator": c.op,
            "value": c.value,
            "message": f"{c.path} {_OPS[c.op]} {c.value}",
        }
        for c in conditions(target)
    ]
    return {
        "apiVersion": "kyverno.io/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": name, "annotations": {"build-image/trusted-keys": ", ".join(keys)}},
        "spec": {
            "background": False,
            "webhookTimeoutSeconds": 30,
            "rules": [
                {
                    "name": "signed-smoke-pass",
                    "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                    "verifyImages": [
                        {
                            "imageReferences": [image_glob],
                            "failureAction": "Enforce",
                            "required": True,
                            "verifyDigest": True,
                            "mutateDigest": False,
                            "attestations": [
                                {
                                    "predicateType": PREDICATE_TYPE,
                                    "attestors": [{"count": 1, "entries": entries}],
                                    "conditions": [{"all": conds}],
                                }
                            ],
                        }
                    ],
                }
            ],
        },
    }


def cue_policy(target: Target) -> str:
    """Pure: the CUE the policy-controller evaluates on the statement: one ``predicate: …: field: constraint``
    line per condition (CUE unifies them), the predicate type first."""
    lines = [f"predicateType: {json.dumps(PREDICATE_TYPE)}"]
    for c in conditions(target):
        value = json.dumps(c.value)
        lines.append(f"predicate: {': '.join(c.path.split('.'))}: {'>=' if c.op != 'Equals' else ''}{value}")
    return "\n".join(lines) + "\n"


def image_policy(image_glob: str, name: str, keys: dict[str, Any], target: Target) -> dict:
    """Pure: the Sigstore policy-controller ClusterImagePolicy (see the module docstring)."""
    return {
        "apiVersion": "policy.sigstore.dev/v1alpha1",
        "kind": "ClusterImagePolicy",
        "metadata": {"name": name, "annotations": {"build-image/trusted-keys": ", ".join(keys)}},
        "spec": {
            "images": [{"glob": image_glob}],
            "mode": "enforce",
            "authorities": [
                {
                    "name": f"key-{fp.split(':', 1)[1][:12]}",
                    "key": {"data": signing.public_pem(k), "hashAlgorithm": "sha256"},
                    "attestations": [
                        {
                            "name": "signed-smoke-pass",
                            "predicateType": PREDICATE_TYPE,
                            "policy": {"type": "cue", "data": cue_policy(target)},
                        }
                    ],
                }
                for fp, k in keys.items()
            ],
        },
    }


def render_policies(registry: str, repository: str, tag: str, keys: dict[str, Any], target: Target) -> dict[str, str]:
    """The two policy files' texts for the images of ``registry/repository`` (every digest of it: the policy
    is what lets one run)."""
    if not keys:
        raise BadInput("the admission policies need a trusted key ([serving] trusted_keys or --trusted-key).")
    glob, name = f"{registry}/{repository}*", _name(repository, tag)
    head = f"{GENERATED_MARK}: admission policy for {registry}/{repository} (docs/cutover.md)\n"
    return {
        KYVERNO_FILE: head + yaml.safe_dump(kyverno_policy(glob, name, keys, target), sort_keys=False),
        SIGSTORE_FILE: head + yaml.safe_dump(image_policy(glob, name, keys, target), sort_keys=False),
    }


# --------------------------------------------------------------------------- the local evaluator


def _lookup(doc: Any, path: str) -> Any:
    for part in path.split("."):
        doc = doc.get(part) if isinstance(doc, dict) else None
    return doc


def _holds(got: Any, op: str, want: Any) -> bool:
    if op == "Equals":
        return got == want and type(got) is type(want)
    if op == "GreaterThanOrEquals":
        numbers = (int, float)
        return isinstance(got, numbers) and not isinstance(got, bool) and isinstance(want, numbers) and got >= want
    raise BadInput(f"the policy uses the operator {op!r}, which this evaluator does not know.")


def _statements(image: str, envelopes: list[bytes], pems: list[str], predicate_type: str) -> list[dict]:
    """The statements among ``envelopes`` one of the keys in ``pems`` signed, of ``predicate_type`` and about
    ``image``'s digest: what a verifier reads before it looks at any condition."""
    from cryptography.hazmat.primitives import serialization

    keys = {str(i): serialization.load_pem_public_key(p.encode()) for i, p in enumerate(pems)}
    digest = image.rsplit("@", 1)[-1].split(":", 1)[-1]
    out = []
    for blob in envelopes:
        try:
            opened = signing.open_envelope(blob, "attestation", keys)
            doc = json.loads(opened.payload)
        except (BadInput, ValueError):
            continue
        subjects = [s.get("digest", {}).get("sha256") for s in doc.get("subject", []) if isinstance(s, dict)]
        if opened.signers and doc.get("predicateType") == predicate_type and digest in subjects:
            out.append(doc)
    return out


def kyverno_admits(policy: dict, image: str, envelopes: list[bytes]) -> tuple[bool, str]:
    """Whether the ClusterPolicy ``policy`` admits a Pod running ``image`` (``HOST/REPO@sha256:…``) whose
    attestations are ``envelopes``, and why not."""
    for vi in (v for rule in policy["spec"]["rules"] for v in rule.get("verifyImages", [])):
        if not any(fnmatch.fnmatchcase(image, g) for g in vi["imageReferences"]):
            continue
        for att in vi["attestations"]:
            pems = [e["keys"]["publicKeys"] for a in att["attestors"] for e in a["entries"]]
            statements = _statements(image, envelopes, pems, att["predicateType"])
            if not statements:
                return False, "no attestation of that type signed by a trusted key"
            conds = [c for block in att["conditions"] for c in block["all"]]
            failing = []
            for st in statements:
                failing = [
                    c["message"]
                    for c in conds
                    if not _holds(_lookup(st["predicate"], c["key"].strip("{} ")), c["operator"], c["value"])
                ]
                if not failing:
                    break
            if failing:
                return False, "condition failed: " + "; ".join(failing)
    return True, "admitted"


_CUE_LINE = re.compile(r"^((?:[A-Za-z_][A-Za-z0-9_]*: )+)(>=)?(.+)$")


def cip_admits(policy: dict, image: str, envelopes: list[bytes]) -> tuple[bool, str]:
    """Whether the ClusterImagePolicy ``policy`` admits ``image`` with ``envelopes``: some authority's key
    signed a statement of its attestation's predicate type that satisfies its CUE (the subset
    :func:`cue_policy` writes: ``a: b: c: value`` and ``a: b: >=number`` lines)."""
    if not any(fnmatch.fnmatchcase(image, i["glob"]) for i in policy["spec"]["images"]):
        return True, "not an image this policy covers"
    why = "no authority's key signed an attestation of that type"
    for auth in policy["spec"]["authorities"]:
        for att in auth["attestations"]:
            for st in _statements(image, envelopes, [auth["key"]["data"]], att["predicateType"]):
                failing = []
                for line in att["policy"]["data"].splitlines():
                    m = _CUE_LINE.match(line.strip())
                    if m is None:
                        raise BadInput(f"the CUE line {line!r:.80} is not one this evaluator reads.")
                    path = ".".join(p for p in m.group(1).split(": ") if p)
                    op = "GreaterThanOrEquals" if m.group(2) else "Equals"
                    if not _holds(_lookup(st, path), op, json.loads(m.group(3))):
                        failing.append(line.strip())
                if not failing:
                    return True, "admitted"
                why = "CUE constraint failed: " + "; ".join(failing)
    return False, why
