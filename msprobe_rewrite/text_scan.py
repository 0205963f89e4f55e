"""The text between ast nodes, for the restore that works on text (``text_restore``).

Between one expression node and the next there are only whitespace, line continuations, comments and
punctuation (strings are nodes), so a small scanner finds the commas, parentheses and ``=`` that the forms of
docs/contract.md are made of. Offsets are into UTF-8 bytes, the unit of ast's column offsets.
"""

from __future__ import annotations

import ast
import re
from array import array
from typing import Optional, Tuple


class Undecided(Exception):
    """The text path cannot be sure of the result; the caller restores with libcst instead (and counts it)."""


_LINE_BREAK = re.compile(rb"\r\n|\r|\n")  # what CPython counts as a line break
_SPACE = re.compile(rb"(?:[ \t\x0c\r\n]|\\(?:\r\n|\r|\n)|#[^\r\n]*)*")  # inside brackets: newlines too
_BLANK = re.compile(rb"[ \t\x0c]*")  # on one line

OPEN, CLOSE, COMMA, EQUAL, SEMICOLON, HASH = b"(),=;#"


class Text:
    """UTF-8 source bytes, with ast positions turned into offsets."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.lines = array("q", [0])  # the offset each line starts at: 8 bytes a line
        self.lines.extend(match.end() for match in _LINE_BREAK.finditer(data))

    def start(self, node: ast.AST) -> int:
        return self.lines[node.lineno - 1] + node.col_offset

    def end(self, node: ast.AST) -> int:
        return self.lines[node.end_lineno - 1] + node.end_col_offset

    def line_start(self, node: ast.AST) -> int:
        return self.lines[node.lineno - 1]

    def skip(self, index: int) -> int:
        """The next offset from ``index`` that is not whitespace, a line break, a continuation or a comment."""
        return _SPACE.match(self.data, index).end()

    def skip_blank(self, index: int) -> int:
        """The next offset from ``index`` that is not a space, tab or form feed."""
        return _BLANK.match(self.data, index).end()

    def expect(self, index: int, byte: int) -> int:
        """``index``, which must hold ``byte``."""
        if index >= len(self.data) or self.data[index] != byte:
            raise Undecided(f"expected {chr(byte)!r}")
        return index

    def arg_span(self, first: int, node: ast.AST, close: int) -> Tuple[int, int, int]:
        """(start, end, after) of the argument ``node`` of a call whose ``)`` is at ``close``. ``first`` is the
        first offset past the delimiter before it and its whitespace. ``start`` and ``end`` take in the
        argument's own parentheses; ``after`` is the offset of the comma after it, or ``close``."""
        if isinstance(node, ast.Starred):
            raise Undecided("a starred argument")
        data, index, opened = self.data, first, 0
        node_start = self.start(node)
        while index < node_start:
            self.expect(index, OPEN)
            opened += 1
            index = self.skip(index + 1)
        if index != node_start:
            raise Undecided("an argument not where ast puts it")
        end, closed = self.end(node), 0
        while True:
            index = self.skip(end)
            if closed < opened:
                if index == close:
                    raise Undecided("unbalanced parentheses")
                self.expect(index, CLOSE)
                closed += 1
                end = index + 1
            elif index == close or (index < len(data) and data[index] == COMMA):
                return first, end, index
            else:
                raise Undecided("no comma after an argument")

    def last_code_before(self, anchor: int, index: int) -> Optional[int]:
        """The offset of the last byte of code in ``[anchor, index)``, or None if there is none. Only for text
        without strings (between an anchor node and the next): a quote makes it Undecided."""
        data, last = self.data, None
        position = self.skip(anchor)
        while position < index:
            if data[position] in b"'\"":
                raise Undecided("a string before a truth test")
            last = position
            position = self.skip(position + 1)
        if position != index:
            raise Undecided("a comment running past a truth test")
        return last
