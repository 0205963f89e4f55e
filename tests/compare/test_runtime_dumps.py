"""compare on dumps of our own runtime: agreement, a 1 % error, a NaN, an extra call, incompatible dumps."""

import csv
import glob
import json
import os

import pytest

from msprobe_rewrite.compare import compare_runs

from .conftest import fixture_line, run_compare

pytestmark = pytest.mark.slow  # training runs and compare CLI runs in fresh interpreters (about 27 s)

TANH_LINE = "h = torch.tanh(self.inp(x))"
SIGMOID_LINE = "h = torch.sigmoid(h) * h"
GELU_LINE = "h = F.gelu(self.fc(x))"


def test_two_identical_runs_do_not_diverge(make_dump, tmp_path):
    a, b = make_dump(), make_dump("--steps", "1")  # the same options, spelled differently: a second run
    code, out, err = run_compare(a, b, "-o", tmp_path / "out")
    assert code == 0, out + err
    summary = json.loads((tmp_path / "out" / "compare_summary.json").read_text())
    assert summary["first_divergence"] is None
    [pair] = summary["pairs"]
    assert pair["matched"] == pair["entries_a"] == pair["entries_b"] > 40
    assert pair["unmatched_a_count"] == pair["unmatched_b_count"] == 0
    assert pair["diverged_entries"] == 0 and pair["tensors_compared"] > 100
    assert "first divergence: none" in out


@pytest.mark.parametrize(
    "api, entry, line",
    [
        ("Torch.sigmoid", "Torch.sigmoid.0.forward", SIGMOID_LINE),
        ("Functional.gelu", "Functional.gelu.0.forward", GELU_LINE),
    ],
)
def test_one_percent_scaling_is_named_as_first_divergence(make_dump, tmp_path, api, entry, line):
    summary = compare_runs(
        str(make_dump("--scale-api", api, "--factor", "1.01")), str(make_dump()), str(tmp_path / "out")
    )
    first = summary["first_divergence"]
    assert first is not None and first["entry"] == entry and first["bench_entry"] == entry
    assert first["kind"] == "outputs" and first["role"] == "output"
    assert first["call_site"].endswith(f"train.py:{fixture_line(line)}")
    assert first["error"] == pytest.approx(0.01, rel=0.05)  # 1 % in every statistic
    assert first["chain_length"] > 0 and first["chain"]
    assert not first["nan_onset"]
    assert summary["pairs"][0]["nan_onset"] == {"a": None, "b": None}


def test_nan_is_named_with_its_onset(make_dump, tmp_path):
    code, out, err = run_compare(make_dump("--nan-at", "Functional.gelu"), make_dump(), "-o", tmp_path / "out")
    assert code == 1, out + err
    summary = json.loads((tmp_path / "out" / "compare_summary.json").read_text())
    first = summary["first_divergence"]
    assert first["entry"] == "Functional.gelu.0.forward" and first["nan_onset"] is True
    assert first["call_site"].endswith(f"train.py:{fixture_line(GELU_LINE)}")
    onset = summary["pairs"][0]["nan_onset"]
    assert onset["a"]["entry"] == "Functional.gelu.0.forward" and onset["b"] is None
    assert "NaN/Inf first appears in A at Functional.gelu.0.forward" in out


