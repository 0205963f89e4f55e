"""The flight recorder (the last K steps' figures written with an anomaly), the AnomalySpike rule on the loss and
the global gradient norm, and their config keys (runtime/monitor/flight_recorder.py, spike.py)."""

import json
import logging
import os

import pytest
import torch

from fixtures.monitor_capture import loop
from fixtures.monitor_capture.model import Net

OPS = ["min", "max", "norm", "nans"]
NAN = {"rule_name": "AnomalyNan"}
SPIKE = {"rule_name": "AnomalySpike", "args": {"k": 6, "window": 20, "warmup": 5}}
RECORDER = {
    "wg_distribution": True,
    "param_distribution": True,
    "ops": OPS,
    "alert": {"rules": [NAN], "dump": True},
    "flight_recorder": {"steps": 5},
}


def _folder(tmp_path):
    return tmp_path / "monitor_output" / "anomaly_detected" / "rank0"


def _small():
    return Net(depth=3)


@pytest.mark.slow
def test_the_recorder_writes_the_steps_before_a_nan_at_step_7(train):
    run = train(RECORDER, steps=12, fault=("nan", 7, "fc2.weight"))
    folder = run.output / "anomaly_detected" / "rank0"
    files = sorted(name for name in os.listdir(folder) if name.startswith("flight_recorder"))
    # the NaN stays and fires every step after; the next file would only be due after K steps
    assert files == ["flight_recorder_step7.json"]
    body = json.loads((folder / files[0]).read_text())
    assert body["step"] == 7 and body["rank"] == 0 and body["ops"] == OPS + ["shape", "dtype"]
    assert [item["step"] for item in body["steps"]] == [3, 4, 5, 6, 7]
    assert body["anomalies"][0] == run.monitor.anomalies[0]
    norm, nans = OPS.index("norm"), OPS.index("nans")
    for item in body["steps"][:-1]:  # the lead-up: sane figures, the same as the CSV's
        row = item["figures"]["param_origin"]["0:fc2.weight/rank0/param_origin"]
        assert type(row[norm]) is float and row[nans] == 0
    last = body["steps"][-1]["figures"]["param_origin"]["0:fc2.weight/rank0/param_origin"]
    assert last[norm] == "nan" and last[nans] == 1
    assert body["steps"][-1]["figures"]["param_origin"]["0:fc1.weight/rank0/param_origin"][nans] == 0
    step5 = body["steps"][2]["figures"]["grad_reduced"]["0:fc1.weight/rank0/post_grad"][norm]
    assert step5 == pytest.approx(run.grads[5][0].norm().item(), rel=1e-6)


@pytest.mark.slow
def test_a_clean_run_writes_no_recorder_file(train):
    run = train({**RECORDER, "alert": {"rules": [NAN, SPIKE], "dump": True}}, steps=30)
    assert run.monitor.anomalies == []
    assert os.listdir(run.output / "anomaly_detected" / "rank0") == ["anomaly.json"]


@pytest.mark.slow
def test_the_spike_rule_fires_on_a_loss_spike_and_not_in_a_clean_run(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "monitor_output"))
    config = {"wg_distribution": True, "ops": ["norm"], "alert": {"rules": [SPIKE], "dump": True}}
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        clean = loop.train(str(tmp_path), _small, config, steps=30)
    assert clean["monitor"].anomalies == [] and "AnomalySpike" not in caplog.text
    spiked = loop.train(str(tmp_path), _small, config, steps=12, fault=("batch", 7, 30.0))
    fired = spiked["monitor"].anomalies
    assert {(item["step"], item["tag_name"]) for item in fired} >= {(7, "loss/rank0/loss")}
    assert all(item["step"] == 7 for item in fired)  # the window takes the spike in; later steps are sane
    loss = next(item for item in fired if item["tag_name"] == "loss/rank0/loss")
    assert loss["message"].startswith("Rule AnomalySpike reports anomaly signal in ('loss/rank0/loss', 'id') at step 7")
    assert f"current value {spiked['losses'][7].item()}" in loss["message"]
    written = json.loads((_folder(tmp_path) / "anomaly.json").read_text())
    assert "loss/rank0/loss_step_7_call_" + str(loss["call_id"]) in written


