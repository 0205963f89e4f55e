"""The CSV report, one file per pair of dumps, with msprobe's compare columns so existing sheets keep working.

Run A is msprobe's "NPU" (target) side, run B its "Bench" (golden) side. Differences are ``A - B`` and
relative errors ``|A - B| / |B|`` written as percentages, as msprobe writes them; equal values give ``0``
and a missing value ``N/A``. Rows are written while the comparison streams. ``NPU_Stack_Info`` holds the
entry's call site (``file:line``) on its first row. Columns of our own come last, after msprobe's, so that its
readers, which pick columns by name, read ours as theirs: the decision error (see metrics.py), whether the row
diverges beyond its threshold, then each side's float8 shares of zeros and of saturated elements
(``fp8_zero_fraction``, ``fp8_saturated_fraction`` of float8 records, docs/low-precision.md; N/A for others).
"""

from __future__ import annotations

import math
from typing import List, Optional

from ..csv_cells import SafeCsvWriter

from .elementwise import COLUMNS as ELEMENTWISE
from .metrics import TensorDiff
from .records import Tensor

BASIC = [
    "NPU Name",
    "Bench Name",
    "NPU Dtype",
    "Bench Dtype",
    "NPU Tensor Shape",
    "Bench Tensor Shape",
    "NPU Requires_grad",
    "Bench Requires_grad",
]
SUMMARY_INDEX = [
    "Max diff",
    "Min diff",
    "Mean diff",
    "L2norm diff",
    "MaxRelativeErr",
    "MinRelativeErr",
    "MeanRelativeErr",
    "NormRelativeErr",
]
SUMMARY_INFO = ["NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min", "Bench mean", "Bench l2norm"]
EXTRACT = ["Requires_grad Consistent", "Result", "Err_message", "NPU_Stack_Info"]
OURS = ["Decision Error", "Diverged"]
FP8 = ["NPU fp8_zero_fraction", "Bench fp8_zero_fraction", "NPU fp8_saturated_fraction", "Bench fp8_saturated_fraction"]
NA = "N/A"


def header(tensor_task: bool) -> List[str]:
    index = list(ELEMENTWISE) if tensor_task else SUMMARY_INDEX
    return BASIC + index + SUMMARY_INFO + EXTRACT + OURS + FP8


def _value(value):
    # csv writes floats with str(): nan, inf and -inf come out as msprobe writes them
    return NA if value is None else value


def _percent(value: Optional[float]) -> str:
    if value is None:
        return NA
    if value == 0:
        return "0"
    if math.isinf(value) or math.isnan(value):
        return str(value)
    return f"{value * 100}%"


class CsvSink:
    """Receives matched and unmatched entries from the comparison and writes their rows."""

    def __init__(self, path: str, tensor_task: bool):
        self.handle = open(path, "w", newline="", encoding="utf-8")
        self.writer = SafeCsvWriter(self.handle)
        self.tensor_task = tensor_task
        self.writer.writerow(header(tensor_task))

    def _row(
        self, name_a, name_b, a: Optional[Tensor], b: Optional[Tensor], diff: Optional[TensorDiff], site: Optional[str]
    ) -> list:
        row = [
            f"{name_a}.{a.suffix}" if a is not None and name_a else NA,
            f"{name_b}.{b.suffix}" if b is not None and name_b else NA,
            a.dtype if a else NA,
            b.dtype if b else NA,
            str(a.shape) if a else NA,
            str(b.shape) if b else NA,
            str(a.requires_grad) if a else NA,
            str(b.requires_grad) if b else NA,
        ]
        if self.tensor_task:
            metrics = (diff.elementwise if diff is not None else None) or {}
            row += [_value(metrics.get(column)) for column in ELEMENTWISE]
        elif diff is not None and a is not None and b is not None:
            row += [_value(v) for v in diff.diff] + [_percent(v) for v in diff.rel]
        else:
            row += [NA] * 8
        row += [NA if v is None else v for v in (a.stats if a else (None,) * 4)]
        row += [NA if v is None else v for v in (b.stats if b else (None,) * 4)]
        both = a is not None and b is not None
        row.append(str(a.requires_grad == b.requires_grad) if both else NA)
        row.append(("diff" if diff.exceeds else "pass") if both and diff is not None else NA)
        message = (
            diff.message if diff is not None else ("No bench data matched." if b is None else "No target data matched.")
        )
        if diff is not None and diff.elementwise and diff.elementwise.get("Err_message"):
            message += str(diff.elementwise["Err_message"])
        if both and a.requires_grad != b.requires_grad:
            message += "Requires_grad inconsistent. "
        row.append(message.strip())
        row.append(site or NA)
        row.append(_value(diff.worst) if both and diff is not None else NA)
        row.append(str(bool(diff.exceeds)) if both and diff is not None else NA)
        for side in ("fp8_zero", "fp8_saturated"):
            row += [_value(getattr(t, side)) if t is not None else NA for t in (a, b)]
        return row

    def matched(self, name_a: str, name_b: str, diffs: List[TensorDiff], site: Optional[str]) -> None:
        for number, diff in enumerate(diffs):
            self.writer.writerow(self._row(name_a, name_b, diff.a, diff.b, diff, site if number == 0 else None))

    def unmatched(
        self, name_a: Optional[str], name_b: Optional[str], tensors: List[Tensor], site: Optional[str]
    ) -> None:
        for number, tensor in enumerate(tensors):
            a = tensor if name_a else None
            b = tensor if name_b else None
            self.writer.writerow(self._row(name_a, name_b, a, b, None, site if number == 0 else None))

    def close(self) -> None:
        self.handle.close()
