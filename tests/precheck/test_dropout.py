"""Dropout is replayed with the mask the device drew, read from its dumped output (and, where the input was
zero, from the dumped input gradient); an imprecise scaling is still caught."""

import csv
import json

import pytest

torch = pytest.importorskip("torch")

from .conftest import run_precheck  # noqa: E402


def _record(tensor, name, requires_grad=False):
    return {
        "type": "torch.Tensor",
        "dtype": str(tensor.dtype),
        "shape": list(tensor.shape),
        "Max": None,
        "Min": None,
        "Mean": None,
        "Norm": None,
        "requires_grad": requires_grad,
        "data_name": name,
    }


def make_dump(root, scale=1.0):
    rank = root / "step0" / "rank0"
    data = rank / "dump_tensor_data"
    data.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 64, generator=generator)
    x[:, :8] = 0  # zeros whose mask only the gradient tells
    p = 0.25
    mask = torch.rand(64, 64, generator=generator) >= p
    out = x * (mask.float() / (1 - p)) * scale
    grad_out = torch.randn(64, 64, generator=generator)
    grad_in = grad_out * (mask.float() / (1 - p))
    tensors = {
        "Functional.dropout.0.forward.input.0.pt": x,
        "Functional.dropout.0.forward.output.0.pt": out,
        "Functional.dropout.0.backward.input.0.pt": grad_out,
        "Functional.dropout.0.backward.output.0.pt": grad_in,
    }
    for name, tensor in tensors.items():
        torch.save(tensor, data / name)
    entries = {
        "Functional.dropout.0.forward": {
            "input_args": [
                _record(x, "Functional.dropout.0.forward.input.0.pt", True),
                {"type": "float", "value": p},
                {"type": "bool", "value": True},
                {"type": "bool", "value": False},
            ],
            "input_kwargs": {},
            "output": [_record(out, "Functional.dropout.0.forward.output.0.pt", True)],
        },
        "Functional.dropout.0.backward": {
            "input": [_record(grad_out, "Functional.dropout.0.backward.input.0.pt")],
            "output": [_record(grad_in, "Functional.dropout.0.backward.output.0.pt")],
        },
    }
    (rank / "dump.json").write_text(
        json.dumps({"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": entries})
    )
    return root


@pytest.mark.parametrize("scale, expected", [(1.0, 0), (1.001, 1)])
def test_dropout_replays_with_the_dumped_mask(tmp_path, scale, expected):
    dump = make_dump(tmp_path / "dump", scale)
    code, _, err = run_precheck(dump, tmp_path / "out", "-j", "1")
    assert code == expected, err
    with open(tmp_path / "out" / "precheck_result.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    (fraction,) = [r for r in rows if r["Metric"] == "drop_fraction"]
    assert fraction["Status"] == "pass"
    backward = [r for r in rows if r["Direction"] == "backward"]
    assert backward and all(r["Status"] in ("pass", "info") for r in backward)
    forward = {r["Status"] for r in rows if r["Direction"] == "forward" and r["Metric"] != "drop_fraction"}
    assert forward == ({"pass"} if scale == 1.0 else {"pass", "error"})
