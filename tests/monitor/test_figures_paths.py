"""The monitor's figures by its three paths (runtime/monitor/metrics.py): the native op's one pass, the Triton
kernels' (on CPU tensors under Triton's interpreter here, ``TRITON_INTERPRET=1``, set by tests/conftest.py on a
machine without a GPU) and the torch ops, which must agree: Max, Min, the zero and NaN counts and the 0-d value
exactly, Mean and Norm within float32 rounding; and the reuse of a gradient's or weight's figures when it was not
written between two reads (runtime/monitor/reuse.py), never when it was."""

import importlib
import json
import math
import sys

import pytest
import torch

from msprobe_runtime import native_stats
from msprobe_runtime.monitor import metrics, reuse

OPS = ["min", "max", "norm", "zeros", "nans", "mean", "id"]
EXACT = {"min", "max", "zeros", "nans", "id"}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NAN, INF = float("nan"), float("inf")


def _case(name):
    g = torch.Generator().manual_seed(7)
    if name == "odd":
        return torch.randn(1001, generator=g)
    if name == "blocks":  # more than one of the native op's 64 K blocks, several Triton programs
        return torch.randn(200003, generator=g)
    if name == "nan":
        x = torch.randn(3000, generator=g)
        x[[5, 17, 2999]] = NAN
        return x
    if name == "inf":
        x = torch.randn(3000, generator=g)
        x[3], x[9] = INF, -INF
        return x
    if name == "all nan":
        return torch.full((70,), NAN)
    if name == "eps":  # at, just under and just over eps (1e-8 in float32), zeros of both signs
        return torch.tensor([1e-8, 9.99e-9, 1.001e-8, -1e-8, -9.99e-9, 0.0, -0.0, 5e-9, 1.0, -2.0])
    if name == "huge":  # a square past float32's range: Norm inf on every path
        return torch.tensor([1e20, -3.0, 2.0])
    if name == "scalar":
        return torch.tensor(-2.75)
    if name == "transposed":
        return torch.randn(301, 7, generator=g).t()
    if name == "broadcast":
        return torch.randn(5, 1, generator=g).expand(5, 40)
    if name == "sliced":  # not one block of memory: copied (native) or read through its strides (Triton)
        return torch.randn(40, 30, generator=g)[::3, 1:20]
    raise ValueError(name)


CASES = ["odd", "blocks", "nan", "inf", "all nan", "eps", "huge", "scalar", "transposed", "broadcast", "sliced"]


def _assert_agree(got, expected, x, what):
    """``got`` (a one-pass path's) equals ``expected`` (the torch ops') exactly for the EXACT ops; Mean and Norm
    are within float32 rounding of the float64 figures, and near the torch ops' (whose float32 sums of 200 K
    elements are off by a few units in the sixth digit: the one-pass paths sum in float64)."""
    assert got is not None, what
    assert got.dtype == torch.float32 and got.shape == (len(OPS),), what
    wide = x.detach().double()
    truth = {"norm": wide.norm().item(), "mean": wide.mean().item()}
    for op, a, b in zip(OPS, got.tolist(), expected.tolist()):
        if math.isnan(b) or math.isinf(b) or op in EXACT:
            assert a == b or (math.isnan(a) and math.isnan(b)), (what, op, a, b)
        else:
            scale = wide.abs().max().item() if op == "mean" else 0.0  # a mean near 0: rounding of the sum
            assert a == pytest.approx(truth[op], rel=2e-6, abs=2e-7 * scale), (what, op, a, truth[op])
            assert a == pytest.approx(b, rel=1e-5, abs=1e-6 * scale), (what, op, a, b)


@pytest.fixture(scope="module")
def native():
    module = native_stats.load()
    if module is None:
        pytest.skip("the native statistics op cannot be built here")
    return module


