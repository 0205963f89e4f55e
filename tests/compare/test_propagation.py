"""Units of the error-propagation view: scale-aware errors, op classes, the noise floor, suspects on
hand-written dumps (no torch, no training run)."""

import json
import math

import pytest

from msprobe_rewrite.compare import compare_runs
from msprobe_rewrite.compare.metrics import Thresholds, compare_tensors
from msprobe_rewrite.compare.noise import CAP_ULPS, HEADROOM, floor_of, floors
from msprobe_rewrite.compare.propagation import allowance, op_class, tensor_errors
from msprobe_rewrite.compare.records import OUTPUT, Tensor

EPS = 1.19e-7


def _record(mx, mn, mean, norm, shape=(32, 64)):
    return {
        "type": "torch.Tensor",
        "dtype": "torch.float32",
        "shape": list(shape),
        "Max": mx,
        "Min": mn,
        "Mean": mean,
        "Norm": norm,
        "requires_grad": True,
    }


def test_a_statistic_near_zero_is_measured_against_the_tensors_scale():
    # a gradient whose Min of about -0.002 moves by 0.0022: msprobe's relative error is 1.1, but against
    # the tensor's own scale (max |x| = 1) the change is 0.0022
    a = Tensor("output.0", OUTPUT, _record(1.0, -0.0042, 1e-5, 10.0))
    b = Tensor("output.0", OUTPUT, _record(1.0, -0.002, 1e-5, 10.0))
    diff = compare_tensors(a, b, Thresholds())
    assert diff.rel[1] == pytest.approx(1.1)
    errors, top, rms, worst = tensor_errors(diff)
    assert top == 1.0 and rms == pytest.approx(10.0 / math.sqrt(32 * 64))
    assert errors[1] == pytest.approx(0.0022) and worst == pytest.approx(0.0022)
    assert errors[0] == 0.0 and errors[2] == 0.0 and errors[3] == 0.0


def test_a_mean_is_measured_against_rms_and_a_norm_against_itself():
    a = Tensor("output.0", OUTPUT, _record(3.0, -3.0, 0.011, 101.0, shape=(100,)))
    b = Tensor("output.0", OUTPUT, _record(3.0, -3.0, 0.010, 100.0, shape=(100,)))
    errors, _, rms, _ = tensor_errors(compare_tensors(a, b, Thresholds()))
    assert rms == pytest.approx(10.0)
    assert errors[2] == pytest.approx(0.001 / 10.0) and errors[3] == pytest.approx(0.01)


@pytest.mark.parametrize(
    "name, cls",
    [
        ("Functional.linear", "matmul"),
        ("Torch.baddbmm", "matmul"),
        ("Tensor.__matmul__", "matmul"),
        ("Functional.layer_norm", "norm"),
        ("Functional.batch_norm", "norm"),
        ("Functional.softmax", "exp"),
        ("Torch.exp", "exp"),
        ("Functional.cross_entropy", "exp"),
        ("Tensor.sum", "reduction"),
        ("Functional.mse_loss", "reduction"),
        ("Functional.gelu", "elementwise"),
        ("Tensor.__add__", "elementwise"),
        ("Module.fcs.0.Linear", "matmul"),
        ("Module.norms.0.LayerNorm", "norm"),
        ("Module.block.Block", "module"),
    ],
)
def test_op_classes(name, cls):
    assert op_class(name) == cls


def test_allowances_grow_with_what_each_class_can_amplify():
    assert allowance("elementwise", 64, 1, 1) == allowance("elementwise", 4096, 50, 9)
    assert allowance("matmul", 4096, 1, 1) == 8 * allowance("matmul", 64, 1, 1)  # sqrt(K)
    assert allowance("norm", 1, 50, 1) == 50 * allowance("norm", 1, 1, 1)  # max |x| / std
    assert allowance("norm", 1, 0.5, 1) == allowance("norm", 1, 1, 1)


