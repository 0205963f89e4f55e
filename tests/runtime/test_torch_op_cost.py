"""The torch-op path of the statistics (an NPU's, or ``MSPROBE_NATIVE_STATS=0 MSPROBE_TRITON=0``): what one
recorded float tensor costs in ATen ops, counted by a TorchDispatchMode (each op the runtime calls, as a device
would launch it). Issue 31: no float32 copy of a bfloat16 tensor, fewer small ops per tensor; the numbers
themselves are compared with the native op's in test_native_stats.py and with Triton's in test_triton_stats.py."""

import math

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from msprobe_runtime.statistics import StatBuffer, slot_values, tensor_kind  # noqa: E402

VIEWS = {"view", "_reshape_alias", "reshape", "alias", "detach", "select", "slice", "unbind", "as_strided", "t"}
VIEWS |= {"permute", "transpose", "expand", "narrow", "unsqueeze", "squeeze", "_unsafe_view", "empty", "lift_fresh"}


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in VIEWS:
            self.ops.append((name, out))
        return out


def ops_of_one_add(t, counts=True):
    stats = StatBuffer(nan_inf_count=counts, native=False)
    stats.add(t, tensor_kind(t))  # the buffers of the flush made here, not counted below
    with Ops() as mode:
        slots = stats.add(t, tensor_kind(t))
    stats.take()
    return mode.ops, slots


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_large_tensor_costs_seven_ops_and_no_float32_copy(dtype):
    t = torch.randn(3, 5000).to(dtype)  # past the staging size: reduced where it is
    ops, (slot, counts) = ops_of_one_add(t)
    names = [name for name, _ in ops]
    # aminmax, sum, the norm (dot: float32), isnan + sum, isinf + sum; the stacked ops were ten or eleven
    assert len(ops) <= 7, names
    for name, out in ops:
        for result in out if isinstance(out, tuple) else (out,):
            # no op makes a copy of the tensor (a float32 one, or any): every result is a number or a mask
            assert result.numel() in (1, t.numel()) and (result.numel() == 1 or result.dtype is torch.bool), name
    values, tally = slot_values(slot), slot_values(counts)
    exact = t.double()
    assert values[:2] == [exact.max().item(), exact.min().item()]
    assert values[2] == float(torch.tensor(values[2]).to(dtype))  # Mean rounded to the dtype
    assert abs(values[2] - exact.mean().item()) <= 2 * torch.finfo(dtype).eps * exact.abs().mean().item()
    assert math.isclose(values[3], exact.norm().item(), rel_tol=2 * torch.finfo(dtype).eps)
    assert values[3] == float(torch.tensor(values[3]).to(dtype))  # Norm rounded to the dtype
    assert tally == [0.0, 0.0]


def test_counts_off_costs_three_ops():
    ops, (_slot, counts) = ops_of_one_add(torch.randn(10_000).bfloat16(), counts=False)
    assert [name for name, _ in ops] == ["aminmax", "sum", "linalg_vector_norm"] and counts is None


def test_a_flush_of_many_tensors_gives_each_its_own_numbers():
    """The rows of one flush, several dtypes, a broadcast view, NaN and Inf: each slot reads its own row."""
    g = torch.Generator().manual_seed(3)
    tensors = [
        (torch.randn(5000 + i, generator=g) * (i + 1)).to(dtype)
        for i, dtype in enumerate([torch.bfloat16, torch.float32, torch.float16, torch.bfloat16, torch.float32] * 30)
    ]
    tensors[7][3] = float("nan")
    tensors[8][5] = float("inf")
    tensors.append(torch.randn(1, 6000, generator=g).expand(3, 6000))  # read once, counted three times
    stats = StatBuffer(nan_inf_count=True, native=False)
    slots = [stats.add(t, tensor_kind(t)) for t in tensors]
    assert stats.take()  # the CPU: on the host already
    for index, (t, (slot, counts)) in enumerate(zip(tensors, slots)):
        values, tally = slot_values(slot), slot_values(counts)
        finite = t.double()[t.double().isfinite()]
        nan, inf = int(t.isnan().sum()), int(t.isinf().sum())
        assert tally == [float(nan), float(inf)], index
        if nan:
            assert math.isnan(values[0]) and math.isnan(values[2]), index
            continue
        assert values[0] == t.double().max().item() and values[1] == t.double().min().item(), index
        if inf:
            assert values[2] == math.inf and values[3] == math.inf, index
            continue
        assert math.isclose(values[2], finite.mean().item(), rel_tol=4 * torch.finfo(t.dtype).eps, abs_tol=1e-3)
        assert math.isclose(values[3], finite.norm().item(), rel_tol=4 * torch.finfo(t.dtype).eps), index


