"""The native Recorder's lane onto the Triton kernels (``TritonStats.attach``, native/stats_op.cpp's
``Recorder.lane``): the records of a call's float32, float16 and bfloat16 device tensors that lie in one block of
memory (contiguous, permuted, a broadcast's narrowed block) or are slices of at most four dimensions (read by a copy
in their own order), and of its backward hooks' gradients, made by the op in
one native call each and queued for the kernels, write the dump that the Python path of the kernels writes, number
for number; every other tensor is left to the Python path, as a CUDA tensor always was. Without a GPU the lane takes
CPU tensors (``StatBuffer(triton_cpu="lane")``) and the kernels run under Triton's interpreter."""

import glob
import json
import logging
import os
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # tests/conftest.py sets it before any import; here for a run alone
triton = pytest.importorskip("triton")

import msprobe_runtime  # noqa: E402
from fixtures.step_files import step_files  # noqa: E402
from fixtures.triton_kernels import Failing, statistics_kernels  # noqa: E402
from msprobe_runtime import PrecisionDebugger, checksums, json_files, records, statistics  # noqa: E402
from msprobe_runtime import collector as collector_module  # noqa: E402
from msprobe_runtime.statistics import DEVICE_ROW, LATER, StatBuffer  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's, in the interpreter: inf and NaN on purpose


@pytest.fixture(scope="module", autouse=True)
def kernels():
    return statistics_kernels(DEVICE)


@pytest.fixture(autouse=True)
def lane_on(monkeypatch, native):
    """The native op (skipped where it cannot be built: tests/runtime/conftest.py), Triton and the lane on."""
    monkeypatch.delenv("MSPROBE_TRITON", raising=False)
    monkeypatch.delenv("MSPROBE_NATIVE_LANE", raising=False)


def lane_buffer(counts=True):
    """A StatBuffer whose device tensors are the lane's (CPU ones here, without a GPU)."""
    return StatBuffer(counts, triton_cpu="lane" if DEVICE == "cpu" else False)


def lane_parts(below=1 << 30, keep=4):
    """A lane's StatBuffer, its Recorder (remembering ``keep`` tensors of ``below`` elements or more) and its
    kernels, attached: on a GPU the kernels are made by a first CUDA tensor's Python record, as in a run."""
    buffer = lane_buffer()
    recorder = buffer.native_recorder(below, keep)
    if buffer._fused is None:
        buffer.add(torch.ones(3, device=DEVICE), statistics.KIND_FLOAT)
    assert buffer._fused._recorder is recorder
    return buffer, recorder, buffer._fused


def flushed(buffer):
    """The flush of ``buffer``'s step (``take``): the numbers its device records name, as the writer sends them to
    the writing process (records.device_numbers)."""
    buffer.take()
    return records.device_numbers(buffer.closed_arenas())


def written(record, numbers):
    """``record`` as the writing process writes it."""
    return json_files.native_json(record, numbers)


def python_buffer(counts=True):
    """The kernels' Python path: no native op, so no lane."""
    return StatBuffer(counts, native=False, triton_cpu=DEVICE == "cpu")


MODEL = """
import torch


class Block(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.norm, self.fc = torch.nn.LayerNorm(8).to(dtype), torch.nn.Linear(8, 8).to(dtype)

    def forward(self, x):
        h = __msprobe__.call("Torch.tanh", torch.tanh, self.fc(x))
        a, b = __msprobe__.call("Torch.split", torch.split, h, 4, -1)      # slices: the lane's, by a copy
        wide = __msprobe__.call("Torch.sin", torch.sin, b.double())         # float64: the Python path
        picked = __msprobe__.call("Torch.argmax", torch.argmax, h, -1)      # int64: the lane's, by aminmax
        __msprobe__.call("Torch.gather", torch.gather, h, -1, picked[:, None])
        mask = __msprobe__.call("Torch.gt", torch.gt, h, 0)                 # bool: the lane's too, 0-d ones too
        __msprobe__.call("Torch.any", torch.any, mask)
        __msprobe__.call("Torch.sum", torch.sum, picked)                    # a 0-d int64
        __msprobe__.call("Torch.remainder", torch.remainder, picked.int(), 3)  # int32
        mean = __msprobe__.call("Torch.mean", torch.mean, h)                # a 0-d output
        joined = __msprobe__.call("Torch.cat", torch.cat, [a * mean, wide.to(a.dtype)], -1)
        same = __msprobe__.call("Torch.add", torch.add, joined, joined)     # one tensor twice: read once
        # its gradient comes through a transpose (permuted: the lane's, in memory order), then one of an empty slice
        turned = __msprobe__.call("Torch.relu", torch.relu, same).t().contiguous().t()
        kept = __msprobe__.call("Torch.concatenate", torch.concatenate, [x[:0], turned])
        return self.norm(kept + x)


class Net(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.first, self.second = Block(dtype), torch.nn.Sequential(Block(dtype), torch.nn.ReLU())

    def forward(self, x):
        return self.second(self.first(x))
"""


def _net(dtype):
    namespace = {"__msprobe__": msprobe_runtime, "__name__": "native_lane_model"}
    exec(compile(MODEL, "native_lane_model.py", "exec"), namespace)
    torch.manual_seed(0)
    return namespace["Net"](dtype).to(DEVICE)


