"""Applying the compiler to a list of files: cache look-ups, a process pool for the misses, and writing
results (in place, into an --out tree, or nowhere for --check/--diff).

Everything that touches the file system or the cache happens in this (the parent) process, in one place;
workers only turn bytes into bytes. So a worker that dies cannot leave a half-written file, and the cache
has one writer per run.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import os
import stat
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import atomic, size_limits, worker_signals
from .cache import FAIL, NEW, SAME, ResultCache, source_digest
from .files import EXCLUDED, LINK, NOT_REGULAR, OTHER, PYTHON, SPECIAL, Entry, is_python
from .markers import SKIP_FILE_MARKER, is_instrumented, module_of, package_of

REWRITE = "rewrite"
RESTORE = "restore"

IN_PLACE = "in-place"
OUT = "out"
NOWHERE = "nowhere"

CHANGED = "changed"
UNCHANGED = "unchanged"
SKIPPED = "skipped"
FAILED = "failed"

# A worker result that must not be cached: the compiler itself broke, which a fixed version may not.
_CRASH = "crash"

DEFAULT_MAX_BYTES = size_limits.DEFAULT_MAX_BYTES


@dataclass
class Options:
    mode: str = REWRITE
    write: str = IN_PLACE
    out_dir: Optional[str] = None
    jobs: int = 1
    keep_results: bool = False  # keep source and result bytes of changed files, for --diff
    # A Catalogue, or a function that loads one (called only if some file misses the cache); None
    # for restore.
    catalogue: object = None
    cache: Optional[ResultCache] = None
    verify: bool = True  # refuse a rewritten file that does not compile
    # A rewrite holds libcst's tree, many times the source's size (size_limits): past this size a file is skipped
    # and said, never attempted. A restore reads up to size_limits.RESTORE_GROWTH times as much, and a rewrite
    # writes no more than that (size_limits says why). None: no limit
    max_bytes: Optional[int] = DEFAULT_MAX_BYTES


@dataclass
class Outcome:
    path: str
    status: str
    reason: str = ""
    source: Optional[bytes] = None
    notice: bool = False  # a skip the user must hear of even without --verbose
    result: Optional[bytes] = None


# --- the worker side -------------------------------------------------------------------------------

_worker_catalogue = None
_verify = True


def _init_worker(catalogue, verify: bool = True) -> None:
    global _worker_catalogue, _verify
    _worker_catalogue = catalogue
    _verify = verify


def _transform(task: Tuple[int, str, bytes, str]) -> Tuple[int, str, bytes]:
    index, mode, source, path = task
    # Looked up on the module at call time, not imported by name, so the api module stays the one
    # place that defines what a rewrite is.
    from . import api

    try:
        if mode == REWRITE:
            result = api.rewrite_source(source, _worker_catalogue, path=path)
        else:
            result = api.restore_source(source, path=path)
    except api.RewriteError as error:
        reason = str(error)
        # The CLI puts the path in front of every reason; do not say it twice.
        if reason.startswith(f"{path}: "):
            reason = reason[len(path) + 2 :]
        return index, FAIL, reason.encode("utf-8", "replace")
    except Exception as error:  # a compiler bug must cost one file, not the run
        return index, _CRASH, f"internal error: {type(error).__name__}: {error}".encode("utf-8", "replace")
    if result == source:
        return index, SAME, b""
    if mode == REWRITE and _verify:
        problem = _does_not_compile(result, source, path)
        if problem:
            # Cached like a parse error: it is a function of the source and of the compiler's code,
            # which is part of the cache key, so a fixed compiler misses and retries.
            return index, FAIL, problem.encode("utf-8", "replace")
    return index, NEW, result


def _compile_quietly(data: bytes, path: str) -> None:
    # The user's own invalid escape sequences would otherwise print a SyntaxWarning per file.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile(data, path, "exec", dont_inherit=True)


def _does_not_compile(result: bytes, source: bytes, path: str) -> Optional[str]:
    """Why ``result`` fails to compile when ``source`` did, or None.

    A compiler bug that emits invalid code would otherwise be written over the user's file, and an
    invalid file cannot even be restored. Costs a few percent of the rewrite; ``--no-verify`` skips it.
    """
    try:
        _compile_quietly(result, path)
        return None
    except (SyntaxError, ValueError) as error:
        try:
            _compile_quietly(source, path)
        except (SyntaxError, ValueError):
            return None  # not compilable to begin with (newer syntax than this Python): not ours to judge
        where = f" (line {error.lineno})" if getattr(error, "lineno", None) else ""
        message = getattr(error, "msg", error)
        return f"internal error: the rewritten file does not compile{where}: {message}; left as it is"


def _pool_worker(*args, **kwargs) -> None:
    """multiprocessing's pool worker loop, ending quietly once nobody reads its results.

    A parent killed with SIGKILL closes its end of the result pipe; the worker's next result then meets
    a broken pipe, which multiprocessing lets escape as a traceback on the terminal the parent shared.
    Only the parent reads that pipe (and closing the pool ends the workers before the pipe), so a broken
    pipe means there is no one left to report to. Ctrl-C is the parent's to handle (``worker_signals``).
    """
    worker_signals.ignore_sigint_in_worker()
    try:
        multiprocessing.pool.worker(*args, **kwargs)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        pass


class _Pool(multiprocessing.pool.Pool):
    @staticmethod
    def Process(ctx, *args, **kwds):  # noqa: N802 (multiprocessing's name)
        if kwds.get("target") is multiprocessing.pool.worker:
            kwds["target"] = _pool_worker
        return ctx.Process(*args, **kwds)


def _pool_context():
    # fork starts workers in milliseconds and lets them inherit the imported compiler; elsewhere the
    # platform default (spawn) is the only safe choice.
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def _run_transforms(tasks: List[Tuple[int, str, bytes, str]], jobs: int, catalogue, verify: bool):
    """Yield worker results as they complete (in any order)."""
    if not tasks:
        return
    from . import api  # noqa: F401  (imported before forking, so workers inherit it)

    workers = min(jobs, len(tasks))
    if workers > 1:
        # Started with SIGINT blocked, so that no worker ever takes a Ctrl-C (worker_signals).
        blocked = worker_signals.block_sigint()
        pool = None
        try:
            pool = _Pool(workers, initializer=_init_worker, initargs=(catalogue, verify), context=_pool_context())
        except OSError:  # no /dev/shm, process limits: one process still does the job
            pass
        finally:
            if pool is None:
                worker_signals.unblock_sigint(blocked)
        if pool is not None:
            try:
                worker_signals.unblock_sigint(blocked)  # a Ctrl-C held back meanwhile is raised here, in the try
                # Largest files first, so one big file does not start last and keep the run waiting.
                ordered = sorted(tasks, key=lambda task: len(task[2]), reverse=True)
                yield from pool.imap_unordered(_transform, ordered, chunksize=1)
                pool.close()
                pool.join()
            finally:
                # What `with pool` does, but a second Ctrl-C cannot break it off halfway (test_cli_faults.py,
                # test_ctrl_c_during_a_parallel_rewrite_exits_130_quietly).
                with worker_signals.sigint_ignored():
                    pool.terminate()
            return
    _init_worker(catalogue, verify)
    for task in tasks:
        yield _transform(task)


# --- the parent side -------------------------------------------------------------------------------


@dataclass
class _Pending:
    entry: Entry
    source: bytes
    stat: os.stat_result
    key: Optional[str]
    key_mode: str  # the mode and package the cache entry is keyed by


def _out_path(options: Options, entry: Entry) -> str:
    return os.path.join(options.out_dir, *entry.rel.split("/"))


def _same_content(path: str, data: bytes) -> bool:
    try:
        if os.path.getsize(path) != len(data):
            return False
        with open(path, "rb") as handle:
            return handle.read() == data
    except OSError:
        return False


def _write_out_bytes(dst: str, data: bytes, mode: int) -> None:
    # Re-running --out into the same folder leaves untouched files alone, so their mtimes (and whatever
    # build or sync tool watches them) stay quiet.
    if _same_content(dst, data):
        return
    os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
    # A hard link in the copy is split, which leaves the file it shared its bytes with alone.
    atomic.write_atomic(dst, data, mode=mode, refuse_hard_links=False)


def _copy_out(src: str, dst: str) -> None:
    try:
        s, d = os.stat(src), os.stat(dst)
        if (s.st_size, s.st_mtime_ns) == (d.st_size, d.st_mtime_ns):
            return
    except OSError:
        pass
    os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
    atomic.copy_atomic(src, dst)


def _link_out(src: str, dst: str) -> None:
    target = os.readlink(src)
    if os.path.islink(dst) and os.readlink(dst) == target:
        return
    os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
    if os.path.lexists(dst):
        os.unlink(dst)
    os.symlink(target, dst)


def _finish(options: Options, pending: _Pending, kind: str, payload: bytes) -> Outcome:
    """Turn one file's result into an outcome, writing what the options ask for."""
    entry, source = pending.entry, pending.source
    if kind in (FAIL, _CRASH):
        outcome = Outcome(entry.path, FAILED, payload.decode("utf-8", "replace"))
        if options.write == OUT:
            # The copy of the tree stays complete: a file we cannot rewrite is copied as it is.
            try:
                _copy_out(entry.path, _out_path(options, entry))
            except OSError as error:
                outcome.reason += f"; and it could not be copied: {error}"
        return outcome
    if kind == SAME:
        status = UNCHANGED
        if options.mode == REWRITE and SKIP_FILE_MARKER.search(source):
            status = SKIPPED
        outcome = Outcome(entry.path, status)
        if options.write == OUT:
            try:
                _copy_out(entry.path, _out_path(options, entry))
            except OSError as error:
                return Outcome(entry.path, FAILED, f"cannot copy to {_out_path(options, entry)}: {error}")
        return outcome
    result = payload
    limit = size_limits.restore_limit(options.max_bytes)
    if options.mode == REWRITE and limit is not None and len(result) > limit:
        # Written, it could not be restored with the same --max-file-size (size_limits; test_cli_faults.py,
        # test_a_rewrite_that_would_outgrow_the_restore_limit_is_not_written).
        outcome = Outcome(
            entry.path, SKIPPED, size_limits.rewritten_too_large(len(result), options.max_bytes), notice=True
        )
        if options.write == OUT:
            try:
                _copy_out(entry.path, _out_path(options, entry))
            except OSError as error:
                outcome = Outcome(entry.path, FAILED, f"cannot copy to {_out_path(options, entry)}: {error}")
        return outcome
    outcome = Outcome(entry.path, CHANGED)
    if options.keep_results:
        outcome.source, outcome.result = source, result
    try:
        if options.write == IN_PLACE:
            # Through a named symlink, the file it points at is rewritten and the link kept.
            atomic.write_atomic(os.path.realpath(entry.path), result, unchanged_since=pending.stat)
        elif options.write == OUT:
            _write_out_bytes(_out_path(options, entry), result, stat.S_IMODE(pending.stat.st_mode))
    except atomic.HardLinked as error:
        return Outcome(
            entry.path,
            FAILED,
            f"has {error.links} hard links; an atomic rewrite would split them (the other "
            f"names would keep the old bytes), so it is left as it is",
        )
    except OSError as error:
        return Outcome(entry.path, FAILED, f"cannot write: {error}")
    return outcome


