"""The compiler's invariants checked on one file at a time, for test_corpus_invariants.py.

Kept out of the test module so that worker processes (started with ``spawn``) can import it by name.
``check_source`` computes every invariant in one pass per file and returns a small picklable result.
"""

from __future__ import annotations

import ast
import os
import sysconfig
import traceback
import warnings
from collections import Counter
from typing import List, NamedTuple, Optional, Tuple

from msprobe_rewrite.api import RUNTIME_IMPORT, RewriteError, default_catalogue, restore_source, rewrite_source
from msprobe_rewrite.ast_transformer import rewrite_to_ast
from restore_agreement import first_difference, restore_disagreement

OK, UNCHANGED, REFUSED, INVALID, FAILED = "ok", "unchanged", "refused", "invalid", "failed"
SAME, FALLBACK, BEYOND = "same", "fallback", "beyond"
# libcst's own limits: where it cannot parse a file, the ast path may still instrument it.
LIBCST_LIMITS = ("cannot parse: ", "too deeply nested")


class Result(NamedTuple):
    path: str
    status: str  # one of OK, UNCHANGED, REFUSED, INVALID, FAILED
    reason: str = ""  # RewriteError message (REFUSED, INVALID) or what broke (FAILED)
    seconds: float = 0.0  # time of the first rewrite alone
    # What the import hook's ast path did with the file: SAME (the tree of the libcst output), FALLBACK (left
    # it to libcst), BEYOND (instrumented a file libcst cannot parse); a difference is a problem in ``reason``.
    ast_path: str = ""


# -- corpora ---------------------------------------------------------------------------------------------


def stdlib_files() -> List[str]:
    root = sysconfig.get_paths()["stdlib"]
    found = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = sorted(
            d for d in subdirectories if d not in ("site-packages", "dist-packages", "__pycache__")
        )
        found.extend(os.path.join(directory, name) for name in sorted(names) if name.endswith(".py"))
    return found


def distribution_files(name: str) -> List[str]:
    """The installed .py files of a distribution, found without importing it."""
    from importlib.metadata import distribution

    dist = distribution(name)
    return sorted(str(dist.locate_file(f)) for f in dist.files or () if str(f).endswith(".py"))


def extra_files(name: str) -> List[str]:
    """``distribution_files(name)`` for a test extra; the calling test is skipped, with the name, where the
    distribution is not installed (``make test`` installs the extras, and fails where one cannot be)."""
    from importlib.metadata import PackageNotFoundError

    import pytest

    try:
        return distribution_files(name)
    except PackageNotFoundError:
        pytest.skip(f"{name} is not installed (a test extra: pip install -e '.[test]')")


# -- invariants ------------------------------------------------------------------------------------------


def _python_accepts(source: bytes, path: str) -> Tuple[Optional[ast.Module], str]:
    """The module's ast when this Python compiles ``source``, else (None, why not)."""
    try:
        with warnings.catch_warnings():  # SyntaxWarnings of the test data ("is" with a literal)
            warnings.simplefilter("ignore")
            tree = ast.parse(source, filename=path)
            compile(tree, path, "exec", dont_inherit=True)
        return tree, ""
    except (SyntaxError, ValueError, UnicodeError, LookupError) as error:
        return None, f"{type(error).__name__}: {error}"


def _is_runtime_import(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Import)
        and len(node.names) == 1
        and node.names[0].name == "msprobe_runtime"
        and node.names[0].asname == "__msprobe__"
    )


def _statements(tree: ast.Module):
    """Every statement in source order, with where it starts and ends and the name it defines."""
    found = [node for node in ast.walk(tree) if isinstance(node, ast.stmt)]
    found.sort(key=lambda node: (node.lineno, node.col_offset))
    return found


def _defined_name(node: ast.stmt) -> Optional[str]:
    name = getattr(node, "name", None)  # a def or class; Python 3.12's `type X = ...` has an ast.Name there
    return name.id if isinstance(name, ast.Name) else name


def line_mismatch(before: ast.Module, after: ast.Module) -> Optional[str]:
    """Why ``after`` does not keep every line of ``before``, or None.

    Every statement starts and ends on the same lines, the first statement of each line at the same column
    (but on the line that carries the runtime import), every def/class keeps its name, and every name (load or
    store) of the original is still on its line.
    """
    old = _statements(before)
    new = _statements(after)
    import_lines = {node.lineno for node in new if _is_runtime_import(node)}
    new = [node for node in new if not _is_runtime_import(node)]
    if len(old) != len(new):
        return f"{len(old)} statements became {len(new)}"
    seen_lines = set()
    for a, b in zip(old, new):
        name_a, name_b = _defined_name(a), _defined_name(b)
        if (a.lineno, a.end_lineno, name_a) != (b.lineno, b.end_lineno, name_b):
            return (
                f"{type(a).__name__} {name_a or ''} at lines {a.lineno}-{a.end_lineno} is now "
                f"{type(b).__name__} {name_b or ''} at lines {b.lineno}-{b.end_lineno}"
            )
        # The first statement of a line keeps its indentation; later ones (`if c: f(x)`) may move right.
        if a.lineno not in seen_lines and a.lineno not in import_lines and a.col_offset != b.col_offset:
            return f"statement at line {a.lineno} moved from column {a.col_offset} to {b.col_offset}"
        seen_lines.add(a.lineno)
    names_before = Counter((n.id, n.lineno) for n in ast.walk(before) if isinstance(n, ast.Name))
    names_after = Counter((n.id, n.lineno) for n in ast.walk(after) if isinstance(n, ast.Name))
    missing = names_before - names_after
    if missing:
        (name, line), _ = next(iter(missing.items()))
        return f"name {name!r} is no longer on line {line}"
    return None


