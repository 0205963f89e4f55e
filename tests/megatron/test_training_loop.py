"""Megatron-LM's own training loop (fixtures/megatron_gpt/train_loop.py) on the rewritten megatron-core, with
``debugger.start(model_list)``: model chunks in a list, each wrapped in megatron-core's DistributedDataParallel
(gradients in param.main_grad, through megatron's hooks on the gradient accumulators), get_forward_backward_func()
with 2 microbatches a step, activation recomputation with dropout on, megatron-core's optimizer or AdamW over
main_grad; 3 steps on CPU with gloo, with torch.compile on (Dynamo enabled: megatron's ``@jit_fuser`` functions
compiled by inductor in the fused configuration).

- bit-identical at L0, L1 and mix: every microbatch's loss, every parameter's main_grad each step, the grad
  norm, equal both the same run from the rewritten package without collection and the unmodified package, and
  torch.compile compiles the same graphs in all of them (no graph break, no recompilation: tests/compile);
- the dump holds each chunk's attention and MLP modules, forward and backward (L0, mix), the APIs inside them,
  forward and backward (L1, mix);
- parameters_grad is taken from main_grad, as msprobe takes it for Megatron: one entry per microbatch per
  parameter, the last one holding the statistics of the step's accumulated main_grad.

Two configurations: overlap_grad_reduce on with full recompute and megatron-core's optimizer, and overlap off
with selective recompute and AdamW. A mix run of each with every statistic read afresh (MSPROBE_STATS_REUSE=0)
gives the same dump as the run that serves some again. The ten rewritten runs and the two unmodified baselines run two
at a time
(50 to 75 s on 2 cores, plus the rewritten copy of megatron-core, which tests/conftest.py makes once per session:
about 20 s cold).
"""

import concurrent.futures
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.reproducible_env import training_env

pytestmark = pytest.mark.slow  # megatron-core's training loop in ten fresh interpreters

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "fixtures" / "megatron_gpt" / "train_loop.py"
SITE_MEGATRON = Path(importlib.util.find_spec("megatron.core").submodule_search_locations[0]).parent
MICROBATCHES = 2
STEPS = 3
LAYERS = 2

CONFIGS = {
    # megatron's fused bias-GELU and bias-dropout-add: @jit_fuser, torch.compile (inductor), as users run them
    "overlap-full-megatron": ["--overlap-grad-reduce", "--recompute", "full", "--optimizer", "megatron", "--fusion"],
    "sync-selective-adamw": ["--recompute", "selective", "--optimizer", "adamw"],
}
LEVELS = ("L0", "L1", "mix")


def _train(workdir, flags, level, copy, **extra_env):
    """One run of the fixture; ``(result dict or None, error text)``. ``copy``: the rewritten package first."""
    env = training_env(copy, PYTHONWARNINGS="ignore", **extra_env)
    env.pop("MASTER_PORT", None)
    command = [
        sys.executable,
        str(SCRIPT),
        "--where",
        "--microbatches",
        str(MICROBATCHES),
        "--steps",
        str(STEPS),
        *flags,
        "--level",
        level,
    ]
    if level != "none":
        command += ["--dump", str(workdir / "dump")]
    workdir.mkdir(parents=True)
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=600, env=env)
    tail = f"rc {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-6000:]}"
    if result.returncode != 0:
        return None, tail
    where = [line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("megatron ")]
    expected = str(copy) if copy is not None else str(SITE_MEGATRON)
    if not where or not all(path.startswith(expected + os.sep) for path in where):
        return None, f"megatron.core imported from {where}, expected under {expected}\n{tail}"
    results = [json.loads(line[len("RESULT ") :]) for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if len(results) != 1:
        return None, f"expected one RESULT line\n{tail}"
    failures = [line for line in result.stderr.splitlines() if "msprobe_runtime" in line]
    return {**results[0], "runtime_log": failures}, tail


@pytest.fixture(scope="module")
def runs(megatron_copy, tmp_path_factory):
    """{(config, level, package): (result or None, error text, dump dir)}; package "plain" is the unmodified
    megatron-core, "rewritten" the copy, "read afresh" the copy with no statistic served again. The twelve runs
    go two at a time."""
    root = tmp_path_factory.mktemp("loop")
    jobs = {}
    for config, flags in CONFIGS.items():
        jobs[(config, "none", "plain")] = (flags, "none", None)
        for level in ("none",) + LEVELS:
            jobs[(config, level, "rewritten")] = (flags, level, megatron_copy)
        jobs[(config, "mix", "read afresh")] = (flags, "mix", megatron_copy, {"MSPROBE_STATS_REUSE": "0"})
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            key: pool.submit(_train, root / "-".join(key), *job[:3], **(job[3] if len(job) > 3 else {}))
            for key, job in jobs.items()
        }
        out = {key: future.result() for key, future in futures.items()}
    for key in out:
        out[key] = (*out[key], root / "-".join(key) / "dump")
    return out


