"""Run the checks of every item over worker processes, in dump order, with a progress line.

The parent reads only JSON and never imports torch, so workers are forked cheaply; each worker reads the
tensors of one call from disk, replays it and returns rows, so memory holds at most one call per worker
(``worker_processes``: a worker that dies costs only the call it held). With one job the checks run in this
process.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional


def _context():
    """fork, after importing torch here once (a second each worker would otherwise spend), when this process
    has not run torch yet: no intra-op thread pool exists to be broken by the fork. Otherwise (torch already
    in use, as in an interactive session) a fresh interpreter per worker."""
    if not hasattr(os, "fork") or "torch" in sys.modules:
        return multiprocessing.get_context("spawn")
    # imported, nothing run: torch's thread pools start on first use, in each worker
    importlib.import_module("torch")
    importlib.import_module(f"{__package__}.worker")
    return multiprocessing.get_context("fork")


def run(
    items: List[Dict[str, Any]], table: Dict[str, str], jobs: int, on_done: Optional[Callable[[int, str], None]] = None
) -> List[Dict[str, Any]]:
    """The result of ``worker.check`` for each item, in the order of ``items``."""
    results: List[Dict[str, Any]] = []
    if jobs <= 1 or len(items) <= 1:
        from . import worker

        worker.init(table, None)
        for done, item in enumerate(items, 1):
            results.append(worker.check(item))
            if on_done:
                on_done(done, item["name"])
        return results
    from . import worker_processes

    return worker_processes.run(items, table, jobs, _context(), on_done)


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:
        return os.cpu_count() or 1


__all__: Iterable[str] = ["run", "default_jobs"]
