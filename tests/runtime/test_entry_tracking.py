"""A step's finished entries whose records hold nothing tracked are untracked by the garbage collector (the native
op's ``seal``): forward entries when they are finished, backward entries as the op's hooks leave them, the op's
records and the Python path's (a ``TensorRecord`` and its slots: ``seal_types``), and the hooks' arrivals as they wait
for the collector. Kept tracked to the flush, each recorded call left containers (its entry and two lists, a Python
path's records and slots) that outlived the young collections into the oldest generation, where they brought on full
collections of the whole heap (bench/per_entry.py --steady); an entry that holds anything else tracked stays tracked,
so nothing the collector must see is hidden from it."""

import gc
import types

import pytest

torch = pytest.importorskip("torch")

import msprobe_runtime as rt  # noqa: E402
from msprobe_runtime import PrecisionDebugger, native_stats, shims  # noqa: E402
from msprobe_runtime.open_calls import ApiBackwardHook  # noqa: E402

SOURCE = """
def calls(x, n):
    for _ in range(n):
        __msprobe__.call("Torch.tanh", torch.tanh, x)
        __msprobe__.call("Torch.split", torch.split, x, 2)  # a tuple of outputs: a record each


def trained(x, n):
    for _ in range(n):
        y = __msprobe__.call("Torch.tanh", torch.tanh, x)
        __msprobe__.call("Tensor.sum", torch.Tensor.sum, y).backward()


def chain(x, n):
    for _ in range(n):
        x = __msprobe__.call("Torch.tanh", torch.tanh, x)
    return x.sum()  # not recorded: the backward's arrivals wait for the flush


def joined(x):
    return __msprobe__.call("Torch.cat", torch.cat, [x, x])  # its first input a list: a list of records


def start(debugger):
    debugger.start()
"""


@pytest.fixture
def native():
    module = native_stats.load()
    if module is None or not hasattr(module, "seal"):
        pytest.skip("the native op does not build here")
    return module


@pytest.fixture
def instrumented():
    code = {"__msprobe__": rt, "torch": torch}
    exec(compile(SOURCE, "<instrumented>", "exec"), code)
    return code


def _collecting(tmp_path, code):
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="statistics", level="L1")
    code["start"](debugger)
    return debugger


def _grown(body, x, warm, n):
    """The objects the garbage collector tracks, grown over ``body(x, n)`` after ``body(x, warm)`` (its shapes,
    names and caches made), with no collection between."""
    body(x, warm)
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        body(x, n)
        return len(gc.get_objects()) - before
    finally:
        gc.enable()


def test_a_recorded_call_leaves_no_container_for_the_garbage_collector(native, instrumented, tmp_path):
    debugger = _collecting(tmp_path, instrumented)
    try:
        grown = _grown(instrumented["calls"], torch.randn(8), 5, 300)
        data = shims._collector.step.data
        entry = data["Torch.split.304.forward"]
    finally:
        debugger.stop()
    assert len(entry["output"]) == 4 and len(data) == 610
    assert not gc.is_tracked(entry) and not gc.is_tracked(entry["input_args"]) and not gc.is_tracked(entry["output"])
    # 600 entries: three containers each, 1 800 objects, before the op sealed them
    assert grown < 60, grown


def test_a_backward_entry_is_sealed_as_the_ops_hook_leaves_it(native, instrumented, tmp_path):
    debugger = _collecting(tmp_path, instrumented)
    try:
        grown = _grown(instrumented["trained"], torch.randn(8, requires_grad=True), 3, 100)
        data = shims._collector.step.data
        backward = data["Torch.tanh.101.backward"]  # the last call's arrives at the next call
    finally:
        debugger.stop()
    assert len(backward["input"]) == 1 and len(backward["output"]) == 1 and backward["output"][0] is not None
    assert not any(gc.is_tracked(part) for part in (backward, backward["input"], backward["output"]))
    # 400 entries, 200 of them backward, and 200 hooks' rows (``ApiBackwardHook``): 1 400 containers before the op
    # sealed them (800 with forward entries sealed only)
    assert grown < 100, grown


