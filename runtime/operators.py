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

from typing import NamedTuple, Optional

BINARY = "binary"
COMPARISON = "comparison"
AUGMENTED = "augmented"
UNARY = "unary"
STORE = "store"


class Operator(NamedTuple):
    entry: str                  # runtime entry point and shim name: "add"
    kind: str                   # BINARY, COMPARISON, AUGMENTED, UNARY or STORE
    spelling: str               # "+", "+=", "<", "-" (unary); "" for the subscript store
    ast_node: Optional[str]     # class name in CPython's ast: "Add" (AugAssign's op is the binary class)
    cst_node: Optional[str]     # class name in libcst: "Add", "AddAssign", "Minus"
    dunder: str                 # the method Python calls on a tensor left (or only) operand: "__add__"
    reflected: Optional[str]    # the method Python calls on a tensor right operand: "__radd__"; None: none
    reported: str               # what torch reports to __torch_function__ for a tensor left operand
    reported_reflected: Optional[str]  # ... for a plain scalar left operand and a tensor right one
    nb_name: Optional[str] = None      # the binary operator's name in ``dis._nb_ops`` (NB_ADD -> "ADD")


def _binary(entry, spelling, ast_node, cst_node, method, reported, reported_reflected, nb_name):
    return Operator(entry, BINARY, spelling, ast_node, cst_node, f"__{method}__", f"__r{method}__", reported,
                    reported_reflected, nb_name)


def _augmented(binary, reported):
    method = binary.dunder[2:-2]
    # a scalar target (`s += t`) has no in-place method: Python falls back to the tensor's reflected one
    return Operator(f"i{binary.entry.rstrip('_')}", AUGMENTED, binary.spelling + "=", binary.ast_node,
                    f"{binary.cst_node}Assign", f"__i{method}__", binary.reflected, reported,
                    binary.reported_reflected)


def _comparison(entry, spelling, ast_node, cst_node, mirrored, reported, reported_reflected):
    # `2 < t` reaches the tensor's mirrored comparison, `t > 2`
    return Operator(entry, COMPARISON, spelling, ast_node, cst_node, f"__{entry}__", f"__{mirrored}__", reported,
                    reported_reflected)


_BINARY_ROWS = (
    _binary("add", "+", "Add", "Add", "add", "add", "add", "ADD"),
    _binary("sub", "-", "Sub", "Subtract", "sub", "sub", "__rsub__", "SUBTRACT"),
    _binary("mul", "*", "Mult", "Multiply", "mul", "mul", "mul", "MULTIPLY"),
    _binary("matmul", "@", "MatMult", "MatrixMultiply", "matmul", "matmul", "__rmatmul__", "MATRIX_MULTIPLY"),
    _binary("truediv", "/", "Div", "Divide", "truediv", "div", "__rdiv__", "TRUE_DIVIDE"),
    _binary("floordiv", "//", "FloorDiv", "FloorDivide", "floordiv", "__floordiv__", "__rfloordiv__",
            "FLOOR_DIVIDE"),
    _binary("mod", "%", "Mod", "Modulo", "mod", "remainder", "__rmod__", "REMAINDER"),
    _binary("pow", "**", "Pow", "Power", "pow", "pow", "__rpow__", "POWER"),
    _binary("lshift", "<<", "LShift", "LeftShift", "lshift", "__lshift__", "__rlshift__", "LSHIFT"),
    _binary("rshift", ">>", "RShift", "RightShift", "rshift", "__rshift__", "__rrshift__", "RSHIFT"),
    _binary("and_", "&", "BitAnd", "BitAnd", "and", "__and__", "bitwise_and", "AND"),
    _binary("or_", "|", "BitOr", "BitOr", "or", "__or__", "bitwise_or", "OR"),
    _binary("xor", "^", "BitXor", "BitXor", "xor", "__xor__", "bitwise_xor", "XOR"),
)

_INPLACE_REPORTED = {
    "add": "add_", "sub": "sub_", "mul": "mul_",
    "matmul": "matmul",  # Tensor has no __imatmul__: Python falls back to __matmul__, reported as matmul
    "truediv": "div_", "floordiv": "floor_divide_", "mod": "remainder_", "pow": "pow_",
    "lshift": "__ilshift__", "rshift": "__irshift__", "and_": "__iand__", "or_": "__ior__", "xor": "__ixor__",
}
INPLACE_OF = {row.entry: _augmented(row, _INPLACE_REPORTED[row.entry]) for row in _BINARY_ROWS}
"""binary entry -> the row of its augmented assignment (``add`` -> ``iadd``)"""

TABLE = _BINARY_ROWS + (
    _comparison("lt", "<", "Lt", "LessThan", "gt", "lt", "gt"),
    _comparison("le", "<=", "LtE", "LessThanEqual", "ge", "le", "ge"),
    _comparison("gt", ">", "Gt", "GreaterThan", "lt", "gt", "lt"),
    _comparison("ge", ">=", "GtE", "GreaterThanEqual", "le", "ge", "le"),
    _comparison("eq", "==", "Eq", "Equal", "eq", "__eq__", "__eq__"),
    _comparison("ne", "!=", "NotEq", "NotEqual", "ne", "ne", "ne"),
) + tuple(INPLACE_OF.values()) + (
    Operator("neg", UNARY, "-", "USub", "Minus", "__neg__", None, "neg", None),
    Operator("pos", UNARY, "+", "UAdd", "Plus", "__pos__", None, "positive", None),
    Operator("invert", UNARY, "~", "Invert", "BitInvert", "__invert__", None, "__invert__", None),
    Operator("setitem", STORE, "", None, None, "__setitem__", None, "__setitem__", None),
)

BY_ENTRY = {row.entry: row for row in TABLE}


def rows(*kinds):
    """The rows of the given kinds, in table order."""
    return tuple(row for row in TABLE if row.kind in kinds)


def dump_names(tensor_methods):
    """``entry -> (name for a tensor left operand, name for a scalar left and tensor right operand)``, each
    the first catalogued candidate (``tensor_methods``: method name -> ``Tensor.<method>``), or None."""
    def first(*candidates):
        for method in candidates:
            if method is not None and method in tensor_methods:
                return tensor_methods[method]
        return None

    return {row.entry: (first(row.dunder, row.reported), first(row.reflected, row.reported_reflected))
            for row in TABLE}
