"""Scaled float8 tensor classes are read through their documented layout (collector._DOCUMENTED), never their
own ``__torch_dispatch__``: torchao's Float8TrainingTensor (``_data``, ``_scale``: values = data / scale) and
Transformer Engine's Float8Tensor (``_data`` uint8, ``_fp8_dtype``, ``_scale_inv``: values = data * scale_inv;
a stand-in of its layout, fixtures/float8_classes, since TE does not install here). The record's statistics are
those of the dequantized values, its float8 fractions those of the raw data, and ``fp8_scale`` is the factor
that dequantizes (docs/low-precision.md)."""

import glob
import json
import os

import pytest

torch = pytest.importorskip("torch")

import msprobe_runtime as rt  # noqa: E402
from msprobe_runtime import PrecisionDebugger  # noqa: E402
from msprobe_runtime.records import FP8_SATURATED_FRACTION, FP8_SCALE, FP8_ZERO_FRACTION  # noqa: E402
from msprobe_runtime.statistics import KIND_LOW, StatBuffer, float8_view, slot_values  # noqa: E402

from fixtures import float8_classes  # noqa: E402


def run_collecting(tmp_path, calls):
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    debugger.start()
    try:
        calls()
    finally:
        debugger.stop()
        debugger.wait()
    [path] = glob.glob(os.path.join(glob.escape(str(tmp_path / "d")), "step0", "*", "dump.json"))
    with open(path) as handle:
        return json.load(handle)["data"]


def expected(values, raw):
    """Max, Min, Mean, Norm of the dequantized ``values`` (float64 sums), and the fractions of the ``raw`` data."""
    d = values.double()
    f = raw.float()
    top = torch.finfo(raw.dtype).max
    return (
        [d.max().item(), d.min().item(), d.mean().item(), torch.linalg.vector_norm(d).item()],
        int((f == 0).sum()) / f.numel(),
        int((f.abs() == top).sum()) / f.numel(),
    )


def check(record, values, raw, scale):
    stats, zero, saturated = expected(values, raw)
    assert record["dtype"] == str(raw.dtype) and record["shape"] == list(raw.shape)
    got = [record[key] for key in ("Max", "Min", "Mean", "Norm")]
    assert got == pytest.approx(stats, rel=1e-5, abs=1e-6), (got, stats)
    assert record[FP8_ZERO_FRACTION] == zero and record[FP8_SATURATED_FRACTION] == saturated
    if isinstance(scale, dict):
        assert record[FP8_SCALE] == pytest.approx(scale, rel=1e-6)
    else:
        assert record[FP8_SCALE] == pytest.approx(scale, rel=1e-6)
    assert record["NaN_count"] == 0 and record["Inf_count"] == 0


def _torchao_module():
    # torchao is a test extra (pyproject.toml); without it only its tests are skipped
    return pytest.importorskip("torchao.float8.float8_training_tensor")


def _torchao(values, scale, axiswise_dim=None, dtype=torch.float8_e4m3fn):
    torchao = _torchao_module()
    data = (values.float() * scale).clamp(-448, 448).to(dtype)
    return torchao.Float8TrainingTensor(
        data, scale, values.dtype, torchao.LinearMMConfig(), torchao.GemmInputRole.INPUT, axiswise_dim
    )