def _run(tmp_path, name, level, dtype, make_buffer, monkeypatch, summary_mode=None):
    """Two steps of two microbatches (forward, backward) of the model through ``make_buffer``'s statistics: the
    files of each step, and the lane's reads of the last. ``summary_mode``: the config's (a checksum mode)."""
    monkeypatch.setattr(collector_module, "StatBuffer", lambda counts: make_buffer(counts))
    model = _net(dtype)
    x = torch.randn(3, 8, device=DEVICE, dtype=dtype, requires_grad=True)
    config = None
    if summary_mode is not None:
        config = tmp_path / f"{name}.json"
        config.write_text(json.dumps({"statistics": {"summary_mode": summary_mode}}))
    debugger = PrecisionDebugger(config_path=config, dump_path=str(tmp_path / name), task="statistics", level=level)
    reads = []
    for _ in range(2):
        debugger.start(model)
        for micro in range(2):
            model(x * (1.5 + micro)).float().sum().backward()
        reads.append(debugger._collector.lane_reads())
        debugger.stop()
        debugger.step()
    debugger.wait()
    return step_files(tmp_path / name, 2), reads


def hooks_left_to_python(monkeypatch):
    """A list that fills with the API (or "module") of each backward hook that leaves its gradients to the Python
    path."""
    left_to_python = []

    def api_fallback(owner, index, *args, real=collector_module._api_backward_fallback):
        left_to_python.append(owner().step.api_backward_hooks[index][0].split(".")[1])
        return real(owner, index, *args)

    def module_fallback(*args, real=collector_module._module_backward_fallback):
        left_to_python.append("module")
        return real(*args)

    monkeypatch.setattr(collector_module, "_api_backward_fallback", api_fallback)
    monkeypatch.setattr(collector_module, "_module_backward_fallback", module_fallback)
    return left_to_python