def test_noise_floor_is_a_capped_low_quantile_and_sums_scale_with_size():
    values = [1e-9 * (1 + i) for i in range(100)]
    floor = floors({("torch.float32", "Max"): values})["torch.float32"]["Max"]
    assert floor == pytest.approx(HEADROOM * values[25])
    capped = floors({("torch.float32", "Max"): [1e-3] * 10})["torch.float32"]["Max"]
    assert capped == pytest.approx(CAP_ULPS * EPS, rel=0.01)
    limits = {"Max": 4e-6, "Mean": 1e-8}
    assert floor_of(limits, "Max", 10000) == 4e-6
    assert floor_of(limits, "Mean", 10000) == pytest.approx(1e-6)  # per sqrt(n), scaled back
    assert floor_of(limits, "Mean", 1) == 4e-6  # a scalar's Mean is its Max


# hand-written dumps: a chain of layers, every statistic nudged by a few ulp in run A; one entry can carry a
# real error; each entry's input is the previous entry's output (as a real run records it)


def _chain(directory, errors, ops, noise_seed=1, inputs_extra=None):
    import random

    rng = random.Random(noise_seed)
    data = {}
    values = (1.8, -1.9, 0.01, 27.0)
    previous_a = previous_b = values
    counts = {}
    for position, (op, error) in enumerate(zip(ops, errors)):
        index = counts.get(op, 0)
        counts[op] = index + 1
        out_b = tuple(v * (1 + 0.1 * position) for v in values)
        jitter = [1 + rng.choice((-2, -1, 1, 2)) * EPS for _ in range(4)]
        out_a = tuple(v * j * (1 + error) for v, j in zip(out_b, jitter))
        for side, previous, out in (("a", previous_a, out_a), ("b", previous_b, out_b)):
            entry = {"input_args": [_record(*previous)], "input_kwargs": {}, "output": [_record(*out)]}
            if inputs_extra and position in inputs_extra:
                entry["input_args"].append(_record(*inputs_extra[position][side]))
            data.setdefault(side, {})[f"{op}.{index}.forward"] = entry
        previous_a, previous_b = out_a, out_b
    for side in ("a", "b"):
        path = directory / side
        path.mkdir(parents=True)
        (path / "dump.json").write_text(
            json.dumps(
                {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data[side]}
            )
        )
    return str(directory / "a"), str(directory / "b")


OPS = ["Functional.linear", "Functional.gelu", "Functional.layer_norm"] * 6


def test_noise_alone_names_no_suspect(tmp_path):
    a, b = _chain(tmp_path, [0.0] * len(OPS), OPS)
    summary = compare_runs(a, b)
    assert summary["first_suspect"] is None and summary["pairs"][0]["suspects"] == []
    assert summary["pairs"][0]["noise_floor"]["torch.float32"]["Max"] > 0


def test_the_entry_that_injects_the_error_is_the_first_suspect(tmp_path):
    errors = [0.0] * len(OPS)
    errors[7] = 4e-3  # a gelu computed in bfloat16; every later entry inherits the error
    for later in range(8, len(OPS)):
        errors[later] = 4e-3
    a, b = _chain(tmp_path, errors, OPS)
    summary = compare_runs(a, b)
    first = summary["first_suspect"]
    assert first["entry"] == "Functional.gelu.2.forward"
    assert first["output_error"] == pytest.approx(4e-3, rel=0.01)
    assert first["input_error"] < 1e-5 and first["gain"] > 100 and first["op_class"] == "elementwise"
    assert [s["entry"] for s in summary["pairs"][0]["suspects"]] == ["Functional.gelu.2.forward"]


def test_an_error_within_the_ops_allowance_is_not_a_suspect(tmp_path):
    # the error grows 5x through a linear (K = 64 allows 32x) once it is there: propagation, not injection
    errors = [0.0] * len(OPS)
    errors[1] = errors[2] = 1e-4
    errors[3] = 5e-4
    for later in range(4, len(OPS)):
        errors[later] = 5e-4
    a, b = _chain(tmp_path, errors, OPS)
    suspects = compare_runs(a, b)["pairs"][0]["suspects"]
    assert [s["entry"] for s in suspects] == ["Functional.gelu.0.forward"]


