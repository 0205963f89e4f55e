"""The rewrite of call sites and Tensor operators into the forms of docs/contract.md.

Only expressions change; every binding, import, decorator, default and annotation stays as written. Scopes
come from ``scopes.collect_scopes`` (built from ``ast``) and are entered here in the same pre-order.
"""

from __future__ import annotations

from typing import Iterable, List, Optional

import libcst as cst

from .dispatch import CachedDispatch
from . import decisions
from .forms import (
    AUGMENTED,
    BINARY,
    COMMA,
    COMPARISON,
    EMPTY,
    UNARY,
    comma_for_operator,
    has_line_break,
    is_empty,
    literal_kind,
    routes_truth_test,
    runtime_attr,
    safe_as_argument,
)
from .kernels import is_kernel_decorator
from .markers import SKIP_MARKER
from .resolver import API, NOT_API, Resolver
from .scopes import CLASS, COMPREHENSION, FUNCTION, LAMBDA, ModuleScopes, Scope


def dotted_name(node: cst.BaseExpression) -> Optional[str]:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if isinstance(node, cst.Name):
        parts.append(node.value)
        return ".".join(reversed(parts))
    return None


class ScopeMismatch(Exception):
    """The ast scopes and the libcst scopes did not pair up: a bug, reported rather than guessed around."""


def _has_skip_marker(node) -> bool:
    for line in node.leading_lines:
        if line.comment is not None and SKIP_MARKER.search(line.comment.value):
            return True
    header = getattr(node.body, "header", None)
    return bool(header is not None and header.comment is not None and SKIP_MARKER.search(header.comment.value))


