"""A module's consumer nodes (backward.consumer_edges): the native op's walk of autograd's graph finds what the
Python walk finds, node for node and edge for edge, in the same order, and gives up at the same limit."""

import random
import weakref

import pytest

torch = pytest.importorskip("torch")

from msprobe_runtime import backward as bw  # noqa: E402
from msprobe_runtime import native_stats  # noqa: E402


@pytest.fixture(scope="module")
def native_walk():
    module = native_stats.load()
    walk = getattr(module, "consumer_edges", None)
    if walk is None:
        pytest.skip("the native op cannot be built here")
    return walk


def _both(native_walk, inputs, outputs, limit=None):
    targets, _ = bw.gradient_targets(inputs)
    if limit is None:
        python = bw._consumer_edges(inputs, outputs, targets)
        native = native_walk(inputs, outputs, list(targets.values()), 20000)
    else:
        python = None  # the Python walk's limit is the module's constant: compared through the native one
        native = native_walk(inputs, outputs, list(targets.values()), limit)
    return python, native


def _same(python, native):
    assert python is not None and native is not None
    assert [(id(node), edges) for node, edges in python] == [(id(node), edges) for node, edges in native]
    return native


class Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def _cases():
    w = torch.randn(3, requires_grad=True)
    a = torch.randn(3, requires_grad=True)
    x = a * 3  # a non-leaf input
    yield "leaf input", [w], [(w * 2).sin()]
    yield "non-leaf input", [x], [x.sin() * x.cos()]
    yield "an input taken twice", [x, x], [x + x.exp()]
    yield "a leaf and a non-leaf", [w, x, None], [(w * x).sum() * w]
    parts = x.split(1)
    yield "outputs of one node as inputs", list(parts), [parts[0] * parts[2] + parts[1]]
    yield "an input passed through", [x], [x]
    yield "a custom Function inside", [x], [Twice.apply(x).tanh()]
    made = Twice.apply(w)
    yield "an input a custom Function made", [made, w], [made.tanh() * w]
    yield "an input that needs no gradient", [torch.randn(3), x], [x.relu()]
    h = x.sin()
    yield "the walk stops at the inputs", [h], [h.exp() * x]


@pytest.mark.parametrize("case", [c[0] for c in _cases()])
def test_native_walk_finds_what_the_python_walk_finds(native_walk, case):
    [(_, inputs, outputs)] = [c for c in _cases() if c[0] == case]
    found = _same(*_both(native_walk, inputs, outputs))
    if case == "an input passed through":
        assert found == []  # no node inside the module: the input falls back to a tensor hook
    elif case != "an input that needs no gradient":
        assert found, case
    if case == "a custom Function inside":
        assert any(type(node).__name__ == "TwiceBackward" for node, _ in found)


def test_native_walk_on_random_graphs(native_walk):
    rng = random.Random(0)
    for trial in range(60):
        leaf = torch.randn(4, requires_grad=True)
        values = [leaf, leaf * 2]
        for _ in range(40):
            a, b = rng.choice(values), rng.choice(values)
            op = rng.choice(["add", "mul", "sin", "split", "view", "sum"])
            if op == "add":
                values.append(a + b)
            elif op == "mul":
                values.append(a * b)
            elif op == "sin":
                values.append(a.sin())
            elif op == "split":
                values.extend(part.repeat(2) for part in a.split(2))  # one node, two outputs
            elif op == "view":
                values.append(a.view(-1))
            else:
                values.append(a.sum() * b)
        inputs = rng.sample(values[:20], 3) + [leaf]
        outputs = values[-3:]
        _same(*_both(native_walk, inputs, outputs))


def test_native_walk_gives_up_past_its_limit(native_walk):
    x = torch.randn(2, requires_grad=True)
    y = x
    for _ in range(30):
        y = y.sin()
    _, native = _both(native_walk, [x], [y], limit=10)
    assert native is None
    _, native = _both(native_walk, [x], [y], limit=30)
    assert native and native[0][1] == [(0, 0)]


def test_a_tensor_subclass_takes_the_python_walk(native_walk):
    class Mine(torch.Tensor):
        pass

    x = torch.randn(3, requires_grad=True) * 2
    y = x.sin().as_subclass(Mine)
    calls = []

    def walk(*args):
        calls.append(args)
        return native_walk(*args)

    targets, _ = bw.gradient_targets([x])
    assert bw.consumer_edges(walk, [x], [y], targets) and calls == []
    assert bw.consumer_edges(walk, [x], [x.sin()], targets) and len(calls) == 1


