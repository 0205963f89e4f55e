"""TrainerMon on a tiny MLP trained with AdamW: bit-identical training, figures equal to torch's own, msprobe's
step selection, and no host sync in forward, backward or the optimizer's update."""

import csv
import os

import pytest
import torch

ALL = {
    "wg_distribution": True,
    "param_distribution": True,
    "mv_distribution": True,
    "ur_distribution": True,
    "mg_direction": True,
    "ops": ["min", "max", "norm", "zeros", "nans", "mean", "id"],
    "ndigits": 12,
}


def rows_of(folder, prefix):
    """{(name, step): row} over every ``{prefix}_a-b.csv`` in ``folder``."""
    found = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith(prefix + "_") and name[len(prefix) + 1].isdigit():
            with open(os.path.join(folder, name), newline="", encoding="utf-8") as handle:
                for row in csv.DictReader(handle):
                    found[(row["name"], int(row["step"]))] = row
    return found


@pytest.mark.parametrize("foreach, fused", [(False, None), (True, None), (None, True)])
def test_training_is_bit_identical_with_the_monitor_on(train, foreach, fused):
    plain = train(monitor=False, foreach=foreach, fused=fused)
    watched = train(ALL, foreach=foreach, fused=fused)
    assert watched.monitor.has_collect_times == 30
    assert len(plain.losses) == len(watched.losses) == 30
    for a, b in zip(plain.losses, watched.losses):
        assert torch.equal(a, b)
    for step_a, step_b in zip(plain.grads, watched.grads):
        for a, b in zip(step_a, step_b):
            assert torch.equal(a, b)
    for a, b in zip(plain.model.parameters(), watched.model.parameters()):
        assert torch.equal(a, b)


def _expected(tensor, eps=1e-8):
    x = tensor.detach().double()
    return {
        "min": x.min().item(),
        "max": x.max().item(),
        "norm": x.norm().item(),
        "mean": x.mean().item(),
        "zeros": (x.abs() < eps).double().mean().item(),
        "nans": float(torch.isnan(x).sum().item()),
    }


def _close(row, expected, scale):
    for op, value in expected.items():
        # float32 rounding, and the CSV's 12 digits
        assert float(row[op]) == pytest.approx(value, rel=2e-6, abs=2e-7 * scale + 1e-12), (op, row, value)


def test_figures_equal_torch_on_the_tensors(train):
    # a 3-step run: the figures of the last step are checked against the model and optimizer after it
    run = train(ALL, steps=3)
    folder = run.monitor.tensorboard_dir
    names = [name for name, _ in run.model.named_parameters()]
    grads = dict(zip(names, run.grads[-1]))
    reduced = rows_of(folder, "grad_reduced")
    unreduced = rows_of(folder, "grad_unreduced")
    updated = rows_of(folder, "param_updated")
    exp_avg = rows_of(folder, "exp_avg")
    exp_avg_sq = rows_of(folder, "exp_avg_sq")
    assert len(reduced) == len(unreduced) == len(updated) == 3 * len(names)
    assert len(exp_avg) == len(exp_avg_sq) == 2 * len(names)  # no optimizer state before the first step
    for name, param in run.model.named_parameters():
        scale = float(param.detach().abs().max())
        _close(updated[(name, 2)], _expected(param), scale)
        grad = grads[name]
        _close(reduced[(name, 2)], _expected(grad), float(grad.abs().max()))
        _close(unreduced[(name, 2)], _expected(grad), float(grad.abs().max()))
        assert reduced[(name, 2)]["shape"] == str(list(param.shape)) and reduced[(name, 2)]["dtype"] == "torch.float32"
        assert reduced[(name, 2)]["id"] == "nan"  # msprobe's id: only a 0-d tensor has one
    # the moments written at step 2 are the state before step 2's update: recompute them from the gradients
    beta1, beta2 = 0.9, 0.999
    for index, name in enumerate(names):
        m = torch.zeros_like(run.grads[0][index], dtype=torch.float64)
        v = torch.zeros_like(m)
        for step in range(2):
            g = run.grads[step][index].double()
            m = beta1 * m + (1 - beta1) * g
            v = beta2 * v + (1 - beta2) * g * g
        _close(exp_avg[(name, 2)], _expected(m), float(m.abs().max()))
        _close(exp_avg_sq[(name, 2)], {k: x for k, x in _expected(v).items() if k != "mean"}, float(v.abs().max()))
        update = rows_of(folder, "adam_update")[(name, 2)]
        m_hat, v_hat = m / (1 - beta1**2), v / (1 - beta2**2)
        expected = m_hat / (v_hat.sqrt() + 1e-8)
        assert float(update["norm"]) == pytest.approx(expected.norm().item(), rel=1e-5)


