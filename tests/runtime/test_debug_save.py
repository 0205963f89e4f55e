"""PrecisionDebugger.save: values no API call shows (the loss, main_grad, a value in a @jit_fuser body), in
msprobe's debug-level layout (debug.json), with gradients from tensor hooks that change no gradient bit."""

import glob
import json
import os
import subprocess
import textwrap

import pytest

torch = pytest.importorskip("torch")

from msprobe_runtime import PrecisionDebugger  # noqa: E402

# the program msprobe runs in test_layout_matches_msprobes_own_save, and we run in-process
PROGRAM = """
def program(debugger, torch):
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    for _ in range(2):
        debugger.start()
        x = torch.randn(2, 4, requires_grad=True)
        y = lin(x)
        debugger.save(y, "y")
        debugger.save({"a": y * 2, "b": [x, 3, "s", 1.5]}, "nest", save_backward=True)
        debugger.save(x.detach(), "nograd", save_backward=True)
        debugger.save(torch.tensor(True), "flag", save_backward=False)
        loss = y.sum()
        debugger.save(loss, "loss")
        debugger.save(loss, "loss")
        debugger.save(7, "intval")
        loss.backward()
        debugger.stop()
        debugger.step()
"""


def _program():
    namespace = {}
    exec(PROGRAM, namespace)
    return namespace["program"]


def _debug_json(root, step=0):
    [path] = glob.glob(os.path.join(str(root), f"step{step}", "*", "debug.json"))
    with open(path) as handle:
        return json.load(handle)


def _run_ours(root, level="debug", task="statistics"):
    debugger = PrecisionDebugger(dump_path=str(root), level=level, task=task)
    _program()(debugger, torch)
    debugger.wait()
    return debugger


def test_debug_level_layout(tmp_path):
    _run_ours(tmp_path / "dump")
    for step in (0, 1):
        files = sorted(os.listdir(glob.glob(str(tmp_path / "dump" / f"step{step}" / "*"))[0]))
        assert files == ["debug.json"]  # the debug level writes nothing else, as msprobe
    dump = _debug_json(tmp_path / "dump")
    assert {k: v for k, v in dump.items() if k != "data"} == {
        "task": "statistics",
        "level": "debug",
        "framework": "pytorch",
        "dump_data_dir": None,
    }
    data = dump["data"]
    assert list(data) == [
        "y.0.debug",
        "y_grad.0.debug",
        "nest.0.debug",
        "nest_grad.0.debug",
        "nograd.0.debug",
        "nograd_grad.0.debug",
        "flag.0.debug",
        "loss.0.debug",
        "loss_grad.0.debug",
        "loss.1.debug",
        "loss_grad.1.debug",
        "intval.0.debug",
        "intval_grad.0.debug",
    ]
    assert data["y_grad.0.debug"]["Max"] == 1.0 and data["y_grad.0.debug"]["requires_grad"] is False
    assert data["nest.0.debug"]["b"][1:] == [
        {"type": "int", "value": 3},
        {"type": "str", "value": "s"},
        {"type": "float", "value": 1.5},
    ]
    # "a" never reaches the loss and the non-tensors have no gradient: null, in the saved structure
    assert data["nest_grad.0.debug"]["a"] is None and data["nest_grad.0.debug"]["b"][1:] == [None, None, None]
    assert data["nest_grad.0.debug"]["b"][0]["shape"] == [2, 4]
    assert data["nograd_grad.0.debug"] is None and data["intval_grad.0.debug"] is None
    assert "flag_grad.0.debug" not in data
    assert data["loss.0.debug"]["Max"] == data["loss.0.debug"]["Norm"]  # a 0-d tensor: all four its value


