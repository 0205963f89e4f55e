"""The compare reads the float8 fields of dump.json records (docs/low-precision.md): each side's
``fp8_zero_fraction`` and ``fp8_saturated_fraction`` in the CSV after msprobe's columns, and the first suspect
says when a float8 record's share of zeros rose (underflow). Hand-written dumps, no torch."""

import csv
import json
import random

from msprobe_rewrite.compare import compare_runs
from msprobe_rewrite.compare.fp8 import describe, findings
from msprobe_rewrite.compare.records import INPUT, OUTPUT, Tensor
from msprobe_rewrite.compare.report_csv import BASIC, EXTRACT, SUMMARY_INDEX, SUMMARY_INFO
from msprobe_rewrite.compare.summary import terminal_summary

EPS = 1.19e-7
OPS = ["Functional.linear", "Functional.gelu", "Functional.layer_norm"] * 6


def _record(mx, mn, mean, norm, dtype="torch.float32", zero=None, saturated=None, shape=(32, 64)):
    record = {
        "type": "torch.Tensor",
        "dtype": dtype,
        "shape": list(shape),
        "Max": mx,
        "Min": mn,
        "Mean": mean,
        "Norm": norm,
        "requires_grad": True,
    }
    if zero is not None:
        record.update(NaN_count=0, Inf_count=0, fp8_zero_fraction=zero, fp8_saturated_fraction=saturated)
    return record


def _write(directory, data):
    directory.mkdir(parents=True)
    (directory / "dump.json").write_text(
        json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data})
    )
    return str(directory)


def _chain(tmp_path, culprit, in_a, in_b, error):
    """Run A and B of a chain of OPS whose entry ``culprit`` has the input records ``in_a``/``in_b`` (functions
    of the statistics: a float8 input, as a matmul of an FP8 recipe receives) and an output error ``error`` from
    there on; a few ulp of noise everywhere else."""
    rng = random.Random(1)
    values = (1.8, -1.9, 0.01, 27.0)
    previous = {"a": values, "b": values}
    data = {"a": {}, "b": {}}
    counts = {}
    for position, op in enumerate(OPS):
        index = counts.get(op, 0)
        counts[op] = index + 1
        stats_b = tuple(v * (1 + 0.1 * position) for v in values)
        jitter = [1 + rng.choice((-2, -1, 1, 2)) * EPS for _ in range(4)]
        stats_a = tuple(v * j * (1 + (error if position >= culprit else 0.0)) for v, j in zip(stats_b, jitter))
        for side, stats, maker in (("a", stats_a, in_a), ("b", stats_b, in_b)):
            given = maker(*previous[side]) if position == culprit else _record(*previous[side])
            data[side][f"{op}.{index}.forward"] = {
                "input_args": [given],
                "input_kwargs": {},
                "output": [_record(*stats)],
            }
            previous[side] = stats
    return _write(tmp_path / "a", data["a"]), _write(tmp_path / "b", data["b"])


def fp8(zero, saturated=0.01):
    return lambda mx, mn, mean, norm: _record(mx, mn, mean, norm, "torch.float8_e4m3fn", zero, saturated)


