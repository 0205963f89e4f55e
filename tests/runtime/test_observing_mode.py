"""The observing mode of a session started from uninstrumented code, around instrumented modules' calls."""

import glob
import json
import os

import pytest

torch = pytest.importorskip("torch")

import msprobe_runtime  # noqa: E402
from msprobe_runtime import PrecisionDebugger  # noqa: E402

LAYER = """
import torch


class Layer(torch.nn.Module):
    def __init__(self, stop_inside=None):
        super().__init__()
        self.stop_inside = stop_inside

    def forward(self, x):
        y = __msprobe__.call("Torch.tanh", torch.tanh, x)
        if self.stop_inside is not None:
            self.stop_inside.stop()
        return y
"""


def _layer_class():
    namespace = {"__msprobe__": msprobe_runtime}
    exec(compile(LAYER, "instrumented_layer.py", "exec"), namespace)
    return namespace["Layer"]


def _entries(dump):
    [directory] = glob.glob(os.path.join(str(dump), "step0", "*"))
    with open(os.path.join(directory, "dump.json")) as handle:
        return list(json.load(handle)["data"])


def test_set_aside_inside_an_instrumented_module_and_back_after(tmp_path):
    layer = _layer_class()()
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    debugger.start()  # from this uninstrumented test: the session's observing mode is pushed
    assert torch._C._len_torch_function_stack() == 1
    x = torch.ones(3)
    torch.relu(x)  # recorded by the mode
    layer(x)  # tanh recorded by its shim; the mode is set aside meanwhile
    assert torch._C._len_torch_function_stack() == 1  # and pushed back
    torch.sigmoid(x)  # recorded by the mode again
    debugger.stop()
    debugger.wait()
    assert torch._C._len_torch_function_stack() == 0
    assert _entries(tmp_path / "d") == ["Torch.relu.0.forward", "Torch.tanh.0.forward", "Torch.sigmoid.0.forward"]


def test_stop_inside_an_instrumented_forward_leaves_no_mode_behind(tmp_path):
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    layer = _layer_class()(stop_inside=debugger)
    debugger.start()
    layer(torch.ones(3))
    assert torch._C._len_torch_function_stack() == 0
    debugger.wait()
    assert _entries(tmp_path / "d") == ["Torch.tanh.0.forward"]
    # the call left open by that session holds no frame into the next one
    assert debugger._collector.anchors._open
    debugger.start()
    assert not debugger._collector.anchors._open and not debugger._collector.module_frames
    debugger.stop()
