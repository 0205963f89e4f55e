"""Ctrl-C during a parallel run is the parent's alone to handle.

A terminal's Ctrl-C sends SIGINT to every process of its foreground group: the CLI and each pool worker. A worker
that took it raised KeyboardInterrupt wherever it was, printed a traceback on the shared terminal, and could die
holding one of the pool's locks, which then hung the parent's shutdown of the pool. So a worker ignores SIGINT
from its first instruction (the parent ends it with SIGTERM), and the parent, interrupted, ends the pool with a
second Ctrl-C dropped meanwhile, then says so in one line (tests/compiler/test_cli_faults.py,
test_ctrl_c_during_a_parallel_rewrite_exits_130_quietly).

To leave no instant in which a new worker still takes SIGINT, the pool is started with SIGINT blocked in the
starting thread: the pool's own threads inherit that mask, so every worker they fork (at the start, or later to
replace one) is born with SIGINT blocked, and unblocks it only once it ignores it (a SIGINT pending by then is
discarded). The parent's main thread unblocks it once the pool is up, and takes any Ctrl-C held back meanwhile.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator

_CAN_MASK = hasattr(signal, "pthread_sigmask") and hasattr(signal, "SIGINT")


def block_sigint() -> bool:
    """Block SIGINT in the calling thread; whether this call blocked it (to pass to ``unblock_sigint``)."""
    if not _CAN_MASK:
        return False
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    return signal.SIGINT not in previous


def unblock_sigint(blocked: bool) -> None:
    """Undo ``block_sigint``: a SIGINT held back meanwhile is taken now (KeyboardInterrupt, in the main thread)."""
    if blocked:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def ignore_sigint_in_worker() -> None:
    """A worker's first step: ignore SIGINT, then unblock it (see the module's docstring)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (ValueError, OSError, AttributeError):  # not a main thread, or no SIGINT on this platform
        return
    if _CAN_MASK:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored for the block (a second Ctrl-C while the parent ends its workers is dropped, rather than
    breaking off the shutdown with a traceback of its own); the previous handler is put back after it."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (ValueError, OSError, AttributeError):  # not the main thread: the interrupt is not this code's to take
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
