"""The operator vocabulary: the one table that every other operator table is derived from.

Each row is one runtime entry point for a Python operator (``__msprobe__.add`` for ``a + b``): how it is
spelt, the node classes that stand for it in CPython's ``ast`` and in libcst (by class name, so this module
imports neither), the method Python calls on a tensor operand, and the method torch reports to
``__torch_function__`` for it. The compiler (``forms``, ``ast_transformer``), the shims, the collector's
dump names and the observing mode's bytecode names all read this table; none of them spells an operator.

The dump name of an operator is the first catalogued ``Tensor.<method>`` among the Python method
(``__neg__``) and the method torch reports (``neg``): msprobe's name where msprobe lists the dunder, else the
name the observing ``TorchFunctionMode`` records for the same operation, so that a rewritten call site never
records less than an observed one (``-x`` is ``Tensor.neg``, ``x /= y`` is ``Tensor.div_``).
"""

from __future__ import annotations

from typing import Dict, Mapping, NamedTuple, Optional, Tuple

BINARY = "binary"
COMPARISON = "comparison"
AUGMENTED = "augmented"
UNARY = "unary"
STORE = "store"


class Operator(NamedTuple):
    entry: str  # runtime entry point and shim name: "add"
    kind: str  # BINARY, COMPARISON, AUGMENTED, UNARY or STORE
    spelling: str  # "+", "+=", "<", "-" (unary); "" for the subscript store
    ast_node: Optional[str]  # class name in CPython's ast: "Add" (AugAssign's op is the binary class)
    cst_node: Optional[str]  # class name in libcst: "Add", "AddAssign", "Minus"
    dunder: str  # the method Python calls on a tensor left (or only) operand: "__add__"
    reflected: Optional[str]  # the method Python calls on a tensor right operand: "__radd__"; None: none
    reported: str  # what torch reports to __torch_function__ for a tensor left operand
    reported_reflected: Optional[str]  # ... for a plain scalar left operand and a tensor right one
    nb_name: Optional[str] = None  # the binary operator's name in ``dis._nb_ops`` (NB_ADD -> "ADD")


def _binary(
    entry: str,
    spelling: str,
    ast_node: str,
    cst_node: str,
    dunder: str,
    reflected: str,
    reported: str,
    reported_reflected: str,
    nb_name: str,
) -> Operator:
    return Operator(
        entry, BINARY, spelling, ast_node, cst_node, dunder, reflected, reported, reported_reflected, nb_name
    )


def _augmented(entry: str, binary: Operator, cst_node: str, dunder: str, reported: str) -> Operator:
    # AugAssign's ast op is the binary operator's class; a scalar target (`s += t`) has no in-place method,
    # so Python falls back to the tensor's reflected one
    return Operator(
        entry,
        AUGMENTED,
        binary.spelling + "=",
        binary.ast_node,
        cst_node,
        dunder,
        binary.reflected,
        reported,
        binary.reported_reflected,
    )


def _comparison(
    entry: str,
    spelling: str,
    ast_node: str,
    cst_node: str,
    dunder: str,
    mirrored: str,
    reported: str,
    reported_reflected: str,
) -> Operator:
    # `2 < t` reaches the tensor's mirrored comparison, `t > 2`
    return Operator(entry, COMPARISON, spelling, ast_node, cst_node, dunder, mirrored, reported, reported_reflected)


_BINARY_ROWS = (
    _binary("add", "+", "Add", "Add", "__add__", "__radd__", "add", "add", "ADD"),
    _binary("sub", "-", "Sub", "Subtract", "__sub__", "__rsub__", "sub", "__rsub__", "SUBTRACT"),
    _binary("mul", "*", "Mult", "Multiply", "__mul__", "__rmul__", "mul", "mul", "MULTIPLY"),
    _binary(
        "matmul",
        "@",
        "MatMult",
        "MatrixMultiply",
        "__matmul__",
        "__rmatmul__",
        "matmul",
        "__rmatmul__",
        "MATRIX_MULTIPLY",
    ),
    _binary("truediv", "/", "Div", "Divide", "__truediv__", "__rtruediv__", "div", "__rdiv__", "TRUE_DIVIDE"),
    _binary(
        "floordiv",
        "//",
        "FloorDiv",
        "FloorDivide",
        "__floordiv__",
        "__rfloordiv__",
        "__floordiv__",
        "__rfloordiv__",
        "FLOOR_DIVIDE",
    ),
    _binary("mod", "%", "Mod", "Modulo", "__mod__", "__rmod__", "remainder", "__rmod__", "REMAINDER"),
    _binary("pow", "**", "Pow", "Power", "__pow__", "__rpow__", "pow", "__rpow__", "POWER"),
    _binary("lshift", "<<", "LShift", "LeftShift", "__lshift__", "__rlshift__", "__lshift__", "__rlshift__", "LSHIFT"),
    _binary("rshift", ">>", "RShift", "RightShift", "__rshift__", "__rrshift__", "__rshift__", "__rrshift__", "RSHIFT"),
    _binary("and_", "&", "BitAnd", "BitAnd", "__and__", "__rand__", "__and__", "bitwise_and", "AND"),
    _binary("or_", "|", "BitOr", "BitOr", "__or__", "__ror__", "__or__", "bitwise_or", "OR"),
    _binary("xor", "^", "BitXor", "BitXor", "__xor__", "__rxor__", "__xor__", "bitwise_xor", "XOR"),
)
_BY_BINARY = {row.entry: row for row in _BINARY_ROWS}

