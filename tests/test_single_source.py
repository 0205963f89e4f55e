"""Each rule of the project lives in one place (the architecture in docs/architecture.md); these checks read
the source, so a second copy of a rule, or state changed from outside its owner, fails here."""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("runtime", "msprobe_rewrite")


def _sources():
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as handle:
                        yield os.path.relpath(path, ROOT), handle.read()


SOURCES = dict(_sources())


@pytest.mark.parametrize(
    "spelling",
    ["__rxor__", "__radd__", "__itruediv__", "__neg__", "MatrixMultiplyAssign", "ast.MatMult", "FLOOR_DIVIDE"],
)
def test_the_operator_vocabulary_is_spelt_in_one_file(spelling):
    files = [path for path, text in SOURCES.items() if spelling.split(".")[-1] in text]
    assert files == [os.path.join("runtime", "operators.py")]


@pytest.mark.parametrize("name", ["RUNTIME_NAME", "RUNTIME_MODULE", "SKIP_FILE_MARKER", "DIRECTIONS"])
def test_shared_constants_are_defined_once(name):
    definitions = [path for path, text in SOURCES.items() if re.search(rf"^{name}\s*=", text, re.MULTILINE)]
    assert len(definitions) == 1, definitions


# the collector, and the declaration of its per-step state (StepState's constructor and remove_hooks)
_THE_COLLECTORS_OWN = (os.path.join("runtime", "collector.py"), os.path.join("runtime", "step_state.py"))


def _writes_outside_the_collector():
    """``(path, statement or call, target)`` for every place outside ``runtime/collector.py`` that assigns,
    deletes or mutates in place (``_MUTATORS``) a target; tuple targets give each element, starred ones what
    they hold."""
    for path, text in SOURCES.items():
        if path in _THE_COLLECTORS_OWN:
            continue
        for node in ast.walk(ast.parse(text)):
            targets = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
                targets = [node.func.value]
            while targets:
                target = targets.pop()
                if isinstance(target, (ast.Tuple, ast.List)):
                    targets.extend(target.elts)
                else:
                    yield path, node, target.value if isinstance(target, ast.Starred) else target


def test_the_collectors_execution_state_changes_only_in_the_collector():
    """``work.depth``, ``mode_depth`` and ``ctx`` are changed by ``Collector`` methods (``own_work``,
    ``push_mode``, ``enter_code``...) and nowhere else."""
    offenders = []
    for path, node, target in _writes_outside_the_collector():
        while isinstance(target, ast.Subscript):
            target = target.value
        if isinstance(target, ast.Attribute) and (
            target.attr in ("work", "mode_depth", "ctx", "param_waiters")
            or (target.attr == "depth" and isinstance(target.value, ast.Attribute) and target.value.attr == "work")
        ):
            offenders.append(f"{path}:{node.lineno}")
    assert offenders == []


def test_no_module_imports_a_private_name_of_another():
    offenders = []
    for path, text in SOURCES.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        offenders.append(f"{path}:{node.lineno} {alias.name}")
    assert offenders == []


def test_the_dump_names_grammar_is_spelt_in_one_file():
    """A dump name's shape (``Prefix.api.N.forward``, ``Module.path.Class.backward.N``) is parsed and built in
    ``runtime/dump_names.py`` only: no other module spells the directions as a pattern or a table of its own
    (the config's scope check, compare's direction codes)."""
    offenders = []
    for path, text in SOURCES.items():
        if path == os.path.join("runtime", "dump_names.py"):
            continue
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.search(r"forward\|backward|backward\|forward", node.value)
            ):
                offenders.append(f"{path}:{node.lineno} pattern {node.value!r}")
            keys = (
                [key.value if isinstance(key, ast.Constant) else None for key in node.keys]
                if isinstance(node, ast.Dict)
                else []
            )
            if {"forward", "backward"} <= set(keys) <= {"forward", "backward", "parameters_grad"}:
                offenders.append(f"{path}:{node.lineno} a table keyed by the directions")
    assert offenders == []


_MUTATORS = ("append", "extend", "pop", "clear", "update", "remove", "insert", "setdefault")


def _is_collector(node):
    """Whether ``node`` spells a collector object: ``collector``, ``self.collector``, ``debugger._collector``..."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name is not None and re.fullmatch(r"_*collector", name) is not None


def _collector_attribute(node):
    """The ``collector.X`` that ``node`` (``collector.X``, ``collector.X[k]``, ``collector.X.y``...) changes
    when written, or None."""
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        if isinstance(node, ast.Attribute) and _is_collector(node.value):
            return node
        node = node.value
    return None


def test_the_collectors_state_changes_only_in_the_collector():
    """No module but ``runtime/collector.py`` assigns, deletes or mutates in place (append, pop, clear...) an
    attribute of a collector: each change is one of ``Collector``'s named verbs (``narrow_to``,
    ``enter_module``, ``keep_hook``...)."""
    offenders = []
    for path, node, target in _writes_outside_the_collector():
        attribute = _collector_attribute(target)
        if attribute is not None:
            offenders.append(f"{path}:{node.lineno} {ast.unparse(attribute)}")
    assert offenders == [], "\n".join(offenders)
