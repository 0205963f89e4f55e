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
    x = torch.ones(3, requires_grad=True)
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
