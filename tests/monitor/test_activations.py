"""xy_distribution: activation statistics per targeted module, named as msprobe 26.2 names them, the backward
read without a module backward hook (runtime/monitor/activations.py): training stays bit-identical, and each
gradient figure equals what msprobe's full backward hook sees (the module's share of its input's gradient)."""

import copy
import csv
import glob
import json
import os

import pytest
import torch

from .test_trainer_mon import Tagged  # counts the torch functions run on it


OPS = ["norm", "min", "max", "mean", "zeros", "nans"]
XY = {"xy_distribution": True, "ops": OPS, "ndigits": 12}


class Block(torch.nn.Module):
    """A pre-norm residual block: its input feeds the norm and the sum, so the norm's share of the input's gradient
    is not the whole gradient (what a tensor hook on the input would read)."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.fc = torch.nn.Linear(32, 32)

    def forward(self, x):
        return x + self.fc(torch.nn.functional.gelu(self.norm(x)))


class Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.layers = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        x = self.fc1(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class Checkpointed(Residual):
    def forward(self, x):
        x = self.fc1(x)
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
        return self.head(x)


def rows(run, prefix):
    """Every row of ``{prefix}_*.csv`` (``actv_0-0.csv``, not ``actv_grad_0-0.csv``), in file and row order."""
    found = []
    for path in sorted(glob.glob(os.path.join(run.monitor.tensorboard_dir, f"{prefix}_[0-9]*.csv"))):
        with open(path, newline="", encoding="utf-8") as handle:
            found.extend(csv.DictReader(handle))
    return found


def _same_training(plain, watched):
    assert len(plain.losses) == len(watched.losses)
    for a, b in zip(plain.losses, watched.losses):
        assert torch.equal(a, b)
    for step_a, step_b in zip(plain.grads, watched.grads):
        for a, b in zip(step_a, step_b):
            assert torch.equal(a, b)
    for a, b in zip(plain.model.parameters(), watched.model.parameters()):
        assert torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("model_class, grad_acc_steps", [(Residual, 1), (Residual, 2), (Checkpointed, 1)])
def test_training_is_bit_identical_with_activations_on(train, model_class, grad_acc_steps):
    plain = train(monitor=False, model_class=model_class, grad_acc_steps=grad_acc_steps)
    config = dict(XY, wg_distribution=True, param_distribution=True, mv_distribution=True)
    watched = train(config, model_class=model_class, grad_acc_steps=grad_acc_steps)
    assert watched.monitor.has_collect_times == 30
    _same_training(plain, watched)
    # and it did collect: every step, both kinds
    assert {int(row["step"]) for row in rows(watched, "actv")} == set(range(30))
    assert {int(row["step"]) for row in rows(watched, "actv_grad")} == set(range(30))


def _reference(model, data, target):
    """What msprobe's hooks see on a copy of ``model``: {module name: (inputs, outputs, grad_input, grad_output)}
    through a forward hook with kwargs and a full backward hook (on the copy only)."""
    seen = {}
    twin = copy.deepcopy(model)
    for name, module in twin.named_modules():

        def forward(module, args, kwargs, output, name=name):
            seen.setdefault(name, {})["forward"] = (args, output)

        def backward(module, grad_input, grad_output, name=name):
            seen.setdefault(name, {})["backward"] = (grad_input, grad_output)

        module.register_forward_hook(forward, with_kwargs=True)
        module.register_full_backward_hook(backward)
    torch.nn.functional.mse_loss(twin(data), target).backward()
    return seen


def test_figures_are_msprobe_hooks_figures_on_a_residual_model(train):
    run = train(XY, steps=1, model_class=Residual)
    torch.manual_seed(0)  # the model as the fixture built it, before its step
    model = Residual()
    data = torch.randn(1, 64, 16)[0]
    target = torch.randn(1, 64, 4)[0]
    with pytest.warns(UserWarning, match="no inputs require gradients"):  # torch's, about the reference's fc1
        seen = _reference(model, data, target)

    def check(row, tensor):
        if tensor is None:
            assert row["norm"] == "nan" and row["shape"] == "nan"
            return
        x = tensor.detach().double()
        scale = float(x.abs().max()) + 1e-30
        assert float(row["norm"]) == pytest.approx(x.norm().item(), rel=1e-5)
        assert float(row["min"]) == pytest.approx(x.min().item(), rel=1e-5, abs=1e-6 * scale)
        assert float(row["max"]) == pytest.approx(x.max().item(), rel=1e-5, abs=1e-6 * scale)
        assert float(row["mean"]) == pytest.approx(x.mean().item(), abs=1e-5 * scale)
        assert row["shape"] == str(list(tensor.shape))

    forward = rows(run, "actv")
    backward = rows(run, "actv_grad")
    modules = [name for name, _ in model.named_modules() if name != "layers"]  # a ModuleList is never called
    # msprobe's names: every module (targets empty), input and output, micro step 0
    assert {row["name"] for row in forward} == {f"{m}.{field}" for m in modules for field in ("input", "output")}
    assert {row["name"] for row in backward} == {row["name"] for row in forward}
    assert {row["micro_step"] for row in forward + backward} == {"0"}
    for row in forward:
        module, field = row["name"].rsplit(".", 1)
        args, output = seen[module]["forward"]
        check(row, args[0] if field == "input" else output)
    for row in backward:
        module, field = row["name"].rsplit(".", 1)
        grad_input, grad_output = seen[module]["backward"]
        check(row, grad_input[0] if field == "input" else grad_output[0])
    # the norm's share differs from the residual stream's whole gradient: the test tells the two apart
    grad_input = seen["layers.1.norm"]["backward"][0][0]
    whole = seen["layers.1"]["backward"][0][0]
    assert not torch.allclose(grad_input, whole)
    # backward order, as msprobe's hooks fire: the head first, each module after its children, fc1 last of the
    # submodules; the root's input has no gradient, so its hook fires at once (first)
    order = [row["name"] for row in backward]
    assert order.index("layers.1.fc.input") < order.index("layers.1.input") < order.index("fc1.input")
    assert order.index("head.input") < order.index("layers.1.fc.input")


def test_targets_name_modules_exactly_and_micro_steps_count_calls(train):
    config = dict(XY, targets={"layers.0.fc": {}, "0:head": {"input": "tensor"}, "layers": {}})
    run = train(config, steps=2, model_class=Residual, grad_acc_steps=2)
    forward = rows(run, "actv")
    names = {row["name"] for row in forward}
    # "layers" is a module (a ModuleList, never called: no rows); "layers.0.fc" does not take "layers.0.fc.x"
    assert names == {"layers.0.fc.input", "layers.0.fc.output", "head.input", "head.output"}
    assert sorted((row["step"], row["micro_step"]) for row in forward if row["name"] == "head.input") == [
        ("0", "0"),
        ("0", "1"),
        ("1", "0"),
        ("1", "1"),
    ]
    assert {row["name"] for row in rows(run, "actv_grad")} == names
    with open(glob.glob(os.path.join(run.monitor.tensorboard_dir, "actv_0-0.csv"))[0], encoding="utf-8") as handle:
        assert handle.readline().strip() == "vpp_stage,name,step,micro_step," + ",".join(OPS) + ",shape,dtype"


@pytest.mark.parametrize(
    "only, present, absent", [("forward_only", "actv", "actv_grad"), ("backward_only", "actv_grad", "actv")]
)
def test_forward_only_and_backward_only(train, only, present, absent):
    run = train(dict(XY, **{only: True}), steps=2, model_class=Residual)
    assert rows(run, present)
    assert not glob.glob(os.path.join(run.monitor.tensorboard_dir, f"{absent}_[0-9]*.csv"))


def test_all_xy_takes_every_module_whatever_targets_say(train):
    run = train(dict(XY, targets={"head": {}}, all_xy=True), steps=1, model_class=Residual)
    assert {"fc1.input", "layers.1.norm.output", ".output"} <= {row["name"] for row in rows(run, "actv")}


def test_a_recomputed_forward_is_not_collected(train):
    plain = train(XY, steps=1, model_class=Residual)
    checkpointed = train(XY, steps=1, model_class=Checkpointed)
    for prefix in ("actv", "actv_grad"):
        # the same rows and figures: the recomputation (a forward inside the backward) adds none, and the
        # gradients still reach the hooks on the first forward's graph
        assert [(r["name"], r["norm"]) for r in rows(plain, prefix)] == [
            (r["name"], r["norm"]) for r in rows(checkpointed, prefix)
        ]


@pytest.mark.slow
def test_a_clean_run_raises_nothing_and_nan_rows_are_not_anomalies(train, caplog):
    rules = [{"rule_name": "AnomalyNan"}, {"rule_name": "AnomalyTurbulence", "args": {"threshold": 0.5}}]
    config = dict(XY, ops=["norm"], alert={"rules": rules})
    run = train(config, steps=30, model_class=Residual)
    # fc1's input has no gradient: a nan row, as msprobe writes it, and no anomaly
    assert [row["norm"] for row in rows(run, "actv_grad") if row["name"] == "fc1.input"] == ["nan"] * 30
    assert run.monitor.anomalies == []


def test_a_nan_activation_is_named(train):
    config = dict(XY, ops=["norm"], alert={"rules": [{"rule_name": "AnomalyNan"}]}, forward_only=True)
    run = train(config, steps=10, model_class=Residual, fault=("nan", 7, "layers.0.fc.weight"))
    first = run.monitor.anomalies[0]
    assert first["step"] == 7 and first["tag_name"] == "0:layers.0.fc.output:0/rank0/actv"


@pytest.mark.slow
def test_no_host_sync_in_the_step(train, host_reads):
    """As tests/monitor/test_trainer_mon.py: every host read of a tensor made under the monitor's code is spied
    on; with activations on, the only one is still the flush's ``tolist`` per collected step."""
    run = train(dict(XY, step_interval=3), steps=9, model_class=Residual, grad_acc_steps=2)
    assert run.monitor.has_collect_times == 3
    assert [call[:2] for call in host_reads.calls] == [("tolist", "_flush")] * 3


