"""The inverse of the rewrite: every instrumented form back to the exact text it came from."""

from __future__ import annotations

import libcst as cst

from .dispatch import CachedDispatch
from .text_forms import UNWRAPPED
from .forms import (
    AUGMENTED_BY_NAME,
    BINARY_BY_NAME,
    COMPARISON_BY_NAME,
    EMPTY,
    UNARY_BY_NAME,
    has_line_break,
    is_empty,
    operator_whitespace,
    runtime_entry,
)


def _string_value(node: cst.BaseExpression) -> str:
    assert isinstance(node, cst.SimpleString)
    return node.evaluated_value


class Restorer(CachedDispatch):
    def leave_Call(self, original: cst.Call, updated: cst.Call):
        entry = runtime_entry(updated)
        if entry is None:
            return updated
        args = updated.args
        if entry in UNWRAPPED:
            return args[0].value  # truth(t), iterate(t), builtin(f): as written, its own parentheses included
        if entry in ("call", "dyn"):
            callee = 1 if entry == "call" else 0  # call("Api.name", fn, ...) / dyn(fn, ...)
            whitespace = updated.whitespace_before_args
            # A line break after the original `(` follows the callee, which stays on its own line.
            moved = args[callee].comma.whitespace_after if len(args) > callee + 1 else args[callee].whitespace_after_arg
            if has_line_break(moved) and is_empty(whitespace):
                whitespace = moved
            return cst.Call(
                func=args[callee].value,
                args=args[callee + 1 :],
                whitespace_after_func=updated.whitespace_after_func,
                whitespace_before_args=whitespace,
                lpar=updated.lpar,
                rpar=updated.rpar,
            )
        if entry in BINARY_BY_NAME or entry in COMPARISON_BY_NAME:
            before, after = operator_whitespace(args[0].comma)
            if entry in BINARY_BY_NAME:
                operator = BINARY_BY_NAME[entry](whitespace_before=before, whitespace_after=after)
                return cst.BinaryOperation(
                    left=args[0].value, operator=operator, right=args[1].value, lpar=updated.lpar, rpar=updated.rpar
                )
            operator = COMPARISON_BY_NAME[entry](whitespace_before=before, whitespace_after=after)
            return cst.Comparison(
                left=args[0].value,
                comparisons=[cst.ComparisonTarget(operator=operator, comparator=args[1].value)],
                lpar=updated.lpar,
                rpar=updated.rpar,
            )
        if entry in UNARY_BY_NAME:
            return cst.UnaryOperation(
                operator=UNARY_BY_NAME[entry](whitespace_after=EMPTY),
                expression=args[0].value,
                lpar=updated.lpar,
                rpar=updated.rpar,
            )
        return updated  # the parts of augmented assignments, undone with their statement

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        targets = []
        for target in updated.targets:
            store = target.target
            if isinstance(store, cst.Subscript) and runtime_entry(store.value) == "item":
                target = target.with_changes(target=store.with_changes(value=store.value.args[0].value))
            targets.append(target)
        updated = updated.with_changes(targets=targets)
        entry = runtime_entry(updated.value)
        if entry not in AUGMENTED_BY_NAME or len(updated.targets) != 1:
            return updated
        target = updated.targets[0]
        operator = AUGMENTED_BY_NAME[entry](
            whitespace_before=target.whitespace_before_equal, whitespace_after=target.whitespace_after_equal
        )
        return cst.AugAssign(
            target=target.target, operator=operator, value=updated.value.args[1].value, semicolon=updated.semicolon
        )

    def leave_Expr(self, original: cst.Expr, updated: cst.Expr):
        if runtime_entry(updated.value) != "aug":
            return updated
        reference, op_name, value = updated.value.args
        if runtime_entry(reference.value) == "attr":
            obj, name = reference.value.args
            target = cst.Attribute(value=obj.value, attr=cst.Name(_string_value(name.value)))
        else:
            subscript = reference.value
            target = subscript.with_changes(value=subscript.value.args[0].value)
        before, after = operator_whitespace(op_name.comma)
        operator = AUGMENTED_BY_NAME[_string_value(op_name.value)](whitespace_before=before, whitespace_after=after)
        return cst.AugAssign(target=target, operator=operator, value=value.value, semicolon=updated.semicolon)
