"""How large a file the CLI works on: the rewrite's limit (``--max-file-size``) and the restore's, derived from it.

The limits exist for memory. A rewrite holds libcst's tree, many times the size of its source; a restore holds
an ``ast`` of the instrumented text, several times less per MB of that text (bench/rewrite_memory.py;
docs/benchmarks.md, 'Memory of rewrite and restore').

A restore reads what a rewrite wrote, and a rewrite writes more than it read: megatron-core's files grow a
little, the benchmark's generated module more than doubles, and a chain of unary operators (``~~x``) grows most,
each operator becoming ``__msprobe__.invert(...)``. Were the restore held to the rewrite's limit, a file
rewritten within it could not be restored (a 1 MB module of the benchmark's kind rewrites past the default
2 MiB). So:

- the restore's limit is ``RESTORE_GROWTH`` times the rewrite's. At that factor a restore holds about what a
  rewrite may hold at its own limit (the two memories per MB of bench/rewrite_memory.py), and it leaves room
  for any real module's growth;
- a rewrite whose result would pass the restore's limit is not written (``rewritten_too_large``): whatever a
  rewrite with a given ``--max-file-size`` wrote, a restore with the same limit reads
  (tests/compiler/test_cli_faults.py, test_restore_reads_every_file_the_rewrite_wrote).
"""

from __future__ import annotations

from typing import Optional

DEFAULT_MAX_BYTES = 2 << 20
RESTORE_GROWTH = 8


def restore_limit(max_bytes: Optional[int]) -> Optional[int]:
    """The most bytes ``--restore`` reads, given the rewrite's limit (None: no limit)."""
    return None if max_bytes is None else max_bytes * RESTORE_GROWTH


def mib(size: int) -> str:
    return f"{size / (1 << 20):.3g} MiB"


def _restore_limit_words(max_bytes: int) -> str:
    return f"the {mib(restore_limit(max_bytes))} that --restore reads ({RESTORE_GROWTH}x --max-file-size)"


def rewritten_too_large(result_size: int, max_bytes: int) -> str:
    """Why a rewrite is not written: its result would be past what a restore reads."""
    return (
        f"rewritten it would be {mib(result_size)}, past {_restore_limit_words(max_bytes)}, so it could not "
        "be restored; left as it is"
    )


def restore_too_large(size: int, max_bytes: int) -> str:
    """Why an instrumented file is left instrumented by a restore."""
    return (
        f"{mib(size)}, past {_restore_limit_words(max_bytes)}: left instrumented; restore it with a larger "
        "--max-file-size (a restore holds about 0.1 GB of memory per MB)"
    )


def restore_skips(size: int, max_bytes: int) -> str:
    """Why a file that is not instrumented is not read by a restore (nothing to restore: not an error)."""
    return f"{mib(size)}, past {_restore_limit_words(max_bytes)}; not instrumented, left as it is"
