"""The README's table of environment variables names every variable the compiler and the runtime read: found in
the source (``os.environ.get``, ``environ[...]``, ``switched_on``, by literal or by a module's constant), so a
new variable without a row fails here. Before, there was no table: two cache folders with two variables and
the switches were spread over the README's paragraphs."""

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("msprobe_rewrite", "runtime")


def _is_environ(node):
    return (isinstance(node, ast.Name) and node.id in ("environ", "environment")) or (
        isinstance(node, ast.Attribute) and node.attr == "environ"
    )


def _read_names(tree):
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            getter = (
                isinstance(func, ast.Attribute)
                and func.attr in ("get", "getenv")
                and (_is_environ(func.value) or (isinstance(func.value, ast.Name) and func.value.id == "os"))
            )
            switch = (isinstance(func, ast.Name) and func.id == "switched_on") or (
                isinstance(func, ast.Attribute) and func.attr == "switched_on"
            )
            if getter or switch:
                yield value(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value):
            yield value(node.slice)


def read_variables():
    names = set()
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for file_name in files:
                if file_name.endswith(".py"):
                    with open(os.path.join(folder, file_name), encoding="utf-8") as handle:
                        names.update(name for name in _read_names(ast.parse(handle.read())) if name)
    return names


def readme_table():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        text = handle.read()
    assert "### Environment variables" in text, "README.md has no section '### Environment variables'"
    section = text.split("### Environment variables", 1)[1].split("\n#", 1)[0]
    return {
        name
        for line in section.splitlines()
        if line.startswith("| `")
        for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1])
    }


def test_the_readme_table_names_every_environment_variable_read():
    read = read_variables()
    assert {"MSPROBE_REWRITE_CACHE_DIR", "MSPROBE_CACHE_DIR", "MSPROBE_NATIVE_STATS"} <= read  # the scan works
    assert read - readme_table() == set()