def test_plain_tensors_only(tmp_path, monkeypatch):
    """A tensor subclass among a module's inputs is counted (msprobe's numbering) and never read: its row is nan."""
    from msprobe_runtime import TrainerMon

    class Pair(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x, extra):
            return self.fc(x), extra

    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    (tmp_path / "c.json").write_text(json.dumps(XY))
    model = Pair()
    optimizer = torch.optim.AdamW(model.parameters())
    mon = TrainerMon(str(tmp_path / "c.json"), params_have_main_grad=False)
    mon.set_monitor(model, optimizer)
    extra = torch.zeros(3).as_subclass(Tagged)
    Tagged.calls = 0
    out, _ = model(torch.randn(2, 4), extra)
    assert Tagged.calls == 0
    out.sum().backward()
    optimizer.step()
    mon.close()
    found = {}
    with open(os.path.join(mon.tensorboard_dir, "actv_0-0.csv"), newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            found[row["name"]] = row
    assert found[".input_1"]["norm"] == "nan" and found[".output_1"]["norm"] == "nan"
    assert found[".input_0"]["norm"] != "nan" and found["fc.input"]["shape"] == "[2, 4]"


def test_csv2tb_parses_our_activation_csv(train, msprobe_root):
    from .test_output import _csv2tb

    run = train(dict(XY, ops=["norm", "max"]), steps=1, model_class=Residual, grad_acc_steps=2)
    csv2tb = _csv2tb(msprobe_root)
    for kind in ("actv", "actv_grad"):
        parsed = csv2tb["parse_step_fn"](os.path.join(run.monitor.tensorboard_dir, f"{kind}_0-0.csv"))
        # msprobe's own reading of the micro_step column: one series per module field and micro-batch
        assert {"vp0:fc1.input:micro0", "vp0:fc1.input:micro1", "vp0:layers.1.norm.output:micro1"} <= set(parsed)
        assert all(list(per_step) == ["0"] and list(per_step["0"]) == ["norm", "max"] for per_step in parsed.values())


class InPlace(torch.nn.Module):
    """One module's output, changed in place, is the next one's input: read again, not taken from the cache."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        y = self.a(x)
        y.mul_(3.0)
        return self.b(y)


def test_a_tensor_read_twice_is_read_again_after_an_in_place_change(tmp_path, monkeypatch):
    from msprobe_runtime import TrainerMon

    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    (tmp_path / "c.json").write_text(json.dumps(dict(XY, targets={"a": {}, "b": {}})))
    torch.manual_seed(0)
    model = InPlace()
    optimizer = torch.optim.AdamW(model.parameters())
    mon = TrainerMon(str(tmp_path / "c.json"), params_have_main_grad=False)
    mon.set_monitor(model, optimizer)
    x = torch.randn(8, 16)
    with torch.no_grad():  # the reference, computed without calling the hooked module
        out = torch.nn.functional.linear(x, model.a.weight, model.a.bias)
    model(x).sum().backward()
    optimizer.step()
    mon.close()
    with open(os.path.join(mon.tensorboard_dir, "actv_0-0.csv"), newline="", encoding="utf-8") as handle:
        found = {row["name"]: float(row["norm"]) for row in csv.DictReader(handle)}
    assert found["a.output"] == pytest.approx(out.double().norm().item(), rel=1e-5)
    assert found["b.input"] == pytest.approx(3 * out.double().norm().item(), rel=1e-5)


@pytest.mark.parametrize(
    "only, hook", [("forward_only", "activation hook"), ("backward_only", "activation gradient hook")]
)
def test_an_error_in_an_activation_hook_never_reaches_the_training_loop(train, monkeypatch, caplog, only, hook):
    from msprobe_runtime.monitor import metrics

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(metrics, "figures", broken)
    plain = train(monitor=False, steps=3, model_class=Residual)
    run = train(dict(XY, **{only: True}), steps=3, model_class=Residual)
    _same_training(plain, run)
    # logged once, not once per call; each step dropped whole (the rest of its hooks do no work)
    assert caplog.text.count("injected") == 1 and f"{hook} failed" in caplog.text
    assert not [name for name in os.listdir(run.monitor.tensorboard_dir) if name.endswith(".csv")]
