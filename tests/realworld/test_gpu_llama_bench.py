"""bench/gpu_llama.py's CPU mode (``make bench`` runs it): every variant of issue 31's table is measured, the
CPU's n/a where a figure needs CUDA, and ours at L1 and mix record tensors whose ATen ops the profiler counted.
Run on the torch-op path (no native op, no Triton), where a recorded tensor costs ATen ops: the figure that
carries to an accelerator."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ["plain", "DIY TorchFunctionMode", "rewritten, off", "ours L1", "ours mix", "ours L1 fingerprint"]


def test_cpu_mode_measures_every_variant(tmp_path):
    out = tmp_path / "figures.json"
    env = dict(os.environ, MSPROBE_NATIVE_STATS="0", MSPROBE_TRITON="0")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, str(ROOT / "bench" / "gpu_llama.py"), "--device", "cpu", "--size", "tiny"]
    command += ["--steps", "1", "--rounds", "1", "--warmup", "1", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    table = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| variant | step ms | x plain | host ms | host syncs in fwd+bwd |")
    names = [line.split(" | ")[0][2:] for line in table[1:]]
    assert names[: len(VARIANTS)] == VARIANTS
    rows = json.loads(out.read_text())["rows"]
    for name in VARIANTS:
        row = rows[name]
        assert row["step_ms"] > 0 and row["host_ms"] > 0, name
        assert row["same_grads"] == "yes", name  # the CPU's steps are bit-identical
        assert "syncs" not in row and row["launches"] is None, name  # CUDA only: n/a in the table
    for line in table[1:]:
        if line.startswith("| plain |"):
            assert line.split(" | ")[4:7] == ["n/a", "n/a", "n/a"]
    assert rows["rewritten, off"]["compute_ops"] == rows["plain"]["compute_ops"]  # off adds no op
    for name in ("ours L1", "ours mix"):
        row = rows[name]
        assert row["entries"] > 0 and row["tensors"] >= row["entries"] / 2, name
        assert row["compute_ops"] > rows["plain"]["compute_ops"] and row["aten_ops"] >= row["compute_ops"], name
        assert row["per_tensor"] == (row["compute_ops"] - rows["plain"]["compute_ops"]) / row["tensors"]
    assert rows["ours mix"]["entries"] > rows["ours L1"]["entries"]
    assert "msprobe L1" in names and "msprobe mix" in names  # measured, or said why not


def test_cpu_mode_stands_in_for_the_device_path(tmp_path):
    """``--stats triton-dispatch``: ours on the device path (the native lane, Triton's kernels through the fake
    driver) in bf16; every variant's gradients equal plain's, and ours record every entry and tensor the CPU path
    records of the bf16 model."""
    pytest.importorskip("triton")
    figures = {}
    for stats in ("default", "triton-dispatch"):
        out = tmp_path / f"{stats}.json"
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        command = [sys.executable, str(ROOT / "bench" / "gpu_llama.py"), "--device", "cpu", "--size", "tiny"]
        command += ["--steps", "1", "--rounds", "1", "--warmup", "1", "--stats", stats, "--dtype", "bfloat16"]
        command += ["--json", str(out)]
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        figures[stats] = json.loads(out.read_text())["rows"]
    rows = figures["triton-dispatch"]
    for name in VARIANTS:
        assert rows[name]["same_grads"] == "yes", name
    for name in ("ours L1", "ours mix", "ours L1 fingerprint"):
        assert rows[name]["entries"] == figures["default"][name]["entries"] > 0, name
        assert rows[name]["tensors"] == figures["default"][name]["tensors"], name
