"""The lock stage as commands run it: spec -> base -> :func:`builder.resolve.lock.run` -> :class:`Locked`.

``build-image lock`` and the pipeline both call :func:`run_lock`; it returns a frozen
:class:`Locked` carrying everything later stages use (the lock's entries with their
facts, its text and hash, the gate verdicts of a new resolution, the resolved base),
so nothing downstream reads the lock or the manifest from disk again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from builder.events import SILENT, Reporter
from builder.resolve import lock as L
from builder.resolve import lockfile
from builder.resolve.abi import GateResult, format_notices
from builder.resolve.baseref import ResolvedBase, resolve_base
from builder.resolve.lockfile import LockFile
from builder.resolve.lockstep import parse_families


@dataclass(frozen=True)
class Locked:
    """The lock stage's result.

    ``status`` is ``written`` (a new resolution, ``gate`` holds its verdicts) or
    ``up-to-date`` (the lock on disk was reused, ``gate`` is None).  ``text`` is the
    lock file as written (None for a pylock.toml), copied verbatim into the context."""

    status: str
    path: Path
    lock: LockFile
    text: str | None
    base: ResolvedBase
    overlay: tuple[str, ...]
    gate: GateResult | None = None  # the verdicts of a new resolution
    resolved: int = 0  # distributions in the resolution (written only)
    timings: dict = field(default_factory=dict)
    unused_allow: tuple[str, ...] = ()
    pylock: str | None = None  # the pylock.toml twin beside the lock
    messages: tuple[str, ...] = ()  # what the stage says on stderr (twin rewritten, notices, warnings)
    seconds: float = 0.0

    @property
    def lock_hash(self) -> str:
        return self.lock.lock_hash

    @property
    def entries(self):
        return self.lock.entries

    @property
    def manifest(self):
        return self.base.manifest

    def summary_line(self) -> str:
        """The one line ``lock`` prints on stdout."""
        if self.status == "up-to-date":
            return (
                f"{self.path} is up to date with its inputs (base {self.base.label}, "
                f"overlay {', '.join(self.overlay)})."
            )
        header = self.lock.header
        moved = sorted(e.key for e in self.lock.entries if e.base_version)
        ray_line = f"; ray {header['ray']}" if header.get("ray") else ""
        return (
            f"wrote {self.path}: {len(self.lock.entries)} packages on top of base {self.base.label} "
            f"({self.resolved} resolved; base distributions moved: {', '.join(moved) or 'none'}; "
            f"{len(self.gate.notices)} notice(s), {len(self.gate.allowed)} allowed ABI change(s)){ray_line}."
        )

    def to_dict(self) -> dict:
        if self.status == "up-to-date":
            return {
                "status": "up-to-date",
                "lock": str(self.path),
                "written": False,
                "pylock": self.pylock,
                "seconds": round(self.seconds, 3),
            }
        header = self.lock.header
        return {
            "status": "written",
            "lock": str(self.path),
            "pylock": self.pylock,
            "written": True,
            "entries": len(self.lock.entries),
            "resolved": self.resolved,
            "moved_base": sorted(e.key for e in self.lock.entries if e.base_version),
            "inputs_sha256": header["inputs-sha256"],
            "lock_hash": self.lock.lock_hash,
            "vllm": header.get("vllm"),
            "ray": header.get("ray"),
            "serve_backend": header.get("serve-backend"),
            "gate": self.gate.to_dict(),
            "unused_allow_abi_change": list(self.unused_allow),
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "seconds": round(self.seconds, 3),
        }


def run_lock(
    spec,
    *,
    check: bool = False,
    upgrade: bool = False,
    force: bool = False,
    default_overlay: bool = True,
    base: ResolvedBase | None = None,
    reporter: Reporter = SILENT,
) -> Locked:
    """Resolve the spec's base (``base``: a :class:`builder.resolve.baseref.ResolvedBase` the caller
    resolved already), make the request, run the lock stage, keep the pylock twin in step.

    Raises what :func:`builder.resolve.lock.run` raises (StaleLock with ``check``, AbiRejected,
    Unsatisfiable, BadInput).  ``reporter`` hears the steps as they happen, then the gate's notices and
    the warnings (kept in :attr:`Locked.messages` too).
    The twin is refused as an output here (:func:`builder.resolve.lockfile.writing`) and kept in step by
    :func:`builder.resolve.lock.run`."""
    t_start = time.monotonic()
    said: list[str] = []

    resolved = base if base is not None else resolve_base(spec.base, spec.vllm, platform=spec.platform)
    if not spec.vllm_given and resolved.vllm:  # no --vllm: the base's vllm (and its default lock path)
        spec = spec.with_flags(vllm=resolved.vllm)
    req = _request(spec, resolved, default_overlay)
    with lockfile.writing(spec.lock_path, check):  # one writer of a lock at a time; -o pylock.toml refused
        out = L.run(req, spec.lock_path, check=check, upgrade=upgrade, force=force, reporter=reporter)
    lock_path = out.path
    if out.status == "up-to-date":  # the lock as the freshness check read it
        assert out.kept is not None
        return Locked(
            status="up-to-date",
            path=lock_path,
            lock=out.kept,
            text=out.kept_text,
            base=resolved,
            overlay=tuple(req.overlay),
            pylock=str(out.pylock),
            messages=tuple(said),
            seconds=time.monotonic() - t_start,
        )
    result = out.result
    notices = format_notices(result.gate)
    if notices:
        said.append("notices:\n" + notices)
        reporter.notice(said[-1])
    if out.unused_allow:  # recorded anyway (it is an input); say so: a stale escape hatch would cover a future change
        warning = (
            f"--allow-abi-change {', '.join(out.unused_allow)}: no gate violation to allow in this lock; "
            "it is still recorded in the header and covers a later violation — drop it if it is stale."
        )
        said.append("warning: " + warning)
        reporter.warning(warning, lead="warning: ")
    return Locked(
        status="written",
        path=lock_path,
        lock=result.lock,
        text=result.lock.format(),
        base=resolved,
        overlay=tuple(req.overlay),
        gate=result.gate,
        resolved=result.resolved,
        timings=dict(result.timings),
        unused_allow=tuple(out.unused_allow),
        pylock=str(out.pylock),
        messages=tuple(said),
        seconds=time.monotonic() - t_start,
    )


def _request(spec, resolved: ResolvedBase, default_overlay: bool):
    """The lock request of ``spec`` on top of the resolved base (its ``--with`` overlay, ABI allowances,
    indexes and exclude-newer)."""
    return L.request_for(
        vllm=spec.vllm,
        base=resolved,
        with_=spec.with_,
        default_overlay=default_overlay,
        vllm_given=spec.vllm_given,
        allow=spec.allow_abi_change,
        find_links=spec.find_links,
        no_index=spec.no_index,
        exclude_newer=spec.exclude_newer,
        where="--with" if not spec.source else f"--with / {spec.source} 'with'",
        lockstep=parse_families(spec.lockstep, f"spec {spec.source} 'lockstep'") if spec.lockstep else (),
    )
