"""Backward hooks run by the native op (``Recorder.hook_api``, ``hook_module``) against the Python hooks they
replace (``backward.py``): the same dump, entry for entry and in the same order; and what a step leaves on the
tensors and nodes that outlive it, on either path: nothing."""

import gc
import glob
import json
import os
import sys
import types
import weakref

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import msprobe_runtime  # noqa: E402
from msprobe_runtime import PrecisionDebugger  # noqa: E402
from msprobe_runtime import backward as bw  # noqa: E402
from msprobe_runtime import collector as collector_module  # noqa: E402
from fixtures.step_files import step_files  # noqa: E402


MODEL = """
import torch


class Identity(torch.nn.Module):  # no node inside: tensor hooks on its input (a leaf here) and output
    def forward(self, t):
        return t


class Scale(torch.nn.Module):  # float64 gradients: the Python records serve its module entry
    def forward(self, t):
        return t * 2.0


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc, self.scale = torch.nn.LayerNorm(8), torch.nn.Linear(8, 8), Scale()

    def forward(self, x):
        h = __msprobe__.call("Torch.tanh", torch.tanh, self.fc(x))
        a, b = __msprobe__.call("Torch.split", torch.split, h, 4, -1)     # two outputs of one node
        both = __msprobe__.call("Torch.pair", lambda t: (t * 2, t + 1), a)  # outputs of two nodes
        wide = __msprobe__.call("Torch.sin", torch.sin, self.scale(b.double()))  # float64: Python's records
        unused = __msprobe__.call("Torch.cos", torch.cos, a)              # never reaches the loss: no gradient
        joined = __msprobe__.call("Torch.cat", torch.cat, [both[0] * both[1], wide.float()], -1)
        joined = __msprobe__.call("Torch.concatenate", torch.concatenate, [x[:0], joined])  # an empty gradient
        return self.norm(joined + x)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = Block(), torch.nn.Sequential(Block(), torch.nn.ReLU())
        self.identity, self.bias = Identity(), torch.nn.Parameter(torch.zeros(8))

    def forward(self, x):
        return self.second(self.first(x)) + self.identity(self.bias)
"""


def _model():
    namespace = {"__msprobe__": msprobe_runtime, "__name__": "native_backward_model"}
    exec(compile(MODEL, "native_backward_model.py", "exec"), namespace)
    torch.manual_seed(0)
    return namespace["Net"]()


def _dump(tmp_path, name, level):
    """Two steps: two microbatches each (forward, backward, forward, backward); step 1 also runs the backward of
    a graph kept from step 0, whose hooks must stay silent."""
    model = _model()
    x = torch.randn(3, 8, requires_grad=True)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / name), task="statistics", level=level)
    kept = None
    for step in range(2):
        debugger.start(model)
        for micro in range(2):
            loss = model(x * (1.5 + micro)).sum()
            loss.backward(retain_graph=kept is None)
            if kept is None:
                kept = loss
        if step == 1:
            kept.backward()
        debugger.stop()
        debugger.step()
    debugger.wait()
    return step_files(tmp_path / name, 2)


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_native_hooks_give_the_python_hooks_dump(native, tmp_path, monkeypatch, level):
    calls = {"python hooks": 0, "python records": 0, "module consumers": 0, "module tensors": 0}
    recorded_in_python = []  # the API entries observe_api recorded
    real = {
        name: getattr(bw, name) for name in ("hook_api_backward", "observe_api", "_observe_consumers", "observe_tensor")
    }

    def counted(name, key):
        def call(*args):
            calls[key] += 1
            if name == "observe_api":
                recorded_in_python.append(args[1])
            return real[name](*args)

        monkeypatch.setattr(bw, name, call)

    counted("hook_api_backward", "python hooks")
    counted("observe_api", "python records")
    counted("_observe_consumers", "module consumers")
    counted("observe_tensor", "module tensors")
    runs = {}
    for name in ("native", "python"):  # from one line: the stacks' outermost frames are the same
        if name == "python":
            counted = dict(calls)
            natively = list(recorded_in_python)
            monkeypatch.setattr(collector_module, "_compiled_autograd", lambda: True)  # the Python hooks, as then
        runs[name] = _dump(tmp_path, name, level)
    native_run, python_run = runs["native"], runs["python"]
    # the native run attached no Python hook but on leaves, and recorded in Python only float64 gradients
    # (Torch.sin's, Scale's) and the leaf's tensor hooks (Identity's, at mix)
    python = {key: calls[key] - counted[key] for key in calls}
    assert counted["python hooks"] == 0 and python["python hooks"] > 0
    assert 0 < counted["python records"] < python["python records"]
    assert not [name for name in natively if name.startswith("Torch.concatenate")]  # an empty gradient: native too
    assert counted["module consumers"] == 0
    if level == "L1":
        assert python["module consumers"] == python["module tensors"] == counted["module tensors"] == 0
    else:
        assert python["module consumers"] > 0 and 0 < counted["module tensors"] < python["module tensors"]
    assert native_run == python_run
    data = native_run[0, "dump.json"]["data"]
    assert list(data) == list(python_run[0, "dump.json"]["data"])
    assert len([name for name in data if name.startswith("Torch.split") and name.endswith("backward")]) == 4
    split = data["Torch.split.0.backward"]
    assert len(split["input"]) == 2 and all(record is not None for record in split["input"])
    pair = data["Torch.pair.0.backward"]
    assert len(pair["input"]) == 2 and len(pair["output"]) == 4  # each node: the gradient of t and of its scalar
    assert data["Torch.sin.0.backward"]["input"][0]["dtype"] == "torch.float64"
    assert not any(name.startswith("Torch.cos") and name.endswith("backward") for name in data)
    # step 1 has its own API entries only: the kept graph's hooks (step 0's) stayed silent
    apis = [
        [name for name in run if not name.startswith("Module.")] for run in (data, native_run[1, "dump.json"]["data"])
    ]
    assert apis[0] == apis[1]


