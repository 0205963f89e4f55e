"""The Triton statistics kernels (runtime/triton_stats.py) give the torch-op path's numbers: Max, Min and the
NaN/Inf counts exactly, Mean and Norm to the rounding of float32 sums and of the tensor's dtype, on every float
dtype, odd sizes, views and strides, 0-d tensors, NaN/Inf and huge values; as the native CPU op where it
builds. Without a GPU they run on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, set here
before Triton is imported); with one, on CUDA tensors, compiled. Skipped where Triton is not installed."""

import importlib
import math
import os
import struct
import sys

import pytest

torch = pytest.importorskip("torch")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    # read by Triton when it is imported and when a kernel is defined or launched (tests/conftest.py sets it
    # before any import, on a machine without a GPU; here for a run of this file alone elsewhere)
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")
tl = triton.language

from fixtures.triton_kernels import Failing, statistics_kernels  # noqa: E402
from msprobe_runtime import native_stats, statistics  # noqa: E402
from msprobe_runtime.statistics import StatBuffer, tensor_kind  # noqa: E402

# the kernels' module, for a test kernel that calls ``_decode`` (the fixture's reload re-runs it in place)
kernels = importlib.import_module("msprobe_runtime.triton_stats")

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's, in the interpreter: inf and NaN on purpose
FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@pytest.fixture(scope="module", autouse=True)
def triton_stats():
    """The kernels' module (fixtures/triton_kernels.py: imported afresh under the interpreter where needed)."""
    return statistics_kernels(DEVICE)


@pytest.fixture(autouse=True)
def triton_on(monkeypatch):
    monkeypatch.delenv("MSPROBE_TRITON", raising=False)


def fused_buffer(counts=True):
    return StatBuffer(nan_inf_count=counts, native=False, triton_cpu=DEVICE == "cpu")


def statistics_of(buffer, tensors):
    """Each tensor's (numbers, counts or None) through ``buffer``: recorded, flushed, read."""
    slots = [buffer.add(t, tensor_kind(t)) for t in tensors]
    buffer.take()
    return [(slot.values(), None if counts is None else counts.values()) for slot, counts in slots]


def ulp(dtype, x):
    """The spacing of ``dtype``'s numbers at ``x`` (float32's for float64: Mean and Norm are float sums)."""
    if not math.isfinite(x):
        return 0.0
    eps = torch.finfo(torch.float32 if dtype is torch.float64 else dtype).eps
    tiny = torch.finfo(torch.float32 if dtype is torch.float64 else dtype).tiny
    return eps * max(abs(x), tiny)


def same(dtype, t, mine, theirs, what):
    """Max and Min (and a 0-d value) equal bit for bit, NaN where the other is; Mean and Norm within two of the
    dtype's roundings plus a float32 sum's error (1e-5 of the mean magnitude, of the norm): the torch ops' own
    float32 sums are further from the exact ones than the kernels' (a float32 norm of 524 621 values in [0, 1):
    exact 417.831472, the kernels 417.831482, torch.dot 417.831238)."""
    assert len(mine) == len(theirs), (what, mine, theirs)
    for index, (a, b) in enumerate(zip(mine, theirs)):
        if math.isnan(b) or math.isnan(a):
            assert math.isnan(a) and math.isnan(b), (what, index, mine, theirs)
        elif index < 2 or len(mine) == 1:
            assert a == b, (what, index, mine, theirs)
        elif math.isinf(a) or math.isinf(b):
            assert a == b, (what, index, mine, theirs)
        else:
            scale = t.double().abs().mean().item() if index == 2 else abs(b)
            tolerance = 2 * ulp(dtype, b) + 1e-5 * scale
            assert abs(a - b) <= tolerance, (what, index, mine, theirs, tolerance)


def check(tensors, counts=True):
    fused = statistics_of(fused_buffer(counts), tensors)
    torch_ops = statistics_of(StatBuffer(nan_inf_count=counts, native=False), tensors)
    for index, (t, (values, tally), (expected, expected_tally)) in enumerate(zip(tensors, fused, torch_ops)):
        what = f"tensor {index}: {t.dtype} {tuple(t.shape)} strides {t.stride()}"
        same(t.dtype, t, values, expected, what)
        assert tally == expected_tally, (what, tally, expected_tally)
    return fused


def on_device(t):
    return t.to(DEVICE)


@pytest.mark.parametrize("dtype", FLOATS)
def test_every_float_dtype_and_odd_sizes(dtype):
    g = torch.Generator().manual_seed(0)
    sizes = [1, 7, 1023, 1024, 1025, 4097, 70001]
    tensors = [on_device((torch.randn(n, generator=g) * 3 + 0.5).to(dtype)) for n in sizes]
    tensors.append(on_device((torch.randn(3, 5, 7, generator=g)).to(dtype)))
    fused = check(tensors)
    assert all(values is not None for values, _ in fused)


@pytest.mark.slow
def test_a_tensor_of_many_rows_per_program(triton_stats):
    """More than ``_BLOCK * _MAX_ROWS`` elements: each program reads several blocks."""
    n = triton_stats._BLOCK * triton_stats._MAX_ROWS * 2 + 333
    g = torch.Generator().manual_seed(1)
    check([on_device(torch.randn(n, generator=g).to(torch.bfloat16)), on_device(torch.rand(n, generator=g))])
    check_low([on_device((torch.randn(n, generator=g) * 100).to(dtype)) for dtype in FP8[:2]])


