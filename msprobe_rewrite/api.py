"""The compiler as functions on bytes: ``rewrite_source``, ``restore_source``, ``is_instrumented``."""

from __future__ import annotations

import ast
import warnings
from typing import Iterable, List, Optional, Tuple

import libcst as cst

from msprobe_runtime.catalogue import Catalogue, load_catalogue

from . import runtime_import, text_restore
from .gc_pause import paused_gc
from .markers import (
    RUNTIME_IMPORT,
    RUNTIME_MODULE,
    RUNTIME_NAME,
    SKIP_FILE_MARKER,  # noqa: F401 (re-exported)
    is_instrumented,
    maybe_lossy,
    module_of,
    package_of,
)
from .resolver import Resolver
from .restore import Restorer
from .scopes import collect_scopes
from .transformer import CallSiteTransformer, ScopeMismatch


class RewriteError(Exception):
    """A file that cannot be decoded or parsed; the message says why. The file is left as it was."""


class RestoreWarning(UserWarning):
    """Restore could not be sure of the original bytes (or found the runtime import missing); names the file."""


_default_catalogue: Optional[Catalogue] = None


def default_catalogue() -> Catalogue:
    global _default_catalogue
    if _default_catalogue is None:
        _default_catalogue = load_catalogue()
    return _default_catalogue


