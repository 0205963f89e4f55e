"""A large tensor recorded twice unchanged is read once; once its version counter moves, it is read again. A
parameter is read once a step, however many calls come between; what is remembered is forgotten at start, stop
and an optimizer's step, which may write a parameter without moving its counter."""

import glob
import json
import os

import pytest

torch = pytest.importorskip("torch")

import msprobe_runtime as rt  # noqa: E402
from msprobe_runtime import PrecisionDebugger, native_stats, statistics  # noqa: E402


STEP = """
def step(debugger, big):
    debugger.start()
    __msprobe__.call("Torch.clone", torch.clone, big)   # 0: read
    __msprobe__.call("Torch.clone", torch.clone, big)   # 1: the same tensor, unchanged: reused
    big.mul_(3)                                         # its version counter moves
    __msprobe__.call("Torch.clone", torch.clone, big)   # 2: read again
    big.data.mul_(5)                                    # .data shares the data, not the version counter...
    big.add_(0)                                         # ...so an in-place op moves it, as training would
    __msprobe__.call("Torch.clone", torch.clone, big)   # 3: read again
    debugger.stop()
    debugger.wait()
"""


def _take_path(monkeypatch, path):
    """Statistics by the native op, or by the torch ops (the path of CUDA and NPU tensors)."""
    if path == "torch ops":
        monkeypatch.setattr(native_stats, "load", lambda: None)
    elif native_stats.load() is None:
        pytest.skip("the native statistics op cannot be built here")


def _step_data(root, step):
    [directory] = glob.glob(os.path.join(str(root), f"step{step}", "*"))
    with open(os.path.join(directory, "dump.json")) as handle:
        return json.load(handle)["data"]


def _instrumented(source):
    """``source`` compiled as instrumented code: its globals hold the runtime, so no observing mode records the
    in-place ops."""
    namespace = {"__msprobe__": rt, "torch": torch}
    exec(compile(source, "<instrumented>", "exec"), namespace)
    return namespace


def _spy_reads(monkeypatch, reader, what):
    """Each tensor whose data ``StatBuffer.<reader>`` reads, as ``what(t)``."""
    reads = []
    original = getattr(statistics.StatBuffer, reader)

    def spy(self, t, *rest):
        reads.append(what(t))
        return original(self, t, *rest)

    monkeypatch.setattr(statistics.StatBuffer, reader, spy)
    return reads


def _run_instrumented(source, tmp_path, big):
    """``source``'s step run as instrumented code (its globals hold the runtime: no observing mode records the
    in-place ops); the step's dump.json data, and how many tensors the native records read (describe_seq)."""
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    _instrumented(source)["step"](debugger, big)
    recorder = debugger._collector.recorder
    native_reads = recorder.reads if recorder is not None else 0
    return _step_data(tmp_path / "d", 0), native_reads


@pytest.mark.parametrize("path", ["native", "torch ops"])
def test_reuse_serves_no_stale_value(tmp_path, monkeypatch, path):
    _take_path(monkeypatch, path)
    # where the data of a float32 CPU tensor is read
    reads = _spy_reads(monkeypatch, "native" if path == "native" else "add", lambda t: t.numel())
    data, native_reads = _run_instrumented(STEP, tmp_path, torch.ones(8192))
    maxima = [data[f"Torch.clone.{i}.forward"]["input_args"][0]["Max"] for i in range(4)]
    assert maxima == [1.0, 1.0, 3.0, 15.0]
    # inputs of calls 0, 2 and 3 and the four outputs (each a new tensor) were read; call 1's input was not
    assert reads.count(8192) + native_reads == 7


VIEWS = """
def step(debugger, big):
    debugger.start()
    __msprobe__.call("Torch.clone", torch.clone, big)             # 0: read
    t = big.t()                                                   # the same elements, transposed
    __msprobe__.call("Torch.clone", torch.clone, t)               # 1: served from 0
    __msprobe__.call("Torch.clone", torch.clone, big.view(-1))    # 2: served from 0
    __msprobe__.call("Torch.clone", torch.clone, big[:, ::2])     # 3: half of them: read
    __msprobe__.call("Torch.clone", torch.clone, torch._neg_view(big))  # 4: same memory, other values: read
    big.mul_(2)                                                   # the base's counter moves, and so its views'
    __msprobe__.call("Torch.clone", torch.clone, t)               # 5: read again
    debugger.stop()
    debugger.wait()
"""


