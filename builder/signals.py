"""SIGINT and SIGTERM as exceptions, so every command unwinds (temp files removed, partial outputs
rolled back by the ``except BaseException`` of each atomic writer) and exits with the shell's codes:
130 for SIGINT (:class:`KeyboardInterrupt`), 143 for SIGTERM (:class:`Terminated`)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

SIGINT_EXIT = 128 + signal.SIGINT  # 130
SIGTERM_EXIT = 128 + signal.SIGTERM  # 143


class Terminated(BaseException):  # noqa: N818 - like KeyboardInterrupt, not an Exception: nothing catches it by mistake
    """SIGTERM arrived: the command unwinds as for SIGINT, then exits 143."""


def _raise_terminated(signum, frame):  # noqa: ARG001 - the signal module's handler signature
    raise Terminated()


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """Within: SIGTERM raises :class:`Terminated` in the main thread (SIGINT raises KeyboardInterrupt
    already, unless someone ignored it); the previous handler comes back afterwards."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread (an embedding caller): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