def test_tensor_task_files(tmp_path):
    _run_ours(tmp_path / "dump", task="tensor")
    dump = _debug_json(tmp_path / "dump")
    folder = dump["dump_data_dir"]
    assert folder.endswith("dump_tensor_data")
    assert sorted(os.listdir(folder)) == sorted(
        [
            "flag.0.debug.pt",
            "loss.0.debug.pt",
            "loss.1.debug.pt",
            "loss_grad.0.debug.pt",
            "loss_grad.1.debug.pt",
            "nest.0.debug.a.pt",
            "nest.0.debug.b.0.pt",
            "nest_grad.0.debug.b.0.pt",
            "nograd.0.debug.pt",
            "y.0.debug.pt",
            "y_grad.0.debug.pt",
        ]
    )
    assert dump["data"]["nest_grad.0.debug"]["b"][0]["data_name"] == "nest_grad.0.debug.b.0.pt"
    saved = torch.load(os.path.join(folder, "loss_grad.0.debug.pt"))
    assert saved.item() == 1.0


def test_save_beside_an_api_dump(tmp_path):
    """At L1 save() adds debug.json next to dump.json (msprobe records save() at its debug level only)."""
    _run_ours(tmp_path / "dump", level="L1")
    [folder] = glob.glob(str(tmp_path / "dump" / "step0" / "*"))
    assert {"dump.json", "debug.json", "stack.json", "construct.json"} <= set(os.listdir(folder))
    with open(os.path.join(folder, "dump.json")) as handle:
        assert "Functional.linear.0.forward" in json.load(handle)["data"]
    assert "loss_grad.0.debug" in _debug_json(tmp_path / "dump")["data"]


def _train(debugger, steps=2):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    results = []
    for _ in range(steps):
        if debugger is not None:
            debugger.start(model)
        x = torch.randn(4, 8, requires_grad=True)
        hidden = model[1](model[0](x))
        out = model[2](hidden)
        if debugger is not None:
            debugger.save(hidden, "hidden")  # a non-leaf in the middle of the graph
            debugger.save([x, model[0].weight], "leaves")  # a leaf input and a parameter
        loss = (out**2).mean()
        if debugger is not None:
            debugger.save(loss, "loss")
        loss.backward()
        if debugger is not None:
            debugger.stop()
            debugger.step()
        results.append((loss.detach().clone(), x.grad.clone(), [p.grad.clone() for p in model.parameters()]))
        model.zero_grad()
    return results


def test_save_backward_leaves_gradients_bit_identical(tmp_path):
    plain = _train(None)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    saved = _train(debugger)
    debugger.wait()
    for (loss_a, x_a, grads_a), (loss_b, x_b, grads_b) in zip(plain, saved):
        assert torch.equal(loss_a, loss_b) and torch.equal(x_a, x_b)
        assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))
    data = _debug_json(tmp_path / "dump", step=1)["data"]
    assert data["leaves_grad.0.debug"][1]["shape"] == [8, 8]  # the parameter's gradient arrived


def test_a_saved_parameter_keeps_no_hook_from_past_steps(tmp_path):
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="debug")
    weight = torch.nn.Parameter(torch.ones(3))
    for _ in range(5):
        debugger.save(weight, "w")
        (weight * 2).sum().backward()
        debugger.step()
    debugger.wait()
    assert len(weight._backward_hooks or {}) == 0
    assert _debug_json(tmp_path / "dump", step=4)["data"]["w_grad.0.debug"]["Max"] == 2.0


def test_invalid_arguments_are_skipped_with_a_warning(tmp_path, caplog):
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="debug")

    class Custom:
        def __eq__(self, other):  # the runtime never calls it
            raise AssertionError("runtime called the user's __eq__")

    debugger.save(Custom(), "custom")
    debugger.save(torch.ones(2), 3)
    debugger.save(torch.ones(2), "ok", save_backward="yes")
    debugger.save({1: torch.ones(2)}, "int_key")
    debugger.save(torch.ones(2), "ok")
    debugger.step()
    debugger.wait()
    assert list(_debug_json(tmp_path / "dump")["data"]) == ["ok.0.debug", "ok_grad.0.debug"]
    assert sum("save() takes" in r.getMessage() for r in caplog.records) == 4


