"""No import cycle inside either package (issue 34, item 3).

The graph is read from the AST of every module, and an import inside a function counts as much as one at the top:
deferring an import only hides a cycle until the function runs, and then the order modules happen to load in
decides whether a name exists yet. Each package is a graph of its own (``msprobe_runtime`` from ``runtime/``, and
``msprobe_rewrite`` with its subpackages); only edges between modules of the same package count. An import names
the module it reads from: ``from . import shims`` depends on ``shims``, ``from . import __version__`` on the package's
``__init__``. The parent packages that Python runs first on the way to a submodule are not edges: every module of a
package would otherwise sit in a cycle with an ``__init__`` that imports any of them.
"""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"msprobe_runtime": os.path.join(ROOT, "runtime"), "msprobe_rewrite": os.path.join(ROOT, "msprobe_rewrite")}

# Cycles that are allowed, each a frozenset of module names with the reason beside it. Empty: there is none.
ALLOWED = {}


def modules_of(package, folder):
    """Module name -> path, for every ``.py`` file under ``folder`` (the package ``package``)."""
    found = {}
    for where, _, files in os.walk(folder):
        parts = [package] + os.path.relpath(where, folder).split(os.sep)
        parts = [part for part in parts if part != "."]
        for name in files:
            if name.endswith(".py"):
                stem = name[:-3]
                found[".".join(parts if stem == "__init__" else parts + [stem])] = os.path.join(where, name)
    return found


def _known(name, modules):
    """The longest prefix of the dotted ``name`` that is a module of the package, or None."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def imports_of(module, path, modules):
    """The package's modules that ``module`` imports, anywhere in its body (functions and classes included)."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    is_package = os.path.basename(path) == "__init__.py"
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(_known(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1 if is_package else node.level)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module
            for alias in node.names:
                # ``from pkg import sub`` reads the submodule; ``from mod import name`` reads mod
                targets.add(
                    _known(f"{base}.{alias.name}", modules)
                    if f"{base}.{alias.name}" in modules
                    else _known(base, modules)
                )
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (
                    isinstance(node.func, ast.Attribute)
                    and node.func.attr == "import_module"
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "importlib"
                )
            )
        ):
            targets.add(_known(node.args[0].value, modules))  # importlib.import_module("a.b") is an import too
    targets.discard(None)
    return targets


def import_graph(package, folder):
    modules = modules_of(package, folder)
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def cycles(graph):
    """Strongly connected components of more than one module, and modules that import themselves (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_relative_absolute_and_deferred_imports(tmp_path):
    """A checker that missed function-level or relative imports would pass on every tree; this one must find
    the cycle each kind of import closes."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("VERSION = 1\n")
    (package / "a.py").write_text("def f():\n    from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("import pkg.c\n")
    (package / "c.py").write_text("class C:\n    def m(self):\n        from pkg import a\n")
    (package / "d.py").write_text("from . import VERSION\n")
    (package / "e.py").write_text("import importlib\nimportlib.import_module('pkg.e')\n")
    graph = import_graph("pkg", str(package))
    assert graph["pkg.d"] == {"pkg"}
    assert sorted(map(sorted, cycles(graph))) == [["pkg.a", "pkg.c", "pkg.sub.b"], ["pkg.e"]]


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle(package):
    graph = import_graph(package, PACKAGES[package])
    found = [cycle for cycle in cycles(graph) if cycle not in ALLOWED]
    assert found == [], "import cycles (each module, then what it imports inside the cycle):\n" + "\n\n".join(
        "\n".join(f"{module} -> {', '.join(sorted(graph[module] & cycle))}" for module in sorted(cycle))
        for cycle in found
    )