def test_one_extra_call_leaves_everything_else_matched(make_dump, tmp_path):
    summary = compare_runs(str(make_dump("--extra-call")), str(make_dump()), str(tmp_path / "out"))
    [pair] = summary["pairs"]
    assert pair["unmatched_a"] == ["Torch.tanh.0.forward"] and pair["unmatched_b"] == []
    assert pair["matched"] == pair["entries_b"] == pair["entries_a"] - 1
    assert summary["first_divergence"] is None
    [csv_path] = glob.glob(str(tmp_path / "out" / "compare_result_*.csv"))
    with open(csv_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    pairs = {(row["NPU Name"], row["Bench Name"]) for row in rows}
    # every later tanh has its call index shifted by one in A, and still meets its counterpart in B
    assert ("Torch.tanh.1.forward.output.0", "Torch.tanh.0.forward.output.0") in pairs
    assert ("Torch.tanh.2.forward.output.0", "Torch.tanh.1.forward.output.0") in pairs
    assert ("Torch.tanh.0.forward.input.0", "N/A") in pairs
    assert {row["Result"] for row in rows if row["Bench Name"] != "N/A"} == {"pass"}


def test_different_levels_are_a_clear_error(make_dump):
    code, out, err = run_compare(make_dump("--level", "L1"), make_dump())
    assert code == 2
    assert "different levels" in err and "level='L1'" in err and "level='mix'" in err
    assert "Traceback" not in err


def test_different_tasks_are_a_clear_error(make_dump):
    code, out, err = run_compare(make_dump("--task", "tensor"), make_dump())
    assert code == 2 and "different tasks" in err and "Traceback" not in err


def test_tensor_dumps_get_element_wise_metrics(make_dump, tmp_path):
    base = make_dump("--task", "tensor")
    same = compare_runs(str(base), str(base), str(tmp_path / "same"))
    assert same["first_divergence"] is None
    summary = compare_runs(
        str(make_dump("--task", "tensor", "--scale-api", "Torch.sigmoid")), str(base), str(tmp_path / "out")
    )
    assert summary["first_divergence"]["entry"] == "Torch.sigmoid.0.forward"
    [csv_path] = glob.glob(str(tmp_path / "out" / "compare_result_*.csv"))
    with open(csv_path, newline="") as handle:
        rows = {row["NPU Name"]: row for row in csv.DictReader(handle)}
    for column in (
        "Cosine",
        "EucDist",
        "MaxAbsErr",
        "MaxRelativeErr",
        "One Thousandth Err Ratio",
        "Five Thousandths Err Ratio",
    ):
        assert column in next(iter(rows.values()))
    scaled = rows["Torch.sigmoid.0.forward.output.0"]
    assert float(scaled["Cosine"]) == pytest.approx(1.0)  # a scaling keeps the direction
    assert float(scaled["MaxRelativeErr"]) == pytest.approx(0.01, rel=1e-3)
    assert float(scaled["One Thousandth Err Ratio"]) == 0.0 and float(scaled["Five Thousandths Err Ratio"]) == 0.0
    untouched = rows["Torch.sigmoid.0.forward.input.0"]
    assert float(untouched["Cosine"]) == pytest.approx(1.0) and float(untouched["MaxAbsErr"]) == 0.0
    assert float(untouched["One Thousandth Err Ratio"]) == 1.0


def test_reports(make_dump, tmp_path):
    out = tmp_path / "out"
    code, stdout, _ = run_compare(make_dump("--scale-api", "Torch.sigmoid"), make_dump(), "-o", out)
    assert code == 1
    assert "first divergence: Torch.sigmoid.0.forward" in stdout and "top divergences" in stdout
    page = (out / "compare_report.html").read_text()
    assert "<svg" in page and "first divergence: Torch.sigmoid.0.forward" in page
    assert "<script" not in page and "<link" not in page and "src=" not in page
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    [csv_path] = glob.glob(str(out / "compare_result_*.csv"))
    with open(csv_path, newline="") as handle:
        header = next(csv.reader(handle))
    for column in (
        "NPU Name",
        "Bench Name",
        "NPU Dtype",
        "Bench Dtype",
        "NPU Tensor Shape",
        "Bench Tensor Shape",
        "NPU Requires_grad",
        "Bench Requires_grad",
        "Max diff",
        "Min diff",
        "Mean diff",
        "L2norm diff",
        "MaxRelativeErr",
        "MinRelativeErr",
        "MeanRelativeErr",
        "NormRelativeErr",
        "NPU max",
        "NPU min",
        "NPU mean",
        "NPU l2norm",
        "Bench max",
        "Bench min",
        "Bench mean",
        "Bench l2norm",
        "Requires_grad Consistent",
        "Result",
        "Err_message",
        "NPU_Stack_Info",
    ):
        assert column in header
    summary = json.loads((out / "compare_summary.json").read_text())  # strict JSON: no NaN or Infinity
    assert "first_divergence" in summary


def test_thresholds_are_configurable_per_dtype(make_dump):
    a, b = str(make_dump("--scale-api", "Torch.sigmoid")), str(make_dump())
    # above 1 % the forward entries pass; what remains is the injection's own backward (the replaced
    # sigmoid's grad_fn is a multiplication, so its recorded gradient differs by far more than 1 %)
    loose = compare_runs(a, b, thresholds={"float32": 0.02})["first_divergence"]
    assert loose["entry"] == "Torch.sigmoid.0.backward"
    assert compare_runs(a, b, thresholds={"float32": 0.005})["first_divergence"]["entry"] == "Torch.sigmoid.0.forward"
    assert compare_runs(a, b, thresholds={"float32": 2.0})["first_divergence"] is None
    code, _, err = run_compare(a, b, "--threshold", "float32=2")
    assert code == 0, err
    code, _, err = run_compare(a, b, "--threshold", "float32")
    assert code == 2 and "DTYPE=VALUE" in err


def test_missing_paths_and_unreadable_json(tmp_path, make_dump):
    code, _, err = run_compare(tmp_path / "nowhere", make_dump())
    assert code == 2 and "no such file or directory" in err
    broken = tmp_path / "broken" / "dump.json"
    broken.parent.mkdir()
    broken.write_text('{"task": "statistics", "level": "mix", "data": {"Torch.relu.0.forward": {"input_args": [')
    code, _, err = run_compare(broken, broken)
    assert code == 2 and "not a readable dump.json" in err and "Traceback" not in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_compare(empty, make_dump())
    assert code == 2 and "no dump.json found" in err


def test_statistics_comparison_imports_neither_libcst_nor_torch(make_dump):
    import subprocess
    import sys

    from .conftest import ROOT

    code = (
        "import sys; from msprobe_rewrite.cli import main; rc = main(['compare', sys.argv[1], sys.argv[2]]);"
        "assert 'libcst' not in sys.modules and 'torch' not in sys.modules, 'imported'; print(rc)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(make_dump()), str(make_dump())],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0"


def test_at_l0_a_fault_in_a_modules_own_code_is_located_inside_that_module(make_dump):
    # F.gelu is not recorded at L0: the difference first shows at the input of the next recorded module,
    # and the LayerNorm after it shrinks the error below threshold, so no later entry is to blame
    summary = compare_runs(
        str(make_dump("--level", "L0", "--scale-api", "Functional.gelu")), str(make_dump("--level", "L0"))
    )
    first = summary["first_divergence"]
    assert first["entry"] == "Module.block1.norm.LayerNorm.forward.0"
    assert first["kind"] == "inputs" and first["role"] == "input"
    assert first["parent"] == "Module.block1.Block.forward.0"
