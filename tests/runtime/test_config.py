"""config.json as msprobe 26.2 users write it: every key works or is refused by name, every value is checked."""

import json
import os
import subprocess
import sys

import pytest

from fixtures.msprobe_schema import compat
from msprobe_runtime import config as cfg
from msprobe_runtime.config import ConfigError, load_config, read_dump_enable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# msprobe 26.2's own default config.json (msprobe/config.json in the package), as users copy it
MSPROBE_DEFAULT = {
    "task": "statistics",
    "dump_path": "./dump_path",
    "rank": [],
    "step": [],
    "level": "L1",
    "extra_info": True,
    "async_dump": False,
    "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
    "tensor": {"scope": [], "list": [], "data_mode": ["all"]},
    "acc_check": {"white_list": [], "black_list": [], "error_data_path": "./"},
}


@pytest.fixture
def load(tmp_path):
    def _load(raw, **kwargs):
        path = tmp_path / "config.json"
        path.write_text(json.dumps(raw))
        return load_config(str(path), **kwargs)

    return _load


def refusal(load, raw, **kwargs):
    with pytest.raises(ConfigError) as caught:
        load(raw, **kwargs)
    return str(caught.value)


def test_msprobe_default_config_loads(load, tmp_path):
    config = load(MSPROBE_DEFAULT)
    assert config.task == "statistics" and config.level == "L1" and config.data_mode == ["all"]
    assert config.dump_path == os.path.abspath("dump_path")


# ----------------------------------------------------------------- keys accepted and ignored before


@pytest.mark.parametrize(
    "raw, field, hint",
    [
        ({"extra_info": False}, "extra_info", "always written"),
        ({"precision": "high"}, "precision", "Mean and Norm"),
        ({"risk_level": "FOCUS"}, "risk_level", "use list"),
        ({"load": {"path": "x", "modules": ["Module.a.A.forward.0"]}}, "load", "task 'tensor'"),
        ({"statistics": {"slice": [{"dim": 0, "begin": 0, "end": 2}]}}, "statistics.slice", "task 'tensor'"),
        ({"statistics": {"request_id": "r1"}}, "statistics.request_id", "use step"),
        ({"statistics": {"tensor_list": ["relu"]}}, "statistics.tensor_list", "task 'tensor' with list"),
        ({"task": "tensor", "tensor": {"bench_path": "/b"}}, "tensor.bench_path", "compare"),
        ({"statistics": {"diff_nums": 5}}, "statistics.diff_nums", "compare"),
        ({"statistics": {"summary_mode": "xor"}}, "statistics.summary_mode", "xor"),
        ({"task": "acc_check"}, "task", "msprobe-rewrite precheck"),
        ({"level": "L2"}, "level", "use L1"),
    ],
)
def test_msprobe_keys_not_supported_are_refused_by_name(load, tmp_path, raw, field, hint):
    message = refusal(load, {"dump_path": str(tmp_path), **raw})
    assert message.startswith(f"{field}:") and "not supported here" in message and hint in message


@pytest.mark.parametrize(
    "raw",
    [
        {"custom_op_namespaces": []},
        {"statistics": {"slice": [], "tensor_list": [], "request_id": None}},
        {"task": "tensor", "tensor": {"bench_path": None, "diff_nums": 1}},
        {"extra_info": True},
        {"precision": "low"},
        {"risk_level": "ALL"},
    ],
)
def test_values_that_do_nothing_in_msprobe_either_are_accepted(load, tmp_path, raw):
    load({"dump_path": str(tmp_path), **raw})


def test_dump_enable_is_validated_and_reread(load, tmp_path):
    assert load({"dump_path": str(tmp_path), "dump_enable": False}).dump_enable is False
    assert load({"dump_path": str(tmp_path)}).dump_enable is None
    assert refusal(load, {"dump_path": str(tmp_path), "dump_enable": "true"}).startswith("dump_enable:")
    path = tmp_path / "live.json"
    path.write_text(json.dumps({"dump_path": str(tmp_path), "dump_enable": True}))
    assert read_dump_enable(str(path)) is True
    path.write_text(json.dumps({"dump_path": str(tmp_path), "dump_enable": False}))
    assert read_dump_enable(str(path)) is False
    path.write_text(json.dumps({"dump_path": str(tmp_path), "dump_enable": 1}))
    with pytest.raises(ConfigError, match="dump_enable"):
        read_dump_enable(str(path))