def test_step_filter_and_dump_enable(tmp_path):
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="debug", step=[1])
    for _ in range(3):
        debugger.save(torch.ones(2), "v")
        debugger.step()
    debugger.wait()
    assert [os.path.basename(p) for p in sorted(glob.glob(str(tmp_path / "dump" / "step*")))] == ["step1"]


MSPROBE_DRIVER = textwrap.dedent("""
    import json, sys, torch
    from msprobe.pytorch import PrecisionDebugger
    json.dump({"task": sys.argv[2], "dump_path": sys.argv[1], "level": "debug"}, open(sys.argv[3], "w"))
    debugger = PrecisionDebugger(config_path=sys.argv[3])
""")


@pytest.mark.slow
@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_layout_matches_msprobes_own_save(tmp_path, task, msprobe_python):
    """msprobe 26.2 (in its own interpreter: it patches torch) runs the same program at its debug level:
    the same file set, the same entry names in the same order, the same records."""
    python = msprobe_python
    driver = tmp_path / "drive.py"
    driver.write_text(MSPROBE_DRIVER + PROGRAM + "\nprogram(debugger, torch)\n")
    env = dict(os.environ)  # that interpreter may see no torch of its own: lend it this one's
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(torch.__file__))
    done = subprocess.run(
        [python, str(driver), str(tmp_path / "theirs"), task, str(tmp_path / "cfg.json")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    _run_ours(tmp_path / "ours", task=task)
    for step in (0, 1):
        theirs, ours = _debug_json(tmp_path / "theirs", step), _debug_json(tmp_path / "ours", step)
        assert list(ours["data"]) == list(theirs["data"])
        assert _rounded(ours["data"]) == _rounded(theirs["data"])
        assert {k: v for k, v in ours.items() if k not in ("data", "dump_data_dir")} == {
            k: v for k, v in theirs.items() if k not in ("data", "dump_data_dir")
        }
        [their_dir] = glob.glob(str(tmp_path / "theirs" / f"step{step}" / "*"))
        [our_dir] = glob.glob(str(tmp_path / "ours" / f"step{step}" / "*"))
        assert _files(our_dir) == _files(their_dir)


def _rounded(value):
    """Numbers rounded to 5 digits; without our NaN/Inf counts, which msprobe does not write."""
    if type(value) is float:
        return round(value, 5)
    if type(value) is list:
        return [_rounded(v) for v in value]
    if type(value) is dict:
        return {k: _rounded(v) for k, v in value.items() if k not in ("NaN_count", "Inf_count")}
    return value


def _files(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)


@pytest.mark.slow  # torch.compile (dynamo) takes seconds to load and trace
def test_save_inside_a_compiled_fuser_body(tmp_path, recwarn):
    """Megatron's @jit_fuser is torch.compile: save() there runs eagerly (one graph break), dynamo never
    traces the runtime, and the gradients are those of the body without save()."""
    import torch._dynamo

    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="debug")

    def body(bias, y, save):
        x = bias + y
        if save:
            debugger.save(x, "bias_gelu_input")
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    results = []
    for save in (False, True):
        torch._dynamo.reset()
        fused = torch.compile(body, backend="eager")
        torch.manual_seed(3)
        bias, y = torch.randn(4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
        fused(bias, y, save).sum().backward()
        results.append((bias.grad, y.grad))
    torch._dynamo.reset()
    debugger.step()
    debugger.wait()
    assert all(torch.equal(a, b) for a, b in zip(*results))
    data = _debug_json(tmp_path / "dump")["data"]
    assert data["bias_gelu_input_grad.0.debug"]["shape"] == [3, 4]
    assert not [w for w in recwarn if "Dynamo does not know how to trace" in str(w.message)]