@pytest.mark.parametrize("dtype", FLOATS)
def test_views_and_strides(dtype):
    g = torch.Generator().manual_seed(2)
    base = on_device(torch.randn(6, 10, 9, generator=g).to(dtype))
    views = [
        base.transpose(0, 2),  # permuted: read in memory order
        base[:, ::3, 1:],  # a strided slice: read through its strides
        base[2],  # an offset view
        base[:, 4, :].unsqueeze(1).expand(6, 5, 9),  # broadcast: read once, counted five times
        base.unfold(1, 4, 3),  # overlapping windows (4 dimensions)
        base.reshape(2, 3, 2, 5, 9).transpose(1, 3)[..., ::2],  # 5 dimensions, not dense: the torch ops serve
        torch._neg_view(base),  # a negative view (its memory holds the values negated)
    ]
    check(views)


@pytest.mark.parametrize("dtype", FLOATS)
def test_zero_dim_and_single(dtype):
    tensors = [on_device(torch.tensor(v, dtype=dtype)) for v in (2.5, -0.0, float("inf"), float("nan"), 1e-3)]
    tensors.append(on_device(torch.tensor([7.25], dtype=dtype)))
    fused = check(tensors)
    assert fused[0][0] == [2.5]
    assert fused[3][1] == [1.0, 0.0]


@pytest.mark.parametrize("dtype", FLOATS)
def test_nan_and_inf(dtype):
    nan, inf = float("nan"), float("inf")
    g = torch.Generator().manual_seed(3)
    noisy = torch.randn(5000, generator=g)
    noisy[[3, 1500, 4999]] = nan
    noisy[[10, 20]] = inf
    noisy[30] = -inf
    tensors = [
        torch.tensor([1.0, inf, 2.0]),
        torch.tensor([inf, -inf]),
        torch.tensor([nan, 1.0, -inf]),
        noisy,
        torch.full((2049,), -inf),
    ]
    fused = check([on_device(t.to(dtype)) for t in tensors])
    assert fused[3][1] == [3.0, 3.0]
    assert fused[0][0][:2] == [inf, 1.0]


@pytest.mark.parametrize("dtype", FLOATS)
def test_huge_values(dtype):
    """Near the dtype's largest value: float32 sums and squares pass float's range, and are inf, as torch's."""
    top = torch.finfo(dtype).max if dtype is not torch.float64 else 1e300
    tensors = [
        torch.full((3000,), top / 2, dtype=dtype),
        torch.tensor([top, -top, top], dtype=dtype),
        torch.full((5,), min(3.0e19, top), dtype=dtype),
        torch.tensor([top, 1.0], dtype=dtype),
    ]
    check([on_device(t) for t in tensors])


def test_without_counts():
    g = torch.Generator().manual_seed(4)
    fused = check([on_device(torch.randn(100, generator=g))], counts=False)
    assert fused[0][1] is None


def test_as_the_native_op_where_it_builds():
    native = native_stats.load()
    if native is None or DEVICE != "cpu":
        pytest.skip("no native op here")
    g = torch.Generator().manual_seed(5)
    tensors = [torch.randn(n, generator=g).to(dtype) for n in (1, 1000, 70001) for dtype in FLOATS[:3]]
    fused = statistics_of(fused_buffer(), tensors)
    for t, (values, tally) in zip(tensors, fused):
        row = native.stats(t, True)
        same(t.dtype, t, values, row[:4], str(t.dtype))
        assert tally == row[4:6]


def test_arenas_that_fill_up_before_the_flush(monkeypatch, triton_stats):
    """An arena closed early (its tensors or rows used up) gives its slots their numbers all the same."""
    monkeypatch.setattr(triton_stats, "_ARENA_TENSORS", 3)
    monkeypatch.setattr(triton_stats, "_ARENA_ROWS", 4)
    g = torch.Generator().manual_seed(6)
    tensors = [
        on_device(torch.randn(n, generator=g).to(dtype))
        for n in (5, 3000, 9000, 1, 20000, 7)
        for dtype in (torch.float32, torch.float64)
    ]
    check(tensors)
    check_low([on_device((torch.randn(n, generator=g) * 9).to(dtype)) for n in (5, 3000, 9000, 1, 7) for dtype in FP8])


def test_identical_runs_give_identical_bits():
    g = torch.Generator().manual_seed(7)
    tensors = [on_device(torch.randn(n, generator=g).to(torch.bfloat16)) for n in (5, 70001)]
    assert statistics_of(fused_buffer(), tensors) == statistics_of(fused_buffer(), tensors)


def test_the_kernels_serve_what_they_read_and_nothing_else(triton_stats):
    fused = triton_stats.TritonStats(True, statistics.Slot, statistics.dense_view)
    assert fused.add(on_device(torch.empty(0)), 4) is None
    assert fused.add(on_device(torch.arange(5)), 2) is None
    assert fused.add(on_device(torch.ones(3, dtype=torch.bool)), 2) is None
    assert fused.add(on_device(torch.randn(3, dtype=torch.float64)), 4) is None  # float64: no Mean nor Norm
    assert fused.add(on_device(torch.randn(3)), 2) is None
    assert fused.add(on_device(torch.randn(3)), 4) is not None
    assert len(fused.finish()) == 2 and fused.finish() == []


