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
