"""msprobe's alert rules on the device: a NaN put into one weight, the learning rate x1000, a clean run."""

import ast
import json
import logging

import pytest

# no mean: msprobe's turbulence rule on the mean of a gradient fires in clean training (a mean near zero changes
# sign), so a clean run would not be clean; norm is the figure users alert on
OPS = ["min", "max", "norm", "zeros", "nans"]
RULES = [{"rule_name": "AnomalyNan"}, {"rule_name": "AnomalyTurbulence", "args": {"threshold": 0.5}}]
CONFIG = {"wg_distribution": True, "param_distribution": True, "ops": OPS, "alert": {"rules": RULES, "dump": True}}


def _anomaly_json(run):
    return json.loads((run.output / "anomaly_detected" / "rank0" / "anomaly.json").read_text())


def test_a_clean_run_raises_nothing(train, caplog):
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        run = train(CONFIG, steps=30)
    assert run.monitor.has_collect_times == 30
    assert run.monitor.anomalies == []
    assert _anomaly_json(run) == {}
    assert "anomal" not in caplog.text


def test_a_nan_in_one_weight_at_step_7_is_named_at_step_7(train, caplog):
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        run = train(CONFIG, steps=30, fault=("nan", 7, "fc2.weight"))
    first = run.monitor.anomalies[0]
    assert first["step"] == 7
    assert first["tag_name"] == "0:fc2.weight/rank0/param_origin"
    assert first["message"].startswith("Rule AnomalyNan reports anomaly signal in ('0:fc2.weight/rank0/param_origin'")
    assert "current value nan" in first["message"]
    written = _anomaly_json(run)
    step7 = [item for item in written.values() if item["step"] == 7]
    assert step7[0] == first  # the file keeps the step's records earliest first
    assert f"0:fc2.weight/rank0/param_origin_step_7_call_{first['call_id']}" in written
    lines = [line for line in caplog.text.splitlines() if "step 7:" in line]
    assert len(lines) == 1 and "0:fc2.weight/rank0/param_origin" in lines[0]


def test_the_learning_rate_x1000_at_step_7_fires_the_turbulence_rule(train):
    run = train(CONFIG, steps=30, fault=("lr", 7, 1000.0))
    first = run.monitor.anomalies[0]
    assert first["step"] in (7, 8)
    assert first["message"].startswith("Rule AnomalyTurbulence")
    layer = first["tag_name"].split("/")[0].split(":")[1]
    assert layer in dict(run.model.named_parameters())


def test_the_turbulence_rule_matches_msprobe_running_average(train):
    """The device rule against msprobe's host rule (data_writers.py), replayed on the CSV's own figures."""
    config = {
        "param_distribution": True,
        "ops": ["norm"],
        "ndigits": 15,
        "alert": {"rules": [{"rule_name": "AnomalyTurbulence", "args": {"threshold": 0.5}}]},
    }
    run = train(config, steps=12, fault=("lr", 7, 1000.0))
    import csv
    import os

    folder = run.monitor.tensorboard_dir
    averages, expected = {}, set()
    for step in range(12):
        with open(os.path.join(folder, f"param_updated_{step}-{step}.csv"), newline="") as handle:
            for row in csv.DictReader(handle):
                value = abs(float(row["norm"]))
                avg = averages.setdefault(row["name"], value)
                if value > avg * 1.5:
                    expected.add((step, row["name"]))
                averages[row["name"]] = 0.99 * avg + 0.01 * value
    found = {
        (item["step"], item["tag_name"].split("/")[0][2:])
        for item in run.monitor.anomalies
        if item["tag_name"].endswith("param_updated")
    }
    assert expected and found == expected


def test_records_have_msprobe_grad_anomaly_data_fields(train, msprobe_root):
    source = (msprobe_root / "core" / "monitor" / "anomaly_processor.py").read_text()
    tree = ast.parse(source)
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "GradAnomalyData")
    fields = [node.target.id for node in cls.body if isinstance(node, ast.AnnAssign)]
    run = train(CONFIG, steps=9, fault=("nan", 7, "fc1.weight"))
    assert run.monitor.anomalies
    for item in _anomaly_json(run).values():
        assert list(item) == fields


