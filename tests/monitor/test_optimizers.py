"""megatron-core's optimizers as the monitor sees them (runtime/monitor/optimizers.py), on stand-ins with
megatron's class names and attributes: megatron's DistributedOptimizer needs CUDA tensors, so it cannot run here
(the real FP32Optimizer is trained in tests/monitor/test_megatron_monitor.py).

The stand-in keeps what the monitor reads where megatron keeps it: the model's parameters in
``model_float16_groups``/``model_fp32_groups``, this rank's fp32 shards in ``shard_fp32_from_float16_groups`` (a
copy) and ``shard_fp32_groups`` (a view), the model-side views in ``shard_float16_groups``, the Adam state in the
inner torch optimizer ``.optimizer`` keyed by the shard; its step copies main_grad's slice to the shard, steps,
and copies the shard back, as megatron's does. This rank holds the second half of each parameter.
"""

import csv
import json
import os

import pytest
import torch

from msprobe_runtime.monitor import optimizers


class MegatronOptimizer:
    """Named as megatron-core's base class: the monitor tells megatron's optimizers by their MRO's names."""


class DistributedOptimizer(MegatronOptimizer):
    def __init__(self, model):
        weight, bias = model.weight, model.bias
        self.ranges = {}
        self.model_float16_groups = [[weight]]
        self.shard_float16_groups = [[self._view(weight)]]
        self.shard_fp32_from_float16_groups = [[self._view(weight).clone()]]
        self.model_fp32_groups = [[bias]]
        self.shard_fp32_groups = [[self._view(bias)]]
        mains = [self.shard_fp32_from_float16_groups[0][0], self.shard_fp32_groups[0][0]]
        self.optimizer = torch.optim.Adam(mains, lr=0.1)
        self.pairs = [(weight, mains[0]), (bias, mains[1])]

    def _view(self, param):
        half = param.numel() // 2
        self.ranges[id(param)] = (half, param.numel() - half)
        return param.detach().view(-1)[half:]

    def step(self):
        for model_param, main in self.pairs:
            start, numel = self.ranges[id(model_param)]
            main.grad = model_param.main_grad.view(-1)[start : start + numel].clone()
        self.optimizer.step()
        with torch.no_grad():
            for model_param, main in self.pairs:
                start, numel = self.ranges[id(model_param)]
                model_param.view(-1)[start : start + numel].copy_(main)
        return True, None, None


class ChainedOptimizer(MegatronOptimizer):
    def __init__(self, parts):
        self.chained_optimizers = parts

    def step(self):
        for part in self.chained_optimizers:
            part.step()
        return True, None, None


def _ddp_like(model):
    """megatron's DDP in brief: main_grad buffers, filled by a hook on each AccumulateGrad node."""
    nodes = []
    for param in model.parameters():
        param.main_grad = torch.zeros_like(param)
        node = param.expand_as(param).grad_fn.next_functions[0][0]

        def hook(*unused, param=param):
            param.main_grad.add_(param.grad)
            param.grad = None

        node.register_hook(hook)
        nodes.append(node)
    return nodes


def _rows(folder, prefix):
    found = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith(prefix + "_") and name[len(prefix) + 1].isdigit():
            with open(os.path.join(folder, name), newline="", encoding="utf-8") as handle:
                for row in csv.DictReader(handle):
                    found[(row["name"], int(row["step"]))] = row
    return found


@pytest.mark.parametrize("chained", [False, True])
def test_distributed_optimizer_state_and_gradient_shards(tmp_path, monkeypatch, chained):
    from msprobe_runtime import TrainerMon

    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 6)
    nodes = _ddp_like(model)
    inner = DistributedOptimizer(model)
    optimizer = ChainedOptimizer([inner]) if chained else inner
    config = tmp_path / "config.json"
    ops = ["min", "max", "norm", "mean"]
    config.write_text(
        json.dumps({"wg_distribution": True, "mv_distribution": True, "param_distribution": True, "ops": ops})
    )
    monitor = TrainerMon(str(config), params_have_main_grad=True)
    monitor.set_monitor(model, optimizer)
    view = monitor._view
    assert view.kind == ("ChainedDistributedOptimizer" if chained else "DistributedOptimizer")
    assert "step" in vars(optimizer) and "step" not in vars(inner if chained else ChainedOptimizer([]))
    expected = {}
    for step in range(3):
        for param in model.parameters():
            param.main_grad.zero_()
        model(torch.randn(5, 4)).square().sum().backward()
        weight_shard = model.weight.main_grad.view(-1)[12:].clone()
        exp_avg = inner.optimizer.state.get(inner.pairs[0][1], {}).get("exp_avg")
        expected[step] = (weight_shard, None if exp_avg is None else exp_avg.clone())
        optimizer.step()
    monitor.close()
    assert "step" not in vars(optimizer) and DistributedOptimizer.__dict__["step"] is not None
    folder = monitor.tensorboard_dir
    grads, moments = _rows(folder, "grad_reduced"), _rows(folder, "exp_avg")
    unreduced = _rows(folder, "grad_unreduced")
    for step, (shard, exp_avg) in expected.items():
        row = grads[("weight", step)]
        assert row["shape"] == "[12]"  # this rank's half of the 6x4 weight, from main_grad
        assert float(row["norm"]) == pytest.approx(shard.norm().item(), rel=1e-6)
        assert float(row["min"]) == pytest.approx(shard.min().item(), rel=1e-6)
        assert unreduced[("weight", step)]["shape"] == "[6, 4]"  # before the reduce: the whole main_grad
        if exp_avg is None:
            assert ("weight", step) not in moments
        else:  # the Adam state of the fp32 shard, keyed by the main parameter, mapped back to the model's name
            assert float(moments[("weight", step)]["norm"]) == pytest.approx(exp_avg.norm().item(), rel=1e-6)
            assert moments[("weight", step)]["shape"] == "[12]"
    assert {step for _, step in moments} == {1, 2}
    assert len(nodes) == 2


