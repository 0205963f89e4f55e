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


@pytest.fixture
def net(tmp_path, monkeypatch):
    """The fixture model, rewritten by the compiler (the dump records calls in instrumented code only)."""
    from msprobe_rewrite.api import rewrite_source

    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "monitor_output"))
    path = tmp_path / "capture_model.py"
    with open(os.path.join(ROOT, "fixtures", "monitor_capture", "model.py"), "rb") as handle:
        path.write_bytes(rewrite_source(handle.read()))
    spec = importlib.util.spec_from_file_location("capture_model_rt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Net


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


@pytest.mark.slow
def test_megatron_gpt_training_loop_nan_is_captured_in_that_layer(tmp_path, megatron_copy):
    """fixtures/megatron_gpt/monitor_loop.py: the tiny GPT of megatron-core (rewritten), DDP chunk list with
    main_grad, get_forward_backward_func over 2 microbatches, AdamW; a NaN in layer 1's linear_fc1 at step 7."""
    import subprocess
    import sys

    from fixtures.reproducible_env import training_env

    runtime_parent = os.path.dirname(
        importlib.util.find_spec("msprobe_runtime").submodule_search_locations[0]
    )  # this checkout's runtime, not an installed one
    config = tmp_path / "monitor.json"
    # the NaN rule alone: msprobe's turbulence rule fires in this GPT's first steps (dropout, 2 microbatches)
    config.write_text(json.dumps({**CAPTURE, "alert": {"rules": RULES[:1], "dump": True}}))
    env = training_env(
        os.pathsep.join([str(megatron_copy), runtime_parent]),
        PYTHONWARNINGS="ignore",
        MONITOR_OUTPUT_DIR=str(tmp_path / "monitor_output"),
    )
    env.pop("MASTER_PORT", None)
    script = os.path.join(ROOT, "fixtures", "megatron_gpt", "monitor_loop.py")
    command = [sys.executable, script, "--config", str(config), "--steps", "9", "--nan-step", "7", "--replay"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
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