@pytest.mark.parametrize("level", ["L1", "mix"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_lane_writes_the_python_paths_dump(tmp_path, monkeypatch, level, dtype, kernels):
    """Forward and backward, at L1 and mix, in each dtype the lane takes: the same files, entry for entry and bit
    for bit, as the Python path of the kernels; the lane made most of the records."""
    queued = []
    real = kernels.TritonStats._queued
    monkeypatch.setattr(kernels.TritonStats, "_queued", lambda self, *args: queued.append(1) or real(self, *args))
    left_to_python = hooks_left_to_python(monkeypatch)
    added = []  # the dtypes of the tensors the Python path's statistics read
    real_add = statistics.StatBuffer.add

    def add(self, t, *args):
        added.append(t.dtype)
        return real_add(self, t, *args)

    monkeypatch.setattr(statistics.StatBuffer, "add", add)
    runs, queued_by, added_by = {}, {}, {}
    for name, make_buffer in (("python", python_buffer), ("lane", lane_buffer)):  # one line: the same stacks
        runs[name] = _run(tmp_path, name, level, dtype, make_buffer, monkeypatch)
        queued_by[name] = len(queued) - sum(queued_by.values())
        added_by[name], added[:] = set(added), []
    integers = {torch.int64, torch.int32, torch.bool}  # argmax's, sum's, remainder's, gt's and any's
    assert integers <= added_by["python"] and not integers & added_by["lane"]
    (python_run, python_reads), (lane_run, lane_reads) = runs["python"], runs["lane"]
    by_python, by_lane_python = queued_by["python"], queued_by["lane"]
    assert python_reads == [0, 0]
    assert all(reads > 0 for reads in lane_reads)
    assert by_python > 0 and by_lane_python < by_python / 3  # the lane queued the rest itself, in C++
    assert lane_run == python_run
    # only float64 gradients (sin's) are the Python path's: not the slices of one (cat's, copied in their own
    # order), nor one through a transpose (relu's), nor an empty one (concatenate's), nor a broadcast (sum's, and
    # the last calls' before it)
    assert set(left_to_python) == {"sin"}
    data = lane_run[1, "dump.json"]["data"]
    assert any(name.endswith("backward") for name in data)
    grads = data["Torch.relu.0.backward"]["input"][0], data["Torch.concatenate.0.backward"]["output"][0]
    assert grads[0]["Max"] is not None and grads[1]["shape"] == [0, 8] and grads[1]["Max"] is None
    record = data["Torch.mean.0.forward"]["output"][0]
    assert record["shape"] == [] and record["Max"] == record["Min"] == record["Mean"] is not None
    record = data["Torch.sum.0.forward"]["output"][0]
    assert record["shape"] == [] and type(record["Max"]) is int and record["Max"] == record["Norm"]
    record = data["Torch.any.0.forward"]["output"][0]
    assert record["Max"] is record["Min"] is True and record["Mean"] is None
    assert all(v is not None for k, v in data["Torch.tanh.0.forward"]["output"][0].items() if k != "requires_grad")


def test_the_lane_takes_float_tensors_in_one_block_within_a_call(kernels):
    """Which tensors the lane takes: within a call's records (``begin``) a float32, float16 or bfloat16 one whose
    elements fill one block of memory (contiguous, 0-d, or transposed or permuted: read in memory order, as the
    Python path reads it), or would once each broadcast dimension is one (read once, counted for each copy), or a
    slice of at most four dimensions (copied into its own order on its device: the order the Python path reads it
    in through its strides); a slice of more, a broadcast whose once-each values do not fill a block, a negative, a
    float64 one is left to the caller (``LATER``), and so is every device tensor outside a call, as a
    CUDA tensor always was (the op reads CPU ones only). An empty one's record is made at once, its statistics
    null, as the Python path writes it."""
    buffer, recorder, fused = lane_parts()
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, 5, generator=g).to(DEVICE)
    cube = torch.randn(3, 4, 5, generator=g).to(DEVICE, torch.bfloat16)
    wide = torch.randn(2, 3, 4, 5, generator=g).to(DEVICE, torch.float16)
    taken = [
        base,
        base.to(torch.bfloat16),
        base.to(torch.float16),
        torch.tensor(2.5, device=DEVICE),
        base.t(),
        cube.permute(2, 0, 1),
        base[:1].expand(4, 5),  # a row broadcast: the row read once, four times in its numbers
        base[:, ::2],  # slices: copied
        cube.permute(2, 0, 1)[..., :3],
        wide[..., 1:],
    ]
    left = [
        wide[..., 1:].unsqueeze(0),  # a slice of five dimensions: the Python path's torch ops
        base[:, :1].expand(6, 4),  # a column broadcast: one block no more
        base._neg_view(),
        base.double(),
    ]
    empty = torch.empty(0, 3, device=DEVICE, dtype=torch.bfloat16)
    made, todo = recorder.records(taken)
    assert todo == len(taken) and all(record is LATER for record in made)  # outside a call
    fused.begin()
    made, todo = recorder.records(taken + left + [empty, None, 3])
    fused.end()
    assert todo == len(left)
    assert all(record is LATER for record in made[len(taken) : len(taken) + len(left)])
    assert made[-2:] == [None, {"type": "int", "value": 3}]
    assert written(made[-3], None) == json_files.tensor_json(
        "torch.Tensor", "torch.bfloat16", [0, 3], False, None, None, None, None, None
    )
    assert all(type(record) is tuple and record[4][0] is DEVICE_ROW for record in made[: len(taken)])
    assert recorder.lane_reads == len(taken)
    numbers = flushed(buffer)
    expected = [python_numbers(t) for t in taken]
    for record, t, wanted in zip(made, taken, expected):
        resolved = written(record, numbers)
        assert resolved["dtype"] == str(t.dtype) and resolved["shape"] == list(t.shape)
        assert [resolved[k] for k in ("Max", "Min", "Mean", "Norm", "NaN_count", "Inf_count")] == wanted


def test_integer_and_bool_device_tensors_are_the_lanes_exactly(kernels):
    """An integer or bool device tensor recorded in a call (token and position ids, attention masks, a router's
    counts) is the lane's, in any layout and of any dimension: read by one ``aminmax`` into the arena of its device
    and dtype, its Max and Min exact past 2**53 (an int64 batch, never through float64), a bool's ``any`` and ``all``
    as bools, a 0-d integer's value as all four: as the Python path writes them. Its record is plain data, named by
    its arena: no Python object for the writer to walk the step for. A uint16 one (no ``aminmax``) is left."""
    buffer, recorder, fused = lane_parts()
    big = torch.tensor([[2**62 + 1, -(2**62) - 3, 5], [7, 2**53 + 1, -1]], device=DEVICE)
    mask = torch.tensor([[True, False, True], [False, False, False]], device=DEVICE)
    taken = [big, big.t(), big[:, ::2], big[1:].expand(3, 3), torch.arange(16, device=DEVICE)]
    taken += [mask, mask.t(), mask[1], mask[0, 0], torch.tensor(False, device=DEVICE)]
    taken += [torch.tensor(-9, device=DEVICE), torch.tensor(2**62 + 1, device=DEVICE)]
    taken += [torch.tensor([3, -200, 7], device=DEVICE, dtype=dtype) for dtype in (torch.int32, torch.int16)]
    taken += [torch.tensor([[3, -100], [7, 1]], device=DEVICE, dtype=torch.int8).t()]
    taken += [torch.tensor([3, 255, 0], device=DEVICE, dtype=torch.uint8), torch.tensor(5, device=DEVICE).int()]
    left = [torch.tensor([3, 9], device=DEVICE, dtype=torch.uint16)]
    made, todo = recorder.records(taken)
    assert todo == len(taken)  # outside a call
    fused.begin()
    made, todo = recorder.records(taken + left)
    fused.end()
    assert todo == len(left) and made[-1] is LATER
    assert recorder.integer_reads == len(taken)
    assert all(record[4][0] == json_files.INTEGER_ROW for record in made[:-1])
    assert len(buffer._integers._arenas) == 6  # int64, bool, int32, int16, int8, uint8: one arena each
    numbers = flushed(buffer)
    for record, t in zip(made, taken):
        resolved = written(record, numbers)
        assert resolved == python_record(t)
        assert resolved["Max"] == t.max().item() and resolved["Min"] == t.min().item()
        assert type(resolved["Max"]) is (bool if t.dtype is torch.bool else int)
    assert written(made[0], numbers)["Max"] == 2**62 + 1  # not 2**62, as through float64
    assert written(made[11], numbers)["Norm"] == 2**62 + 1  # a 0-d one's value as all four, exact


def test_int64_records_whose_stack_fails_are_null_and_the_lane_goes_on(kernels, caplog):
    """The flush's stack of an integer arena fails: that flush's int64 records are written null, with a warning, and
    the next step's are read again."""
    buffer, recorder, fused = lane_parts()
    ids = torch.arange(5, device=DEVICE)

    def failing(pending, width):
        raise RuntimeError("no stack here")

    real, buffer._integers._make_slot = buffer._integers._make_slot, failing
    fused.begin()
    made, _ = recorder.records([ids])
    fused.end()
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        numbers = flushed(buffer)
    assert written(made[0], numbers)["Max"] is None and "no stack here" in caplog.text
    buffer._integers._make_slot = real
    fused.begin()
    made, _ = recorder.records([ids])
    fused.end()
    assert written(made[0], flushed(buffer))["Max"] == 4


def python_record(t):
    """The record of ``t`` the kernels' Python path writes."""
    buffer = python_buffer()
    kind = statistics.tensor_kind(t)
    slot, counts = buffer.add(t, kind)
    buffer.take()
    return records.TensorRecord("torch.Tensor", str(t.dtype), tuple(t.shape), False, kind, slot, counts).to_json()


def python_numbers(t):
    """Max, Min, Mean, Norm and the counts of ``t`` by the kernels' Python path, as a record writes them."""
    buffer = python_buffer()
    buffer.add(torch.ones(3, device=DEVICE), statistics.KIND_FLOAT)  # makes the kernels: ``begin`` queues from here
    fused = buffer._fused
    fused.begin()
    slot, counts = buffer.add(t, statistics.tensor_kind(t))
    fused.end()
    buffer.take()
    values = slot.values()
    if t.dim() == 0:
        values = values * 4
    return list(values) + [int(c) for c in counts.values()]


def test_another_threads_record_outside_a_call_is_not_the_lanes(kernels):
    """While one thread's call has its records open, another thread's record outside any call of its own (a
    ``save()``, say) is left to that thread's path: nothing of the other thread's would launch it at its time."""
    import threading

    buffer, recorder, fused = lane_parts()
    x, y = torch.randn(100, device=DEVICE), torch.randn(100, device=DEVICE)
    made = {}
    fused.begin()
    worker = threading.Thread(target=lambda: made.update(other=recorder.records((y,))[0][0]))
    worker.start()
    worker.join()
    made["own"] = recorder.records((x,))[0][0]
    fused.end()
    assert made["own"][4][0] is DEVICE_ROW and recorder.lane_reads == 1
    assert made["other"] is LATER  # the Python path's, as a device tensor's record outside a call always was
    buffer.take()


def test_a_tensor_twice_in_a_call_is_read_once(kernels):
    buffer, recorder, _ = lane_parts(1)  # every tensor remembered (``below`` 1)
    x = torch.randn(2000, device=DEVICE)
    buffer._fused.begin()
    made, _ = recorder.records((x, x, x.view(40, 50)))
    buffer._fused.end()
    assert recorder.lane_reads == 1
    assert made[0][4] is made[1][4] is made[2][4]
    assert written(made[2], flushed(buffer))["Max"] == x.max().item()


def test_a_slice_is_read_by_one_copy_with_no_autograd_node(kernels):
    """A slice that requires grad (rotary embeddings' halves) recorded twice in a call: read once (by a copy of its
    values); its autograd graph, its version and its gradient are as they were."""
    buffer, recorder, fused = lane_parts(1)  # every tensor remembered (``below`` 1)
    x = torch.randn(6, 8, device=DEVICE, requires_grad=True)
    half = (x * 2)[:, :4]
    node, version = half.grad_fn, half._version
    fused.begin()
    made, todo = recorder.records((half, half))
    fused.end()
    assert todo == 0 and recorder.lane_reads == 1 and made[0][4] is made[1][4]
    assert half.grad_fn is node and half._version == version
    half.sum().backward()
    assert torch.equal(x.grad, torch.cat([torch.full((6, 4), 2.0), torch.zeros(6, 4)], 1).to(DEVICE))
    resolved = written(made[0], flushed(buffer))
    assert [resolved[k] for k in ("Max", "Min")] == [half.max().item(), half.min().item()]


def test_an_arenas_numbers_are_read_once_for_all_its_records(monkeypatch, kernels):
    """Each group slot's values() is a copy of the whole arena's numbers: read once, not once a record, which made
    a step's resolve quadratic in its records (bench/per_entry.py, "the step's flush"). The records name the arena
    by its key, which is plain data (marshal takes it: the writing process is sent the records as they are)."""
    buffer, recorder, fused = lane_parts()
    xs = [torch.randn(n, device=DEVICE) for n in range(1, 41)]
    made = []
    for x in xs:
        fused.begin()
        made += recorder.records((x,))[0]
        fused.end()
    assert recorder.lane_reads == len(xs)
    key = made[0][4][1]
    assert type(key) is int and all(record[4][1] == key for record in made)  # one arena
    assert json_files.decode(json_files.encode(made)) == made
    buffer.take()
    [arena] = buffer.closed_arenas()
    assert arena.key == key
    reads, listed = [], []
    doubles, values = statistics.Slot.doubles, statistics.Slot.values
    monkeypatch.setattr(statistics.Slot, "doubles", lambda slot: (reads.append(slot), doubles(slot))[1])
    monkeypatch.setattr(statistics.Slot, "values", lambda slot: (listed.append(slot), values(slot))[1])
    numbers = records.device_numbers([arena])
    for record, x in zip(made, xs):
        assert written(record, numbers)["Max"] == x.max().item()
    assert len(reads) == len(arena.groups) == 2  # the numbers' group slot, and the counts' where they are on
    assert listed == []  # as the copy's bytes: no float object made in this process


def test_full_arenas_are_closed_and_new_ones_taken(monkeypatch, kernels):
    """More tensors than an arena holds, and a tensor of more rows than its room left: new arenas, the numbers
    of every tensor right."""
    monkeypatch.setattr(kernels, "_ARENA_TENSORS", 3)
    monkeypatch.setattr(kernels, "_ARENA_ROWS", 4)
    buffer, recorder, _ = lane_parts()
    g = torch.Generator().manual_seed(5)
    tensors = [torch.randn(n, generator=g).to(DEVICE) for n in (10, 3000, 5000, 7, 9000, 11, 12, 13)]
    made = []
    for t in tensors:  # a call each, as the collector makes them
        buffer._fused.begin()
        made.extend(recorder.records((t,))[0])
        buffer._fused.end()
    assert len({record[4][1] for record in made}) >= 4  # arenas
    numbers = flushed(buffer)
    for record, t in zip(made, tensors):
        resolved = written(record, numbers)
        assert (resolved["Max"], resolved["Min"]) == (t.max().item(), t.min().item())


def test_gradients_are_launched_as_their_hook_ends(tmp_path, monkeypatch, kernels):
    """A backward hook's gradients, recorded by the lane, are launched before the hook returns: nothing is left
    queued (holding a gradient's memory) when ``backward`` is done."""
    monkeypatch.setattr(collector_module, "StatBuffer", lambda counts: lane_buffer(counts))
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="L1")
    x = torch.randn(50, device=DEVICE, requires_grad=True)
    debugger.start()
    y = msprobe_runtime.call("Torch.exp", torch.exp, x)
    before = debugger._collector.lane_reads()
    y.sum().backward()
    fused = debugger._collector.stats._fused
    assert debugger._collector.lane_reads() > before and fused._queue == []
    debugger.stop()
    debugger.step()
    debugger.wait()
    [path] = glob.glob(str(tmp_path / "d" / "step0" / "*" / "dump.json"))
    with open(path) as handle:
        entry = json.load(handle)["data"]["Torch.exp.0.backward"]
    assert entry["input"][0]["Max"] == entry["input"][0]["Min"] == 1.0
    assert entry["output"][0]["Max"] == pytest.approx(x.exp().max().item(), rel=1e-6)


