"""Low-precision tensors are first-class (issue 36): float8 statistics and their own two fields.

Every float8 dtype of this torch gets Max, Min, Mean, Norm and exact NaN and Inf counts, computed from its values
upcast to float32 (torch reduces no float8 itself), equal to a float32 reference computed from the raw values;
``fp8_zero_fraction`` and ``fp8_saturated_fraction`` are exact. float8_e8m0fnu (MX scales) and float4_e2m1fn_x2
(two E2M1 values a byte, which no torch op unpacks) get the same, from their values decoded (docs/low-precision.md).
"""

import glob
import importlib.util
import json
import logging
import math
import os
import textwrap

import pytest

torch = pytest.importorskip("torch")

import msprobe_runtime as rt  # noqa: E402
from msprobe_runtime import PrecisionDebugger, statistics  # noqa: E402
from msprobe_runtime.records import FP8_SATURATED_FRACTION, FP8_ZERO_FRACTION  # noqa: E402
from msprobe_runtime.statistics import KIND_LOW, StatBuffer, slot_values, tensor_kind  # noqa: E402

FP8 = [
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
]
E8M0 = getattr(torch, "float8_e8m0fnu", None)
FLOAT4 = getattr(torch, "float4_e2m1fn_x2", None)
MX = [dtype for dtype in (E8M0, FLOAT4) if dtype is not None]
# the E2M1 code table of the OCP MX specification, written out here rather than read from the runtime
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
MSPROBE_FIELDS = ["type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad"]


def every_value(dtype):
    """Each of the format's 256 encodings once: NaN(s), Inf where the format has it, both zeros where it has
    -0, the subnormals and the largest finite magnitude."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)


def crafted(dtype):
    """Named tensors of ``dtype`` made from raw bytes and from float32 values."""
    raw = every_value(dtype)
    f = raw.float()
    top = torch.finfo(dtype).max
    tiny = torch.finfo(dtype).tiny
    cases = {
        "all encodings": raw,
        "finite encodings": raw[torch.isfinite(f)],
        "no nan": raw[~torch.isnan(f)],
        "zeros and subnormals": torch.tensor([0.0, -0.0, tiny / 2, tiny / 4, -tiny / 2, 0.0]).to(dtype),
        "saturated": torch.tensor([top, -top, top, 1.0, 0.5, 0.0, top / 2, -top]).to(dtype),
        "matrix": (torch.linspace(-3, 3, 60).reshape(6, 10) * 7).to(dtype),
        "transposed": (torch.linspace(-3, 3, 60).reshape(6, 10) * 7).to(dtype).t(),
        "broadcast": torch.tensor([[top], [0.0], [-1.5]]).to(dtype).expand(3, 7),
        "zero-d": torch.tensor(-top).to(dtype),
    }
    return cases


def reference(t):
    """Max, Min, Mean, Norm and the NaN, Inf, zero and saturated counts of ``t``'s values as float32, the
    sums in float64 (what the runtime's float32 sums round)."""
    f = t.float()
    top = torch.finfo(t.dtype).max
    if f.dim() == 0:
        value = f.item()
        row = [value] * 4
    else:
        d = f.double()
        row = [f.amax().item(), f.amin().item(), d.mean().item(), torch.linalg.vector_norm(d).item()]
    counts = [int(torch.isnan(f).sum()), int(torch.isinf(f).sum()), int((f == 0).sum()), int((f.abs() == top).sum())]
    return row, counts


def same(mine, expected, exact, t=None):
    """Max and Min exact; Mean and Norm to float32 rounding: of the result or, for a Mean that cancels, of the
    mean of the magnitudes (a float32 sum's error is relative to that)."""
    if math.isnan(expected):
        return math.isnan(mine)
    if exact or math.isinf(expected):
        return mine == expected
    scale = 0.0
    if t is not None:
        f = t.float()
        f = f[torch.isfinite(f)]
        scale = f.abs().double().mean().item() if f.numel() else 0.0
    return math.isclose(mine, expected, rel_tol=2e-6, abs_tol=max(1e-30, 2e-6 * scale))


def statistics_of(t, nan_inf_count=True, native=False):
    stats = StatBuffer(nan_inf_count=nan_inf_count, native=native)
    kind = tensor_kind(t)
    slot, counts = stats.add(t, kind)
    assert stats.take()  # CPU: the numbers are on the host
    return kind, slot_values(slot), slot_values(counts)


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_statistics_equal_a_float32_reference(dtype):
    for name, t in crafted(dtype).items():
        before = t.clone()
        kind, row, counts = statistics_of(t)
        assert kind == KIND_LOW
        expected, expected_counts = reference(t)
        if t.dim() == 0:
            row = [row[0]] * 4  # a 0-d record's four fields are its value (records.TensorRecord)
        for index, (mine, theirs) in enumerate(zip(row, expected)):
            assert same(mine, theirs, index < 2, t), (name, index, row, expected)
        assert [int(c) for c in counts] == expected_counts, (name, counts, expected_counts)
        assert torch.equal(t.view(torch.uint8), before.view(torch.uint8))  # read only


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_chunked_pass_equals_one_pass(dtype, monkeypatch):
    torch.manual_seed(0)
    t = (torch.randn(2500) * 30).to(dtype)
    t[7] = float("nan")
    t[2000] = torch.finfo(dtype).max
    t[2001] = 0.0
    whole = statistics_of(t)
    monkeypatch.setattr(statistics, "_LOW_CHUNK", 1000)  # three chunks, the last one short
    chunked = statistics_of(t)
    expected, expected_counts = reference(t)
    assert [int(c) for c in chunked[2]] == [int(c) for c in whole[2]] == expected_counts
    for index, (mine, theirs) in enumerate(zip(chunked[1], expected)):
        assert same(mine, theirs, index < 2, t), (index, chunked[1], expected)
    t[7] = 1.0
    expected, _ = reference(t)
    for index, (mine, theirs) in enumerate(zip(statistics_of(t)[1], expected)):
        assert same(mine, theirs, index < 2, t), (index, expected)


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_no_host_sync_while_recording(dtype, monkeypatch):
    synced = []
    for name in ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda self, *a, _n=name, _o=original, **k: (synced.append(_n), _o(self, *a, **k))[1]
        )
    stats = StatBuffer(nan_inf_count=True, native=False)
    for t in crafted(dtype).values():
        stats.add(t, tensor_kind(t))
    monkeypatch.undo()
    assert synced == []


