"""Cold-cache prefetch for the import hook: spare cores rewrite the modules an import is about to need.

The first cache miss inside a hooked package starts a few low-priority worker processes (this module's
``main``, also ``python -m msprobe_rewrite.prefetch``, reading a job as JSON on stdin). Each reads the static imports of
the module being imported and of
everything they reach inside the hooked packages (with ``ast``; no user code runs), in the order Python will
import them, and writes the instrumented bytecode cache for those files, working from the far end of that
order so that it meets the importing process instead of racing it for the same file.

A worker only ever saves time: the importing process still reads the cache before each rewrite of its own,
and a worker writes exactly the entry the loader would (``instrumented_code``, the same key, an atomic
replace). A worker that falls behind, dies, or resolves a name differently costs spare-core time, never a
wrong module. Workers stop after their current file when the importing process exits.
"""

from __future__ import annotations

import ast
import atexit
import json
import os
import signal
import subprocess
import sys
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from .module_code import in_packages
from .scopes import absolute_module

ENV_PREFETCH = "MSPROBE_REWRITE_PREFETCH"
_MAX_WORKERS = 4

_workers: List[subprocess.Popen] = []
_started: set = set()
_stop_at_exit = False


# ----------------------------------------------------------------- the importing process


def worker_count(environ=os.environ) -> int:
    """``$MSPROBE_REWRITE_PREFETCH`` workers where it is a number (0 turns prefetch off); otherwise the spare
    cores: those this process may run on, less one per local rank (each rank imports too), at most four."""
    setting = environ.get(ENV_PREFETCH, "").strip()
    if setting.isdigit():
        return int(setting)
    if environ.get("LOCAL_RANK", "0") != "0":
        return 0  # one rank per node prefetches; the others read what it writes
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        ranks = max(1, int(environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return max(0, min(_MAX_WORKERS, cores - ranks))


def start(
    fullname: str,
    packages: Sequence[str],
    catalogue_files: Sequence[str],
    skip_decorators: Sequence[str],
    fingerprint: str,
) -> int:
    """Start the workers for the package of ``fullname`` (once per top-level package); returns how many."""
    top = fullname.partition(".")[0]
    if top in _started or sys.dont_write_bytecode or not sys.executable:
        return 0
    _started.add(top)
    package = sys.modules.get(top)
    roots = [os.fspath(p) for p in getattr(package, "__path__", ()) or () if isinstance(p, (str, os.PathLike))]
    count = worker_count()
    if not roots or count == 0:
        return 0
    job = {
        "start": fullname,
        "packages": list(packages),
        "roots": {top: roots},
        "catalogue_files": list(catalogue_files),
        "skip_decorators": list(skip_decorators),
        "fingerprint": fingerprint,
        "pycache_prefix": sys.pycache_prefix,
        "parent": os.getpid(),
        "count": count,
    }
    environment = {
        k: v for k, v in os.environ.items() if k not in ("MSPROBE_REWRITE_PACKAGES", "PYTHONDONTWRITEBYTECODE")
    }
    # Where the importing process found the compiler is the worker's last resort, after its own sys.path
    # (never ahead of the standard library). A different copy found first has another fingerprint, and its
    # worker writes nothing.
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    program = f"import sys; sys.path.append({here!r}); from msprobe_rewrite.prefetch import main; sys.exit(main())"
    flags = ["-O"] * sys.flags.optimize
    started = 0
    for index in range(count):
        try:
            worker = subprocess.Popen(
                [sys.executable, *flags, "-c", program],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=environment,
            )
            worker.stdin.write(json.dumps({**job, "index": index}).encode())
            worker.stdin.close()
        except OSError:
            break
        _workers.append(worker)
        started += 1
    global _stop_at_exit
    if started and not _stop_at_exit:
        atexit.register(stop_workers)
        _stop_at_exit = True
    return started


def stop_workers(timeout: float = 30.0) -> None:
    """Ask every worker to stop after its current file, and wait for it (no half-written file is left)."""
    for worker in _workers:
        if worker.poll() is None:
            try:
                worker.send_signal(signal.SIGTERM)
            except OSError:
                pass
    for worker in _workers:
        try:
            worker.wait(timeout)
        except subprocess.TimeoutExpired:
            worker.kill()
    _workers.clear()


def wait_workers(timeout: Optional[float] = None) -> None:
    """Wait until every worker has finished its whole list (tests and benchmarks)."""
    for worker in _workers:
        worker.wait(timeout)


# ----------------------------------------------------------------- the import order, read statically


class ModuleIndex:
    """Module names of the hooked packages mapped to their source files, by the plain directory layout."""

    def __init__(self, packages: Sequence[str], roots: Dict[str, Sequence[str]]):
        self.packages = tuple(packages)
        self.roots = roots

    def wanted(self, name: str) -> bool:
        return in_packages(name, self.packages)

    def find(self, name: str) -> Optional[Tuple[str, bool]]:
        """``(file, is_package)`` of module ``name``, or None where it is not a plain source file."""
        top, _, rest = name.partition(".")
        parts = rest.split(".") if rest else []
        for root in self.roots.get(top, ()):
            base = os.path.join(root, *parts)
            init = os.path.join(base, "__init__.py")
            if os.path.isfile(init):
                return init, True
            if parts and os.path.isfile(base + ".py"):
                return base + ".py", False
        return None


def imported_names(tree: ast.Module, fullname: str, is_package: bool) -> Tuple[List[str], List[str]]:
    """Modules named by the import statements of a module, in source order: those its body runs at import
    time (also inside ``if``/``try``/``with`` at module level), then those inside functions and classes."""
    package = fullname if is_package else fullname.rpartition(".")[0]
    top_level: List[str] = []
    nested: List[str] = []

    def names_of(node) -> List[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        base = absolute_module(node, package)
        if base is None:
            return []  # a relative import above the top-level package, or with no package at all
        # ``from a import b`` imports a, and a.b too where b is a submodule
        return ([base] if base else []) + [
            f"{base}.{alias.name}" if base else alias.name for alias in node.names if alias.name != "*"
        ]

    def walk(body, out):
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out.extend(names_of(node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for child in ast.walk(node):
                    if isinstance(child, (ast.Import, ast.ImportFrom)):
                        nested.extend(names_of(child))
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                walk(node.orelse, out)  # never runs: typing-only imports
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(node, field, None)
                    if isinstance(inner, list):
                        walk(inner, out)
                for case in getattr(node, "cases", ()) or ():
                    walk(case.body, out)

    walk(tree.body, top_level)
    return top_level, nested


def _is_type_checking(test) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_order(start: str, index: ModuleIndex) -> Tuple[List[Tuple[str, str, bool]], int]:
    """``(module, file, is_package)`` in the order an import of ``start`` loads them: depth first, parents
    before children, each once; imports inside functions come after everything the module bodies import,
    whose count is returned too."""
    order: List[Tuple[str, str, bool]] = []
    seen: set = set()
    later: List[str] = []

    def visit(name: str) -> None:
        if name in seen or not index.wanted(name):
            return
        parent = name.rpartition(".")[0]
        if parent:
            visit(parent)
        if name in seen:
            return
        seen.add(name)
        found = index.find(name)
        if found is None:
            return
        path, is_package = found
        order.append((name, path, is_package))
        try:
            with open(path, "rb") as handle:
                tree = ast.parse(handle.read(), filename=path)
        except (OSError, SyntaxError, ValueError):
            return
        body, nested = imported_names(tree, name, is_package)
        later.extend(nested)
        for imported in body:
            visit(imported)

    visit(start)
    eager = len(order)
    while later:
        pending, later[:] = list(later), []
        for name in pending:
            visit(name)
    return order, eager


def share(order: Sequence, eager: int, index: int, count: int) -> List:
    """Worker ``index``'s part, every ``count``-th entry: the modules an import surely loads (the first
    ``eager``) from the far end, where the importing process arrives last; then those only imported inside
    functions, which it may never need."""
    ranked = list(reversed(order[:eager])) + list(order[eager:])
    return ranked[index::count]


# ----------------------------------------------------------------- the worker process

_stop = False


def _request_stop(signum, frame) -> None:
    global _stop
    _stop = True


def run_worker(job: dict) -> int:
    from . import bytecode_cache
    from .module_code import RewriteOptions, instrumented_code

    signal.signal(signal.SIGTERM, _request_stop)
    try:
        os.nice(10)  # the importing process and training come first
    except (AttributeError, OSError):
        pass
    sys.pycache_prefix = job.get("pycache_prefix")
    options = RewriteOptions(job["catalogue_files"], job["skip_decorators"])
    catalogue, fingerprint = options.prepare()
    if fingerprint != job["fingerprint"]:
        return 1  # another compiler or catalogue than the importing process's: its entries would not match
    index = ModuleIndex(job["packages"], job["roots"])
    order, eager = import_order(job["start"], index)
    parent = job["parent"]
    for name, path, is_package in share(order, eager, job["index"], job["count"]):
        if _stop or os.getppid() != parent:
            break
        cached_at = bytecode_cache.cache_path(path)
        try:
            with open(path, "rb") as handle:
                source = handle.read()
        except OSError:
            continue
        package = name if is_package else name.rpartition(".")[0]
        key = bytecode_cache.cache_key(source, fingerprint, package)
        if bytecode_cache.read(cached_at, key) is not None:
            continue
        try:
            code = instrumented_code(source, path, package, catalogue, options.skip_decorators)
        except Exception:  # the importing process reports it, with its warning, when it gets there
            continue
        bytecode_cache.write(cached_at, key, code)
    return 0


def main(argv: Optional[Iterable[str]] = None) -> int:
    return run_worker(json.loads(sys.stdin.read()))


if __name__ == "__main__":
    sys.exit(main())