def test_a_launch_that_fails_leaves_null_statistics_and_the_python_path(monkeypatch, kernels, caplog):
    """A failed launch: the lane's queued tensors get null statistics (their records kept, never garbage), one
    warning, and the lane is given up: device tensors go to the Python path (the torch ops) from then on."""
    buffer, recorder, fused = lane_parts()
    for name in ("_partials", "_partials_few", "_partials_many"):
        monkeypatch.setattr(kernels, name, Failing("no launch here"))
    x = torch.randn(100, device=DEVICE)
    with caplog.at_level("WARNING", logger="msprobe_runtime"):
        fused.begin()
        made, _ = recorder.records((x, x + 1))
        buffer.end_call(fused)
    assert "Triton statistics kernels failed" in caplog.text
    reads = recorder.lane_reads
    fused.begin()
    after, _ = recorder.records((x * 2,))
    buffer.end_call(fused)
    # the lane is off: a CUDA tensor is left to the Python path (LATER), a CPU one here read by the op itself
    assert recorder.lane_reads == reads
    assert after[0] is LATER if DEVICE != "cpu" else after[0][4][0] is not DEVICE_ROW
    numbers = flushed(buffer)
    for record in made:
        resolved = written(record, numbers)
        assert resolved["Max"] is None and resolved["shape"] == [100] and "NaN_count" not in resolved


