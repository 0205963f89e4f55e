"""A faster dispatch for libcst transformers, with the same results.

``libcst.CSTTransformer`` looks up ``visit_<Type>``, ``leave_<Type>``, ``visit_<Type>_<field>`` and
``leave_<Type>_<field>`` with ``getattr`` and a formatted name for every node and every field it visits; most
lookups fail, and a failing ``getattr`` raises and catches an exception. ``CachedDispatch`` does each lookup
once per class, and does not descend into node types listed in ``LEAVES``: nodes that can hold no expression a
rewrite would change (names, literals, whitespace, punctuation, imports). Their ``leave_`` methods still run.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Optional, Tuple

import libcst as cst

from msprobe_runtime import operators

LEAVES: FrozenSet[type] = frozenset(
    {
        cst.Name,
        cst.Integer,
        cst.Float,
        cst.Imaginary,
        cst.SimpleString,
        cst.Ellipsis,
        cst.SimpleWhitespace,
        cst.ParenthesizedWhitespace,
        cst.TrailingWhitespace,
        cst.EmptyLine,
        cst.Newline,
        cst.Comment,
        cst.Comma,
        cst.Dot,
        cst.Semicolon,
        cst.Colon,
        cst.AssignEqual,
        cst.LeftParen,
        cst.RightParen,
        cst.LeftSquareBracket,
        cst.RightSquareBracket,
        cst.LeftCurlyBrace,
        cst.RightCurlyBrace,
        cst.AsName,
        cst.Import,
        cst.ImportFrom,
        cst.ImportAlias,
        cst.Pass,
        cst.Break,
        cst.Continue,
        cst.Global,
        cst.Nonlocal,
        cst.ImportStar,
        cst.FormattedStringText,
        cst.BitOr,
        # operator tokens: those of the operator table, and the ones no runtime entry stands for
        *(getattr(cst, row.cst_node) for row in operators.TABLE if row.cst_node),
        *(getattr(cst, name) for name in ("Not", "And", "Or", "In", "NotIn", "Is", "IsNot")),
    }
)


def _dotted_names(node: cst.Attribute) -> bool:
    """Whether ``node`` is a plain chain of names, ``a.b.c``: nothing in it can be rewritten."""
    value = node.value
    while isinstance(value, cst.Attribute):
        value = value.value
    return isinstance(value, cst.Name)


class CachedDispatch(cst.CSTTransformer):
    """Mixin for a CSTTransformer: the same callbacks, found once per (class, node type, field)."""

    _visits: Dict[type, Optional[object]]
    _leaves: Dict[type, Optional[object]]
    _attribute_visits: Dict[Tuple[type, str], Optional[object]]
    _attribute_leaves: Dict[Tuple[type, str], Optional[object]]
    descend_into_leaves = False  # True to visit the children of LEAVES too

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._visits, cls._leaves, cls._attribute_visits, cls._attribute_leaves = {}, {}, {}, {}

    @classmethod
    def _find(cls, cache: dict, key, name: str):
        function = getattr(cls, name, None)
        cache[key] = function
        return function

    def on_visit(self, node: cst.CSTNode) -> bool:
        kind = type(node)
        try:
            function = self._visits[kind]
        except KeyError:
            function = self._find(self._visits, kind, f"visit_{kind.__name__}")
        if function is not None and function(self, node) is False:
            return False
        if kind in LEAVES:
            return self.descend_into_leaves
        if kind is cst.Attribute and _dotted_names(node):
            return self.descend_into_leaves
        return True

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        kind = type(original_node)
        try:
            function = self._leaves[kind]
        except KeyError:
            function = self._find(self._leaves, kind, f"leave_{kind.__name__}")
        return updated_node if function is None else function(self, original_node, updated_node)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        key = (type(node), attribute)
        try:
            function = self._attribute_visits[key]
        except KeyError:
            function = self._find(self._attribute_visits, key, f"visit_{key[0].__name__}_{attribute}")
        if function is not None:
            function(self, node)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        key = (type(original_node), attribute)
        try:
            function = self._attribute_leaves[key]
        except KeyError:
            function = self._find(self._attribute_leaves, key, f"leave_{key[0].__name__}_{attribute}")
        if function is not None:
            function(self, original_node)
