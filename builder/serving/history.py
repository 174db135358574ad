"""The local cutover history of one deploy tag: every promotion and rollback, with what it moved.

One JSON file per tag (default ``$XDG_STATE_HOME/build-image/cutover/<host_port>/<repo>/<tag>.json``, else
``~/.local/state/…``; ``--history FILE``).  It is a cache, not the truth: the truth about where a tag came
from is the rollback record each promotion attaches in the registry to the digest it promoted
(:mod:`builder.serving.cutover` reads it and refuses a history entry that disagrees with it).  The sha256
the file carries of its own content only catches a truncated or hand-edited file early -- anyone can
recompute it, so nothing trusts the file for it.  The file is read by :func:`load`: through the bounded
reader (a regular file, at most :data:`MAX_HISTORY_BYTES`), depth-bounded, and by :data:`HISTORY_SCHEMA`
(every field typed); nothing in it is ever used as a path.  Written atomically, and only under the output
lock of the file (two promotes of one tag serialize on it).

An entry's ``status``: ``moving`` (written just before the tag moves), then ``done`` (the tag points at
``to``), ``not-moved`` (it still points at ``from``) or ``unconfirmed`` (the registry stopped answering
before the move could be read back).  :func:`reconcile` settles ``moving``/``unconfirmed`` entries from
the registry's answer, so the history always ends up saying where the tag is.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from builder.credentials import credential_fields, redact_value
from builder.errors import BadInput
from builder.report import render_json
from builder.serving.kuberay import RAYCLUSTER_FILE, RAYSERVICE_FILE
from builder.util import atomic_write_text
from builder.validate import MAX_DEPTH, load_typed_json, read_bounded_text

SCHEMA = "build-image/cutover-history/v1"
ACTIONS = ("promote", "rollback")
STATUSES = ("moving", "done", "not-moved", "unconfirmed")
SETTLED = ("done", "not-moved")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
#: The only file names a history or a rollback record may carry manifests under (the -o files).
MANIFEST_NAMES = (RAYSERVICE_FILE, RAYCLUSTER_FILE)
MAX_HISTORY_BYTES = 64 << 20
MAX_ENTRIES = 100_000

DIGEST_SCHEMA = {"type": "string", "pattern": _DIGEST.pattern}
_ID = {"type": "integer", "minimum": 1, "maximum": 2**53}
_TEXT = {"type": "string", "maxLength": 1 << 16}
_NULL_OR_DIGEST = {"anyOf": [{"type": "null"}, DIGEST_SCHEMA]}
#: signer key fingerprints (builder.signing.fingerprint)
_FINGERPRINTS = {"type": "array", "maxItems": 16, "items": DIGEST_SCHEMA}
#: A container configuration as a record keeps it (retag.container_config): its digest and the fields.
CONFIG_SCHEMA = {"type": "object", "properties": {"digest": DIGEST_SCHEMA}, "required": ["digest"]}
#: Manifests by file name: only the names build-image writes, each a text.
MANIFESTS_SCHEMA = {
    "type": "object",
    "propertyNames": {"enum": list(MANIFEST_NAMES)},
    "additionalProperties": {"type": "string", "maxLength": 1 << 20},
}
_ENTRY = {
    "type": "object",
    "properties": {
        "id": _ID,
        "action": {"enum": list(ACTIONS)},
        "status": {"enum": list(STATUSES)},
        "time": {"type": "string", "maxLength": 64},
        "from": _NULL_OR_DIGEST,
        "to": DIGEST_SCHEMA,
        "tag_at": _NULL_OR_DIGEST,
        "source": _TEXT,
        "record": _NULL_OR_DIGEST,
        "record_signers": _FINGERPRINTS,
        "undoes": _ID,
        "verdict": {
            "anyOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "properties": {"artifact": _TEXT, "summary": _TEXT, "signers": _FINGERPRINTS},
                    "required": ["summary"],
                },
            ]
        },
        "forced": {"type": "boolean"},
        "reason": {"anyOf": [{"type": "null"}, _TEXT]},
        "previous": {
            "anyOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "properties": {"digest": _NULL_OR_DIGEST, "config": {"anyOf": [{"type": "null"}, CONFIG_SCHEMA]}},
                },
            ]
        },
        "new_config": CONFIG_SCHEMA,
        "manifests": {
            "type": "object",
            "properties": {
                "new": MANIFESTS_SCHEMA,
                "previous": {"anyOf": [{"type": "null"}, MANIFESTS_SCHEMA]},
                "previous_source": _TEXT,
            },
            "additionalProperties": False,
        },
        "upgrade": {"type": "object"},
    },
    "required": ["id", "action", "status", "time", "to"],
    "additionalProperties": False,
    "if": {"properties": {"action": {"const": "rollback"}}},
    "then": {"required": ["undoes"]},
}
#: The history file, every field typed (:func:`load` reads it by this).
HISTORY_SCHEMA = {
    "type": "object",
    "properties": {
        "schema": {"const": SCHEMA},
        "tag": {"type": "string", "maxLength": 1024},
        "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "entries": {"type": "array", "maxItems": MAX_ENTRIES, "items": _ENTRY},
    },
    "required": ["schema", "tag", "sha256", "entries"],
    "additionalProperties": False,
}


def default_path(registry: str, repository: str, tag: str) -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "build-image" / "cutover" / registry.replace(":", "_") / repository / f"{tag}.json"


def _canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def content_sha256(target: str, entries: list[dict]) -> str:
    return hashlib.sha256(_canonical({"schema": SCHEMA, "tag": target, "entries": entries})).hexdigest()


def render(target: str, entries: list[dict]) -> str:
    """Pure: the file's text (credentials redacted; the checksum is over what is written)."""
    entries = redact_value(entries)
    doc = {"schema": SCHEMA, "tag": target, "sha256": content_sha256(target, entries), "entries": entries}
    return render_json(doc, sort_keys=True, ensure_ascii=True)


