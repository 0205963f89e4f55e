"""The instrumented forms of docs/contract.md turned back into their original text, as edits of the text.

Each function gives the edits ``(start, end, replacement)`` that undo one form, touching only the form's own
text (its ``__msprobe__.entry(``, its commas, its ``)``), so the edits of nested forms never overlap. It gives
exactly what ``restore.Restorer`` (the libcst restore, the reference) gives, and raises ``Undecided`` for a
form written in a way the reference may treat otherwise (a keyword argument, parentheses the reference drops).
"""

from __future__ import annotations

import ast
import re
from typing import List, Optional, Tuple

from msprobe_runtime import operators
from msprobe_runtime.contract import RUNTIME_NAME

from .text_scan import CLOSE, EQUAL, OPEN, Text, Undecided

Edit = Tuple[int, int, bytes]


def _spellings(*kinds):
    return {row.entry: row.spelling.encode() for row in operators.rows(*kinds)}


BINARY = _spellings(operators.BINARY, operators.COMPARISON)
UNARY = _spellings(operators.UNARY)
AUGMENTED = _spellings(operators.AUGMENTED)
_STATEMENT_ENTRIES = frozenset({*AUGMENTED, "aug", "attr", "item"})  # undone with the statement around them
_RUNTIME = RUNTIME_NAME.encode()
_SIMPLE_NAME = re.compile(rb"""(['"])([A-Za-z_][A-Za-z0-9_]*)\1\Z""")


def entry(node: ast.AST) -> Optional[str]:
    """``name`` when ``node`` is a call of ``__msprobe__.name`` with no parentheses in its callee, else None."""
    if type(node) is not ast.Call:
        return None
    func = node.func
    if (
        type(func) is ast.Attribute
        and type(func.value) is ast.Name
        and func.value.id == RUNTIME_NAME
        and node.lineno == func.lineno == func.value.lineno
        and node.col_offset == func.col_offset == func.value.col_offset
    ):
        return func.attr
    return None


class Call:
    """One form's call: where its ``(`` and ``)`` are, and the spans of its first positional arguments."""

    def __init__(self, text: Text, node: ast.Call, count: Optional[int] = None, keywords: bool = False):
        """``count``: the call must have exactly this many arguments (None: any); ``keywords``: whether
        keyword arguments may follow the ones read."""
        if (node.keywords and not keywords) or (count is not None and len(node.args) != count):
            raise Undecided(f"a form with other arguments: {node.func.attr}")
        self.text, self.node = text, node
        self.start, self.end = text.start(node), text.end(node)
        if not text.data.startswith(_RUNTIME, self.start):  # ast's positions in f-strings, checked
            raise Undecided("a form not where ast puts it")
        self.close = text.expect(self.end - 1, CLOSE)
        self.open = text.expect(text.skip(text.end(node.func)), OPEN)
        self.first = text.skip(self.open + 1)

    def spans(self, count: int) -> List[Tuple[int, int, int]]:
        """(start, end, after) of the first ``count`` arguments, parentheses included (``Text.arg_span``)."""
        found, first = [], self.first
        for node in self.node.args[:count]:
            span = self.text.arg_span(first, node, self.close)
            found.append(span)
            if span[2] == self.close:
                break
            first = self.text.skip(span[2] + 1)
        if len(found) < count:
            raise Undecided("too few arguments")
        return found

    def unwrap(self, span) -> List[Edit]:
        """The call around the argument ``span`` taken away: only the argument's text is left."""
        return [(self.start, span[0], b""), (span[1], self.end, b"")]


def operator_text(text: Text, left, right, spelling: bytes) -> Edit:
    """The comma between two arguments back into the operator it replaced; ``, `` stands for `` + ``."""
    before = text.data[left[1] : left[2]]
    after = text.data[left[2] + 1 : right[0]]
    if before == b"" and after == b" ":
        return left[1], right[0], b" " + spelling + b" "
    return left[1], right[0], before + spelling + after


def has_line_break(whitespace: bytes) -> bool:
    return b"\n" in whitespace or b"\r" in whitespace


