"""The same rewrite as ``transformer.py``, on Python's own ``ast``, for the import hook.

The import hook needs a code object, not source a person reads, so it does not need libcst's lossless tree;
on CPython's own parser the whole rewrite takes a fifth of the time, and a cold import is mostly rewriting.
This module takes the transformer's decisions on an ``ast`` tree and builds the nodes that parsing the
transformer's output would give, so the two compile to the same program (``tests/compiler/corpus_check.py``
compares the two trees for every file of the standard library and megatron-core). Where a decision depends on
a spelling that ``ast`` does not keep (operator whitespace, parentheses, comments), it is read from the source
text at the nodes' positions.

Anything this module cannot decide for certain (a skip marker, a spelling libcst does not reproduce, an
already instrumented file, an API call inside nested f-strings) returns None, and the caller takes the
libcst path; nothing here imports libcst.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from typing import Iterable, List, Optional

from msprobe_runtime import operators
from msprobe_runtime.catalogue import Catalogue

from . import decisions
from .kernels import is_kernel_decorator
from .markers import RUNTIME_NAME, SKIP_FILE_MARKER, SKIP_MARKER, is_instrumented, maybe_lossy, module_of, package_of
from .resolver import API, NOT_API, Resolver
from .scopes import Scope, callee_path, collect_scopes


def _by_ast_node(*kinds):
    """Runtime entry and spelling of each operator, by its ast node class (the operator table's rows)."""
    return {getattr(ast, row.ast_node): (row.entry, row.spelling.encode()) for row in operators.rows(*kinds)}


BINARY = _by_ast_node(operators.BINARY)
COMPARISON = _by_ast_node(operators.COMPARISON)
AUGMENTED = _by_ast_node(operators.AUGMENTED)
UNARY = _by_ast_node(operators.UNARY)

_NEWLINE = re.compile(rb"\r\n|\r|\n")  # how ast numbers lines
_BLANK = frozenset(b" \t\x0c\r\n\\")  # whitespace and line continuations between tokens
_NOT_A_TOKEN_START = _BLANK | {ord("#")}


# Nodes that hold no expression the rewrite changes.
_LEAVES = (
    ast.Name,
    ast.Constant,
    ast.Import,
    ast.ImportFrom,
    ast.Pass,
    ast.Break,
    ast.Continue,
    ast.Global,
    ast.Nonlocal,
    ast.expr_context,
    ast.operator,
    ast.unaryop,
    ast.cmpop,
    ast.boolop,
)


_GAP = frozenset(b" \t\x0c\r\n\\(")  # what may stand between a keyword and its test: blanks and parentheses
GAP_NONE, GAP_SPACE, GAP_PAREN = "none", "space", "paren"


_UNPACKING = (ast.Tuple, ast.List)  # an assignment or loop target that unpacks


class Unsure(Exception):
    """This module cannot take the decision for certain; the libcst transformer must."""


def _literal_kind(node: ast.AST) -> int:
    """The ``decisions`` literal kind of an expression as ast spells it (``forms.literal_kind`` for libcst)."""
    if isinstance(node, ast.JoinedStr):
        return decisions.TEXT
    if not isinstance(node, ast.Constant):
        return decisions.NOT_LITERAL
    value = node.value
    if value is None or isinstance(value, bool):
        return decisions.CONSTANT
    if isinstance(value, (str, bytes)):
        return decisions.TEXT
    return decisions.ELLIPSIS if value is Ellipsis else decisions.NUMBER


def _routes_truth_test(node: ast.AST) -> bool:
    """``decisions.routes_truth_test`` on the facts of an ast test (``forms.routes_truth_test`` for libcst)."""
    comparison = name = None
    if isinstance(node, ast.Compare):
        comparison = (
            [type(op).__name__ for op in node.ops],
            [_literal_kind(operand) for operand in (node.left, *node.comparators)],
        )
    elif isinstance(node, ast.Name):
        name = node.id
    elif isinstance(node, ast.Attribute):
        name = node.attr
    is_not = isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)
    return decisions.routes_truth_test(_literal_kind(node), is_not, comparison, name)


def _tokens(segment: bytes) -> list:
    """The tokens of a piece of source (a string literal, a parenthesized expression)."""
    try:
        return list(tokenize.tokenize(io.BytesIO(segment).readline))
    except (tokenize.TokenError, SyntaxError) as error:
        raise Unsure(f"cannot tokenize {segment[:40]!r}: {error}") from None


