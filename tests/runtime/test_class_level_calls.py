"""PrecisionDebugger used the way msprobe's docs use it across files: built once in one module, reached from
another with class-level calls (start, stop, step, save, set_init_step) or by ``PrecisionDebugger()``."""

import glob
import json
import os
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import msprobe_runtime  # noqa: E402
from msprobe_runtime import PrecisionDebugger  # noqa: E402

SETUP = """
from msprobe_runtime import PrecisionDebugger

def build(dump_path):
    return PrecisionDebugger(dump_path=dump_path, level="L1")
"""

TRAIN = """
import torch
from msprobe_runtime import PrecisionDebugger

def train(steps):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    PrecisionDebugger.set_init_step(5)
    for _ in range(steps):
        PrecisionDebugger.start(model)
        loss = torch.relu(model(torch.randn(3, 4))).sum()
        PrecisionDebugger.save(loss, "loss")
        loss.backward()
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
    return PrecisionDebugger()  # no arguments: the debugger already built, as msprobe's singleton
"""


def _module(tmp_path, name, source):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(tmp_path))
    try:
        __import__(name)
    finally:
        sys.path.remove(str(tmp_path))
    return sys.modules.pop(name)


def test_built_in_one_module_driven_from_another(tmp_path):
    setup = _module(tmp_path, "ms_setup_mod", SETUP)
    train = _module(tmp_path, "ms_train_mod", TRAIN)
    debugger = setup.build(str(tmp_path / "dump"))
    assert train.train(2) is debugger
    debugger.wait()
    assert debugger.current_step == 7
    steps = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "dump" / "step*")))
    assert steps == ["step5", "step6"]
    [dump] = glob.glob(str(tmp_path / "dump" / "step6" / "*" / "dump.json"))
    with open(dump) as handle:
        names = list(json.load(handle)["data"])
    assert "Functional.linear.0.forward" in names and "Torch.relu.0.forward" in names
    [debug] = glob.glob(str(tmp_path / "dump" / "step6" / "*" / "debug.json"))
    with open(debug) as handle:
        assert list(json.load(handle)["data"]) == ["loss.0.debug", "loss_grad.0.debug"]


def test_the_instance_keeps_its_own_calls(tmp_path):
    """Two debuggers in one process stay independent: an instance's calls are its own, the class reaches the
    one built last."""
    first = PrecisionDebugger(dump_path=str(tmp_path / "a"), level="L1")
    second = PrecisionDebugger(dump_path=str(tmp_path / "b"), level="L1")
    assert first is not second and PrecisionDebugger() is second
    first.set_init_step(3)
    PrecisionDebugger.set_init_step(9)
    assert (first.current_step, second.current_step) == (3, 9)


def test_class_level_call_before_any_debugger_says_so(monkeypatch):
    monkeypatch.setattr(PrecisionDebugger, "_instance", None)
    with pytest.raises(RuntimeError, match="needs a PrecisionDebugger built first"):
        PrecisionDebugger.start()
    with pytest.raises(RuntimeError, match="built first"):
        msprobe_runtime.module_dump_end()


def test_set_init_step_refuses_what_msprobe_refuses(tmp_path):
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1")
    for bad in (-1, 1.0, "2", True):
        with pytest.raises(ValueError):
            debugger.set_init_step(bad)