class AllOps(TorchDispatchMode):
    """Every ATen op, views and detaches included: each is a dispatch the host pays for (on an NPU, several µs)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def assert_numbers_of(stats, slot, counts, base):
    """The flush gives ``slot`` and ``counts`` the numbers of ``base`` (finite, float32)."""
    stats.take()
    exact = base.double()
    values = slot_values(slot)
    assert values[:2] == [exact.max().item(), exact.min().item()]
    assert math.isclose(values[2], exact.mean().item(), rel_tol=1e-5, abs_tol=1e-6)
    assert math.isclose(values[3], exact.norm().item(), rel_tol=1e-6)
    assert slot_values(counts) == [0.0, 0.0]


@pytest.mark.parametrize("make", ["plain", "requires_grad", "parameter", "matrix"])
def test_a_small_tensor_is_staged_by_one_copy_and_records_no_autograd_node(make):
    """A small contiguous tensor (an NPU's bias, a norm's weight, an activation that requires grad) is copied into
    its stage as it is: no detached alias and no flat view of it, only the copy (it was detach, view, copy_); the
    stage's buffer stays out of autograd, and the numbers are the tensor's."""
    g = torch.Generator().manual_seed(5)
    base = torch.randn(8, 6, generator=g) if make == "matrix" else torch.randn(48, generator=g)
    t = {
        "plain": base,
        "matrix": base,
        "requires_grad": base.clone().requires_grad_(),
        "parameter": torch.nn.Parameter(base.clone()),
    }[make]
    stats = StatBuffer(nan_inf_count=True, native=False)
    stats.add(torch.randn(base.shape, generator=g), tensor_kind(t))  # the stage made here, not counted below
    with AllOps() as mode:
        slot, counts = stats.add(t, tensor_kind(t))
    assert mode.names == ["copy_"]
    assert torch.is_grad_enabled()  # set back
    for stages in stats._stages.values():
        for stage in stages:
            assert not stage.buffer.requires_grad and stage.buffer.grad_fn is None
    if t.requires_grad:
        (t * 2).sum().backward()  # its graph is the user's alone: nothing of ours was recorded into it
        assert torch.equal(t.grad, torch.full_like(base, 2.0))
    assert_numbers_of(stats, slot, counts, base)


def test_a_staged_copy_under_no_grad_and_a_failed_one_leave_grad_mode_as_it_was():
    stats = StatBuffer(nan_inf_count=False, native=False)
    t = torch.randn(16, requires_grad=True)
    with torch.no_grad():
        stats.add(t, tensor_kind(t))
        assert not torch.is_grad_enabled()
    stats.add(t, tensor_kind(t))
    key = next(iter(stats._stages))
    stage = stats._stages[key][-1]
    stage.views = [torch.empty(0)] * len(stage.views)  # a row the copy cannot fill: the copy raises
    with pytest.raises(RuntimeError):
        stats.add(t, tensor_kind(t))
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("make", ["requires_grad", "parameter"])
def test_a_large_tensor_that_requires_grad_is_read_without_a_detached_alias(make):
    """Past the staging size, a contiguous tensor that requires grad is reduced into its rows with gradients off: the
    reductions and nothing else (it was a detach first), no autograd node of ours, the numbers its own."""
    base = torch.randn(6000, generator=torch.Generator().manual_seed(9))
    t = base.clone().requires_grad_() if make == "requires_grad" else torch.nn.Parameter(base.clone())
    stats = StatBuffer(nan_inf_count=True, native=False)
    stats.add(torch.randn(6000), tensor_kind(t))  # the rows' buffers made here, not counted below
    with AllOps() as mode:
        slot, counts = stats.add(t, tensor_kind(t))
    assert "detach" not in mode.names and mode.names[0] == "aminmax", mode.names
    assert torch.is_grad_enabled()
    (t * 3).sum().backward()
    assert torch.equal(t.grad, torch.full_like(base, 3.0))
    assert_numbers_of(stats, slot, counts, base)


# torch's forward AD scripts its jvp decompositions on first use, and torch.jit.script warns that it is deprecated
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_a_dual_tensor_is_staged_by_a_detached_alias_so_the_stage_has_no_tangent():
    """Gradients off leave forward AD on: within a dual level a tensor is read as before (detached), so that
    the stage's buffer gets no tangent of the user's."""
    import torch.autograd.forward_ad as fwAD

    stats = StatBuffer(nan_inf_count=False, native=False)
    x = torch.randn(16)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.ones(16))
        slot, _ = stats.add(dual, tensor_kind(dual))
        for stages in stats._stages.values():
            assert fwAD.unpack_dual(stages[-1].buffer).tangent is None
        assert torch.equal(fwAD.unpack_dual(dual * 2).tangent, torch.full((16,), 2.0))
    stats.take()
    assert slot_values(slot)[:2] == [x.max().item(), x.min().item()]


def test_a_devices_stage_is_made_at_the_size_of_the_last_step(monkeypatch):
    """A device's stage is made afresh each step (its reductions may still be queued): at the rows its key took
    the step before, one buffer, one set of row views and one reduction, where growing from the first size made
    three of each a step (32, 64, 128 rows for 100 tensors). The CPU's kept buffer is a device's here."""
    monkeypatch.setattr(StatBuffer, "_keeps_stage", staticmethod(lambda device: False))
    g = torch.Generator().manual_seed(11)
    stats = StatBuffer(nan_inf_count=True, native=False)

    def step(count):
        tensors = [torch.randn(16, generator=g) for _ in range(count)]
        with AllOps() as mode:
            slots = [stats.add(t, tensor_kind(t)) for t in tensors]
        (stages,) = stats._stages.values()
        made = [len(stage.views) for stage in stages]
        with AllOps() as flush:
            stats.take()
        for t, (slot, counts) in zip(tensors, slots):
            assert slot_values(slot)[:2] == [t.max().item(), t.min().item()]
            assert slot_values(counts) == [0.0, 0.0]
        return made, mode.names.count("unbind"), flush.names.count("amax")

    assert step(100) == ([32, 64, 128], 3, 3)
    assert step(100) == ([100], 1, 1)
    assert step(150) == ([100, 200], 2, 2)  # more than the last step's: it grows from there
    assert step(150) == ([150], 1, 1)
    assert step(10) == ([150], 1, 1)
    assert step(10) == ([32], 1, 1)


def test_where_triton_does_not_serve_a_device_tensor_is_staged_by_one_copy(monkeypatch):
    """``MSPROBE_TRITON=0`` on a Triton device (here the CPU, taken as one: ``triton_cpu``): once the kernels are
    known not to serve, the device's tensors take the torch ops' one-copy staging too."""
    monkeypatch.setenv("MSPROBE_TRITON", "0")
    stats = StatBuffer(nan_inf_count=False, native=False, triton_cpu=True)
    t = torch.randn(32, requires_grad=True)
    stats.add(t, tensor_kind(t))  # asks for the kernels: none
    assert stats._fused is False
    with AllOps() as mode:
        slot, _ = stats.add(t, tensor_kind(t))
    assert mode.names == ["copy_"]
    stats.take()
    assert slot_values(slot)[:2] == [t.max().item(), t.min().item()]
