"""Bad input gets a clear error and no traceback: a statistics-only dump, a truncated .pt, a missing tensor
file, an API name the catalogue does not know, a path with no dump."""

import csv
import glob
import json
import os
import shutil

import pytest

from .conftest import MSPROBE_STATISTICS_DUMP, MSPROBE_TENSOR_DUMP, run_precheck


@pytest.fixture
def dump_copy(tmp_path):
    target = tmp_path / "dump"
    shutil.copytree(MSPROBE_TENSOR_DUMP, target)
    rank = glob.glob(str(target / "step0" / "*"))[0]
    return target, rank


def rows_of(out, api):
    with open(os.path.join(out, "precheck_result.csv"), encoding="utf-8") as handle:
        return [row for row in csv.DictReader(handle) if row["API"] == api]


def test_statistics_only_dump_asks_for_task_tensor(tmp_path):
    code, out, err = run_precheck(MSPROBE_STATISTICS_DUMP, tmp_path / "out")
    assert code == 2
    assert "re-collect with task 'tensor'" in err and "Traceback" not in err + out


def test_no_dump_at_the_path(tmp_path):
    code, out, err = run_precheck(tmp_path / "nowhere", tmp_path / "out")
    assert code == 2 and "no such file or directory" in err and "Traceback" not in err + out


def test_truncated_tensor_file(dump_copy, tmp_path):
    dump, rank = dump_copy
    path = os.path.join(rank, "dump_tensor_data", "Torch.tanh.0.forward.input.0.pt")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    code, out, err = run_precheck(dump, tmp_path / "out", "-j", "1")
    assert code == 2 and "Traceback" not in err + out
    assert "Torch.tanh.0" in err and "Torch.tanh.0.forward.input.0.pt" in err and "truncated" in err
    (row,) = rows_of(tmp_path / "out", "Torch.tanh.0")
    assert row["Status"] == "skip" and "truncated" in row["Message"]
    assert {r["Status"] for r in rows_of(tmp_path / "out", "Functional.gelu.0")} <= {"pass", "info"}


def test_missing_tensor_file(dump_copy, tmp_path):
    dump, rank = dump_copy
    os.remove(os.path.join(rank, "dump_tensor_data", "Functional.gelu.0.forward.output.0.pt"))
    code, out, err = run_precheck(dump, tmp_path / "out", "-j", "2")
    assert code == 2 and "Traceback" not in err + out
    assert "missing tensor file" in err and "Functional.gelu.0.forward.output.0.pt" in err
    (row,) = rows_of(tmp_path / "out", "Functional.gelu.0")
    assert row["Status"] == "skip" and "missing tensor file" in row["Message"]


def test_api_the_catalogue_does_not_know(dump_copy, tmp_path):
    dump, rank = dump_copy
    path = os.path.join(rank, "dump.json")
    data = json.load(open(path))
    data["data"] = {name.replace("Torch.tanh.", "Torch.no_such_api."): entry for name, entry in data["data"].items()}
    json.dump(data, open(path, "w"))
    code, out, err = run_precheck(dump, tmp_path / "out", "-j", "1")
    assert code == 2 and "Traceback" not in err + out
    assert "Torch.no_such_api" in err and "catalogue does not know" in err
    summary = json.load(open(tmp_path / "out" / "precheck_summary.json"))
    assert [p["api"] for p in summary["input_problems"]] == ["Torch.no_such_api.0"]
    assert summary["counts"]["pass"] == 5