@pytest.fixture(scope="module")
def triton_path():
    """metrics' Triton path with kernels defined under the interpreter on a CPU-only machine (imported afresh
    where an earlier import defined them outside it); skipped where Triton is absent or its interpreter cannot
    run the kernels here (as tests/runtime/test_triton_stats.py)."""
    triton = pytest.importorskip("triton")
    name = "msprobe_runtime.triton_stats"
    module = sys.modules.get(name)
    if module is None:
        module = importlib.import_module(name)
    elif not torch.cuda.is_available():
        module = importlib.reload(module)
    saved = metrics._triton[0]
    metrics._triton[0] = module
    try:
        metrics.triton_figures(torch.ones(3), OPS, 1e-8)
    except triton.runtime.errors.InterpreterError as error:
        metrics._triton[0] = saved
        pytest.skip(f"Triton's interpreter cannot run the kernels here: {str(error).splitlines()[0]}")
    yield module
    metrics._triton[0] = saved


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES)
def test_native_op_agrees_with_the_torch_ops(native, case, dtype):
    x = _case(case).to(dtype)
    _assert_agree(metrics.native_figures(x, OPS, 1e-8), metrics.torch_figures(x, OPS, 1e-8), x, (case, dtype))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's, in the interpreter: inf and NaN on purpose
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "case",
    # 200 K elements take seconds in the interpreter; "nan" and "inf" already span three programs
    [pytest.param(case, marks=pytest.mark.slow) if case == "blocks" else case for case in CASES],
)
def test_triton_kernels_agree_with_the_torch_ops(triton_path, case, dtype):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = _case(case).to(dtype).to(device)
    expected = metrics.torch_figures(x, OPS, 1e-8)
    _assert_agree(metrics.triton_figures(x, OPS, 1e-8), expected, x, (case, dtype))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_triton_kernels_take_a_parameter(triton_path):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    weight = torch.nn.Parameter(_case("nan").to(device))
    _assert_agree(metrics.triton_figures(weight, OPS, 1e-8), metrics.torch_figures(weight, OPS, 1e-8), weight, "w")


@pytest.mark.parametrize("eps", [1e-8, 1e-3, 0.5, 1.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_zero_count_compares_in_the_tensors_dtype(native, triton_path, eps, dtype):
    """torch's ``x.abs() < eps`` rounds eps to the tensor's dtype (float16's 1e-8 is 0: nothing is under it);
    values straddle eps's neighbours in each dtype."""
    bound = torch.tensor(eps, dtype=dtype)
    near = torch.stack([bound, torch.nextafter(bound.float(), torch.tensor(0.0)).to(dtype)])
    x = torch.cat([near, -near, torch.tensor([0.0, 3.0], dtype=dtype), near * 2, near / 2])
    expected = metrics.torch_figures(x, ["zeros", "nans"], eps)
    assert torch.equal(metrics.native_figures(x, ["zeros", "nans"], eps), expected)
    assert torch.equal(metrics.triton_figures(x, ["zeros", "nans"], eps), expected)


def test_ops_come_out_in_the_order_asked(native):
    x = _case("nan")
    for ops in (["norm"], ["nans", "min"], ["mean", "zeros", "max", "id", "norm"]):
        got = metrics.native_figures(x, ops, 1e-8)
        torch.testing.assert_close(got, metrics.torch_figures(x, ops, 1e-8), equal_nan=True, rtol=2e-6, atol=0)


def test_what_the_fast_paths_refuse_goes_to_the_torch_ops(native, monkeypatch):
    # empty, integer and float64 tensors: the native op says None; figures gives the torch path's numbers
    assert metrics.native_figures(torch.empty(0), OPS, 1e-8) is None
    assert metrics.native_figures(torch.arange(5), OPS, 1e-8) is None
    assert metrics.native_figures(torch.randn(9, dtype=torch.float64), OPS, 1e-8) is None
    assert torch.isnan(metrics.figures(torch.empty(0), OPS, 1e-8)).all()
    assert torch.isnan(metrics.figures(torch.arange(5), OPS, 1e-8)).all()
    x = torch.randn(9, dtype=torch.float64)
    got = metrics.figures(x, OPS, 1e-8)
    assert got.dtype == torch.float32
    assert got[2].item() == pytest.approx(x.norm().item(), rel=2e-7)  # summed in float64, then made float32
    # a CPU float32 tensor never reaches the torch ops while the native op is there
    monkeypatch.setattr(metrics, "torch_figures", lambda *args: pytest.fail("the torch-op path was taken"))
    assert metrics.figures(torch.randn(50), ["norm", "max"], 1e-8).shape == (2,)


def test_a_failed_native_build_is_asked_once_and_the_torch_ops_serve(monkeypatch):
    """The monitor loads the op through native_stats.load, which remembers a failed build (its ``failed``
    note, tests/runtime/test_native_build_cache.py); here the failure is asked for once, not per tensor."""
    calls = []

    def failing():
        calls.append(1)
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(native_stats, "_load", failing)
    native_stats.reset()
    metrics.reset()
    try:
        x = _case("nan")
        for _ in range(5):
            assert torch.equal(
                metrics.figures(x, OPS, 1e-8).nan_to_num(7), metrics.torch_figures(x, OPS, 1e-8).nan_to_num(7)
            )
        assert calls == [1]
    finally:
        native_stats.reset()
        metrics.reset()


# ------------------------------------------------------------------------------------------------ reuse


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


@pytest.fixture(autouse=True)
def _reuse_on(monkeypatch):
    """The reuse is opt-in (reuse.py): the tests below turn it on, unless they say otherwise."""
    monkeypatch.setenv("MSPROBE_MONITOR_REUSE", "1")


def test_the_reuse_is_off_unless_asked_for(tmp_path, monkeypatch):
    monkeypatch.delenv("MSPROBE_MONITOR_REUSE")
    assert not reuse.Figures(["norm"], 1e-8).enabled

    def scale_through_data(model):  # a write the version counter misses: read again, as the reuse is off
        for param in model.parameters():
            param.grad.data.mul_(0.5)

    written, grads, _, mon = _monitored(tmp_path, monkeypatch, between=scale_through_data)
    names = list(written[("grad_reduced", 0)])
    for step in range(3):
        reduced, unreduced = written[("grad_reduced", step)], written[("grad_unreduced", step)]
        for name in names:
            assert reduced[name][0] == pytest.approx(0.5 * unreduced[name][0], rel=1e-6)
        _close_rows([reduced[name] for name in names], _fresh(grads[step]))
    assert mon._figures.computed == 4 * 4 * 3


def _monitored(
    tmp_path, monkeypatch, steps=3, between=None, after=None, fused=None, ops=("norm", "max", "min"), stepper=None
):
    """A monitored AdamW run: ``between(model)`` after backward, ``after(model)`` after each step, ``stepper``
    (``(loss, optimizer)``: backward and step) in place of ``loss.backward(); optimizer.step()``. Returns
    (figures written as {(prefix, step): {name: values}}, gradients after backward and weights before each
    step, the monitor)."""
    from msprobe_runtime import TrainerMon

    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"wg_distribution": True, "param_distribution": True, "ops": list(ops)}))
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    mon = TrainerMon(str(config), params_have_main_grad=False)
    mon.set_monitor(model, optimizer)
    written = {}

    def write(prefix, step, rows):
        written[(prefix, step)] = {tag.split("/")[0]: list(values) for tag, values, _, _ in rows}

    mon.summary_writer.write = write
    data, target = torch.randn(32, 16), torch.randn(32, 4)
    grads, weights = [], []
    for _ in range(steps):
        optimizer.zero_grad()
        weights.append([p.detach().clone() for p in model.parameters()])
        loss = torch.nn.functional.mse_loss(model(data), target)
        if stepper is not None:
            stepper(loss, optimizer)
            grads.append([p.grad.clone() for p in model.parameters()])
        else:
            loss.backward()
            if between is not None:
                between(model)
            grads.append([p.grad.clone() for p in model.parameters()])
            optimizer.step()
        if after is not None:
            after(model)
    mon.close()
    return written, grads, weights, mon