def _get(runs, config, level, package="rewritten"):
    result, error, dump = runs[(config, level, package)]
    assert result is not None, f"{config} {level} {package} failed:\n{error}"
    return result, dump


def _compared(result):
    """What must be equal bit for bit, and what torch.compile did (frames compiled, graph breaks, graphs)."""
    return {key: result[key] for key in ("losses", "digests", "stats", "grad_norms", "dynamo")}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_unmodified_baseline_trains(runs, config):
    """The loop itself: 3 steps of 2 microbatches, every parameter's main_grad, finite, not all zero."""
    plain, _ = _get(runs, config, "none", "plain")
    assert len(plain["losses"]) == STEPS and all(len(step) == MICROBATCHES for step in plain["losses"])
    assert all(math.isfinite(float.fromhex(loss)) for step in plain["losses"] for loss, _ in step)
    # embeddings 2, per layer 12 (two norms and four linears, weight and bias), final norm 2, output layer 1
    assert len(plain["digests"]) == STEPS and len(plain["digests"][0]) == 2 + 12 * LAYERS + 2 + 1
    assert all(max(abs(v) for v in stats[:2]) > 0 for step in plain["stats"] for stats in step.values())
    assert plain["losses"][0] != plain["losses"][1] and plain["digests"][0] != plain["digests"][1]
    if "--fusion" in CONFIGS[config]:  # megatron's @jit_fuser functions compiled, each whole, once
        assert plain["dynamo"]["unique_graphs"] > 0 and plain["dynamo"]["graph_breaks"] == 0, plain["dynamo"]
        assert plain["dynamo"]["frames"]["total"] == plain["dynamo"]["unique_graphs"], plain["dynamo"]
    if "megatron" in CONFIGS[config]:  # megatron-core's optimizer reports the grad norm (clip_grad=0: unclipped)
        assert len(plain["grad_norms"]) == STEPS and all(norm is not None for norm in plain["grad_norms"])
    rewritten, _ = _get(runs, config, "none", "rewritten")
    assert _compared(rewritten) == _compared(plain)  # the rewritten package, nothing collecting


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_bit_identical_with_collection(runs, config, level):
    plain, _ = _get(runs, config, "none", "plain")
    quiet, _ = _get(runs, config, "none", "rewritten")
    collected, dump = _get(runs, config, level)
    assert not collected["runtime_log"], collected["runtime_log"]  # "msprobe_runtime: ... failed" and the like
    assert _compared(collected) == _compared(quiet)
    assert _compared(collected) == _compared(plain)
    for step in range(STEPS):
        assert (dump / f"step{step}" / "rank0" / "dump.json").is_file()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_no_hook_outlives_its_step(runs, config, level):
    """The biases that megatron's linear layers return (skip_bias_add) are module outputs: at L0 and mix each step
    hooks them, and nothing of it is left on them after the run (it was one hook a step)."""
    plain, _ = _get(runs, config, "none", "plain")
    collected, _ = _get(runs, config, level)
    assert plain["hooked_parameters"] == []
    assert collected["hooked_parameters"] == []


@pytest.mark.parametrize("config", list(CONFIGS))
def test_statistics_served_again_equal_those_read_afresh(runs, config):
    """Reuse (the last few tensors, a parameter read once a step) against every record read afresh
    (MSPROBE_STATS_REUSE=0), over megatron's microbatches, recomputation and optimizer, which writes the
    parameters between steps: the same dump, entry for entry."""
    _, dump = _get(runs, config, "mix")
    _, afresh = _get(runs, config, "mix", "read afresh")
    for step in range(STEPS):
        served, read = _load(dump, step)["data"], _load(afresh, step)["data"]
        assert list(served) == list(read)
        # megatron's attention passes torch.baddbmm an uninitialized buffer (beta=0.0: never read by the op), and
        # what memory it got differs from process to process: its statistics are not the program's
        unset = [name for name in served if name.startswith("Torch.baddbmm.") and name.endswith(".forward")]
        assert unset, sorted(served)[:20]
        for name in unset:
            for entry in (served[name], read[name]):
                entry["input_args"][0] = {
                    key: value
                    for key, value in entry["input_args"][0].items()
                    if key in ("type", "dtype", "shape", "requires_grad")
                }
        assert [name for name in served if served[name] != read[name]] == [], step


def _load(dump, step, name="dump.json"):
    return json.loads((dump / f"step{step}" / "rank0" / name).read_text())


def _chunk_indices(runs, config):
    plain, _ = _get(runs, config, "none", "plain")
    return sorted({key.split("/", 1)[0] for key in plain["digests"][0]})