_AUGMENTED_ROWS = (
    _augmented("iadd", _BY_BINARY["add"], "AddAssign", "__iadd__", "add_"),
    _augmented("isub", _BY_BINARY["sub"], "SubtractAssign", "__isub__", "sub_"),
    _augmented("imul", _BY_BINARY["mul"], "MultiplyAssign", "__imul__", "mul_"),
    # Tensor has no __imatmul__: Python falls back to __matmul__, which torch reports as matmul
    _augmented("imatmul", _BY_BINARY["matmul"], "MatrixMultiplyAssign", "__imatmul__", "matmul"),
    _augmented("itruediv", _BY_BINARY["truediv"], "DivideAssign", "__itruediv__", "div_"),
    _augmented("ifloordiv", _BY_BINARY["floordiv"], "FloorDivideAssign", "__ifloordiv__", "floor_divide_"),
    _augmented("imod", _BY_BINARY["mod"], "ModuloAssign", "__imod__", "remainder_"),
    _augmented("ipow", _BY_BINARY["pow"], "PowerAssign", "__ipow__", "pow_"),
    _augmented("ilshift", _BY_BINARY["lshift"], "LeftShiftAssign", "__ilshift__", "__ilshift__"),
    _augmented("irshift", _BY_BINARY["rshift"], "RightShiftAssign", "__irshift__", "__irshift__"),
    _augmented("iand", _BY_BINARY["and_"], "BitAndAssign", "__iand__", "__iand__"),
    _augmented("ior", _BY_BINARY["or_"], "BitOrAssign", "__ior__", "__ior__"),
    _augmented("ixor", _BY_BINARY["xor"], "BitXorAssign", "__ixor__", "__ixor__"),
)
INPLACE_OF = dict(zip((row.entry for row in _BINARY_ROWS), _AUGMENTED_ROWS))
"""binary entry -> the row of its augmented assignment (``add`` -> ``iadd``)"""

TABLE = (
    _BINARY_ROWS
    + (
        _comparison("lt", "<", "Lt", "LessThan", "__lt__", "__gt__", "lt", "gt"),
        _comparison("le", "<=", "LtE", "LessThanEqual", "__le__", "__ge__", "le", "ge"),
        _comparison("gt", ">", "Gt", "GreaterThan", "__gt__", "__lt__", "gt", "lt"),
        _comparison("ge", ">=", "GtE", "GreaterThanEqual", "__ge__", "__le__", "ge", "le"),
        _comparison("eq", "==", "Eq", "Equal", "__eq__", "__eq__", "__eq__", "__eq__"),
        _comparison("ne", "!=", "NotEq", "NotEqual", "__ne__", "__ne__", "ne", "ne"),
    )
    + _AUGMENTED_ROWS
    + (
        Operator("neg", UNARY, "-", "USub", "Minus", "__neg__", None, "neg", None),
        Operator("pos", UNARY, "+", "UAdd", "Plus", "__pos__", None, "positive", None),
        Operator("invert", UNARY, "~", "Invert", "BitInvert", "__invert__", None, "__invert__", None),
        Operator("setitem", STORE, "", None, None, "__setitem__", None, "__setitem__", None),
    )
)


def rows(*kinds: str) -> Tuple[Operator, ...]:
    """The rows of the given kinds, in table order."""
    return tuple(row for row in TABLE if row.kind in kinds)


def dump_names(tensor_methods: Mapping[str, str]) -> Dict[str, Tuple[Optional[str], Optional[str]]]:
    """``entry -> (name for a tensor left operand, name for a scalar left and tensor right operand)``, each
    the first catalogued candidate (``tensor_methods``: method name -> ``Tensor.<method>``), or None."""

    def first(*candidates: Optional[str]) -> Optional[str]:
        for method in candidates:
            if method is not None and method in tensor_methods:
                return tensor_methods[method]
        return None

    return {row.entry: (first(row.dunder, row.reported), first(row.reflected, row.reported_reflected)) for row in TABLE}


# -- builtins that call a tensor's own methods ----------------------------------------------------------------
# Called on a tensor, each of these runs a method torch reports to ``__torch_function__`` (``iter(t)`` and
# ``zip(t, u)`` run ``Tensor.__iter__``, hence ``Tensor.unbind``; ``abs(t)`` runs ``Tensor.abs``; ``sum``,
# ``min``, ``max`` and ``sorted`` run the operators and ``Tensor.__bool__``): the observing mode records those
# calls in a program left as written, so rewritten code calls these builtins through ``__msprobe__.builtin``,
# which runs them with the mode on (``Collector.builtin``; tests/runtime/test_window_coverage.py). Builtins
# that only format (``str``, ``print``, f-strings) are not here: torch's printing records nothing in either run.
OBSERVED_BUILTINS = (
    "iter",
    "list",
    "tuple",
    "set",
    "frozenset",
    "dict",
    "zip",
    "enumerate",
    "map",
    "filter",
    "reversed",
    "sorted",
    "sum",
    "min",
    "max",
    "any",
    "all",
    "abs",
    "pow",
)
"""builtin names whose calls rewritten code makes through ``__msprobe__.builtin``"""