def test_the_spike_rule_on_the_gradient_norm_alone(tmp_path, monkeypatch):
    """Without observe_loss the rule watches the global gradient norm, sqrt of the sum of the squared norms."""
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "monitor_output"))
    config = {"wg_distribution": True, "ops": ["norm"], "alert": {"rules": [SPIKE]}, "flight_recorder": {"steps": 3}}
    run = loop.train(str(tmp_path), _small, config, steps=10, fault=("once", 7, "layers.1", 100.0), observe=False)
    assert [(item["step"], item["tag_name"]) for item in run["monitor"].anomalies] == [(7, "grad_norm/rank0/post_grad")]
    body = json.loads((_folder(tmp_path) / "flight_recorder_step7.json").read_text())
    step6 = body["steps"][1]
    norms = [row[0] for row in step6["figures"]["grad_reduced"].values()]
    assert step6["loss"] is None
    assert step6["grad_norm"] == pytest.approx(sum(n * n for n in norms) ** 0.5, rel=1e-5)


def test_the_window_on_the_device():
    from msprobe_runtime.monitor.config import Rule
    from msprobe_runtime.monitor.spike import SpikeWindow

    window = SpikeWindow(Rule("AnomalySpike", k=3.0, window=4, warmup=3))
    out = [window.evaluate(torch.tensor(v)).tolist() for v in (1.0, 1.1, 0.9, 1.0, 5.0, float("nan"), 1.0)]
    assert [row[3] for row in out] == [0, 0, 0, 0, 1, 0, 0]  # warm-up, then the jump; a NaN never (AnomalyNan)
    kept = (1.1, 0.9, 1.0, 1.0)  # the window of 4 before the jump (1.0 has dropped out)
    mean = sum(kept) / 4
    assert out[4][1] == pytest.approx(mean) and out[4][2] == pytest.approx(
        (sum((v - mean) ** 2 for v in kept) / 4) ** 0.5, rel=1e-5
    )
    flat = SpikeWindow(Rule("AnomalySpike", k=3.0, window=4, warmup=2))
    flags = [flat.evaluate(torch.tensor(v))[3].item() for v in (2.0, 2.0, 2.0, 2.0001, 2.1)]
    assert flags == [0, 0, 0, 0, 1]  # std 0: the 1e-3 relative floor, not any rounding, decides


def test_no_host_read_in_the_step_with_the_spike_rule_and_recorder(tmp_path, monkeypatch, host_reads):
    """As test_trainer_mon's spy: the loss is kept on the device and the spike figures ride in the flush's copy."""
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "monitor_output"))
    config = {**RECORDER, "alert": {"rules": [NAN, SPIKE]}, "step_interval": 2}
    run = loop.train(str(tmp_path), _small, config, steps=10)
    assert [call[:2] for call in host_reads.calls] == [("tolist", "_flush")] * 5
    assert run["monitor"].has_collect_times == 5


