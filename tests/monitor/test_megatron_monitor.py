"""TrainerMon in Megatron-LM's own training loop (fixtures/megatron_gpt/train_loop.py, CPU, gloo): megatron-core's
DistributedDataParallel with main_grad and overlap_grad_reduce, 2 microbatches a step, with megatron-core's
optimizer (not a torch optimizer: its step is wrapped on the instance, runtime/monitor/optimizers.py) and with
AdamW over main_grad.

- training is bit-identical with the monitor on: every microbatch's loss, every main_grad, megatron's grad norm;
- figures for every parameter of every layer, each step; grad_unreduced and grad_reduced equal the statistics of
  the step's accumulated main_grad (both microbatches: read after megatron's accumulator hook);
- the monitor's only host read is one ``tolist`` per collected step;
- two data-parallel ranks (torchrun, megatron's tp and dp groups given to set_monitor): grad_unreduced is each
  rank's own gradient, read before megatron scales the bucket by 1/dp and all-reduces it (the mean of the two
  ranks' unreduced means is the reduced mean), including the last parameter of each bucket, whose reduction
  megatron starts inside its own accumulator hook (runtime/monitor/megatron_ddp.py); grad_reduced is written by
  dp rank 0 only (msprobe's de-duplication).
"""

import concurrent.futures
import csv
import glob
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.reproducible_env import training_env