def _too_large(options: Options, path: str, source: bytes) -> Optional[Outcome]:
    """The outcome of a file too large to work on, or None.

    A restore reads more than a rewrite does (``size_limits``). A file it leaves instrumented for its size is a
    failure, named, so that the run's status says the tree is not restored; one that is not instrumented has
    nothing to restore and is only skipped (test_cli_faults.py,
    test_restore_leaves_a_file_instrumented_only_as_an_error).
    """
    if options.max_bytes is None:
        return None
    if options.mode == REWRITE:
        if len(source) <= options.max_bytes:
            return None
        return Outcome(
            path,
            SKIPPED,
            f"{len(source) / (1 << 20):.1f} MiB, past the {options.max_bytes / (1 << 20):g} "
            f"MiB limit (--max-file-size): libcst needs about 1 GB of memory per MB; left as it is",
            notice=True,
        )
    if len(source) <= size_limits.restore_limit(options.max_bytes):
        return None
    if is_instrumented(source):
        return Outcome(path, FAILED, size_limits.restore_too_large(len(source), options.max_bytes))
    return Outcome(path, SKIPPED, size_limits.restore_skips(len(source), options.max_bytes), notice=True)


def _read_regular_file(path: str) -> Tuple[Optional[bytes], os.stat_result]:
    """The bytes and stat of ``path``; None for the bytes if it is not a regular file.

    Opened non-blocking and checked on the open descriptor, so a named pipe (which would block the open
    until something writes to it) or a device is never read, even one put there after the walk.
    """
    nonblocking = getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, os.O_RDONLY | nonblocking | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    with open(fd, "rb") as handle:
        file_stat = os.fstat(fd)
        if not stat.S_ISREG(file_stat.st_mode):
            return None, file_stat
        if nonblocking:
            os.set_blocking(fd, True)
        return handle.read(), file_stat