def test_switched_off_the_torch_ops_serve(monkeypatch, triton_stats):
    monkeypatch.setenv("MSPROBE_TRITON", "0")
    launched = []
    monkeypatch.setattr(triton_stats.TritonStats, "add", lambda self, t, kind: launched.append(t))
    buffer = fused_buffer()
    t = on_device(torch.randn(10))
    ((values, counts),) = statistics_of(buffer, [t])
    assert buffer._fused is False and not launched
    assert values[0] == t.max().item()


def test_the_cpu_path_never_asks_for_triton(monkeypatch, triton_stats):
    launched = []
    monkeypatch.setattr(triton_stats.TritonStats, "add", lambda self, t, kind: launched.append(t))
    buffer = StatBuffer(native=False)
    statistics_of(buffer, [torch.randn(10)])
    assert buffer._fused is None and not launched


def test_no_host_sync_while_recording(monkeypatch):
    synced = []
    for name in ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda self, *a, _n=name, _o=original, **k: (synced.append(_n), _o(self, *a, **k))[1]
        )
    buffer = fused_buffer()
    slots = [
        buffer.add(t, tensor_kind(t))
        for t in (on_device(torch.randn(3000)), on_device(torch.tensor(1.5)), on_device(torch.randn(8, 9).t()))
    ]
    assert buffer._fused and all(slot.pending is None for slot, _ in slots)  # the kernels' slots, no torch op's
    buffer._fused.finish()
    monkeypatch.undo()
    assert synced == []


def _dump(tmp_path, name, calls):
    import glob
    import json

    import msprobe_runtime as rt
    from msprobe_runtime import PrecisionDebugger

    config = tmp_path / f"{name}.json"
    config.write_text(json.dumps({"dump_path": str(tmp_path / name), "level": "L1"}))
    debugger = PrecisionDebugger(config_path=str(config))
    debugger.start()
    try:
        calls(rt)
    finally:
        debugger.stop()
        debugger.wait()
    [path] = glob.glob(os.path.join(glob.escape(str(tmp_path / name)), "step0", "*", "dump.json"))
    with open(path) as handle:
        return json.load(handle)["data"]


def test_the_dump_through_the_kernels(tmp_path, monkeypatch):
    """A recorded run writes the kernels' numbers into dump.json: as the torch ops' run, to their rounding."""
    from msprobe_runtime import collector

    g = torch.Generator().manual_seed(8)
    tensors = [
        on_device(t)
        for t in (
            torch.randn(3000, generator=g).to(torch.bfloat16),
            torch.randn(5, 7).t(),
            torch.tensor(2.5, dtype=torch.float16),
            torch.randn(40, dtype=torch.float64),
            torch.tensor([1.0, float("nan"), float("inf")]),
        )
    ]

    def calls(rt):
        for t in tensors:
            rt.call("Torch.clone", torch.clone, t)

    launched = []
    monkeypatch.setattr(collector, "StatBuffer", lambda counts: StatBuffer(counts, native=False, triton_cpu=True))
    original_add = triton_stats_module().TritonStats.add
    monkeypatch.setattr(
        triton_stats_module().TritonStats,
        "add",
        lambda self, t, width: launched.append(width) or original_add(self, t, width),
    )
    fused = _dump(tmp_path, "fused", calls)
    monkeypatch.setattr(collector, "StatBuffer", lambda counts: StatBuffer(counts, native=False))
    torch_ops = _dump(tmp_path, "torch_ops", calls)
    assert len(launched) == 2 * len(tensors)  # each call's input and output
    assert sorted(fused) == sorted(torch_ops) and len(fused) == len(tensors)
    for name, entry in torch_ops.items():
        for field in ("input_args", "output"):
            for mine, theirs in zip(fused[name][field], entry[field]):
                assert {k: v for k, v in mine.items() if k not in ("Mean", "Norm")} == {
                    k: v for k, v in theirs.items() if k not in ("Mean", "Norm")
                }, (name, field)
                t = tensors[int(name.split(".")[2])]
                numbers = [mine[k] for k in ("Max", "Min", "Mean", "Norm")]
                expected = [theirs[k] for k in ("Max", "Min", "Mean", "Norm")]
                same(
                    t.dtype,
                    t,
                    [math.nan if v is None else v for v in numbers],
                    [math.nan if v is None else v for v in expected],
                    name,
                )


def triton_stats_module():
    return sys.modules["msprobe_runtime.triton_stats"]


def test_a_kernel_that_fails_here_leaves_the_torch_ops(monkeypatch, triton_stats, caplog):
    """A kernel that does not compile or launch on this machine is said once, and the torch ops serve from
    then on: the numbers are theirs, not nulls. The tensors the kernels took before are still finished."""
    buffer = fused_buffer()
    g = torch.Generator().manual_seed(9)
    before = on_device(torch.randn(50, generator=g))
    slot_before, _ = buffer.add(before, tensor_kind(before))

    monkeypatch.setattr(triton_stats, "_partials", Failing("PTX .version 9.9 does not support .target sm_999"))
    tensors = [on_device(torch.randn(n, generator=g).to(torch.bfloat16)) for n in (10, 5000)]
    with caplog.at_level("WARNING", logger="msprobe_runtime"):
        fused = statistics_of(buffer, tensors)
    warnings = [r.getMessage() for r in caplog.records if "Triton" in r.getMessage()]
    assert len(warnings) == 1 and "sm_999" in warnings[0], warnings
    expected = statistics_of(StatBuffer(native=False), tensors)
    assert fused == expected  # the torch ops' own numbers, bit for bit
    assert slot_before.values()[0] == before.max().item()