def run_collecting(tmp_path, calls, nan_inf_count=True):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"dump_path": str(tmp_path / "d"), "level": "L1", "statistics": {"nan_inf_count": nan_inf_count}})
    )
    debugger = PrecisionDebugger(config_path=str(config))
    debugger.start()
    try:
        calls()
    finally:
        debugger.stop()
        debugger.wait()
    [path] = glob.glob(os.path.join(glob.escape(str(tmp_path / "d")), "step0", "*", "dump.json"))
    with open(path) as handle:
        return json.load(handle)["data"]


@pytest.mark.parametrize("nan_inf_count", [True, False])
def test_fractions_in_dump_json(tmp_path, nan_inf_count):
    tensors = {dtype: crafted(dtype) for dtype in FP8}

    def calls():
        for cases in tensors.values():
            for t in cases.values():
                rt.call("Torch.clone", torch.clone, t)

    data = run_collecting(tmp_path, calls, nan_inf_count)
    index = 0
    for dtype, cases in tensors.items():
        for name, t in cases.items():
            record = data[f"Torch.clone.{index}.forward"]["output"][0]
            index += 1
            assert record["dtype"] == str(dtype)
            expected, counts = reference(t)
            numel = t.numel()
            assert record[FP8_ZERO_FRACTION] == counts[2] / numel, (dtype, name)
            assert record[FP8_SATURATED_FRACTION] == counts[3] / numel, (dtype, name)
            fields = MSPROBE_FIELDS + (["NaN_count", "Inf_count"] if nan_inf_count else [])
            assert list(record) == fields + [FP8_ZERO_FRACTION, FP8_SATURATED_FRACTION]
            if nan_inf_count:
                assert [record["NaN_count"], record["Inf_count"]] == counts[:2], (dtype, name)
            got = [record[key] for key in ("Max", "Min", "Mean", "Norm")]
            for position, (mine, theirs) in enumerate(zip(got, expected)):
                assert same(mine, theirs, position < 2, t), (dtype, name, got, expected)