def call_or_dyn(text: Text, node: ast.Call, name: str) -> List[Edit]:
    """``__msprobe__.call("Api", f, args...)`` and ``__msprobe__.dyn(f, args...)`` back to ``f(args...)``."""
    call = Call(text, node, keywords=True)
    callee_index = 1 if name == "call" else 0
    if len(node.args) <= callee_index:
        raise Undecided("no callee")
    _not_a_runtime_call(node.args[callee_index])
    spans = call.spans(callee_index + 1)
    callee = spans[callee_index]
    whitespace_after_func = text.data[text.end(node.func) : call.open]
    whitespace = text.data[call.open + 1 : call.first]
    if callee[2] == call.close:  # the callee is the last argument: what precedes `)` is its own whitespace
        rest = call.close
        moved = text.data[callee[1] : call.close]
    else:
        rest = text.skip(callee[2] + 1)
        if rest == call.close:
            raise Undecided("a trailing comma after the callee")
        moved = text.data[callee[2] + 1 : rest]
    # A line break after the original `(` follows the callee, which stays on its own line.
    if has_line_break(moved) and whitespace == b"":
        whitespace = moved
    return [(call.start, callee[0], b""), (callee[1], rest, whitespace_after_func + b"(" + whitespace)]


def binary(text: Text, node: ast.Call, name: str) -> List[Edit]:
    """``__msprobe__.add(a, b)`` back to ``a + b`` (comparisons alike)."""
    call = Call(text, node, count=2)
    left, right = call.spans(2)
    return [(call.start, left[0], b""), operator_text(text, left, right, BINARY[name]), (right[1], call.end, b"")]


def unary(text: Text, node: ast.Call, name: str) -> List[Edit]:
    """``__msprobe__.neg(a)`` back to ``-a``."""
    call = Call(text, node, count=1)
    (operand,) = call.spans(1)
    return [(call.start, operand[0], UNARY[name]), (operand[1], call.end, b"")]


UNWRAPPED = frozenset({"truth", "iterate", "iterate_unpacked", "builtin"})  # the forms that wrap one expression


def unwrapped(text: Text, node: ast.Call, parent: ast.AST) -> List[Edit]:
    """``__msprobe__.truth(t)``, ``iterate(t)``, ``iterate_unpacked(t)`` and ``builtin(f)`` back to ``t`` (``f``).
    The reference drops parentheses around the call itself, so a call that may have some is left to it."""
    call = Call(text, node, count=1)
    (test,) = call.spans(1)
    _not_a_runtime_call(node.args[0])
    if _maybe_parenthesized(text, node, parent, call):
        raise Undecided("parentheses around a one-argument form")
    return call.unwrap(test)


def _not_a_runtime_call(restored: ast.AST) -> None:
    """The reference restores bottom-up: a form that restores to a call of an entry that the statement around
    it undoes (``iadd``, ``aug``, ``attr``, ``item``: the callee of ``dyn(__msprobe__.aug, ...)``, the test of
    ``truth(__msprobe__.aug(...))``) may then be taken for that form. Only text edited by hand has one; it is
    left to the reference."""
    if type(restored) is ast.Call:
        restored = restored.func
    if (
        type(restored) is ast.Attribute
        and type(restored.value) is ast.Name
        and restored.value.id == RUNTIME_NAME
        and restored.attr in _STATEMENT_ENTRIES
    ):
        raise Undecided("a form that restores to a runtime call")


def _maybe_parenthesized(text: Text, node: ast.Call, parent: ast.AST, call: Call) -> bool:
    data = text.data
    before = call.start
    while before > 0 and data[before - 1] in b" \t":
        before -= 1
    if before > 0 and data[before - 1] not in b"(\r\n\\":
        return False  # code on the same line ends right before it: no comment, no string, no `(`
    if before > 0 and data[before - 1] == OPEN:
        opening = before - 1
    else:  # the call starts its line: look from the node before it
        opening = text.last_code_before(_anchor(text, node, parent, call.start), call.start)
        if opening is None or data[opening] != OPEN:
            return False
    following = text.skip(call.end)
    if following >= len(data) or data[following] != CLOSE:
        return False
    # `f(__msprobe__.truth(t))`: the parentheses are the outer call's
    return not (
        type(parent) is ast.Call
        and parent.args == [node]
        and not parent.keywords
        and text.skip(text.end(parent.func)) == opening
    )


