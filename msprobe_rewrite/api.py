"""The compiler as functions on bytes: ``rewrite_source``, ``restore_source``, ``is_instrumented``."""
from __future__ import annotations

import ast
from typing import Iterable, Optional

import libcst as cst

from msprobe_runtime.catalogue import Catalogue, load_catalogue

from . import runtime_import
from .gc_pause import paused_gc
from .markers import (RUNTIME_IMPORT, SKIP_FILE_MARKER, is_instrumented,  # noqa: F401 (re-exported)
                      maybe_lossy, package_of)
from .resolver import Resolver
from .restore import Restorer
from .scopes import collect_scopes
from .transformer import CallSiteTransformer, ScopeMismatch


class RewriteError(Exception):
    """A file that cannot be decoded or parsed; the message says why. The file is left as it was."""


_default_catalogue: Optional[Catalogue] = None


def default_catalogue() -> Catalogue:
    global _default_catalogue
    if _default_catalogue is None:
        _default_catalogue = load_catalogue()
    return _default_catalogue


def _parse(source: bytes, path: str) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        raise RewriteError(f"{path}: cannot parse: {str(error).splitlines()[0]} "
                           f"(line {error.raw_line}, column {error.raw_column})") from None
    except (UnicodeDecodeError, LookupError) as error:
        raise RewriteError(f"{path}: cannot decode: {error}") from None
    except Exception as error:  # libcst raises a few other types for odd input (null bytes, bad tokens)
        raise RewriteError(f"{path}: cannot parse: {type(error).__name__}: {error}") from None


def rewrite_source(source: bytes, catalogue: Optional[Catalogue] = None, path: str = "<string>",
                   skip_decorators: Iterable[str] = (), package: Optional[str] = None,
                   add_import: bool = True) -> bytes:
    """Instrument one module's source; an instrumented source is re-instrumented from its original.

    ``package`` resolves relative imports; by default it is found from ``path``'s ``__init__.py`` files.
    ``add_import=False`` leaves out the runtime import, for a loader that binds ``__msprobe__`` in the
    module's globals itself. A file that needs no instrumentation is returned as it is.
    """
    with paused_gc():
        try:
            return _rewrite_source(source, catalogue, path, skip_decorators, package, add_import)
        except RecursionError:
            raise RewriteError(f"{path}: too deeply nested for libcst (an expression of thousands of terms)") from None


def _first_difference(got: bytes, want: bytes) -> int:
    for number, (a, b) in enumerate(zip(got.splitlines(), want.splitlines()), 1):
        if a != b:
            return number
    return min(got.count(b"\n"), want.count(b"\n")) + 1


def _rewrite_source(source: bytes, catalogue: Optional[Catalogue], path: str, skip_decorators: Iterable[str],
                    package: Optional[str], add_import: bool) -> bytes:
    if SKIP_FILE_MARKER.search(source):
        return restore_source(source, path) if is_instrumented(source) else source
    original = restore_source(source, path) if is_instrumented(source) else source
    module = _parse(original, path)
    try:
        tree = ast.parse(original, filename=path)
    except (SyntaxError, ValueError) as error:
        raise RewriteError(f"{path}: not valid Python for this interpreter: {error}") from None
    scopes = collect_scopes(tree, package if package is not None else package_of(path))
    transformer = CallSiteTransformer(scopes, Resolver(catalogue or default_catalogue()), skip_decorators)
    try:
        rewritten = module.visit(transformer)
    except ScopeMismatch as error:
        raise RewriteError(f"{path}: internal error, please report: {error}") from None
    if not transformer.changes:
        return original
    if maybe_lossy(original) and module.bytes != original:
        line = _first_difference(module.bytes, original)
        raise RewriteError(f"{path}: libcst does not reproduce line {line} byte for byte, so the file is left "
                           "as it is")
    if not add_import:
        return rewritten.bytes
    try:
        rewritten = runtime_import.place(rewritten)
    except runtime_import.PlacementError as error:
        raise RewriteError(f"{path}: {error}") from None
    return rewritten.bytes


def restore_source(source: bytes, path: str = "<string>") -> bytes:
    """Give back the exact original bytes of an instrumented module (unchanged if not instrumented)."""
    if not is_instrumented(source):
        return source
    module = _parse(source, path)
    try:
        return runtime_import.remove(module.visit(Restorer())).bytes
    except RecursionError:
        raise RewriteError(f"{path}: too deeply nested for libcst (an expression of thousands of terms)") from None
