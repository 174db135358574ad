"""``build-image ray-check IMAGE``: the same image, the same versions on every Ray node.

Starts a real Ray head and N workers as containers of IMAGE on the local engine
(never pulls; one network namespace holding only loopback, shared by all nodes; no GPU), runs one task pinned to
each node, and compares what the nodes report with each other and with the lock.

Exit 0: PASS; 1: the nodes disagree (or one did not join); 2: bad input;
8: no engine; 12: docker failed unexpectedly.
"""

from __future__ import annotations

import click

from builder.commands import stderr_console
from builder.errors import BuildImageError, VerdictFailure
from builder.report import emit_text
from builder.spec import default_lock_path

# What a command runs (its stage, the engine adapter, downloads, reports) is imported inside the command
# function, not here: `build-image --help` imports every command module to list it, and a stage
# (with its dependencies) loads only when its command runs.


@click.command("ray-check")
@click.argument("image")
@click.option("--workers", type=int, default=1, show_default=True, help="Number of Ray worker nodes besides the head.")
@click.option(
    "--lock",
    "lock_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Lock file: every locked package's version must match on every node.",
)
@click.option(
    "--worker-image",
    default=None,
    help="Run the last worker from this image instead (to demonstrate / investigate a mismatch).",
)
@click.option(
    "--timeout",
    type=float,
    default=180.0,
    show_default=True,
    help="Seconds to wait for the cluster to form and report.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def command(
    image: str, workers: int, lock_path: str | None, worker_image: str | None, timeout: float, as_json: bool
) -> None:
    """Start a Ray head and N workers from IMAGE and check that every node runs the same thing.

    Exit codes: 0 every node runs the same versions as the lock; 1 the nodes
    disagree, or agree but differ from the lock; 2 bad input; 8 container engine
    unreachable; 12 a helper tool failed.
    """
    from builder.events import RichReporter
    from builder.resolve.lockfile import load_lock
    from builder.serving import raycheck

    err = stderr_console(highlight=True)
    if lock_path is None:
        lock_path = image_lock(image)
        if lock_path:
            err.print(
                f"ray-check: comparing with {lock_path} (its hash is the image's org.build-image.lock-hash label)",
                highlight=False,
                markup=False,
            )
        else:
            err.print(
                "ray-check: no --lock and no lock file matching the image's lock-hash label: the nodes are "
                "compared with each other only, not with a lock",
                highlight=False,
                markup=False,
            )
    lock = load_lock(lock_path) if lock_path else None
    with err.status("ray-check: starting") as status:
        result = raycheck.run_check(
            image,
            workers=workers,
            lock=lock,
            lock_path=lock_path,
            timeout=timeout,
            worker_image=worker_image,
            reporter=RichReporter(err, status=status).scoped("ray-check: "),
        )
    if as_json:
        emit_text(result.to_json())
    else:
        click.echo(raycheck.render_text(result))
    if not result.ok:
        subjects = ", ".join(dict.fromkeys(f.subject for f in result.findings))
        if result.mismatch == "lock":
            raise VerdictFailure(
                f"ray-check: the nodes agree with each other but not with the lock {lock_path} on "
                f"{subjects} (details above): the image is not the one this lock builds."
            )
        if result.mismatch == "image":
            raise VerdictFailure(
                f"ray-check: the nodes agree, but {subjects} differ from what the build recorded (details above)."
            )
        raise VerdictFailure(f"ray-check: the nodes disagree on {subjects} (details above).")


def image_lock(image: str, engine=None) -> str | None:
    """The default lock of ``image`` (``lockfiles/vllm-<label vllm>/requirements.lock``), only when its
    hash equals the image's ``org.build-image.lock-hash`` label; else None."""
    from builder.resolve.lockfile import load_lock

    try:
        if engine is None:
            from builder.engine import get_engine

            engine = get_engine()
        info = engine.inspect(image)
    except BuildImageError:
        return None  # run_check reports the engine / image problem itself
    labels = (info.labels if info else None) or {}
    vllm, want = labels.get("org.build-image.vllm"), labels.get("org.build-image.lock-hash")
    if not (vllm and want):
        return None
    path = default_lock_path(vllm)
    try:
        return str(path) if path.is_file() and load_lock(path).lock_hash == want else None
    except BuildImageError:
        return None
