"""Property-based fuzzing of the cutover's inputs (docs/faults.md, third round; the profiles and strategies of
tests/test_fuzz.py): history files and smoke attestation statements of random JSON shapes, types and depths.
Each must be read, or refused with BadInput / exit 2 naming it: never exit 70, never a hang.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from builder.commands.history import render_text
from builder.errors import BadInput
from builder.serving import attestation, history
from tests.fx_cutover import CHECKPOINT_SHA, GPU, statement
from tests.test_fuzz import bounded, examples, invoke, json_value

TAG = "127.0.0.1:9/x/app:prod"  # nothing listens on port 9: the registry part ends in a note or exit 10
DIGEST = "sha256:" + "ab" * 32
A, B, C = ("sha256:" + x * 64 for x in "abc")
TARGET = attestation.Target(concurrency=16, max_model_len=4096, tp=1, gpu_model=GPU, checkpoint_sha256=CHECKPOINT_SHA)


def _history_entries() -> list[dict]:
    promote = {
        "id": 1,
        "action": "promote",
        "time": "2026-12-06T00:00:00Z",
        "from": A,
        "to": B,
        "status": "done",
        "record": C,
        "verdict": {"artifact": "x", "summary": "PASS"},
        "forced": False,
        "reason": None,
        "previous": {"digest": A, "config": {"digest": A, "Env": ["A=1"]}},
        "manifests": {"new": {"rayservice.yaml": "a"}, "previous": {"raycluster.yaml": "b"}, "previous_source": "x"},
        "upgrade": {"cost": "x"},
    }
    rollback = {"id": 2, "action": "rollback", "time": "t", "from": B, "to": A, "undoes": 1, "status": "moving"}
    return [promote, rollback]


def _paths(doc, prefix=()):
    """Every (path) into ``doc``'s dicts and lists."""
    yield prefix
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        yield from _paths(v, (*prefix, k))


def _replace(doc, path, value):
    if not path:
        return value
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return doc


def _nested(depth: int, leaf):
    for _ in range(depth):
        leaf = [leaf]
    return leaf


replacement = st.one_of(json_value, st.builds(_nested, st.integers(1, 900), json_value))


def _history_file(tmp_path, entries) -> str:
    path = tmp_path / "h.json"
    doc = {"schema": history.SCHEMA, "tag": TAG, "sha256": history.content_sha256(TAG, entries), "entries": entries}
    path.write_text(json.dumps(doc))
    return str(path)


def _use_history(path) -> None:
    """Load the file; when it is accepted, every reader of its entries runs without an error."""
    try:
        entries = history.load(Path(path), TAG)
    except BadInput as exc:
        assert path in exc.message
        return
    history.rollback_target(entries, B)
    history.next_id(entries)
    history.reconcile(copy.deepcopy(entries), A)
    render_text({"target": TAG, "history": path, "tag_at": None, "entries": entries})


@given(data=st.data())
@examples(150)
def test_fuzz_history_fields(tmp_path_factory, data):
    """A history whose checksum was recomputed after a field became any JSON value (types, depths, names)."""
    tmp = tmp_path_factory.mktemp("h")
    entries = _history_entries()
    path = data.draw(st.sampled_from(list(_paths(entries))[1:]))
    entries = _replace(entries, path, data.draw(replacement))
    with bounded(20):
        _use_history(_history_file(tmp, entries))


@given(doc=json_value)
@examples(60)
def test_fuzz_history_documents(tmp_path_factory, doc):
    """Any JSON document as the history file, through the CLI: exit 0 or 2, never 70."""
    tmp = tmp_path_factory.mktemp("h")
    path = tmp / "h.json"
    path.write_text(json.dumps(doc))
    with bounded(30):
        invoke("history", TAG, "--history", str(path), allowed=(0, 2))
        invoke("rollback", TAG, "--history", str(path), allowed=(2, 10))


@given(data=st.data())
@examples(200)
def test_fuzz_statement_fields(data):
    """A statement with one field (or the whole) replaced by any JSON value: a Verdict every reader can use,
    or BadInput naming the artifact."""
    doc = statement("r/app", DIGEST)
    path = data.draw(st.sampled_from(list(_paths(doc))))
    doc = _replace(doc, path, data.draw(replacement))
    try:
        blob = json.dumps(doc).encode()
    except (ValueError, RecursionError):  # a value json itself cannot write (a 900-deep list is fine)
        return
    with bounded(20):
        try:
            v = attestation.parse_statement(blob, where="REG/app@sha256:feed", subject_digest=DIGEST)
        except BadInput as exc:
            assert "REG/app@sha256:feed" in exc.message
            return
        attestation.mismatches(v, TARGET)
        v.summary()
        attestation.settings_key(v.predicate)


@given(data=st.data())
@examples(150)
def test_fuzz_dsse_envelopes(data):
    """A signed envelope with one field (or the whole) replaced by any JSON value: opened (its signers only
    the keys that signed those bytes) or BadInput naming it."""
    from builder import signing

    envelope = json.loads(signing.sign_envelope(json.dumps(statement("r/app", DIGEST)).encode(), _SIGNER))
    path = data.draw(st.sampled_from(list(_paths(envelope))))
    envelope = _replace(envelope, path, data.draw(replacement))
    try:
        blob = json.dumps(envelope).encode()
    except (ValueError, RecursionError):
        return
    with bounded(20):
        try:
            opened = signing.open_envelope(blob, "ENV@sha256:feed", _TRUSTED)
        except BadInput as exc:
            assert "ENV@sha256:feed" in exc.message
            return
        assert set(opened.signers) <= set(_TRUSTED)


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    from builder import signing

    key = ec.generate_private_key(ec.SECP256R1())
    return signing.KeySigner(key=key, path="fuzz"), {signing.fingerprint(key.public_key()): key.public_key()}


_SIGNER, _TRUSTED = _key()