def test_saturated_and_underflowed_fractions_are_exact(tmp_path):
    dtype = torch.float8_e4m3fn
    x = torch.tensor([1000.0, -1000.0, 448.0, 1e-6, -1e-6, 0.0, 1.0, 2.0, 3.0, 1e-4])  # 3 saturate, 3 flush to 0

    def calls():
        rt.call("Torch.clamp_to", lambda v: v.clamp(-448, 448).to(dtype), x)

    data = run_collecting(tmp_path, calls)
    record = data["Torch.clamp_to.0.forward"]["output"][0]
    assert record[FP8_SATURATED_FRACTION] == 3 / 10
    assert record[FP8_ZERO_FRACTION] == 4 / 10  # 1e-6, -1e-6, 0 and 1e-4: under half of 2**-9
    assert FP8_ZERO_FRACTION not in data["Torch.clamp_to.0.forward"]["input_args"][0]  # float32: msprobe's own


PROGRAM = textwrap.dedent("""
    import torch
    import torch.nn.functional as F


    def quantized_step(w, x):
        scale = x.abs().amax() / 448.0
        q = (x / scale).to(torch.float8_e4m3fn)
        r = torch.ops.aten._to_copy(q, dtype=torch.float8_e5m2)  # runs; aten ops are not recorded at L1
        s = (x * 1e4).to(torch.float8_e5m2)
        deq = q.to(torch.float32) * scale + r.float() * 1e-3 + s.float() * 1e-9
        out = F.gelu(deq @ w)
        loss = out.pow(2).mean()
        loss.backward()
        return out, q, r, s
""")


