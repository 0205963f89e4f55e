"""Whether a spelling is rewritten: the rules both walkers apply (``transformer`` on libcst, ``ast_transformer``
on Python's ``ast``) and the lint reports by, on facts each walker reads from its own tree.

The walkers gather facts (the literal kind of an operand, the operators of a comparison, a name); the rules
here decide on them. The zones never rewritten are one table, ``ZONES``, with each tree's spelling of them.
Imports neither libcst nor torch.
"""

from __future__ import annotations

import ast
from typing import Callable, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from msprobe_runtime.operators import OBSERVED_BUILTINS

# -- literal kinds: what an operand is when it is written as a literal -------------------------------------------
NOT_LITERAL = 0
NUMBER = 1  # 1, 1.0, 1j
TEXT = 2  # "s", b"s", f"{x}", adjacent strings
CONSTANT = 3  # None, True, False
ELLIPSIS = 4  # ...


def is_literal(kind: int) -> bool:
    """A literal that no tensor operation can involve."""
    return kind != NOT_LITERAL


def is_text(kind: int) -> bool:
    """Strings, f-strings, None, True, False: a comparison with one of them is no tensor comparison."""
    return kind == TEXT or kind == CONSTANT


# -- operators ---------------------------------------------------------------------------------------------


def rewrite_binary(entry: str, left: int, right: int, left_is_one_string: Callable[[], bool]) -> bool:
    """``a <op> b`` -> ``__msprobe__.<entry>(a, b)``, unless no tensor can take part or it formats a string
    (``"%s" % args``, with one string literal on the left: asked only then, since reading it may cost)."""
    if is_literal(left) and is_literal(right):
        return False
    return not (entry == "mod" and left == TEXT and left_is_one_string())


def rewrite_unary(operand: int) -> bool:
    """``-x`` -> ``__msprobe__.neg(x)``, unless ``x`` is a literal (``-1`` is a number)."""
    return not is_literal(operand)


def rewrite_comparison(comparators: int, left: int, right: int) -> bool:
    """``a < b`` -> ``__msprobe__.lt(a, b)``: one operator only (a chain has no form that keeps both the single
    evaluation of its middle operand and short-circuiting), and no text or literal-only comparison."""
    return (
        comparators == 1 and not is_text(left) and not is_text(right) and not (is_literal(left) and is_literal(right))
    )


# -- truth tests -------------------------------------------------------------------------------------------
ALWAYS_BOOL_COMPARISONS = frozenset({"Is", "IsNot", "In", "NotIn"})  # the same class names in ast and libcst
FLAGS = frozenset({"TYPE_CHECKING", "__debug__"})  # read by their spelling (type checkers, ``python -O``)


def routes_truth_test(
    literal: int, is_not: bool, comparison: Optional[Tuple[Sequence[str], Sequence[int]]], name: Optional[str]
) -> bool:
    """Whether a test is routed through ``__msprobe__.truth``. Not for a test no tensor takes part in: a
    literal, ``not x`` itself (a bool), an identity or membership comparison (always a bool), a comparison with
    a text literal, and the flags. ``comparison``: the operators' class names and the operands' literal kinds,
    for a comparison left as written; ``name``: a plain name's or an attribute's last name."""
    if is_literal(literal) or is_not:
        return False
    if comparison is not None:
        operators, operands = comparison
        return not (all(op in ALWAYS_BOOL_COMPARISONS for op in operators) or any(is_text(k) for k in operands))
    return name not in FLAGS


# -- iteration -------------------------------------------------------------------------------------------
# Iterating a tensor runs ``Tensor.__iter__`` (``unbind``), which the observing mode records in a program left
# as written; rewritten code iterates through ``__msprobe__.iterate`` (``for x in t``, a comprehension's
# ``for``, ``a, b = t``) or ``iterate_unpacked`` (a ``for`` whose target unpacks each item: ``for h, w in t``),
# and calls the builtins that iterate or run tensor methods through ``__msprobe__.builtin``
# (``operators.OBSERVED_BUILTINS``; tests/runtime/test_window_coverage.py).
NOT_DISPLAY, DISPLAY, DISPLAY_OF_DISPLAYS = 0, 1, 2  # a list, tuple, set, dict display or comprehension;
# DISPLAY_OF_DISPLAYS: a list, tuple or set display whose every item is a list or tuple display or a literal
NEVER_A_TENSOR = frozenset(
    {
        "range",
        "zip",
        "enumerate",
        "map",
        "filter",
        "sorted",
        "list",
        "tuple",
        "set",
        "frozenset",
        "dict",
        "iter",
        "str",
        "bytes",
        "bytearray",
    }
)
"""builtins whose result is never a tensor"""
ITEMS_NEVER_TENSORS = frozenset({"range", "zip", "enumerate"})
"""builtins whose result's items are never tensors (ints, tuples)"""


