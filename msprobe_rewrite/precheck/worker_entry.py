"""The worker's entry points by a module that imports no torch at load, so that the parent can name them
for its worker processes without importing torch itself; torch is imported in the worker, on first use."""

import os
import signal

READY = "ready"
# how long an idle worker waits for its next item before it looks whether its parent still lives
PARENT_CHECK_S = 1.0


def init(table, threads):
    from . import worker

    worker.init(table, threads)


def check(item):
    from . import worker

    return worker.check(item)


def serve(conn, table, threads, parent_pid):
    """A worker process (``worker_processes``): say READY once initialised, then answer each item received on
    ``conn`` with its result, until None comes, the pipe closes, or the parent is gone."""
    # Ctrl-C reaches the whole process group: the parent ends its workers, which print nothing of their own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    init(table, threads)
    try:
        conn.send(READY)
    except OSError:
        return
    while True:
        # a parent killed outright (SIGKILL) leaves the pipe open in the other workers it forked: its pid tells
        while not conn.poll(PARENT_CHECK_S):
            if os.getppid() != parent_pid:
                return
        try:
            item = conn.recv()
        except EOFError:
            return
        if item is None:
            return
        result = check(item)
        try:
            conn.send(result)
        except OSError:  # the parent is gone (its end of the pipe closed): no one to answer
            return
