"""torch.compile on rewritten programs (fixtures/compiled/cases.py, inductor on the CPU): with no debugger, Dynamo
compiles exactly what it compiles for the original program, and collecting at L0, L1 or mix changes neither its
graphs (frames compiled, so recompilations; graph breaks; graphs; calls captured) nor a bit of any output or
gradient. Each compiled call made from eager code is one entry at its boundary; nothing inside it is recorded.

The five runs (original, rewritten with collection off, at L0, L1 and mix) take 20 to 40 s two at a time, plus the
rewritten megatron-core copy (tests/conftest.py) that the megatron case imports."""

import glob
import json
import os

import pytest

from .conftest import LEVELS

pytestmark = pytest.mark.slow  # five interpreters compiling with inductor

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

CASES = ("blocks", "submodule", "in_place", "function", "megatron")
STEPS = 3


def _get(case_runs, variant):
    result, error, dump = case_runs[variant]
    assert result is not None, f"{variant} failed:\n{error}"
    return result, dump


def _entries(dump, case, step):
    [path] = glob.glob(os.path.join(str(dump), case, f"step{step}", "*", "dump.json"))
    with open(path) as handle:
        return json.load(handle)["data"]


@pytest.mark.parametrize("case", CASES)
def test_collection_off_is_invisible_to_dynamo(case_runs, case):
    original, _ = _get(case_runs, "original")
    off, _ = _get(case_runs, "off")
    assert original["cases"][case]["dynamo"]["graph_breaks"] == 0  # the programs compile whole as written
    assert off["cases"][case]["dynamo"] == original["cases"][case]["dynamo"]
    assert off["cases"][case]["digests"] == original["cases"][case]["digests"]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("case", CASES)
def test_collection_never_breaks_nor_recompiles_a_compiled_region(case_runs, case, level):
    original, _ = _get(case_runs, "original")
    collected, _ = _get(case_runs, level)
    assert collected["cases"][case]["dynamo"] == original["cases"][case]["dynamo"]
    assert collected["cases"][case]["digests"] == original["cases"][case]["digests"]
    assert [line for line in collected["stderr"].splitlines() if "msprobe_runtime" in line] == []


# (case, level) -> (entries each step must hold, entries no step may hold: calls inside a compiled region)
BOUNDARIES = {
    ("blocks", "L1"): (
        ["Compiled.Sequential.0.forward", "Compiled.Sequential.0.backward"],
        ["Functional.linear.0.forward", "Functional.gelu.0.forward", "Tensor.__add__.0.forward"],
    ),
    ("blocks", "mix"): (
        ["Compiled.Sequential.0.forward", "Compiled.Sequential.0.backward", "Module.0.fc.Linear.parameters_grad.0"],
        ["Functional.linear.0.forward", "Module.0.Block.forward.0", "Module.0.fc.Linear.forward.0"],
    ),
    ("blocks", "L0"): (["Module.3.fc.Linear.parameters_grad.0"], ["Module.0.Block.forward.0"]),
    # block 1 compiled, called from this file's loop; tail.1 compiled, called by nn.Sequential (torch's code)
    ("submodule", "L1"): (
        [
            "Compiled.Block.0.forward",
            "Compiled.Block.1.forward",
            "Compiled.Block.0.backward",
            "Functional.linear.2.forward",
        ],
        ["Functional.linear.3.forward", "Functional.gelu.3.forward"],
    ),
    ("submodule", "mix"): (
        [
            "Module.blocks.1.Block.forward.0",
            "Module.blocks.1.Block.backward.0",
            "Module.tail.1.Block.forward.0",
            "Module.blocks.0.fc.Linear.forward.0",
            "Module.blocks.1.fc.Linear.parameters_grad.0",
            "Functional.linear.2.forward",
        ],
        [
            "Module.blocks.1.fc.Linear.forward.0",
            "Module.tail.1.fc.Linear.forward.0",
            "Functional.linear.3.forward",
            "Compiled.Block.0.forward",
        ],
    ),
    ("submodule", "L0"): (
        ["Module.blocks.1.Block.forward.0", "Module.tail.1.Block.backward.0"],
        ["Module.blocks.1.fc.Linear.forward.0"],
    ),
    ("in_place", "L1"): (
        ["Compiled.Block.0.forward", "Compiled.Block.0.backward", "Functional.linear.0.forward"],
        ["Functional.linear.1.forward"],
    ),
    ("in_place", "mix"): (
        ["Module.second.Block.forward.0", "Module.second.Block.backward.0", "Module.first.fc.Linear.forward.0"],
        ["Module.second.fc.Linear.forward.0"],
    ),
    ("in_place", "L0"): (["Module.second.Block.forward.0"], ["Module.second.fc.Linear.forward.0"]),
    ("function", "L1"): (
        ["Compiled.make_fused_fused_residual.0.forward", "Compiled.make_fused_fused_residual.0.backward"],
        ["Torch.tanh.0.forward", "Tensor.clamp.0.forward", "Tensor.__setitem__.0.forward"],
    ),
    ("function", "mix"): (
        ["Compiled.make_fused_fused_residual.0.forward", "Module.fc.Linear.forward.0"],
        ["Torch.tanh.0.forward", "Tensor.clamp.0.forward"],
    ),
    ("function", "L0"): (["Module.fc.Linear.forward.0"], ["Compiled.make_fused_fused_residual.0.forward"]),
    ("megatron", "L1"): (
        [
            "Megatron.bias_gelu_impl.0.forward",
            "Megatron.bias_swiglu_impl.0.forward",
            "Megatron.bias_dropout_add_fused_train.0.forward",
            "Megatron.bias_dropout_add_fused_train.0.backward",
        ],
        ["Megatron.bias_gelu.0.forward", "Functional.dropout.0.forward"],
    ),
    ("megatron", "mix"): (
        ["Megatron.bias_dropout_add_fused_train.0.forward", "Module.fc1.Linear.forward.0"],
        ["Functional.dropout.0.forward"],
    ),
    ("megatron", "L0"): (["Module.fc2.Linear.backward.0"], ["Megatron.bias_dropout_add_fused_train.0.forward"]),
}


@pytest.mark.parametrize("case, level", sorted(BOUNDARIES))
def test_a_compiled_call_is_one_entry_at_its_boundary(case_runs, case, level):
    _, dump = _get(case_runs, level)
    present, absent = BOUNDARIES[(case, level)]
    for step in range(STEPS):
        data = _entries(dump, case, step)
        assert [name for name in present if name not in data] == [], (step, sorted(data))
        assert [name for name in absent if name in data] == [], (step, sorted(data))
        for name in present:
            if name.startswith(("Compiled.", "Megatron.")) and name.endswith(".forward"):
                entry = data[name]  # inputs and outputs, with statistics
                assert entry["output"] and entry["output"][0]["type"] == "torch.Tensor", entry
                assert entry["output"][0]["Max"] is not None and entry["input_args"], entry
