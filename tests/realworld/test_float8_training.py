"""An FP8 training run end to end (issue 36, item 4), on the CPU: a tiny `transformers` Llama trained 2 AdamW steps
with torchao's ``convert_to_float8_training`` (tensorwise dynamic scaling; torch._scaled_mm runs on the CPU),
transformers and torchao instrumented on import (fixtures/float8_training/train_fp8.py), each run a fresh
interpreter:

- bit-identical: with every decoder linear in float8, each step's loss and every gradient's bytes at mix equal
  the same training run plainly (no hook, no debugger);
- the dump carries the float8 statistics: torchao's Float8TrainingTensor operands of each ``Torch.mm`` are read
  through their data and scale (e4m3 forward, e5m2 gradients), with ``fp8_scale`` and both fractions;
- compare, bf16 run against FP8 run (only layer 1's MLP in float8, one weight outlier in its up_proj that flushes
  the rest of that weight to zero in e4m3): the first suspect is that up_proj, with the underflow inside it named.
"""

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.reproducible_env import REPRODUCIBLE

pytestmark = pytest.mark.slow  # four training runs, each in a fresh interpreter

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("torchao.float8")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "fixtures" / "float8_training" / "train_fp8.py"
TIMEOUT = 900
UP_PROJ = "Module.model.layers.1.mlp.up_proj.Float8Linear.forward.0"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("float8_training")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "MSPROBE_REWRITE_PACKAGES")}
    env.update(
        PYTHONPYCACHEPREFIX=str(workdir / "bytecode"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        **REPRODUCIBLE,
    )
    done = {}

    def _run(name, *args, level="none"):
        if name not in done:
            argv = [str(SCRIPT), *args, "--level", level]
            if level != "none":
                argv = [
                    "-m",
                    "msprobe_rewrite",
                    "run",
                    "--packages",
                    "transformers,torchao",
                    "--",
                    *argv,
                    "--dump",
                    str(workdir / name),
                ]
            result = subprocess.run(
                [sys.executable, *argv], cwd=workdir, env=env, capture_output=True, text=True, timeout=TIMEOUT
            )
            assert result.returncode == 0, result.stderr[-6000:]
            assert "msprobe_runtime" not in result.stderr, result.stderr[-6000:]  # no warning of ours
            done[name] = (json.loads(result.stdout.strip().splitlines()[-1]), workdir / name)
        return done[name]

    return _run


def _records(dump):
    """Every tensor record of every dump.json under ``dump``."""
    out = []

    def walk(value):
        if isinstance(value, dict):
            if "dtype" in value and "shape" in value:
                out.append(value)
            else:
                for item in value.values():
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for path in glob.glob(os.path.join(str(dump), "step*", "*", "dump.json")):
        with open(path) as handle:
            walk(json.load(handle)["data"])
    return out


def test_fp8_training_is_bit_identical_and_dumps_float8_statistics(run):
    plain, _ = run("fp8-plain", "--recipe", "fp8")
    collected, dump = run("fp8-mix", "--recipe", "fp8", level="mix")
    assert "Float8Linear" in collected["modules"]
    assert collected["losses"] == plain["losses"]
    assert collected["grads"] == plain["grads"]
    scaled = [r for r in _records(dump) if "fp8_scale" in r]
    assert {r["dtype"] for r in scaled} == {"torch.float8_e4m3fn", "torch.float8_e5m2"}
    for record in scaled:
        assert isinstance(record["fp8_scale"], float) and record["fp8_scale"] > 0
        assert 0 <= record["fp8_zero_fraction"] <= 1 and 0 < record["fp8_saturated_fraction"] <= 1
        assert isinstance(record["Max"], float) and isinstance(record["Norm"], float)
        # tensorwise scaling maps the largest magnitude to the format's max: the dequantized Max or -Min is
        # that max times the scale
        top = {"torch.float8_e4m3fn": 448.0, "torch.float8_e5m2": 57344.0}[record["dtype"]]
        assert max(record["Max"], -record["Min"]) == pytest.approx(top * record["fp8_scale"], rel=1e-6)


def test_compare_names_the_layer_whose_float8_underflow_explains_the_divergence(run):
    from msprobe_rewrite.compare import compare_runs

    _, fp8 = run("fp8-layer1-mlp", "--recipe", "fp8", "--only", "model.layers.1.mlp", "--outlier", level="mix")
    _, bf16 = run("bf16", "--recipe", "bf16", "--outlier", level="mix")
    summary = compare_runs(str(fp8), str(bf16))
    first = summary["first_suspect"]
    assert first["entry"] == UP_PROJ and first["step"] == 0
    assert first["bench_entry"] == "Module.model.layers.1.mlp.up_proj.Linear.forward.0"
    assert "input.1 in run A: 99.99 % of its float8 elements are zero" in first["fp8_underflow"]