def test_unknown_keys_get_a_did_you_mean(load, tmp_path):
    assert "did you mean 'level'" in refusal(load, {"dump_path": str(tmp_path), "levle": "mix"})
    message = refusal(load, {"dump_path": str(tmp_path), "statistics": {"scop": []}})
    assert message.startswith("statistics.scop:") and "did you mean 'scope'" in message
    assert "did you mean 'statistics'" in refusal(load, {"dump_path": str(tmp_path), "task": "statistic"})


def test_async_dump_must_be_a_bool(load, tmp_path):
    assert refusal(load, {"dump_path": str(tmp_path), "async_dump": "yes"}).startswith("async_dump:")
    assert load({"dump_path": str(tmp_path), "async_dump": True}).async_dump is True


# ----------------------------------------------------------------- values are type-checked


@pytest.mark.parametrize(
    "raw, field",
    [
        ({"statistics": {"nan_inf_count": "false"}}, "statistics.nan_inf_count"),
        ({"is_deterministic": "false"}, "is_deterministic"),
        ({"dump_path": ""}, "dump_path"),
        ({"dump_path": 123}, "dump_path"),
        ({"step": [1.5]}, "step"),
        ({"step": 1}, "step"),
        ({"step": [True]}, "step"),
        ({"rank": 3.7}, "rank"),
        ({"rank": [3.7]}, "rank"),
        ({"rank": ["3-1"]}, "rank"),
        ({"step": [10**7]}, "step"),
        ({"seed": 1.5}, "seed"),
        ({"seed": -1}, "seed"),
        ({"level": 1}, "level"),
        ({"statistics": {"data_mode": ["all", "input"]}}, "statistics.data_mode"),
        ({"statistics": {"data_mode": "forward"}}, "statistics.data_mode"),
        ({"statistics": {"list": "relu"}}, "statistics.list"),
        ({"statistics": []}, "statistics"),
    ],
)
def test_wrong_values_name_their_field(load, tmp_path, raw, field):
    message = refusal(load, {"dump_path": str(tmp_path), **raw})
    assert message.startswith(f"{field}:"), message


def test_arguments_are_checked_like_the_file(load, tmp_path):
    with pytest.raises(ConfigError, match=r"^dump_path \(argument\)"):
        load_config(dump_path=123)
    with pytest.raises(ConfigError, match=r"^step \(argument\)"):
        load_config(dump_path=str(tmp_path), step=[1.5])
    with pytest.raises(ConfigError, match=r"^level \(argument\).*did you mean 'mix'"):
        load_config(dump_path=str(tmp_path), level="mx")
    assert load_config(dump_path=tmp_path, step=["0-2"]).step == [0, 1, 2]


@pytest.mark.parametrize(
    "scope, level, hint",
    [
        (["Torch.relu.1"], "L1", "exactly two"),
        (["Torch.relu.1", "Torch.tanh.0.forward"], "L1", "did you mean 'Torch.relu.1.forward'"),
        (["Torch.relu.1.forward", "Torch.tanh.0.forward", "Torch.exp.0.forward"], "L1", "exactly two"),
        (["Module.a.A.forward.0", "Module.b.B.forward.0"], "L1", "level mix"),
        (["Torch.relu.1.forward", "Module.b.B.forward.0"], "L0", "level mix"),
    ],
)
def test_scope_takes_two_full_names(load, tmp_path, scope, level, hint):
    message = refusal(load, {"dump_path": str(tmp_path), "level": level, "statistics": {"scope": scope}})
    assert message.startswith("statistics.scope:") and hint in message


# ----------------------------------------------------------------- the schema walk


def test_every_msprobe_key_is_handled():
    """A key msprobe 26.2 reads that the table does not handle fails here instead of being ignored."""
    table = cfg.keys()
    missing = [key for key in compat.schema_keys(compat.load_schema()) if key not in table]
    assert not missing, f"msprobe keys with no handling in runtime/config.py: {missing}"
    for key, handling in table.items():
        assert handling.status in (cfg.SUPPORTED, cfg.REFUSED, cfg.OURS, cfg.INACTIVE) and handling.note, key