@pytest.mark.slow  # imports torchao (seconds)
def test_torchao_float8_is_read_as_its_dequantized_values_without_its_dispatch(tmp_path, monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(64, 96) * 3
    x[0, :40] = 1e-5  # underflow to zero in e4m3 at this scale
    per_tensor = _torchao(x, torch.tensor(448.0) / x.abs().amax())
    rows = x.abs().amax(dim=1, keepdim=True)
    per_row = _torchao(x, 448.0 / rows, axiswise_dim=-1)
    torchao = _torchao_module()
    dispatched = []
    original = torchao.Float8TrainingTensor.__torch_dispatch__.__func__

    def counting(cls, func, types, args=(), kwargs=None):
        dispatched.append(str(func))
        return original(cls, func, types, args, kwargs)

    monkeypatch.setattr(torchao.Float8TrainingTensor, "__torch_dispatch__", classmethod(counting))

    data = run_collecting(
        tmp_path,
        lambda: (rt.call("Torch.clone", lambda v: v, per_tensor), rt.call("Torch.clone", lambda v: v, per_row)),
    )
    assert dispatched == []  # neither the record nor the statistics ran the class's code
    for index, tensor in enumerate((per_tensor, per_row)):
        values = tensor._data.float() / tensor._scale  # as to_original_precision, in float32
        factor = tensor._scale.reciprocal()
        scale = factor.item() if factor.numel() == 1 else {"Max": factor.max().item(), "Min": factor.min().item()}
        entry = data[f"Torch.clone.{index}.forward"]
        check(entry["input_args"][0], values, tensor._data, scale)
        assert entry["output"][0] == entry["input_args"][0]
    assert data["Torch.clone.0.forward"]["input_args"][0][FP8_ZERO_FRACTION] >= 40 / x.numel()


def test_the_raw_data_and_the_scaled_tensor_never_share_statistics(tmp_path):
    # the same memory, recorded first as a plain float8 tensor (what a cast returns) and then as the class's
    # data: a reuse by place would give one the other's numbers (collector._place)
    torch.manual_seed(1)
    x = torch.randn(128, 128)
    tensor = _torchao(x, torch.tensor(100.0))
    data = run_collecting(
        tmp_path,
        lambda: (
            rt.call("Torch.clone", lambda v: v, tensor._data),
            rt.call("Torch.clone", lambda v: v, tensor),
            rt.call("Torch.clone", lambda v: v, tensor._data),
        ),
    )
    raw = [data[f"Torch.clone.{i}.forward"]["input_args"][0] for i in (0, 2)]
    scaled = data["Torch.clone.1.forward"]["input_args"][0]
    assert raw[0]["Max"] == raw[1]["Max"] == tensor._data.float().max().item() and FP8_SCALE not in raw[0]
    assert scaled["Max"] == pytest.approx(tensor._data.float().max().item() / 100.0, rel=1e-6)


def test_transformer_engine_layout_is_read_without_its_dispatch(tmp_path, monkeypatch):
    float8_classes.install_te(monkeypatch)
    float8_classes.DISPATCHED.clear()
    torch.manual_seed(2)
    x = torch.randn(32, 48) * 0.01
    tensors = [float8_classes.quantize(x), float8_classes.quantize(x * 1e3, torch.float8_e5m2)]
    data = run_collecting(tmp_path, lambda: [rt.call("Torch.clone", lambda v: v, t) for t in tensors])
    assert float8_classes.DISPATCHED == []
    for index, tensor in enumerate(tensors):
        dtype = torch.float8_e4m3fn if index == 0 else torch.float8_e5m2
        raw = tensor._data.view(dtype)
        values = raw.float() * tensor._scale_inv
        record = data[f"Torch.clone.{index}.forward"]["input_args"][0]
        check(record, values, raw, tensor._scale_inv.item())
        assert record[FP8_SATURATED_FRACTION] > 0  # the largest magnitude maps to the format's max


def test_an_unknown_format_member_keeps_null_statistics(tmp_path, monkeypatch):
    float8_classes.install_te(monkeypatch)
    tensor = float8_classes.quantize(torch.randn(4, 4))
    tensor._fp8_dtype = object()  # not a member of DType: the format is not guessed
    data = run_collecting(tmp_path, lambda: rt.call("Torch.clone", lambda v: v, tensor))
    record = data["Torch.clone.0.forward"]["input_args"][0]
    assert record["Max"] is None and FP8_SCALE not in record and record["dtype"] == "torch.bfloat16"


def test_scaled_statistics_start_no_host_sync(monkeypatch):
    x = torch.randn(300, 70)
    views = [
        float8_view((x * 50).to(torch.float8_e4m3fn), torch.tensor(50.0), True),
        float8_view((x * 50).to(torch.float8_e4m3fn), torch.full((300, 1), 50.0), True),
    ]
    synced = []
    for name in ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda self, *a, _n=name, _o=original, **k: (synced.append(_n), _o(self, *a, **k))[1]
        )
    stats = StatBuffer(nan_inf_count=True, native=False)
    slots = [stats.add(view, KIND_LOW) for view in views]
    monkeypatch.undo()
    assert synced == []
    assert stats.take()
    for view, (slot, counts) in zip(views, slots):
        row = slot_values(slot)
        assert len(row) == (5 if view is views[0] else 6)
        assert row[0] == pytest.approx(view.float().max().item() / 50.0, rel=1e-6)
        assert row[4] == pytest.approx(1 / 50.0, rel=1e-6)


def test_a_tensor_dump_saves_the_raw_float8_data_beside_its_scale(tmp_path):
    tensor = _torchao(torch.randn(8, 16), torch.tensor(64.0))
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", task="tensor")
    debugger.start()
    rt.call("Torch.clone", lambda v: v, tensor)
    debugger.stop()
    debugger.wait()
    [path] = glob.glob(os.path.join(glob.escape(str(tmp_path / "d")), "step0", "*", "dump.json"))
    with open(path) as handle:
        record = json.load(handle)["data"]["Torch.clone.0.forward"]["input_args"][0]
    saved = torch.load(os.path.join(os.path.dirname(path), "dump_tensor_data", record["data_name"]))
    assert type(saved) is torch.Tensor and saved.dtype == torch.float8_e4m3fn
    assert torch.equal(saved.view(torch.uint8), tensor._data.view(torch.uint8))
    assert record[FP8_SCALE] == 1 / 64.0  # values = saved * fp8_scale