def test_a_lane_without_an_arena_gives_itself_up(monkeypatch, kernels, caplog):
    """An arena it cannot have (a device out of memory): that record and every later one are the Python path's,
    said once at the flush, and nothing of the lane's is left half made."""

    def no_arena(self, t, rows):
        raise RuntimeError("out of memory (an arena)")

    monkeypatch.setattr(kernels.TritonStats, "_lane_arena", no_arena)  # before ``attach`` binds it
    buffer, recorder, fused = lane_parts()
    x = torch.randn(100, device=DEVICE)
    fused.begin()
    made, todo = recorder.records((x,))
    buffer.end_call(fused)
    assert todo == 1 and made[0] is LATER and recorder.lane_reads == 0 and fused._queue == []
    with caplog.at_level("WARNING", logger="msprobe_runtime"):
        buffer.take()
        buffer.take()
    assert caplog.text.count("records of device tensors stopped (RuntimeError: out of memory (an arena))") == 1
    fused.begin()
    after, _ = recorder.records((x * 2,))
    buffer.end_call(fused)
    assert recorder.lane_reads == 0
    assert after[0] is LATER if DEVICE != "cpu" else after[0][4][0] is not DEVICE_ROW


def _dump(tmp_path, name, step=0):
    [path] = glob.glob(str(tmp_path / name / f"step{step}" / "*" / "dump.json"))
    with open(path) as handle:
        return json.load(handle)["data"]


@pytest.mark.parametrize("made_by", ["the training thread", "the writer thread"])
@pytest.mark.parametrize("process", ["1", "0"])
def test_a_steps_device_records_go_to_the_writing_process_as_they_are(tmp_path, monkeypatch, kernels, process, made_by):
    """A step whose records are all the lane's is written without a walk of its entries in this process (``resolve``
    never runs): the records go as they were made, their arenas' numbers beside them, and the writing process (or,
    switched off, the writer thread) makes each into its dict, with the numbers of its own tensor. The message is
    made by the training thread where every number is on the host (here), by the writer thread on a GPU."""
    from msprobe_runtime import writer as writer_module

    monkeypatch.setenv("MSPROBE_WRITER_PROCESS", process)
    if made_by == "the writer thread":
        monkeypatch.setattr(writer_module.Writer, "may_prepare", lambda self: False)
    monkeypatch.setattr(collector_module, "StatBuffer", lambda counts: lane_buffer(counts))
    walked = []
    real = writer_module.resolve
    monkeypatch.setattr(writer_module, "resolve", lambda entry: walked.append(1) or real(entry))
    g = torch.Generator().manual_seed(23)
    tensors = [torch.randn(n, generator=g).to(DEVICE) for n in (5, 700, 3000)]
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="L1")
    debugger.start()
    for t in tensors:
        msprobe_runtime.call("Torch.exp", torch.exp, t)
    reads = debugger._collector.lane_reads()
    debugger.stop()
    debugger.step()
    debugger.wait()
    assert reads == 2 * len(tensors) and walked == []
    data = _dump(tmp_path, "d")
    for index, t in enumerate(tensors):
        entry = data[f"Torch.exp.{index}.forward"]
        for record, value in ((entry["input_args"][0], t), (entry["output"][0], t.exp())):
            assert record["shape"] == list(t.shape) and record["NaN_count"] == 0
            assert (record["Max"], record["Min"]) == pytest.approx((value.max().item(), value.min().item()), rel=1e-6)


