"""megatron-core under the import hook: its MLP with bias_activation_fusion runs with collection on (msprobe
raises ``Only support fusion of gelu and swiglu`` here), records the fused call and the MLP's modules, and
computes bit-identical outputs and gradients to the same run without the hook.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # megatron-core's MLP in fresh interpreters (about 17 s)

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "megatron_mlp" / "run_mlp.py"


def run(command, cwd):
    result = subprocess.run(
        [sys.executable, *command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return [line for line in result.stdout.splitlines() if line.split(" ", 1)[0] in ("loss", "input_grad", "grad")]


@pytest.mark.parametrize("gated, fused_api", [(False, "Megatron.bias_gelu_impl"), (True, "Megatron.bias_swiglu_impl")])
def test_mlp_under_the_hook_with_collection_is_bit_identical(tmp_path, gated, fused_api):
    flags = ["--gated"] if gated else []
    plain = run([str(SCRIPT), *flags], tmp_path)
    dump = tmp_path / "dump"
    hooked = run(
        ["-m", "msprobe_rewrite", "run", "--packages", "megatron", "--", str(SCRIPT), "--dump", str(dump), *flags],
        tmp_path,
    )
    assert len(plain) == 6 and hooked == plain
    data = json.loads(next(dump.glob("step0/*/dump.json")).read_text())["data"]
    for entry in (
        f"{fused_api}.0.forward",
        f"{fused_api}.0.backward",
        "Module.linear_fc1.ColumnParallelLinear.forward.0",
        "Module.linear_fc1.ColumnParallelLinear.backward.0",
        "Module.linear_fc2.RowParallelLinear.forward.0",
        "Module.linear_fc2.RowParallelLinear.backward.0",
        "Module.linear_fc1.ColumnParallelLinear.parameters_grad.0",
    ):
        assert entry in data, sorted(data)
    fused = data[f"{fused_api}.0.forward"]
    assert fused["input_args"][0]["type"] == "torch.Tensor" and fused["output"][0]["shape"][0] == 8