# float8 (KIND_LOW): the kernels decode the bytes themselves (triton_stats._decode), so the 256 encodings of
# each format are checked one by one, then whole tensors against ``StatBuffer._add_low``'s torch ops
FP8 = [
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
]


def every_encoding(dtype):
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)


def check_low(tensors, counts=True):
    """As ``check``, for float8: Max, Min and the four (or two) counts exactly, Mean and Norm to float32's
    rounding (``_add_low`` sums float32 chunks with torch ops, the kernels float32 lanes then float64 rows)."""
    fused = statistics_of(fused_buffer(counts), tensors)
    torch_ops = statistics_of(StatBuffer(nan_inf_count=counts, native=False), tensors)
    for index, (t, (values, tally), (expected, expected_tally)) in enumerate(zip(tensors, fused, torch_ops)):
        what = f"tensor {index}: {t.dtype} {tuple(t.shape)} strides {t.stride()}"
        assert len(values) == 4 and len(tally) == (4 if counts else 2), (what, values, tally)
        same(torch.float32, t.float(), values, expected, what)
        assert tally == expected_tally, (what, tally, expected_tally)
    return fused


@triton.jit
def _decode_all(x, out, LOW: tl.constexpr):
    lanes = tl.arange(0, 256)
    tl.store(out + lanes, kernels._decode(tl.load(x + lanes), LOW))


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_float8_decoded_as_torch_decodes(dtype, triton_stats):
    """The kernels' decoding of each of the 256 bytes: torch's float32 value bit for bit (NaN where torch's is)."""
    out = on_device(torch.empty(256))
    _decode_all[(1,)](
        on_device(torch.arange(256, dtype=torch.int32).to(torch.uint8)), out, LOW=triton_stats._LOW[dtype]
    )
    expected = every_encoding(dtype).float()
    out = out.cpu()
    assert torch.equal(out.isnan(), expected.isnan())
    assert torch.equal(out[~out.isnan()].view(torch.int32), expected[~expected.isnan()].view(torch.int32))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_float8_every_encoding_alone(dtype):
    """Each encoding as a one-element tensor: its value (NaN, Inf, both zeros, subnormals, the largest) and
    its counts exactly as torch decodes it (Triton's interpreter alone reads e4m3fn's NaN as 480)."""
    raw = every_encoding(dtype)
    tensors = [on_device(raw[i : i + 1]) for i in range(256)]
    fused = check_low(tensors)
    decoded = raw.float()
    for i, (values, tally) in enumerate(fused):
        v = decoded[i].item()
        if math.isnan(v):
            assert math.isnan(values[0]) and tally[0] == 1.0, (i, values, tally)
        else:
            assert values == [v, v, v, abs(v)], (i, values, v)
            assert tally == [0.0, float(math.isinf(v)), float(v == 0), float(abs(v) == torch.finfo(dtype).max)]


def float8_cases(dtype):
    raw = every_encoding(dtype)
    f = raw.float()
    top, tiny = torch.finfo(dtype).max, torch.finfo(dtype).tiny
    g = torch.Generator().manual_seed(10)
    matrix = (torch.linspace(-3, 3, 60).reshape(6, 10) * 7).to(dtype)
    noisy = (torch.randn(5000, generator=g) * top / 4).to(dtype)
    noisy[[3, 1500, 4999]] = raw[f.isnan()][0]
    cube = (torch.randn(4, 6, 10, generator=g) * 5).to(dtype)
    cases = [
        raw,  # all 256 encodings
        raw[torch.isfinite(f)],
        raw[~torch.isnan(f)],  # e5m2: +-Inf, no NaN
        torch.tensor([0.0, -0.0, tiny / 2, tiny / 4, -tiny / 2, 0.0]).to(dtype),  # zeros and subnormals
        torch.tensor([top, -top, top, 1.0, 0.5, 0.0, top / 2, -top]).to(dtype),  # saturated
        matrix,
        matrix.t(),  # transposed: read in memory order
        torch.tensor([[top], [0.0], [-1.5]]).to(dtype).expand(3, 7),  # broadcast: read once, counted 7 times
        torch.tensor(-top).to(dtype),  # 0-d
        torch.tensor(0.0).to(dtype),
        cube[:, ::2, 1:],  # a strided slice: read through its strides
        cube.reshape(2, 2, 3, 2, 10).transpose(1, 3)[..., ::3],  # 5 dimensions, not dense: the torch ops serve
        noisy,
    ]
    cases += [(torch.randn(n, generator=g) * 40).to(dtype) for n in (1, 7, 1023, 1025, 4097, 70001)]
    return [on_device(t) for t in cases]


