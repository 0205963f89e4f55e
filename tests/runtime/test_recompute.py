"""Activation checkpointing runs a block's forward again inside backward, where the autograd engine keeps no
torch function mode of the caller's: the runtime pushes its observing mode again there, so the APIs of torch's
own modules are recorded in the recomputation too, forward and backward, as msprobe records them."""

import glob
import importlib.util
import json
import os

import pytest

torch = pytest.importorskip("torch")

from msprobe_runtime import PrecisionDebugger  # noqa: E402


@pytest.mark.parametrize("reentrant", [True, False])
def test_recomputed_torch_modules_are_observed(instrument, tmp_path, reentrant):
    path = instrument("fixtures/recompute/recompute.py")
    spec = importlib.util.spec_from_file_location("recompute_instrumented", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    block = module.Block()
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    debugger.start(block)
    module.step(block, reentrant)
    debugger.stop()
    debugger.wait()
    [dump] = glob.glob(os.path.join(str(tmp_path / "dump"), "step0", "*", "dump.json"))
    with open(dump) as handle:
        names = list(json.load(handle)["data"])
    forwards = [n for n in names if n.startswith("Functional.layer_norm.") and n.endswith(".forward")]
    backwards = [n for n in names if n.startswith("Functional.layer_norm.") and n.endswith(".backward")]
    assert len(forwards) == 2  # the forward, and its recomputation in backward
    assert backwards  # the recomputed call is the one whose graph backward runs through
    assert any(n.startswith("Functional.gelu.") and n.endswith(".backward") for n in names)
