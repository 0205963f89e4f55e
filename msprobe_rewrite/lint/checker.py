"""Find the rules' constructs in one module, with the compiler's own binding tables and resolver.

Every decision that the transformer also makes (is this callee a catalogued API, is this decorator a kernel
decorator, is this zone left as written) is taken from the same code or the same tables, so the lint reports
exactly what the rewrite will not see. The tree is Python's ``ast``; ``collect_scopes`` records each scope's
node, so a node's scope is a dictionary look-up rather than a second pairing walk.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from msprobe_runtime.catalogue import Catalogue

from ..kernels import is_kernel_decorator
from ..markers import SKIP_FILE_MARKER, SKIP_MARKER, module_of, package_of
from ..resolver import API, UNKNOWN, Resolver, qualify
from ..decisions import frozen_ast_parts
from ..scopes import ModuleScopes, Scope, absolute_module, callee_path, collect_scopes
from .noqa import is_suppressed

# Roots of the modules whose import makes unresolved calls worth counting (MSP901).
TORCH_ROOTS = frozenset({"torch", "torch_npu"})
CONTAINER_GETTERS = frozenset({"get", "pop", "setdefault"})
_NEWLINE = re.compile(r"\r\n|\r|\n")  # how ast numbers lines (str.splitlines also splits on \f, \x1c, ...)


class CheckError(Exception):
    """A file that cannot be decoded or parsed; the message names it and says why."""


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    column: int  # 1-based, in characters (ast counts UTF-8 bytes)
    end_line: int
    end_column: int
    code: str
    message: str


@dataclass(frozen=True)
class _Container:
    name: str
    line: int
    kind: str  # "dict" or "sequence": what plain iteration yields (keys, or the APIs themselves)
    apis: Tuple[str, ...]


def catalogued_namespaces(catalogue: Catalogue) -> FrozenSet[str]:
    """Modules and classes that directly hold a catalogued API (``torch``, ``torch.nn.functional``,
    ``torch.Tensor``, ``megatron.core.fusions.fused_bias_gelu``, ...)."""
    return frozenset(qualname.rsplit(".", 1)[0] for qualname in catalogue.by_qualname if "." in qualname)


def _short(node: ast.AST, limit: int = 48) -> str:
    text = ast.unparse(node)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Visitor(ast.NodeVisitor):
    """One walk over the module. Scopes are entered as the collector entered them: decorators, defaults,
    annotations and class bases in the enclosing scope."""

    def __init__(self, linter: "Linter", scopes: ModuleScopes, lines: Sequence[str]):
        self.linter = linter
        self.resolver = linter.resolver
        self.codes = linter.codes
        self.lines = lines
        self.scope_of = {id(scope.node): scope for scope in scopes.in_order}
        self.stack: List[Scope] = [scopes.module]
        self.kernels: List[str] = []  # decorators of the kernel bodies we are in
        self.frozen = 0  # decorators, defaults, annotations, bases: never rewritten
        self.skipped = 0  # bodies under `# msprobe: skip`: the user opted out, so nothing to report
        self.findings: List[Tuple[ast.AST, str, str]] = []
        self.containers: Dict[int, _Container] = {}  # id(Binding) -> container of APIs
        self.class_containers: Dict[str, Tuple[str, _Container]] = {}  # attribute -> (class name, container)
        self.imports_torch = any(self._binds_torch(scope) for scope in [scopes.module, *scopes.in_order])

    @staticmethod
    def _binds_torch(scope: Scope) -> bool:
        if any(module.split(".", 1)[0] in TORCH_ROOTS for module in scope.star_imports):
            return True
        return any(
            qualname.split(".", 1)[0] in TORCH_ROOTS
            for binding in scope.bindings.values()
            for qualname in binding.qualnames
        )

    @property
    def scope(self) -> Scope:
        return self.stack[-1]

    def report(self, node: ast.AST, code: str, message: str) -> None:
        if code in self.codes and not self.skipped:
            self.findings.append((node, code, message))

    # -- import-time containers (MSP004), found before the walk so a function above the container sees it --
    def collect_containers(self, body: Iterable[ast.stmt], scope: Scope, class_name: Optional[str]) -> None:
        for statement in body:
            if isinstance(statement, ast.ClassDef):
                inner = self.scope_of.get(id(statement))
                if inner is not None:
                    self.collect_containers(statement.body, inner, statement.name)
                continue
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue  # runs later, not at import time
            targets: List[ast.expr] = []
            value = None
            if isinstance(statement, ast.Assign):
                targets, value = statement.targets, statement.value
            elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
                targets, value = [statement.target], statement.value
            if value is not None:
                kind_apis = self._container_apis(value, scope)
                if kind_apis is not None:
                    for target in targets:
                        if isinstance(target, ast.Name):
                            self._add_container(target.id, statement.lineno, *kind_apis, scope, class_name)
                # A registry filled at import time: REGISTRY["gelu"] = F.gelu
                for target in targets:
                    if (
                        isinstance(target, ast.Subscript)
                        and isinstance(target.value, ast.Name)
                        and self.resolver.resolve_dotted(callee_path(value), scope).kind == API
                    ):
                        self._add_container(
                            target.value.id, statement.lineno, "dict", [callee_path(value)], scope, class_name
                        )
                continue
            for field in ("body", "orelse", "finalbody"):  # if/try/with/for bodies run at import time
                nested = getattr(statement, field, None)
                if isinstance(nested, list):
                    self.collect_containers(nested, scope, class_name)
            for handler in getattr(statement, "handlers", None) or ():
                self.collect_containers(handler.body, scope, class_name)

    def _add_container(
        self, name: str, line: int, kind: str, apis: List[str], scope: Scope, class_name: Optional[str]
    ) -> None:
        binding = scope.bindings.get(name)
        key = id(binding) if binding is not None else None
        known = self.containers.get(key) if key is not None else None
        if known is not None:  # a second filling of the same table: keep its first line, add the APIs
            container = _Container(name, known.line, known.kind, known.apis + tuple(apis))
        else:
            container = _Container(name, line, kind, tuple(apis))
        if key is not None:
            self.containers[key] = container
        if class_name is not None:
            self.class_containers[name] = (class_name, container)

    def _container_apis(self, value: ast.expr, scope: Scope) -> Optional[Tuple[str, List[str]]]:
        if isinstance(value, ast.Dict):
            kind, elements = "dict", list(value.values)
        elif isinstance(value, (ast.List, ast.Tuple, ast.Set)):
            kind, elements = "sequence", list(value.elts)
        elif (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "dict"
            and scope.lookup("dict") == (None, True)
        ):
            kind, elements = "dict", [keyword.value for keyword in value.keywords]
        else:
            return None
        apis: List[str] = []
        for element in elements:
            if element is None:
                continue
            dotted = callee_path(element)
            if dotted is not None:
                if self.resolver.resolve_dotted(dotted, scope).kind == API:
                    apis.append(dotted)
            else:
                nested = self._container_apis(element, scope)  # {"gelu": (F.gelu, True)}
                if nested is not None:
                    apis.extend(nested[1])
        return (kind, apis) if apis else None

    def _container_at(self, node: ast.expr) -> Optional[_Container]:
        if isinstance(node, ast.Name):
            binding, _ = self.scope.lookup(node.id)
            return self.containers.get(id(binding)) if binding is not None else None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            entry = self.class_containers.get(node.attr)
            if entry is not None and node.value.id in ("self", "cls", entry[0]):
                return entry[1]
        return None

    def _report_container(self, node: ast.AST, container: _Container, how: str) -> None:
        apis = ", ".join(container.apis[:3]) + (", ..." if len(container.apis) > 3 else "")
        self.report(
            node,
            "MSP004",
            f"{how} reaches APIs stored in `{container.name}` at import time (line {container.line}: "
            f"{apis}); no static name, only the run-time identity check sees the call",
        )

    def _iterated_container(self, iterable: ast.expr) -> Optional[_Container]:
        container = self._container_at(iterable)
        if container is not None:
            return container if container.kind == "sequence" else None  # a dict yields its keys
        if (
            isinstance(iterable, ast.Call)
            and isinstance(iterable.func, ast.Attribute)
            and iterable.func.attr in ("values", "items")
        ):
            container = self._container_at(iterable.func.value)
            if container is not None and container.kind == "dict":
                return container
        return None

    def _check_loop(self, target: ast.expr, iterable: ast.expr, body: Sequence[ast.AST]) -> None:
        container = self._iterated_container(iterable)
        if container is None:
            return
        names = {node.id for node in ast.walk(target) if isinstance(node, ast.Name)}
        for part in body:
            for node in ast.walk(part):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
                    self._report_container(iterable, container, f"iterating `{_short(iterable)}`")
                    return

    # -- scopes -------------------------------------------------------------------------------------
    def _visit_frozen(self, nodes: Iterable[Optional[ast.AST]]) -> None:
        self.frozen += 1
        for node in nodes:
            if node is not None:
                self.visit(node)
        self.frozen -= 1

    def _in(self, node: ast.AST, body: Iterable[ast.AST]) -> None:
        self.stack.append(self.scope_of.get(id(node), self.scope))
        for item in body:
            self.visit(item)
        self.stack.pop()

    def _kernel_decorator(self, node) -> Optional[str]:
        # The transformer's test (transformer._is_kernel) on ast nodes: the same tables, the same order.
        skip = self.linter.skip_decorators
        for decorator in node.decorator_list:
            expression = decorator.func if isinstance(decorator, ast.Call) else decorator
            dotted = callee_path(expression)
            if dotted is None:
                continue
            if is_kernel_decorator(dotted, self.scope, skip):
                return dotted
        return None

    def _has_skip_marker(self, node) -> bool:
        first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
        header_end = max(node.lineno, node.body[0].lineno - 1) if node.body else node.lineno
        candidates = list(range(node.lineno, header_end + 1))
        line = first - 1
        while line >= 1 and (not self.lines[line - 1].strip() or self.lines[line - 1].lstrip().startswith("#")):
            candidates.append(line)
            line -= 1
        return any(SKIP_MARKER.search(self.lines[n - 1]) for n in candidates if n <= len(self.lines))

    def _function(self, node) -> None:
        self._visit_frozen(frozen_ast_parts(node))  # decorators, defaults, annotations: decisions.ZONES
        kernel = self._kernel_decorator(node)
        skip = self._has_skip_marker(node)
        if kernel is not None:
            self.kernels.append(f"`@{kernel}` function `{node.name}`")
        self.skipped += skip
        self._in(node, node.body)
        self.skipped -= skip
        if kernel is not None:
            self.kernels.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._visit_frozen(frozen_ast_parts(node))
        skip = self._has_skip_marker(node)
        self.skipped += skip
        self._in(node, node.body)
        self.skipped -= skip

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._visit_frozen(frozen_ast_parts(node))
        self._in(node, [node.body])

    def _comprehension(self, node) -> None:
        # the first iterable is evaluated in the enclosing scope, but the transformers resolve it inside the
        # comprehension's (libcst visits it there); the lint reports what the rewrite does, so it does too
        parts: List[ast.AST] = []
        for generator in node.generators:
            parts.append(generator.target)
            parts.append(generator.iter)
            parts.extend(generator.ifs)
        result = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        self._in(node, parts + result)
        self.stack.append(self.scope_of.get(id(node), self.scope))
        for generator in node.generators:
            self._check_loop(generator.target, generator.iter, result + generator.ifs)
        self.stack.pop()

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._visit_frozen(frozen_ast_parts(node))
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    # -- rules --------------------------------------------------------------------------------------
    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if any(alias.name == "*" for alias in node.names):
            module = absolute_module(node, self.linter.package)
            if module in self.linter.namespaces:
                self.report(
                    node,
                    "MSP002",
                    f"`from {module} import *` hides which APIs are called: its names, and every builtin "
                    f"after it, resolve only at run time; import the names used",
                )

    def visit_For(self, node: ast.For) -> None:
        self._check_loop(node.target, node.iter, node.body)
        self.generic_visit(node)

    visit_AsyncFor = visit_For

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load):
            container = self._container_at(node.value)
            if container is not None:
                self._report_container(node, container, f"`{_short(node.value)}[...]`")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self._check_getattr(node)
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr in CONTAINER_GETTERS
            and self._container_at(func.value) is not None
        ):
            self._report_container(node, self._container_at(func.value), f"`{_short(func)}(...)`")
        dotted = callee_path(func)
        if self.kernels:
            resolution = self.resolver.resolve_dotted(dotted, self.scope)
            if resolution.kind == API:
                self.report(
                    node,
                    "MSP003",
                    f"`{dotted}` ({resolution.api_name}) is called in the body of {self.kernels[-1]}, "
                    f"which is left uninstrumented: this call is never recorded",
                )
        elif not self.frozen and "MSP901" in self.codes and self.imports_torch:
            bare_generator = any(isinstance(arg, ast.GeneratorExp) for arg in node.args) and len(node.args) == 1
            if not bare_generator and self.resolver.resolve_dotted(dotted, self.scope).kind == UNKNOWN:
                self.report(node, "MSP901", f"`{_short(func)}(...)` is resolved only at run time (dyn)")
        self.generic_visit(node)

    def _check_getattr(self, node: ast.Call) -> None:
        func = node.func
        if not (isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2):
            return
        binding, _ = self.scope.lookup("getattr")
        if binding is not None:
            return  # a getattr of the user's own
        dotted = callee_path(node.args[0])
        namespace = qualify(dotted, self.scope) if dotted is not None else None
        if namespace not in self.linter.namespaces:
            return
        name = node.args[1]
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            api_name = self.linter.catalogue.dump_name(f"{namespace}.{name.value}")
            if api_name is not None:
                self.report(
                    node,
                    "MSP001",
                    f"`getattr({dotted}, {name.value!r})` hides `{namespace}.{name.value}` "
                    f"({api_name}) from static resolution; write `{dotted}.{name.value}`",
                )
        else:
            self.report(
                node,
                "MSP001",
                f"`getattr({dotted}, {_short(name, 24)})` fetches an API of {namespace} by a "
                f"computed name: no static name, only the run-time identity check sees it",
            )


class Linter:
    """The rules that are on, and the catalogue and resolver they share, for any number of files."""

    def __init__(self, catalogue: Catalogue, codes: FrozenSet[str], skip_decorators: Iterable[str] = ()):
        self.catalogue = catalogue
        self.resolver = Resolver(catalogue)
        self.namespaces = catalogued_namespaces(catalogue)
        self.codes = codes
        self.skip_decorators = frozenset(skip_decorators)
        self.package: Optional[str] = None

    def check(self, source: bytes, path: str = "<string>", package: Optional[str] = None) -> List[Finding]:
        """Findings in ``source``, in line order, without the suppressed ones."""
        if SKIP_FILE_MARKER.search(source):
            return []  # the file opted out of instrumentation as a whole
        try:
            tree = ast.parse(source, filename=path)
        except SyntaxError as error:
            raise CheckError(
                f"{path}: cannot parse: {error.msg} (line {error.lineno}, column {error.offset})"
            ) from None
        except (ValueError, UnicodeDecodeError, LookupError) as error:
            raise CheckError(f"{path}: cannot parse: {error}") from None
        text = _decode(source)
        lines = _NEWLINE.split(text)
        self.package = package if package is not None else package_of(path)
        scopes = collect_scopes(tree, self.package, module_of(path, self.package))
        visitor = _Visitor(self, scopes, lines)
        if "MSP004" in self.codes:
            visitor.collect_containers(tree.body, scopes.module, None)
        for statement in tree.body:
            visitor.visit(statement)
        findings = []
        for node, code, message in visitor.findings:
            line, end_line = node.lineno, getattr(node, "end_lineno", None) or node.lineno
            if is_suppressed(lines, line, code):
                continue
            findings.append(
                Finding(
                    path,
                    line,
                    _column(lines, line, node.col_offset),
                    end_line,
                    _column(lines, end_line, getattr(node, "end_col_offset", None) or 0),
                    code,
                    message,
                )
            )
        findings.sort(key=lambda f: (f.line, f.column, f.code))
        return findings


def _decode(source: bytes) -> str:
    import io
    import tokenize

    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
        return source.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return source.decode("utf-8", "replace")


def _column(lines: Sequence[str], line: int, byte_offset: int) -> int:
    if not 1 <= line <= len(lines):
        return byte_offset + 1
    text = lines[line - 1]
    if text.isascii():
        return byte_offset + 1
    return len(text.encode("utf-8")[:byte_offset].decode("utf-8", "ignore")) + 1


def check_source(
    source: bytes,
    catalogue: Catalogue,
    codes: FrozenSet[str],
    path: str = "<string>",
    skip_decorators: Iterable[str] = (),
    package: Optional[str] = None,
) -> List[Finding]:
    """One module's findings; see ``Linter`` to check many files with one set-up."""
    return Linter(catalogue, codes, skip_decorators).check(source, path, package)