def test_an_unused_input_that_differs_wholly_does_not_excuse_the_output(tmp_path):
    # megatron's baddbmm reads an uninitialised buffer under beta=0: the buffer differs completely between
    # runs, the output does not show it, so it explains nothing
    errors = [0.0] * len(OPS)
    for later in range(4, len(OPS)):
        errors[later] = 3e-3
    garbage = {4: {"a": (2.4e-7, -2.4e-7, 2e-9, 8e-6), "b": (1.3e15, -2.4e-7, 1.8e12, 2.1e15)}}
    a, b = _chain(tmp_path, errors, OPS, inputs_extra=garbage)
    assert compare_runs(a, b)["first_suspect"]["entry"] == "Functional.gelu.1.forward"


def _stats(values, shape):
    return _record(*values, shape=shape)


# step 0 of fixtures/bignet as recorded by the demo (python -m fixtures.demo), run A with the default seed and
# run B with --seed 7: net1's first linear (input x, weight, bias -> output) and the batch_norm it feeds
# (that output, running mean, running var, weight, bias -> normalised output), Max, Min, Mean, Norm
SEEDED_LINEAR = {
    "a": [
        (2.7440667, -2.3309395, -0.0232627, 9.9738016),
        (0.1764288, -0.1765512, -0.0002825, 3.1622252),
        (0.1731171, -0.1547506, -0.0216476, 0.4922506),
        (1.3671668, -1.4511256, -0.0584613, 5.1804814),
    ],
    "b": [
        (2.5966012, -2.7002826, -0.0039410, 9.8077621),
        (0.1766308, -0.1765421, 0.0001034, 3.2956371),
        (0.1711940, -0.1761866, -0.0208750, 0.6286973),
        (1.5190893, -1.2341632, 0.0042249, 5.6230364),
    ],
}
SEEDED_BATCH_NORM_OUTPUT = {
    "a": (1.4137990, -1.4132441, -1.64e-08, 9.7976532),
    "b": (1.4135700, -1.4130316, -1.42e-08, 9.7977266),
}


def test_a_normalisation_whose_input_differs_wholly_is_explained_by_it(tmp_path):
    """Two runs with different seeds: every input differs. batch_norm over a batch of 3 bounds its output by
    sqrt(2) and makes its Norm sqrt(numel), so its output's statistics move by 1.6e-4 while its input moves
    by 0.14: the rule that takes such an input for an unused one (baddbmm's buffer, above) dropped it, and the
    compare named batch_norm the first suspect with "input error 0" (the demo with --seed 7)."""
    zeros, ones = (0.0, 0.0, 0.0, 0.0), (1.0, 1.0, 1.0, math.sqrt(32))
    for side in ("a", "b"):
        x, weight, bias, out = SEEDED_LINEAR[side]
        data = {
            "Functional.linear.0.forward": {
                "input_args": [_stats(x, (3, 32)), _stats(weight, (32, 32)), _stats(bias, (32,))],
                "input_kwargs": {},
                "output": [_stats(out, (3, 32))],
            },
            "Functional.batch_norm.0.forward": {
                "input_args": [_stats(out, (3, 32))] + [_stats(v, (32,)) for v in (zeros, ones, ones, zeros)],
                "input_kwargs": {},
                "output": [_stats(SEEDED_BATCH_NORM_OUTPUT[side], (3, 32))],
            },
        }
        (tmp_path / side).mkdir()
        (tmp_path / side / "dump.json").write_text(
            json.dumps(
                {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}
            )
        )
    summary = compare_runs(str(tmp_path / "a"), str(tmp_path / "b"))
    assert summary["pairs"][0]["suspects"] == [] and summary["first_suspect"] is None, summary["first_suspect"]


def test_a_nan_onset_is_the_first_suspect_and_the_reports_render(tmp_path):
    errors = [0.0] * len(OPS)
    for later in range(5, len(OPS)):
        errors[later] = math.nan
    a, b = _chain(tmp_path, errors, OPS)
    summary = compare_runs(a, b, str(tmp_path / "out"))
    first = summary["first_suspect"]
    assert first["entry"] == "Functional.layer_norm.1.forward" and first["output_error"] == "inf"
    assert [s["entry"] for s in summary["pairs"][0]["suspects"]] == ["Functional.layer_norm.1.forward"]
    page = (tmp_path / "out" / "compare_report.html").read_text()
    assert 'id="suspect-0-1"' in page and "First suspect:" in page
