"""The metrics, the criteria and the name lookup, in process (fast)."""

import importlib.util

import pytest

torch = pytest.importorskip("torch")

from msprobe_rewrite.precheck import apis, metrics, standards  # noqa: E402
from msprobe_rewrite.precheck.errors import Unreplayable  # noqa: E402


def graded(standard, device, golden, cpu):
    dtype = device.dtype
    m_dev = metrics.measure(device, golden, dtype)
    m_cpu = metrics.measure(cpu, golden, dtype)
    return {row["metric"]: row["status"] for row in standards.grade(standard, dtype, m_dev, m_cpu)}


@pytest.fixture
def golden():
    return torch.randn(4096, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_a_relative_bias_of_1e_3_is_an_error_and_rounding_passes(golden):
    cpu = golden.float()
    assert set(graded(standards.BENCHMARK, cpu, golden, cpu).values()) == {"pass"}
    biased = graded(standards.BENCHMARK, (golden * (1 + 1e-3)).float(), golden, cpu)
    assert biased["rel_bias"] == biased["mean_rel_err"] == "error"


def test_bfloat16_compute_is_an_error_for_every_standard(golden):
    cpu = golden.float()
    low = golden.to(torch.bfloat16).float()
    for standard, metric in (
        (standards.BENCHMARK, "mean_rel_err"),
        (standards.ULP, "ulp_err_proportion"),
        (standards.ABSOLUTE, "rel_err_ratio"),
        (standards.BINARY, "mismatch_ratio"),
    ):
        assert graded(standard, low, golden, cpu)[metric] == "error", standard


def test_device_as_bad_as_the_cpu_same_dtype_passes(golden):
    # a bfloat16 op is held to what bfloat16 on the CPU reaches, not to float64
    device = golden.to(torch.bfloat16)
    assert set(graded(standards.BENCHMARK, device, golden, device.clone()).values()) == {"pass"}


def test_error_balance_catches_rounding_that_leans_one_way(golden):
    cpu = golden.float()
    up = torch.nextafter(cpu, torch.full_like(cpu, float("inf")))
    assert graded(standards.BENCHMARK, up, golden, cpu)["eb"] == "error"


def test_nan_where_the_golden_has_none_is_an_error(golden):
    cpu = golden.float()
    device = cpu.clone()
    device[7] = float("nan")
    assert graded(standards.BENCHMARK, device, golden, cpu)["nonfinite_mismatch"] == "error"


def test_names_resolve_through_the_catalogue():
    table = apis.load_table()
    assert apis.resolve("Functional.gelu", table)[0] is torch.nn.functional.gelu
    assert apis.resolve("Tensor.__mul__", table)[0] is torch.Tensor.__mul__
    assert apis.resolve("Torch.matmul", table)[0] is torch.matmul
    with pytest.raises(Unreplayable, match="catalogue does not know") as unknown:
        apis.resolve("Torch.no_such_api", table)
    assert unknown.value.input_problem
    with pytest.raises(Unreplayable, match="communication"):
        apis.resolve("Distributed.all_reduce", table)
    if importlib.util.find_spec("torch_npu") is None:
        with pytest.raises(Unreplayable, match="missing from this CPU build") as npu:
            apis.resolve("NPU.npu_fusion_attention", table)
        assert not npu.value.input_problem


def test_standards_follow_msprobes_lists():
    assert standards.standard_for("matmul", torch.float32) == standards.ULP
    assert standards.standard_for("__add__", torch.float16) == standards.ABSOLUTE
    assert standards.standard_for("relu", torch.bfloat16) == standards.BINARY
    assert standards.standard_for("gelu", torch.float32) == standards.BENCHMARK
    assert standards.standard_for("gelu", torch.int64) == standards.EXACT


def test_random_ops_say_why_in_their_row(tmp_path):
    from msprobe_rewrite.precheck import worker

    worker.init(apis.load_table(), None)
    record = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4], "data_name": "x.pt"}
    item = {
        "name": "Torch.randn_like.0",
        "api": "Torch.randn_like",
        "tensor_dir": str(tmp_path),
        "backward": None,
        "forward": {"input_args": [record], "input_kwargs": {}, "output": [record]},
    }
    (row,) = worker.check(item)["rows"]
    assert row["status"] == "skip" and "random op" in row["message"]
