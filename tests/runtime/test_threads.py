"""Calls from several threads inside one collected step: each is recorded once, with its own index. The
runtime's "own work" state (a call passes straight through while the runtime works) belongs to the thread that
does the work, so another thread's calls are never taken for it and dropped."""

import glob
import importlib.util
import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")

from msprobe_runtime import PrecisionDebugger  # noqa: E402


@pytest.mark.parametrize("round_", range(5))
def test_every_call_of_every_thread_is_recorded_once(instrument, tmp_path, round_):
    path = instrument("fixtures/threads/clones.py")
    spec = importlib.util.spec_from_file_location("clones_instrumented", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows, to meet every race
    try:
        debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1")
        debugger.start()
        module.run(4, 50)
        debugger.stop()
    finally:
        sys.setswitchinterval(interval)
    debugger.wait()
    [dump] = glob.glob(os.path.join(str(tmp_path / "dump"), "step0", "*", "dump.json"))
    with open(dump) as handle:
        names = [n for n in json.load(handle)["data"] if n.startswith("Torch.clone.")]
    assert sorted(names) == sorted(f"Torch.clone.{i}.forward" for i in range(250))
