"""The ``msprobe-rewrite`` command line (also ``python -m msprobe_rewrite``): argument parsing, the
report, and exit codes. Walking files lives in ``files``, doing the work in ``batch``.

``msprobe-rewrite PATH...`` is the rewrite command. Later commands (``run``, ``check``, ``compare``) are
subcommands registered in ``SUBCOMMANDS``: when the first argument is one of their names it is
dispatched there, so adding one never changes what ``msprobe-rewrite PATH`` means for any other PATH.
A folder whose name is a subcommand is still reachable as ``./run`` or ``msprobe-rewrite rewrite run``.

Exit status, as black and ruff use it: 0 when the work asked for was done (a rewrite in place, ``--out``
or ``--restore``, whether or not a file changed), 1 only where the user asked to be told: ``--check`` or
``--diff`` found a file that would change; 2 an error: bad arguments, a missing PATH, a bad catalogue, or a
file that could not be processed, or left instrumented by ``--restore`` (every other file is still
processed). So ``msprobe-rewrite --out DIR . && python DIR/train.py`` runs the copy
(``tests/compiler/test_cli.py::test_exit_status_as_black_uses_it``).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import os
import sys
import textwrap
import warnings
from typing import Callable, Dict, List, Optional, Sequence

from . import batch, size_limits
from ._version import __version__
from .cache import ResultCache, compiler_fingerprint, default_directory
from .files import PYTHON, PathNotFound, discover
from .progress import Progress

PROG = "msprobe-rewrite"

EXIT_CLEAN = 0
EXIT_WOULD_CHANGE = 1  # --check / --diff only: the user asked to be told
EXIT_ERROR = 2

# Written into every --out folder this tool creates or fills. A folder that is not empty is written into
# only when it carries this file (a copy made earlier, refreshed) or with --force: anything else there is
# somebody's own work that a same-named file of the copy would replace.
OUT_MARKER = ".msprobe-rewrite-out"
OUT_MARKER_TEXT = (
    f"This folder holds a copy instrumented by {PROG} (--out). Running {PROG} --out into it again replaces its files.\n"
)


def _default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _format_restore_warning(message, category, filename, lineno, line=None):
    """A restore's note (``api.RestoreWarning``: the file and what may differ) as one line of this command's,
    not as a Python warning pointing into the batch code."""
    from .api import RestoreWarning

    if issubclass(category, RestoreWarning):
        return f"{PROG}: warning: {message}\n"
    return _PYTHON_FORMATWARNING(message, category, filename, lineno, line)


_PYTHON_FORMATWARNING = warnings.formatwarning


# What each command does, for the overview that --help and a bare `msprobe-rewrite` print
# (test_bare_command_lists_every_command). A command missing here is still listed, by name.
COMMAND_SUMMARIES: Dict[str, str] = {
    "rewrite": "PATH...: instrument files in place (the default: `msprobe-rewrite PATH...`); "
    "options: --out, --check, --diff, --restore, ...",
    "run": "[--packages PKG] -- script.py ARGS | -m MODULE ARGS: run a program with its imports instrumented, "
    "nothing written to disk",
    "compare": "RUN_A RUN_B: align two runs' dumps and name the first divergence",
    "precheck": "DUMP: replay each dumped API call on the CPU and grade it, with no reference run",
    "nan": "DUMP: name where NaN or Inf started in one run (the op, step, rank and line), as msprobe's overflow_check",
    "monitor-report": "DIR: an HTML page of a training monitor's CSV output (a plot per metric and layer, the "
    "anomalies marked) and the layers whose gradient norms grew first",
    "check": "PATH...: report API calls the instrumentation cannot see (the lint)",
    "guard": "PATH...: fail on instrumented files, or restore them with --fix (for pre-commit)",
    "hook-path": "print the folder to put on PYTHONPATH so that $MSPROBE_REWRITE_PACKAGES instruments on import",
}


def _commands_overview(width: int = 100) -> str:
    names = list(SUBCOMMANDS)
    pad = max(len(name) for name in names) + 2
    lines = ["commands (`msprobe-rewrite COMMAND --help` for each):"]
    for name in names:
        wrapped = textwrap.wrap(COMMAND_SUMMARIES.get(name, ""), width - pad - 2) or [""]
        lines.append(f"  {name:<{pad}}{wrapped[0]}".rstrip())
        lines.extend(" " * (pad + 2) + line for line in wrapped[1:])
    return "\n".join(lines)


def _bare_overview() -> str:
    parser = build_parser()
    return (
        f"{parser.format_usage()}\n{parser.description}\n\n{_commands_overview()}\n\n"
        f"The rewrite's options: {PROG} --help"
    )


def build_parser() -> argparse.ArgumentParser:
    exit_status = textwrap.fill(
        "Exit status (as black's): 0 done, whether or not a file changed (a rewrite in place, --out, --restore); "
        "1 only with --check or --diff, when a file would change; 2 error (a file that could not be processed, "
        "or that --restore left instrumented). A folder named like a command can be given as ./NAME.",
        100,
    )
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage="%(prog)s [options] PATH [PATH ...]\n       %(prog)s COMMAND [arguments]",
        description="Instrument PyTorch call sites in Python source trees for precision debugging.",
        epilog=f"{_commands_overview()}\n\n{exit_status}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files and folders to process")
    what = parser.add_argument_group("what to do (default: rewrite in place)")
    what.add_argument(
        "--out",
        metavar="DIR",
        help="write an instrumented copy of the tree (non-Python files copied too) to DIR "
        "instead of rewriting in place; takes exactly one PATH, whose contents "
        "become DIR's contents. A DIR that is not empty is refused unless an earlier "
        f"--out wrote it (it holds {OUT_MARKER}) or --force is given",
    )
    what.add_argument(
        "--force",
        action="store_true",
        help="with --out: write into DIR even if it is not empty, replacing same-named files",
    )
    what.add_argument(
        "--check", action="store_true", help="write nothing; list the files that would change and exit 1 if any"
    )
    what.add_argument(
        "--diff", action="store_true", help="write nothing; print a unified diff and exit 1 if it is not empty"
    )
    what.add_argument("--restore", action="store_true", help="return instrumented files to their exact original bytes")
    how = parser.add_argument_group("how")
    how.add_argument(
        "--catalogue",
        metavar="FILE",
        action="append",
        default=[],
        help="a catalogue YAML (msprobe's support_wrap_ops.yaml sections, or 'custom:') "
        "whose entries add to or replace the shipped ones; repeatable",
    )
    how.add_argument(
        "--exclude",
        metavar="GLOB",
        action="append",
        default=[],
        help="skip files and folders whose path (relative to PATH) or name matches GLOB; repeatable",
    )
    how.add_argument(
        "-j",
        "--jobs",
        type=_positive_int,
        default=None,
        metavar="N",
        help="worker processes (default: all available cores)",
    )
    how.add_argument(
        "--no-cache",
        action="store_true",
        help="neither read nor write the result cache "
        "(default location: rewrite/ in $MSPROBE_CACHE_DIR, else in $XDG_CACHE_HOME/msprobe-rewrite; "
        "$MSPROBE_REWRITE_CACHE_DIR, where set, is the folder itself)",
    )
    how.add_argument(
        "--max-file-size",
        type=float,
        default=batch.DEFAULT_MAX_BYTES / (1 << 20),
        metavar="MIB",
        help="skip (and name) files larger than this many MiB: libcst needs about 1 GB of memory per "
        "MB of source (default: %(default)g; 0: no limit). --restore reads files up to "
        f"{size_limits.RESTORE_GROWTH}x as large (what a rewrite writes is larger than what it "
        "read), and a rewrite writes none larger",
    )
    how.add_argument(
        "--no-verify",
        action="store_true",
        help="do not check that each rewritten file compiles before writing it (a few percent faster)",
    )
    out = parser.add_argument_group("output")
    out.add_argument("-q", "--quiet", action="store_true", help="print only errors (and --check/--diff output)")
    out.add_argument("-v", "--verbose", action="store_true", help="name every file that changed or was skipped")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def _error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


def _print_path(path: str) -> None:
    # A file name that is not valid in the locale's encoding (os.walk hands it over with surrogate
    # escapes) is printed as its raw bytes rather than crashing a strict stdout.
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        print(path)
        return
    sys.stdout.flush()
    buffer.write(os.fsencode(path) + b"\n")
    buffer.flush()


def _diff(path: str, before: bytes, after: bytes) -> bytes:
    def lines(data: bytes) -> List[bytes]:
        result = data.splitlines(keepends=True)
        if result and not result[-1].endswith((b"\n", b"\r")):
            result[-1] += b"\n\\ No newline at end of file\n"
        return result

    name = os.fsencode(path.replace(os.sep, "/"))
    return b"".join(
        difflib.diff_bytes(
            difflib.unified_diff, lines(before), lines(after), fromfile=b"a/" + name, tofile=b"b/" + name
        )
    )


def _catalogue_files_digest(extra_files: Sequence[str]) -> Optional[str]:
    """A digest of the catalogue files' bytes, for the cache key, without parsing them.

    Parsing the YAML costs more than a whole run of cache hits, so it waits for the first miss. A key
    from the exact bytes is safe: results are only ever stored after those bytes loaded successfully.
    None when a file cannot be read (the loader then reports it).
    """
    from msprobe_runtime.catalogue import DEFAULT_FILES

    digest = hashlib.sha256()
    for path in [*DEFAULT_FILES, *extra_files]:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError:
            return None
        digest.update(b"%d\0" % len(data) + data)
    return digest.hexdigest()


def _validate_out(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.check or args.diff:
        parser.error("--out writes a copy; it cannot be combined with --check or --diff")
    if len(args.paths) != 1:
        parser.error("--out takes exactly one PATH (a folder, whose contents are copied into DIR, or a file)")


def _out_problem(source: str, out_dir: str, force: bool = False) -> Optional[str]:
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        return f"--out {out_dir} exists and is not a folder"
    if os.path.isdir(source):
        src, dst = os.path.realpath(source), os.path.realpath(out_dir)
        if dst == src or dst.startswith(src.rstrip(os.sep) + os.sep):
            return f"--out {out_dir} is inside {source}; a second run would instrument the copy"
    if os.path.isdir(out_dir) and not force:
        try:
            names = os.listdir(out_dir)
        except OSError as error:
            return f"--out {out_dir}: cannot list it: {error.strerror or error}"
        if names and OUT_MARKER not in names:
            return (
                f"--out {out_dir} is not empty and was not written by {PROG} (it has no {OUT_MARKER}); "
                "its files would be replaced. Give a new or empty folder, or add --force to write "
                "into it anyway"
            )
    return None


def _mark_out(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    marker = os.path.join(out_dir, OUT_MARKER)
    if not os.path.isfile(marker):
        with open(marker, "w", encoding="utf-8") as handle:
            handle.write(OUT_MARKER_TEXT)


def _rewrite_main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.out is not None:
        _validate_out(args, parser)
    elif args.force:
        parser.error("--force only goes with --out")

    try:
        entries = discover(args.paths, args.exclude)
    except PathNotFound as missing:
        _error(f"{missing}: no such file or folder")
        return EXIT_ERROR
    if args.out is not None:
        problem = _out_problem(args.paths[0], args.out, force=args.force)
        if problem:
            _error(problem)
            return EXIT_ERROR

    mode = batch.RESTORE if args.restore else batch.REWRITE
    from msprobe_runtime.catalogue import CatalogueError, load_catalogue

    loaded = []

    def catalogue():
        if not loaded:
            loaded.append(load_catalogue(args.catalogue))
        return loaded[0]

    digest = _catalogue_files_digest(args.catalogue) if mode == batch.REWRITE else ""
    try:
        if digest is None or (mode == batch.RESTORE and args.catalogue):
            # An unreadable file: fail now with the loader's message. Restore needs no catalogue, but a
            # bad one named on the command line is still an error.
            catalogue()
    except CatalogueError as error:
        _error(f"bad catalogue: {error}")
        return EXIT_ERROR

    cache = None
    if not args.no_cache:
        cache = ResultCache(default_directory(), f"{compiler_fingerprint()}\0{digest}")

    dry = args.check or args.diff
    options = batch.Options(
        mode=mode,
        write=batch.NOWHERE if dry else (batch.OUT if args.out is not None else batch.IN_PLACE),
        out_dir=args.out,
        jobs=args.jobs or _default_jobs(),
        keep_results=args.diff,
        catalogue=catalogue if mode == batch.REWRITE else None,  # loaded only on a cache miss
        cache=cache,
        verify=not args.no_verify,
        max_bytes=int(args.max_file_size * (1 << 20)) if args.max_file_size > 0 else None,
    )
    if args.out is not None:
        try:
            _mark_out(args.out)
        except OSError as error:
            _error(f"--out {args.out}: {error.strerror or error}")
            return EXIT_ERROR

    progress = Progress(sum(1 for entry in entries if entry.kind == PYTHON), enabled=False if args.quiet else None)
    plain_format = warnings.formatwarning
    warnings.formatwarning = _format_restore_warning  # forked workers inherit it too
    try:
        outcomes = batch.run(entries, options, on_progress=lambda done, total, label: progress.update(done, label))
    except CatalogueError as error:  # raised before any file is written
        progress.clear()
        _error(f"bad catalogue: {error}")
        return EXIT_ERROR
    finally:
        warnings.formatwarning = plain_format
        progress.clear()
    return _report(args, mode, outcomes, cache)


def _report(args: argparse.Namespace, mode: str, outcomes: List[batch.Outcome], cache: Optional[ResultCache]) -> int:
    changed = [o for o in outcomes if o.status == batch.CHANGED]
    failed = [o for o in outcomes if o.status == batch.FAILED]
    counts = {
        status: sum(1 for o in outcomes if o.status == status)
        for status in (batch.CHANGED, batch.UNCHANGED, batch.SKIPPED, batch.FAILED)
    }

    if args.diff:
        out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else None
        for outcome in changed:
            text = _diff(outcome.path, outcome.source, outcome.result)
            if out is not None:
                out.write(text)
            else:  # a replaced sys.stdout (tests, notebooks) takes text
                sys.stdout.write(text.decode("utf-8", "replace"))
        if out is not None:
            out.flush()
    if args.check:
        for outcome in changed:
            _print_path(outcome.path)
    if not args.quiet:
        verb = "restored" if mode == batch.RESTORE else "rewrote"
        for outcome in outcomes:
            if not (args.verbose or outcome.notice):
                continue
            if outcome.status == batch.CHANGED and not (args.check or args.diff):
                print(f"{verb} {outcome.path}", file=sys.stderr)
            elif outcome.status == batch.SKIPPED:
                print(f"skipped {outcome.path}" + (f" ({outcome.reason})" if outcome.reason else ""), file=sys.stderr)
    for outcome in failed:
        _error(f"{outcome.path}: {outcome.reason}")
    if cache is not None and cache.problem and not args.quiet:
        print(f"{PROG}: warning: {cache.problem}", file=sys.stderr)
    if not args.quiet:
        # A restore says what it did in its own word (test_restore_summary_says_restored).
        if mode == batch.RESTORE:
            changed_word = "would be restored" if (args.check or args.diff) else "restored"
        else:
            changed_word = "would change" if (args.check or args.diff) else "changed"
        print(
            f"{PROG}: {counts[batch.CHANGED]} {changed_word}, {counts[batch.UNCHANGED]} unchanged, "
            f"{counts[batch.SKIPPED]} skipped, {counts[batch.FAILED]} failed",
            file=sys.stderr,
        )

    if failed:
        return EXIT_ERROR
    if args.check or args.diff:  # only where the user asked to be told, as black --check
        return EXIT_WOULD_CHANGE if changed else EXIT_CLEAN
    return EXIT_CLEAN


def _run_main(argv: Sequence[str]) -> int:
    from .run_command import main as run_main

    return run_main(argv)


def _hook_path_main(argv: Sequence[str]) -> int:
    """Print the folder to put on PYTHONPATH so that $MSPROBE_REWRITE_PACKAGES installs the import hook."""
    from . import startup

    # A parser of no arguments, so that --help prints usage like every other command's, and a stray argument is
    # a usage error: before, `hook-path --help` printed the path (test_every_command_answers_help).
    argparse.ArgumentParser(
        prog=f"{PROG} hook-path",
        description="P" + COMMAND_SUMMARIES["hook-path"][1:] + ", as in: "
        "PYTHONPATH=$(msprobe-rewrite hook-path) MSPROBE_REWRITE_PACKAGES=megatron python train.py",
    ).parse_args(argv)
    print(os.path.dirname(os.path.abspath(startup.__file__)))
    return EXIT_CLEAN


def _check_main(argv: Sequence[str]) -> int:
    from .lint.runner import main as check_main

    return check_main(argv)


def _guard_main(argv: Sequence[str]) -> int:
    from .guard import main as guard_main

    return guard_main(argv)


def _compare_main(argv: Sequence[str]) -> int:
    from .compare.cli import main as compare_main

    return compare_main(argv)


# name -> handler taking the arguments after the name.
SUBCOMMANDS: Dict[str, Callable[[Sequence[str]], int]] = {
    "rewrite": _rewrite_main,
    "run": _run_main,
    "hook-path": _hook_path_main,
    "check": _check_main,
    "guard": _guard_main,
    "compare": _compare_main,
    "nan": lambda argv: __import__("msprobe_rewrite.compare.nan_cli", fromlist=["main"]).main(argv),
    "precheck": lambda argv: __import__("msprobe_rewrite.precheck.cli", fromlist=["main"]).main(argv),
    "monitor-report": lambda argv: __import__("msprobe_rewrite.monitor_report", fromlist=["main"]).main(argv),
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        # Bare `msprobe-rewrite` used to say only "the following arguments are required: PATH", hiding every
        # command; it prints the overview instead, and exits 2 as any usage error (test_bare_command_...).
        print(_bare_overview())
        return EXIT_ERROR
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]](argv[1:])
        return _rewrite_main(argv)
    except SystemExit as exit_:  # argparse reports usage errors by raising; main() returns codes
        return exit_.code if isinstance(exit_.code, int) else EXIT_ERROR
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `msprobe-rewrite --diff . | head`
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_ERROR