@pytest.mark.parametrize("level", ("L0", "mix"))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_dump_holds_each_chunks_attention_and_mlp_forward_and_backward(runs, config, level):
    _, dump = _get(runs, config, level)
    chunks = _chunk_indices(runs, config)
    assert chunks == ["0"]
    for step in range(STEPS):
        data = _load(dump, step)["data"]
        construct = _load(dump, step, "construct.json")
        for chunk in chunks:
            for layer in range(LAYERS):
                for path in (
                    "self_attention.SelfAttention",
                    "self_attention.core_attention.DotProductAttention",
                    "mlp.MLP",
                ):
                    for direction in ("forward", "backward"):
                        pattern = re.compile(
                            rf"Module\.{chunk}\.module\.decoder\.layers\.{layer}\.{re.escape(path)}"
                            rf"\.{direction}\.(\d+)$"
                        )
                        calls = [name for name in data if pattern.match(name)]
                        # one call per microbatch; full recompute runs the forward again in backward
                        assert len(calls) >= MICROBATCHES, (step, chunk, layer, path, direction, sorted(data)[:20])
                        if direction == "forward":
                            first = f"Module.{chunk}.module.decoder.layers.{layer}.{path}.forward.0"
                            assert construct.get(first, "").startswith(f"Module.{chunk}.module."), construct.get(first)
        if level == "mix":  # APIs inside the modules, forward and backward
            for direction in ("forward", "backward"):
                inside = [
                    name
                    for name in data
                    if not name.startswith("Module.")
                    and name.endswith(direction)
                    and ".mlp.MLP." in str(construct.get(name))
                ]
                assert inside, f"no {direction} API directly inside an MLP"


@pytest.mark.parametrize("config", list(CONFIGS))
def test_l1_dump_holds_apis_forward_and_backward(runs, config):
    """The APIs of attention, MLP and norms, forward and backward, including those the recomputation runs in
    backward: megatron's own calls (Torch.baddbmm) and those inside torch's modules (F.softmax in nn.Softmax,
    F.layer_norm in nn.LayerNorm, F.dropout in nn.Dropout), which msprobe records there too."""
    _, dump = _get(runs, config, "L1")
    for step in range(STEPS):
        data = _load(dump, step)["data"]
        assert not [name for name in data if name.startswith("Module.")]
        missing = []
        for api in ("Torch.baddbmm", "Functional.softmax", "Functional.layer_norm", "Functional.dropout"):
            for direction in ("forward", "backward"):
                # one a layer a microbatch at least; with recompute the first forward runs under no_grad and the
                # recomputed one (in backward) is the one whose backward runs
                calls = [name for name in data if re.fullmatch(rf"{re.escape(api)}\.\d+\.{direction}", name)]
                if len(calls) < MICROBATCHES * LAYERS:
                    missing.append(f"{api} {direction}: {len(calls)} calls")
        assert not missing, (step, missing)


def _close(a, b, scale):
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6 * scale)


@pytest.mark.parametrize("level", ("L0", "mix"))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_parameters_grad_taken_from_main_grad(runs, config, level):
    """msprobe records a Megatron parameter's gradient from main_grad after megatron's accumulation hook (one
    entry per microbatch, ``parameters_grad.{n}``); the last of a step therefore holds the step's main_grad,
    which the fixture reports after the gradients are finalized (data parallel 1: the reduction changes nothing)."""
    collected, dump = _get(runs, config, level)
    mismatches = []
    for step in range(STEPS):
        data = _load(dump, step)["data"]
        for key, (g_max, g_min, g_mean, g_norm) in collected["stats"][step].items():
            chunk, name = key.split("/", 1)
            path, param = name.rsplit(".", 1)
            pattern = re.compile(
                rf"Module\.{chunk}\.{re.escape(path)}\.[A-Za-z_][A-Za-z0-9_]*\.parameters_grad\.(\d+)$"
            )
            entries = sorted((int(m.group(1)), n) for n in data if (m := pattern.match(n)) and param in data[n])
            assert [index for index, _ in entries] == list(range(MICROBATCHES)), (step, key, entries)
            record = data[entries[-1][1]][param]
            scale = max(abs(g_max), abs(g_min))
            if not (
                record["Max"] == g_max
                and record["Min"] == g_min
                and _close(record["Mean"], g_mean, scale)
                and _close(record["Norm"], g_norm, scale)
            ):
                mismatches.append(
                    (
                        step,
                        entries[-1][1],
                        param,
                        {k: record[k] for k in ("Max", "Min", "Mean", "Norm")},
                        {"Max": g_max, "Min": g_min, "Mean": g_mean, "Norm": g_norm},
                    )
                )
    assert not mismatches, (
        f"{len(mismatches)} of {sum(len(s) for s in collected['stats'])} parameters_grad "
        f"entries do not hold main_grad; first: {mismatches[0]}"
    )
