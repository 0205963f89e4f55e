"""The import hook: the same rewrite as the CLI, applied as modules are imported.

A meta-path finder placed first on ``sys.meta_path`` decides by module name (cheap, before any file system
look-up) whether a module is wanted, asks the other finders for its spec (so regular installs, editable
installs with their own meta-path finders and ``sys.path`` hooks all work as before), and swaps the loader
of a plain ``.py`` source for ``InstrumentingLoader``. Everything else (namespace packages, zip imports,
extension modules, frozen modules) keeps its own loader. The loader subclasses ``SourceFileLoader`` as
typeguard's does, so ``get_source`` (tracebacks, ``inspect.getsource``), ``get_data``
(``pkgutil.get_data``), resource readers and ``importlib.reload`` behave as for any source module: the
file on disk is never changed and every line keeps its number.
"""

from __future__ import annotations

import _imp
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import warnings
from typing import Iterable, List, Optional, Sequence

from . import bytecode_cache
from .markers import RUNTIME_NAME
from .module_code import RewriteOptions, in_packages, instrumented_code  # noqa: F401 (re-exported)
from .scopes import STDLIB_MODULES

ENV_PACKAGES = "MSPROBE_REWRITE_PACKAGES"

# Never instrumented, whatever is asked: the interpreter's own library, torch and its kin, and the tools.
NEVER = frozenset(
    {
        "torch",
        "torch_npu",
        "torchgen",
        "functorch",
        "triton",
        "libcst",
        "yaml",
        "numpy",
        "msprobe_rewrite",
        "msprobe_runtime",
        "msprobe",
        "_pytest",
        "pytest",
        "pluggy",
    }
)


def _never(name: str) -> bool:
    root = name.partition(".")[0]
    return root in NEVER or root in STDLIB_MODULES


class InstrumentingLoader(importlib.machinery.SourceFileLoader):
    def __init__(self, fullname: str, path: str, options: RewriteOptions, is_package: bool):
        super().__init__(fullname, path)
        self.options = options
        self._package = fullname if is_package else fullname.rpartition(".")[0]

    def get_code(self, fullname):
        source_path = self.get_filename(fullname)
        source = self.get_data(source_path)
        catalogue, fingerprint = self.options.prepare()
        key = bytecode_cache.cache_key(source, fingerprint, self._package)
        cached_at = bytecode_cache.cache_path(source_path)
        code = bytecode_cache.read(cached_at, key)
        if code is not None:
            _imp._fix_co_filename(code, source_path)  # as importlib does for a .pyc: the tree may have moved
            return code
        if cached_at is not None and self.options.packages:
            from . import prefetch

            prefetch.start(
                fullname, self.options.packages, self.options.catalogue_files, self.options.skip_decorators, fingerprint
            )
        try:
            code = instrumented_code(source, source_path, self._package, catalogue, self.options.skip_decorators)
        except Exception as error:  # a compiler bug must not stop the user's program either
            failure = error
        else:
            bytecode_cache.write(cached_at, key, code)
            return code
        # Outside the handler, so that Python's own SyntaxError for a module it cannot compile is raised exactly
        # as an import without the hook raises it: no warning, no compiler error chained to it.
        plain = self.source_to_code(source, source_path)
        from .api import RewriteError

        reason = failure if isinstance(failure, RewriteError) else f"{type(failure).__name__}: {failure}"
        warnings.warn(f"msprobe-rewrite: {fullname} is imported uninstrumented: {reason}", RuntimeWarning, stacklevel=2)
        return plain  # not cached: the warning comes every run

    def exec_module(self, module):
        # The rewrite left the runtime import out (no line to find for it); bind it here instead.
        import msprobe_runtime

        module.__dict__.setdefault(RUNTIME_NAME, msprobe_runtime)
        super().exec_module(module)


class InstrumentingFinder(importlib.abc.MetaPathFinder):
    def __init__(self, packages: Iterable[str], paths: Iterable[str], options: RewriteOptions):
        self.packages = tuple(p.strip() for p in packages if p.strip())
        self.paths = tuple(os.path.join(os.path.realpath(p), "") for p in paths)
        self.options = options
        self._local = threading.local()

    def wants_name(self, fullname: str) -> bool:
        return in_packages(fullname, self.packages)

    def find_spec(self, fullname, path=None, target=None):
        if _never(fullname):
            return None
        by_name = self.wants_name(fullname)
        if not by_name and not self.paths:
            return None
        if getattr(self._local, "busy", False):
            return None
        self._local.busy = True
        try:
            spec = self._find_elsewhere(fullname, path, target)
        finally:
            self._local.busy = False
        if spec is None or spec.origin is None or type(spec.loader) is not importlib.machinery.SourceFileLoader:
            return spec
        if not by_name and not os.path.realpath(spec.origin).startswith(self.paths):
            return spec
        spec.loader = InstrumentingLoader(
            fullname, spec.origin, self.options, is_package=spec.submodule_search_locations is not None
        )
        return spec

    def _find_elsewhere(self, fullname, path, target):
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, InstrumentingFinder):
                continue
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def invalidate_caches(self):
        pass


class ImportHook:
    """An installed hook; ``uninstall()`` removes it, and it works as a context manager."""

    def __init__(self, finder: InstrumentingFinder):
        self.finder = finder

    def uninstall(self) -> None:
        try:
            sys.meta_path.remove(self.finder)
        except ValueError:
            pass

    def __enter__(self) -> "ImportHook":
        return self

    def __exit__(self, *exc_info) -> None:
        self.uninstall()


def install_import_hook(
    packages: Iterable[str] = (),
    *,
    paths: Iterable[str] = (),
    catalogue_files: Sequence[str] = (),
    skip_decorators: Sequence[str] = (),
) -> ImportHook:
    """Instrument the modules of ``packages`` (by name prefix: ``megatron`` covers ``megatron.core.x``) and
    the source files under ``paths`` as they are imported from now on.

    A requested package that is already imported can no longer be instrumented; a warning names it.
    """
    packages = [packages] if isinstance(packages, str) else list(packages)
    refused = [p for p in packages if _never(p)]
    if refused:
        warnings.warn(f"msprobe-rewrite: never instrumented: {', '.join(refused)}", RuntimeWarning, stacklevel=2)
    packages = [p.strip() for p in packages if p.strip() and not _never(p.strip())]
    options = RewriteOptions(catalogue_files, skip_decorators, packages)
    options.prepare()  # a bad catalogue is reported here, not as an ImportError of some user module
    finder = InstrumentingFinder(packages, paths, options)
    already = sorted(name for name in list(sys.modules) if finder.wants_name(name))
    if already:
        warnings.warn(
            "msprobe-rewrite: already imported before the import hook, so not instrumented: " + ", ".join(already),
            RuntimeWarning,
            stacklevel=2,
        )
    sys.meta_path.insert(0, finder)
    return ImportHook(finder)


def packages_from_environment(environ=os.environ) -> List[str]:
    return [p for p in environ.get(ENV_PACKAGES, "").replace(",", " ").split() if p]


def install_from_environment(environ=os.environ) -> Optional[ImportHook]:
    """Install the hook for the packages named in ``$MSPROBE_REWRITE_PACKAGES``, if any."""
    packages = packages_from_environment(environ)
    catalogue = [f for f in environ.get("MSPROBE_REWRITE_CATALOGUE", "").split(os.pathsep) if f]
    return install_import_hook(packages, catalogue_files=catalogue) if packages else None