def test_csv_carries_each_sides_fractions_after_msprobes_columns(tmp_path):
    a, b = _chain(tmp_path, 7, fp8(0.25, 0.03), fp8(0.0, 0.01), 0.0)
    compare_runs(a, b, str(tmp_path / "out"))
    with open(tmp_path / "out" / "compare_result_a.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    header = rows[0]
    msprobe = BASIC + SUMMARY_INDEX + SUMMARY_INFO + EXTRACT
    assert header[: len(msprobe)] == msprobe  # msprobe's readers find their columns where they were
    column = {name: header.index(name) for name in header}
    by_name = {row[0]: row for row in rows[1:]}
    cast = by_name["Functional.gelu.2.forward.input.0"]
    assert cast[column["NPU fp8_zero_fraction"]] == "0.25" and cast[column["Bench fp8_zero_fraction"]] == "0.0"
    assert cast[column["NPU fp8_saturated_fraction"]] == "0.03"
    assert cast[column["Bench fp8_saturated_fraction"]] == "0.01"
    plain = by_name["Functional.gelu.2.forward.output.0"]
    assert [plain[column[name]] for name in header[len(header) - 4 :]] == ["N/A"] * 4


def test_a_rise_of_float8_zeros_against_the_other_run_explains_the_first_suspect(tmp_path):
    a, b = _chain(tmp_path, 7, fp8(0.25), fp8(0.001), 4e-3)
    summary = compare_runs(a, b)
    first = summary["first_suspect"]
    assert first["entry"] == "Functional.gelu.2.forward"
    assert "input.0 in run A: float8 zeros rose to 25 % from 0.1 %" in first["fp8_underflow"]
    assert "the same float8 tensor in run B" in first["fp8_underflow"]
    assert summary["first_divergence"]["fp8_underflow"] == first["fp8_underflow"]
    assert "float8 underflow: input.0 in run A" in terminal_summary(summary, 10)


def test_equal_float8_zero_shares_explain_nothing(tmp_path):
    a, b = _chain(tmp_path, 7, fp8(0.25), fp8(0.2495), 4e-3)
    first = compare_runs(a, b)["first_suspect"]
    assert first["entry"] == "Functional.gelu.2.forward" and "fp8_underflow" not in first


def test_against_a_float_run_whose_tensor_is_positive_the_rise_is_from_zero(tmp_path):
    # run B is bfloat16: its zeros are not counted, but a Min above 0 says it has none
    def positive_bf16(mx, mn, mean, norm):
        return _record(abs(mx), 1e-6, abs(mean), norm, "torch.bfloat16")  # its smallest are tiny

    def positive_fp8(mx, mn, mean, norm):
        return _record(abs(mx), 0.0, abs(mean), norm, "torch.float8_e4m3fn", 0.125, 0.0)

    a, b = _chain(tmp_path, 7, positive_fp8, positive_bf16, 4e-3)
    first = compare_runs(a, b)["first_suspect"]
    assert "float8 zeros rose to 12.5 % from 0 % in run B's torch.bfloat16 tensor" in first["fp8_underflow"]


def _tensor(suffix, role, record):
    return Tensor(suffix, role, record)


def test_against_the_same_entrys_float_input():
    # a cast: run A's float input is positive (no zeros), its float8 output holds 20 % zeros; run B's output
    # is a signed bfloat16 tensor whose zeros are not known
    x = _record(3.0, 0.25, 1.0, 40.0)
    a = [
        _tensor("input.0", INPUT, x),
        _tensor("output.0", OUTPUT, _record(3.0, 0.0, 1.0, 40.0, "torch.float8_e4m3fn", 0.2, 0.0)),
    ]
    b = [_tensor("input.0", INPUT, x), _tensor("output.0", OUTPUT, _record(3.0, -1.0, 1.0, 40.0, "torch.bfloat16"))]
    found = findings(list(zip(a, b)))
    assert found == [("output.0", "A", 0.2, 0.0, "its float input input.0 in run A")]
    # and the same in run B when run B is the float8 one: the view is symmetric
    assert findings(list(zip(b, a))) == [("output.0", "B", 0.2, 0.0, "its float input input.0 in run B")]


def test_with_nothing_to_set_against_a_large_share_is_named_as_such():
    a = [_tensor("input.0", INPUT, _record(3.0, -3.0, 0.0, 40.0, "torch.float8_e4m3fn", 0.4, 0.0))]
    b = [_tensor("input.0", INPUT, _record(3.0, -3.0, 0.0, 40.0, "torch.bfloat16"))]
    text = describe(findings(list(zip(a, b))))
    assert text == (
        "input.0 in run A: 40 % of its float8 elements are zero (underflow, or zeros before the cast: "
        "run B's torch.bfloat16 tensor gives no zero count to set against it)"
    )
    small = [_tensor("input.0", INPUT, _record(3.0, -3.0, 0.0, 40.0, "torch.float8_e4m3fn", 0.001, 0.0))]
    assert findings(list(zip(small, b))) == []


def _insert(directory, before, entries, parents):
    """Add ``entries`` to the dump in ``directory`` ahead of the entry ``before`` (execution order), and a
    construct.json naming each entry's enclosing module."""
    path = directory / "dump.json"
    dump = json.loads(path.read_text())
    data = {}
    for name, entry in dump["data"].items():
        if name == before:
            data.update(entries)
        data[name] = entry
    dump["data"] = data
    path.write_text(json.dumps(dump))
    (directory / "construct.json").write_text(json.dumps(parents))


def test_a_float8_twin_module_is_paired_and_named_with_the_underflow_inside_it(tmp_path):
    # torchao swaps nn.Linear for Float8Linear: run A (float8) has Module.fc.Float8Linear with a Torch.mm on
    # float8 operands inside it, run B (bfloat16) Module.fc.Linear with a Functional.linear inside it
    a, b = _chain(tmp_path, 7, lambda *s: _record(*s), lambda *s: _record(*s), 0.3)
    x = _record(1.8, -1.9, 0.01, 27.0)
    weight_a = _record(448.0, -3.0, 0.001, 500.0, "torch.float8_e4m3fn", 0.9990234375, 0.0001220703125)
    for side, module, inner, record in (
        ("a", "Module.fc.Float8Linear.forward.0", "Torch.mm.0.forward", weight_a),
        ("b", "Module.fc.Linear.forward.0", "Functional.linear.0.forward", _record(0.08, -0.08, 0.0, 1.8)),
    ):
        out = _record(1.8, -1.9, 0.01, 27.0 * (0.2 if side == "a" else 1.0))
        entries = {
            inner: {"input_args": [x, record], "input_kwargs": {}, "output": [out]},
            module: {"input_args": [x], "input_kwargs": {}, "output": [out]},
        }
        _insert(tmp_path / side, "Functional.gelu.2.forward", entries, {inner: module, module: None})
    summary = compare_runs(a, b)
    pair = summary["pairs"][0]
    assert "Module.fc.Float8Linear.forward.0" not in pair["unmatched_a"]  # paired with Module.fc.Linear
    first = summary["first_suspect"]
    assert first["entry"] == "Module.fc.Float8Linear.forward.0" and first["bench_entry"] == "Module.fc.Linear.forward.0"
    assert first["fp8_underflow"].startswith(
        "inside it, Torch.mm.0.forward: input.1 in run A: 99.9 % of its float8 elements are zero"
    )