def test_a_view_of_the_same_elements_is_served_and_nothing_else(tmp_path, monkeypatch):
    if native_stats.load() is None:
        pytest.skip("the native statistics op cannot be built here")
    reads = _spy_reads(monkeypatch, "native", lambda t: tuple(t.shape))
    big = torch.arange(128 * 64, dtype=torch.float32).reshape(128, 64) - 100.0
    data, native_reads = _run_instrumented(VIEWS, tmp_path, big)
    inputs = [data[f"Torch.clone.{i}.forward"]["input_args"][0] for i in range(6)]
    assert [i["shape"] for i in inputs] == [[128, 64], [64, 128], [8192], [128, 32], [128, 64], [64, 128]]
    top = 128 * 64 - 101.0
    assert [(i["Max"], i["Min"]) for i in inputs] == [
        (top, -100.0),
        (top, -100.0),
        (top, -100.0),
        (top - 1.0, -100.0),
        (100.0, -top),
        (2 * top, -200.0),
    ]
    assert inputs[1]["Norm"] == inputs[0]["Norm"] == inputs[2]["Norm"]
    # the inputs of calls 0, 3, 4 and 5 were read, and each call's output (a clone: new memory, in the
    # input's layout); the inputs of 1 and 2 were not
    inputs_read = [(128, 64), (128, 32), (128, 64), (64, 128)]
    outputs_read = [(128, 64), (64, 128), (8192,), (128, 32), (128, 64), (64, 128)]
    if native_reads:  # the native records read them (describe_seq): counted only
        assert not reads and native_reads == len(inputs_read + outputs_read)
    else:
        assert sorted(reads) == sorted(inputs_read + outputs_read)


LAYOUTS = """
def step(debugger, tensors):
    debugger.start()
    for t in tensors:
        __msprobe__.call("Torch.clone", torch.clone, t)
    debugger.stop()
    debugger.wait()
"""


@pytest.mark.parametrize("path", ["native", "torch ops"])
def test_a_view_read_afresh_has_the_bits_of_the_tensor_it_views(tmp_path, monkeypatch, path):
    """Served again, a view gets its tensor's statistics; read afresh (MSPROBE_STATS_REUSE=0), it must get the
    same bits, or a dump would depend on whether reuse is on. Each view is reduced in its tensor's memory order:
    a staged matrix (4 096 elements, 64 x 64, as megatron's weights of the tiny GPT) and its transpose, a larger
    one and its transpose, a 3-D tensor and a permutation of it."""
    _take_path(monkeypatch, path)
    monkeypatch.setenv("MSPROBE_STATS_REUSE", "0")
    generator = torch.Generator().manual_seed(3)
    tensors = []
    for _ in range(8):  # the torch ops' two norms (staged rows, a dot) differ in the last bit on about 2 of 3
        square = torch.randn(64, 64, generator=generator) * 0.03
        tensors += [square, square.t()]
    wide = torch.randn(128, 96, generator=generator)
    cube = torch.randn(8, 16, 24, generator=generator)
    tensors += [wide, wide.t(), cube, cube.permute(2, 0, 1)]
    data, _ = _run_instrumented(LAYOUTS, tmp_path, tensors)
    records = [data[f"Torch.clone.{i}.forward"]["input_args"][0] for i in range(len(tensors))]
    fields = ("Max", "Min", "Mean", "Norm", "NaN_count", "Inf_count")
    for base, view in zip(records[0::2], records[1::2]):
        assert [base[field] for field in fields] == [view[field] for field in fields], (base, view)


