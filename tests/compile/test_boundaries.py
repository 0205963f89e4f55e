"""Compiled callables told apart and named (runtime/compiled_calls.py), and what collection leaves behind for
torch.compile: no global hook mark after stop(), no graph break where the runtime does not see a compiled call's
boundary. In this process, with the ``eager`` backend."""

import pytest

torch = pytest.importorskip("torch")

import torch._dynamo  # noqa: E402, F811  (binds torch again, as importorskip did)
from torch._dynamo.utils import counters  # noqa: E402
from torch.nn.modules import module as nn_module  # noqa: E402

from msprobe_runtime import PrecisionDebugger, compiled_calls  # noqa: E402


def plain_function(x):
    return x + 1


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class WithCompiledMethod(torch.nn.Module):
    @torch.compile(backend="eager")
    def forward(self, x):
        return x * 2


def test_compiled_functions_and_methods_are_told_apart():
    known = compiled_calls.CompiledCallables()
    compiled = torch.compile(plain_function, backend="eager")
    assert known.function(compiled) is plain_function  # the original, for its name
    method = WithCompiledMethod().forward
    assert known.function(method) is WithCompiledMethod.forward.__wrapped__
    assert known.function(plain_function) is None
    assert known.function(torch.compiler.disable(plain_function)) is None  # disabled is not compiled
    assert known.function(torch.tanh) is None and known.function(Block()) is None
    optimized = torch.compile(Block(), backend="eager")
    assert known.is_optimized_module(type(optimized)) and not known.is_optimized_module(Block)
    assert type(compiled_calls.original_module(optimized)) is Block
    assert compiled_calls.unwrapped(optimized) is compiled_calls.original_module(optimized)
    block = Block()
    assert not compiled_calls.compiled_in_place(block)
    block.compile(backend="eager")
    assert compiled_calls.compiled_in_place(block)


def test_boundary_names():
    def local_helper(x):
        return x

    assert compiled_calls.function_name(plain_function, {}) == "Compiled.plain_function"
    assert compiled_calls.function_name(local_helper, {}) == (
        "Compiled.test_boundary_names_local_helper"
    )  # one part: msprobe's grammar has no dots in an API's name
    assert compiled_calls.function_name(plain_function, {id(plain_function): "Megatron.fused"}) == "Megatron.fused"
    assert compiled_calls.module_name(Block()) == "Compiled.Block"


def test_named_as_eager_leaves_out_the_compiled_wrapper():
    model = torch.nn.Sequential(Block(), torch.compile(Block(), backend="eager"))
    paths = [path for path, _ in compiled_calls.named_as_eager(model)]
    assert paths == ["", "0", "0.fc", "1", "1", "1.fc"]  # the wrapper and its original share the eager name
    eager = torch.nn.Sequential(Block(), Block())
    assert sorted(set(paths)) == sorted(path for path, _ in eager.named_modules())


def test_no_global_hook_is_left_after_stop(tmp_path):
    """torch's handle of a global forward hook registered with kwargs leaves its with_kwargs mark behind;
    torch.compile(module) would warn of global hooks at every call from then on."""
    assert not nn_module._has_any_global_hook()
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    model = Block()
    debugger.start(model)
    assert nn_module._has_any_global_hook()
    model(torch.ones(2, 4))
    debugger.stop()
    debugger.wait()
    assert not nn_module._has_any_global_hook()


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_an_unseen_boundary_is_no_graph_break(tmp_path, level):
    """A module compiled in place that only torch's nn.Sequential calls: the runtime never sees the call's
    boundary, and Dynamo traces the global module hooks and the observing mode; each is a no-op there. Dynamo
    guards on them, so the module compiles once more when collection is on (docs/compile.md)."""
    torch.manual_seed(0)
    inner = Block()
    inner.compile(backend="eager")
    model = torch.nn.Sequential(Block(), inner)
    x = torch.randn(3, 4)
    torch._dynamo.reset()
    counters.clear()
    expected = model(x)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level=level)
    outs = []
    for _ in range(2):
        debugger.start(model)
        outs.append(model(x))
        debugger.stop()
        debugger.step()
        outs.append(model(x))
    debugger.wait()
    assert all(torch.equal(out, expected) for out in outs)
    assert sum(counters["graph_break"].values()) == 0
    assert counters["frames"]["total"] <= 2, dict(counters["frames"])


CALLER = """
import torch


def call(fn, *args):
    return fn(*args)
"""


class Failing(torch.nn.Module):
    def forward(self, x):
        raise ValueError("inside the compiled module")


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bad = Failing()
        self.bad.compile(backend="eager")
        self.good = Block()


def test_a_compiled_call_that_raises_leaves_collection_as_it_was(tmp_path):
    """The error reaches the caller; the module entry that began is dropped, and the next module call is named
    and placed (its parent in construct.json) as if the failing call had not been."""
    import glob
    import json
    import os

    from msprobe_rewrite.api import rewrite_source

    import msprobe_runtime

    namespace = {"__msprobe__": msprobe_runtime, "__name__": "failing_caller"}
    exec(compile(rewrite_source(CALLER.encode()).decode(), "failing_caller.py", "exec"), namespace)
    model = Holder()
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    debugger.start(model)
    with pytest.raises(ValueError, match="inside the compiled module"):
        namespace["call"](model.bad, torch.ones(2, 4))
    namespace["call"](model.good, torch.ones(2, 4))
    debugger.stop()
    debugger.wait()
    [directory] = glob.glob(os.path.join(str(tmp_path / "dump"), "step0", "*"))
    with open(os.path.join(directory, "dump.json")) as handle:
        data = json.load(handle)["data"]
    with open(os.path.join(directory, "construct.json")) as handle:
        construct = json.load(handle)
    assert "Module.bad.Failing.forward.0" not in data
    assert "Module.good.Block.forward.0" in data and construct["Module.good.Block.forward.0"] is None