class _Text:
    """The source as UTF-8 bytes, addressed as ``ast`` addresses it: (line, byte column)."""

    def __init__(self, data: bytes):
        self.data = data
        self.starts = [0] + [match.end() for match in _NEWLINE.finditer(data)]

    def start(self, node: ast.AST) -> int:
        return self.starts[node.lineno - 1] + node.col_offset

    def end(self, node: ast.AST) -> int:
        return self.starts[node.end_lineno - 1] + node.end_col_offset

    def next_token(self, position: int):
        """Skip closing parentheses, whitespace, continuations and comments from ``position``: (where the next
        token starts, where the whitespace right before it starts)."""
        data, size = self.data, len(self.data)
        whitespace = position
        while position < size:
            char = data[position]
            if char in _BLANK:
                position += 1
            elif char == 0x23:  # '#'
                while position < size and data[position] not in (0x0A, 0x0D):
                    position += 1
            elif char == 0x29:  # ')'
                position += 1
                whitespace = position
            else:
                break
        return position, whitespace

    def gap_before(self, node: ast.AST) -> str:
        """What separates ``node`` from the keyword before it (``if``, ``not``, ``and`` ...): GAP_NONE,
        GAP_SPACE (whitespace first) or GAP_PAREN (a parenthesis first, whose owner the ast does not keep)."""
        data, start = self.data, self.start(node)
        position = start - 1
        while position >= 0 and data[position] in _GAP:
            position -= 1
        if position < 0 or not (data[position : position + 1].isalnum() or data[position] == 0x5F):
            raise Unsure("no keyword before a truth test where one was expected")
        gap = data[position + 1 : start]
        if b"\n" in gap or b"\r" in gap:
            line = max(data.rfind(b"\n", 0, position), data.rfind(b"\r", 0, position)) + 1
            if b"#" in data[line:position]:
                raise Unsure("a comment may stand between a keyword and its test")
        if not gap:
            return GAP_NONE
        return GAP_PAREN if gap[0] == 0x28 else GAP_SPACE

    def left_alone_operator(self, after: int, spelling: bytes) -> bool:
        """forms.comma_for_operator returns None: the operator reads ``a+ b`` (nothing before it, one space
        after), the one spelling that no comma can encode."""
        position, whitespace = self.next_token(after)
        if not self.data.startswith(spelling, position):
            raise Unsure(f"expected {spelling!r} at byte {position}")
        following = position + len(spelling)
        after = self.data[following : following + 2]
        return whitespace == position and len(after) == 2 and after[0] == 0x20 and after[1] not in _NOT_A_TOKEN_START