def test_a_record_of_an_arena_the_last_flush_closed_keeps_its_numbers(tmp_path, monkeypatch, kernels):
    """A step flushed while a call runs (``step()`` inside it): the call's inputs were read into an arena that flush
    closed, its entry is the next step's. Its numbers are sent again with the next step's, so they are written."""
    monkeypatch.setattr(collector_module, "StatBuffer", lambda counts: lane_buffer(counts))
    g = torch.Generator().manual_seed(24)
    x = torch.randn(300, generator=g).to(DEVICE)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="L1")

    def steps_inside(t):
        debugger.step()
        return t * 3

    debugger.start()
    msprobe_runtime.call("Torch.exp", torch.exp, x)
    msprobe_runtime.call("Torch.flushing_op", steps_inside, x + 1)
    debugger.stop()
    debugger.step()
    debugger.wait()
    first, second = _dump(tmp_path, "d", 0), _dump(tmp_path, "d", 1)
    assert first["Torch.exp.0.forward"]["output"][0]["Max"] == pytest.approx(x.exp().max().item(), rel=1e-6)
    [(name, entry)] = second.items()
    assert name.startswith("Torch.flushing_op.")
    assert entry["input_args"][0]["Max"] == pytest.approx((x + 1).max().item(), rel=1e-6)
    assert entry["output"][0]["Max"] == pytest.approx(((x + 1) * 3).max().item(), rel=1e-6)


def test_an_input_changed_by_its_call_is_null_and_the_api_learned(tmp_path, monkeypatch, kernels, caplog):
    """An input read after its call (call_effects) that the call changed anyway: null through the lane too, said
    once with the API's name, and read before the call from then on."""
    monkeypatch.setattr(collector_module, "StatBuffer", lambda counts: lane_buffer(counts))
    g = torch.Generator().manual_seed(16)
    tensors = [torch.rand(3000, generator=g).to(DEVICE) for _ in range(3)]
    before = [t.max().item() for t in tensors]

    def doubles_in_place(x):
        x.mul_(2)
        return x + 1

    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="L1")
    with caplog.at_level("WARNING", logger="msprobe_runtime"):
        debugger.start()
        for t in tensors:
            msprobe_runtime.call("Torch.exp", doubles_in_place, t)
        reads = debugger._collector.lane_reads()
        debugger.stop()
        debugger.step()
        debugger.wait()
    assert reads == 2 * len(tensors)
    [path] = glob.glob(str(tmp_path / "d" / "step0" / "*" / "dump.json"))
    with open(path) as handle:
        data = json.load(handle)["data"]
    assert data["Torch.exp.0.forward"]["input_args"][0]["Max"] is None
    for index in (1, 2):
        assert data[f"Torch.exp.{index}.forward"]["input_args"][0]["Max"] == pytest.approx(before[index], rel=1e-6)
    assert caplog.text.count("Torch.exp changed an input in place") == 1


def test_the_lane_and_its_kernels_are_freed_with_their_buffer(kernels):
    """The op holds the kernels' callables weakly: no cycle through the native Recorder (which the garbage collector
    cannot traverse) keeps the kernels' state, and its arenas' device memory, once their StatBuffer is gone."""
    import gc
    import weakref

    buffer, recorder, fused = lane_parts()
    fused.begin()
    recorder.records((torch.randn(100, device=DEVICE),))
    fused.end()
    buffer.take()
    gone = weakref.ref(fused)
    del buffer, recorder, fused
    gc.collect()
    assert gone() is None


def test_switched_off_the_python_path_serves(tmp_path, monkeypatch, kernels):
    """``MSPROBE_NATIVE_LANE=0``: no lane; the same entries (on a GPU the Python path of the kernels serves them,
    the same numbers: the first test; here the op reads the CPU tensors itself, to other roundings)."""
    monkeypatch.setenv("MSPROBE_NATIVE_LANE", "0")
    runs = {}
    for name in ("off", "on"):  # one line: the same stacks
        runs[name] = _run(tmp_path, name, "L1", torch.bfloat16, lane_buffer, monkeypatch)
        monkeypatch.delenv("MSPROBE_NATIVE_LANE", raising=False)
    assert runs["off"][1] == [0, 0] and all(runs["on"][1])
    for step in range(2):
        on, off = runs["on"][0][step, "dump.json"]["data"], runs["off"][0][step, "dump.json"]["data"]
        assert list(on) == list(off) and len(on) > 10
        assert runs["on"][0][step, "construct.json"] == runs["off"][0][step, "construct.json"]


def fingerprint_lane_parts():
    """A lane's StatBuffer in summary_mode fingerprint, its Recorder and its kernels, the fingerprints' lane attached
    (by the first fingerprint asked of the Python path, as in a run)."""
    buffer = lane_buffer()
    recorder = buffer.native_recorder(1 << 30, 4, fingerprints=True)
    if buffer._fused is None:
        buffer.add(torch.ones(3, device=DEVICE), statistics.KIND_FLOAT)
    assert not recorder.fingerprinting  # until the fingerprints' kernels are made: every record the Python path's
    assert buffer.fused_fingerprint(torch.ones(3, device=DEVICE), checksums.fingerprint_parts) is not None
    assert recorder.fingerprinting
    return buffer, recorder, buffer._fused


def test_with_fingerprints_a_fingerprint_that_asks_first_attaches_the_lane(kernels):
    """The kernels made where a fingerprint asks for them first (a float8 tensor's, whose statistics are not the
    kernels'), as on a GPU, where the first device tensor to ask makes them: the lane is attached, its records'
    fingerprints too, as when a statistic asks first."""
    buffer = lane_buffer()
    recorder = buffer.native_recorder(1 << 30, 4, fingerprints=True)
    buffer._fused = None  # no tensor has asked yet (the lane of CPU tensors, for this test, made them above)
    assert buffer.fused_fingerprint(torch.ones(3, device=DEVICE), checksums.fingerprint_parts) is not None
    assert buffer._fused.lane_attached and recorder.fingerprinting
    buffer.take()


def _bytes(t):
    flat = t.detach().cpu().contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).tolist())


