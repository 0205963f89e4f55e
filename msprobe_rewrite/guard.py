"""``msprobe-rewrite guard [--fix] FILE...``: keep instrumented files out of commits (the pre-commit hooks).

Without ``--fix`` each instrumented file is named with the command that restores it, and the exit status is
1. With ``--fix`` each is restored to its exact original bytes in place (atomically); as with ruff's
``--fix``, the status is then 0 unless something could not be fixed, and pre-commit fails the hook anyway
because files were modified. ``--exit-non-zero-on-fix`` makes a fix exit 1 as well.

A file is instrumented when it carries the runtime import, or calls of runtime entry points whose import was
deleted, *and* restoring it changes it: their text alone also appears in this project's own source, in strings.
Where restore cannot be sure of the original bytes (a deleted import, one a formatter moved), a note says why.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import List, Optional, Sequence, Tuple

from .api import RewriteError, is_instrumented, restore_report
from .atomic import write_atomic
from .files import PYTHON, PathNotFound, discover

PROG = "msprobe-rewrite guard"
EXIT_CLEAN, EXIT_FOUND, EXIT_ERROR = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Fail on Python files that carry msprobe-rewrite instrumentation (or restore them).",
        epilog="Exit status: 0 none instrumented (or all restored with --fix), 1 instrumented files found, 2 error.",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files and folders to check")
    parser.add_argument(
        "--fix", action="store_true", help="restore instrumented files to their exact original bytes, in place"
    )
    parser.add_argument("--exit-non-zero-on-fix", action="store_true", help="with --fix, exit 1 if a file was restored")
    parser.add_argument(
        "--exclude",
        metavar="GLOB",
        action="append",
        default=[],
        help="skip files and folders whose relative path or name matches GLOB; repeatable",
    )
    return parser


def _error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


def instrumented_original(source: bytes, path: str) -> Optional[bytes]:
    """The original bytes of an instrumented ``source``, or None when it is not instrumented."""
    return _restored(source, path)[0]


def _restored(source: bytes, path: str) -> Tuple[Optional[bytes], List[str]]:
    """``instrumented_original``, and restore's notes on where that may not be the original bytes."""
    if not is_instrumented(source):  # a text test: most files stop here without parsing
        return None, []
    original, notes = restore_report(source, path)
    return (None, []) if original == source else (original, notes)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        entries = [e for e in discover(args.paths, args.exclude) if e.kind == PYTHON]
    except PathNotFound as missing:
        _error(f"{missing}: no such file or folder")
        return EXIT_ERROR
    found, errors = [], 0
    for entry in entries:
        try:
            with open(entry.path, "rb") as handle:
                source = handle.read()
            stat = os.stat(entry.path)
            original, notes = _restored(source, entry.path)
            if original is None:
                continue
            found.append(entry.path)
            if args.fix:
                write_atomic(entry.path, original, unchanged_since=stat)
                print(f"{entry.path}: restored the original bytes (was instrumented by msprobe-rewrite)")
            else:
                print(
                    f"{entry.path}: instrumented by msprobe-rewrite; restore it with: "
                    f"msprobe-rewrite --restore {shlex.quote(entry.path)}"
                )
            for note in notes:
                print(f"{entry.path}: note: {note}")
        except RewriteError as error:
            _error(str(error))
            errors += 1
        except OSError as error:
            _error(f"{entry.path}: {error.strerror or error}")
            errors += 1
        except Exception as error:  # ModifiedMeanwhile and the like: name the file, go on with the rest
            _error(f"{entry.path}: {error}")
            errors += 1
    if found and not args.fix:
        print(
            f"{PROG}: {len(found)} instrumented file{'s' * (len(found) != 1)}; restore all with: "
            f"msprobe-rewrite --restore {' '.join(shlex.quote(p) for p in found)}",
            file=sys.stderr,
        )
    if errors:
        return EXIT_ERROR
    if found and (not args.fix or args.exit_non_zero_on_fix):
        return EXIT_FOUND
    return EXIT_CLEAN
