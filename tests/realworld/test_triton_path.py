"""A transformers Llama in bfloat16 recorded through the Triton kernels (the path of a CUDA tensor; here under
Triton's interpreter on CPU tensors) writes what the torch-op path writes: the same entries, every statistic of
every tensor present where the torch ops have one (its attention mask's too: padding), Max and Min equal, Mean and
Norm to the rounding of bfloat16 and of float32 sums; its inputs read after their call where the call leaves them
alone (runtime/call_effects.py) are those of the call (no null, no "changed an input" warning); and the losses equal
the plain run's. The records made by the native op's lane onto the kernels (``TritonStats.attach``, the path of a
CUDA tensor where the op builds) are those of the Python path, bit for bit.

What it would catch: a batched launch whose table sends a program to the wrong tensor or row (wrong numbers), an
input of a real model's call read after it and found changed (null statistics, the warning), records lost on the
device path. A call that changes its input in place is tests/runtime/test_triton_stats.py's: this model makes none.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.reproducible_env import REPRODUCIBLE

pytestmark = pytest.mark.slow

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 2

SCRIPT = """
import glob, json, os, sys, tempfile
import torch, transformers
import msprobe_runtime
from msprobe_runtime import collector, statistics

path, level, dump = sys.argv[1], sys.argv[2], sys.argv[3]
if path == "triton":
    collector.StatBuffer = lambda counts: statistics.StatBuffer(counts, native=False, triton_cpu=True)
elif path == "lane":  # the records made by the native op's Recorder, queued for the kernels, as on a GPU
    collector.StatBuffer = lambda counts: statistics.StatBuffer(counts, triton_cpu="lane")
elif path == "torch_ops":
    collector.StatBuffer = lambda counts: statistics.StatBuffer(counts, native=False)
torch.manual_seed(0)
config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False,
    pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="sdpa")
model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
ids = torch.randint(3, 128, (2, 32))
mask = torch.ones(2, 32, dtype=torch.long)
mask[1, :5] = 0  # padding: transformers builds bool masks (the lane's integer records), not SDPA's causal flag
debugger = None
if path != "plain":
    config = None
    if len(sys.argv) > 5:  # a summary_mode (fingerprint: every record hashed too)
        config = os.path.join(tempfile.mkdtemp(), "config.json")
        with open(config, "w") as handle:
            json.dump({"statistics": {"summary_mode": sys.argv[5]}}, handle)
    debugger = msprobe_runtime.PrecisionDebugger(config_path=config, dump_path=dump, level=level, task="statistics")
losses = []
for step in range(int(sys.argv[4])):
    if debugger is not None:
        debugger.start(model)
    loss = model(input_ids=ids, labels=ids, attention_mask=mask).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if debugger is not None:
        debugger.stop()
        debugger.step()
    losses.append(loss.detach().float().item())
if debugger is not None:
    debugger.wait()
print(json.dumps(losses))
"""


def _run(tmp_path, path, level, *summary_mode):
    dump = tmp_path / f"{path}_{level}{''.join(summary_mode)}"
    env = {k: v for k, v in os.environ.items() if k not in ("MSPROBE_TRITON", "MSPROBE_NATIVE_STATS")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TRITON_INTERPRET="1", **REPRODUCIBLE)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, path, level, str(dump), str(STEPS), *summary_mode],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "changed an input in place" not in done.stderr
    assert "Triton statistics kernels failed" not in done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), dump


def _records(dump, step):
    """``{(entry, path in it): record}`` of every tensor record of a step's dump.json."""
    [path] = (Path(dump) / f"step{step}").glob("*/dump.json")
    data = json.loads(path.read_text())["data"]
    found = {}

    def walk(value, where):
        if isinstance(value, dict):
            if "Max" in value:
                found[where] = value
                return
            for key, item in value.items():
                walk(item, where + (key,))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, where + (index,))

    for name, entry in data.items():
        walk(entry, (name,))
    return found


def _close(mine, theirs, record, key):
    if theirs is None or mine is None:
        return mine is None and theirs is None
    if math.isnan(theirs) or math.isnan(mine):
        return math.isnan(theirs) and math.isnan(mine)
    if key in ("Max", "Min"):
        return mine == theirs
    # two bfloat16 roundings of float32 sums that differ in their order: the root mean square bounds a mean's
    # and a norm's sum error
    elements = math.prod(record["shape"]) or 1
    rms = (record["Norm"] or 0.0) / math.sqrt(elements)
    return abs(mine - theirs) <= 2 * 2**-7 * abs(theirs) + 1e-4 * rms


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_the_triton_path_writes_the_torch_op_paths_numbers(tmp_path, level):
    plain, _ = _run(tmp_path, "plain", level)
    triton_losses, triton_dump = _run(tmp_path, "triton", level)
    torch_losses, torch_dump = _run(tmp_path, "torch_ops", level)
    lane_losses, lane_dump = _run(tmp_path, "lane", level)
    assert triton_losses == plain and torch_losses == plain and lane_losses == plain
    for step in range(STEPS):
        mine, theirs = _records(triton_dump, step), _records(torch_dump, step)
        assert sorted(mine) == sorted(theirs)
        assert len(mine) > 100
        wrong = [
            (where, key, mine[where][key], record[key])
            for where, record in theirs.items()
            for key in ("Max", "Min", "Mean", "Norm")
            if key in record and not _close(mine[where].get(key), record[key], record, key)
        ]
        assert not wrong, wrong[:10]
        [lane_file] = (Path(lane_dump) / f"step{step}").glob("*/dump.json")
        [triton_file] = (Path(triton_dump) / f"step{step}").glob("*/dump.json")
        assert json.loads(lane_file.read_text())["data"] == json.loads(triton_file.read_text())["data"]


def test_with_fingerprints_the_lane_writes_the_python_paths_dump(tmp_path):
    """summary_mode fingerprint at mix: the records the native op's lane makes with their fingerprints (queued with
    their statistics, one launch a call) are those of the kernels' Python path, bit for bit, every tensor hashed;
    and the losses are the plain run's."""
    plain, _ = _run(tmp_path, "plain", "mix")
    lane_losses, lane_dump = _run(tmp_path, "lane", "mix", "fingerprint")
    triton_losses, triton_dump = _run(tmp_path, "triton", "mix", "fingerprint")
    assert lane_losses == plain and triton_losses == plain
    for step in range(STEPS):
        [lane_file] = (Path(lane_dump) / f"step{step}").glob("*/dump.json")
        [triton_file] = (Path(triton_dump) / f"step{step}").glob("*/dump.json")
        lane = json.loads(lane_file.read_text())["data"]
        assert lane == json.loads(triton_file.read_text())["data"]
        hashed = [record.get("fingerprint") for record in _records(lane_dump, step).values()]
        assert len(hashed) > 100 and None not in hashed
