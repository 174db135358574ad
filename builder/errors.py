"""Typed errors, one class per exit code.

Every fatal condition the tool reports is an instance of a subclass of
:class:`BuildImageError`; the CLI prints its message (one paragraph) and exits
with the class's ``exit_code``.  The codes are part of the public interface
(README, "Exit codes") — never renumber them, only add new ones.

Verdict commands use 0/1 for their answer (``diff``: dangerous change present,
``plan``: does not fit, ``smoke``: FAIL, ``ray-check``: nodes disagree), and
the codes below for everything else.
"""

from __future__ import annotations

import re

from builder.credentials import redact_text  # no secret reaches a message, a log or a --json document

#: what a message may not carry to a terminal raw: control characters but the newline (ESC starts an escape
#: sequence, CR rewrites the line, BEL rings), DEL, C1 controls and the Unicode line separators
_UNPRINTABLE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str, *, paragraph: bool = True) -> str:
    """Pure: ``text`` as a terminal shows it safely: each control character but the newline (a value quoted
    into a message may hold any) written as its escape (``\\x1b``); ``paragraph``: blank lines dropped too
    (a message and its hint are one paragraph; details keep their layout)."""
    if not text:
        return text
    text = _UNPRINTABLE.sub(lambda m: "\t" if m.group(0) == "\t" and not paragraph else repr(m.group(0))[1:-1], text)
    return re.sub(r"\n[ \t]*(?=\n)", "", text) if paragraph and "\n" in text else text


class BuildImageError(Exception):
    """Base class: a user-facing, expected failure."""

    exit_code = 70
    title = "error"

    def __init__(self, message: str, *, hint: str | None = None, details: str | None = None):
        message, hint, details = (
            printable(redact_text(message)),
            printable(redact_text(hint or "")) or None,
            printable(redact_text(details or ""), paragraph=False) or None,
        )
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details

    def render(self) -> str:
        text = f"{self.title}: {self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        if self.details:
            text += "\n" + self.details.rstrip()
        return text


class VerdictFailure(BuildImageError):
    """A check ran and its answer is negative (diff dangerous, plan does not fit,
    smoke FAIL, ray-check mismatch)."""

    exit_code = 1
    title = "failed"


class BadInput(BuildImageError):
    """Bad flags, malformed spec/manifest/lock/patch files, unknown versions."""

    exit_code = 2
    title = "bad input"


class AbiRejected(BuildImageError):
    """The ABI gate rejected the resolution."""

    exit_code = 3
    title = "ABI gate rejected the lock"


class Unsatisfiable(BuildImageError):
    """The resolver found no solution on top of the base."""

    exit_code = 4
    title = "unsatisfiable"


class StaleLock(BuildImageError):
    """``lock --check``: the lock on disk does not match its inputs."""

    exit_code = 5
    title = "stale lock"


class PatchFailed(BuildImageError):
    """A patch does not apply, touches a forbidden path, or targets a file whose
    content differs from the wheel's original."""

    exit_code = 6
    title = "patch series failed"


class IntegrityError(BuildImageError):
    """A download or a cached file failed its sha256 check, or could not be fetched."""

    exit_code = 7
    title = "integrity/download error"


class EngineUnavailable(BuildImageError):
    """No reachable container engine."""

    exit_code = 8
    title = "container engine unavailable"


class BuildFailed(BuildImageError):
    """The image build failed (including the Dockerfile's early checks)."""

    exit_code = 9
    title = "image build failed"


class RegistryError(BuildImageError):
    """Registry unreachable, push refused, digest mismatch after push, or an answer the HTTP policy refuses
    (a redirect it does not follow, larger than its bound, past its deadline: ``builder/httpclient.py``)."""

    exit_code = 10
    title = "registry error"


class TagConflict(BuildImageError):
    """A tag already points at a different digest in the registry."""

    exit_code = 11
    title = "tag conflict"


class ExternalToolError(BuildImageError):
    """A helper program (uv, docker CLI, ...) failed in an unexpected way."""

    exit_code = 12
    title = "external tool failed"


class CheckpointNotReady(BuildImageError):
    """``smoke`` / the pipeline's ``--smoke``: the checkpoint failed the structural
    readiness checks (``checkpoint verify``), so no server was started."""

    exit_code = 13
    title = "checkpoint not ready"


class OutputBusy(BuildImageError):
    """Another build-image run holds the output file or directory for longer than the wait allows."""

    exit_code = 14
    title = "output busy"


EXIT_CODES: dict[int, str] = {
    0: "success / PASS / fits / no dangerous change",
    1: "verdict negative (diff: dangerous change; plan: does not fit; smoke: FAIL; ray-check: nodes disagree; "
    "promote: no matching PASS)",
    BadInput.exit_code: "bad input (flags, spec, manifest, lock, patch files)",
    AbiRejected.exit_code: "ABI gate rejection",
    Unsatisfiable.exit_code: "unsatisfiable resolution on top of the base",
    StaleLock.exit_code: "lock is stale against its inputs (lock --check)",
    PatchFailed.exit_code: "patch series does not apply / refused",
    IntegrityError.exit_code: "download or sha256 verification failure (or an index/download answer refused)",
    EngineUnavailable.exit_code: "container engine unreachable",
    BuildFailed.exit_code: "image build failed",
    RegistryError.exit_code: "registry unreachable / push refused / digest mismatch / an answer refused (redirect, "
    "size, deadline)",
    TagConflict.exit_code: "tag already points to a different digest",
    ExternalToolError.exit_code: "a helper tool (uv, docker) failed unexpectedly",
    CheckpointNotReady.exit_code: "smoke: the checkpoint is not ready (checkpoint verify's structural checks); no "
    "server started",
    OutputBusy.exit_code: "another run holds the output (-o) longer than BUILD_IMAGE_LOCK_TIMEOUT",
    130: "interrupted by SIGINT; outputs as they were before the run",
    143: "terminated by SIGTERM; outputs as they were before the run",
    70: "internal error (a bug: please report)",
}
