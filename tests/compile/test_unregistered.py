"""A function first compiled while collecting, in a process that loaded Dynamo only then (a library compiling
lazily, at its first call). The runtime registers its polyfills as Dynamo's import ends (a post-import finder), so
the function compiles once, whole. Where that finder did not see the import (another finder before it took it),
Dynamo traces the shims themselves: the collector's entries are then the plain calls (no record inside, no graph
break), and the function compiles once more at most, when collection stops and the polyfills are registered;
later starts and stops recompile nothing. In new interpreters: registration is once per process."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("libcst")

pytestmark = pytest.mark.slow  # a new interpreter that loads Dynamo

MODEL = """
import torch


def body(x):
    y = x * 2 + 1
    y = y.clamp(-3.0, 3.0)
    return torch.tanh(y)


def call_compiled(fn, x):
    return fn(x)
"""

SCRIPT = """
import json, sys
import msprobe_runtime
from msprobe_runtime import PrecisionDebugger, compiled_regions
import torch

sys.path.insert(0, sys.argv[1])
import compiled_model

debugger = PrecisionDebugger(dump_path=sys.argv[2], level="L1")
x = torch.linspace(-2, 2, 8)
expected = torch.tanh((x * 2 + 1).clamp(-3.0, 3.0))
assert "torch._dynamo" not in sys.modules
debugger.start()
if sys.argv[3] == "finder-bypassed":
    sys.meta_path[:] = [finder for finder in sys.meta_path if type(finder).__name__ != "_WhenDynamoLoads"]
import torch._dynamo  # loaded inside the window
from torch._dynamo.utils import counters
fn = torch.compile(compiled_model.body, backend="eager")
first = compiled_model.call_compiled(fn, x)
registered_while_collecting = bool(compiled_regions.POLYFILLED)
debugger.stop()
debugger.step()
outs = [first]
for _ in range(4):
    debugger.start()
    outs.append(compiled_model.call_compiled(fn, x))
    debugger.stop()
    debugger.step()
    outs.append(compiled_model.call_compiled(fn, x))
debugger.wait()
print(json.dumps({"registered_while_collecting": registered_while_collecting,
                  "registered": bool(compiled_regions.POLYFILLED),
                  "equal": all(torch.equal(out, expected) for out in outs),
                  "frames": dict(counters["frames"]),
                  "graph_breaks": sum(counters["graph_break"].values())}))
"""


@pytest.mark.parametrize("finder", ["finder-bypassed", "finder-in-place"])
def test_a_function_compiled_while_collecting_after_dynamo_was_loaded(tmp_path, finder):
    from msprobe_rewrite.api import rewrite_source

    (tmp_path / "compiled_model.py").write_bytes(rewrite_source(MODEL.encode()))
    (tmp_path / "script.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "script.py"), str(tmp_path), str(tmp_path / "dump"), finder],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["registered"] is True
    assert result["equal"] and result["graph_breaks"] == 0
    if finder == "finder-in-place":
        assert result["registered_while_collecting"] is True
        assert result["frames"] == {"total": 1, "ok": 1}, result
    else:
        assert result["registered_while_collecting"] is False
        assert result["frames"]["total"] <= 2, result  # the first trace, and one more once registered
    for step in range(5):
        data = json.loads(next((tmp_path / "dump" / f"step{step}").glob("*/dump.json")).read_text())["data"]
        assert list(data) == ["Compiled.body.0.forward"], (step, list(data))  # nothing from inside
    assert "msprobe_runtime" not in done.stderr
