"""Binding tables for every scope of a module, built from Python's own ``ast`` in one cheap pass.

The transformer walks the libcst tree; libcst's own scope analysis is correct but several times slower than
parsing, so the bindings come from ``ast`` instead, in the spirit of typeguard's ``TransformMemo``. Scopes are
listed in pre-order of the source (the order in which a libcst visitor enters them), so the transformer pairs
each libcst scope node with its table by position in that list and checks the pairing by kind and name.
"""

from __future__ import annotations

import ast
import builtins
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

# How a name is bound within one scope. A name bound several ways is UNKNOWN at its call sites.
IMPORT = "import"  # bound only by imports, to the qualified names in Binding.qualnames
DEFINITION = "definition"  # bound only by `def` / `class`
STDLIB_VALUE = "stdlib-value"  # bound only by `name = <call of a stdlib or builtin callable>`
OTHER = "other"

MODULE, FUNCTION, CLASS, LAMBDA, COMPREHENSION = "module", "function", "class", "lambda", "comprehension"

STDLIB_MODULES = frozenset(getattr(sys, "stdlib_module_names", ())) | frozenset(sys.builtin_module_names)
_BUILTINS = frozenset(dir(builtins))


def is_stdlib(qualname: str) -> bool:
    return qualname.split(".", 1)[0] in STDLIB_MODULES


@dataclass
class Binding:
    kinds: Set[str] = field(default_factory=set)
    qualnames: Set[str] = field(default_factory=set)

    @property
    def kind(self) -> str:
        if len(self.kinds) != 1:
            return OTHER
        (kind,) = self.kinds
        if kind == IMPORT and len(self.qualnames) != 1:
            return OTHER
        return kind

    @property
    def qualname(self) -> Optional[str]:
        return next(iter(self.qualnames)) if self.kind == IMPORT else None


@dataclass
class Scope:
    kind: str
    name: str
    parent: Optional["Scope"]
    bindings: Dict[str, Binding] = field(default_factory=dict)
    globals_declared: Set[str] = field(default_factory=set)
    nonlocals_declared: Set[str] = field(default_factory=set)
    star_imports: List[str] = field(default_factory=list)
    # The ast node that opens the scope (None for the module), so an ``ast`` walker such as the lint can
    # find a node's scope directly instead of re-deriving the pre-order pairing the transformer uses.
    node: Optional[ast.AST] = field(default=None, repr=False, compare=False)
    # The module scope only: the module's own dotted name, where it is known, so that a function it defines
    # resolves to its qualified name (``apex.normalization.fused_layer_norm.fused_rms_norm_affine``).
    qualname: Optional[str] = None

    def bind(self, name: str, kind: str, qualname: Optional[str] = None) -> None:
        binding = self.bindings.setdefault(name, Binding())
        binding.kinds.add(kind)
        if qualname is not None:
            binding.qualnames.add(qualname)

    @property
    def module(self) -> "Scope":
        scope = self
        while scope.parent is not None:
            scope = scope.parent
        return scope

    def lookup(self, name: str) -> Tuple[Optional[Binding], bool]:
        """Python's lookup of ``name`` used in this scope: (binding or None, whether it is a builtin)."""
        scope: Optional[Scope] = self
        first = True
        while scope is not None:
            # Class bodies are not enclosing scopes for the functions, lambdas and comprehensions in them.
            if scope.kind == CLASS and not first:
                scope = scope.parent
                continue
            if name in scope.globals_declared:
                return self.module.bindings.get(name), False
            if name not in scope.nonlocals_declared and name in scope.bindings:
                return scope.bindings[name], False
            first = False
            scope = scope.parent
        if self.module.star_imports:
            return None, False
        return None, name in _BUILTINS


def absolute_module(node: ast.ImportFrom, package: Optional[str]) -> Optional[str]:
    if not node.level:
        return node.module
    if not package:
        return None
    parts = package.split(".")
    if node.level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


# torch.library's decorators whose result is a CustomOpDef, an operator of a torch.ops namespace
_OPERATOR_DECORATORS = frozenset({"custom_op", "triton_op"})


def _makes_operator(decorator: ast.AST) -> bool:
    """Whether ``decorator`` is spelled as one of torch.library's operator decorators (``@custom_op(...)``,
    ``@torch.library.custom_op(...)``), read from the spelling: a name that only looks like one costs a
    ``dyn`` call, never a missed record."""
    if isinstance(decorator, ast.Call):
        decorator = decorator.func
    path = dotted_path(decorator)
    return path is not None and path.rpartition(".")[2] in _OPERATOR_DECORATORS


def dotted_path(node: ast.AST, constants_as_names: bool = False) -> Optional[str]:
    """``a.b.c`` for a Name/Attribute chain, else None. ``constants_as_names``: ``None``, ``True`` and ``False``
    count as names, as in libcst's tree, so ``True.__index__`` reads as the transformer reads it."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif (
        constants_as_names
        and isinstance(node, ast.Constant)
        and (node.value is None or node.value is True or node.value is False)
    ):
        parts.append(repr(node.value))
    else:
        return None
    return ".".join(reversed(parts))


def callee_path(node: ast.AST) -> Optional[str]:
    """A callee's dotted name as the transformers and the lint resolve it (``True.__index__`` included)."""
    return dotted_path(node, constants_as_names=True)


