"""Placing ``import msprobe_runtime as __msprobe__`` on an existing line, and taking it off again.

No line may move (tracebacks, ``stack.json`` and ``inspect.getsource`` users must see the user's lines), so the
import joins a line that is already there, before any instrumented code can run, in this order of preference:

1. the first statement after the docstring and ``from __future__`` imports, when it is a simple statement:
   ``import msprobe_runtime as __msprobe__; import torch``;
2. a blank or comment line just before that statement (never lines 1-2, which may hold a shebang or an
   encoding cookie): ``import msprobe_runtime as __msprobe__  # comment``;
3. the end of the docstring or last ``__future__`` line: ``"Doc."; import msprobe_runtime as __msprobe__``;
4. the first simple statement further on, past ``def`` statements (defining a function runs no instrumented
   code: decorators and defaults are never rewritten), classes made only of those, and into ``try`` bodies
   (whose first statement always runs); a definition whose decorators, defaults, annotations or bases name
   one passed over might run its instrumented body, so the search stops there;
5. a blank or comment line between such definitions, before the first other statement.

On a line that starts with ``__future__`` imports followed by other statements, the import goes right after
them: ``from __future__ import annotations; import msprobe_runtime as __msprobe__; import os``.

Each placement has a distinct shape, so ``remove`` knows which one it undoes; it also undoes a formatter's split
of a shared line (``import msprobe_runtime as __msprobe__`` left on a line of its own before the statement it
shared a line with), and says where a moved import leaves it unsure of the original lines.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Set

import libcst as cst

from .forms import EMPTY, RUNTIME_MODULE, RUNTIME_NAME, SPACE


class PlacementError(Exception):
    """No existing line can carry the runtime import."""


def _import_statement(semicolon=cst.MaybeSentinel.DEFAULT) -> cst.Import:
    return cst.Import(
        names=[cst.ImportAlias(name=cst.Name(RUNTIME_MODULE), asname=cst.AsName(name=cst.Name(RUNTIME_NAME)))],
        semicolon=semicolon,
    )


def is_runtime_import(node: cst.CSTNode) -> bool:
    return (
        isinstance(node, cst.Import)
        and len(node.names) == 1
        and isinstance(node.names[0].name, cst.Name)
        and node.names[0].name.value == RUNTIME_MODULE
        and node.names[0].asname is not None
        and isinstance(node.names[0].asname.name, cst.Name)
        and node.names[0].asname.name.value == RUNTIME_NAME
    )


def _is_docstring(line: cst.BaseStatement) -> bool:
    return (
        isinstance(line, cst.SimpleStatementLine)
        and isinstance(line.body[0], cst.Expr)
        and isinstance(line.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _is_future(line: cst.BaseStatement) -> bool:
    return isinstance(line, cst.SimpleStatementLine) and all(
        isinstance(s, cst.ImportFrom) and isinstance(s.module, cst.Name) and s.module.value == "__future__"
        for s in line.body
    )


def _prefixed(line: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    semicolon = cst.Semicolon(whitespace_before=EMPTY, whitespace_after=SPACE)
    return line.with_changes(body=[_import_statement(semicolon), *line.body])


def _line_statement(empty: cst.EmptyLine) -> cst.SimpleStatementLine:
    whitespace = empty.whitespace
    if empty.comment is not None:
        whitespace = cst.SimpleWhitespace("  " + whitespace.value)
    return cst.SimpleStatementLine(
        body=[_import_statement()],
        trailing_whitespace=cst.TrailingWhitespace(whitespace=whitespace, comment=empty.comment, newline=empty.newline),
    )


def _empty_line(line: cst.SimpleStatementLine) -> cst.EmptyLine:
    trailing = line.trailing_whitespace
    whitespace = trailing.whitespace
    if trailing.comment is not None:
        whitespace = cst.SimpleWhitespace(whitespace.value[2:])
    return cst.EmptyLine(indent=True, whitespace=whitespace, comment=trailing.comment, newline=trailing.newline)


def _pick_line(lines: Sequence[cst.EmptyLine], first_line_number: int) -> Optional[int]:
    """Index of the line to carry the import: the last blank line, else the first comment line."""
    eligible = [i for i in range(len(lines)) if first_line_number + i > 2]
    blanks = [i for i in eligible if lines[i].comment is None]
    if blanks:
        return blanks[-1]
    return eligible[0] if eligible else None


class _Names(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.names: Set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)


def _names(nodes) -> Set[str]:
    visitor = _Names()
    for node in nodes:
        if node is not None:
            node.visit(visitor)
    return visitor.names


def _is_inert_line(line: cst.BaseStatement) -> bool:
    """``pass``, ``...`` or a docstring: a class body line that runs nothing."""
    return isinstance(line, cst.SimpleStatementLine) and all(
        isinstance(s, cst.Pass)
        or (isinstance(s, cst.Expr) and isinstance(s.value, (cst.SimpleString, cst.ConcatenatedString, cst.Ellipsis)))
        for s in line.body
    )


def _inert(statement: cst.BaseStatement, defined: Set[str]) -> bool:
    """Whether running ``statement`` runs no instrumented code; adds the name it defines to ``defined``.

    Defining a function runs only its decorators, defaults and annotations, which are never rewritten; they
    may still call a function defined before (``@my_decorator``), whose body is instrumented, so a definition
    that names one of ``defined`` is not inert. A class is inert when its body holds only such definitions.
    """
    if isinstance(statement, cst.FunctionDef):
        outside = [*statement.decorators, statement.params, statement.returns]
    elif isinstance(statement, cst.ClassDef):
        outside = [*statement.decorators, *statement.bases, *statement.keywords]
    else:
        return False
    if _names(outside) & defined:
        return False
    if isinstance(statement, cst.ClassDef):
        body = statement.body.body
        if isinstance(statement.body, cst.SimpleStatementSuite):
            if not all(
                isinstance(s, cst.Pass) or isinstance(s, cst.Expr) and isinstance(s.value, cst.Ellipsis) for s in body
            ):
                return False
        else:
            local = set(defined)
            if not all(_is_inert_line(line) or _inert(line, local) for line in body):
                return False
    defined.add(statement.name.value)
    return True


def _place_in_suite(statements: List[cst.BaseStatement], start: int, defined: Set[str]) -> bool:
    """Option 4: prefix the first simple statement from ``start`` on, past inert definitions and into try
    bodies."""
    for index in range(start, len(statements)):
        statement = statements[index]
        if isinstance(statement, cst.SimpleStatementLine):
            statements[index] = _prefixed(statement)
            return True
        if _inert(statement, defined):
            continue
        if isinstance(statement, cst.Try):
            body = statement.body
            if isinstance(body, cst.SimpleStatementSuite):
                semicolon = cst.Semicolon(whitespace_before=EMPTY, whitespace_after=SPACE)
                statements[index] = statement.with_changes(
                    body=body.with_changes(body=[_import_statement(semicolon), *body.body])
                )
                return True
            inner = list(body.body)
            if _place_in_suite(inner, 0, defined):
                statements[index] = statement.with_changes(body=body.with_changes(body=inner))
                return True
        return False
    return False


def _place_between_definitions(statements: List[cst.BaseStatement], start: int) -> bool:
    """Option 5: a blank (else comment) line before a statement that only inert definitions precede."""
    defined: Set[str] = set()
    for index in range(start + 1, len(statements)):
        if not _inert(statements[index - 1], defined):
            return False
        statement = statements[index]
        lines = list(statement.leading_lines)
        chosen = _pick_line(lines, 3)  # past a definition, so never on lines 1-2
        if chosen is not None:
            carrier = _line_statement(lines[chosen]).with_changes(leading_lines=lines[:chosen])
            statements[index : index + 1] = [carrier, statement.with_changes(leading_lines=lines[chosen + 1 :])]
            return True
    return False


def _future_prefix(line: cst.BaseStatement) -> int:
    """How many ``from __future__`` imports open a simple statement line."""
    count = 0
    if isinstance(line, cst.SimpleStatementLine):
        for statement in line.body:
            if not _is_future(cst.SimpleStatementLine(body=[statement])):
                break
            count += 1
    return count


def place(module: cst.Module) -> cst.Module:
    body = list(module.body)
    start = 0
    if body and _is_docstring(body[0]):
        start = 1
    while start < len(body) and _is_future(body[start]):
        start += 1
    if start == len(body):
        raise PlacementError("the module has no statement after its docstring and __future__ imports")
    first = body[start]

    futures = _future_prefix(first)
    if futures:  # 1, after the __future__ imports that open the line
        small = list(first.body)
        semicolon = cst.Semicolon(whitespace_before=EMPTY, whitespace_after=SPACE)
        small.insert(futures, _import_statement(semicolon))
        body[start] = first.with_changes(body=small)
        return module.with_changes(body=body)

    if isinstance(first, cst.SimpleStatementLine):  # 1
        body[start] = _prefixed(first)
        return module.with_changes(body=body)

    header = list(module.header) if start == 0 else []
    candidates = header + list(first.leading_lines)
    chosen = _pick_line(candidates, 1 if start == 0 else 3)
    if chosen is not None:  # 2
        statement = _line_statement(candidates[chosen])
        if chosen < len(header):
            new_header, statement_lines, rest = header[:chosen], [], header[chosen + 1 :] + list(first.leading_lines)
        else:
            cut = chosen - len(header)
            new_header, statement_lines = header, list(first.leading_lines[:cut])
            rest = list(first.leading_lines[cut + 1 :])
        body[start : start + 1] = [
            statement.with_changes(leading_lines=statement_lines),
            first.with_changes(leading_lines=rest),
        ]
        return module.with_changes(header=new_header if start == 0 else module.header, body=body)

    if start > 0:  # 3
        last = body[start - 1]
        if last.body[-1].semicolon is cst.MaybeSentinel.DEFAULT:
            statements = list(last.body)
            statements[-1] = statements[-1].with_changes(
                semicolon=cst.Semicolon(whitespace_before=EMPTY, whitespace_after=SPACE)
            )
            body[start - 1] = last.with_changes(body=[*statements, _import_statement()])
            return module.with_changes(body=body)

    if _place_in_suite(body, start, set()):  # 4
        return module.with_changes(body=body)
    if _place_between_definitions(body, start):  # 5
        return module.with_changes(body=body)
    raise PlacementError(
        "no existing line before the first module-level code can carry the runtime import "
        f"(the module starts with a {type(first).__name__} statement)"
    )


# Placements 2 and 5 put the import on a blank or comment line of its own, always the last blank line before a
# compound statement; placements 1, 3 and 4 put it on a line with other statements, which a formatter (black,
# ruff) may split into lines of their own. A line of its own followed by a simple statement is such a split: its
# whole line goes, and the rest is the original bytes (with whatever else the formatter changed). Any other
# shape that no placement writes is restored the same way, with this note, since the lines around it may
# differ from the original.
UNSURE = (
    "the runtime import stood on a line of its own where msprobe-rewrite never puts it (split off its line "
    "or moved, by a formatter?); restore removed that line, so blank lines near it may differ from the "
    "original"
)


class Removal(NamedTuple):
    module: cst.Module
    found: bool  # whether a runtime import was taken off
    notes: List[str]  # why the result may not be the original bytes


def _standalone(
    statements: List[cst.BaseStatement], index: int, module_level: bool, notes: List[str]
) -> List[cst.EmptyLine]:
    """Take off the import that is the only statement of ``statements[index]``; return the lines it leaves for
    the footer of the suite (when it was the suite's last statement)."""
    statement = statements[index]
    following = statements[index + 1] if index + 1 < len(statements) else None
    commented = statement.trailing_whitespace.comment is not None
    split = isinstance(following, cst.SimpleStatementLine) and not commented
    placed = (
        module_level
        and following is not None
        and not isinstance(following, cst.SimpleStatementLine)
        and all(line.comment is not None for line in following.leading_lines)
    )
    if not split and not placed:
        notes.append(UNSURE)
    # A placed import gives back the blank or comment line it took; a split one, or one no placement put there,
    # gives back nothing but a comment of the user's.
    lines = [*statement.leading_lines, *([_empty_line(statement)] if placed or commented else [])]
    del statements[index]
    if following is None:
        return lines
    statements[index] = following.with_changes(leading_lines=[*lines, *following.leading_lines])
    return []


def _remove_in_suite(
    statements: List[cst.BaseStatement], notes: List[str], module_level: bool
) -> Optional[List[cst.EmptyLine]]:
    """Take the runtime import off; None if there is none, else the lines it leaves for the suite's footer."""
    for index, statement in enumerate(statements):
        if isinstance(statement, cst.SimpleStatementLine):
            small = statement.body
            if is_runtime_import(small[0]) and len(small) > 1:  # 1 and 4
                statements[index] = statement.with_changes(body=small[1:])
                return []
            if is_runtime_import(small[0]):  # 2 and 5, or a formatter's split of 1, 3 and 4
                return _standalone(statements, index, module_level, notes)
            middle = next((i for i in range(1, len(small) - 1) if is_runtime_import(small[i])), None)
            if middle is not None and _future_prefix(statement) == middle:  # 1, after __future__ imports
                statements[index] = statement.with_changes(body=[*small[:middle], *small[middle + 1 :]])
                return []
            if len(small) > 1 and is_runtime_import(small[-1]):  # 3
                before = list(small[:-1])
                before[-1] = before[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
                statements[index] = statement.with_changes(body=before)
                return []
        elif isinstance(statement, cst.Try):
            body = statement.body
            if isinstance(body, cst.SimpleStatementSuite):
                if is_runtime_import(body.body[0]) and len(body.body) > 1:
                    statements[index] = statement.with_changes(body=body.with_changes(body=body.body[1:]))
                    return []
            else:
                inner = list(body.body)
                footer = _remove_in_suite(inner, notes, module_level=False)
                if footer is not None:
                    if not inner:
                        raise PlacementError("the runtime import is the only statement of a try body")
                    statements[index] = statement.with_changes(
                        body=body.with_changes(body=inner, footer=[*footer, *body.footer])
                    )
                    return []
    return None


def remove_import(module: cst.Module) -> Removal:
    """Take the runtime import off its line, restoring that line exactly where a placement put it (or the line
    a formatter split it from); ``notes`` says where the result may differ from the original."""
    body, notes = list(module.body), []
    footer = _remove_in_suite(body, notes, module_level=True)
    if footer is None:
        return Removal(module, False, notes)
    return Removal(module.with_changes(body=body, footer=[*footer, *module.footer]), True, notes)


def remove(module: cst.Module) -> cst.Module:
    """Take the runtime import off its line, restoring that line exactly; unchanged if there is none."""
    return remove_import(module).module