@pytest.mark.slow
def test_links_planted_in_the_output_are_not_written_through(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "monitor_output"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "monitor_output" / "anomaly_detected").mkdir(parents=True)
    os.symlink(elsewhere, _folder(tmp_path))  # the rank folder is a link
    config = {**RECORDER, "alert": {"rules": [NAN], "dump": True}}
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        run = loop.train(str(tmp_path), _small, config, steps=9, fault=("nan", 7, "layers.1.fc.weight"))
    assert run["monitor"].anomalies and os.listdir(elsewhere) == []
    assert "writing the flight recorder failed" in caplog.text
    assert "anomaly.json is not written" in caplog.text
    # a link at the file's own name is replaced, never followed
    os.unlink(_folder(tmp_path))
    _folder(tmp_path).mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    os.symlink(victim, _folder(tmp_path) / "flight_recorder_step7.json")
    loop.train(str(tmp_path), _small, config, steps=9, fault=("nan", 7, "layers.1.fc.weight"))
    assert victim.read_text() == "keep"
    target = _folder(tmp_path) / "flight_recorder_step7.json"
    assert not target.is_symlink() and json.loads(target.read_text())["step"] == 7
    # the same for anomaly.json: the link at its name is replaced when the monitor starts
    os.symlink(victim, _folder(tmp_path) / "anomaly.json.link")
    os.replace(_folder(tmp_path) / "anomaly.json.link", _folder(tmp_path) / "anomaly.json")
    run = loop.train(str(tmp_path), _small, config, steps=9, fault=("nan", 7, "layers.1.fc.weight"))
    assert victim.read_text() == "keep"
    assert not (_folder(tmp_path) / "anomaly.json").is_symlink()
    assert json.loads((_folder(tmp_path) / "anomaly.json").read_text())


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"alert": {"rules": [{"rule_name": "AnomalySpike", "args": {"k": -1}}]}}, "args.k: expected a number > 0"),
        ({"alert": {"rules": [{"rule_name": "AnomalySpike", "args": {"window": 1}}]}}, "args.window"),
        ({"alert": {"rules": [{"rule_name": "AnomalySpike", "args": {"sigma": 3}}]}}, "known: k, warmup, window"),
        ({"alert": {"rules": [{"rule_name": "AnomalySpike", "args": {"window": 4, "warmup": 5}}]}}, "args.warmup"),
        ({"alert": {"rules": [{"rule_name": "AnomalySpik"}]}}, "did you mean 'AnomalySpike'"),
        ({"flight_recorder": {"steps": 0}}, "flight_recorder.steps"),
        ({"flight_recorder": {"step": 4}}, "did you mean 'steps'"),
        ({"flight_recordr": {"steps": 4}}, "did you mean 'flight_recorder'"),
        ({"on_anomaly": {"level": "L2"}}, "on_anomaly.level"),
        ({"on_anomaly": {"level": "L1"}}, "level L1 does not record"),
        ({"on_anomaly": {"scope": "layer"}}, "on_anomaly.scope"),
        ({"on_anomaly": {"steps": -1}}, "on_anomaly.steps"),
        ({"on_anomaly": {"stpes": 1}}, "did you mean 'steps'"),
        ({"flight_recorder": {"steps": 4}, "alert": {}}, "flight_recorder: acts when an alert rule fires"),
        ({"on_anomaly": {}, "alert": {"rules": []}}, "on_anomaly: acts when an alert rule fires"),
    ],
)
def test_bad_values_of_our_keys_are_refused(patch, message):
    from msprobe_runtime.config import ConfigError
    from msprobe_runtime.monitor import config as monitor_config

    raw = {"wg_distribution": True, "alert": {"rules": [NAN]}, **patch}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        monitor_config.parse(raw)


def test_our_keys_parse():
    from msprobe_runtime.monitor import config as monitor_config

    cfg = monitor_config.parse(
        {
            "alert": {"rules": [{"rule_name": "AnomalySpike", "args": {"k": 4, "window": 30}}]},
            "flight_recorder": {"steps": 8},
            "on_anomaly": {"level": "L1", "scope": "all", "steps": 2, "times": 3},
        }
    )
    assert (cfg.rules[0].k, cfg.rules[0].window, cfg.rules[0].warmup) == (4.0, 30, 10)
    assert cfg.flight_recorder_steps == 8
    assert (cfg.on_anomaly.level, cfg.on_anomaly.scope, cfg.on_anomaly.steps, cfg.on_anomaly.times) == (
        "L1",
        "all",
        2,
        3,
    )
