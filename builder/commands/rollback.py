"""``build-image rollback REPO:TAG``: put the tag back on the digest its last promotion replaced."""

from __future__ import annotations

from pathlib import Path

import click

from builder.commands import stderr_console
from builder.report import emit_json, emit_text


@click.command("rollback")
@click.argument("target", metavar="REPO:TAG")
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the restored image's recorded rayservice.yaml / raycluster.yaml here, to re-apply.",
)
@click.option(
    "--history",
    "history_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The tag's history file (default: $XDG_STATE_HOME/build-image/cutover/HOST/REPO/TAG.json).",
)
@click.option(
    "--trusted-key",
    "trusted_keys",
    multiple=True,
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="A PEM public key the rollback record must be signed by (promote --sign-key's; repeatable).",
)
@click.option("--force", is_flag=True, help="Replace -o files that build-image did not write.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result on stdout.")
def command(target, out_dir, history_file, trusted_keys, force, as_json):
    """Move REPO:TAG back to the digest recorded as the rollback target of its latest promotion (the digest and
    its container configuration verified against the registry's rollback record; with --trusted-key, a record
    one of those keys signed), and write that image's recorded KubeRay manifests.  A second rollback undoes the
    promotion before.

    Exit codes: 0 moved back, 2 bad input (no history, a history file edited by hand, a tag that does not
    exist, a rollback target the registry no longer holds or holds with another configuration; nothing moved),
    10 registry unreachable / refused (the history says where the tag is), 11 the tag was moved outside
    build-image since its last promotion (nothing moved), 14 another run holds the tag's history longer than
    BUILD_IMAGE_LOCK_TIMEOUT.
    """
    from builder.events import reporter_for
    from builder.serving.cutover import RollbackRequest, rollback

    console = stderr_console()
    req = RollbackRequest(target, history_file=history_file, out_dir=out_dir, force=force, trusted_keys=trusted_keys)
    res = rollback(req, reporter_for(console).scoped("rollback: "))
    if as_json:
        emit_json(res)
        return
    lines = [
        f"rolled back {res['target']}: {res['previous']} -> {res['digest']} (undoes history entry {res['undoes']})",
        f"  history: {res['history']}",
    ]
    lines += [f"  wrote {p}" for p in res["manifests"]]
    service = [p for p in res["manifests"] if p.endswith("rayservice.yaml")]
    if service:
        lines.append(f"  apply: kubectl apply -f {service[0]}")
    if out_dir and not res["manifests"]:
        lines.append("  no manifests were recorded for that image")
    emit_text("\n".join(lines) + "\n")
