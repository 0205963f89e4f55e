"""on_anomaly: a PrecisionDebugger dump of the module a rule named, started from the monitor, and the replay of
the step that says whether the anomaly comes back (runtime/monitor/deep_capture.py)."""

import glob
import importlib.util
import json
import logging
import os

import pytest
import torch

from fixtures.monitor_capture import loop

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPS = ["min", "max", "norm", "nans"]
RULES = [{"rule_name": "AnomalyNan"}, {"rule_name": "AnomalyTurbulence", "args": {"threshold": 0.5}}]
CAPTURE = {
    "wg_distribution": True,
    "param_distribution": True,
    "ops": OPS,
    "alert": {"rules": RULES, "dump": True},
    "flight_recorder": {"steps": 5},
    "on_anomaly": {"level": "mix", "scope": "anomalous", "steps": 1},
}
SPIKE = {
    "wg_distribution": True,
    "ops": OPS,
    "alert": {
        "rules": [
            {"rule_name": "AnomalyNan"},
            {"rule_name": "AnomalySpike", "args": {"k": 6, "window": 20, "warmup": 5}},
        ]
    },
    "on_anomaly": {"level": "mix", "scope": "anomalous", "steps": 1},
}


def _run(tmp_path, net, config, **options):
    return loop.train(str(tmp_path), net, config, **options)


def _rank_folder(tmp_path):
    return tmp_path / "monitor_output" / "anomaly_detected" / "rank0"


def _dump(tmp_path, fired_at, step):
    [path] = glob.glob(str(_rank_folder(tmp_path) / f"capture_step{fired_at}" / f"step{step}" / "*" / "dump.json"))
    with open(path) as handle:
        return json.load(handle)["data"]


def _layers(names):
    """The layer indices whose modules or APIs a dump holds (Module.layers.N...)."""
    return {int(name.split(".")[2]) for name in names if name.startswith("Module.layers.")}


@pytest.mark.slow
def test_a_nan_in_one_weight_is_captured_in_that_layer_and_replays_reproducible(tmp_path, net, caplog):
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        run = _run(tmp_path, net, CAPTURE, steps=12, fault=("nan", 7, "layers.1.fc.weight"), replay=True)
    first = run["monitor"].anomalies[0]
    assert first["step"] == 7 and first["tag_name"] == "0:layers.1.fc.weight/rank0/param_origin"
    config = json.loads((_rank_folder(tmp_path) / "capture_step7.config.json").read_text())
    assert config["statistics"] == {"list": ["Module.layers.1.fc."]} and config["level"] == "mix"
    for step in (7, 8):  # 7: the replay, 8: the next optimizer step
        data = _dump(tmp_path, 7, step)
        assert "Module.layers.1.fc.Linear.forward.0" in data
        assert any(name.startswith("Functional.linear.") for name in data)  # the API inside that module
        assert _layers(data) == {1}  # not layers.10, nor any other layer
        assert not any(name.startswith("Module.head.") for name in data)
        nan_input = data["Module.layers.1.fc.Linear.forward.0"]["input_args"]
        assert nan_input is not None
    assert not (_rank_folder(tmp_path) / "capture_step7" / "step9").exists()  # steps: 1, then stopped
    replay = json.loads((_rank_folder(tmp_path) / "replay_step7.json").read_text())
    assert replay["verdict"] == "reproducible", replay
    assert replay["anomaly"] == first
    assert "came back: reproducible" in caplog.text
    assert "deep capture (level mix, list Module.layers.1.fc.)" in caplog.text


@pytest.mark.slow
def test_the_learning_rate_x1000_is_captured_in_the_layer_named(tmp_path, net):
    plain = _run(tmp_path, net, None, steps=10, fault=("lr", 7, 1000.0))
    run = _run(tmp_path, net, CAPTURE, steps=10, fault=("lr", 7, 1000.0))
    # the dump started and stopped from the optimizer's hooks changes nothing in training
    assert all(torch.equal(a, b) for a, b in zip(plain["losses"], run["losses"]))
    assert all(torch.equal(a, b) for a, b in zip(plain["weights"][-1], run["weights"][-1]))
    first = run["monitor"].anomalies[0]
    assert first["step"] == 7 and first["message"].startswith("Rule AnomalyTurbulence")
    param = first["tag_name"].split("/")[0].split(":")[1]
    module = param.rpartition(".")[0]
    data = _dump(tmp_path, 7, 8)  # no replay: the capture starts at the next step
    assert f"Module.{module}.Linear.forward.0" in data
    named = {name.split(".Linear.")[0] for name in data if name.startswith("Module.")}
    assert named == {f"Module.{module}"}
    assert not glob.glob(str(_rank_folder(tmp_path) / "capture_step7" / "step7"))