def test_not_an_optimizer_is_refused(tmp_path, monkeypatch):
    from msprobe_runtime import TrainerMon
    from msprobe_runtime.config import ConfigError

    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"wg_distribution": True}))
    with pytest.raises(ConfigError, match="neither a torch.optim.Optimizer"):
        TrainerMon(str(config), params_have_main_grad=False).set_monitor(torch.nn.Linear(2, 2), object())


def test_an_instance_step_wrapped_by_someone_else_is_put_back():
    calls = []
    inner = DistributedOptimizer(torch.nn.Linear(2, 2))
    theirs = inner.step
    inner.step = lambda: calls.append("theirs") or theirs()  # another tool's instance wrapper, there before us
    mine = inner.step
    view = optimizers.OptimizerView(inner)
    (handle,) = view.install(lambda *a: calls.append("pre"), lambda *a: calls.append("post"))
    for param in inner.model_float16_groups[0] + inner.model_fp32_groups[0]:
        param.main_grad = torch.zeros_like(param)
    inner.step()
    assert calls == ["pre", "theirs", "post"]
    handle.remove()
    assert inner.step is mine


class Float16OptimizerWithFloat16Params(MegatronOptimizer):
    """megatron's mixed-precision optimizer in brief: fp32 copies in ``fp32_from_float16_groups``, stepped by the
    inner torch optimizer, copied back into the model's parameters at the end of megatron's step."""

    def __init__(self, model):
        self.float16_groups = [list(model.parameters())]
        self.fp32_from_float16_groups = [[param.detach().clone() for param in model.parameters()]]
        self.optimizer = torch.optim.Adam(self.fp32_from_float16_groups[0], lr=0.1)

    def step(self):
        pairs = list(zip(self.float16_groups[0], self.fp32_from_float16_groups[0]))
        for model_param, main in pairs:
            main.grad = model_param.main_grad.clone()
        self.optimizer.step()
        with torch.no_grad():
            for model_param, main in pairs:
                model_param.copy_(main)
        return True, None, None


def test_mixed_precision_optimizer_state_of_the_fp32_copy_and_weights_after_the_copy_back(tmp_path, monkeypatch):
    from msprobe_runtime import TrainerMon

    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 6)
    _ddp_like(model)
    optimizer = Float16OptimizerWithFloat16Params(model)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"mv_distribution": True, "param_distribution": True, "ops": ["norm"]}))
    monitor = TrainerMon(str(config), params_have_main_grad=True)
    monitor.set_monitor(model, optimizer)
    updated, moments = [], []
    for _ in range(2):
        for param in model.parameters():
            param.main_grad.zero_()
        model(torch.randn(5, 4)).square().sum().backward()
        optimizer.step()
        updated.append(model.weight.detach().norm().item())
        moments.append(optimizer.optimizer.state[optimizer.fp32_from_float16_groups[0][0]]["exp_avg"].norm().item())
    monitor.close()
    rows = _rows(monitor.tensorboard_dir, "param_updated")
    # read after megatron's step has copied the fp32 copy back (a hook on the inner optimizer would be too early)
    assert [float(rows[("weight", step)]["norm"]) for step in (0, 1)] == pytest.approx(updated, rel=1e-6)
    exp_avg = _rows(monitor.tensorboard_dir, "exp_avg")
    assert float(exp_avg[("weight", 1)]["norm"]) == pytest.approx(moments[0], rel=1e-6)  # before step 1's update
    assert exp_avg[("weight", 1)]["shape"] == "[6, 4]"
