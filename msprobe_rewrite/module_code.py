"""What the import hook compiles for one module, shared by its loader and the prefetch workers (which import
this module, not the hook): which modules a package list covers, the options the rewrite depends on, and the
code object of one instrumented module.
"""

from __future__ import annotations

import os
import threading
import warnings
from types import CodeType
from typing import Optional, Sequence


def in_packages(name: str, packages: Sequence[str]) -> bool:
    """By name prefix: ``megatron`` covers ``megatron`` and ``megatron.core.x``, not ``megatron_extra``."""
    return any(name == p or name.startswith(p + ".") for p in packages)


class RewriteOptions:
    """What the rewrite depends on besides the source: catalogue files and skipped decorators (and, for the
    prefetch workers, the packages asked for)."""

    def __init__(
        self, catalogue_files: Sequence[str] = (), skip_decorators: Sequence[str] = (), packages: Sequence[str] = ()
    ):
        self.packages = list(packages)
        self.catalogue_files = [os.fspath(f) for f in catalogue_files]
        self.skip_decorators = list(skip_decorators)
        self._catalogue = None
        self._fingerprint = None
        self._lock = threading.Lock()

    def prepare(self):
        """Load the catalogue and the fingerprint once, on the first instrumented import."""
        with self._lock:
            if self._catalogue is None:
                from msprobe_runtime.catalogue import load_catalogue

                from .cache import compiler_fingerprint

                self._catalogue = load_catalogue(self.catalogue_files)
                self._fingerprint = "\0".join(
                    [compiler_fingerprint(), self._catalogue.digest, *sorted(self.skip_decorators)]
                )
        return self._catalogue, self._fingerprint


def instrumented_code(
    source: bytes, source_path: str, package: Optional[str], catalogue, skip_decorators: Sequence[str]
) -> CodeType:
    """The code object the loader runs and caches for one module (the prefetch workers call this too, so
    that what they cache is exactly what the loader would).

    The rewrite is taken on Python's own ``ast`` (``ast_transformer``), which compiles to the same program as
    the libcst rewrite the CLI writes, several times faster; where that path cannot decide, the libcst one
    does, and its errors are the ones reported. A failure of the ast path itself (a bug) is reported too, and
    the libcst path still instruments the module.
    """
    from .ast_transformer import rewrite_to_ast
    from .gc_pause import paused_gc

    with paused_gc():
        try:
            tree = rewrite_to_ast(source, catalogue, path=source_path, skip_decorators=skip_decorators, package=package)
            if tree is not None:
                return compile(tree, source_path, "exec", dont_inherit=True)
        except SyntaxError:
            pass  # one Python's compiler finds in the user's code (a misplaced __future__ import): libcst's turn
        except Exception as error:
            warnings.warn(
                f"msprobe-rewrite: internal error on the fast path for {source_path}, please report: "
                f"{type(error).__name__}: {error}; it is instrumented on the libcst path instead",
                RuntimeWarning,
                stacklevel=2,
            )
    from .api import rewrite_source

    rewritten = rewrite_source(
        source, catalogue, path=source_path, package=package, skip_decorators=skip_decorators, add_import=False
    )
    return compile(rewritten, source_path, "exec", dont_inherit=True)