@pytest.mark.parametrize("foreach, fused", [(False, None), (True, None), (None, True)])
def test_every_step_weights_and_gradients(train, foreach, fused):
    """param_origin and both gradient kinds of every step equal the tensors of that step (the weights as they were
    before the update, recorded by the loop), under each AdamW implementation."""
    run = train(
        {"wg_distribution": True, "param_distribution": True, "ops": ["norm", "max"], "ndigits": 12},
        steps=6,
        foreach=foreach,
        fused=fused,
    )
    folder = run.monitor.tensorboard_dir
    origin, reduced = rows_of(folder, "param_origin"), rows_of(folder, "grad_reduced")
    unreduced, updated = rows_of(folder, "grad_unreduced"), rows_of(folder, "param_updated")
    names = [name for name, _ in run.model.named_parameters()]
    for step in range(6):
        for index, name in enumerate(names):
            weight, grad = run.weights[step][index].double(), run.grads[step][index].double()
            assert float(origin[(name, step)]["norm"]) == pytest.approx(weight.norm().item(), rel=2e-6)
            assert float(origin[(name, step)]["max"]) == pytest.approx(weight.max().item(), abs=1e-12)
            assert float(reduced[(name, step)]["norm"]) == pytest.approx(grad.norm().item(), rel=2e-6)
            assert unreduced[(name, step)] == dict(reduced[(name, step)])
            if step + 1 < 6:
                after = run.weights[step + 1][index].double()
                assert float(updated[(name, step)]["norm"]) == pytest.approx(after.norm().item(), rel=2e-6)


def test_step_selection_follows_start_step_interval_and_collect_times(train):
    run = train({"wg_distribution": True, "start_step": 3, "step_interval": 4, "collect_times": 5}, steps=30)
    steps = sorted({step for _, step in rows_of(run.monitor.tensorboard_dir, "grad_reduced")})
    assert steps == [3, 7, 11, 15, 19]
    assert run.monitor.handles == []  # collect_times reached: the hooks are gone, as msprobe removes them


def test_file_names_follow_step_count_per_record(train):
    run = train({"wg_distribution": True, "step_count_per_record": 10}, steps=25)
    names = sorted(n for n in os.listdir(run.monitor.tensorboard_dir) if n.startswith("grad_reduced"))
    assert names == ["grad_reduced_0-9.csv", "grad_reduced_10-19.csv", "grad_reduced_20-29.csv"]


def test_gradient_accumulation_reads_the_accumulated_gradient(train):
    run = train({"wg_distribution": True, "ops": ["norm"], "ndigits": 12}, steps=4, grad_acc_steps=3)
    rows = rows_of(run.monitor.tensorboard_dir, "grad_unreduced")
    names = [name for name, _ in run.model.named_parameters()]
    assert len(rows) == 4 * len(names)  # one row per step, not per microbatch
    for step in range(4):
        for name, grad in zip(names, run.grads[step]):
            assert float(rows[(name, step)]["norm"]) == pytest.approx(grad.double().norm().item(), rel=2e-6)


def test_targets_select_parameters_by_prefix(train):
    run = train({"wg_distribution": True, "targets": {"fc2": {}}}, steps=2)
    assert {name for name, _ in rows_of(run.monitor.tensorboard_dir, "grad_reduced")} == {"fc2.weight", "fc2.bias"}


def test_no_host_sync_in_the_step_only_one_batched_read_per_flush(train, host_reads):
    """Every host read of a tensor is spied on (conftest's ``host_reads``): none during forward, backward and the
    optimizer step may come from the monitor's hooks; the monitor's only read is the flush's one ``tolist`` per
    collected step."""
    rules = [{"rule_name": "AnomalyNan"}, {"rule_name": "AnomalyTurbulence", "args": {"threshold": 0.5}}]
    config = dict(ALL, step_interval=3, alert={"rules": rules})
    run = train(config, steps=30, window=host_reads.window)
    flushes = [call for call in host_reads.calls if call[1] == "_flush"]
    assert [call for call in host_reads.calls if call[1] != "_flush"] == []
    assert len(flushes) == 10 and all(name == "tolist" for name, _, _ in flushes)
    assert run.monitor.has_collect_times == 10


def test_an_error_of_ours_never_reaches_the_training_loop(train, monkeypatch, caplog):
    from msprobe_runtime.monitor import metrics

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(metrics, "figures", broken)
    plain = train(monitor=False, steps=5)
    run = train({"wg_distribution": True, "param_distribution": True}, steps=5)
    for a, b in zip(plain.losses, run.losses):
        assert torch.equal(a, b)
    assert "injected" in caplog.text
    # once per hook that failed, not once per call: the gradient hook and the pre-step hook (the post-step hook
    # then writes nothing for the step: it is dropped whole)
    assert caplog.text.count("injected") == 2
    assert not [name for name in os.listdir(run.monitor.tensorboard_dir) if name.endswith(".csv")]


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Module()
        self.encoder.layers = torch.nn.ModuleList([torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)])

    def forward(self, x):
        return self.encoder.layers[1](torch.relu(self.encoder.layers[0](x)))