@pytest.mark.slow
def test_a_one_off_fault_replays_transient_and_training_stays_bit_identical(tmp_path, net, caplog):
    fault = ("once", 7, "layers.3", 1000.0)
    plain = _run(tmp_path, net, None, steps=12, fault=fault)
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        run = _run(tmp_path, net, SPIKE, steps=12, fault=fault, replay=True)
    first = run["monitor"].anomalies[0]
    assert first["step"] == 7 and first["message"].startswith("Rule AnomalySpike")
    replay = json.loads((_rank_folder(tmp_path) / "replay_step7.json").read_text())
    assert replay["verdict"] == "transient", replay
    assert replay["replayed"] < replay["limit"] < replay["value"]
    assert "did not come back: transient" in caplog.text
    # the replay's forward and backward, and the dump, change nothing in training
    for a, b in zip(plain["losses"], run["losses"]):
        assert torch.equal(a, b)
    for a, b in zip(plain["weights"][-1], run["weights"][-1]):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_a_one_off_nan_that_adamw_applied_replays_reproducible(tmp_path, net):
    """The replay sees the weights after the step's update (docs/monitor.md): a NaN of one forward alone, once
    AdamW has applied its NaN gradient, is in the weights, and comes back."""
    run = _run(tmp_path, net, CAPTURE, steps=9, fault=("once", 7, "layers.3", float("nan")), replay=True)
    assert run["monitor"].anomalies[0]["step"] == 7
    assert not torch.isfinite(run["weights"][7][0]).all()
    replay = json.loads((_rank_folder(tmp_path) / "replay_step7.json").read_text())
    assert replay["verdict"] == "reproducible", replay


@pytest.mark.slow
def test_a_bad_batch_replays_reproducible(tmp_path, net):
    run = _run(tmp_path, net, SPIKE, steps=10, fault=("batch", 7, 100.0), replay=True)
    assert run["monitor"].anomalies[0]["step"] == 7
    replay = json.loads((_rank_folder(tmp_path) / "replay_step7.json").read_text())
    assert replay["verdict"] == "reproducible", replay


@pytest.mark.slow
def test_a_clean_run_of_30_steps_captures_nothing(tmp_path, net, caplog):
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        run = _run(
            tmp_path,
            net,
            {**CAPTURE, "alert": {"rules": RULES + SPIKE["alert"]["rules"][1:], "dump": True}},
            steps=30,
            replay=True,
        )
    assert run["monitor"].has_collect_times == 30
    assert run["monitor"].anomalies == []
    assert sorted(os.listdir(_rank_folder(tmp_path))) == ["anomaly.json"]
    assert "anomal" not in caplog.text and "capture" not in caplog.text


def test_a_replay_closure_must_be_callable(tmp_path, monkeypatch):
    from msprobe_runtime import TrainerMon
    from msprobe_runtime.config import ConfigError

    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"wg_distribution": True}))
    mon = TrainerMon(str(path), params_have_main_grad=False)
    with pytest.raises(ConfigError, match="set_replay"):
        mon.set_replay(42)


def _megatron(tmp_path, megatron_copy, config, *flags):
    """fixtures/megatron_gpt/monitor_loop.py with ``config`` and ``flags``, in a fresh interpreter -> its RESULT."""
    import subprocess
    import sys

    from fixtures.reproducible_env import training_env

    runtime_parent = os.path.dirname(
        importlib.util.find_spec("msprobe_runtime").submodule_search_locations[0]
    )  # this checkout's runtime, not an installed one
    path = tmp_path / "monitor.json"
    path.write_text(json.dumps(config))
    env = training_env(
        os.pathsep.join([str(megatron_copy), runtime_parent]),
        PYTHONWARNINGS="ignore",
        MONITOR_OUTPUT_DIR=str(tmp_path / "monitor_output"),
    )
    env.pop("MASTER_PORT", None)
    script = os.path.join(ROOT, "fixtures", "megatron_gpt", "monitor_loop.py")
    command = [sys.executable, script, "--config", str(path), *flags]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    result["stderr"] = done.stderr
    return result