class _Collector(ast.NodeVisitor):
    def __init__(self, package: Optional[str], module: Optional[str] = None):
        self.package = package
        self.module = Scope(MODULE, "", None, qualname=module)
        self.current = self.module
        # (sort key, scope) for every scope but the module; sorted into pre-order at the end.
        self.entries: List[Tuple[Tuple[int, int, int], Scope]] = []
        self.depth = 0

    # -- scopes -------------------------------------------------------------------------------------
    def _enter(self, node: ast.AST, kind: str, name: str, start: ast.AST) -> Scope:
        scope = Scope(kind, name, self.current, node=node)
        self.entries.append(((start.lineno, start.col_offset, self.depth), scope))
        return scope

    def _in_scope(self, scope: Scope, body) -> None:
        saved = self.current
        self.current = scope
        self.depth += 1
        for item in body:
            self.visit(item)
        self.depth -= 1
        self.current = saved

    def _start_of(self, node) -> ast.AST:
        # libcst enters a decorated definition before its decorators, so its position is the first one's.
        return node.decorator_list[0] if node.decorator_list else node

    def _visit_arguments(self, args: ast.arguments, scope: Scope) -> None:
        for arg in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
            if arg is not None:
                scope.bind(arg.arg, OTHER)

    def _function(self, node) -> None:
        # a ``@custom_op("mylib::op")`` function is torch's CustomOpDef, which the runtime names by identity
        # where config.json lists its namespace: its calls go through ``dyn`` (tests/runtime/test_custom_ops.py)
        self.current.bind(node.name, OTHER if any(_makes_operator(d) for d in node.decorator_list) else DEFINITION)
        scope = self._enter(node, FUNCTION, node.name, self._start_of(node))
        self.depth += 1  # decorators, defaults and annotations are evaluated outside the function
        for item in node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d]:
            self.visit(item)
        for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs + [node.args.vararg, node.args.kwarg]:
            if arg is not None and arg.annotation is not None:
                self.visit(arg.annotation)
        if node.returns is not None:
            self.visit(node.returns)
        self.depth -= 1
        self._visit_arguments(node.args, scope)
        self._in_scope(scope, node.body)

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.current.bind(node.name, DEFINITION)
        scope = self._enter(node, CLASS, node.name, self._start_of(node))
        self.depth += 1
        for item in node.decorator_list + node.bases + node.keywords:
            self.visit(item)
        self.depth -= 1
        self._in_scope(scope, node.body)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        scope = self._enter(node, LAMBDA, "<lambda>", node)
        self.depth += 1
        for item in node.args.defaults + [d for d in node.args.kw_defaults if d]:
            self.visit(item)
        self.depth -= 1
        self._visit_arguments(node.args, scope)
        self._in_scope(scope, [node.body])

    def _comprehension(self, node) -> None:
        scope = self._enter(node, COMPREHENSION, type(node).__name__, node)
        # The first iterable is evaluated in the enclosing scope; libcst still visits it inside the node.
        self.depth += 1
        self.visit(node.generators[0].iter)
        self.depth -= 1
        saved = self.current
        self.current = scope
        self.depth += 1
        for index, generator in enumerate(node.generators):
            self.visit(generator.target)
            if index:
                self.visit(generator.iter)
            for condition in generator.ifs:
                self.visit(condition)
        if isinstance(node, ast.DictComp):
            self.visit(node.key)
            self.visit(node.value)
        else:
            self.visit(node.elt)
        self.depth -= 1
        self.current = saved

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    # -- bindings -----------------------------------------------------------------------------------
    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            self.current.bind(node.id, OTHER)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        scope = self.current
        while scope.kind == COMPREHENSION and scope.parent is not None:
            scope = scope.parent
        scope.bind(node.target.id, OTHER)
        self.visit(node.value)

    def visit_Assign(self, node: ast.Assign) -> None:
        kind = None
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call):
            kind = self._stdlib_value_kind(node.value)
        if kind is not None:
            self.current.bind(node.targets[0].id, kind)
            self.visit(node.value)
        else:
            self.generic_visit(node)

    def _stdlib_value_kind(self, call: ast.Call) -> Optional[str]:
        dotted = dotted_path(call.func)
        if dotted is None:
            return None
        root, _, rest = dotted.partition(".")
        binding, builtin = self.current.lookup(root)
        if builtin:
            return STDLIB_VALUE
        if binding is not None and binding.kind == IMPORT and is_stdlib(binding.qualname):
            return STDLIB_VALUE
        return None

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.current.bind(alias.asname, IMPORT, alias.name)
            else:
                root = alias.name.split(".", 1)[0]
                self.current.bind(root, IMPORT, root)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = absolute_module(node, self.package)
        for alias in node.names:
            if alias.name == "*":
                self.current.star_imports.append(module or "")
                continue
            bound = alias.asname or alias.name
            if module is None:
                self.current.bind(bound, OTHER)
            else:
                self.current.bind(bound, IMPORT, f"{module}.{alias.name}")

    def visit_Global(self, node: ast.Global) -> None:
        self.current.globals_declared.update(node.names)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.current.nonlocals_declared.update(node.names)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.current.bind(node.name, OTHER)
        self.generic_visit(node)

    def visit_MatchAs(self, node) -> None:
        if node.name:
            self.current.bind(node.name, OTHER)
        self.generic_visit(node)

    def visit_MatchStar(self, node) -> None:
        if node.name:
            self.current.bind(node.name, OTHER)

    def visit_MatchMapping(self, node) -> None:
        if node.rest:
            self.current.bind(node.rest, OTHER)
        self.generic_visit(node)


@dataclass
class ModuleScopes:
    module: Scope
    in_order: List[Scope]  # every scope but the module, in source pre-order


def collect_scopes(tree: ast.Module, package: Optional[str] = None, module: Optional[str] = None) -> ModuleScopes:
    """Binding tables of ``tree``; ``package`` resolves relative imports (``from . import x``), ``module`` is the
    module's own dotted name (``markers.module_of``), where known."""
    collector = _Collector(package, module)
    for statement in tree.body:
        collector.visit(statement)
    collector.entries.sort(key=lambda entry: entry[0])
    return ModuleScopes(collector.module, [scope for _, scope in collector.entries])
