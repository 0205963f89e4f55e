"""Taking the runtime import off its line, as edits of the text: ``runtime_import.remove_import`` (the libcst
reference) on ast positions, with the same result and the same notes, and ``Undecided`` where the text may
not say what the reference would do (a semicolon after the import, the import ending a ``try`` body).
"""

from __future__ import annotations

import ast
from typing import List, NamedTuple, Optional

from msprobe_runtime.contract import RUNTIME_MODULE, RUNTIME_NAME

from .runtime_import import UNSURE
from .text_scan import Text, Undecided

Edit = tuple

_COMPOUND = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.If,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.With,
    ast.AsyncWith,
    ast.Try,
    *((ast.TryStar,) if hasattr(ast, "TryStar") else ()),
    *((ast.Match,) if hasattr(ast, "Match") else ()),
)


class Removal(NamedTuple):
    edits: List[Edit]
    found: bool  # whether a runtime import was taken off
    notes: List[str]  # why the result may not be the original bytes


def is_runtime_import(node: ast.AST) -> bool:
    return (
        type(node) is ast.Import
        and len(node.names) == 1
        and node.names[0].name == RUNTIME_MODULE
        and node.names[0].asname == RUNTIME_NAME
    )


def _is_future(node: ast.AST) -> bool:
    return type(node) is ast.ImportFrom and node.module == "__future__"


def _lines(text: Text, body: List[ast.stmt]) -> List[List[ast.stmt]]:
    """The statements of a suite by line, as libcst sees them: a compound statement alone, simple statements
    joined by semicolons together."""
    lines: List[List[ast.stmt]] = []
    previous = None
    for statement in body:
        if previous is not None and not isinstance(statement, _COMPOUND) and not isinstance(previous, _COMPOUND):
            after = text.skip_blank(text.end(previous))
            if text.data[after : after + 1] == b";" and text.skip_blank(after + 1) == text.start(statement):
                lines[-1].append(statement)
                previous = statement
                continue
        lines.append([statement])
        previous = statement
    return lines


def _has_semicolon(text: Text, statement: ast.stmt) -> bool:
    return text.data[text.skip_blank(text.end(statement)) :][:1] == b";"


def _standalone(text: Text, lines, index: int, module_level: bool, notes: List[str]) -> List[Edit]:
    """The edits that take off the import standing alone on ``lines[index]``."""
    statement = lines[index][0]
    data = text.data
    end = text.end(statement)
    after = text.skip_blank(end)
    following = lines[index + 1][0] if index + 1 < len(lines) else None
    if following is None and not module_level:
        raise Undecided("the runtime import ends a try body")
    byte = data[after : after + 1]
    if byte == b";" or byte == b"\\":
        raise Undecided("a semicolon or continuation after the runtime import")
    commented = byte == b"#"
    if not commented and byte not in (b"\n", b"\r"):
        raise Undecided("the runtime import's line does not end after it")
    split = following is not None and not isinstance(following, _COMPOUND) and not commented
    placed = (
        module_level
        and following is not None
        and isinstance(following, _COMPOUND)
        and _comment_lines_only(text, statement, following)
    )
    if not split and not placed:
        notes.append(UNSURE)
    if commented:  # the comment line it took, given back: its whitespace lost the two spaces before `#`
        return [(text.start(statement), after, data[end:after][2:])]
    if placed:  # the blank line it took, given back
        return [(text.start(statement), end, b"")]
    line_end = after + (2 if data[after : after + 2] == b"\r\n" else 1)
    return [(text.line_start(statement), line_end, b"")]


def _comment_lines_only(text: Text, statement: ast.stmt, following: ast.stmt) -> bool:
    """Whether every line between ``statement`` and ``following`` (its decorators included) is a comment."""
    first = min([following.lineno, *(d.lineno for d in getattr(following, "decorator_list", ()))])
    for number in range(statement.end_lineno + 1, first):
        line = text.data[text.lines[number - 1] : text.lines[number]]
        if not line.lstrip(b" \t\x0c").startswith(b"#"):
            return False
    return True


def _future_prefix(line: List[ast.stmt]) -> int:
    count = 0
    for statement in line:
        if not _is_future(statement):
            break
        count += 1
    return count


def _try_body_on_its_line(text: Text, statement: ast.Try) -> bool:
    """Whether the body of ``try:`` is on the ``try:`` line itself (libcst's SimpleStatementSuite)."""
    colon = text.skip(text.start(statement) + 3)
    text.expect(colon, ord(":"))
    byte = text.data[text.skip_blank(colon + 1) :][:1]
    if byte == b"\\":
        raise Undecided("a continuation after try:")
    return byte not in (b"\n", b"\r", b"#", b"")


def _in_suite(text: Text, body: List[ast.stmt], notes: List[str], module_level: bool) -> Optional[List[Edit]]:
    lines = _lines(text, body)
    for index, line in enumerate(lines):
        first = line[0]
        if not isinstance(first, _COMPOUND):
            if is_runtime_import(first) and len(line) > 1:  # placements 1 and 4
                return [(text.start(first), text.start(line[1]), b"")]
            if is_runtime_import(first):  # 2 and 5, or a formatter's split of 1, 3 and 4
                return _standalone(text, lines, index, module_level, notes)
            middle = next((i for i in range(1, len(line) - 1) if is_runtime_import(line[i])), None)
            if middle is not None and _future_prefix(line) == middle:  # 1, after __future__ imports
                return [(text.start(line[middle]), text.start(line[middle + 1]), b"")]
            if len(line) > 1 and is_runtime_import(line[-1]):  # 3
                if _has_semicolon(text, line[-1]):
                    raise Undecided("a semicolon after the runtime import")
                return [(text.end(line[-2]), text.end(line[-1]), b"")]
        elif type(first) is ast.Try:
            if _try_body_on_its_line(text, first):
                if is_runtime_import(first.body[0]) and len(first.body) > 1:
                    return [(text.start(first.body[0]), text.start(first.body[1]), b"")]
            else:
                found = _in_suite(text, first.body, notes, module_level=False)
                if found is not None:
                    if len(first.body) == 1:
                        raise Undecided("the runtime import is the only statement of a try body")
                    return found
    return None


def remove_import(text: Text, module: ast.Module) -> Removal:
    """The edits that take the runtime import off its line, as ``runtime_import.remove_import`` does."""
    notes: List[str] = []
    edits = _in_suite(text, module.body, notes, module_level=True)
    if edits is None:
        return Removal([], False, notes)
    return Removal(edits, True, notes)