@pytest.mark.slow
def test_megatron_gpt_training_loop_nan_is_captured_in_that_layer(tmp_path, megatron_copy):
    """fixtures/megatron_gpt/monitor_loop.py: the tiny GPT of megatron-core (rewritten), DDP chunk list with
    main_grad, get_forward_backward_func over 2 microbatches, AdamW; a NaN in layer 1's linear_fc1 at step 7."""
    # the NaN rule alone: msprobe's turbulence rule on the weights fires from step 1 on those megatron initialises
    # to zero (the biases: a running average of 0; MEGATRON_TURBULENCE below)
    config = {**CAPTURE, "alert": {"rules": RULES[:1], "dump": True}}
    result = _megatron(tmp_path, megatron_copy, config, "--steps", "9", "--nan-step", "7", "--replay")
    param = "0:module.decoder.layers.1.mlp.linear_fc1.weight"
    assert result["anomalies"][0]["step"] == 7
    assert result["anomalies"][0]["tag_name"] == f"{param}/rank0/param_origin"
    assert all(item["step"] >= 7 for item in result["anomalies"])
    module = "Module.0.module.decoder.layers.1.mlp.linear_fc1."
    for step in (7, 8):
        data = _dump(tmp_path, 7, step)
        modules = {name for name in data if name.startswith("Module.")}
        assert f"{module}ColumnParallelLinear.forward.0" in modules
        assert f"{module}ColumnParallelLinear.backward.0" in modules
        assert all(name.startswith(module) for name in modules)  # no other layer, no attention
        assert any(name.startswith("Torch.matmul.") for name in data)  # the APIs inside linear_fc1
    replay = json.loads((_rank_folder(tmp_path) / "replay_step7.json").read_text())
    assert replay["verdict"] == "reproducible"
    recorder = json.loads((_rank_folder(tmp_path) / "flight_recorder_step7.json").read_text())
    assert [item["step"] for item in recorder["steps"]] == [3, 4, 5, 6, 7]


# The learning rate x1000 on megatron's GPT: gradients only (wg_distribution), since megatron initialises its
# biases and LayerNorm biases to zero and msprobe's turbulence rule on a weight norm whose running average starts
# at 0 fires at every step of clean training (no parameter rows then). Threshold 3: with fresh batches and dropout
# the clean gradient norms swing by about half their running average, within a hair of the 0.5 the 12-layer model
# uses; the x1000 jump is many times the average.
MEGATRON_TURBULENCE = {
    "wg_distribution": True,
    "ops": OPS,
    "alert": {
        "rules": [{"rule_name": "AnomalyNan"}, {"rule_name": "AnomalyTurbulence", "args": {"threshold": 3.0}}],
        "dump": True,
    },
    "flight_recorder": {"steps": 5},
    "on_anomaly": {"level": "mix", "scope": "anomalous", "steps": 1},
}


@pytest.mark.slow
def test_megatron_gpt_learning_rate_x1000_is_captured_in_the_layer_named(tmp_path, megatron_copy):
    """The learning rate x1000 from step 7 on megatron-core's tiny GPT, gradients monitored: the anomaly is at
    step 8, not 7. Step 7's gradients were computed before its update and are sane; the weights the update threw
    off give step 8's gradients, which jump. The earliest record in msprobe's execution order (backward stage,
    the gradient hooks' order) names the first gradient that jumps, and the capture dumps its module in step 9."""
    result = _megatron(tmp_path, megatron_copy, MEGATRON_TURBULENCE, "--steps", "10", "--lr-step", "7")
    anomalies = result["anomalies"]
    assert anomalies and all(item["step"] >= 8 for item in anomalies)
    first = anomalies[0]
    assert first["step"] == 8 and first["message"].startswith("Rule AnomalyTurbulence")
    assert first["tag_name"].endswith("/rank0/acc_grad")
    param = first["tag_name"].split("/")[0].split(":", 1)[1]
    # the output layer's gradient is the first the backward computes, and the weights thrown off by step 7's
    # update make it jump
    assert param == "module.output_layer.weight" and first["call_id"] == 0
    module = f"Module.0.{param.rpartition('.')[0]}."
    config = json.loads((_rank_folder(tmp_path) / "capture_step8.config.json").read_text())
    assert config["statistics"] == {"list": [module]}
    data = _dump(tmp_path, 8, 9)  # no replay: the capture is the next step
    modules = {name for name in data if name.startswith("Module.")}
    for micro in range(2):
        assert f"{module}ColumnParallelLinear.forward.{micro}" in modules, sorted(modules)
        assert f"{module}ColumnParallelLinear.backward.{micro}" in modules, sorted(modules)
    assert all(name.startswith(module) for name in modules), sorted(modules)
    assert any(name.startswith("Torch.matmul.") for name in data)  # the API inside it
    assert sorted(os.listdir(_rank_folder(tmp_path) / "capture_step8")) == ["step9"]


@pytest.mark.slow
def test_megatron_gpt_clean_run_of_30_steps_raises_nothing(tmp_path, megatron_copy):
    result = _megatron(tmp_path, megatron_copy, MEGATRON_TURBULENCE, "--steps", "30")
    assert len(result["losses"]) == 30
    assert result["anomalies"] == []
    assert sorted(os.listdir(_rank_folder(tmp_path))) == ["anomaly.json"]
    assert "anomal" not in result["stderr"] and "capture" not in result["stderr"]