@pytest.mark.parametrize(("level", "dtype"), [("L1", torch.bfloat16), ("mix", torch.float32)])
def test_with_fingerprints_the_lane_writes_the_python_paths_dump(tmp_path, monkeypatch, level, dtype, kernels):
    """summary_mode fingerprint: the lane makes a call's records with their fingerprints (the tensor's bytes queued
    beside its statistics), and the files are the Python path's, bit for bit, every fingerprint there. A backward
    hook leaves its gradients to the Python path only for a float64 one (sin's): not for an empty one (concatenate's,
    as ``cat``'s of an empty cache in transformers)."""
    runs, hashed = {}, {}
    real_fingerprint = statistics.StatBuffer.fused_fingerprint

    def fused_fingerprint(self, t, by_torch_ops):  # the Python path's fingerprint of ``t``
        hashed.setdefault(name, set()).add(t.dtype)
        return real_fingerprint(self, t, by_torch_ops)

    monkeypatch.setattr(statistics.StatBuffer, "fused_fingerprint", fused_fingerprint)
    for name, make_buffer in (("python", python_buffer), ("lane", lane_buffer)):  # one line: the same stacks
        left_to_python = hooks_left_to_python(monkeypatch)
        runs[name] = _run(tmp_path, name, level, dtype, make_buffer, monkeypatch, "fingerprint")
    assert set(left_to_python) == {"sin"}
    integers = {torch.int64, torch.int32, torch.bool}  # argmax's, sum's, remainder's, gt's and any's
    assert integers <= hashed["python"] and not integers & hashed["lane"]
    (python_run, python_reads), (lane_run, lane_reads) = runs["python"], runs["lane"]
    assert python_reads == [0, 0] and all(reads > 10 for reads in lane_reads)
    assert lane_run == python_run
    data = lane_run[1, "dump.json"]["data"]
    assert any(name.endswith("backward") for name in data)
    fingerprints = [
        record["fingerprint"]
        for entry in data.values()
        for records_ in entry.values()
        if type(records_) is list
        for record in records_
        if type(record) is dict and "fingerprint" in record
    ]
    assert len(fingerprints) > 20 and None not in fingerprints


def test_with_fingerprints_the_lane_takes_a_calls_tensors_and_leaves_the_rest(kernels):
    """Which records the op makes with fingerprints: a call's float tensors that fill a block of memory, each with
    the digits of its bytes in its own order (a transpose's or a permutation's copied into that order: not its
    base's digits, whose memory it shares), or a slice (copied into that order, its statistics read from the copy),
    or a broadcast whose values are one block (all its elements' bytes hashed); the same tensor twice, read once; an
    empty tensor of any dtype at once, with the Python path's record (null statistics, the empty fingerprint); an
    integer or bool one, 0-d too (its Max and Min exact, by ``aminmax``); a slice of more than four dimensions, a
    column broadcast, a float64 tensor and any tensor outside a call are the Python path's (``LATER``), the CPU's too
    where the lane is off."""
    buffer, recorder, fused = fingerprint_lane_parts()
    empties = [torch.empty(0, 3, device=DEVICE, dtype=dtype) for dtype in (torch.bfloat16, torch.int64)]
    g = torch.Generator().manual_seed(21)
    base = torch.randn(6, 5, generator=g).to(DEVICE)
    cube = torch.randn(3, 4, 5, generator=g).to(DEVICE, torch.bfloat16)
    taken = [base, base.to(torch.bfloat16), torch.tensor(2.5, device=DEVICE, dtype=torch.float16)]
    taken += [base[:, ::2], cube[:, 1:, :3], base[:1].expand(4, 6, 5), base.t(), cube.permute(2, 0, 1)]
    left = [cube[:, 1:, :3][None, None], base[:, :1].expand(6, 5), base.double()]
    ids = torch.tensor([[2**62 + 1, -7], [5, 2**53 + 1]], device=DEVICE)
    integers = [ids, ids.t(), torch.tensor(3, device=DEVICE), ids > 0, (ids > 0).any(), (ids % 1000).int().t()]
    made, todo = recorder.records(taken)
    assert todo == len(taken)  # outside a call
    fused.begin()
    made, todo = recorder.records(taken + left + [taken[-1]] + empties + integers)
    fused.end()
    made, made_integers = made[: -len(integers)], made[-len(integers) :]
    made, made_empty = made[: -len(empties)], made[-len(empties) :]
    assert todo == len(left) and all(record is LATER for record in made[len(taken) : -1])
    assert made[-1][4] is made[len(taken) - 1][4]  # the same tensor again: its row, read once
    assert recorder.lane_reads == len(taken)  # an empty one has nothing to read
    numbers = flushed(buffer)
    for record, t in zip(made_empty, empties):
        python_path = checksums.checksum_of(t, checksums.FINGERPRINT_KEY, True, buffer).value()
        assert python_path == checksums.EMPTY_FINGERPRINT
        assert written(record, numbers) == {
            "type": "torch.Tensor",
            "dtype": str(t.dtype),
            "shape": [0, 3],
            "requires_grad": False,
            "Max": None,
            "Min": None,
            "Mean": None,
            "Norm": None,
            "fingerprint": python_path,
        }
    digits = []
    for record, t in zip(made, taken):
        resolved = written(record, numbers)
        assert resolved["fingerprint"] == checksums.fingerprint_reference(_bytes(t))
        assert resolved["Max"] == t.max().item()
        digits.append(resolved["fingerprint"])
    assert digits[6] != digits[0]  # the transpose's bytes in its own order, not its base's
    assert recorder.integer_reads == len(integers)
    for record, t in zip(made_integers, integers):
        resolved = written(record, numbers)
        assert resolved["fingerprint"] == checksums.fingerprint_reference(_bytes(t))
        assert (resolved["Max"], resolved["Min"]) == (t.max().item(), t.min().item())
        assert resolved["Mean"] == (t.item() if t.dim() == 0 and t.dtype is not torch.bool else None)
    assert written(made_integers[0], numbers)["Max"] == 2**62 + 1


