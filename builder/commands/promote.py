"""``build-image promote IMAGE@DIGEST --to REPO:TAG``: move a deploy tag on a matching PASS verdict."""

from __future__ import annotations

from pathlib import Path

import click

from builder.commands import stderr_console
from builder.report import emit_json, emit_text

# What a command runs (its stage, the engine adapter, downloads, reports) is imported inside the command
# function, not here: `build-image --help` imports every command module to list it, and a stage
# (with its dependencies) loads only when its command runs.


@click.command("promote")
@click.argument("image", metavar="IMAGE@DIGEST")
@click.option("--to", "to", required=True, metavar="REPO:TAG", help="The deploy tag to move (same registry).")
@click.option(
    "--spec",
    "spec_file",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Spec whose [serving] settings the verdict must match (default: ./build-image.toml).",
)
@click.option(
    "--lock",
    "lock_file",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Lock the KubeRay manifests take rayVersion from (default: the spec's lock).",
)
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the new image's rayservice.yaml / raycluster.yaml here, to apply.",
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
    help="A PEM public key whose signed verdicts count (repeatable; added to [serving] trusted_keys).",
)
@click.option(
    "--sign-key",
    "sign_key",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Sign the rollback record with this private key (ECDSA P-256 or Ed25519 PEM, mode 0600; an encrypted "
    "one opens with $BUILD_IMAGE_SIGN_KEY_PASSPHRASE).",
)
@click.option("--force", is_flag=True, help="Move the tag without a matching PASS verdict (needs --reason).")
@click.option("--reason", default=None, metavar="TEXT", help="Why --force: recorded in the history and the record.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result on stdout.")
def command(image, to, spec_file, lock_file, out_dir, history_file, trusted_keys, sign_key, force, reason, as_json):
    """Move REPO:TAG to IMAGE@DIGEST when a smoke attestation attached to that digest, signed by a trusted key
    ([serving] trusted_keys, --trusted-key), is a PASS at the target's [serving] settings: concurrency at least
    serving.concurrency, the same max_model_len, tp, gpu_model and checkpoint (checkpoint_sha256).  Before the
    tag moves, the digest it pointed at, that image's container configuration and the KubeRay manifests of both
    are recorded as an OCI artifact referring to the new digest (signed with --sign-key) and in the tag's
    history file.  With -o, the admission policies (Kyverno, Sigstore policy-controller) are written too.

    Exit codes: 0 moved (or already there), 1 refused: no attached PASS signed by a trusted key matches the
    target (nothing moved), 2 bad input (a digest the registry does not hold, a forged or truncated
    attestation, an attestation about another digest, an image of another platform than the lock or [serving]
    platform, a history file edited by hand, unstated [serving] settings, no trusted key, an unreadable key
    file, --force without --reason; nothing moved), 10 registry
    unreachable / refused (the history says where the tag is), 14 another run holds the tag's history longer
    than BUILD_IMAGE_LOCK_TIMEOUT.
    """
    from builder.events import reporter_for
    from builder.resolve.lockfile import load_lock
    from builder.serving.cutover import PromoteRequest, promote
    from builder.spec import load_spec

    console = stderr_console()
    spec = load_spec(spec_file)
    lock = load_lock(lock_file or spec.lock_path)
    req = PromoteRequest(
        image,
        to,
        spec=spec,
        lock=lock,
        force=force,
        reason=reason,
        history_file=history_file,
        out_dir=out_dir,
        trusted_keys=trusted_keys,
        sign_key=sign_key,
    )
    res = promote(req, reporter_for(console).scoped("promote: "))
    if as_json:
        emit_json(res)
        return
    if res["status"] == "unchanged":
        emit_text(f"{res['target']} already points at {res['digest']}\n")
        return
    lines = [
        f"promoted {res['target']}: {res['previous'] or '(new tag)'} -> {res['digest']}",
        "  verdict: " + (res["verdict"]["summary"] if res["verdict"] else f"none, FORCED: {res['reason']}"),
        *(["  signed by " + ", ".join(res["verdict"]["signers"])] if res["verdict"] else []),
        f"  rollback record: {res['record']} (refers to {res['digest']})"
        + (f", signed by {res['record_signers'][0]}" if res["record_signers"] else ", unsigned"),
        f"  history: {res['history']}",
        f"  upgrade: {res['upgrade']['cost']}",
    ]
    lines += [f"  wrote {p}" for p in res["manifests"]]
    service = [p for p in res["manifests"] if p.endswith("rayservice.yaml")]
    if service:
        lines.append(f"  apply: kubectl apply -f {service[0]}")
    emit_text("\n".join(lines) + "\n")