@pytest.mark.parametrize("counts", [True, False], ids=["nan_inf", "no_nan_inf"])
@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_float8_as_the_torch_ops(dtype, counts, monkeypatch, triton_stats):
    served = []
    original = triton_stats.TritonStats.add
    monkeypatch.setattr(
        triton_stats.TritonStats, "add", lambda self, t, width: served.append(original(self, t, width)) or served[-1]
    )
    tensors = float8_cases(dtype)
    fused = check_low(tensors, counts)
    # every case but the 5-dimensional one is the kernels' (that one the torch ops', as for any dtype)
    assert [result is not None for result in served] == [index != 11 for index in range(len(tensors))]
    values, tally = fused[0]  # all 256 encodings
    fnuz = "fnuz" in str(dtype)  # one zero (its -0 is the NaN), no Inf
    assert math.isnan(values[0]) and tally[-2:] == [1.0 if fnuz else 2.0, 2.0]  # zeros, saturated magnitudes
    if counts:
        nans = 1 if fnuz else (6 if dtype is torch.float8_e5m2 else 2)
        assert tally[:2] == [float(nans), 2.0 if dtype is torch.float8_e5m2 else 0.0]
    assert fused[7][1][-2:] == [7.0, 7.0]  # broadcast: one zero, one saturated value, each seven times


def test_float8_scaled_views_are_the_torch_ops(monkeypatch, triton_stats):
    """A scaled class's float8 view (``float8_view``: statistics of data / scale) is left to the torch ops."""
    served = []
    monkeypatch.setattr(triton_stats.TritonStats, "add", lambda self, t, width: served.append(t))
    data = on_device(torch.tensor([1.0, -2.0, 448.0]).to(torch.float8_e4m3fn))
    view = statistics.float8_view(data, on_device(torch.tensor(4.0)), True)
    ((values, tally),) = statistics_of(fused_buffer(), [view])
    assert served == [] and values[:3] + values[4:] == [112.0, -0.5, 37.25, 0.25]
    assert values[3] == pytest.approx(math.sqrt(0.25**2 + 0.5**2 + 112.0**2), rel=1e-6)
    assert tally == [0.0, 0.0, 0.0, 1.0]


def test_float8_when_the_kernel_fails_the_torch_ops(monkeypatch, triton_stats, caplog):
    monkeypatch.setattr(triton_stats, "_partials", Failing("cannot lower uint8 here"))
    tensors = [on_device(every_encoding(dtype)) for dtype in FP8]
    buffer = fused_buffer()
    with caplog.at_level("WARNING", logger="msprobe_runtime"):
        fused = statistics_of(buffer, tensors)
    warnings = [r.getMessage() for r in caplog.records if "Triton" in r.getMessage()]
    assert len(warnings) == 1 and "uint8" in warnings[0], warnings
    assert buffer._fused_devices == ()
    expected = statistics_of(StatBuffer(native=False), tensors)
    assert repr(fused) == repr(expected)  # the torch ops' numbers, bit for bit (repr: NaN equal to NaN)


# ------------------------------------------------------------------ several tensors per launch (issue 31)


KERNELS = ("_partials_many", "_partials_few", "_partials")  # the partials' kernels: a table, a few, one tensor


class Launches:
    """Counts the launches of a kernel of the module, then launches it."""

    def __init__(self, kernel):
        self.kernel, self.count = kernel, 0

    def __getitem__(self, grid):
        self.count += 1
        return self.kernel[grid]


def exact(results):
    """Each number's bits (a NaN equal to a NaN)."""
    return [[None if v is None else [struct.pack("<d", x) for x in v] for v in pair] for pair in results]


def with_kind(t):
    return t, tensor_kind(t)


def prime(buffer):
    """A first tensor through ``buffer``: its kernels made (``one_launch`` is a no-op before)."""
    return buffer.add(*with_kind(on_device(torch.ones(3))))


def batched_statistics(tensors, counts=True):
    """Each tensor's (numbers, counts) recorded within one ``one_launch`` (after a first tensor, which makes
    the buffer's kernels), flushed, read."""
    buffer = fused_buffer(counts)
    first = prime(buffer)
    with buffer.one_launch():
        slots = [buffer.add(t, tensor_kind(t)) for t in tensors]
    buffer.take()
    return [(slot.values(), None if c is None else c.values()) for slot, c in [first] + slots][1:]


def mixed_tensors(seed):
    g = torch.Generator().manual_seed(seed)
    tensors = [
        on_device((torch.randn(n, generator=g) * 3 + 0.5).to(dtype))
        for n in (1, 7, 1025, 70001, 300_000)
        for dtype in (torch.float32, torch.float16, torch.bfloat16)
    ]
    tensors[4][3] = float("nan")
    tensors[5][2] = float("-inf")
    tensors += [
        on_device(torch.randn(5, 9, generator=g).to(torch.bfloat16)).t(),  # permuted: its dense view, batched
        on_device(torch.randn(6, 10, generator=g))[:, ::3],  # strided: a launch of its own
        on_device(torch.randn(1, 40, generator=g).to(torch.float16)).expand(5, 40),  # broadcast: counted five times
        on_device(torch.randn(100, generator=g).double()),  # float64: a launch of its own
        on_device(torch.tensor(-2.5, dtype=torch.bfloat16)),  # 0-d
        on_device((torch.randn(700, generator=g) * 9).to(FP8[0])),  # float8: a launch of its own
    ]
    return tensors


