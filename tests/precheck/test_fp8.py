"""The pre-check flags float8 records whose saturated or zero share is above its limit (precheck/fp8.py),
from the records alone: a call the CPU cannot replay is still range-checked."""

import csv
import json

import pytest

torch = pytest.importorskip("torch")

from msprobe_rewrite.precheck import apis, fp8, standards  # noqa: E402
from msprobe_rewrite.precheck.summary import verdicts  # noqa: E402

from .conftest import run_precheck  # noqa: E402

FP8 = torch.float8_e4m3fn


def _record(tensor, name):
    record = {
        "type": "torch.Tensor",
        "dtype": str(tensor.dtype),
        "shape": list(tensor.shape),
        "Max": None,
        "Min": None,
        "Mean": None,
        "Norm": None,
        "requires_grad": False,
        "data_name": name,
    }
    if tensor.dtype == FP8:
        values = tensor.float()
        record["fp8_zero_fraction"] = values.eq(0).float().mean().item()
        record["fp8_saturated_fraction"] = values.abs().eq(torch.finfo(FP8).max).float().mean().item()
    return record


def make_dump(root, scale):
    """One cast of a float32 tensor to float8_e4m3fn (``Tensor.to``) times ``scale``: a large scale saturates
    many elements, a small one flushes many to zero."""
    rank = root / "step0" / "rank0"
    data = rank / "dump_tensor_data"
    data.mkdir(parents=True)
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) * scale
    out = x.to(FP8)
    names = ("Tensor.to.0.forward.input.0.pt", "Tensor.to.0.forward.output.0.pt")
    torch.save(x, data / names[0])
    torch.save(out, data / names[1])
    entries = {
        "Tensor.to.0.forward": {
            "input_args": [_record(x, names[0]), {"type": "torch.dtype", "value": "torch.float8_e4m3fn"}],
            "input_kwargs": {},
            "output": [_record(out, names[1])],
        }
    }
    (rank / "dump.json").write_text(
        json.dumps({"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": entries})
    )
    return root, entries


def _rows(item):
    from msprobe_rewrite.precheck import worker

    worker.init(apis.load_table(), None)
    return verdicts([worker.check(item)])[0]


@pytest.mark.parametrize(
    "scale, metric, status",
    [(1.0, None, None), (1000.0, "fp8_saturated_fraction", "error"), (1e-3, "fp8_zero_fraction", "warning")],
)
def test_a_cast_to_float8_is_flagged_by_its_shares(tmp_path, scale, metric, status):
    root, entries = make_dump(tmp_path / "dump", scale)
    item = {
        "name": "Tensor.to.0",
        "api": "Tensor.to",
        "forward": entries["Tensor.to.0.forward"],
        "backward": None,
        "tensor_dir": str(root / "step0" / "rank0" / "dump_tensor_data"),
        "label": "rank0",
    }
    api = _rows(item)
    ranged = {row["metric"]: row for row in api["rows"] if row["standard"] == fp8.STANDARD}
    assert set(ranged) == {"fp8_saturated_fraction", "fp8_zero_fraction"}
    assert all(row["tensor"] == "output.0" and row["dtype"] == "float8_e4m3fn" for row in ranged.values())
    if metric is None:  # randn in float8: about 0.05 % of zeros, nothing saturated
        assert {row["status"] for row in ranged.values()} == {standards.PASS}
        assert ranged["fp8_zero_fraction"]["device"] < 0.01
        return
    assert ranged[metric]["status"] == status and ranged[metric]["device"] > 0.5
    assert api["status"] == status and api["reason"].startswith(f"forward output.0: {metric}")


def test_a_call_that_cannot_be_replayed_is_still_range_checked(tmp_path):
    root, entries = make_dump(tmp_path / "dump", 1000.0)
    item = {
        "name": "Torch.rand_like.0",
        "api": "Torch.rand_like",
        "forward": entries["Tensor.to.0.forward"],
        "backward": None,
        "tensor_dir": str(root),
        "label": "rank0",
    }
    api = _rows(item)
    assert api["rows"][0]["metric"] == "replay" and api["rows"][0]["status"] == standards.SKIP
    assert api["status"] == standards.ERROR
    # below the limits the call stays what it was: not replayed (a passing range row is no replay)
    item["fp8_limits"] = {"fp8_saturated_fraction": 1.0, "fp8_zero_fraction": 1.0}
    assert _rows(item)["status"] == standards.SKIP


@pytest.mark.slow  # spawns the command
def test_the_command_takes_the_limits(tmp_path):
    root, _ = make_dump(tmp_path / "dump", 1000.0)
    code, _, err = run_precheck(root, tmp_path / "out", "-j", "1")
    assert code == 1, err
    code, _, err = run_precheck(root, tmp_path / "out2", "-j", "1", "--fp8-saturated", "0.9")
    assert code == 0, err
    with open(tmp_path / "out2" / "precheck_result.csv", encoding="utf-8") as handle:
        (row,) = [r for r in csv.DictReader(handle) if r["Metric"] == "fp8_saturated_fraction"]
    assert row["Threshold"] == "<= 0.9" and row["Status"] == "pass" and float(row["Device"]) > 0.5
