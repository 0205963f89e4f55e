"""mix on the torch-op path (``MSPROBE_NATIVE_STATS=0``: no native op, so backward.py's Python hooks and its
Python graph walk serve, as on an accelerator or a torch the op does not build on) records every module
backward entry the native path records: the same names, the same shapes, and no ``hook failed`` warning.

What it would have caught (issue 31): on the device machine (torch 2.11) mix logged ``module backward hook
failed (RuntimeError: The size of tensor a (2048) must match the size of tensor b (5632) ...)`` four times a
step on a transformers Llama, and those records were missing. The Python walk told autograd nodes apart by the
ids of Python objects it let go (before torch 2.13 a node's Python object lives only while referenced), so it
summed gradients of nodes that do not consume the input. On torch 2.11 (CPU) this test fails with that walk
(``git show 25e9ee3^:runtime/backward.py``): ``size of tensor a (16) must match ... b (128)``, the tiny Llama's
sequence and intermediate sizes. On 2.13 a node's Python object lives as long as the node, so the same walk
passes here: tests/runtime/test_graph_walk.py recycles node objects as 2.11 does to catch it on this torch.

The whole realworld suite runs on the torch-op path with ``MSPROBE_NATIVE_STATS=0`` in the environment (the
fixture's subprocesses inherit it): ``make test-torch-ops``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.reproducible_env import REPRODUCIBLE

pytestmark = pytest.mark.slow

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "fixtures" / "transformers_models" / "train_tiny.py"
STEPS = 2


def _run(dump, native):
    """The tiny Llama (hidden 64, intermediate 128: an input and an output of different sizes in each MLP) at
    mix, its modules hooked by ``start(model)`` (no rewrite: module records need none)."""
    env = {k: v for k, v in os.environ.items() if k != "MSPROBE_NATIVE_STATS"}
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MSPROBE_NATIVE_STATS="1" if native else "0", **REPRODUCIBLE
    )
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--arch", "llama", "--steps", str(STEPS), "--level", "mix", "--dump", str(dump)],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stderr


def _module_backward(dump, step):
    """``{entry name: (shapes of its input field, shapes of its output field)}`` of a step's module backward
    entries."""
    folders = [p for p in (Path(dump) / f"step{step}").iterdir() if p.is_dir()]
    assert len(folders) == 1, folders
    data = json.loads((folders[0] / "dump.json").read_text())["data"]

    def shapes(items):
        return [item.get("shape") if isinstance(item, dict) else item for item in items]

    return {
        name: (shapes(entry.get("input", [])), shapes(entry.get("output", [])))
        for name, entry in data.items()
        if name.startswith("Module.") and ".backward." in name
    }


def test_mix_on_the_torch_op_path_records_every_module_backward(tmp_path):
    torch_ops = _run(tmp_path / "torch-ops", native=False)
    warnings = [line for line in torch_ops.splitlines() if "msprobe_runtime" in line]
    assert not warnings, "\n".join(warnings[:10])
    native = _run(tmp_path / "native", native=True)
    assert not [line for line in native.splitlines() if "hook failed" in line]
    for step in range(STEPS):
        python_path = _module_backward(tmp_path / "torch-ops", step)
        native_path = _module_backward(tmp_path / "native", step)
        # every module of the model has a backward entry: 2 layers of 9 modules with a backward, and more
        assert len(native_path) >= 20, sorted(native_path)
        assert sorted(python_path) == sorted(native_path), sorted(set(native_path) ^ set(python_path))
        different = {
            name: (python_path[name], native_path[name])
            for name in native_path
            if python_path[name] != native_path[name]
        }
        assert not different, different
        mlp = [name for name in native_path if ".mlp.LlamaMLP." in name]
        assert mlp and all(python_path[name][1] == [[BATCH, SEQ, 64]] for name in mlp), {
            name: python_path[name] for name in mlp
        }


BATCH, SEQ = 2, 16  # train_tiny's batch and sequence
