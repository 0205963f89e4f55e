"""Kernel and compiled functions of real code (megatron-core from PyPI) keep their bodies byte for byte."""

import ast
import collections
from pathlib import Path

import pytest

from msprobe_rewrite.api import rewrite_source

KERNEL_DECORATORS = (
    "triton.jit",
    "triton.autotune",
    "triton.heuristics",
    "jit_fuser",
    "torch.compile",
    "torch.compiler.disable",
    "torch.jit.script",
)


def megatron_core_root() -> Path:
    """megatron-core's package directory, found without importing it; the test is skipped, with the name,
    where it is not installed (a test extra, which ``make test`` installs)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution("megatron-core")
    except PackageNotFoundError:
        pytest.skip("megatron-core is not installed (a test extra: pip install -e '.[test]')")
    return Path(str(dist.locate_file("megatron/core/__init__.py"))).parent


def kernel_functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                text = ast.unparse(target)
                if text in KERNEL_DECORATORS:
                    yield text, node


def test_megatron_core_kernel_bodies_are_untouched():
    counts = collections.Counter()
    for path in sorted(megatron_core_root().rglob("*.py")):
        source = path.read_bytes()
        if not any(name.encode() in source for name in ("triton.", "jit_fuser", "torch.compile")):
            continue
        tree = ast.parse(source)
        found = list(kernel_functions(tree))
        if not found:
            continue
        before = source.decode().splitlines()
        after = rewrite_source(source, path=str(path)).decode().splitlines()
        for decorator, node in found:
            first = min(d.lineno for d in node.decorator_list)
            lines = slice(first - 1, node.end_lineno)
            assert after[lines] == before[lines], f"{path}:{node.lineno} {node.name} (@{decorator}) changed"
            counts[decorator] += 1
    # The test proves something only if real kernels of each main kind were seen.
    assert counts["triton.jit"] >= 30 and counts["jit_fuser"] >= 30 and counts["torch.compiler.disable"] >= 5, counts
