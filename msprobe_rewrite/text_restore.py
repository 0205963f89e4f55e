"""Restore without a concrete syntax tree: the instrumented forms inverted as edits of the text, found by
Python's ``ast`` (a fraction of libcst's memory: see bench/rewrite_memory.py).

``restore`` gives what the libcst restore gives (``api.restore_report_cst``, the reference, which the tests
compare it with on every golden case and on the corpora), or raises ``Undecided`` where it cannot be sure:
the caller then restores with libcst and counts the case in ``FALLBACKS``, by reason.
"""

from __future__ import annotations

import ast
import codecs
import io
import tokenize
from collections import Counter
from typing import List, NamedTuple

from . import text_forms
from .text_forms import Edit, entry
from .text_import import remove_import
from .text_scan import Text, Undecided

FALLBACKS: Counter = Counter()  # reason -> how many restores fell back to libcst for it


class Restored(NamedTuple):
    source: bytes
    found: bool  # whether the runtime import was taken off
    notes: List[str]  # why the result may not be the original bytes


def _decode(source: bytes):
    """(UTF-8 bytes to work on, the source's encoding or None for UTF-8, its BOM)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    except SyntaxError as error:
        raise Undecided(f"encoding: {error}") from None
    bom = codecs.BOM_UTF8 if source.startswith(codecs.BOM_UTF8) else b""
    body = source[len(bom) :]
    if codecs.lookup(encoding).name in ("utf-8", "utf-8-sig"):  # the BOM, if any, is put back as it was
        return body, None, bom
    try:
        return body.decode(encoding).encode("utf-8"), encoding, bom
    except (UnicodeError, LookupError) as error:
        raise Undecided(f"encoding: {error}") from None


def _parse(data: bytes, encoding) -> ast.Module:
    try:
        # UTF-8 bytes whose cookie, if any, names another encoding: parse the text, whose cookie Python ignores
        return ast.parse(data if encoding is None else data.decode("utf-8"))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise Undecided(f"ast: {type(error).__name__}") from None


def _form_edits(text: Text, tree: ast.Module) -> List[Edit]:
    """The edits that undo every form, in one walk of the tree (each node with its parent, which a truth test
    needs). The statement forms are undone where the reference undoes them: ``iadd``... as the value of an
    assignment to one target, ``item`` as an assignment's target, ``aug`` as an expression statement."""
    edits: List[Edit] = []
    stack = [(tree, None)]
    while stack:
        node, parent = stack.pop()
        kind = type(node)
        if kind is ast.Call:
            name = entry(node)
            if name is not None:
                if name in text_forms.UNWRAPPED:
                    edits.extend(text_forms.unwrapped(text, node, parent))
                elif name == "call" or name == "dyn":
                    edits.extend(text_forms.call_or_dyn(text, node, name))
                elif name in text_forms.BINARY:
                    edits.extend(text_forms.binary(text, node, name))
                elif name in text_forms.UNARY:
                    edits.extend(text_forms.unary(text, node, name))
        elif kind is ast.Assign:
            for target in node.targets:
                if type(target) is ast.Subscript and entry(target.value) == "item":
                    edits.extend(text_forms.item_store(text, target))
            name = entry(node.value)
            if name in text_forms.AUGMENTED and len(node.targets) == 1:
                edits.extend(text_forms.augmented_name(text, node, name))
        elif kind is ast.Expr and entry(node.value) == "aug":
            edits.extend(text_forms.augmented_target(text, node))
        stack.extend((child, node) for child in ast.iter_child_nodes(node))
    return edits


def _apply(data: bytes, edits: List[Edit]) -> bytes:
    edits.sort(key=lambda edit: (edit[0], edit[1]))
    pieces, position = [], 0
    previous = None
    for start, end, replacement in edits:
        if start < position or (previous is not None and previous[0] == previous[1] == start == end):
            raise Undecided("overlapping edits")  # a form inside text another form drops
        pieces.append(data[position:start])
        pieces.append(replacement)
        position = end
        previous = (start, end)
    pieces.append(data[position:])
    return b"".join(pieces)


def restore(source: bytes) -> Restored:
    """The original bytes of an instrumented module, whether its runtime import was found, and notes."""
    data, encoding, bom = _decode(source)
    tree = _parse(data, encoding)
    text = Text(data)
    try:
        edits = _form_edits(text, tree)
        removal = remove_import(text, tree)
    except (IndexError, RecursionError) as error:
        raise Undecided(f"{type(error).__name__} reading the text") from None
    del tree
    restored = _apply(data, edits + removal.edits)
    if encoding is not None:
        restored = restored.decode("utf-8").encode(encoding)
    return Restored(bom + restored, removal.found, removal.notes)