def test_the_tensors_of_a_call_in_one_launch_per_dtype(monkeypatch, triton_stats):
    """Within ``one_launch`` the contiguous float32, float16 and bfloat16 tensors are read by one
    ``_partials_many`` per dtype and slot width; the numbers are the bits each tensor gets alone (the same
    chunks into the same rows), and the torch ops' numbers."""
    tensors = mixed_tensors(11)
    alone = statistics_of(fused_buffer(), tensors)
    many = Launches(triton_stats._partials_many)
    one = Launches(triton_stats._partials)
    monkeypatch.setattr(triton_stats, "_partials_many", many)
    monkeypatch.setattr(triton_stats, "_partials", one)
    together = batched_statistics(tensors)
    assert exact(together) == exact(alone)  # bit for bit
    assert many.count == 3  # float32, float16, bfloat16 of width 4
    # the buffer's first tensor; the strided, float64 and float8 ones; the 0-d one, alone in its batch (width 1)
    assert one.count == 1 + 3 + 1
    torch_ops = statistics_of(StatBuffer(nan_inf_count=True, native=False), tensors[:-1])
    for index, (t, (values, tally), (expected, expected_tally)) in enumerate(zip(tensors, together, torch_ops)):
        same(t.dtype, t, values, expected, f"tensor {index}")
        assert tally == expected_tally, index


def test_more_tensors_than_a_table_holds_take_several_launches(monkeypatch, triton_stats):
    """A batch of more than ``_MANY_MAX`` tensors of a dtype is launched ``_MANY_MAX`` at a time (a table's rows
    are what every program looks through), the last one alone by ``_partials``: the same bits."""
    monkeypatch.setattr(triton_stats, "_MANY_MAX", 5)
    g = torch.Generator().manual_seed(18)
    sizes = (3, 2000, 300_000, 9, 70001, 1, 4096, 5000, 1025, 17, 64)
    tensors = [on_device(torch.randn(n, generator=g).to(torch.bfloat16)) for n in sizes]
    alone = statistics_of(fused_buffer(), tensors)
    many, few, one = (Launches(getattr(triton_stats, name)) for name in KERNELS)
    monkeypatch.setattr(triton_stats, "_partials_many", many)
    monkeypatch.setattr(triton_stats, "_partials_few", few)
    monkeypatch.setattr(triton_stats, "_partials", one)
    assert exact(batched_statistics(tensors)) == exact(alone)
    assert (many.count, few.count, one.count) == (2, 0, 1 + 1)  # 5 + 5 + 1, after the buffer's first tensor


@pytest.mark.parametrize("count", [2, 3, 4])
def test_a_few_tensors_by_their_addresses(count, monkeypatch, triton_stats):
    """Two to ``_FEW`` contiguous tensors of a dtype in a call: one ``_partials_few`` launch, their addresses its
    arguments (no table to make and copy), and the bits each gets alone: many rows a program (300 000 elements),
    a dense view counted five times (broadcast), a transposed one, one element, NaN and Inf."""
    g = torch.Generator().manual_seed(20 + count)
    pool = [
        on_device(torch.randn(300_000, generator=g).to(torch.float16)),
        on_device(torch.randn(1, 40, generator=g).to(torch.float16)).expand(5, 40),
        on_device(torch.randn(9, 5, generator=g).to(torch.float16)).t(),
        on_device(torch.tensor([float("nan"), float("-inf"), 2.0], dtype=torch.float16)),
        on_device(torch.full((1,), 3.5, dtype=torch.float16)),
        on_device(torch.randn(1025, generator=g).to(torch.float16)),
    ]
    tensors = pool[count - 2 : 2 * count - 2]
    alone = statistics_of(fused_buffer(), tensors)
    many, few, one = (Launches(getattr(triton_stats, name)) for name in KERNELS)
    monkeypatch.setattr(triton_stats, "_partials_many", many)
    monkeypatch.setattr(triton_stats, "_partials_few", few)
    monkeypatch.setattr(triton_stats, "_partials", one)
    together = batched_statistics(tensors)
    assert exact(together) == exact(alone)  # bit for bit
    assert (many.count, few.count, one.count) == (0, 1, 1)  # the buffer's first tensor alone
    torch_ops = statistics_of(StatBuffer(nan_inf_count=True, native=False), tensors)
    for index, (t, (values, tally), (expected, expected_tally)) in enumerate(zip(tensors, together, torch_ops)):
        same(t.dtype, t, values, expected, f"tensor {index}")
        assert tally == expected_tally, index