def test_squash_name_keeps_the_layers_tail_as_msprobe(train):
    run = train({"wg_distribution": True, "squash_name": True}, steps=1, model_class=Stack)
    names = {name for name, _ in rows_of(run.monitor.tensorboard_dir, "grad_reduced")}
    assert names == {"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"}
    plain = train({"wg_distribution": True}, steps=1, model_class=Stack)
    assert "encoder.layers.0.weight" in {name for name, _ in rows_of(plain.monitor.tensorboard_dir, "grad_reduced")}


def test_a_rank_outside_module_ranks_collects_nothing(train):
    run = train({"wg_distribution": True, "module_ranks": [1]}, steps=3)
    assert run.monitor.handles == [] and not os.path.exists(run.monitor.tensorboard_dir)
    run = train({"wg_distribution": True, "collect_times": 0}, steps=3)
    assert run.monitor.handles == [] and os.listdir(run.monitor.tensorboard_dir) == []


def test_msprobe_older_entry_points(tmp_path, monkeypatch):
    import json

    from msprobe_runtime import TrainerMon
    from msprobe_runtime.config import ConfigError

    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"wg_distribution": True}))
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    monitor = TrainerMon(str(path), params_have_main_grad=False, opt_ty="Megatron_DistributedOptimizer")
    with pytest.raises(ConfigError, match="set_wrapped_optimizer"):
        monitor.monitor_gnorm_with_ad(model)
    monitor.set_wrapped_optimizer(optimizer)
    monitor.monitor_gnorm_with_ad(model)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    assert rows_of(monitor.tensorboard_dir, "grad_reduced").keys() == {("weight", 0), ("bias", 0)}


def test_a_failed_flush_drops_that_step_only(train, monkeypatch, caplog):
    from msprobe_runtime.monitor import writer

    original = writer.CSVWriter.write

    def write(self, prefix, step, rows):
        if step == 3:
            raise OSError("disk full")
        return original(self, prefix, step, rows)

    monkeypatch.setattr(writer.CSVWriter, "write", write)
    run = train({"wg_distribution": True, "ops": ["norm"], "ndigits": 12}, steps=6)
    assert "disk full" in caplog.text
    rows = rows_of(run.monitor.tensorboard_dir, "grad_reduced")
    assert sorted({step for _, step in rows}) == [0, 1, 2, 4, 5]
    names = [name for name, _ in run.model.named_parameters()]
    for step in (4, 5):  # still labelled with the optimizer's step
        for name, grad in zip(names, run.grads[step]):
            assert float(rows[(name, step)]["norm"]) == pytest.approx(grad.double().norm().item(), rel=2e-6)


def test_mg_direction_is_the_sign_agreement_of_gradient_and_exp_avg(train):
    run = train({"mg_direction": True, "ops": ["norm", "max"], "ndigits": 12}, steps=4)
    rows = rows_of(run.monitor.tensorboard_dir, "other")
    names = [name for name, _ in run.model.named_parameters()]
    assert len(rows) == 4 * len(names)
    for index, name in enumerate(names):
        assert float(rows[(name, 0)]["norm"]) == 1.0  # no exp_avg before the first step: msprobe's 1.0
        m = torch.zeros_like(run.grads[0][index])
        for step in range(1, 4):
            m = 0.9 * m + 0.1 * run.grads[step - 1][index]
            g = run.grads[step][index]
            expected = ((g.sign() * m.sign()).double().mean().item() + 1) / 2
            assert float(rows[(name, step)]["max"]) == pytest.approx(expected, abs=1e-6)


class Tagged(torch.Tensor):
    """A tensor subclass that counts the torch functions run on it."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        Tagged.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


class WithSubclass(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.plain = torch.nn.Linear(4, 4)
        self.odd = torch.nn.Parameter(torch.randn(4).as_subclass(Tagged))

    def forward(self, x):
        return self.plain(x) * self.odd.as_subclass(torch.Tensor)


def _sgd_step_calls(monitor_config, tmp_path):
    """The subclass's torch-function calls during one SGD step, with the monitor on or off."""
    import json

    from msprobe_runtime import TrainerMon

    torch.manual_seed(0)
    model = WithSubclass()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = None
    if monitor_config is not None:
        path = tmp_path / "subclass.json"
        path.write_text(json.dumps(monitor_config))
        monitor = TrainerMon(str(path), params_have_main_grad=False)
        monitor.set_monitor(model, optimizer)
    model(torch.randn(2, 4)).sum().backward()
    Tagged.calls = 0
    optimizer.step()
    return Tagged.calls, monitor


def test_a_tensor_subclass_is_left_alone(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    calls, monitor = _sgd_step_calls({"param_distribution": True, "wg_distribution": True}, tmp_path)
    plain_calls, _ = _sgd_step_calls(None, tmp_path)
    assert calls == plain_calls  # none of the subclass's code ran for the monitor: SGD's own calls only
    assert "odd" in caplog.text and "Tagged" in caplog.text
    names = {name for name, _ in rows_of(monitor.tensorboard_dir, "param_origin")}
    assert names == {"plain.weight", "plain.bias"}