def iteration_entry(literal: int, display: int, builtin: Optional[str], unpacks_items: bool) -> Optional[str]:
    """The entry an iterated value goes through (``iterate``, ``iterate_unpacked``), or None where no tensor
    can be iterated: a literal, a display (``a, b = b, a``), the result of a builtin that is never a tensor.
    ``builtin``: the name of the builtin the value is a call of, where the callee is one; ``unpacks_items``:
    a ``for`` target that unpacks each item, where the items of a display of displays are never tensors."""
    if is_literal(literal):
        return None
    if unpacks_items:
        if display == DISPLAY_OF_DISPLAYS or builtin in ITEMS_NEVER_TENSORS:
            return None
        return "iterate_unpacked"
    if display != NOT_DISPLAY or builtin in NEVER_A_TENSOR:
        return None
    return "iterate"


def observes_builtin(name: str) -> bool:
    """Whether a call of the builtin ``name`` goes through ``__msprobe__.builtin``."""
    return name in OBSERVED_BUILTINS


# -- zones never rewritten ---------------------------------------------------------------------------------


class Zone(NamedTuple):
    what: str
    cst: Tuple[Tuple[str, Optional[str]], ...]  # libcst (node class, field); field None: the whole node
    ast: Tuple[Tuple[str, str], ...]  # ast (node class, field) left as written


_DEFINITIONS = ("FunctionDef", "AsyncFunctionDef", "ClassDef")

ZONES: Tuple[Zone, ...] = (
    # evaluated once, when the definition runs, before any step collects
    Zone("decorators", (("Decorator", None),), tuple((d, "decorator_list") for d in _DEFINITIONS)),
    Zone("parameter defaults", (("Param", "default"),), (("arguments", "defaults"), ("arguments", "kw_defaults"))),
    Zone(
        "class bases and keywords",
        (("ClassDef", "bases"), ("ClassDef", "keywords")),
        (("ClassDef", "bases"), ("ClassDef", "keywords")),
    ),
    # evaluated lazily, or never, and read by tools as written
    Zone(
        "annotations",
        (("Annotation", None),),
        (
            ("FunctionDef", "returns"),
            ("AsyncFunctionDef", "returns"),
            ("arg", "annotation"),
            ("AnnAssign", "annotation"),
        ),
    ),
    Zone(
        "type parameters and type aliases (Python 3.12)",
        (("TypeParameters", None), ("TypeAlias", None)),
        tuple((d, "type_params") for d in _DEFINITIONS)
        + (("TypeAlias", "name"), ("TypeAlias", "type_params"), ("TypeAlias", "value")),
    ),
    # not expressions at all
    Zone("match patterns", (("MatchCase", "pattern"),), (("match_case", "pattern"),)),
    Zone("with ... as targets", (("AsName", None),), (("withitem", "optional_vars"),)),
)
FROZEN_AST_FIELDS = frozenset(part for zone in ZONES for part in zone.ast)


def ast_fields(node: ast.AST) -> List[str]:
    """The fields of ``node`` the rewrite walks into: every field outside ``ZONES``."""
    kind = type(node).__name__
    return [field for field in node._fields if (kind, field) not in FROZEN_AST_FIELDS]


def frozen_ast_parts(node: ast.AST) -> List[ast.AST]:
    """The nodes under ``node`` that ``ZONES`` leave as written, through its parameters (``arguments``, each
    ``arg``) but not into its body: for the lint, which still reads them."""
    out: List[ast.AST] = []
    kind = type(node).__name__
    for field in node._fields:
        value = getattr(node, field, None)
        values: Iterable = value if isinstance(value, list) else [value]
        if (kind, field) in FROZEN_AST_FIELDS:
            out.extend(v for v in values if isinstance(v, ast.AST))
        elif isinstance(value, (ast.arguments, ast.arg)) or (
            field in ("posonlyargs", "args", "kwonlyargs") and isinstance(node, ast.arguments)
        ):
            for item in values:
                if isinstance(item, ast.AST):
                    out.extend(frozen_ast_parts(item))
        elif field in ("vararg", "kwarg") and isinstance(value, ast.arg):
            out.extend(frozen_ast_parts(value))
    return out