def test_compiled_autograd_keeps_the_python_hooks(native, monkeypatch, tmp_path):
    """torch's compiled autograd asks each hook for ``compiled_args``, which only its Python hooks have."""
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="L1")
    debugger.start()
    assert debugger._collector.native_backward
    debugger.stop()
    fake = types.ModuleType("torch._dynamo.compiled_autograd")
    fake.compiled_autograd_enabled = True
    monkeypatch.setitem(sys.modules, "torch._dynamo.compiled_autograd", fake)
    debugger.start()
    assert not debugger._collector.native_backward
    debugger.stop()
    debugger.wait()


def test_a_graph_outliving_its_collector_does_not_keep_it(native, tmp_path):
    """The hooks hold the Recorder, and the Recorder its collector by a weak reference only (a Python hook holds
    the collector itself, as long as the graph lives)."""
    x = torch.randn(4, requires_grad=True)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="L1")
    debugger.start()
    y = msprobe_runtime.call("Torch.sin", torch.sin, x)
    first = weakref.ref(debugger._collector)
    debugger.stop()
    debugger.step()
    debugger.start(nn.Linear(2, 2))  # another model: another collector
    gc.collect()
    assert first() is None
    y.sum().backward()  # the old hook runs: its step is over, nothing is recorded, nothing raised
    debugger.stop()
    debugger.wait()
    assert torch.equal(x.grad, torch.cos(x.detach()))


@pytest.mark.parametrize("hooks", ["native", "python"])
def test_no_hook_outlives_its_step(native, tmp_path, monkeypatch, hooks):
    """A tensor that outlives the step keeps none of the step's hooks: here a parameter that a module takes and
    returns (Identity's), as megatron's linear layers return their bias. Its hooks still fire in their step."""
    if hooks == "python":
        monkeypatch.setattr(collector_module, "_compiled_autograd", lambda: True)
    model = _model()
    x = torch.randn(3, 8)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="mix")
    for _ in range(3):
        debugger.start(model)
        model(x).sum().backward()
        debugger.stop()
        debugger.step()
        assert not model.bias._backward_hooks
    debugger.wait()
    for step in range(3):
        [directory] = glob.glob(os.path.join(str(tmp_path / "d"), f"step{step}", "*"))
        with open(os.path.join(directory, "dump.json")) as handle:
            entry = json.load(handle)["data"]["Module.identity.Identity.backward.0"]
        assert entry["input"][0] is not None and entry["output"][0] is not None


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_step_leaves_nothing_for_the_next(native, tmp_path, level):
    """Collection over many steps holds no more objects after a step than after the one before: nothing of a
    step outlives it (hooks, their bound state, records). Counted after 20 steps, when the caches that the first
    steps fill (torch's and ours, as the stacks' table) are full, and 12 steps later: fewer than one object a
    step may appear, so a leak of one per step fails."""
    model = _model()
    x = torch.randn(3, 8)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level=level)
    counts = []
    for step in range(32):
        debugger.start(model)
        model(x).sum().backward()
        debugger.stop()
        debugger.step()
        if step in (19, 31):
            debugger.wait()
            model.zero_grad(set_to_none=True)
            gc.collect()
            counts.append(len(gc.get_objects()))
    debugger.wait()
    assert counts[1] - counts[0] < 12


@pytest.mark.parametrize("hooks", ["native", "python"])
def test_a_node_kept_from_step_to_step_keeps_one_step_of_hooks(native, tmp_path, monkeypatch, hooks):
    """A tensor computed with grad once and used every step (a cache): its grad_fn outlives the steps. Each step
    puts the module's tensor hook and the API's post-hook on it; those of the step before are dropped, silent
    as they are, rather than left to pile up one a step."""
    if hooks == "python":
        monkeypatch.setattr(collector_module, "_compiled_autograd", lambda: True)
    weight = torch.nn.Parameter(torch.randn(8))
    cached = weight.view(2, 4)  # its ViewBackward keeps no tensor: the node serves every step's backward

    class Cache(nn.Module):
        def forward(self):
            return cached

    model = nn.Sequential()
    model.cache = Cache()
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="mix")
    counts = []
    for _ in range(4):
        debugger.start(model)
        same = msprobe_runtime.call("Tensor.contiguous", torch.Tensor.contiguous, model.cache())  # returns it
        (same * 3.0).sum().backward()
        if hooks == "native":
            counts.append(debugger._collector.recorder.hooks_on(cached))
        else:
            gc.collect()
            counts.append(sum(type(o) is bw._Observer for o in gc.get_objects()))
        debugger.stop()
        debugger.step()
    debugger.wait()
    assert counts == [2, 2, 2, 2]  # one step's: the module's tensor hook and the API's post-hook
    [directory] = glob.glob(os.path.join(str(tmp_path / "d"), "step3", "*"))
    with open(os.path.join(directory, "dump.json")) as handle:
        data = json.load(handle)["data"]
    assert data["Module.cache.Cache.backward.0"]["input"][0] is not None
    assert data["Tensor.contiguous.0.backward"]["input"][0] is not None
