"""Every runtime entry point, inside a function Dynamo traces, is the plain operation: a rewritten function
that uses every form of the contract compiles as one graph with no break, collecting or not, and switching
collection on and off recompiles nothing (Dynamo guards on no state of ours). Compiled with the ``eager`` backend, in
this process: the
graphs are Dynamo's, the arithmetic is the original's, bit for bit."""

import glob
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("libcst")

import torch._dynamo  # noqa: E402, F811  (binds torch again, as importorskip did)
from torch._dynamo.utils import counters  # noqa: E402

import msprobe_runtime  # noqa: E402
from msprobe_runtime import PrecisionDebugger, compiled_regions, operators, shims  # noqa: E402

from .conftest import as_module  # noqa: E402

SOURCE = '''
import torch
import torch.nn.functional as F


class Holder:
    def __init__(self, value):
        self.value = value


def every_form(x, y, n, m):
    a = x + y
    a = a - y * 0.5
    a = a / 2 + a // 3 + a % 5 + a ** 2 + (a @ y.t()) @ x
    a = -a + (+a)
    c = F.gelu(a)
    c = c.clamp(-5.0, 5.0)
    if c.shape[0] > 2:  # a tensor's truth test is a graph break in the original too: a shape's is not
        c = c * 2
    t = (c < 1) & (c <= 2) | (c > -1) ^ (c >= -2) & (c == c) & (c != 0)
    b = (n << 1) + (n >> 1) + (n & m) + (n | m) + (n ^ m) + ~n
    b += 1
    b -= 1
    b *= 2
    b //= 3
    b %= 7
    b **= 1
    b <<= 1
    b >>= 1
    b &= m
    b |= m
    b ^= m
    f = c.clone()
    f /= 2
    f @= torch.eye(f.shape[-1])
    holder = Holder(f)
    holder.value += 1
    f[0] = f[1]
    f[1] -= 1
    return f, t, b


def call_compiled(fn, *args):
    """Instrumented code calling a compiled function: the boundary of a compiled call."""
    return fn(*args)
'''


@pytest.fixture(scope="module")
def program():
    from msprobe_rewrite.api import rewrite_source

    rewritten = rewrite_source(SOURCE.encode()).decode()
    namespace = as_module(rewritten, "every_form_program")
    plain = as_module(SOURCE, "every_form_plain")
    return rewritten, namespace, plain


def _inputs():
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(4, 4, generator=generator)
    y = torch.randn(4, 4, generator=generator)
    n = torch.randint(0, 50, (4, 4), generator=generator)
    m = torch.randint(1, 50, (4, 4), generator=generator)
    return x, y, n, m


def _equal(a, b):
    return all(torch.equal(p, q) for p, q in zip(a, b))


def test_the_program_uses_every_entry_point(program):
    rewritten, _, _ = program
    used = {row.entry for row in operators.TABLE if row.kind != operators.STORE}
    missing = [
        entry for entry in used if f"__msprobe__.{entry}(" not in rewritten and f'"{entry}"' not in rewritten
    ]  # augmented forms name their entry: aug(..., "iadd", v)
    assert missing == []
    for form in (
        "__msprobe__.call(",
        "__msprobe__.dyn(",
        "__msprobe__.truth(",
        "__msprobe__.attr(",
        "__msprobe__.item(",
        "__msprobe__.aug(",
    ):
        assert form in rewritten
    assert "__msprobe__.item(f)[0] = " in rewritten  # the subscript store


def test_every_entry_has_a_polyfill():
    """Each callable instrumented code reaches on the package is registered with Dynamo, or reads no state."""
    polyfilled = {entry for entry, _ in compiled_regions.polyfills()}
    stateless = {shims.attr, shims.item}  # they only load: Dynamo traces them as they are
    for name in ["call", "dyn", "truth", "aug", "attr", "item"] + list(shims.OPERATOR_ENTRIES):
        entry = getattr(msprobe_runtime, name)
        assert entry in polyfilled or entry in stateless, name
    assert shims.store in polyfilled  # item(obj)[k] = v stores through it


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_compiled_whole_and_never_recompiled_by_collection(program, tmp_path, level):
    _, namespace, plain = program
    compiled_regions.register_if_loaded()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(namespace["every_form"], backend="eager")
    expected = plain["every_form"](*_inputs())
    assert _equal(compiled(*_inputs()), expected)  # collection off
    frames = dict(counters["frames"])
    assert frames == {"total": 1, "ok": 1} and sum(counters["graph_break"].values()) == 0  # one whole graph
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level=level)
    model = torch.nn.Linear(2, 2)
    for _ in range(2):
        inputs = _inputs()
        debugger.start(model)  # from this test: the session's observing mode is pushed (and set aside below)
        out = namespace["call_compiled"](compiled, *inputs)
        debugger.stop()
        assert _equal(out, expected)
        debugger.step()
        assert _equal(compiled(*_inputs()), expected)  # off again
    debugger.wait()
    assert dict(counters["frames"]) == frames  # no recompilation: no guard on the collector
    assert counters["stats"]["unique_graphs"] == 1
    assert sum(counters["graph_break"].values()) == 0
    for step in range(2):
        [path] = glob.glob(str(tmp_path / "dump" / f"step{step}" / "*" / "dump.json"))
        with open(path) as handle:
            data = json.load(handle)["data"]
        # one entry at the boundary, with its inputs and outputs; nothing of what ran inside
        assert list(data) == ["Compiled.every_form.0.forward"], list(data)
        entry = data["Compiled.every_form.0.forward"]
        assert len(entry["input_args"]) == 4 and len(entry["output"]) == 3


def test_the_collector_is_the_plain_call_inside_a_compiled_region(program, tmp_path):
    """A function traced before the polyfills were registered reaches the collector while it collects: each of its
    entries is then the plain call too (tests/compile/test_unregistered.py covers the whole path in a new
    process, where nothing is registered yet)."""
    _, namespace, plain = program
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1")
    collector_entries = []

    def traced(x, y, n, m):
        collector = shims._collector
        collector_entries.append(collector is not None)
        a = collector.operator("add", torch.add, x, y)
        b = collector.dyn(a.clamp, (-1.0, 1.0), {})
        c = collector.call("Torch.tanh", torch.tanh, (b,), {})
        if collector.truth(x.shape[0] > 100):
            c = c + 1
        return c

    debugger.start(torch.nn.Linear(2, 2))
    registered = list(compiled_regions.POLYFILLED)
    compiled_regions.POLYFILLED.clear()  # as before registration: the collector asks whether Dynamo traces it
    try:
        torch._dynamo.reset()
        counters.clear()
        out = torch.compile(traced, backend="eager", fullgraph=True)(*_inputs())
    finally:
        compiled_regions.POLYFILLED.extend(registered)
        debugger.stop()
    x, y, _, _ = _inputs()
    assert torch.equal(out, torch.tanh((x + y).clamp(-1.0, 1.0)))
    assert sum(counters["graph_break"].values()) == 0 and collector_entries == [True]