def check_source(source: bytes, path: str) -> Result:
    """Rewrite ``source`` once and check every invariant of the output."""
    import time

    tree, invalid = _python_accepts(source, path)
    start = time.perf_counter()
    try:
        out = rewrite_source(source, path=path)
    except RewriteError as error:
        status = REFUSED if tree is not None else INVALID
        ast_path, problem = ast_path_check(source, path, None, str(error))
        return Result(path, FAILED if problem else status, problem or str(error), ast_path=ast_path)
    except Exception:  # anything but RewriteError is a crash, on valid and invalid input alike
        return Result(path, FAILED, "crashed: " + traceback.format_exc(limit=-4))
    seconds = time.perf_counter() - start

    if tree is None:
        # Python rejects the file but the compiler did not: it must still keep it restorable.
        problems = []
        try:
            if restore_source(out, path=path) != source:
                problems.append("restore(rewrite(s)) != s")
        except Exception as error:
            problems.append(f"restore crashed: {type(error).__name__}: {error}")
        problems.extend(restore_disagreement(out, path, may_fall_back=True))
        if problems:
            return Result(path, FAILED, f"invalid input ({invalid}): " + "; ".join(problems), seconds)
        return Result(path, INVALID, f"rewritten although Python rejects it: {invalid}", seconds)

    ast_path, problem = ast_path_check(source, path, out, "")
    problems = [problem] if problem else []
    if out == source:
        return Result(path, FAILED if problems else UNCHANGED, "; ".join(problems), seconds, ast_path)
    after, why = _python_accepts(out, path)
    if after is None:
        problems.append(f"output does not compile: {why}")
    if out.count(b"\n") != source.count(b"\n") or out.count(b"\r") != source.count(b"\r"):
        problems.append("the number of lines changed")
    elif after is not None:
        moved = line_mismatch(tree, after)
        if moved:
            problems.append(f"line numbers moved: {moved}")
    if RUNTIME_IMPORT.encode() not in out:
        problems.append("changed without the runtime import")
    try:
        if restore_source(out, path=path) != source:
            problems.append("restore(rewrite(s)) != s" + first_difference(restore_source(out, path=path), source))
    except Exception as error:
        problems.append(f"restore crashed: {type(error).__name__}: {error}")
    problems.extend(restore_disagreement(out, path))
    try:
        if rewrite_source(out, path=path) != out:
            problems.append("rewrite(rewrite(s)) != rewrite(s)")
    except Exception as error:
        problems.append(f"second rewrite crashed: {type(error).__name__}: {error}")
    return Result(path, FAILED if problems else OK, "; ".join(problems), seconds, ast_path)


def _without_runtime_import(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            statements = getattr(node, name, None)
            if isinstance(statements, list):
                statements[:] = [s for s in statements if not _is_runtime_import(s)]
    return tree


def ast_path_check(source: bytes, path: str, out: Optional[bytes], refusal: str) -> Tuple[str, str]:
    """(what the import hook's ast path did, the problem if it differs from the libcst path).

    ``out`` is ``rewrite_source(source)`` (None where it refused, and ``refusal`` says why); the hook compiles
    the same rewrite without the runtime import, so that import is taken out of the libcst tree.
    """
    try:
        fast = rewrite_to_ast(source, default_catalogue(), path=path)
    except Exception:
        return FALLBACK, "the ast path crashed: " + traceback.format_exc(limit=-4)
    if out is None:
        try:  # a refusal to place the runtime import does not concern the hook
            out = rewrite_source(source, path=path, add_import=False)
        except RewriteError:
            if fast is None:
                return FALLBACK, ""
            if any(limit in refusal for limit in LIBCST_LIMITS):
                return BEYOND, ""
            return SAME, f"the ast path instruments a file the libcst path refuses: {refusal}"
    if fast is None:
        return FALLBACK, ""
    slow = _without_runtime_import(ast.parse(out, filename=path))
    if ast.dump(fast) == ast.dump(slow):
        return SAME, ""
    for a, b in zip(ast.walk(fast), ast.walk(slow)):
        if isinstance(a, ast.stmt) and ast.dump(a) != ast.dump(b) and not hasattr(a, "body"):
            return SAME, (
                f"the ast path differs at line {a.lineno}: {ast.unparse(a)[:120]!r} != {ast.unparse(b)[:120]!r}"
            )
    return SAME, "the ast path gives another tree"


def check_file(path: str) -> Result:
    with open(path, "rb") as handle:
        return check_source(handle.read(), path)
