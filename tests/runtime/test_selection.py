"""scope and list in msprobe's documented form: full entry names, substrings, and modules at mix."""

import glob
import importlib.util
import json
import logging
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")

import msprobe_runtime as rt  # noqa: E402
from msprobe_runtime import PrecisionDebugger  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "fixtures", "selection")


@pytest.fixture
def model_module(tmp_path):
    from msprobe_rewrite.api import rewrite_source

    path = tmp_path / "selection_model.py"
    with open(os.path.join(FIXTURE, "model.py"), "rb") as handle:
        path.write_bytes(rewrite_source(handle.read()))
    spec = importlib.util.spec_from_file_location("selection_model_rt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dump(tmp_path, section, level="L1", run=None, model=None):
    config = tmp_path / "config.json"
    out = tmp_path / "dump"
    config.write_text(json.dumps({"dump_path": str(out), "level": level, "statistics": section}))
    debugger = PrecisionDebugger(config_path=str(config))
    try:
        debugger.start(model)
        run()
    finally:
        debugger.stop()
        debugger.wait()
    [directory] = glob.glob(os.path.join(glob.escape(str(out)), "step0", "*"))
    with open(os.path.join(directory, "dump.json")) as handle:
        return list(json.load(handle)["data"])


def api_calls():
    x = torch.ones(2, requires_grad=True)
    y = rt.call("Torch.relu", torch.relu, x)  # Torch.relu.0
    y = rt.call("Torch.relu", torch.relu, y)  # Torch.relu.1
    y = rt.call("Torch.tanh", torch.tanh, y)  # Torch.tanh.0
    y = rt.call("Torch.exp", torch.exp, y)  # Torch.exp.0
    rt.call("Torch.sum", torch.sum, y).backward()  # Torch.sum.0


def test_list_of_full_forward_names_selects_those_entries(tmp_path):
    names = dump(tmp_path, {"list": ["Torch.relu.1.forward", "Torch.exp.0.forward"]}, run=api_calls)
    assert sorted(names) == ["Torch.exp.0.forward", "Torch.relu.1.forward"]


def test_list_of_a_backward_name_selects_only_the_backward(tmp_path):
    assert dump(tmp_path, {"list": ["Torch.tanh.0.backward"]}, run=api_calls) == ["Torch.tanh.0.backward"]


def test_list_substring_selects_forward_and_backward(tmp_path):
    names = dump(tmp_path, {"list": ["relu"]}, run=api_calls)
    assert sorted(names) == [
        "Torch.relu.0.backward",
        "Torch.relu.0.forward",
        "Torch.relu.1.backward",
        "Torch.relu.1.forward",
    ]


def test_scope_of_forward_names_is_a_range_of_forward_entries(tmp_path):
    names = dump(tmp_path, {"scope": ["Torch.relu.1.forward", "Torch.exp.0.forward"]}, run=api_calls)
    assert names == ["Torch.relu.1.forward", "Torch.tanh.0.forward", "Torch.exp.0.forward"]


def test_scope_of_backward_names_is_a_range_in_backward_order(tmp_path):
    names = dump(tmp_path, {"scope": ["Torch.exp.0.backward", "Torch.relu.1.backward"]}, run=api_calls)
    assert names == ["Torch.exp.0.backward", "Torch.tanh.0.backward", "Torch.relu.1.backward"]


def test_scope_and_list_together(tmp_path):
    names = dump(tmp_path, {"scope": ["Torch.relu.0.forward", "Torch.tanh.0.forward"], "list": ["relu"]}, run=api_calls)
    assert names == ["Torch.relu.0.forward", "Torch.relu.1.forward"]


# (level, section, the entry names msprobe 26.2 dumps for fixtures/selection/model.py's step: measured with
# fixtures/selection/msprobe_names.py, and checked against msprobe by the slow test below)
MODEL_CASES = [
    (
        "mix",
        {"list": ["Module.inner.Inner"]},  # a listed module: the forward entries inside it, its own backward
        [
            "Functional.linear.0.forward",
            "Module.inner.fc.Linear.forward.0",
            "Functional.gelu.0.forward",
            "Module.inner.Inner.forward.0",
            "Module.inner.Inner.backward.0",
        ],
    ),
    (
        "L0",
        {"list": ["Module.inner"]},
        [
            "Module.inner.fc.Linear.forward.0",
            "Module.inner.Inner.forward.0",
            "Module.inner.Inner.backward.0",
            "Module.inner.fc.Linear.backward.0",
            "Module.inner.fc.Linear.parameters_grad.0",
        ],
    ),
    (
        "L0",
        {"scope": ["Module.inner.Inner.forward.0", "Module.seq.0.Linear.forward.0"]},  # seq begins inside
        [
            "Module.inner.fc.Linear.forward.0",
            "Module.inner.Inner.forward.0",
            "Module.seq.Sequential.forward.0",
            "Module.seq.0.Linear.forward.0",
        ],
    ),
    (
        "mix",
        {"scope": ["Module.inner.Inner.forward.0", "Functional.linear.1.forward"]},
        [
            "Functional.linear.0.forward",
            "Module.inner.fc.Linear.forward.0",
            "Functional.gelu.0.forward",
            "Module.inner.Inner.forward.0",
            "Module.seq.Sequential.forward.0",
            "Module.seq.0.Linear.forward.0",
            "Functional.linear.1.forward",
        ],
    ),
    (
        "L1",
        {"scope": ["Functional.relu.0.backward", "Functional.linear.0.backward"]},
        [
            "Functional.relu.0.backward",
            "Functional.linear.1.backward",
            "Functional.gelu.0.backward",
            "Functional.linear.0.backward",
        ],
    ),
    (
        "L1",
        {"list": ["Functional.linear.1.forward", "Torch.tanh.0.backward"]},
        ["Functional.linear.1.forward", "Torch.tanh.0.backward"],
    ),
]
CASE_IDS = [f"{level}-{json.dumps(section)}" for level, section, _ in MODEL_CASES]


@pytest.mark.parametrize("level, section, expected", MODEL_CASES, ids=CASE_IDS)
def test_model_selection_as_msprobe(tmp_path, model_module, level, section, expected):
    model = model_module.Outer()
    names = dump(tmp_path, section, level=level, model=model, run=lambda: model_module.train_step(model))
    assert sorted(names) == sorted(expected)


@pytest.mark.slow
@pytest.mark.parametrize("level, section, expected", MODEL_CASES, ids=CASE_IDS)
def test_model_cases_are_what_msprobe_dumps(level, section, expected, msprobe_python):
    python = msprobe_python
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(torch.__file__))  # msprobe's venv may lack torch
    done = subprocess.run(
        [python, os.path.join(FIXTURE, "msprobe_names.py"), level, json.dumps(section)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(json.loads(done.stdout.strip().splitlines()[-1])) == sorted(expected)


def test_an_entry_matching_nothing_is_reported_once(tmp_path, caplog):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {"dump_path": str(tmp_path / "d"), "level": "L1", "statistics": {"list": ["Torch.relu.7.forward", "tanh"]}}
        )
    )
    debugger = PrecisionDebugger(config_path=str(config))
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        for _ in range(2):
            debugger.start()
            api_calls()
            debugger.stop()
            debugger.step()
        debugger.wait()
    warnings = [r.getMessage() for r in caplog.records if "matched no dump name" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "'Torch.relu.7.forward'" in warnings[0] and "Torch.relu.1.forward" in warnings[0]
