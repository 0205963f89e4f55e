"""Injected faults in a transformers Llama under TrainerMon (issue 35's test bullet): a tiny LlamaForCausalLM built
from a config in code (3 decoder layers, no network), trained by a plain loop with AdamW
(fixtures/monitor_capture/llama_loop.py), transformers instrumented on import (``msprobe-rewrite run --packages
transformers``: the deep capture's dump records the calls of instrumented code), each run a fresh interpreter.

The monitor: wg + param distributions, AnomalyNan and AnomalyTurbulence (threshold 3), the flight recorder and
``on_anomaly`` mix / anomalous / 1 step. The threshold: at the loop's learning rate (1e-4) the gradient norms of
the RMSNorm weights, tiny at initialisation, grow up to 2.3 times their running average within 30 clean steps, so
msprobe's turbulence rule at 0.5 fires in clean training; at 3 (a value beyond 4 times the average) a clean run
is quiet and the learning rate x1000 still fires (the weights' norms grow about 5 times in one step)."""

import glob
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.reproducible_env import training_env

pytestmark = pytest.mark.slow

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "fixtures" / "monitor_capture" / "llama_loop.py"
THRESHOLD = 3.0
CONFIG = {
    "wg_distribution": True,
    "param_distribution": True,
    "ops": ["min", "max", "norm", "nans"],
    "alert": {
        "rules": [{"rule_name": "AnomalyNan"}, {"rule_name": "AnomalyTurbulence", "args": {"threshold": THRESHOLD}}],
        "dump": True,
    },
    "flight_recorder": {"steps": 5},
    "on_anomaly": {"level": "mix", "scope": "anomalous", "steps": 1},
}
NAN_PARAM = "model.layers.1.mlp.up_proj.weight"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """``llama(name, *flags)`` -> (the RESULT json, the run's anomaly folder). Instrumented bytecode is kept in a
    module temporary folder (PYTHONPYCACHEPREFIX), so transformers is rewritten once for the module's runs."""
    prefix = tmp_path_factory.mktemp("bytecode")
    runtime_parent = os.path.dirname(importlib.util.find_spec("msprobe_runtime").submodule_search_locations[0])
    base = tmp_path_factory.mktemp("llama")
    config = base / "monitor.json"
    config.write_text(json.dumps(CONFIG))

    def run(name, *flags):
        folder = base / name
        folder.mkdir()
        env = training_env(
            os.pathsep.join([str(ROOT), runtime_parent]),
            PYTHONPYCACHEPREFIX=str(prefix),
            PYTHONWARNINGS="ignore",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            MONITOR_OUTPUT_DIR=str(folder / "monitor_output"),
        )
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.pop("MSPROBE_REWRITE_PACKAGES", None)
        command = [sys.executable, "-m", "msprobe_rewrite", "run", "--packages", "transformers", "--", str(SCRIPT)]
        command += ["--config", str(config), *flags]
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=900, env=env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        result = json.loads(done.stdout.split("RESULT ", 1)[1])
        result["stderr"] = done.stderr
        return result, folder / "monitor_output" / "anomaly_detected" / "rank0"

    return run


def _dump(rank_folder, fired_at, step):
    [path] = glob.glob(str(rank_folder / f"capture_step{fired_at}" / f"step{step}" / "*" / "dump.json"))
    with open(path) as handle:
        return json.load(handle)["data"]


def _check_capture(rank_folder, fired_at, steps, module):
    """The capture of the anomaly at ``fired_at``: its config lists ``module``, and the dump of each of ``steps``
    holds that module's forward, backward and the ``Functional.linear`` called inside it, and no other module."""
    entry = f"Module.{module}."
    config = json.loads((rank_folder / f"capture_step{fired_at}.config.json").read_text())
    assert config["statistics"] == {"list": [entry]} and config["level"] == "mix"
    for step in steps:
        data = _dump(rank_folder, fired_at, step)
        modules = {name for name in data if name.startswith("Module.")}
        assert f"{entry}Linear.forward.0" in modules, sorted(data)
        assert f"{entry}Linear.backward.0" in modules, sorted(data)
        assert all(name.startswith(entry) for name in modules), sorted(modules)  # no other layer's modules
        apis = [name for name in data if not name.startswith("Module.")]
        assert apis and all(name.startswith("Functional.linear.") for name in apis), apis  # the API inside it
    stepped = sorted(os.listdir(rank_folder / f"capture_step{fired_at}"))
    assert stepped == [f"step{step}" for step in steps]  # steps: 1, then stopped