def _python_reason(source: bytes, path: str) -> Optional[str]:
    """Why Python's own compiler rejects ``source`` (its message, at its line), or None when it accepts it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the user's invalid escapes and the like: not ours to report
            compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as error:
        message, line, column = error.msg, error.lineno, error.offset
    except ValueError as error:  # null bytes, on Pythons before 3.12
        message, line, column = str(error), None, None
    except (MemoryError, RecursionError):
        return None
    else:
        return None
    if line is None and b"\0" in source:  # Python names no line for a null byte; running the file, it does
        line = source.count(b"\n", 0, source.index(b"\0")) + 1
    where = f"line {line}" + (f", column {column}" if column else "") if line else ""
    return f"{message} ({where})" if where else message


def _keeping_final_carriage_return(module: cst.Module, source: bytes) -> cst.Module:
    """``module``, rendering the lone ``\\r`` that ends ``source`` (old Mac line endings, or a mixed file whose
    last line ends so).

    libcst's parser counts only ``\\n`` as a final newline (``has_trailing_newline``), so it renders such a file
    without its last byte: the rewrite, and the libcst restore, would drop it (test_line_endings.py). Python
    accepts no file ending in a line continuation, so a final ``\\r`` is always the last line's ending.
    """
    if source.endswith(b"\r") and not module.has_trailing_newline:
        return module.with_changes(has_trailing_newline=True)
    return module


def _parse(source: bytes, path: str) -> cst.Module:
    try:
        return _keeping_final_carriage_return(cst.parse_module(source), source)
    except cst.ParserSyntaxError as error:
        reason = f"{str(error).splitlines()[0]} (line {error.raw_line}, column {error.raw_column})"
    except (UnicodeDecodeError, LookupError) as error:
        raise RewriteError(f"{path}: cannot decode: {error}") from None
    except Exception as error:  # libcst raises a few other types for odd input (null bytes, bad tokens)
        reason = f"{type(error).__name__}: {error}"
    # What Python itself says, at the line it gives; libcst's own reason only where Python accepts the file.
    raise RewriteError(f"{path}: cannot parse: {_python_reason(source, path) or reason}") from None


def rewrite_source(
    source: bytes,
    catalogue: Optional[Catalogue] = None,
    path: str = "<string>",
    skip_decorators: Iterable[str] = (),
    package: Optional[str] = None,
    add_import: bool = True,
) -> bytes:
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


def _rewrite_source(
    source: bytes,
    catalogue: Optional[Catalogue],
    path: str,
    skip_decorators: Iterable[str],
    package: Optional[str],
    add_import: bool,
) -> bytes:
    if SKIP_FILE_MARKER.search(source):
        return restore_source(source, path) if is_instrumented(source) else source
    original = restore_source(source, path) if is_instrumented(source) else source
    module = _parse(original, path)
    try:
        tree = ast.parse(original, filename=path)
    except (SyntaxError, ValueError) as error:
        raise RewriteError(f"{path}: not valid Python for this interpreter: {error}") from None
    package = package if package is not None else package_of(path)
    scopes = collect_scopes(tree, package, module_of(path, package))
    transformer = CallSiteTransformer(scopes, Resolver(catalogue or default_catalogue()), skip_decorators)
    try:
        rewritten = module.visit(transformer)
    except ScopeMismatch as error:
        raise RewriteError(f"{path}: internal error, please report: {error}") from None
    if not transformer.changes:
        return original
    if maybe_lossy(original) and module.bytes != original:
        line = _first_difference(module.bytes, original)
        raise RewriteError(f"{path}: libcst does not reproduce line {line} byte for byte, so the file is left as it is")
    if not add_import:
        return rewritten.bytes
    try:
        rewritten = runtime_import.place(rewritten)
    except runtime_import.PlacementError as error:
        raise RewriteError(f"{path}: {error}") from None
    return rewritten.bytes


def restore_source(source: bytes, path: str = "<string>") -> bytes:
    """Give back the exact original bytes of an instrumented module (unchanged if not instrumented).

    Where it cannot be sure of them (the runtime import was deleted, or a formatter moved it), it says so in a
    ``RestoreWarning`` that names ``path``; ``restore_report`` returns those notes instead.
    """
    restored, notes = restore_report(source, path)
    for note in notes:
        warnings.warn(f"{path}: {note}", RestoreWarning, stacklevel=2)
    return restored


MISSING_IMPORT = (
    f"its runtime import (`{RUNTIME_IMPORT}`) was missing, so it could not run; its instrumented forms were restored"
)
MOVED_IMPORT = (
    "its runtime import is not on a line msprobe-rewrite puts it on, and was left where it is; its "
    "instrumented forms were restored"
)


def restore_report(source: bytes, path: str = "<string>") -> Tuple[bytes, List[str]]:
    """``restore_source``'s result, and its notes on what may not be the original bytes (without the path).

    The forms are inverted on the text (``text_restore``), which needs a fraction of the memory of a libcst
    tree; where that cannot be sure of the result, the libcst restore gives it (counted in
    ``text_restore.FALLBACKS``)."""
    if not is_instrumented(source):
        return source, []
    try:
        restored = text_restore.restore(source)
    except text_restore.Undecided as why:
        text_restore.FALLBACKS[str(why)] += 1
        return restore_report_cst(source, path)
    return _notes(source, restored.source, restored.found, list(restored.notes))


def restore_report_cst(source: bytes, path: str = "<string>") -> Tuple[bytes, List[str]]:
    """``restore_report`` through a libcst tree: the reference the text restore is tested against."""
    if not is_instrumented(source):
        return source, []
    module = _parse(source, path)
    try:
        removal = runtime_import.remove_import(module.visit(Restorer()))
    except RecursionError:
        raise RewriteError(f"{path}: too deeply nested for libcst (an expression of thousands of terms)") from None
    except runtime_import.PlacementError as error:
        raise RewriteError(f"{path}: cannot restore: {error}") from None
    return _notes(source, removal.module.bytes, removal.found, list(removal.notes))


def _notes(source: bytes, restored: bytes, found: bool, notes: List[str]) -> Tuple[bytes, List[str]]:
    """The result of a restore, given whether it found the runtime import: a module without it is either not
    instrumented at all (left as it is) or had its import deleted or moved (restored, with a note)."""
    if not found:
        if restored == source:
            return source, []  # the import's text or a form's in a string: not instrumented
        binding = _runtime_name_binding(source)
        if binding == "own":
            return source, []  # the module's own `__msprobe__`, not ours
        notes.append(MOVED_IMPORT if binding == "runtime" else MISSING_IMPORT)
    return restored, notes


def _runtime_name_binding(source: bytes) -> Optional[str]:
    """How a module whose runtime import was not found binds ``__msprobe__``: ``"runtime"`` (an import of the
    runtime elsewhere), ``"own"`` (anything else of the module's), or None (it does not)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.alias) and (node.asname or node.name.partition(".")[0]) == RUNTIME_NAME:
            if node.name != RUNTIME_MODULE or node.asname != RUNTIME_NAME:
                return "own"
            found = "runtime"
        elif (
            (isinstance(node, ast.Name) and node.id == RUNTIME_NAME and not isinstance(node.ctx, ast.Load))
            or (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == RUNTIME_NAME)
            or (isinstance(node, ast.arg) and node.arg == RUNTIME_NAME)
            or getattr(node, "name", None) == RUNTIME_NAME  # except ... as, match captures
            or getattr(node, "rest", None) == RUNTIME_NAME
        ):
            return "own"
    return found