def test_a_few_tensors_of_each_dtype_and_a_parameter(monkeypatch, triton_stats):
    """A call's two float32, three bfloat16 and two float16 tensors (one a Parameter, one requiring grad, queued
    undetached by ``StatBuffer.add``'s fast path): a ``_partials_few`` launch per dtype, and the bits of each
    tensor alone."""
    g = torch.Generator().manual_seed(30)
    weight = torch.nn.Parameter(on_device(torch.randn(33, 7, generator=g)))
    grad = on_device(torch.randn(300, generator=g).to(torch.float16)).requires_grad_()
    tensors = [
        weight,
        on_device(torch.randn(2049, generator=g)),
        on_device(torch.randn(5, generator=g).to(torch.bfloat16)),
        on_device(torch.randn(70001, generator=g).to(torch.bfloat16)),
        on_device(torch.randn(1, generator=g).to(torch.bfloat16)),
        grad,
        on_device(torch.randn(8, 8, generator=g).to(torch.float16)),
    ]
    alone = statistics_of(fused_buffer(), [t.detach() for t in tensors])
    few = Launches(triton_stats._partials_few)
    monkeypatch.setattr(triton_stats, "_partials_few", few)
    assert exact(batched_statistics(tensors)) == exact(alone)
    assert few.count == 3


def test_batched_without_counts_and_nested(triton_stats):
    tensors = mixed_tensors(12)[:15]
    buffer = fused_buffer(False)
    prime(buffer)
    with buffer.one_launch():
        slots = [buffer.add(t, tensor_kind(t)) for t in tensors[:5]]
        with buffer.one_launch():  # a call's records inside another's: launched when the outermost exits
            slots += [buffer.add(t, tensor_kind(t)) for t in tensors[5:]]
        assert len(buffer._fused._queue) == 15
    assert buffer._fused._queue == []
    buffer.take()
    assert exact([(slot.values(), counts) for slot, counts in slots]) == exact(
        statistics_of(fused_buffer(False), tensors)
    )


def test_batched_values_are_those_at_the_call(triton_stats):
    """The queue is launched as the call's records are made: a change in place after them is not seen."""
    t = on_device(torch.ones(5000, dtype=torch.bfloat16))
    buffer = fused_buffer()
    prime(buffer)
    with buffer.one_launch():
        slot, counts = buffer.add(t, tensor_kind(t))
    t.fill_(float("nan"))
    buffer.take()
    assert slot.values()[:3] == [1.0, 1.0, 1.0] and counts.values() == [0.0, 0.0]
    assert slot.values()[3] == float(torch.tensor(math.sqrt(5000.0)).to(torch.bfloat16))


def test_an_arena_closed_in_a_call_launches_its_queue_first(monkeypatch, triton_stats):
    """An arena filled up inside ``one_launch`` is combined (``_finish``) only after its queued partials."""
    monkeypatch.setattr(triton_stats, "_ARENA_TENSORS", 3)
    monkeypatch.setattr(triton_stats, "_ARENA_ROWS", 4)
    g = torch.Generator().manual_seed(13)
    tensors = [on_device(torch.randn(n, generator=g).to(torch.bfloat16)) for n in (5, 3000, 9000, 1, 20000, 7, 64)]
    assert exact(batched_statistics(tensors)) == exact(statistics_of(fused_buffer(), tensors))


def test_a_failed_batched_launch_leaves_the_torch_ops(monkeypatch, triton_stats, caplog):
    """A batched launch that fails: its tensors get null statistics (their records kept), the next the torch
    ops', with one warning."""

    monkeypatch.setattr(triton_stats, "_partials_many", Failing("no launch here"))
    monkeypatch.setattr(triton_stats, "_partials_few", Failing("no launch here"))
    buffer = fused_buffer()
    prime(buffer)
    with caplog.at_level("WARNING", logger="msprobe_runtime"):
        with buffer.one_launch():
            queued = buffer.add(*with_kind(on_device(torch.randn(10))))
            also = buffer.add(*with_kind(on_device(torch.randn(10))))
    assert "Triton statistics kernels failed" in caplog.text
    after = buffer.add(*with_kind(on_device(torch.randn(10))))  # the torch ops from now on
    buffer.take()
    for slot, counts in (queued, also):  # their rows never written: null, not garbage
        assert slot.values() is None and counts.values() is None
    assert after[0].values() is not None and after[1].values() == [0.0, 0.0]


def test_a_recorded_call_reads_its_inputs_in_one_launch(tmp_path, monkeypatch):
    """Through the collector: a call of three tensors in and one out that leaves its inputs alone
    (runtime/call_effects.py) costs one launch, its inputs read after it with its output, where it cost four,
    and writes the numbers of the torch ops' run (to their rounding), which read the inputs before the call."""
    from msprobe_runtime import collector

    g = torch.Generator().manual_seed(14)
    inputs = [[on_device(torch.randn(2000, generator=g).to(torch.bfloat16)) for _ in range(3)] for _ in range(4)]

    def calls(rt):
        for a, b, c in inputs:
            rt.call("Torch.addcmul", torch.addcmul, a, b, c)

    kernels = triton_stats_module()
    few, one = Launches(kernels._partials_few), Launches(kernels._partials)
    monkeypatch.setattr(kernels, "_partials_few", few)
    monkeypatch.setattr(kernels, "_partials", one)
    monkeypatch.setattr(collector, "StatBuffer", lambda counts: StatBuffer(counts, native=False, triton_cpu=True))
    fused = _dump(tmp_path, "fused", calls)
    monkeypatch.setattr(collector, "StatBuffer", lambda counts: StatBuffer(counts, native=False))
    torch_ops = _dump(tmp_path, "torch_ops", calls)
    # the first call's inputs launched one by one (the first of them makes the kernels), its output alone; then
    # one launch a call: its three inputs and its output together
    assert (one.count, few.count) == (3 + 1, len(inputs) - 1)
    assert sorted(fused) == sorted(torch_ops) and len(fused) == len(inputs)
    for name, entry in torch_ops.items():
        records = fused[name]["input_args"] + fused[name]["output"]
        for index, (mine, theirs) in enumerate(zip(records, entry["input_args"] + entry["output"])):
            assert {k: mine[k] for k in ("Max", "Min", "type", "shape")} == {
                k: theirs[k] for k in ("Max", "Min", "type", "shape")
            }
            t = inputs[int(name.split(".")[2])][index] if index < 3 else None
            if t is not None:
                keys = ("Max", "Min", "Mean", "Norm")
                same(t.dtype, t, [mine[k] for k in keys], [theirs[k] for k in keys], name)