def _fresh(tensors, ops=("norm", "max", "min")):
    return [metrics.torch_figures(t, list(ops), 1e-8).tolist() for t in tensors]


def _close_rows(got, expected):
    for a, b in zip(got, expected):
        assert a == pytest.approx(b, rel=2e-6)


def test_an_unchanged_gradient_and_weight_are_read_once(tmp_path, monkeypatch):
    written, grads, weights, mon = _monitored(tmp_path, monkeypatch, steps=3)
    names = list(written[("grad_reduced", 0)])
    assert len(names) == 4
    for step in range(3):
        reduced, unreduced = written[("grad_reduced", step)], written[("grad_unreduced", step)]
        assert reduced == unreduced
        _close_rows([reduced[name] for name in names], _fresh(grads[step]))
        _close_rows([written[("param_origin", step)][name] for name in names], _fresh(weights[step]))
        if step:  # the weights after step N are those before step N+1: the same figures
            assert written[("param_origin", step)] == written[("param_updated", step - 1)]
    # per step: one gradient read and param_updated; param_origin read at step 0 only
    assert mon._figures.computed == 4 * (3 * 2 + 1)


def test_clipping_between_backward_and_step_gives_new_grad_reduced_figures(tmp_path, monkeypatch):
    def clip(model):
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e-3)

    written, grads, _, mon = _monitored(tmp_path, monkeypatch, between=clip)
    names = list(written[("grad_reduced", 0)])
    for step in range(3):
        reduced, unreduced = written[("grad_reduced", step)], written[("grad_unreduced", step)]
        for name in names:
            assert reduced[name][0] < unreduced[name][0]  # norm: clipped
        _close_rows([reduced[name] for name in names], _fresh(grads[step]))  # the clipped gradients'
        total = math.sqrt(sum(reduced[name][0] ** 2 for name in names))
        assert total == pytest.approx(1e-3, rel=1e-4)
    assert mon._figures.computed == 4 * (3 * 3 + 1)