MODEL = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x, scale=None):
        h = __msprobe__.call("Torch.tanh", torch.tanh, self.fc(x))
        return self.norm(h + x) * (scale if scale is not None else 1.0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = Block()
        self.second = nn.Sequential(Block(), nn.ReLU())

    def forward(self, x):
        y = self.first(x, scale=2.0)
        return self.second(y) + y
"""


def _mix_dump(tmp_path, name):
    import glob
    import json
    import os

    import msprobe_runtime
    from msprobe_runtime import PrecisionDebugger

    namespace = {"__msprobe__": msprobe_runtime, "__name__": "walked_model"}
    exec(compile(MODEL, "walked_model.py", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Net"]()
    x = torch.randn(3, 4, requires_grad=True)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / name), task="statistics", level="mix")
    debugger.start(model)
    model(x * 1.5).sum().backward()
    debugger.stop()
    debugger.wait()
    [directory] = glob.glob(os.path.join(str(tmp_path / name), "step0", "*"))
    out = {}
    for file in ("dump.json", "stack.json", "construct.json"):
        with open(os.path.join(directory, file)) as handle:
            out[file] = json.load(handle)
    return out


def test_a_mix_dump_is_the_same_with_the_native_op_off(tmp_path, monkeypatch, native_walk):
    """The module backward entries (found by the walk) and every stack (captured by the op) are those of the
    Python paths: the whole mix dump with the op off is the same, but for the last float32 bit of Mean and
    Norm, which the torch ops sum in another order."""
    dumps = {}
    try:
        for name in ("on", "off"):  # from one line: the stacks' outermost frames are the same
            if name == "off":
                monkeypatch.setenv("MSPROBE_NATIVE_STATS", "0")
                native_stats.reset()
            dumps[name] = _mix_dump(tmp_path, name)
    finally:
        monkeypatch.delenv("MSPROBE_NATIVE_STATS", raising=False)
        native_stats.reset()
    on, off = dumps["on"], dumps["off"]
    assert on["stack.json"] == off["stack.json"] and on["construct.json"] == off["construct.json"]
    on_data, off_data = on["dump.json"]["data"], off["dump.json"]["data"]
    assert list(on_data) == list(off_data)
    assert any(".backward." in name and name.startswith("Module.first") for name in on_data)

    def numbers(value, path):
        if isinstance(value, dict):
            for key in value:
                yield from numbers(value[key], path + (key,))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                yield from numbers(item, path + (index,))
        else:
            yield path, value

    pairs = list(zip(numbers(on_data, ()), numbers(off_data, ())))
    assert pairs and all(a[0] == b[0] for a, b in pairs)
    for (path, a), (_, b) in pairs:
        if path[-1] in ("Mean", "Norm") and isinstance(a, float) and isinstance(b, float):
            assert a == pytest.approx(b, rel=1e-6, abs=1e-7), path
        else:
            assert a == b, path


class _Node:
    """An autograd node of a fake graph: its sequence number and its next edges ``[(node, output number)]``."""

    def __init__(self, name, sequence_nr, next_edges=()):
        self.name, self.sequence_nr, self.next_edges = name, sequence_nr, list(next_edges)


class _PythonNode:
    """A node as torch before 2.13 shows it to Python (torch 2.11 on the device machine): one object while
    something holds it, a new one, often at a freed object's address, once nothing does."""

    __slots__ = ("node", "__weakref__")
    live = weakref.WeakValueDictionary()

    def __init__(self, node):
        self.node = node

    @classmethod
    def of(cls, node):
        held = cls.live.get(id(node))
        if held is None:
            held = cls.live[id(node)] = cls(node)
        return held

    def _sequence_nr(self):
        return self.node.sequence_nr

    @property
    def next_functions(self):
        return tuple((_PythonNode.of(child), output_nr) for child, output_nr in self.node.next_edges)


class _Value:
    """A tensor that requires grad, as the walk reads it: ``grad_fn`` (a fresh read each time) and ``output_nr``."""

    requires_grad = True

    def __init__(self, node, output_nr=0):
        self._node, self.output_nr = node, output_nr

    @property
    def grad_fn(self):
        return _PythonNode.of(self._node)


def test_the_python_walk_holds_every_node_whose_id_it_keeps():
    """The module's input ``x`` feeds three nodes along a chain of 200; each node's Python object is let go
    as soon as nothing holds it. The walk must find exactly the three consumers of ``x``, whatever ids the
    objects it let go gave away (a walk that kept bare ids found other nodes, differently from run to run)."""
    source = _Node("source", 0)
    x = _Node("x", 1, [(source, 0)])
    chain, consumers, sequence = [], [], 2
    previous = None
    for k in range(200):
        edges = [(previous, 0)] if previous is not None else []
        if k in (0, 70, 150):  # these take x as their second (or only) edge
            edges.append((x, 0))
            consumers.append(f"n{k}")
        previous = _Node(f"n{k}", sequence, edges)
        chain.append(previous)
        sequence += 1
    inputs, outputs = [_Value(x)], [_Value(chain[-1])]
    for _ in range(5):
        targets, positions = bw.gradient_targets(inputs)
        assert positions == [0]
        found = bw._consumer_edges(inputs, outputs, targets)
        assert sorted(node.node.name for node, _ in found) == sorted(consumers)
        assert all(edges == [(len(node.node.next_edges) - 1, 0)] for node, edges in found)