def load(path: Path, target: str) -> list[dict]:
    """The entries of the history file (``[]`` when there is none), read by the bounded reader and
    :data:`HISTORY_SCHEMA`; BadInput naming the file when it is not a regular file build-image could have
    written for ``target`` (a FIFO, a device, too large, too deep, a field of another type, a manifest under
    another name, a content that no longer matches its sha256).  The entries are a cache: the cutover checks
    what it acts on against the registry's rollback records."""
    if not path.exists():
        return []

    def bad(why: str) -> BadInput:
        return BadInput(
            f"cutover history {path}: {why}; nothing was moved.",
            hint="restore the file build-image wrote (from a backup or version control), or move it "
            "aside to start a new history (the registry's rollback records stay attached to the "
            "promoted digests).",
        )

    try:
        text = read_bounded_text(path, "cutover history", max_bytes=MAX_HISTORY_BYTES)
        doc = load_typed_json(text, "it", HISTORY_SCHEMA, limit=MAX_DEPTH)
    except BadInput as exc:
        raise bad(exc.message.removeprefix(f"cutover history {path}").lstrip(": ").rstrip(".")) from None
    if doc["tag"] != target:
        raise bad(f"is the history of {doc['tag']!r:.120}, not of {target}")
    entries = doc["entries"]
    if doc["sha256"] != content_sha256(target, entries):
        raise bad("was edited by hand or cut short: its content no longer matches the sha256 recorded in it")
    ids = [e["id"] for e in entries]
    if len(set(ids)) != len(ids):
        raise bad("holds two entries with one id")
    if credential_fields(entries):
        raise bad("holds a credential (" + ", ".join(credential_fields(entries)[:3]) + ")")
    return entries


def check_writable(path: Path) -> None:
    """Before anything moves: the history file can be written (its folder made if need be)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(
            f"cutover history {path}: its folder cannot be made ({exc.strerror or exc}); nothing was moved.",
            hint="give --history FILE in a writable place.",
        ) from None
    if not os.access(path.parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.R_OK)):
        raise BadInput(
            f"cutover history {path}: not writable here; nothing was moved.",
            hint="give --history FILE in a writable place.",
        )


def save(path: Path, target: str, entries: list[dict]) -> None:
    atomic_write_text(path, render(target, entries))


def reconcile(entries: list[dict], tag_at: str | None) -> bool:
    """Settle every ``moving``/``unconfirmed`` entry from where the tag points now (``tag_at``); True when an
    entry changed.  Only the last entry can be unsettled (each run settles before it appends)."""
    changed = False
    for e in entries:
        if e["status"] in SETTLED:
            continue
        if tag_at == e["to"]:
            e["status"] = "done"
        elif tag_at == e.get("from"):
            e["status"] = "not-moved"
        else:
            continue  # the tag is elsewhere (moved outside build-image): left as it is, shown as such
        e["tag_at"] = tag_at
        changed = True
    return changed


def undone_ids(entries: list[dict]) -> set[int]:
    return {e["undoes"] for e in entries if e["action"] == "rollback" and e["status"] == "done" and "undoes" in e}


def rollback_target(entries: list[dict], current: str | None) -> dict | None:
    """Pure: the latest promotion that moved the tag to ``current`` and has not been rolled back."""
    undone = undone_ids(entries)
    for e in reversed(entries):
        if e["action"] == "promote" and e["status"] == "done" and e["id"] not in undone:
            return e if e["to"] == current else None
    return None


def next_id(entries: list[dict]) -> int:
    return max((e["id"] for e in entries), default=0) + 1