class AstCallSiteTransformer:
    """Rewrites a parsed module in place, as ``CallSiteTransformer`` rewrites its libcst tree."""

    def __init__(self, text: _Text, scopes, resolver: Resolver, skip_decorators: Iterable[str] = ()):
        self.text = text
        self.resolver = resolver
        self.skip_decorators = frozenset(skip_decorators)
        self.scope_of = {id(scope.node): scope for scope in scopes.in_order}
        self.stack: List[Scope] = [scopes.module]
        self.fstrings = 0  # f-strings around the current node (format specs are not f-strings of their own)
        self.misplaced = 0  # replacement fields around the current node whose positions are wrong
        self.handlers = {
            ast.FunctionDef: self._definition,
            ast.AsyncFunctionDef: self._definition,
            ast.ClassDef: self._definition,
            ast.Lambda: self._lambda,
            ast.ListComp: self._comprehension,
            ast.SetComp: self._comprehension,
            ast.DictComp: self._comprehension,
            ast.GeneratorExp: self._comprehension,
            ast.JoinedStr: self._fstring,
            ast.FormattedValue: self._formatted_value,
            ast.Call: self._call,
            ast.BinOp: self._binary,
            ast.UnaryOp: self._unary,
            ast.Compare: self._comparison,
            ast.Assign: self._assignment,
            ast.AugAssign: self._augmented,
            ast.If: self._test_owner,
            ast.While: self._test_owner,
            ast.Assert: self._test_owner,
            ast.IfExp: self._test_owner,
            ast.comprehension: self._comprehension_ifs,
            ast.For: self._for_loop,
        }
        self.tests = set()  # ids of the nodes in a test position, as transformer.CallSiteTransformer.tests
        if hasattr(ast, "match_case"):  # Python 3.10+
            self.handlers[ast.match_case] = self._match_case

    # -- walking ------------------------------------------------------------------------------------
    def visit(self, node):
        handler = self.handlers.get(type(node))
        if handler is not None:
            return handler(node)
        if not isinstance(node, _LEAVES):
            self._children(node)
        return node

    def _children(self, node, fields=None) -> None:
        """Visit ``fields`` of ``node``, by default every one outside the zones never rewritten."""
        for name in fields if fields is not None else decisions.ast_fields(node):
            value = getattr(node, name, None)
            if isinstance(value, list):
                for index, item in enumerate(value):
                    if isinstance(item, ast.AST):
                        value[index] = self.visit(item)
            elif isinstance(value, ast.AST):
                setattr(node, name, self.visit(value))

    def _in_scope(self, node, fields) -> None:
        self.stack.append(self.scope_of[id(node)])
        try:
            self._children(node, fields)
        finally:
            self.stack.pop()

    # -- scopes and zones left as written -----------------------------------------------------------
    def _is_kernel(self, node) -> bool:
        for decorator in node.decorator_list:
            expression = decorator.func if isinstance(decorator, ast.Call) else decorator
            dotted = callee_path(expression)
            if dotted is not None and is_kernel_decorator(dotted, self.stack[-1], self.skip_decorators):
                return True
        return False

    def _definition(self, node):
        # decorators, defaults, annotations, type parameters, class bases and keywords: decisions.ZONES
        if not self._is_kernel(node):
            self._in_scope(node, decisions.ast_fields(node))
        return node

    def _lambda(self, node):
        self._in_scope(node, decisions.ast_fields(node))  # its defaults are left as written
        return node

    def _comprehension(self, node):
        # libcst visits the first iterable inside the comprehension's scope, and the transformer resolves
        # there; so does this walk.
        self._in_scope(node, None)
        return node

    def _match_case(self, node):
        if node.guard is not None:
            self._mark_test(node.guard)
        self._children(node)  # the pattern is no expression: decisions.ZONES
        if node.guard is not None:
            node.guard = self._truth_test(node.guard)
        return node

    def _fstring(self, node):
        self.fstrings += 1
        try:
            self._children(node)
        finally:
            self.fstrings -= 1
        return node

    def _formatted_value(self, node):
        # Python 3.11 places a replacement field's nodes by searching the f-string for the field's text,
        # which can find the wrong place (or line); a field is trusted where its text, read back from those
        # positions, parses to the same tree.
        misplaced = not self._placed(node.value)
        if not misplaced and self._prints_its_text(node.value):
            return node  # f"{x*2=}" prints the expression's text, so the expression stays as written
        self.misplaced += misplaced
        try:
            node.value = self.visit(node.value)
        finally:
            self.misplaced -= misplaced
        if node.format_spec is not None:
            self._children(node.format_spec)  # a format spec is part of its f-string, not one of its own
        return node

    def _prints_its_text(self, node: ast.expr) -> bool:
        """A replacement field with ``=`` after its expression (a "self-documenting" field)."""
        position, _ = self.text.next_token(self.text.end(node))
        return self.text.data[position : position + 1] == b"="

    def _placed(self, node: ast.expr) -> bool:
        segment = self.text.data[self.text.start(node) : self.text.end(node)]
        try:
            parsed = ast.parse(b"(" + segment + b")", mode="eval")
        except (SyntaxError, ValueError):
            return False
        return ast.dump(parsed.body) == ast.dump(node)

    # -- rewrites -----------------------------------------------------------------------------------
    def _runtime(self, entry: str, args, like: ast.AST, keywords=(), line: Optional[int] = None) -> ast.Call:
        """``__msprobe__.entry(*args)`` in place of ``like``. CPython 3.11+ runs a method call on the line
        where its attribute ends, so ``__msprobe__.entry`` stands on ``line``: the line the original
        expression ran on (its first, or for a method call the line of the method's name), which the frame's
        ``f_lineno``, tracebacks and the dump's call site then show."""
        name = ast.Name(id=RUNTIME_NAME, ctx=ast.Load())
        func = ast.Attribute(value=name, attr=entry, ctx=ast.Load())
        call = ast.Call(func=func, args=list(args), keywords=list(keywords))
        ast.copy_location(call, like)
        line, column = (like.lineno, like.col_offset) if line is None or line == like.lineno else (line, 0)
        for new, width in ((name, len(RUNTIME_NAME)), (func, len(RUNTIME_NAME) + 1 + len(entry))):
            new.lineno, new.col_offset, new.end_lineno, new.end_col_offset = line, column, line, column + width
        return call

    def _constant(self, value: str, like: ast.AST) -> ast.Constant:
        return ast.copy_location(ast.Constant(value=value), like)

    def _positions_known(self) -> None:
        if self.misplaced:
            raise Unsure("a spelling inside an f-string whose positions are wrong")

    def _call(self, node: ast.Call):
        self._children(node)
        builtin = self._builtin_name(node.func)
        if builtin is not None and decisions.observes_builtin(builtin):
            self._positions_known()
            node.func = self._runtime("builtin", [node.func], node.func)  # as transformer.leave_Call
            return node
        resolution = self.resolver.resolve_dotted(callee_path(node.func), self.stack[-1])
        if resolution.kind == NOT_API:
            return node
        self._positions_known()
        text = self.text
        paren, whitespace = text.next_token(text.end(node.func))
        if text.data[paren : paren + 1] != b"(":
            raise Unsure("the call's parenthesis is not where it was expected")
        if any(isinstance(arg, ast.GeneratorExp) and text.start(arg) == paren for arg in node.args):
            return node  # f(x for x in y): a bare generator must stay the only argument
        if b"\n" in text.data[whitespace:paren] or b"\r" in text.data[whitespace:paren]:
            return node  # `f\<newline>(x)`: no form keeps the callee on its line
        args = [node.func, *node.args]
        entry = "dyn"
        if resolution.kind == API:
            if self.fstrings > 1:
                raise Unsure("an API call inside nested f-strings")  # the quotes left decide call or dyn
            entry = "call"
            args.insert(0, self._constant(resolution.api_name, node))
        # `(\n x\n).to(y)` ran on the line of `.to`; a plain `f(\n x)` on its first line
        line = node.func.end_lineno if isinstance(node.func, ast.Attribute) else None
        return self._runtime(entry, args, node, node.keywords, line)

    def _binary(self, node: ast.BinOp):
        self._children(node)
        left, right = node.left, node.right
        entry, spelling = BINARY[type(node.op)]
        one_string = lambda: isinstance(left, ast.Constant) and self._single_string(left)  # noqa: E731
        if not decisions.rewrite_binary(entry, _literal_kind(left), _literal_kind(right), one_string):
            return node
        self._positions_known()
        if self.text.left_alone_operator(self.text.end(left), spelling):
            return node
        return self._runtime(entry, [left, right], node)

    def _single_string(self, node: ast.Constant) -> bool:
        """Whether a string constant is one literal (libcst's SimpleString), not adjacent ones."""
        self._positions_known()
        segment = self.text.data[self.text.start(node) : self.text.end(node)]
        return sum(token.type == tokenize.STRING for token in _tokens(b"(" + segment + b")")) == 1

    # -- truth tests (as transformer.CallSiteTransformer's) -------------------------------------------
    def _mark_test(self, node) -> None:
        self.tests.add(id(node))
        if isinstance(node, ast.BoolOp):
            for value in node.values:
                self._mark_test(value)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self._mark_test(node.operand)

    def _test_owner(self, node):
        self._mark_test(node.test)
        self._children(node)
        node.test = self._truth_test(node.test)
        return node

    def _comprehension_ifs(self, node):
        for test in node.ifs:
            self._mark_test(test)
        entry = None if node.is_async else self._iteration_entry(node.iter, isinstance(node.target, _UNPACKING))
        self._children(node)
        node.ifs = [self._truth_test(test) for test in node.ifs]
        self._iterate_loop(node, entry)
        return node

    # -- iteration (as transformer.CallSiteTransformer's) --------------------------------------------
    def _builtin_name(self, node: ast.AST) -> Optional[str]:
        if isinstance(node, ast.Name) and self.stack[-1].lookup(node.id) == (None, True):
            return node.id
        return None

    def _iteration_entry(self, value: ast.AST, unpacks_items: bool) -> Optional[str]:
        """``decisions.iteration_entry`` on the facts of an ast value, read before its own rewrite."""
        display = decisions.NOT_DISPLAY
        if isinstance(value, (ast.List, ast.Tuple, ast.Set)):
            display = (
                decisions.DISPLAY_OF_DISPLAYS
                if all(
                    isinstance(item, (ast.List, ast.Tuple)) or decisions.is_literal(_literal_kind(item))
                    for item in value.elts
                )
                else decisions.DISPLAY
            )
        elif isinstance(value, (ast.Dict, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            display = decisions.DISPLAY
        builtin = self._builtin_name(value.func) if isinstance(value, ast.Call) else None
        return decisions.iteration_entry(_literal_kind(value), display, builtin, unpacks_items)

    def _iterate_loop(self, node, entry: Optional[str]) -> None:
        """``for x in t`` -> ``for x in __msprobe__.iterate(t)``, where whitespace follows ``in``."""
        if entry is None:
            return
        self._positions_known()
        if isinstance(node.iter, ast.Tuple) and not self._enclosed(node.iter):
            return  # `for a, b in "ab", "cd"`: a bare tuple is no single argument
        if self.text.gap_before(node.iter) == GAP_SPACE:
            node.iter = self._runtime(entry, [node.iter], node.iter)

    def _for_loop(self, node: ast.For):
        entry = self._iteration_entry(node.iter, isinstance(node.target, _UNPACKING))
        self._children(node)
        self._iterate_loop(node, entry)
        return node

    def _truth_test(self, node, first_operand: bool = False):
        """``node`` in a test position, each truth test routed. ``first_operand``: the first operand of an
        ``and``/``or``, where a parenthesis after the keyword may be the operation's (libcst then routes) or
        the operand's own (libcst leaves it), which the ast does not tell apart."""
        if isinstance(node, ast.BoolOp):
            node.values = [self._truth_test(value, index == 0) for index, value in enumerate(node.values)]
            return node
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            node.operand = self._truth_test(node.operand)
            return node
        if not _routes_truth_test(node):
            return node
        self._positions_known()
        gap = self.text.gap_before(node)
        if gap == GAP_PAREN and first_operand:
            raise Unsure("a parenthesis right after a keyword, before an operand of and/or")
        if gap != GAP_SPACE:
            return node  # `if(t):`: `__msprobe__` would join the keyword
        return self._runtime("truth", [node], node)

    def _unary(self, node: ast.UnaryOp):
        self._children(node)
        if isinstance(node.op, ast.Not):
            if id(node) in self.tests or not _routes_truth_test(node.operand):
                return node  # in a test position, its owner routes the operand
            self._positions_known()
            if self.text.gap_before(node.operand) == GAP_SPACE:
                node.operand = self._runtime("truth", [node.operand], node.operand)
            return node
        found = UNARY.get(type(node.op))
        if found is None or not decisions.rewrite_unary(_literal_kind(node.operand)):
            return node
        self._positions_known()
        entry, spelling = found
        start = self.text.start(node)
        if not self.text.data.startswith(spelling, start):
            raise Unsure("the unary operator is not where it was expected")
        if self.text.data[start + 1] in _NOT_A_TOKEN_START:
            return node  # `- x`: whitespace after the operator has no place in the call
        return self._runtime(entry, [node.operand], node)

    def _comparison(self, node: ast.Compare):
        self._children(node)
        left, right = node.left, node.comparators[0]
        if not decisions.rewrite_comparison(len(node.ops), _literal_kind(left), _literal_kind(right)):
            return node
        found = COMPARISON.get(type(node.ops[0]))
        if found is None:
            return node
        self._positions_known()
        entry, spelling = found
        if self.text.left_alone_operator(self.text.end(left), spelling):
            return node
        return self._runtime(entry, [left, right], node)

    def _enclosed(self, node: ast.expr) -> bool:
        """Whether ``node``'s text is one pair of parentheses and what they hold."""
        segment = self.text.data[self.text.start(node) : self.text.end(node)]
        if not segment.startswith(b"("):
            return False
        depth = 0
        tokens = [token for token in _tokens(segment) if token.type == tokenize.OP]
        for index, token in enumerate(tokens):
            depth += token.string in "([{"
            depth -= token.string in ")]}"
            if depth == 0:
                return index == len(tokens) - 1
        return False

    def _parenthesized_target(self, statement: ast.stmt, target: ast.expr, first: bool) -> bool:
        start = self.text.start(target)
        if first:
            return self.text.start(statement) != start
        data = self.text.data
        position = start - 1
        while position >= 0 and data[position] in b" \t\x0c":
            position -= 1
        if position < 0 or data[position] not in b"=(":
            raise Unsure("cannot tell whether an assignment target is parenthesized")
        return data[position] == 0x28  # '('

    def _assignment(self, node: ast.Assign):
        """``obj[k] = v`` -> ``__msprobe__.item(obj)[k] = v`` and ``a, b = t`` -> ``a, b =
        __msprobe__.iterate(t)``, as ``leave_Assign``."""
        entry = None
        if any(isinstance(target, _UNPACKING) for target in node.targets) and not isinstance(
            node.value, (ast.Yield, ast.YieldFrom)
        ):
            entry = self._iteration_entry(node.value, False)
        self._children(node)
        for index, target in enumerate(node.targets):
            if isinstance(target, ast.Subscript) and not self._parenthesized_target(node, target, index == 0):
                target.value = self._runtime("item", [target.value], target.value)
        if entry is not None:
            node.value = self._runtime(entry, [node.value], node.value)
        return node

    def _augmented(self, node: ast.AugAssign):
        self._children(node)
        value, target = node.value, node.target
        if isinstance(value, (ast.Yield, ast.YieldFrom)):
            raise Unsure("an augmented assignment of a yield")  # whether it is parenthesized decides
        if isinstance(value, ast.Tuple) and not self._enclosed(value):
            return node  # `x += a, b`: a bare tuple is no single argument
        entry, spelling = AUGMENTED[type(node.op)]
        if isinstance(target, ast.Name):
            load = ast.copy_location(ast.Name(id=target.id, ctx=ast.Load()), target)
            call = self._runtime(entry, [load, value], node)
            return ast.copy_location(ast.Assign(targets=[target], value=call), node)
        text = self.text
        if text.left_alone_operator(text.end(target), spelling):
            return node
        if self._parenthesized_target(node, target, True):
            return node
        if isinstance(target, ast.Attribute):
            dot, whitespace = text.next_token(text.end(target.value))
            if text.data[dot : dot + 1] != b"." or not target.attr.isascii():
                raise Unsure("cannot find an attribute's dot")
            if whitespace != dot or text.end(target) != dot + 1 + len(target.attr):
                return node  # `a . b += v`: no form keeps the spaces around the dot
            reference = self._runtime("attr", [target.value, self._constant(target.attr, target)], target)
        elif isinstance(target, ast.Subscript):
            loader = self._runtime("item", [target.value], target.value)
            reference = ast.copy_location(ast.Subscript(value=loader, slice=target.slice, ctx=ast.Load()), target)
        else:
            return node
        call = self._runtime("aug", [reference, self._constant(entry, node), value], node)
        return ast.copy_location(ast.Expr(value=call), node)


def rewrite_to_ast(
    source: bytes,
    catalogue: Catalogue,
    path: str = "<string>",
    skip_decorators: Iterable[str] = (),
    package: Optional[str] = None,
) -> Optional[ast.Module]:
    """The instrumented module as an ``ast`` tree, without the runtime import (the import hook binds
    ``__msprobe__`` itself), equal to parsing ``api.rewrite_source(..., add_import=False)``; None where only
    the libcst path can say (it then also gives any error)."""
    if SKIP_FILE_MARKER.search(source) or is_instrumented(source) or maybe_lossy(source):
        return None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
        text = source.decode(encoding)
        if text.startswith("\ufeff"):
            text = text[1:]
        if SKIP_MARKER.search(text):
            return None
        tree = ast.parse(text, filename=path)
    except (SyntaxError, ValueError, UnicodeError, LookupError):
        return None
    package = package if package is not None else package_of(path)
    scopes = collect_scopes(tree, package, module_of(path, package))
    transformer = AstCallSiteTransformer(_Text(text.encode("utf-8")), scopes, Resolver(catalogue), skip_decorators)
    try:
        tree.body = [transformer.visit(statement) for statement in tree.body]
    except (Unsure, RecursionError):
        return None
    return tree
