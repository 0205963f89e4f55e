"""The lint and the transformer share one resolver: every call the lint reports as unresolved (MSP901) is a
call the rewrite routes through ``__msprobe__.dyn``, and no API call it reports inside a kernel body
(MSP003) is rewritten. Checked on real modules of megatron-core."""

import os
import re

import pytest

from msprobe_rewrite.api import default_catalogue, rewrite_source
from msprobe_rewrite.lint.checker import Linter

MODULES = [
    "transformer/mlp.py",
    "transformer/attention.py",
    "transformer/transformer_layer.py",
    "fusions/fused_bias_swiglu.py",
    "fusions/fused_bias_gelu.py",
    "fusions/fused_cross_entropy.py",
    "models/gpt/gpt_model.py",
    "tensor_parallel/layers.py",
    "activations.py",
]


@pytest.fixture(scope="module")
def megatron_core():
    return pytest.importorskip("megatron.core", reason="megatron-core is test material").__path__[0]


@pytest.mark.parametrize("module", MODULES)
def test_unresolved_calls_are_exactly_the_dyn_calls(megatron_core, module):
    path = os.path.join(megatron_core, module)
    with open(path, "rb") as handle:
        source = handle.read()
    findings = Linter(default_catalogue(), frozenset({"MSP901"})).check(source, path)
    rewritten = rewrite_source(source, path=path)
    assert len(findings) == rewritten.count(b"__msprobe__.dyn(")


@pytest.mark.parametrize("module", [m for m in MODULES if "fus" in m or m == "activations.py"])
def test_api_calls_in_kernel_bodies_are_left_as_written(megatron_core, module):
    path = os.path.join(megatron_core, module)
    with open(path, "rb") as handle:
        source = handle.read()
    findings = Linter(default_catalogue(), frozenset({"MSP003"})).check(source, path)
    assert findings
    rewritten = rewrite_source(source, path=path).splitlines()
    original = source.splitlines()
    for finding in findings:
        line = rewritten[finding.line - 1]
        assert line == original[finding.line - 1] and not re.search(rb"__msprobe__\.", line), finding


@pytest.mark.parametrize(
    "source",
    [
        # a comprehension's first iterable is resolved inside the comprehension by both transformers, where its
        # target shadows the module `torch`
        b"import torch\n\ndef f(x):\n    return [t for torch in torch.split(x, 1) for t in torch]\n",
        # `True.__index__` is a constant's method for libcst and for the ast path: no API, no dyn
        b"import torch\n\ndef f(x):\n    return True.__index__() + torch.relu(x).sum().item()\n",
    ],
)
def test_the_lint_resolves_callees_where_the_rewrite_does(source):
    findings = Linter(default_catalogue(), frozenset({"MSP901"})).check(source, "case.py")
    assert len(findings) == rewrite_source(source, path="case.py").count(b"__msprobe__.dyn(")