class CallSiteTransformer(CachedDispatch):
    def __init__(self, scopes: ModuleScopes, resolver: Resolver, skip_decorators: Iterable[str] = ()):
        super().__init__()
        self.resolver = resolver
        self.pending = iter(scopes.in_order)
        self.stack: List[Scope] = [scopes.module]
        self.frozen = 0  # > 0 inside decorators, defaults, annotations, class bases and skipped bodies
        self.skipped: List[bool] = []
        self.fstring_quotes: List[str] = []
        self.skip_decorators = frozenset(skip_decorators)
        self.changes = 0
        self.tests = set()  # ids of the original nodes in a test position (see _mark_test)

    # -- scopes -------------------------------------------------------------------------------------
    def _enter(self, kind: str, name: Optional[str]) -> None:
        scope = next(self.pending, None)
        if scope is None or scope.kind != kind or (name is not None and scope.name != name):
            raise ScopeMismatch(f"expected {kind} {name!r}, paired with {scope and (scope.kind, scope.name)}")
        self.stack.append(scope)

    def _leave(self) -> None:
        self.stack.pop()

    @property
    def scope(self) -> Scope:
        return self.stack[-1]

    def _is_kernel(self, node) -> bool:
        for decorator in node.decorators:
            expression = decorator.decorator
            if isinstance(expression, cst.Call):
                expression = expression.func
            dotted = dotted_name(expression)
            if dotted is None:
                continue
            if is_kernel_decorator(dotted, self.scope, self.skip_decorators):
                return True
        return False

    def _enter_definition(self, node, kind: str) -> None:
        skip = _has_skip_marker(node) or self._is_kernel(node)
        self.skipped.append(skip)
        if skip:
            self.frozen += 1
        self._enter(kind, node.name.value)

    def _leave_definition(self) -> None:
        if self.skipped.pop():
            self.frozen -= 1
        self._leave()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._enter_definition(node, FUNCTION)

    def leave_FunctionDef(self, original, updated):
        self._leave_definition()
        return updated

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._enter_definition(node, CLASS)

    def leave_ClassDef(self, original, updated):
        self._leave_definition()
        return updated

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self._enter(LAMBDA, None)

    def leave_Lambda(self, original, updated):
        self._leave()
        return updated

    def _visit_comprehension(self, node) -> None:
        self._enter(COMPREHENSION, type(node).__name__)

    def _leave_comprehension(self, original, updated):
        self._leave()
        return updated

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _visit_comprehension
    leave_ListComp = leave_SetComp = leave_DictComp = leave_GeneratorExp = _leave_comprehension

    # -- zones that are never rewritten -------------------------------------------------------------
    def _freeze(self, node) -> None:
        self.frozen += 1

    def _thaw(self, node) -> None:
        self.frozen -= 1

    def _thaw_node(self, original, updated):
        self.frozen -= 1
        return updated

    def visit_FormattedStringExpression(self, node: cst.FormattedStringExpression) -> None:
        if node.equal is not None:  # f"{x*2=}" prints the expression's text, so it must stay as written
            self.frozen += 1

    def leave_FormattedStringExpression(self, original, updated):
        if original.equal is not None:
            self.frozen -= 1
        return updated

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        self.fstring_quotes.append(node.quote[0])

    def leave_FormattedString(self, original, updated):
        self.fstring_quotes.pop()
        return updated

    # -- rewrites -----------------------------------------------------------------------------------
    def _runtime_call(self, entry: str, args, template):
        self.changes += 1
        return cst.Call(func=runtime_attr(entry), args=args, lpar=template.lpar, rpar=template.rpar)

    def _builtin_name(self, node: cst.BaseExpression) -> Optional[str]:
        """The builtin's name where ``node`` is a plain name that resolves to one, else None."""
        if isinstance(node, cst.Name) and self.scope.lookup(node.value) == (None, True):
            return node.value
        return None

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.frozen:
            return updated
        builtin = self._builtin_name(original.func)
        if builtin is not None and decisions.observes_builtin(builtin):
            # `zip(t, u)` -> `__msprobe__.builtin(zip)(t, u)`: the callee is wrapped, so a bare generator stays
            self.changes += 1
            return updated.with_changes(func=cst.Call(func=runtime_attr("builtin"), args=[cst.Arg(value=updated.func)]))
        if any(isinstance(arg.value, cst.GeneratorExp) and not arg.value.lpar for arg in updated.args):
            return updated  # f(x for x in y): a bare generator must stay the only argument
        resolution = self.resolver.resolve_dotted(dotted_name(original.func), self.scope)
        if resolution.kind == NOT_API:
            return updated
        if has_line_break(updated.whitespace_after_func):
            return updated  # `f\<newline>(x)`: no form keeps the callee on its line
        # The callee stays on its own line: `f(\n    x)` becomes `dyn(f,\n    x)`, not `dyn(\n    f, x)`.
        whitespace = updated.whitespace_before_args
        newline = has_line_break(whitespace)
        if not updated.args:
            callee = cst.Arg(value=updated.func, whitespace_after_arg=whitespace if newline else EMPTY)
        else:
            callee = cst.Arg(
                value=updated.func, comma=COMMA.with_changes(whitespace_after=whitespace) if newline else COMMA
            )
        if newline:
            updated = updated.with_changes(whitespace_before_args=EMPTY)
        args = [callee, *updated.args]
        entry = "dyn"
        if resolution.kind == API:
            quote = next((q for q in ('"', "'") if q not in self.fstring_quotes), None)
            if quote is not None:  # inside f-strings using both quotes, identity dispatch names it instead
                entry = "call"
                args.insert(0, cst.Arg(value=cst.SimpleString(f"{quote}{resolution.api_name}{quote}"), comma=COMMA))
        self.changes += 1
        return updated.with_changes(func=runtime_attr(entry), args=args)

    def leave_BinaryOperation(self, original, updated):
        entry = BINARY[type(updated.operator)]
        if self.frozen or not decisions.rewrite_binary(
            entry,
            literal_kind(original.left),
            literal_kind(original.right),
            lambda: isinstance(original.left, cst.SimpleString),
        ):
            return updated
        operator = updated.operator
        comma = comma_for_operator(operator.whitespace_before, operator.whitespace_after)
        if comma is None:
            return updated
        args = [cst.Arg(value=updated.left, comma=comma), cst.Arg(value=updated.right)]
        return self._runtime_call(entry, args, updated)

    # -- iteration ----------------------------------------------------------------------------------
    # `for x in t`, a comprehension's `for`, `a, b = t` call iter() on t; `__msprobe__.iterate(t)` makes that
    # iterator as the plain run does (decisions.iteration_entry).
    def _iteration_entry(self, value: cst.BaseExpression, unpacks_items: bool) -> Optional[str]:
        display = decisions.NOT_DISPLAY
        if isinstance(value, (cst.List, cst.Tuple, cst.Set)):
            display = (
                decisions.DISPLAY_OF_DISPLAYS
                if all(
                    isinstance(element, cst.Element)
                    and (
                        isinstance(element.value, (cst.List, cst.Tuple))
                        or decisions.is_literal(literal_kind(element.value))
                    )
                    for element in value.elements
                )
                else decisions.DISPLAY
            )
        elif isinstance(value, (cst.Dict, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
            display = decisions.DISPLAY
        builtin = self._builtin_name(value.func) if isinstance(value, cst.Call) else None
        return decisions.iteration_entry(literal_kind(value), display, builtin, unpacks_items)

    def _iterated(self, entry: str, value: cst.BaseExpression) -> cst.Call:
        self.changes += 1
        return cst.Call(func=runtime_attr(entry), args=[cst.Arg(value=value)])

    def _leave_loop(self, original, updated):
        """``for x in t`` -> ``for x in __msprobe__.iterate(t)``; a comprehension's ``for`` alike. Not where
        ``in`` touches its value (``in(t)``: ``__msprobe__`` would join the keyword), nor ``async for``."""
        if (
            self.frozen
            or updated.asynchronous is not None
            or is_empty(updated.whitespace_after_in)
            or not safe_as_argument(original.iter)
        ):
            return updated  # `for a, b in "ab", "cd"`: a bare tuple is no single argument
        entry = self._iteration_entry(original.iter, isinstance(original.target, (cst.Tuple, cst.List)))
        if entry is None:
            return updated
        return updated.with_changes(iter=self._iterated(entry, updated.iter))

    leave_For = leave_CompFor = _leave_loop

    # -- truth tests --------------------------------------------------------------------------------
    # `if t:`, `while t:`, `assert t`, `a if t else b`, a comprehension's `if t` and `not t` each call bool()
    # on t once; `__msprobe__.truth(t)` is that call (Tensor.__bool__, as the observing mode records it). In a
    # test position CPython jumps on each operand of `and`/`or` and on the operand of `not`, calling bool() on
    # each at most once, so each of those operands is a test of its own; elsewhere `a and b` is a value.
    def _mark_test(self, node) -> None:
        self.tests.add(id(node))
        if isinstance(node, cst.BooleanOperation):
            self._mark_test(node.left)
            self._mark_test(node.right)
        elif isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            self._mark_test(node.expression)

    def _visit_test_owner(self, node) -> None:
        self._mark_test(node.test)

    visit_If = visit_While = visit_Assert = visit_IfExp = visit_CompIf = _visit_test_owner

    def visit_MatchCase(self, node: cst.MatchCase) -> None:
        if node.guard is not None:
            self._mark_test(node.guard)

    def leave_MatchCase(self, original, updated):
        if updated.guard is None:
            return updated
        return updated.with_changes(guard=self._truth_test(updated.guard, not is_empty(updated.whitespace_after_if)))

    def _truth_test(self, expression, spaced: bool):
        """``expression`` in a test position, with each truth test routed. ``spaced``: the text before it
        ends in whitespace or a parenthesis, so ``__msprobe__`` cannot join the keyword before it."""
        if isinstance(expression, cst.BooleanOperation):
            return expression.with_changes(
                left=self._truth_test(expression.left, spaced or bool(expression.lpar)),
                right=self._truth_test(expression.right, not is_empty(expression.operator.whitespace_after)),
            )
        if isinstance(expression, cst.UnaryOperation) and isinstance(expression.operator, cst.Not):
            return expression.with_changes(
                expression=self._truth_test(expression.expression, not is_empty(expression.operator.whitespace_after))
            )
        if self.frozen or not spaced or not routes_truth_test(expression):
            return expression
        self.changes += 1
        return cst.Call(func=runtime_attr("truth"), args=[cst.Arg(value=expression)])

    def _with_test(self, updated, whitespace):
        return updated.with_changes(test=self._truth_test(updated.test, not is_empty(whitespace)))

    def leave_If(self, original, updated):
        return self._with_test(updated, updated.whitespace_before_test)

    def leave_CompIf(self, original, updated):
        return self._with_test(updated, updated.whitespace_before_test)

    def leave_While(self, original, updated):
        return self._with_test(updated, updated.whitespace_after_while)

    def leave_Assert(self, original, updated):
        return self._with_test(updated, updated.whitespace_after_assert)

    def leave_IfExp(self, original, updated):
        return self._with_test(updated, updated.whitespace_after_if)

    def leave_UnaryOperation(self, original, updated):
        if isinstance(updated.operator, cst.Not):
            operand = updated.expression
            if (
                id(original) in self.tests
                or self.frozen
                or is_empty(updated.operator.whitespace_after)
                or not routes_truth_test(operand)
            ):
                return updated  # in a test position, its owner routes the operand
            self.changes += 1  # elsewhere `not` calls bool() once on its whole operand's value
            return updated.with_changes(expression=cst.Call(func=runtime_attr("truth"), args=[cst.Arg(value=operand)]))
        entry = UNARY.get(type(updated.operator))
        if (
            self.frozen
            or entry is None
            or not decisions.rewrite_unary(literal_kind(original.expression))
            or not is_empty(updated.operator.whitespace_after)
        ):
            return updated
        return self._runtime_call(entry, [cst.Arg(value=updated.expression)], updated)

    def leave_Comparison(self, original, updated):
        comparisons = original.comparisons
        if self.frozen or not decisions.rewrite_comparison(
            len(comparisons), literal_kind(original.left), literal_kind(comparisons[0].comparator)
        ):
            return updated
        target = updated.comparisons[0]
        entry = COMPARISON.get(type(target.operator))
        if entry is None:
            return updated
        comma = comma_for_operator(target.operator.whitespace_before, target.operator.whitespace_after)
        if comma is None:
            return updated
        args = [cst.Arg(value=updated.left, comma=comma), cst.Arg(value=target.comparator)]
        return self._runtime_call(entry, args, updated)

    def leave_Assign(self, original, updated):
        """``obj[k] = v`` -> ``__msprobe__.item(obj)[k] = v``: the store goes through the runtime (msprobe's
        ``Tensor.__setitem__``) with Python's order kept: ``v``, then ``obj``, then ``k``, then the store."""
        if self.frozen:
            return updated
        targets = []
        for target in updated.targets:
            store = target.target
            if isinstance(store, cst.Subscript) and not store.lpar:
                loader = cst.Call(func=runtime_attr("item"), args=[cst.Arg(value=store.value)])
                target = target.with_changes(target=store.with_changes(value=loader))
                self.changes += 1
            targets.append(target)
        updated = updated.with_changes(targets=targets)
        # `a, b = t` iterates t: `a, b = __msprobe__.iterate(t)`; not a yield's value, whose parentheses the
        # ast path cannot see
        if (
            any(isinstance(target.target, (cst.Tuple, cst.List)) for target in original.targets)
            and not isinstance(original.value, cst.Yield)
            and safe_as_argument(original.value)
        ):
            entry = self._iteration_entry(original.value, False)
            if entry is not None:
                updated = updated.with_changes(value=self._iterated(entry, updated.value))
        return updated

    def leave_AugAssign(self, original, updated):
        if self.frozen or not safe_as_argument(updated.value):
            return updated
        operator = updated.operator
        entry = AUGMENTED[type(operator)]
        target = updated.target
        if isinstance(target, cst.Name):
            self.changes += 1
            call = cst.Call(
                func=runtime_attr(entry),
                args=[cst.Arg(value=cst.Name(target.value), comma=COMMA), cst.Arg(value=updated.value)],
            )
            return cst.Assign(
                targets=[
                    cst.AssignTarget(
                        target=target,
                        whitespace_before_equal=operator.whitespace_before,
                        whitespace_after_equal=operator.whitespace_after,
                    )
                ],
                value=call,
                semicolon=updated.semicolon,
            )
        comma = comma_for_operator(operator.whitespace_before, operator.whitespace_after)
        if comma is None:
            return updated
        if isinstance(target, cst.Attribute) and not target.lpar:
            dot = target.dot
            if not (is_empty(dot.whitespace_before) and is_empty(dot.whitespace_after)):
                return updated
            reference = cst.Call(
                func=runtime_attr("attr"),
                args=[
                    cst.Arg(value=target.value, comma=COMMA),
                    cst.Arg(value=cst.SimpleString(f'"{target.attr.value}"')),
                ],
            )
        elif isinstance(target, cst.Subscript) and not target.lpar:
            loader = cst.Call(func=runtime_attr("item"), args=[cst.Arg(value=target.value)])
            reference = target.with_changes(value=loader)
        else:
            return updated
        self.changes += 1
        call = cst.Call(
            func=runtime_attr("aug"),
            args=[
                cst.Arg(value=reference, comma=COMMA),
                cst.Arg(value=cst.SimpleString(f'"{entry}"'), comma=comma),
                cst.Arg(value=updated.value),
            ],
        )
        return cst.Expr(value=call, semicolon=updated.semicolon)


def _install_zones() -> None:
    """The zones never rewritten (``decisions.ZONES``) as libcst visitor methods: a whole node frozen from its
    visit to its leave, or one field of it (``visit_<Node>_<field>``)."""
    for zone in decisions.ZONES:
        for node, field in zone.cst:
            if field is None:
                setattr(CallSiteTransformer, f"visit_{node}", CallSiteTransformer._freeze)
                setattr(CallSiteTransformer, f"leave_{node}", CallSiteTransformer._thaw_node)
            else:
                setattr(CallSiteTransformer, f"visit_{node}_{field}", CallSiteTransformer._freeze)
                setattr(CallSiteTransformer, f"leave_{node}_{field}", CallSiteTransformer._thaw)


_install_zones()
