"""Worker processes that replay items, each watched by the parent, so that one that dies costs only its API.

``multiprocessing.Pool`` replaces a worker that dies (a signal, ``os._exit``, the kernel's OOM killer) but
loses the task it held, and its ``imap`` then waits for that result forever (tests/precheck/
test_worker_death.py). Here each worker holds one item at a time, on a pipe of its own, and the parent waits
on the pipes and on the processes' sentinels together: an ended process whose item is unanswered died on that
item, which gets a result saying so (``died``); the other items go on, on a new worker in its place.
"""

from __future__ import annotations

import os
import signal
from collections import deque
from multiprocessing.connection import wait
from typing import Any, Callable, Deque, Dict, List, Optional

from . import worker_entry
from .errors import PrecheckError

# how long a worker told to stop may take to end before it is killed
STOP_GRACE_S = 5.0


def describe_end(exitcode: Optional[int]) -> str:
    """How a process ended, from its exit code (negative: the signal that killed it)."""
    if exitcode is None:
        return "it is still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-exitcode}, {name}"
    return f"exited with status {exitcode}"


def died(item: Dict[str, Any], exitcode: Optional[int]) -> Dict[str, Any]:
    """The result of an item whose worker died while replaying it: a skip row, and a problem (exit status 2)."""
    from .standards import SKIP

    problem = (
        f"the worker process replaying it died ({describe_end(exitcode)}); no result for this API, "
        "the others are reported"
    )
    row = {
        "api": item["name"],
        "label": item.get("label", ""),
        "direction": "forward",
        "tensor": "",
        "dtype": "",
        "shape": "",
        "standard": "",
        "metric": "replay",
        "device": None,
        "cpu": None,
        "ratio": None,
        "threshold": "",
        "status": SKIP,
        "message": problem,
    }
    return {"rows": [row], "plots": {}, "problem": problem}


class _Worker:
    """One worker process, its end of the pipe, and the index of the item it holds (None: idle or starting)."""

    def __init__(self, context, table: Dict[str, str], threads: Optional[int]):
        parent_end, child_end = context.Pipe()
        self.process = context.Process(
            target=worker_entry.serve, args=(child_end, table, threads, os.getpid()), daemon=True
        )
        self.process.start()
        child_end.close()
        self.conn = parent_end
        self.ready = False
        self.holding: Optional[int] = None

    def stop(self) -> None:
        """End an idle worker: it leaves its loop on None."""
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(STOP_GRACE_S)
        self.kill()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


def run(
    items: List[Dict[str, Any]],
    table: Dict[str, str],
    jobs: int,
    context,
    on_done: Optional[Callable[[int, str], None]] = None,
) -> List[Dict[str, Any]]:
    """``worker.check`` of each item, in the order of ``items``, over ``jobs`` processes of ``context``."""
    results: List[Optional[Dict[str, Any]]] = [None] * len(items)
    pending: Deque[int] = deque(range(len(items)))
    workers: List[_Worker] = []
    done = 0

    def finish(index: int, result: Dict[str, Any]) -> None:
        nonlocal done
        results[index] = result
        done += 1
        if on_done:
            on_done(done, items[index]["name"])

    finished = False
    try:
        for _ in range(min(jobs, len(items))):
            workers.append(_Worker(context, table, 1))
        while done < len(items):
            for each in workers:
                if each.ready and each.holding is None and pending:
                    each.holding = pending.popleft()
                    try:
                        each.conn.send(items[each.holding])
                    except OSError:  # it died before it could read the item: the item goes to another worker
                        pending.appendleft(each.holding)
                        each.holding = None
            wait([each.conn for each in workers] + [each.process.sentinel for each in workers])
            for each in list(workers):
                ended = not each.process.is_alive()
                # answers first: a worker that answered and then ended leaves its answer in the pipe
                while each.conn.poll():
                    try:
                        message = each.conn.recv()
                    except (EOFError, OSError):
                        ended = True
                        break
                    if not each.ready:
                        each.ready = True  # its first message: initialised, ready for items
                        continue
                    index, each.holding = each.holding, None
                    finish(index, message)
                    break  # one item held, one answer
                if not ended:
                    continue
                each.kill()
                workers.remove(each)
                if not each.ready:
                    raise PrecheckError(f"a worker process could not start ({describe_end(each.process.exitcode)})")
                if each.holding is not None:
                    finish(each.holding, died(items[each.holding], each.process.exitcode))
                if pending:
                    workers.append(_Worker(context, table, 1))
        finished = True
    finally:
        # all idle when finished; else (Ctrl-C, a worker that could not start) some may be mid-call: no waiting
        for each in workers:
            if finished:
                each.stop()
            else:
                each.kill()
    return results  # type: ignore[return-value]