pytestmark = pytest.mark.slow  # megatron-core's training loop in fresh interpreters

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "fixtures" / "megatron_gpt" / "train_loop.py"
STEPS = 3
PARAMS = 2 + 12 * 2 + 2 + 1  # embeddings, 2 layers of 12, final norm, output layer (test_training_loop.py)
OPS = ["min", "max", "norm", "zeros", "nans", "mean"]
CONFIG = {
    "targets": {},
    "wg_distribution": True,
    "param_distribution": True,
    "mv_distribution": True,
    "ur_distribution": True,
    "mg_direction": True,
    "ops": OPS,
    "ndigits": 12,
}
CONFIGS = {
    "overlap-megatron": ["--overlap-grad-reduce", "--recompute", "full", "--optimizer", "megatron"],
    "overlap-adamw": ["--overlap-grad-reduce", "--optimizer", "adamw"],
}


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _train(workdir, flags, monitor, ranks=1):
    workdir.mkdir(parents=True)
    command = [sys.executable, str(SCRIPT), "--steps", str(STEPS), *flags]
    if ranks > 1:
        port = _free_port()
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-port",
                   str(port), "--", *command[1:]]  # fmt: skip
    if monitor:
        (workdir / "config.json").write_text(json.dumps(CONFIG))
        command += ["--monitor", str(workdir / "config.json")]
    # the runtime under test: this interpreter's msprobe_runtime (PYTHONPATH as the tests run)
    env = training_env(os.environ.get("PYTHONPATH"), PYTHONWARNINGS="ignore", MONITOR_OUTPUT_DIR=str(workdir / "out"))
    env.pop("MASTER_PORT", None)
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=600, env=env)
    tail = f"rc {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-6000:]}"
    found = [json.loads(line[len("RESULT ") :]) for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or len(found) != ranks:
        return None, tail
    return sorted(found, key=lambda r: r["rank"]), tail


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("monitor-loop")
    jobs = {(config, monitor, 1): flags for config, flags in CONFIGS.items() for monitor in (False, True)}
    jobs[("overlap-megatron", True, 2)] = ["--overlap-grad-reduce", "--optimizer", "megatron", "--monitor-groups"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            key: pool.submit(_train, root / f"{key[0]}-{key[1]}-{key[2]}", flags, key[1], key[2])
            for key, flags in jobs.items()
        }
        return {key: future.result() for key, future in futures.items()}


def _get(runs, config, monitor, ranks=1):
    results, tail = runs[(config, monitor, ranks)]
    assert results is not None, f"{config} monitor={monitor} ranks={ranks} failed:\n{tail}"
    return results


def rows_of(folder, prefix):
    """{(name, step): {op: value}} over every ``{prefix}_a-b.csv`` in ``folder``."""
    found = {}
    for path in sorted(glob.glob(os.path.join(folder, f"{prefix}_[0-9]*.csv"))):
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                found[(row["name"], int(row["step"]))] = {op: float(row[op]) for op in OPS}
    return found


@pytest.mark.parametrize("config", list(CONFIGS))
def test_training_is_bit_identical_with_the_monitor_on(runs, config):
    (plain,) = _get(runs, config, False)
    (watched,) = _get(runs, config, True)
    assert len(plain["losses"]) == STEPS
    for key in ("losses", "digests", "stats", "grad_norms"):
        assert watched[key] == plain[key], key
    if config.endswith("megatron"):
        assert all(norm is not None for norm in watched["grad_norms"])


@pytest.mark.parametrize("config", list(CONFIGS))
def test_figures_for_every_layer_and_one_host_read_per_step(runs, config):
    (watched,) = _get(runs, config, True)
    monitor = watched["monitor"]
    assert monitor["collected"] == STEPS
    assert [read[:2] for read in monitor["reads"]] == [["tolist", "_flush"]] * STEPS
    # megatron's optimizer has no step hooks: its step is wrapped on the instance, and unwrapped by close()
    assert monitor["step_is_wrapped"] == config.endswith("megatron") and not monitor["step_after_close"]
    folder = monitor["dir"]
    for prefix in ("grad_unreduced", "grad_reduced", "param_origin", "param_updated", "other"):
        rows = rows_of(folder, prefix)
        assert len(rows) == PARAMS * STEPS, prefix
        for layer in (0, 1):
            assert any(f"decoder.layers.{layer}.mlp.linear_fc1.weight" in name for name, _ in rows), (prefix, layer)
    for prefix in ("exp_avg", "exp_avg_sq", "adam_update", "adam_ratio"):  # Adam's state exists from step 1
        rows = rows_of(folder, prefix)
        assert {step for _, step in rows} == set(range(1, STEPS)) and len(rows) == PARAMS * (STEPS - 1), prefix
        if prefix != "adam_ratio":  # m/sqrt(v) is 0/0 where a gradient was always zero (unused embedding rows)
            assert all(values["norm"] > 0 for values in rows.values()), prefix


@pytest.mark.parametrize("config", list(CONFIGS))
def test_gradients_are_the_steps_accumulated_main_grad(runs, config):
    """One rank: unreduced and reduced are both the accumulated main_grad the loop reports (max, min, mean, norm
    in float32): a read before megatron's hook added the last microbatch would miss half of it."""
    (watched,) = _get(runs, config, True)
    folder = watched["monitor"]["dir"]
    for prefix in ("grad_unreduced", "grad_reduced"):
        rows = rows_of(folder, prefix)
        for step, stats in enumerate(watched["stats"]):
            for key, (g_max, g_min, g_mean, g_norm) in stats.items():
                row = rows[(key.split("/", 1)[1], step)]
                scale = max(abs(g_max), abs(g_min))
                assert row["max"] == pytest.approx(g_max, rel=1e-6) and row["min"] == pytest.approx(g_min, rel=1e-6)
                assert row["norm"] == pytest.approx(g_norm, rel=1e-5), (prefix, key, step)
                assert abs(row["mean"] - g_mean) <= 1e-6 * scale, (prefix, key, step)


def test_two_data_parallel_ranks_read_unreduced_before_the_reduce(runs):
    ranks = _get(runs, "overlap-megatron", True, 2)
    unreduced = [rows_of(rank["monitor"]["dir"], "grad_unreduced") for rank in ranks]
    reduced = [rows_of(rank["monitor"]["dir"], "grad_reduced") for rank in ranks]
    assert len(unreduced[0]) == len(unreduced[1]) == len(reduced[0]) == PARAMS * STEPS
    # set_monitor(dp_group=...): as msprobe, only dp rank 0 writes the reduced gradient, the same on every rank
    assert reduced[1] == {}
    differ = 0
    for key, row in reduced[0].items():
        scale = max(abs(row["max"]), abs(row["min"]))
        # megatron averages over dp: the reduced mean is the mean of the ranks' unreduced means
        assert abs((unreduced[0][key]["mean"] + unreduced[1][key]["mean"]) / 2 - row["mean"]) <= 1e-6 * scale, key
        differ += unreduced[0][key]["norm"] != pytest.approx(row["norm"], rel=1e-3)
    assert differ == len(reduced[0])  # each rank's own batch: its gradient is not the average
    # and the loop's own report of the reduced main_grad agrees with grad_reduced
    for step, stats in enumerate(ranks[0]["stats"]):
        for key, (_, _, _, g_norm) in stats.items():
            assert reduced[0][(key.split("/", 1)[1], step)]["norm"] == pytest.approx(g_norm, rel=1e-5)
