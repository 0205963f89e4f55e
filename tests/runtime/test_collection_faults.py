"""An error of the runtime's own never reaches the training loop: it is logged once, and what it spoils is
written null rather than lost."""

import glob
import json
import logging
import os

import pytest

torch = pytest.importorskip("torch")

from msprobe_runtime import PrecisionDebugger  # noqa: E402
from msprobe_runtime import statistics  # noqa: E402


def test_a_failing_statistics_flush_leaves_training_alone(monkeypatch, tmp_path, caplog):
    def broken(self):
        raise RuntimeError("aten.cat.default got mixed torch.Tensor and DTensor")

    monkeypatch.setattr(statistics.StatBuffer, "take", broken)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1")
    # float64: reduced by torch ops at the flush (a float32 CPU tensor's numbers come from the native op at
    # the call, so a failing flush cannot spoil them)
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        debugger.start()
        y = torch.relu(x).sum()
        y.backward()
        debugger.stop()  # must not raise
        debugger.step()
    debugger.wait()
    assert "collecting the step's statistics failed" in caplog.text
    [path] = glob.glob(os.path.join(str(tmp_path / "dump"), "step0", "*", "dump.json"))
    with open(path) as handle:
        record = json.load(handle)["data"]["Torch.relu.0.forward"]["output"][0]
    assert record["shape"] == [3] and record["Max"] is None and record["Norm"] is None


def test_tensors_without_readable_data_are_recorded_with_null_statistics(tmp_path, caplog):
    """A meta tensor has no data, a sparse one no dense kernels: their records keep dtype and shape, the
    statistics are null, each kind is said once, and stop() and the training go on."""
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1")
    meta = torch.empty(3, 4, device="meta")
    sparse = torch.eye(3).to_sparse()
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        debugger.start()
        torch.relu(meta)
        torch.relu(meta)
        torch.abs(sparse)
        dense = torch.relu(torch.ones(2))
        debugger.stop()
    debugger.wait()
    assert dense.tolist() == [1.0, 1.0]
    [path] = glob.glob(os.path.join(str(tmp_path / "dump"), "step0", "*", "dump.json"))
    with open(path) as handle:
        data = json.load(handle)["data"]
    meta_record = data["Torch.relu.0.forward"]["input_args"][0]
    assert meta_record["shape"] == [3, 4] and meta_record["Max"] is None
    sparse_record = data["Torch.abs.0.forward"]["output"][0]
    assert sparse_record["shape"] == [3, 3] and sparse_record["Norm"] is None
    assert data["Torch.relu.2.forward"]["output"][0]["Max"] == 1.0
    assert caplog.text.count("meta tensors are recorded without statistics") == 1
    assert caplog.text.count("sparse_coo tensors are recorded without statistics") == 1
    assert "failed" not in caplog.text


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_statistic_torch_cannot_compute_nulls_the_statistics_not_the_entry(tmp_path, caplog, level):
    """torch has no amax for unsigned 16/32/64-bit tensors on the CPU: the entries that hold one keep every
    record, with dtype and shape and null statistics (the promise for what cannot be read), said once a dtype;
    the records beside them are whole."""
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level=level)
    unsigned = [torch.tensor([1, 2, 3]).to(dtype) for dtype in (torch.uint16, torch.uint32, torch.uint64)]
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        debugger.start(torch.nn.Identity())
        for t in unsigned + unsigned:
            torch.clone(t)
        mixed = torch.add(torch.ones(3), unsigned[1].to(torch.float32))
        debugger.stop()
    debugger.wait()
    assert mixed.tolist() == [2.0, 3.0, 4.0]
    [path] = glob.glob(os.path.join(str(tmp_path / "dump"), "step0", "*", "dump.json"))
    with open(path) as handle:
        data = json.load(handle)["data"]
    for k, t in enumerate(unsigned + unsigned):
        entry = data[f"Torch.clone.{k}.forward"]
        for record in (entry["input_args"][0], entry["output"][0]):
            assert record["dtype"] == str(t.dtype) and record["shape"] == [3]
            assert record["Max"] is None and record["Norm"] is None
    assert data["Torch.add.0.forward"]["output"][0]["Max"] == 4.0
    for name in ("uint16", "uint32", "uint64"):
        assert caplog.text.count(f"statistics of torch.{name} tensors cannot be computed") == 1
    assert "that record is skipped" not in caplog.text


def test_a_tensor_without_statistics_is_still_saved_with_task_tensor(tmp_path):
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1", task="tensor")
    t = torch.tensor([1, 2, 3], dtype=torch.uint32)
    debugger.start()
    torch.clone(t)
    debugger.stop()
    debugger.wait()
    [directory] = glob.glob(os.path.join(str(tmp_path / "dump"), "step0", "*"))
    with open(os.path.join(directory, "dump.json")) as handle:
        record = json.load(handle)["data"]["Torch.clone.0.forward"]["output"][0]
    assert record["Max"] is None and record["data_name"].endswith(".pt")
    saved = torch.load(os.path.join(directory, "dump_tensor_data", record["data_name"]), weights_only=True)
    assert saved.dtype == torch.uint32 and saved.tolist() == [1, 2, 3]


def test_a_dump_path_that_cannot_be_written_is_refused_at_start(tmp_path):
    """Found before the first step trains, not after the run as one warning per step."""
    from msprobe_runtime.debugger import DumpPathNotWritable

    occupied = tmp_path / "a_file"
    occupied.write_text("not a folder")
    debugger = PrecisionDebugger(dump_path=str(occupied / "dump"), level="L1")
    with pytest.raises(DumpPathNotWritable, match="cannot hold a dump"):
        debugger.start()
    assert occupied.read_text() == "not a folder"


def test_a_failing_parameter_gradient_record_leaves_the_gradients_alone(monkeypatch, tmp_path, caplog):
    """A parameter's post-accumulate-grad hook that fails inside the runtime is logged once; the backward
    finishes and every gradient is the one a run without the debugger computes."""
    from msprobe_runtime.collector import Collector

    def broken(self, prefix, param_name, param, grad):
        raise RuntimeError("a record that cannot be made")

    def run(debugger):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        if debugger is not None:
            debugger.start(model=model)
        model(torch.ones(5, 4)).square().sum().backward()
        if debugger is not None:
            debugger.stop()
            debugger.wait()
        return [param.grad.clone() for param in model.parameters()]

    expected = run(None)
    monkeypatch.setattr(Collector, "record_param_grad", broken)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        got = run(debugger)
    assert caplog.text.count("parameter gradient hook failed") == 1
    assert all(torch.equal(a, b) for a, b in zip(got, expected)) and len(got) == 4
    [path] = glob.glob(os.path.join(str(tmp_path / "dump"), "step0", "*", "dump.json"))
    with open(path) as handle:
        names = list(json.load(handle)["data"])
    assert "Module.0.Linear.forward.0" in names and not any("parameters_grad" in name for name in names)