PARAMETERS = """
def step(debugger, w, others):
    debugger.start()
    __msprobe__.call("Torch.clone", torch.clone, w)              # 0: read (a parameter)
    for other in others:                                         # 1-6: each read, as is each call's output:
        __msprobe__.call("Torch.clone", torch.clone, other)      #   far more than the last few tensors
    __msprobe__.call("Torch.clone", torch.clone, w)              # 7: served: the step's parameters
    __msprobe__.call("Torch.clone", torch.clone, w.t())          # 8: a view of it: served
    __msprobe__.call("Torch.clone", torch.clone, others[0])      # 9: not a parameter, long gone: read
    with torch.no_grad():
        w.mul_(2)                                                # its version counter moves
    __msprobe__.call("Torch.clone", torch.clone, w)              # 10: read again
    debugger.stop()
    debugger.step()
"""


@pytest.mark.parametrize("reuse", ["on", "off"])
@pytest.mark.parametrize("path", ["native", "torch ops"])
def test_a_parameter_is_read_once_a_step_until_it_changes(tmp_path, monkeypatch, path, reuse):
    _take_path(monkeypatch, path)
    if reuse == "off":
        monkeypatch.setenv("MSPROBE_STATS_REUSE", "0")
    reads = _spy_reads(monkeypatch, "native" if path == "native" else "add", lambda t: t.numel())
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    namespace = _instrumented(PARAMETERS)
    w = torch.nn.Parameter(torch.ones(64, 128))
    others = [torch.full((8192,), float(i)) for i in range(6)]
    counted = []
    for _ in range(2):
        recorder = debugger._collector.recorder if debugger._collector is not None else None
        before = (recorder.reads if recorder is not None else 0) + reads.count(8192)
        namespace["step"](debugger, w, others)
        recorder = debugger._collector.recorder
        counted.append((recorder.reads if recorder is not None else 0) + reads.count(8192) - before)
    debugger.wait()
    maxima = []
    for step in (0, 1):
        data = _step_data(tmp_path / "d", step)
        maxima.append([data[f"Torch.clone.{i}.forward"]["input_args"][0]["Max"] for i in (0, 7, 8, 10)])
    assert maxima == [[1.0, 1.0, 1.0, 2.0], [2.0, 2.0, 2.0, 4.0]]
    # inputs 0, 1-6, 9 and 10 and the 11 outputs were read; the parameter at 7 and 8 was not; and a new step
    # reads it afresh. With MSPROBE_STATS_REUSE=0 every one is read.
    assert counted == ([20, 20] if reuse == "on" else [22, 22])


WRITTEN_AROUND_ITS_COUNTER = """
class Fused(torch.optim.Optimizer):
    # as a fused kernel (or megatron's copy through .data) writes: the parameter's version counter stays
    def __init__(self, params):
        super().__init__(params, {})

    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                p.data.mul_(2)


def step(debugger, w):
    optimizer = Fused([w])
    debugger.start()
    __msprobe__.call("Torch.clone", torch.clone, w)              # 0: Max 1
    optimizer.step()
    __msprobe__.call("Torch.clone", torch.clone, w)              # 1: Max 2, read again after the step
    debugger.stop()
    w.data.mul_(2)                                               # between stop and start
    debugger.start()
    __msprobe__.call("Torch.clone", torch.clone, w)              # 2: Max 4
    debugger.stop()
    debugger.step()
"""


@pytest.mark.parametrize("path", ["native", "torch ops"])
def test_a_parameter_is_read_afresh_after_an_optimizer_step_or_a_stop(tmp_path, monkeypatch, path):
    _take_path(monkeypatch, path)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    w = torch.nn.Parameter(torch.ones(64, 128))
    version = w._version
    _instrumented(WRITTEN_AROUND_ITS_COUNTER)["step"](debugger, w)
    debugger.wait()
    assert w._version == version  # nothing but the hooks could have told the collector
    data = _step_data(tmp_path / "d", 0)
    assert [data[f"Torch.clone.{i}.forward"]["input_args"][0]["Max"] for i in range(3)] == [1.0, 2.0, 4.0]
