"""``build-image history REPO:TAG``: the promotions and rollbacks of a deploy tag."""

from __future__ import annotations

from pathlib import Path

import click

from builder.commands import stderr_console
from builder.report import emit_json, emit_text


def render_text(res: dict) -> str:
    """Pure: one line per entry, newest last."""
    lines = [f"{res['target']} (history {res['history']}); the tag points at {res['tag_at'] or 'unknown'}"]
    if res.get("note"):
        lines.append(f"  note: {res['note']}")
    for e in res["entries"]:
        what = (e.get("verdict") or {}).get("summary") if e["action"] == "promote" else f"undoes entry {e['undoes']}"
        if e["action"] == "promote" and e.get("forced"):
            what = f"FORCED: {e.get('reason')}"
        signers = (e.get("verdict") or {}).get("signers") if e["action"] == "promote" else None
        if signers:
            what = f"{what} [signed by {', '.join(signers)}]"
        status = {
            "done": "moved",
            "not-moved": "NOT moved (the tag stayed)",
            "unconfirmed": "UNCONFIRMED (the registry stopped answering)",
            "moving": "moving",
        }[e["status"]]
        lines.append(
            f"  #{e['id']} {e['time']} {e['action']:<8} {e.get('from') or '(new tag)'} -> {e['to']}  "
            f"[{status}]  {what or ''}".rstrip()
        )
    return "\n".join(lines) + "\n"


@click.command("history")
@click.argument("target", metavar="REPO:TAG")
@click.option(
    "--history",
    "history_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The tag's history file (default: $XDG_STATE_HOME/build-image/cutover/HOST/REPO/TAG.json).",
)
@click.option("--json", "as_json", is_flag=True, help="The whole history (with recorded configs and manifests).")
def command(target, history_file, as_json):
    """List REPO:TAG's promotions and rollbacks with their verdicts; an entry a failed registry left unconfirmed
    is settled from where the tag points now.

    Exit codes: 0 listed, 2 bad input (no history for the tag, a history file edited by hand), 14 another run
    holds the tag's history longer than BUILD_IMAGE_LOCK_TIMEOUT.
    """
    from builder.events import reporter_for
    from builder.serving.cutover import show_history

    console = stderr_console()
    res = show_history(target, history_file=history_file, reporter=reporter_for(console).scoped("history: "))
    if as_json:
        emit_json(res)
    else:
        emit_text(render_text(res))