def _recorded(tmp_path, monkeypatch, name, calls):
    """The dump of ``calls`` through the kernels, and the launches it made (``_partials``, ``_partials_few``,
    ``_partials_many``)."""
    from msprobe_runtime import collector

    kernels = triton_stats_module()
    launches = [Launches(getattr(kernels, name)) for name in ("_partials_many", "_partials_few", "_partials")]
    for name, counted in zip(("_partials_many", "_partials_few", "_partials"), launches):
        monkeypatch.setattr(kernels, name, counted)
    monkeypatch.setattr(collector, "StatBuffer", lambda counts: StatBuffer(counts, native=False, triton_cpu=True))
    data = _dump(tmp_path, name, calls)
    return data, sum(counted.count for counted in launches)


def test_an_in_place_call_has_its_inputs_read_before_it(tmp_path, monkeypatch):
    """``Tensor.add_`` changes its first input: that input's record holds the values before the call, read by a
    launch of their own, and the output's the values after (two launches a call, as before call_effects)."""
    g = torch.Generator().manual_seed(15)
    pairs = [[on_device(torch.rand(3000, generator=g)) for _ in range(2)] for _ in range(3)]
    before = [a.max().item() for a, _ in pairs]

    def calls(rt):
        rt.call("Torch.mul", torch.mul, pairs[0][0], 1.0)  # makes the kernels: every call below is batched
        for a, b in pairs:
            rt.call("Tensor.add_", torch.Tensor.add_, a, b)

    data, launches = _recorded(tmp_path, monkeypatch, "in_place", calls)
    for index, (a, _) in enumerate(pairs):
        entry = data[f"Tensor.add_.{index}.forward"]
        assert entry["input_args"][0]["Max"] == pytest.approx(before[index], rel=1e-6)
        assert entry["output"][0]["Max"] == pytest.approx(a.max().item(), rel=1e-6)
        assert entry["output"][0]["Max"] > entry["input_args"][0]["Max"]
    assert launches == 2 + 2 * len(pairs)  # mul: its input alone, its output; then inputs and output apart


def test_a_call_that_changes_an_input_after_all_leaves_it_null(tmp_path, monkeypatch, caplog):
    """A call taken to leave its inputs alone (recorded as ``Torch.exp``, torch's own name, no ``_``) that
    changes one in place anyway: the version counter tells at the launch, so that input's statistics are null,
    never the values after the call; said once, and the API's inputs are read before it from then on (its next
    call records them right)."""
    g = torch.Generator().manual_seed(16)
    tensors = [on_device(torch.rand(3000, generator=g)) for _ in range(3)]
    before = [t.max().item() for t in tensors]

    def doubles_in_place(x):
        x.mul_(2)  # inside the recorded call: not a record of its own, but a new version of x
        return x + 1

    def calls(rt):
        rt.call("Torch.mul", torch.mul, on_device(torch.ones(3000)), 1.0)  # makes the kernels
        for t in tensors:
            rt.call("Torch.exp", doubles_in_place, t)

    with caplog.at_level("WARNING", logger="msprobe_runtime"):
        data, _ = _recorded(tmp_path, monkeypatch, "changed", calls)
    first = data["Torch.exp.0.forward"]
    assert first["input_args"][0]["Max"] is None and first["input_args"][0]["shape"] == [3000]
    assert first["output"][0]["Max"] == pytest.approx(2 * before[0] + 1, rel=1e-6)
    for index in (1, 2):  # read before the call now: the values it was called with
        entry = data[f"Torch.exp.{index}.forward"]
        assert entry["input_args"][0]["Max"] == pytest.approx(before[index], rel=1e-6)
    assert caplog.text.count("Torch.exp changed an input in place") == 1


def test_no_input_is_read_after_its_call_in_inference_mode(tmp_path, monkeypatch):
    """Inference tensors have no version counter to check: inside inference mode each call's inputs are read
    before it (two launches a call, not one)."""
    g = torch.Generator().manual_seed(17)
    tensors = [on_device(torch.rand(3000, generator=g)) for _ in range(4)]

    def calls(rt):
        with torch.inference_mode():
            for t in tensors:
                rt.call("Torch.exp", torch.exp, t)

    data, launches = _recorded(tmp_path, monkeypatch, "inference", calls)
    assert launches == 2 * len(tensors)
    for index, t in enumerate(tensors):
        assert data[f"Torch.exp.{index}.forward"]["input_args"][0]["Max"] == pytest.approx(t.max().item(), rel=1e-6)
