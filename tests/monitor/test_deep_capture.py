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
    run = _run(tmp_path, net, CAPTURE, steps=10, fault=("lr", 7, 1000.0))
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
