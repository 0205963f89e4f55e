"""The monitor config: msprobe's keys, snapshotted from its source; each honoured or refused, the nearest named."""

import json
import re
import subprocess
import sys

import pytest

from msprobe_runtime.config import ConfigError
from msprobe_runtime.monitor import config as monitor_config

# msprobe reads its keys as self.config.get('key' / self.config['key'] (module_hook.py) and config.get('key'
# (core/monitor/utils.py, validate_config); msprobe's own defaults for keys it reads nowhere else come from there
_READ = re.compile(r"""\bconfig(?:\.get\(|\[)\s*['"](\w+)['"]""")


def msprobe_keys(root):
    keys = set()
    for relative in ("pytorch/monitor/module_hook.py", "core/monitor/utils.py"):
        keys.update(_READ.findall((root / relative).read_text(encoding="utf-8")))
    return tuple(sorted(keys))


def test_the_snapshot_is_msprobe_source(msprobe_root):
    assert msprobe_keys(msprobe_root) == monitor_config.MSPROBE_KEYS


def test_every_msprobe_key_has_a_decision():
    assert set(monitor_config.KEYS) == set(monitor_config.MSPROBE_KEYS)


def test_msprobe_op_and_rule_names(msprobe_root):
    const = (msprobe_root / "core" / "common" / "const.py").read_text(encoding="utf-8")
    ops = re.search(r"OP_LIST = (\[[^\]]*\])", const).group(1)
    rules = re.search(r"RULE_NAME = (\[[^\]]*\])", const).group(1)
    assert tuple(json.loads(ops)) == monitor_config.OP_LIST
    assert tuple(json.loads(rules)) == monitor_config.RULE_NAMES


@pytest.mark.parametrize(
    "raw, named",
    [
        ({"wg_distrbution": True}, "did you mean 'wg_distribution'"),
        ({"step_intervals": 2}, "did you mean 'step_interval'"),
        ({"ops": ["norm", "nrom"]}, "did you mean 'norm'"),
        (
            {"alert": {"rules": [{"rule_name": "AnomalyTurbulance", "args": {"threshold": 0.5}}]}},
            "did you mean 'AnomalyTurbulence'",
        ),
        (
            {"alert": {"rules": [{"rule_name": "AnomalyTurbulence", "args": {"treshold": 0.5}}]}},
            "did you mean 'threshold'",
        ),
        ({"alert": {"rule": []}}, "did you mean 'rules'"),
        ({"format": "tensorbord"}, "did you mean 'tensorboard'"),
        (
            {"xy_distribution": True, "forward_only": True, "backward_only": True},
            "forward_only and backward_only together collect no activation",
        ),
        ({"all_xy": 1}, "expected true or false"),
        ({"cc_distribution": {"enable": True}}, "communication statistics (cc_distribution) are not yet supported"),
        ({"cc_distribution": {"enable": True, "cc_codeline": []}}, "use {} or {'enable': false}"),
        ({"print_struct": True}, "not yet"),
        ({"mg_direction": 1}, "expected true or false"),
        ({"start_step": -1}, "start_step"),
        ({"step_interval": 0}, "step_interval"),
        ({"eps": 1}, "eps"),
        ({"wg_distribution": "true"}, "expected true or false"),
        ({"alert": {"rules": [{"rule_name": "AnomalyTurbulence"}]}}, "needs a threshold"),
    ],
)
def test_refused_with_the_nearest_option(raw, named):
    with pytest.raises(ConfigError) as error:
        monitor_config.parse(raw)
    assert named in str(error.value)


def test_neutral_values_of_refused_keys_are_accepted():
    config = monitor_config.parse(
        {
            "xy_distribution": False,
            "all_xy": False,
            "forward_only": False,
            "cc_distribution": {"enable": False},
            "print_struct": False,
            "l2_targets": {},
            "append_output": [],
            "dynamic_on": False,
            "sa_order": "b, s,h,d",
            "mg_distribution": False,
        }
    )
    assert config.ops == ["norm", "shape", "dtype"]  # msprobe's default ops


def test_msprobe_defaults():
    config = monitor_config.parse({"ops": ["max", "min"]})
    assert config.ops == ["max", "min", "shape", "dtype"] and config.numeric_ops == ["max", "min"]
    assert (config.start_step, config.step_interval, config.collect_times, config.ndigits) == (0, 1, 100000000, 6)
    assert config.format == "csv" and config.rules == [] and not config.anomaly_dump


def test_trainer_mon_refuses_what_it_cannot_do(tmp_path, monkeypatch):
    import torch

    from msprobe_runtime import TrainerMon

    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"wg_distribution": True}))
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(ConfigError, match="dp_group"):
        TrainerMon(str(path)).set_monitor(model, optimizer, dp_group=object())
    with pytest.raises(ConfigError, match="grad_acc_steps"):
        TrainerMon(str(path)).set_monitor(model, optimizer, grad_acc_steps=0)
    monkeypatch.setenv("DYNAMIC_MONITOR", "true")
    with pytest.raises(ConfigError, match="DYNAMIC_MONITOR"):
        TrainerMon(str(path))
    monkeypatch.delenv("DYNAMIC_MONITOR")
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        TrainerMon(str(path))


def test_importing_the_package_and_its_config_loads_no_torch():
    code = (
        "import sys, msprobe_runtime, msprobe_runtime.monitor.config, msprobe_runtime.monitor.anomalies; "
        "assert 'torch' not in sys.modules, 'torch loaded'; "
        "from msprobe_runtime import TrainerMon; assert 'torch' in sys.modules; print(TrainerMon.__name__)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "TrainerMon"