@pytest.mark.parametrize(
    "rule, fault", [("AnomalyNan", ("nan", 7, "fc1.weight")), ("AnomalyTurbulence", ("lr", 7, 1e3))]
)
def test_without_dump_the_rules_log_and_write_no_file(train, rule, fault):
    # msprobe writes anomaly_detected/ only with alert.dump; the log names the anomalies either way
    config = dict(CONFIG, alert={"rules": [r for r in RULES if r["rule_name"] == rule]})
    run = train(config, steps=9, fault=fault)
    assert not (run.output / "anomaly_detected").exists()
    assert run.monitor.anomalies and {item["step"] for item in run.monitor.anomalies} <= {7, 8}
    assert all(item["message"].startswith(f"Rule {rule} ") for item in run.monitor.anomalies)


def test_a_nan_is_not_a_turbulence(train):
    # msprobe's turbulence rule compares with >, which a NaN never passes: only AnomalyNan reports a NaN
    config = dict(CONFIG, alert={"rules": [r for r in RULES if r["rule_name"] == "AnomalyTurbulence"]})
    run = train(config, steps=9, fault=("nan", 7, "fc1.weight"))
    assert run.monitor.anomalies == []


def _msprobe_grad_anomaly_data(root):
    """msprobe's GradAnomalyData class, executed from its source with MonitorConst's stage table read from
    const.py (msprobe itself is not importable here)."""
    import dataclasses
    import re
    import types

    const = (root / "core" / "common" / "const.py").read_text(encoding="utf-8")
    keys = {
        name: ast.literal_eval(re.search(rf"\n    {name} = (.+)", const).group(1))
        for name in (
            "ACTV",
            "ACTVGRAD",
            "PRE_GRAD",
            "POST_GRAD",
            "ACC_GRAD",
            "EXP_AVG",
            "EXP_AVG_SQ",
            "DEFAULT_STAGE",
            "FORWARD_STAGE",
            "BACKWARD_STAGE",
            "OPTIMIZER_STAGE",
        )
    }
    stage = {keys["ACTV"]: keys["FORWARD_STAGE"]}
    stage.update(
        {
            key: keys["BACKWARD_STAGE"]
            for key in ("ACTVGRAD", "PRE_GRAD", "POST_GRAD", "ACC_GRAD")
            for key in [keys[key]]
        }
    )
    stage.update({keys["EXP_AVG"]: keys["OPTIMIZER_STAGE"], keys["EXP_AVG_SQ"]: keys["OPTIMIZER_STAGE"]})
    const_ns = types.SimpleNamespace(
        TRAIN_STAGE=stage, DEFAULT_STAGE=keys["DEFAULT_STAGE"], FORWARD_STAGE=keys["FORWARD_STAGE"]
    )
    tree = ast.parse((root / "core" / "monitor" / "anomaly_processor.py").read_text(encoding="utf-8"))
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "GradAnomalyData")
    namespace = {"dataclass": dataclasses.dataclass, "field": dataclasses.field, "MonitorConst": const_ns}
    exec(compile(ast.Module(body=[cls], type_ignores=[]), "anomaly_processor.py", "exec"), namespace)
    return namespace["GradAnomalyData"]


def test_records_are_in_msprobe_execution_order(train, msprobe_root):
    grad_anomaly_data = _msprobe_grad_anomaly_data(msprobe_root)
    config = dict(CONFIG, mv_distribution=True)
    run = train(config, steps=10, fault=("nan", 7, "fc2.weight"))
    ours = run.monitor.anomalies
    assert len(ours) > 10 and {"param_origin", "acc_grad", "post_grad", "exp_avg"} <= {
        item["tag_name"].split("/")[-1] for item in ours
    }
    theirs = sorted(ours[::-1], key=lambda item: grad_anomaly_data(**item))
    assert [(item["step"], item["tag_name"]) for item in theirs] == [(item["step"], item["tag_name"]) for item in ours]


def test_an_infinity_is_reported_by_the_nan_rule(train):
    # ours: msprobe's AnomalyNan without a threshold looks for NaN only (math.isnan); an infinity in a weight is as
    # much a fault, so the device rule tests isfinite
    config = dict(CONFIG, alert={"rules": [{"rule_name": "AnomalyNan"}]})
    run = train(config, steps=9, fault=("inf", 7, "fc1.weight"))
    first = run.monitor.anomalies[0]
    assert first["step"] == 7 and first["tag_name"] == "0:fc1.weight/rank0/param_origin"
    assert "current value inf" in first["message"]
