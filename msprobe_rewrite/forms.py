"""The syntax of instrumentation (docs/contract.md): libcst views of the operator table
(``msprobe_runtime.operators``), the runtime name, and the whitespace encoding that lets every rewritten form
be turned back into its original text byte for byte.
"""

from __future__ import annotations

from typing import Optional, Tuple

import libcst as cst

from msprobe_runtime import operators

from . import decisions

from .markers import RUNTIME_MODULE, RUNTIME_NAME  # noqa: F401 (re-exported)


def _by_cst_node(*kinds):
    return {getattr(cst, row.cst_node): row.entry for row in operators.rows(*kinds)}


BINARY = _by_cst_node(operators.BINARY)
COMPARISON = _by_cst_node(operators.COMPARISON)
AUGMENTED = _by_cst_node(operators.AUGMENTED)
UNARY = _by_cst_node(operators.UNARY)

BINARY_BY_NAME = {name: node for node, name in BINARY.items()}
COMPARISON_BY_NAME = {name: node for node, name in COMPARISON.items()}
AUGMENTED_BY_NAME = {name: node for node, name in AUGMENTED.items()}
UNARY_BY_NAME = {name: node for node, name in UNARY.items()}

SPACE = cst.SimpleWhitespace(" ")
EMPTY = cst.SimpleWhitespace("")
COMMA = cst.Comma(whitespace_before=EMPTY, whitespace_after=SPACE)


def runtime_attr(name: str) -> cst.Attribute:
    return cst.Attribute(value=cst.Name(RUNTIME_NAME), attr=cst.Name(name))


def runtime_entry(node: cst.BaseExpression) -> Optional[str]:
    """``name`` when ``node`` is a call of ``__msprobe__.name``, else None."""
    if isinstance(node, cst.Call):
        func = node.func
        if (
            isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and func.value.value == RUNTIME_NAME
            and not func.lpar
            and not func.value.lpar
        ):
            return func.attr.value
    return None


def _text(whitespace) -> Optional[str]:
    return whitespace.value if isinstance(whitespace, cst.SimpleWhitespace) else None


def is_empty(whitespace) -> bool:
    return _text(whitespace) == ""


def has_line_break(whitespace) -> bool:
    """Whether ``whitespace`` ends a line: a newline inside brackets, or a backslash continuation."""
    text = _text(whitespace)
    return text is None or "\n" in text or "\r" in text


def comma_for_operator(before, after) -> Optional[cst.Comma]:
    """Encode an operator's surrounding whitespace in the comma that replaces it; None where it cannot.

    The map is the identity except that the usual ``a + b`` becomes the usual ``f(a, b)``; ``a+ b``, whose
    image that would be, is the one spelling left uninstrumented.
    """
    b, a = _text(before), _text(after)
    if b == " " and a == " ":
        return COMMA
    if b == "" and a == " ":
        return None
    return cst.Comma(whitespace_before=before, whitespace_after=after)


def operator_whitespace(
    comma: cst.Comma,
) -> Tuple[cst.BaseParenthesizableWhitespace, cst.BaseParenthesizableWhitespace]:
    """The inverse of ``comma_for_operator``."""
    before, after = comma.whitespace_before, comma.whitespace_after
    if _text(before) == "" and _text(after) == " ":
        return SPACE, SPACE
    return before, after


def literal_kind(node: cst.BaseExpression) -> int:
    """The ``decisions`` literal kind of an expression as libcst spells it."""
    if isinstance(node, (cst.Integer, cst.Float, cst.Imaginary)):
        return decisions.NUMBER
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
        return decisions.TEXT
    if isinstance(node, cst.Name) and node.value in ("None", "True", "False"):
        return decisions.CONSTANT
    if isinstance(node, cst.Ellipsis):
        return decisions.ELLIPSIS
    return decisions.NOT_LITERAL


def safe_as_argument(node: cst.BaseExpression) -> bool:
    """Whether ``node`` keeps its meaning when moved, as it is, into a call's argument list."""
    if node.lpar:
        return True
    return not isinstance(node, (cst.Tuple, cst.Yield, cst.StarredElement, cst.NamedExpr))


def routes_truth_test(node: cst.BaseExpression) -> bool:
    """``decisions.routes_truth_test`` on the facts of a libcst test."""
    comparison = name = None
    if isinstance(node, cst.Comparison):
        comparison = (
            [type(t.operator).__name__ for t in node.comparisons],
            [literal_kind(node.left), *(literal_kind(t.comparator) for t in node.comparisons)],
        )
    elif isinstance(node, cst.Name):
        name = node.value
    elif isinstance(node, cst.Attribute):
        name = node.attr.value
    is_not = isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not)
    return decisions.routes_truth_test(literal_kind(node), is_not, comparison, name)
