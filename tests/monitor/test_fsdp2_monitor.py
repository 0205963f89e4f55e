"""TrainerMon on FSDP2 (``fully_shard``, DTensor parameters, 2 gloo ranks on CPU: fixtures/fsdp2/monitor_fsdp2.py).

- training is bit-identical with the monitor on (losses, every local gradient, the final weights);
- with ``dp_group`` the figures of each sharded parameter, gradient and Adam state are the global ones: equal, on
  both ranks, to those of the same model unsharded (trained on both ranks' batches) within float32 rounding,
  with the global shape;
- without it they are each rank's local shard's (the local shape; the two shards' norms make the global norm).
"""

import csv
import glob
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.reproducible_env import training_env

pytestmark = pytest.mark.slow  # two gloo ranks in fresh interpreters, three runs

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "fixtures" / "fsdp2" / "monitor_fsdp2.py"
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
KINDS = ("grad_reduced", "param_origin", "param_updated", "exp_avg", "exp_avg_sq", "adam_update", "adam_ratio", "other")


def _run(workdir, *flags):
    workdir.mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps(CONFIG))
    command = [sys.executable, str(SCRIPT), "--out", str(workdir / "out"), *flags]
    command = [part.replace("CONFIG", str(workdir / "config.json")) for part in command]
    env = training_env(os.environ.get("PYTHONPATH"), PYTHONWARNINGS="ignore")
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-6000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import concurrent.futures

    root = tmp_path_factory.mktemp("fsdp2-monitor")
    jobs = {
        "off": (),
        "global": ("--monitor", "CONFIG", "--dp-group", "--reference"),
        "local": ("--monitor", "CONFIG"),
    }
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {key: pool.submit(_run, root / key, *flags) for key, flags in jobs.items()}
        return {key: future.result() for key, future in futures.items()}


def rows_of(folder, prefix):
    found = {}
    for path in sorted(glob.glob(os.path.join(folder, f"{prefix}_[0-9]*.csv"))):
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                found[(row["name"], int(row["step"]))] = row
    return found


def test_training_is_bit_identical_with_the_monitor_on(runs):
    off = runs["off"][0]["ranks"]
    for key in ("global", "local"):
        on = runs[key][0]["ranks"]
        for rank in (0, 1):
            assert on[rank]["collected"] == 3
            for part in ("losses", "grads", "weights"):
                assert on[rank][part] == off[rank][part], (key, rank, part)


def test_global_figures_equal_the_unsharded_models(runs):
    result, log = runs["global"]
    reference = result["reference"]
    assert "not a plain tensor" not in log  # DTensor parameters are monitored, not skipped
    for prefix in KINDS:
        expected = rows_of(reference, prefix)
        assert len(expected) >= 16, prefix  # 8 parameters; Adam's state from step 1
        for rank in (0, 1):
            rows = rows_of(result["ranks"][rank]["monitor"], prefix)
            assert set(rows) == set(expected), (prefix, rank)
            for key, want in expected.items():
                got = rows[key]
                assert got["shape"] == want["shape"], (prefix, key)  # the global shape: [5, 16], not a shard's
                scale = max(abs(float(want["max"])), abs(float(want["min"])))
                for op in OPS:
                    # float32 rounding: the shards' partial sums, and weights a few ulps apart after Adam steps
                    assert abs(float(got[op]) - float(want[op])) <= 1e-5 * scale, (prefix, key, op, got, want)


def test_without_dp_group_the_figures_are_the_local_shards(runs):
    local, _ = runs["local"]
    glob_result, _ = runs["global"]
    shards = [rows_of(local["ranks"][rank]["monitor"], "param_origin") for rank in (0, 1)]
    whole = rows_of(glob_result["ranks"][0]["monitor"], "param_origin")
    assert shards[0][("head.weight", 0)]["shape"] == "[3, 16]"  # FSDP2 shards the 5 rows 3 and 2
    assert shards[1][("head.weight", 0)]["shape"] == "[2, 16]"
    for key, row in whole.items():
        norms = [float(shard[key]["norm"]) for shard in shards]
        assert math.hypot(*norms) == pytest.approx(float(row["norm"]), rel=1e-5), key
        assert min(float(shard[key]["min"]) for shard in shards) == float(row["min"]), key
    assert rows_of(local["ranks"][0]["monitor"], "grad_unreduced") == {}  # not yet under FSDP2 (docs/monitor.md)