def test_recorded_program_is_bit_identical_and_dumps_fp8(tmp_path):
    from msprobe_rewrite.api import rewrite_source

    path = tmp_path / "fp8_program.py"
    path.write_bytes(rewrite_source(PROGRAM.encode()))
    assert b"__msprobe__" in path.read_bytes()
    spec = importlib.util.spec_from_file_location("fp8_program_rt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def run():
        torch.manual_seed(0)
        w = torch.randn(16, 8, requires_grad=True)
        x = torch.randn(4, 16) * 5
        out, q, r, s = module.quantized_step(w, x)
        return [out.detach(), q, r, s, w.grad]

    plain = run()
    results = []
    data = run_collecting(tmp_path, lambda: results.extend(run()))
    for a, b in zip(plain, results):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    fp8_outputs = {
        name: entry["output"][0]
        for name, entry in data.items()
        if name.endswith(".forward")
        and entry.get("output")
        and entry["output"][0].get("dtype", "").startswith("torch.float8")
    }
    assert {record["dtype"] for record in fp8_outputs.values()} == {"torch.float8_e4m3fn", "torch.float8_e5m2"}
    for name, record in fp8_outputs.items():
        assert record["Max"] is not None and record["Norm"] is not None, name
        assert FP8_ZERO_FRACTION in record and FP8_SATURATED_FRACTION in record, name
        assert record["NaN_count"] == 0, name
    for dtype, value in ((torch.float8_e4m3fn, results[1]), (torch.float8_e5m2, results[3])):
        [record] = [record for record in fp8_outputs.values() if record["dtype"] == str(dtype)]
        f = value.float()
        top = torch.finfo(dtype).max
        assert record[FP8_SATURATED_FRACTION] == int((f.abs() == top).sum()) / f.numel()
        assert record[FP8_ZERO_FRACTION] == int((f == 0).sum()) / f.numel()
        assert record["Max"] == f.max().item() and record["Inf_count"] == int(torch.isinf(f).sum())
    assert fp8_outputs and any(record[FP8_SATURATED_FRACTION] > 0 for record in fp8_outputs.values())


def decoded(t):
    """The values of an e8m0 or float4 tensor, decoded here from its raw bytes (float64): e8m0 byte ``u`` is
    2**(u-127), 255 NaN; a float4 byte holds two E2M1 codes (sign bit 3, then the magnitude's code)."""
    raw = t.contiguous().view(torch.uint8).reshape(-1).tolist()
    if t.dtype is E8M0:
        return torch.tensor([math.nan if u == 255 else 2.0 ** (u - 127) for u in raw], dtype=torch.float64)
    values = []
    for byte in raw:
        for code in (byte & 15, byte >> 4):
            values.append(-E2M1[code & 7] if code & 8 else E2M1[code])
    return torch.tensor(values, dtype=torch.float64)


@pytest.mark.parametrize("dtype", MX, ids=str)
def test_mx_formats_equal_a_reference_decoded_from_their_bytes(dtype):
    top = 6.0 if dtype is FLOAT4 else 2.0**127
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
    matrix = every[:240].reshape(12, 20)
    cases = {
        "all encodings": every,
        "matrix": matrix,
        "transposed": matrix.t(),
        "broadcast": every[100:103].reshape(3, 1).expand(3, 5),
        "one": every[130:131],
    }
    for name, t in cases.items():
        kind, row, counts = statistics_of(t)
        assert kind == KIND_LOW
        v = decoded(t)
        finite = v[~torch.isnan(v)]
        expected = [finite.max().item(), finite.min().item()] if finite.numel() == v.numel() else [math.nan] * 2
        expected += [v.mean().item(), torch.linalg.vector_norm(v).item()]
        expected_counts = [int(torch.isnan(v).sum()), 0, int((v == 0).sum()), int((v.abs() == top).sum())]
        for index, (mine, theirs) in enumerate(zip(row, expected)):
            assert same(mine, theirs, index < 2), (name, index, row, expected)
        assert [int(c) for c in counts] == expected_counts, (name, counts, expected_counts)


@pytest.mark.parametrize("dtype", MX, ids=str)
def test_mx_formats_reach_dump_json_with_their_fractions(tmp_path, caplog, dtype):
    t = torch.tensor([0x00, 0x07, 0x7F, 0x88, 0xF1, 0x26], dtype=torch.uint8).view(dtype)
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        data = run_collecting(tmp_path, lambda: rt.call("Torch.clone", torch.clone, t))
    record = data["Torch.clone.0.forward"]["output"][0]
    v = decoded(t)
    top = 6.0 if dtype is FLOAT4 else 2.0**127
    assert record["dtype"] == str(dtype) and record["shape"] == [6]
    assert record["Max"] == v.max().item() and record["Min"] == v.min().item()
    assert record[FP8_ZERO_FRACTION] == int((v == 0).sum()) / v.numel()
    assert record[FP8_SATURATED_FRACTION] == int((v.abs() == top).sum()) / v.numel()
    assert not [r.getMessage() for r in caplog.records if str(dtype) in r.getMessage()]
    # a 0-d tensor: one e8m0 value, whose four fields are that value; a float4 byte's two values
    one = torch.tensor(0x26, dtype=torch.uint8).view(dtype)
    (tmp_path / "0d").mkdir()
    record = run_collecting(tmp_path / "0d", lambda: rt.call("Torch.clone", torch.clone, one))["Torch.clone.0.forward"][
        "output"
    ][0]
    v = decoded(one)
    assert [record[key] for key in ("Max", "Min", "Mean")] == [v.max().item(), v.min().item(), v.mean().item()]


def test_native_records_leave_low_precision_to_the_collector(native):
    for dtype in FP8 + MX:
        t = torch.arange(64, dtype=torch.uint8).view(dtype)
        assert not native.stats(t, True), dtype
        recorder = StatBuffer(nan_inf_count=True, native=native).native_recorder(4096, 4)
        records, todo = recorder.records((t,))
        assert todo == 1, dtype  # left to the collector's Python, whose StatBuffer.add reads it (_add_low)
    for dtype in MX:  # no one-pass kernel of these: the chunked torch ops decode them
        assert not native.stats_low(torch.arange(64, dtype=torch.uint8).view(dtype), True), dtype


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_the_native_one_pass_equals_the_reference_and_the_torch_ops(native, dtype, monkeypatch):
    """float8 on the CPU: one read through the op's table of the 256 encodings (native/stats_op.cpp's
    stats_low), the same numbers as the chunked torch ops, and the tensor not handed to them."""
    chunked = []
    original = statistics._low_format
    monkeypatch.setattr(statistics, "_low_format", lambda dtype: chunked.append(dtype) or original(dtype))
    for name, t in crafted(dtype).items():
        for nan_inf_count in (True, False):
            kind, row, counts = statistics_of(t, nan_inf_count, native)
            assert not chunked, name
            _, torch_row, torch_counts = statistics_of(t, nan_inf_count)
            chunked.clear()
            expected, expected_counts = reference(t)
            if t.dim() == 0:
                row, torch_row = [row[0]] * 4, [torch_row[0]] * 4
            for index, (mine, theirs, ops) in enumerate(zip(row, expected, torch_row)):
                assert same(mine, theirs, index < 2, t) and same(mine, ops, index < 2, t), (name, index, row)
            wanted = expected_counts if nan_inf_count else expected_counts[2:]
            assert [int(c) for c in counts] == [int(c) for c in torch_counts] == wanted, (name, counts)