def test_a_nan_in_one_decoder_layer_is_named_at_step_7_and_captured_in_that_layer(llama):
    result, rank_folder = llama("nan", "--steps", "10", "--nan-step", "7", "--nan-param", NAN_PARAM, "--replay")
    anomalies = result["anomalies"]
    assert anomalies and all(item["step"] >= 7 for item in anomalies)
    first = anomalies[0]
    assert first["step"] == 7
    assert first["tag_name"] == f"0:{NAN_PARAM}/rank0/param_origin"
    assert first["message"].startswith("Rule AnomalyNan")
    # the replay is step 7 of the dump, the next optimizer step 8
    _check_capture(rank_folder, 7, (7, 8), "model.layers.1.mlp.up_proj")
    replay = json.loads((rank_folder / "replay_step7.json").read_text())
    assert replay["verdict"] == "reproducible" and replay["anomaly"] == first
    assert "deep capture (level mix, list Module.model.layers.1.mlp.up_proj.)" in result["stderr"]


def _first_jump(names, norms, step, threshold):
    """The first parameter, in model order, whose weight norm after ``step``'s update is beyond (1 + threshold)
    times the running average (msprobe's, weight 0.99) of its norms after the earlier steps: msprobe's turbulence
    rule on param_updated, recomputed in float64 from the loop's own weights."""
    for index, name in enumerate(names):
        history = norms[0][index]
        for earlier in range(1, step):
            history = 0.99 * history + 0.01 * norms[earlier][index]
        if norms[step][index] > history * (1 + threshold):
            return name
    return None


def test_the_learning_rate_x1000_is_named_at_step_7_in_the_first_layer_that_jumps(llama):
    """The learning rate x1000 from step 7: the anomaly is at step 7, on ``param_updated`` (the weights after step
    7's update; the gradients of step 7 were computed before it and are sane, they jump at step 8). It names the
    first parameter, in execution order, whose updated weight norm jumps: recomputed here from the weights, the
    embedding (its unused rows get no update) stays below the threshold and the first decoder layer's q_proj is
    named. The capture (no replay) then dumps that module in step 8."""
    result, rank_folder = llama("lr", "--steps", "10", "--lr-step", "7", "--lr-factor", "1000")
    anomalies = result["anomalies"]
    assert anomalies and all(item["step"] >= 7 for item in anomalies)
    first = anomalies[0]
    assert first["step"] == 7 and first["message"].startswith("Rule AnomalyTurbulence")
    name = first["tag_name"].split("/")[0].split(":", 1)[1]
    assert first["tag_name"].endswith("/param_updated")
    assert not any(item["tag_name"].endswith(("/acc_grad", "/post_grad")) for item in anomalies if item["step"] == 7)
    expected = _first_jump(result["names"], result["norms"], 7, THRESHOLD)
    assert expected is not None and name == expected
    assert _first_jump(result["names"], result["norms"], 6, THRESHOLD) is None  # and nothing before
    _check_capture(rank_folder, 7, (8,), name.rpartition(".")[0])


def test_a_clean_run_of_30_steps_raises_nothing_and_trains_bit_identically(llama):
    watched, rank_folder = llama("clean", "--steps", "30")
    plain, _ = llama("plain", "--steps", "30", "--no-monitor")
    assert watched["collected"] == 30
    assert watched["anomalies"] == []
    assert sorted(os.listdir(rank_folder)) == ["anomaly.json"]  # no capture, no recorder file
    assert "anomal" not in watched["stderr"] and "capture" not in watched["stderr"]
    assert len(watched["losses"]) == 30 and watched["losses"] == plain["losses"]
    assert watched["norms"] == plain["norms"]