def test_gradients_unscaled_by_a_grad_scaler_are_read_again(tmp_path, monkeypatch):
    """``scaler.step`` unscales the gradients in place without a version bump, just before the optimizer's step:
    grad_reduced is the unscaled gradient's, grad_unreduced the scaled one's, as msprobe's hooks read them."""
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)

    def stepper(loss, optimizer):
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    written, grads, _, mon = _monitored(tmp_path, monkeypatch, stepper=stepper)
    names = list(written[("grad_reduced", 0)])
    for step in range(3):
        reduced, unreduced = written[("grad_reduced", step)], written[("grad_unreduced", step)]
        for name in names:
            assert unreduced[name][0] == pytest.approx(1024.0 * reduced[name][0], rel=1e-6)
        _close_rows([reduced[name] for name in names], _fresh(grads[step]))  # unscaled by the step


def test_no_gradient_reuse_under_a_megatron_optimizer(tmp_path, monkeypatch):
    """megatron's optimizers unscale their own way: a step called from megatron/core/optimizer/ reads the
    gradients again (a stand-in caller compiled under that file name)."""
    namespace = {}
    code = "def megatron_step(loss, optimizer):\n    loss.backward()\n    optimizer.step()\n"
    exec(compile(code, "/site-packages/megatron/core/optimizer/optimizer.py", "exec"), namespace)
    written, _, _, mon = _monitored(tmp_path, monkeypatch, stepper=namespace["megatron_step"])
    assert written[("grad_reduced", 1)] == written[("grad_unreduced", 1)]  # the same values, read twice
    assert mon._figures.computed == 4 * (3 * 3 + 1)


def test_weights_written_between_steps_are_read_again(tmp_path, monkeypatch):
    def rescale(model):
        with torch.no_grad():
            for param in model.parameters():
                param.mul_(0.5)

    written, _, weights, _ = _monitored(tmp_path, monkeypatch, after=rescale)
    names = list(written[("param_origin", 0)])
    for step in (1, 2):
        origin = written[("param_origin", step)]
        assert origin != written[("param_updated", step - 1)]
        _close_rows([origin[name] for name in names], _fresh(weights[step]))


def test_a_fused_optimizers_update_is_read_again(tmp_path, monkeypatch):
    """fused AdamW writes the weights without bumping their version counter: param_updated is never taken from
    param_origin's read."""
    written, _, weights, _ = _monitored(tmp_path, monkeypatch, fused=True)
    names = list(written[("param_origin", 0)])
    for step in (0, 1):
        updated = written[("param_updated", step)]
        assert updated != written[("param_origin", step)]
        _close_rows([updated[name] for name in names], _fresh(weights[step + 1]))


def test_writes_the_version_counter_does_not_see():
    """Why the reuse is limited (reuse.py): these writes leave the version counter as it was. Should torch start
    counting them, this fails, and the limits can be relaxed."""
    param = torch.nn.Parameter(torch.ones(4))
    param.grad = torch.ones(4)
    torch.optim.AdamW([param], lr=0.1, fused=True).step()
    assert param._version == 0 and not torch.equal(param.detach(), torch.ones(4))
    grad = torch.full((4,), 8.0)
    torch._amp_foreach_non_finite_check_and_unscale_([grad], torch.zeros(()), torch.full((), 0.5))
    assert grad._version == 0 and torch.equal(grad, torch.full((4,), 4.0))
    param.data.mul_(2)
    assert param._version == 0
    # and those it sees: the for-loop optimizer, clipping
    torch.optim.AdamW([param], lr=0.1, foreach=False).step()
    assert param._version > 0
    torch.nn.utils.clip_grad_norm_([param], 1e-3)
    assert param.grad._version > 0


def test_reuse_turned_off_reads_every_tensor(tmp_path, monkeypatch):
    monkeypatch.setenv("MSPROBE_MONITOR_REUSE", "0")
    written, _, _, mon = _monitored(tmp_path, monkeypatch)
    assert mon._figures.computed == 4 * 4 * 3
    assert written[("grad_reduced", 1)] == written[("grad_unreduced", 1)]  # equal values, read twice


def test_no_reuse_in_a_world_of_several_ranks(monkeypatch):
    figures = reuse.Figures(["norm"], 1e-8)
    assert figures.enabled
    x = torch.randn(10)
    first = figures.of("grad_unreduced", x)
    assert figures.of("grad_reduced", x) is first
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    figures.end_step()  # a process group made after the monitor is seen at the end of a step
    assert not figures.enabled
    assert figures.of("grad_reduced", x) is not figures.of("grad_reduced", x)
    assert not reuse.Figures(["norm"], 1e-8).enabled