def test_every_refused_key_is_refused_with_its_note(tmp_path):
    for key, handling in cfg.keys().items():
        if handling.status != cfg.REFUSED:
            continue
        parts = key.split(".")
        raw = {"dump_path": str(tmp_path)}
        if parts[0] == "load":
            raw["load"] = {parts[-1]: "not neutral"}
        elif len(parts) == 2:
            raw["task"] = parts[0]
            raw[parts[0]] = {parts[1]: "not neutral"}
        else:
            raw[key] = "not neutral"
        with pytest.raises(ConfigError) as caught:
            cfg.config_from_dict(raw)
        shown = parts[0] if parts[0] == "load" else key
        assert str(caught.value).startswith(f"{shown}:") and cfg.keys()[shown].note in str(caught.value), key


def test_every_msprobe_value_is_accepted_or_refused_with_a_reason():
    values = compat.load_schema()["values"]
    for key, options in values.items():
        for value in options:
            raw = {"dump_path": "dump"}
            if key in cfg.COMMON_KEYS:
                raw[key] = value
            else:
                raw["statistics"] = {key: [value] if key == "data_mode" else value}
            try:
                cfg.config_from_dict(raw)
            except ConfigError as error:
                assert "not supported here: " in str(error), (key, value, str(error))


def test_compatibility_doc_is_current():
    with open(compat.DOC, encoding="utf-8") as handle:
        assert handle.read() == compat.render(), "run: python -m fixtures.msprobe_schema.compat"


@pytest.mark.slow  # a fresh interpreter: torch is already imported in this one
def test_config_module_imports_no_torch():
    code = "import sys, msprobe_runtime.config, fixtures.msprobe_schema.compat; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


@pytest.mark.slow
def test_schema_snapshot_matches_installed_msprobe(msprobe_python):
    """The committed schema.json is what the installed mindstudio-probe's config classes read today."""
    python = msprobe_python
    import torch

    env = dict(os.environ)
    # msprobe's venv may lack torch: lend it ours (a separate process, so its patches never reach us)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(torch.__file__))
    done = subprocess.run(
        [python, os.path.join(ROOT, "fixtures", "msprobe_schema", "extract.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if done.returncode != 0 and "No module named 'msprobe'" in done.stderr:
        pytest.skip(f"{python} has no msprobe")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == compat.load_schema()


# ----------------------------------------------------------------- seed and is_deterministic


def test_seed_and_is_deterministic_are_applied_when_the_debugger_is_built(load, tmp_path):
    import random

    import torch

    from msprobe_runtime import PrecisionDebugger

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"dump_path": str(tmp_path / "d"), "seed": 5, "is_deterministic": True}))
    try:
        PrecisionDebugger(config_path=str(path))
        first = (random.random(), torch.rand(2))
        assert torch.are_deterministic_algorithms_enabled()
        random.seed(5)
        torch.manual_seed(5)
        assert first[0] == random.random() and torch.equal(first[1], torch.rand(2))
    finally:
        torch.use_deterministic_algorithms(False)
    path.write_text(json.dumps({"dump_path": str(tmp_path / "d")}))
    torch.manual_seed(0)
    PrecisionDebugger(config_path=str(path))  # no seed: the generators are left alone
    after = torch.rand(2)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(2)) and not torch.are_deterministic_algorithms_enabled()


def test_a_dump_path_that_is_not_utf8_is_refused_at_construction(tmp_path, monkeypatch):
    """dump.json records the tensor folder's path as UTF-8 text: a name of other bytes made every tensor-task
    step fail at its write, late. It is refused with the config, named by its bytes, and a relative dump_path
    is checked with the working folder's name."""
    name = os.fsdecode(b"dump-\xff")
    with pytest.raises(ConfigError, match=r"dump_path: b'.*dump-\\xff' is not a UTF-8 name"):
        load_config(dump_path=str(tmp_path / name), task="tensor")
    odd = tmp_path / os.fsdecode(b"cwd-\xfe")
    odd.mkdir()
    monkeypatch.chdir(odd)
    with pytest.raises(ConfigError, match="is not a UTF-8 name"):
        load_config(dump_path="dump")
    assert load_config(dump_path=str(tmp_path / "d\u00fcmp")).dump_path.endswith("d\u00fcmp")  # UTF-8: kept
