"""Garbage collection paused while one module is rewritten.

A parse allocates hundreds of thousands of short-lived nodes (libcst's, or ``ast``'s on the import hook's
path), and every collection they trigger walks the whole heap, which under the import hook holds torch: a
share of the CLI's time, and more of a cold import (bench/rewrite_throughput.py, bench/import_time.py;
docs/benchmarks-log.md, 'Rewrite throughput of megatron-core', 'Import time under the hook'). The cycles a
rewrite leaves are collected after it.
"""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def paused_gc():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
