"""The dump's layout and record format: msprobe's names, fields, null rules, stack.json and construct.json."""

import glob
import importlib.util
import json
import logging
import os
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import msprobe_runtime as rt  # noqa: E402
from msprobe_runtime import PrecisionDebugger  # noqa: E402
from msprobe_runtime.debugger import DumpPathError  # noqa: E402

MODEL_SOURCE = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return F.gelu(self.fc(x))


    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()
            self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

        def forward(self, x):
            y = self.inner(x)
            return self.seq(y) + y


    def loss_of(model, x):
        out = model(x)
        return out.sum()
""")


@pytest.fixture
def model_module(tmp_path):
    from msprobe_rewrite.api import rewrite_source

    path = tmp_path / "small_model.py"
    path.write_bytes(rewrite_source(MODEL_SOURCE.encode()))
    spec = importlib.util.spec_from_file_location("small_model_rt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def debuggers():
    made = []

    def make(**kwargs):
        debugger = PrecisionDebugger(**kwargs)
        made.append(debugger)
        return debugger

    yield make
    for debugger in made:
        debugger.stop()


def read_step(dump_path, step=0):
    [directory] = glob.glob(os.path.join(glob.escape(str(dump_path)), f"step{step}", "*"))
    out = {}
    for name in ("dump.json", "stack.json", "construct.json"):
        with open(os.path.join(directory, name)) as handle:
            out[name] = json.load(handle)
    out["dir"] = directory
    return out


def train_once(debuggers, module, dump_path, level, **kwargs):
    torch.manual_seed(0)
    model = module.Outer()
    x = torch.randn(2, 4)
    debugger = debuggers(dump_path=str(dump_path), level=level, **kwargs)
    debugger.start(model)
    loss = module.loss_of(model, x)
    loss.backward()
    debugger.stop()
    debugger.wait()
    return read_step(dump_path)


def test_layout_and_header(debuggers, model_module, tmp_path):
    result = train_once(debuggers, model_module, tmp_path / "d", "mix")
    assert os.path.basename(result["dir"]) == f"proc{os.getpid()}"
    dump = result["dump.json"]
    assert dump["task"] == "statistics" and dump["level"] == "mix" and dump["framework"] == "pytorch"
    assert dump["dump_data_dir"] is None
    names = list(dump["data"])
    for expected in [
        "Module.inner.Inner.forward.0",
        "Module.inner.fc.Linear.forward.0",
        "Functional.linear.0.forward",
        "Functional.gelu.0.forward",
        "Module.seq.Sequential.forward.0",
        "Module.seq.0.Linear.forward.0",
        "Module.seq.1.ReLU.forward.0",
        "Functional.relu.0.forward",
        "Tensor.__add__.0.forward",
        "Module.inner.fc.Linear.backward.0",
        "Functional.gelu.0.backward",
        "Module.inner.fc.Linear.parameters_grad.0",
        "Module.seq.0.Linear.parameters_grad.0",
    ]:
        assert expected in names, expected
    assert not any(n.startswith("Module.Outer") for n in names)  # msprobe names children, not the root


def test_record_fields(debuggers, model_module, tmp_path):
    data = train_once(debuggers, model_module, tmp_path / "d", "mix")["dump.json"]["data"]
    linear = data["Module.inner.fc.Linear.forward.0"]
    assert list(linear) == ["input_args", "input_kwargs", "output", "parameters"]
    record = linear["input_args"][0]
    assert list(record)[:8] == ["type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad"]
    assert record["type"] == "torch.Tensor" and record["dtype"] == "torch.float32" and record["shape"] == [2, 4]
    # exact counts are on by default (statistics.nan_inf_count), after msprobe's fields
    assert list(record)[8:] == ["NaN_count", "Inf_count"] and (record["NaN_count"], record["Inf_count"]) == (0, 0)
    assert set(linear["parameters"]) == {"weight", "bias"}
    backward = data["Functional.gelu.0.backward"]
    assert set(backward) == {"input", "output"} and len(backward["input"]) == 1
    grads = data["Module.inner.fc.Linear.parameters_grad.0"]
    assert set(grads) == {"weight", "bias"} and grads["weight"]["shape"] == [4, 4]
    api = data["Functional.linear.0.forward"]
    assert [r["shape"] for r in api["input_args"]] == [[2, 4], [4, 4], [4]]


def test_statistics_values_and_null_rules(debuggers, tmp_path):
    values = torch.tensor([[1.0, -2.0], [3.0, float("nan")]])
    infs = torch.tensor([1.0, float("inf"), -float("inf")])
    inputs = {
        "bool": torch.tensor([True, False]),
        "int": torch.tensor([3, -1, 7]),
        "f64": torch.tensor([1.0, 2.0], dtype=torch.float64),
        "empty": torch.empty(0, 3),
        "zero_d": torch.tensor(-2.5),
        "plain": torch.tensor([[1.0, -2.0], [3.0, 4.0]]),
    }
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"dump_path": str(tmp_path / "d"), "level": "L1", "statistics": {"nan_inf_count": True}})
    )
    debugger = debuggers(config_path=str(config))
    debugger.start()
    for key, tensor in inputs.items():
        rt.call("Torch.clone", torch.clone, tensor)
    rt.call("Torch.clone", torch.clone, values)
    rt.call("Torch.clone", torch.clone, infs)
    debugger.stop()
    debugger.wait()
    data = read_step(tmp_path / "d")["dump.json"]["data"]
    rec = [data[f"Torch.clone.{i}.forward"]["input_args"][0] for i in range(8)]
    boolean, integer, f64, empty, zero_d, plain, nan, inf = rec
    assert (boolean["Max"], boolean["Min"], boolean["Mean"], boolean["Norm"]) == (True, False, None, None)
    assert (integer["Max"], integer["Min"], integer["Mean"], integer["Norm"]) == (7, -1, None, None)
    assert (f64["Max"], f64["Min"], f64["Mean"], f64["Norm"]) == (2.0, 1.0, None, None)
    assert (empty["Max"], empty["Min"], empty["Mean"], empty["Norm"]) == (None, None, None, None)
    assert empty["shape"] == [0, 3]
    assert (zero_d["Max"], zero_d["Min"], zero_d["Mean"], zero_d["Norm"]) == (-2.5, -2.5, -2.5, -2.5)
    assert zero_d["shape"] == []
    assert plain["Max"] == 4.0 and plain["Min"] == -2.0 and plain["Mean"] == 1.5
    assert plain["Norm"] == pytest.approx(30**0.5)
    assert nan["NaN_count"] == 1 and nan["Inf_count"] == 0
    assert inf["NaN_count"] == 0 and inf["Inf_count"] == 2
    assert "NaN_count" not in integer and "NaN_count" not in boolean
    assert f64["NaN_count"] == 0 and zero_d["Inf_count"] == 0


def test_statistics_of_strided_tensors(debuggers, tmp_path):
    base = torch.arange(12.0).reshape(3, 4) - 5
    views = [base.t(), base[:, :1].expand(3, 5), base.reshape(3, 2, 2).permute(2, 0, 1)]
    debugger = debuggers(dump_path=str(tmp_path / "d"), level="L1")
    debugger.start()
    for view in views:
        rt.call("Torch.clone", torch.clone, view)
    debugger.stop()
    debugger.wait()
    data = read_step(tmp_path / "d")["dump.json"]["data"]
    for i, view in enumerate(views):
        record = data[f"Torch.clone.{i}.forward"]["input_args"][0]
        dense = view.contiguous()
        assert record["Max"] == dense.max().item() and record["Min"] == dense.min().item()
        assert record["Mean"] == pytest.approx(dense.mean().item(), abs=1e-6)
        assert record["Norm"] == pytest.approx(dense.norm().item(), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_statistics_of_many_small_tensors_reduced_together(debuggers, tmp_path, dtype):
    """Small tensors are copied into staging rows and reduced per size at the flush: more of them than a
    first buffer holds, several sizes, a NaN and an Inf, and a tensor changed in place after its call."""
    torch.manual_seed(0)
    tensors = [torch.randn(size).to(dtype) for size in [7, 64, 3 * 5, 4096] * 20]
    tensors[3][5] = float("nan")
    tensors[4][0] = float("inf")
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"dump_path": str(tmp_path / "d"), "level": "L1", "statistics": {"nan_inf_count": True}})
    )
    debugger = debuggers(config_path=str(config))
    debugger.start()
    for tensor in tensors:
        rt.call("Torch.clone", torch.clone, tensor)
    expected = [t.clone() for t in tensors]
    tensors[0].mul_(100)  # after the record: the record keeps the values at the call
    debugger.stop()
    debugger.wait()
    data = read_step(tmp_path / "d")["dump.json"]["data"]
    for i, tensor in enumerate(expected):
        record = data[f"Torch.clone.{i}.forward"]["input_args"][0]
        finite = tensor[torch.isfinite(tensor)].float()
        assert record["NaN_count"] == int(torch.isnan(tensor).sum()) and record["Inf_count"] == int(
            torch.isinf(tensor).sum()
        )
        if record["NaN_count"]:
            assert record["Max"] != record["Max"]  # NaN propagates, as in torch.amax
            continue
        assert record["Max"] == tensor.float().max().item() and record["Min"] == tensor.float().min().item()
        if record["Inf_count"]:
            continue
        tolerance = 1e-6 if dtype is torch.float32 else 1e-2
        assert record["Mean"] == pytest.approx(finite.mean().item(), rel=tolerance, abs=tolerance)
        assert record["Norm"] == pytest.approx(finite.norm().item(), rel=tolerance)


def test_small_tensors_in_and_out_of_inference_mode(debuggers, tmp_path):
    """A staging buffer is never made in inference mode, so records on either side of it keep working."""
    debugger = debuggers(dump_path=str(tmp_path / "d"), level="L1")
    debugger.start()
    with torch.inference_mode():
        rt.call("Torch.clone", torch.clone, torch.full((8,), 2.0))
    rt.call("Torch.clone", torch.clone, torch.full((8,), 3.0))
    with torch.inference_mode():
        rt.call("Torch.clone", torch.clone, torch.full((8,), 4.0))
    debugger.stop()
    debugger.wait()
    data = read_step(tmp_path / "d")["dump.json"]["data"]
    assert [data[f"Torch.clone.{i}.forward"]["input_args"][0]["Max"] for i in range(3)] == [2.0, 3.0, 4.0]
    assert debugger._collector.error_count == 0


def test_non_tensor_records(debuggers, tmp_path):
    x = torch.arange(12.0).reshape(3, 4)
    debugger = debuggers(dump_path=str(tmp_path / "d"), level="L1")
    debugger.start()
    rt.call("Tensor.__getitem__", torch.Tensor.__getitem__, x, (slice(0, 2, None), Ellipsis))
    rt.call("Torch.sum", torch.sum, x, 1, keepdim=True, dtype=torch.float64)
    rt.call("Tensor.view", x.view, torch.Size([4, 3]))
    rt.call("Torch.ones", torch.ones, (2,), device=torch.device("cpu"), dtype=None)
    debugger.stop()
    debugger.wait()
    data = read_step(tmp_path / "d")["dump.json"]["data"]
    getitem = data["Tensor.__getitem__.0.forward"]["input_args"]
    assert getitem[1] == [{"type": "slice", "value": [0, 2, None]}, {"type": "ellipsis", "value": "..."}]
    summed = data["Torch.sum.0.forward"]
    assert summed["input_args"][1] == {"type": "int", "value": 1}
    assert summed["input_kwargs"]["keepdim"] == {"type": "bool", "value": True}
    assert summed["input_kwargs"]["dtype"] == {"type": "torch.dtype", "value": "torch.float64"}
    view = data["Tensor.view.0.forward"]["input_args"]
    assert view[0]["shape"] == [3, 4]  # the bound method's tensor comes first, as msprobe records self
    assert view[1] == {"type": "torch.Size", "value": [4, 3]}
    ones = data["Torch.ones.0.forward"]
    assert ones["input_args"][0] == [{"type": "int", "value": 2}]
    assert ones["input_kwargs"]["device"] == {"type": "torch.device", "value": "cpu"}
    assert ones["input_kwargs"]["dtype"] is None


def test_operators_and_dyn_identity(debuggers, tmp_path):
    x = torch.ones(3)
    act = F.gelu
    calls = []

    def not_an_api(value):
        calls.append(value)
        return value

    debugger = debuggers(dump_path=str(tmp_path / "d"), level="L1")
    debugger.start()
    rt.add(x, 1)
    rt.add(2, x)
    y = rt.iadd(x.clone(), x)
    rt.eq(x, y)
    rt.lt(1, x)
    rt.sub(x, 1)
    rt.add(1, 2)
    rt.dyn(act, x)
    rt.dyn(x.abs)
    rt.dyn(not_an_api, x)
    debugger.stop()
    debugger.wait()
    names = list(read_step(tmp_path / "d")["dump.json"]["data"])
    for expected in [
        "Tensor.__add__.0.forward",
        "Tensor.__radd__.0.forward",
        "Tensor.__iadd__.0.forward",
        "Tensor.__eq__.0.forward",
        "Tensor.__gt__.0.forward",
        "Tensor.__sub__.0.forward",
        "Functional.gelu.0.forward",
        "Tensor.abs.0.forward",
    ]:
        assert expected in names, (expected, names)
    assert len(calls) == 1
    radd = read_step(tmp_path / "d")["dump.json"]["data"]["Tensor.__radd__.0.forward"]["input_args"]
    assert radd[0]["type"] == "torch.Tensor" and radd[1] == {"type": "int", "value": 2}


def test_call_indices_restart_each_step(debuggers, tmp_path):
    x = torch.ones(2)
    debugger = debuggers(dump_path=str(tmp_path / "d"), level="L1")
    for _ in range(2):
        debugger.start()
        rt.call("Torch.relu", torch.relu, x)
        rt.call("Torch.relu", torch.relu, x)
        debugger.stop()
        debugger.step()
    debugger.wait()
    for step in range(2):
        names = list(read_step(tmp_path / "d", step)["dump.json"]["data"])
        assert names == ["Torch.relu.0.forward", "Torch.relu.1.forward"]


def test_a_step_collected_in_two_parts_is_written_whole(debuggers, model_module, tmp_path):
    """stop() flushes, start() again in the same step goes on counting; step() without stop() hands the
    tables over. The step's files hold both parts, and the first part's entries are not changed by the second."""
    torch.manual_seed(0)
    model = model_module.Outer()
    x = torch.randn(2, 4, requires_grad=True)
    debugger = debuggers(dump_path=str(tmp_path / "d"), level="mix")
    debugger.start(model)
    first = model_module.loss_of(model, x)
    debugger.stop()
    debugger.wait()
    part = read_step(tmp_path / "d")["dump.json"]["data"]
    debugger.start(model)
    second = model_module.loss_of(model, x)
    (first + second).backward()
    debugger.step()  # still collecting: flushed with the tables handed over
    rt.call("Torch.relu", torch.relu, x)  # step 1 begins with fresh tables
    debugger.stop()
    debugger.wait()
    whole = read_step(tmp_path / "d")["dump.json"]["data"]
    assert set(part) < set(whole)
    assert {name: whole[name] for name in part if name.endswith(".forward") or ".forward." in name} == {
        name: entry for name, entry in part.items() if name.endswith(".forward") or ".forward." in name
    }
    assert "Functional.gelu.1.forward" in whole and "Functional.gelu.1.backward" in whole
    assert "Module.inner.Inner.forward.1" in whole and "Module.inner.Inner.backward.1" in whole
    assert list(read_step(tmp_path / "d", 1)["dump.json"]["data"]) == ["Torch.relu.0.forward"]
    # the flush's own ops (statistics of staged tensors, the concatenation) are never recorded as the user's
    ours = {"cat", "stack", "amax", "amin", "mean", "copy_", "unbind", "isnan", "isinf", "to"}
    assert not [name for name in whole if name.split(".")[1] in ours]


@pytest.mark.parametrize("path", ["prepared", "writer thread"])
def test_a_flushed_backward_entry_is_not_changed_by_hooks_after_it(debuggers, model_module, tmp_path, path):
    """stop() flushes a backward entry that a later backward of the same step fills again (the same graph,
    after start()). The first part's file shows the first backward's gradients, whether the training thread
    made its message at once (the snapshot is not copied) or the writer thread writes it later (copied)."""
    import threading

    torch.manual_seed(0)
    model = model_module.Outer()
    x = torch.randn(2, 4)
    debugger = debuggers(dump_path=str(tmp_path / "d"), level="mix")
    release = threading.Event()
    if path == "writer thread":
        writer = debugger._writer
        writer.prepare = lambda job: job  # left to the writer thread, which waits until the second backward
        write = writer._write
        writer._write = lambda job: (release.wait(30), write(job))
    debugger.start(model)
    out = model(x)
    out.sum().backward(retain_graph=True)  # d(out) = 1
    debugger.stop()
    debugger.start(model)
    (out * 2).sum().backward()  # the same nodes' hooks again: d(out) = 2
    release.set()
    debugger.wait()
    part = read_step(tmp_path / "d")["dump.json"]["data"]
    [name] = [name for name in part if name.startswith("Module.seq.Sequential.backward")]
    assert part[name]["input"][0]["Max"] == 1.0
    debugger.stop()
    debugger.wait()
    assert read_step(tmp_path / "d")["dump.json"]["data"][name]["input"][0]["Max"] == 2.0


def test_stack_json(debuggers, tmp_path):
    x = torch.ones(2)
    debugger = debuggers(dump_path=str(tmp_path / "d"), level="L1")
    debugger.start()
    line = sys._getframe().f_lineno + 1  # the call's, on the next line
    rt.call("Torch.relu", torch.relu, x)
    debugger.stop()
    debugger.wait()
    stack = read_step(tmp_path / "d")["stack.json"]
    [(key, (names, lines))] = [(k, v) for k, v in stack.items() if "Torch.relu.0.forward" in v[0]]
    assert key.isdigit()
    assert lines[0].startswith(f"File {__file__}, line {line}, in test_stack_json, \n ")
    assert "torch.relu" in lines[0]
    assert all(".backward" not in name for entry in stack.values() for name in entry[0])


def test_construct_json(debuggers, model_module, tmp_path):
    construct = train_once(debuggers, model_module, tmp_path / "d", "mix")["construct.json"]
    assert construct["Module.inner.Inner.forward.0"] is None
    assert construct["Module.inner.fc.Linear.forward.0"] == "Module.inner.Inner.forward.0"
    assert construct["Functional.linear.0.forward"] == "Module.inner.fc.Linear.forward.0"
    assert construct["Module.seq.0.Linear.forward.0"] == "Module.seq.Sequential.forward.0"
    assert construct["Module.inner.fc.Linear.backward.0"] == "Module.inner.Inner.backward.0"
    assert not any("parameters_grad" in name for name in construct)
    l1 = train_once(debuggers, model_module, tmp_path / "l1", "L1")["construct.json"]
    assert l1 == {}


def test_tensor_task_saves_tensors(debuggers, model_module, tmp_path):
    result = train_once(debuggers, model_module, tmp_path / "d", "L1", task="tensor")
    dump = result["dump.json"]
    assert dump["task"] == "tensor"
    record = dump["data"]["Functional.gelu.0.forward"]["input_args"][0]
    assert record["data_name"] == "Functional.gelu.0.forward.input.0.pt"
    saved = torch.load(os.path.join(result["dir"], "dump_tensor_data", record["data_name"]))
    assert list(saved.shape) == record["shape"] and saved.max().item() == pytest.approx(record["Max"])


def test_error_inside_collection_is_logged_once_and_skipped(debuggers, tmp_path, caplog, monkeypatch):
    from msprobe_runtime import statistics

    def broken(self, t, kind=None):
        raise RuntimeError("statistics exploded")

    monkeypatch.setattr(statistics.StatBuffer, "add", broken)
    monkeypatch.setattr(statistics.StatBuffer, "native", broken)  # the native op's paths, where it serves

    class BrokenRecorder:
        def records(self, values):
            broken(self, values)

        def clear(self):
            pass

        def forget(self):
            pass

        def observe_backward(self, *where):
            pass

    monkeypatch.setattr(statistics.StatBuffer, "native_recorder", lambda self, below, keep: BrokenRecorder())
    calls = []

    def api(x):
        calls.append(x)
        return x * 2

    x = torch.ones(2)
    debugger = debuggers(dump_path=str(tmp_path / "d"), level="L1")
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        debugger.start()
        results = [rt.call("Torch.relu", api, x) for _ in range(3)]
        debugger.stop()
        debugger.wait()
    assert len(calls) == 3 and all(torch.equal(r, x * 2) for r in results)
    messages = [r.getMessage() for r in caplog.records if "statistics exploded" in r.getMessage()]
    assert len(messages) == 1
    data = read_step(tmp_path / "d")["dump.json"]["data"]
    assert not any(name.startswith("Torch.relu") and name.endswith("forward") for name in data)


def test_user_exception_propagates_once(debuggers, tmp_path):
    calls = []

    def failing(x):
        calls.append(x)
        raise ValueError("user error")

    debugger = debuggers(dump_path=str(tmp_path / "d"), level="L1")
    debugger.start()
    with pytest.raises(ValueError, match="user error"):
        rt.call("Torch.relu", failing, torch.ones(1))
    debugger.stop()
    assert len(calls) == 1


def test_existing_dump_is_refused_not_overwritten(debuggers, tmp_path):
    x = torch.ones(2)
    first = debuggers(dump_path=str(tmp_path / "d"), level="L1")
    first.start()
    rt.call("Torch.relu", torch.relu, x)
    first.stop()
    first.wait()
    path = read_step(tmp_path / "d")["dir"]
    before = open(os.path.join(path, "dump.json")).read()
    second = debuggers(dump_path=str(tmp_path / "d"), level="L1")
    with pytest.raises(DumpPathError, match="already holds a dump"):
        second.start()
    assert rt.shims._collector is None
    assert open(os.path.join(path, "dump.json")).read() == before


@pytest.mark.parametrize("parts", [("with space", "a+b"), ("x y+z", "++")])
def test_any_path_works(debuggers, tmp_path, parts):
    dump = tmp_path.joinpath(*parts)
    debugger = debuggers(dump_path=str(dump), level="L1")
    debugger.start()
    rt.call("Torch.relu", torch.relu, torch.ones(2))
    debugger.stop()
    debugger.wait()
    assert "Torch.relu.0.forward" in read_step(dump)["dump.json"]["data"]


def test_config_json(tmp_path):
    from msprobe_runtime.config import ConfigError, load_config

    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "task": "statistics",
                "dump_path": str(tmp_path / "out"),
                "rank": [0, "2-3"],
                "step": ["1-3", 5],
                "level": "mix",
                "async_dump": True,
                "statistics": {"scope": [], "list": ["relu"], "data_mode": ["forward"], "summary_mode": "statistics"},
            }
        )
    )
    config = load_config(str(path))
    assert config.rank == [0, 2, 3] and config.step == [1, 2, 3, 5] and config.level == "mix"
    assert config.list == ["relu"] and config.data_mode == ["forward"]
    assert load_config(str(path), level="L1", step=[0]).level == "L1"
    with pytest.raises(ConfigError, match="level"):
        load_config(str(path), level="L7")
    with pytest.raises(ConfigError, match="dump_path"):
        load_config(task="statistics")


def test_step_list_and_data_mode_filters(tmp_path, debuggers):
    x = torch.ones(2, requires_grad=True)
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "dump_path": str(tmp_path / "d"),
                "step": [1],
                "level": "L1",
                "statistics": {"list": ["relu"], "data_mode": ["forward"]},
            }
        )
    )
    debugger = debuggers(config_path=str(config))
    for _ in range(2):
        debugger.start()
        y = rt.call("Torch.relu", torch.relu, x)
        rt.call("Torch.tanh", torch.tanh, y).sum().backward()
        debugger.stop()
        debugger.step()
    debugger.wait()
    assert not os.path.exists(tmp_path / "d" / "step0")
    assert list(read_step(tmp_path / "d", 1)["dump.json"]["data"]) == ["Torch.relu.0.forward"]


def test_seed_all_repeats_random_numbers():
    import random

    rt.seed_all(7)
    first = (random.random(), torch.rand(3))
    rt.seed_all(7, mode=True)
    try:
        second = (random.random(), torch.rand(3))
        assert os.environ["PYTHONHASHSEED"] == "7" and os.environ["HCCL_DETERMINISTIC"] == "true"
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
    assert first[0] == second[0] and torch.equal(first[1], second[1])


def test_shims_forward_only_when_not_collecting():
    assert rt.shims._collector is None
    x = torch.ones(2)
    assert torch.equal(rt.call("Torch.relu", torch.relu, x), x)
    assert rt.add(1, 2) == 3 and rt.dyn(len, [1, 2]) == 2


def test_scope_and_rank_filters(tmp_path, debuggers):
    x = torch.ones(2)
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "dump_path": str(tmp_path / "d"),
                "level": "L1",
                "statistics": {"scope": ["Torch.tanh.0.forward", "Torch.sigmoid.0.forward"]},
            }
        )
    )
    debugger = debuggers(config_path=str(config))
    debugger.start()
    for fn in (torch.relu, torch.tanh, torch.exp, torch.sigmoid, torch.neg):
        rt.call(f"Torch.{fn.__name__}", fn, x)
    debugger.stop()
    debugger.wait()
    names = list(read_step(tmp_path / "d")["dump.json"]["data"])
    assert names == ["Torch.tanh.0.forward", "Torch.exp.0.forward", "Torch.sigmoid.0.forward"]
    other_rank = tmp_path / "rank.json"
    other_rank.write_text(json.dumps({"dump_path": str(tmp_path / "r"), "level": "L1", "rank": [3]}))
    debugger = debuggers(config_path=str(other_rank))
    debugger.start()  # no process group: rank filters apply only under one, so this process collects
    rt.call("Torch.relu", torch.relu, x)
    debugger.stop()
    debugger.wait()
    assert "Torch.relu.0.forward" in read_step(tmp_path / "r")["dump.json"]["data"]


def test_nothing_of_torch_is_patched_while_collecting(debuggers, model_module, tmp_path):
    import torch.distributed
    import torch.nn.modules.module as nn_module

    namespaces = [torch, F, torch.Tensor, torch.nn.Module, torch.distributed, torch.autograd]

    def attributes():
        return [{name: id(value) for name, value in vars(space).items()} for space in namespaces]

    before = attributes()
    model = model_module.Outer()
    debugger = debuggers(dump_path=str(tmp_path / "d"), level="mix")
    debugger.start(model)
    during = attributes()
    assert F.gelu is torch._C._nn.gelu
    model_module.loss_of(model, torch.randn(2, 4)).backward()
    # only forward hooks, and no backward hook anywhere (module, global, or inserted node)
    assert not nn_module._global_backward_hooks and not nn_module._global_backward_pre_hooks
    assert all(not m._backward_hooks and not m._backward_pre_hooks for m in model.modules())
    debugger.stop()
    assert during == before
    assert attributes() == before
    assert not nn_module._global_forward_hooks and not nn_module._global_forward_pre_hooks


def test_autograd_graph_is_the_same_node_for_node(debuggers, model_module, tmp_path):
    def graph(loss):
        # seen holds the nodes: before torch 2.13 a freed node object gives its id to the next (docs/versions.md)
        names, stack, seen = [], [loss.grad_fn], {}
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen[id(node)] = node
            names.append(node.name())
            stack.extend(child for child, _ in node.next_functions)
        return names

    torch.manual_seed(0)
    model = model_module.Outer()
    x = torch.randn(2, 4)
    plain = graph(model_module.loss_of(model, x))
    debugger = debuggers(dump_path=str(tmp_path / "d"), level="mix")
    debugger.start(model)
    collected = graph(model_module.loss_of(model, x))
    debugger.stop()
    assert collected == plain
    assert not any("BackwardHook" in name for name in collected)


def test_uninstrumented_code_is_observed_with_msprobe_names(debuggers, tmp_path):
    """Code that was not rewritten (this test file, torch's modules) is seen through the scoped mode."""
    x, y = torch.ones(3), torch.full((3,), 2.0)
    layer = torch.nn.Linear(3, 3)
    debugger = debuggers(dump_path=str(tmp_path / "d"), level="mix")
    debugger.start(torch.nn.Sequential(layer))
    z = x + y
    z += x
    mask = z > 0
    layer(z)
    F.gelu(z)
    debugger.stop()
    debugger.wait()
    names = list(read_step(tmp_path / "d")["dump.json"]["data"])
    for expected in [
        "Tensor.__add__.0.forward",
        "Tensor.__iadd__.0.forward",
        "Tensor.__gt__.0.forward",
        "Functional.linear.0.forward",
        "Module.0.Linear.forward.0",
        "Functional.gelu.0.forward",
    ]:
        assert expected in names, (expected, names)
    assert mask.all()