def test_a_backward_passs_arrivals_wait_for_the_flush_untracked(native, instrumented, tmp_path):
    # a whole backward pass with no recorded call after it: its hooks' arrivals wait in the collector's list until the
    # flush takes them (a training step's whole backward, then the optimizer's unrecorded step)
    debugger = _collecting(tmp_path, instrumented)
    x = torch.randn(8, requires_grad=True)
    try:
        instrumented["chain"](x, 3).backward()  # shapes, names and the op's hooks made
        loss = instrumented["chain"](x, 200)
        gc.collect()
        gc.disable()
        try:
            before = len(gc.get_objects())
            loss.backward()
            grown = len(gc.get_objects()) - before
        finally:
            gc.enable()
        arrivals = list(shims._collector._arrivals)
        data = shims._collector.step.data
    finally:
        debugger.stop()
    assert len(arrivals) == 200
    parts = [part for _, received, sent in arrivals for part in (received, sent, *received)]
    assert not any(gc.is_tracked(part) for part in (*arrivals, *parts))
    backward = data["Torch.tanh.202.backward"]  # taken by the flush, whole
    assert backward["input"][0] is not None and backward["output"][0] is not None
    # 200 arrivals: four containers each (the arrival, its two lists, a gradient's place) before they were untracked
    assert grown < 60, grown


def test_the_python_hooks_write_into_a_fresh_list_where_the_op_sealed_one(native):
    from msprobe_runtime import backward

    entry = {"input": [None], "output": [None]}
    assert native.seal(entry)
    sealed = entry["output"]
    written = backward.writable(entry, "output")
    written.append(types.SimpleNamespace())  # a Python-path record: tracked
    assert written is entry["output"] and written is not sealed and sealed == [None]
    assert gc.is_tracked(entry) and gc.is_tracked(entry["output"])  # the collector looks into both again


def test_a_device_tensors_entry_is_sealed_too(native, instrumented, tmp_path, monkeypatch):
    # the native Recorder's lane (a device tensor's record names its arena: plain data too), on CPU tensors taken as a
    # device's, the kernels under Triton's interpreter where no GPU is (tests/conftest.py)
    from fixtures.triton_kernels import statistics_kernels

    statistics_kernels("cpu")  # skips where this Triton's interpreter cannot run the kernels (3.6's with NumPy 2)
    from msprobe_runtime import collector as collector_module
    from msprobe_runtime.statistics import DEVICE_ROW, StatBuffer

    monkeypatch.setattr(collector_module, "StatBuffer", lambda counts: StatBuffer(counts, triton_cpu="lane"))
    debugger = _collecting(tmp_path, instrumented)
    try:
        instrumented["calls"](torch.randn(8), 2)
        entry = shims._collector.step.data["Torch.tanh.1.forward"]
    finally:
        debugger.stop()
    assert entry["output"][0][4][0] == DEVICE_ROW
    assert not gc.is_tracked(entry) and not gc.is_tracked(entry["input_args"]) and not gc.is_tracked(entry["output"])


def test_the_python_paths_records_are_sealed_with_their_entry(native, instrumented, tmp_path, monkeypatch):
    # the records an NPU's tensors get (the torch ops' statistics): a TensorRecord and its slots, filled at the flush
    from msprobe_runtime import collector as collector_module
    from msprobe_runtime.records import TensorRecord
    from msprobe_runtime.statistics import StatBuffer

    monkeypatch.setattr(collector_module, "StatBuffer", lambda counts: StatBuffer(counts, native=False))
    x = torch.randn(8)
    debugger = _collecting(tmp_path, instrumented)
    try:
        instrumented["calls"](x, 200)  # a longer step first: the staging rows of small tensors made, kept for the next
        debugger.stop()
        debugger.step()
        debugger.start()
        grown = _grown(instrumented["calls"], x, 5, 100)
        entry = shims._collector.step.data["Torch.tanh.104.forward"]
        record = entry["output"][0]
    finally:
        debugger.stop()
    assert type(record) is TensorRecord
    parts = (entry, entry["input_args"], entry["output"], record, record.slot, record.counts)
    assert not any(gc.is_tracked(part) for part in parts)
    debugger.wait()
    numbers = record.to_json()  # the slot the flush filled after it was sealed
    assert numbers["Max"] == torch.tanh(x).max().item() and numbers["Norm"] is not None
    # 200 entries, 700 records: 2 700 containers before they were sealed (an entry, two lists, each record and its
    # two slots)
    assert grown < 100, grown