@pytest.mark.parametrize("alone", [False, True], ids=["beside others", "the first of its arena"])
def test_with_fingerprints_a_failed_launch_keeps_the_digits_and_the_python_path_follows(
    monkeypatch, kernels, caplog, alone
):
    """A launch of a call's statistics and hashes that fails: the call's fingerprints are the torch ops' digits
    (not nulls), its statistics null; the lane is given up, and the records after are the Python path's. Also where
    they were the first tensors of a step (``alone``): their arena holds no tensor the kernels read."""
    from msprobe_runtime import triton_fingerprint

    buffer, recorder, fused = fingerprint_lane_parts()
    if alone:
        flushed(buffer)
    monkeypatch.setattr(triton_fingerprint, "_partials_hash_few", Failing("no launch here"))
    x = torch.randn(100, device=DEVICE)
    with caplog.at_level("WARNING", logger="msprobe_runtime"):
        fused.begin()
        made, todo = recorder.records((x, x + 1))
        buffer.end_call(fused)
    assert todo == 0 and "no launch here" in caplog.text
    fused.begin()
    after, todo = recorder.records((x * 2,))
    buffer.end_call(fused)
    assert todo == 1 and after[0] is LATER and not recorder.fingerprinting
    numbers = flushed(buffer)
    for record, t in zip(made, (x, x + 1)):
        resolved = written(record, numbers)
        assert resolved["fingerprint"] == checksums.fingerprint_reference(_bytes(t))
        assert resolved["Max"] is None


def test_with_fingerprints_an_input_changed_by_its_call_is_null(tmp_path, monkeypatch, kernels, caplog):
    """An input read after its call (call_effects) that the call changed anyway: its fingerprint through the lane is
    null as its statistics are (never the digits of the bytes after the call), said once; read before the call from
    then on, with the digits of the bytes the call saw."""
    monkeypatch.setattr(collector_module, "StatBuffer", lambda counts: lane_buffer(counts))
    g = torch.Generator().manual_seed(17)
    tensors = [torch.rand(3000, generator=g).to(DEVICE) for _ in range(4)]
    before = [_bytes(t) for t in tensors]

    def doubles_in_place(x):
        x.mul_(2)
        return x + 1

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"statistics": {"summary_mode": "fingerprint"}}))
    debugger = PrecisionDebugger(config_path=config, dump_path=str(tmp_path / "d"), task="statistics", level="L1")
    with caplog.at_level("WARNING", logger="msprobe_runtime"):
        debugger.start()
        msprobe_runtime.call("Torch.exp", torch.exp, tensors[0])  # the kernels made, the lane's fingerprints on
        for t in tensors[1:]:
            msprobe_runtime.call("Torch.exp", doubles_in_place, t)
        reads = debugger._collector.lane_reads()
        debugger.stop()
        debugger.step()
        debugger.wait()
    assert reads >= 2 * (len(tensors) - 1)
    [path] = glob.glob(str(tmp_path / "d" / "step0" / "*" / "dump.json"))
    with open(path) as handle:
        data = json.load(handle)["data"]
    changed = data["Torch.exp.1.forward"]["input_args"][0]
    assert changed["fingerprint"] is None and changed["Max"] is None
    for index in (2, 3):
        record = data[f"Torch.exp.{index}.forward"]["input_args"][0]
        assert record["fingerprint"] == checksums.fingerprint_reference(before[index])
    assert caplog.text.count("Torch.exp changed an input in place") == 1


def test_a_parameters_gradient_and_a_modules_inputs_are_one_launch(tmp_path, monkeypatch, kernels):
    """At mix with fingerprints: a parameter's gradient (its post-accumulate hook) and a module's inputs (before its
    forward runs) are recorded within a call's records, so each has its statistics and its hashes in one launch,
    where each tensor took one of each."""
    from msprobe_runtime import triton_fingerprint

    launched = []  # (kernel, the collector's method that made the records)

    def counted(module, name):
        kernel = getattr(module, name)

        class Counted:
            def __getitem__(self, grid):
                names = set()
                frame = sys._getframe(1)
                while frame is not None:
                    names.add(frame.f_code.co_name)
                    frame = frame.f_back
                where = next((n for n in ("record_param_grad", "module_forward_begin") if n in names), None)
                launched.append((name, where))
                return kernel[grid]

        monkeypatch.setattr(module, name, Counted())

    for name in ("_partials", "_partials_few"):
        counted(kernels, name)
    for name in ("_hash_few", "_partials_hash_few"):
        counted(triton_fingerprint, name)
    monkeypatch.setattr(collector_module, "StatBuffer", lambda counts: lane_buffer(counts))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(DEVICE)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"statistics": {"summary_mode": "fingerprint"}}))
    debugger = PrecisionDebugger(config_path=config, dump_path=str(tmp_path / "d"), task="statistics", level="mix")
    x = torch.randn(3, 8, device=DEVICE)
    for _ in range(2):
        launched.clear()
        debugger.start(model)
        model(x).sum().backward()
        debugger.stop()
        debugger.step()
    debugger.wait()
    gradients = [kernel for kernel, where in launched if where == "record_param_grad"]
    inputs = [kernel for kernel, where in launched if where == "module_forward_begin"]
    assert gradients == ["_partials_hash_few"] * 4  # two Linear layers' weight and bias
    assert inputs and set(inputs) == {"_partials_hash_few"}
    data = step_files(tmp_path / "d", 2)[1, "dump.json"]["data"]
    grads = [record for name, entry in data.items() if "parameters_grad" in name for record in entry.values()]
    assert len(grads) == 4 and all(record["fingerprint"] is not None for record in grads)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