def run(
    entries: Sequence[Entry], options: Options, on_progress: Optional[Callable[[int, int, str], None]] = None
) -> List[Outcome]:
    """Process ``entries``; return one outcome per Python file (or skipped file), in ``entries`` order.

    Nothing is written until every file has been read and looked up and the catalogue (needed only for
    cache misses) has loaded, so a bad catalogue leaves every file as it was.
    """
    outcomes: List[Optional[Outcome]] = []
    others: List[Tuple[int, Entry]] = []
    hits: List[Tuple[int, _Pending, Tuple[str, bytes]]] = []
    pending: Dict[int, _Pending] = {}
    tasks: List[Tuple[int, str, bytes, str]] = []
    cache = options.cache
    # An unverified result must never be served to a run that asked for verification.
    key_mode = options.mode if options.verify or options.mode != REWRITE else options.mode + "+unverified"
    done = 0
    total = sum(1 for entry in entries if entry.kind == PYTHON)

    def progressed(label: str) -> None:
        nonlocal done
        done += 1
        if on_progress is not None:
            on_progress(done, total, label)

    for entry in entries:
        index = len(outcomes)
        outcomes.append(None)
        if entry.kind in (OTHER, EXCLUDED, LINK, SPECIAL):
            others.append((index, entry))
            continue
        try:
            source, file_stat = _read_regular_file(entry.path)
        except OSError as error:
            outcomes[index] = Outcome(entry.path, FAILED, f"cannot read: {error.strerror or error}")
            progressed(entry.path)
            continue
        if source is None:
            outcomes[index] = Outcome(entry.path, SKIPPED, NOT_REGULAR)
            progressed(entry.path)
            continue
        too_large = _too_large(options, entry.path, source)
        if too_large is not None:
            outcomes[index] = too_large
            progressed(entry.path)
            continue
        # the rewrite depends on the file's module name too (relative imports, and the catalogued functions the
        # module defines, decide which calls are APIs): a byte-identical file under another name is another entry
        entry_mode = (
            f"{key_mode}\0{module_of(entry.path, package_of(entry.path)) or ''}" if cache is not None else key_mode
        )
        key = cache.key(source_digest(source), entry_mode) if cache is not None else None
        item = _Pending(entry, source, file_stat, key, entry_mode)
        hit = cache.get(key) if cache is not None else None
        if hit is not None:
            hits.append((index, item, hit))
        else:
            pending[index] = item
            tasks.append((index, options.mode, source, entry.path))

    catalogue = options.catalogue
    if callable(catalogue):
        # Loading the catalogue (YAML) costs more than a whole run of cache hits; only misses need it.
        catalogue = catalogue() if tasks or total == 0 else None

    for index, entry in others:
        if entry.kind == SPECIAL:
            # Never opened: a named pipe would block the run, a device never end it. Not copied by --out.
            outcomes[index] = Outcome(entry.path, SKIPPED, NOT_REGULAR)
            continue
        if options.write == OUT:
            dst = _out_path(options, entry)
            try:
                (_link_out if entry.kind == LINK else _copy_out)(entry.path, dst)
            except OSError as error:
                outcomes[index] = Outcome(entry.path, FAILED, f"cannot copy to {dst}: {error}")
                continue
        if entry.kind == EXCLUDED or (entry.kind == LINK and is_python(entry.path)):
            outcomes[index] = Outcome(
                entry.path, SKIPPED, "excluded" if entry.kind == EXCLUDED else "symbolic link, not followed"
            )

    for index, item, hit in hits:
        outcomes[index] = _finish(options, item, *hit)
        progressed(item.entry.path)

    results = _run_transforms(tasks, options.jobs, catalogue, options.verify)
    try:
        for index, kind, payload in results:
            item = pending.pop(index)
            if cache is not None and kind != _CRASH:
                cache.put(item.key, kind, payload)
                if kind == NEW:
                    # After an in-place run the tree holds the results. Rewriting is idempotent (and a
                    # restored file has nothing left to restore), so recording "result -> unchanged" makes
                    # the next run over that tree all cache hits.
                    cache.put(cache.key(source_digest(payload), item.key_mode), SAME)
            outcomes[index] = _finish(options, item, kind, payload)
            progressed(item.entry.path)
    finally:
        # An interrupt (or any error) while a result is written ends the workers now, before the caller reports
        # it, rather than whenever the suspended generator is collected.
        results.close()

    return [outcome for outcome in outcomes if outcome is not None]