def test_a_sealed_slot_is_in_no_cycle_its_steps_records_outlive(native, instrumented, tmp_path, monkeypatch):
    # a sealed slot refers to its Batch, which the collector then sees as referred to from outside: a Batch that
    # referred back to its slots (the rows' reading of a larger tensor's numbers) made a cycle never collected, and
    # every step's records and numbers stayed
    from msprobe_runtime import collector as collector_module
    from msprobe_runtime.statistics import Batch, StatBuffer

    monkeypatch.setattr(collector_module, "StatBuffer", lambda counts: StatBuffer(counts, native=False))
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="statistics", level="L1")
    x, counts = torch.randn(6000), []  # past the staging size: reduced into the rows
    for step in range(12):
        instrumented["start"](debugger)
        instrumented["calls"](x, 5)
        debugger.stop()
        debugger.step()
        if step in (5, 11):  # as test_native_backward.py's count: the first steps' caches filled
            debugger.wait()
            gc.collect()
            alive = gc.get_objects()  # other tests' objects too: what grows between the two counts is this one's
            counts.append((sum(type(item) is Batch for item in alive), len(alive)))
            del alive
    (batches, before), (batches_after, after) = counts
    assert batches_after == batches, counts  # a step's Batch left each step
    assert after - before < 6, counts  # one object a step fails


def test_a_gradient_the_op_hands_to_the_python_records_is_sealed_too(native, instrumented, tmp_path):
    # complex: the op's hooks run, and hand the gradients to the Python records (as an NPU's gradients are handed)
    from msprobe_runtime.records import TensorRecord

    debugger = _collecting(tmp_path, instrumented)
    try:
        x = torch.randn(8, dtype=torch.complex64, requires_grad=True)
        instrumented["chain"](x, 3).backward(torch.tensor(1 + 0j))
        native_hooks = shims._collector.native_backward
        backward = shims._collector.step.data["Torch.tanh.1.backward"]
    finally:
        debugger.stop()
    assert native_hooks and type(backward["output"][0]) is TensorRecord and type(backward["input"][0]) is TensorRecord
    parts = (backward, backward["input"], backward["output"], backward["output"][0], backward["input"][0])
    assert not any(gc.is_tracked(part) for part in parts)


def test_an_entry_that_holds_a_tracked_object_stays_tracked(native, instrumented, tmp_path):
    debugger = _collecting(tmp_path, instrumented)
    try:
        instrumented["joined"](torch.randn(3))
        entry = shims._collector.step.data["Torch.cat.0.forward"]
    finally:
        debugger.stop()
    assert type(entry["input_args"][0]) is list  # the list argument's records
    # nothing of it untracked, its output's list neither: an entry is sealed whole or not at all
    assert gc.is_tracked(entry) and gc.is_tracked(entry["input_args"]) and gc.is_tracked(entry["output"])


def test_seal_untracks_only_what_can_hold_no_cycle(native):
    sealed = {"input_args": [None, ("torch.float32", (), False, True, b"")], "input_kwargs": {}, "output": [None]}
    assert native.seal(sealed)
    assert not gc.is_tracked(sealed) and not gc.is_tracked(sealed["input_args"])
    sealed["parameters"] = {"weight": [1]}  # CPython tracks a dict again once it is given a tracked value
    assert gc.is_tracked(sealed)
    row = ApiBackwardHook("Torch.tanh.0.backward", 1)  # a step's row of a hook: a named tuple of a str and an int
    assert gc.is_tracked(row) and native.seal(row) and not gc.is_tracked(row)
    tracked = ({"input_args": [[None]]}, {"output": [types.SimpleNamespace()]}, {"parameters": {"weight": [1]}})
    for kept in (*tracked, [None], (None, [None])):
        assert not native.seal(kept)
        assert gc.is_tracked(kept)