def _anchor(text: Text, node: ast.AST, parent: ast.AST, start: int) -> int:
    """An offset before ``node`` with only punctuation, keywords and comments between it and ``node``: the end
    of the node before it under ``parent``, else the start of ``parent``."""
    anchor = None
    for child in ast.iter_child_nodes(parent):
        if child is not node and hasattr(child, "end_lineno") and child.end_lineno is not None:
            end = text.end(child)
            if end <= start and (anchor is None or end > anchor):
                anchor = end
    if anchor is None and getattr(parent, "lineno", None) is not None and text.start(parent) <= start:
        anchor = text.start(parent)
    if anchor is None:
        raise Undecided("no node before a truth test")
    return anchor


def item_store(text: Text, target: ast.Subscript) -> List[Edit]:
    """``__msprobe__.item(obj)[k] = v`` back to ``obj[k] = v`` (one target of an assignment)."""
    node = target.value
    if text.start(target) != text.start(node):
        raise Undecided("parentheses around an item form")
    call = Call(text, node, count=1)
    return call.unwrap(call.spans(1)[0])


def augmented_name(text: Text, statement: ast.Assign, name: str) -> List[Edit]:
    """``x = __msprobe__.iadd(x, v)`` back to ``x += v``."""
    node = statement.value
    call = Call(text, node, count=2)
    _, value = call.spans(2)
    equal = text.skip(text.end(statement.targets[0]))
    while text.data[equal] == CLOSE:  # the target's own parentheses
        equal = text.skip(equal + 1)
    text.expect(equal, EQUAL)
    if text.skip(equal + 1) != call.start:
        raise Undecided("parentheses around an augmented form")
    return [(equal, equal + 1, AUGMENTED[name]), (call.start, value[0], b""), (value[1], call.end, b"")]


def augmented_target(text: Text, statement: ast.Expr) -> List[Edit]:
    """``__msprobe__.aug(__msprobe__.attr(obj, "name"), "iadd", v)`` back to ``obj.name += v``, and
    ``__msprobe__.aug(__msprobe__.item(obj)[k], "iadd", v)`` back to ``obj[k] += v``."""
    node = statement.value
    if text.start(statement) != text.start(node) or text.end(statement) != text.end(node):
        raise Undecided("parentheses around an aug form")
    call = Call(text, node, count=3)
    reference, op_name, value = call.spans(3)
    spelling = _quoted_name(text, op_name)
    if spelling not in AUGMENTED:
        raise Undecided("an unknown augmented operator")
    target = node.args[0]
    if entry(target) == "attr":
        if text.start(target) != reference[0]:
            raise Undecided("parentheses around an attr form")
        attr = Call(text, target, count=2)
        obj, attribute = attr.spans(2)
        edits = [(attr.start, obj[0], b""), (obj[1], attr.end, b"." + _quoted_name(text, attribute).encode())]
    elif type(target) is ast.Subscript and entry(target.value) == "item":
        edits = item_store(text, target)
    else:
        raise Undecided("an aug form of another target")
    return [
        (call.start, reference[0], b""),
        *edits,
        _aug_operator(text, reference, op_name, value, AUGMENTED[spelling]),
        (value[1], call.end, b""),
    ]


def _aug_operator(text: Text, reference, op_name, value, spelling: bytes) -> Edit:
    """The text from the target to the value (``, "iadd", ``) back to the operator, whose whitespace the
    comma after the operator's name carries."""
    _, _, replacement = operator_text(text, op_name, value, spelling)
    return reference[1], value[0], replacement


def _quoted_name(text: Text, span) -> str:
    match = _SIMPLE_NAME.match(text.data, span[0], span[1])
    if match is None:
        raise Undecided("a name that is not a plain string")
    return match.group(2).decode()
