"""The local cutover history of one deploy tag: every promotion and rollback, with what it moved.

One JSON file per tag (default ``$XDG_STATE_HOME/build-image/cutover/<host_port>/<repo>/<tag>.json``, else
``~/.local/state/…``; ``--history FILE``).  It carries the sha256 of its own content: a file edited by hand
(or cut short) is bad input naming it, never silently used to move a tag.  Written atomically, and only
under the output lock of the file (two promotes of one tag serialize on it).

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
from builder.util import atomic_write_text

SCHEMA = "build-image/cutover-history/v1"
ACTIONS = ("promote", "rollback")
STATUSES = ("moving", "done", "not-moved", "unconfirmed")
SETTLED = ("done", "not-moved")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


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


def _entry_errors(i: int, e: Any) -> list[str]:
    if not isinstance(e, dict):
        return [f"entries[{i}] is not an object"]
    errs = []
    if e.get("action") not in ACTIONS:
        errs.append(f"entries[{i}].action is {e.get('action')!r:.40}")
    if e.get("status") not in STATUSES:
        errs.append(f"entries[{i}].status is {e.get('status')!r:.40}")
    if not _DIGEST.match(str(e.get("to"))):
        errs.append(f"entries[{i}].to is not a digest")
    if e.get("from") is not None and not _DIGEST.match(str(e.get("from"))):
        errs.append(f"entries[{i}].from is not a digest")
    if not isinstance(e.get("id"), int):
        errs.append(f"entries[{i}].id is not an integer")
    return errs


def load(path: Path, target: str) -> list[dict]:
    """The entries of the history file (``[]`` when there is none); BadInput naming the file when it is not one
    build-image wrote for ``target``, or when its content no longer matches its sha256 (edited by hand)."""
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
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise bad(f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise bad(f"is not JSON ({exc}; truncated?)") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise bad(f"is not a cutover history (schema is not {SCHEMA!r})")
    if doc.get("tag") != target:
        raise bad(f"is the history of {doc.get('tag')!r:.120}, not of {target}")
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise bad("has no list of entries")
    if doc.get("sha256") != content_sha256(target, entries):
        raise bad("was edited by hand: its content no longer matches the sha256 build-image recorded in it")
    errs = [x for i, e in enumerate(entries) for x in _entry_errors(i, e)]
    if errs:
        raise bad("; ".join(errs[:5]))
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
