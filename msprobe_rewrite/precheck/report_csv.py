"""``precheck_result.csv``: one row per API call, direction, tensor and metric, with its status."""

from __future__ import annotations

import math
from typing import Any, Dict, List

from ..csv_cells import SafeCsvWriter

COLUMNS = [
    ("API", "api"),
    ("Rank", "label"),
    ("Direction", "direction"),
    ("Tensor", "tensor"),
    ("Dtype", "dtype"),
    ("Shape", "shape"),
    ("Standard", "standard"),
    ("Metric", "metric"),
    ("Device", "device"),
    ("CPU", "cpu"),
    ("Ratio", "ratio"),
    ("Threshold", "threshold"),
    ("Status", "status"),
    ("Message", "message"),
]


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.6g}"
    return value


def write(path: str, apis: List[Dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as handle:
        out = SafeCsvWriter(handle)
        out.writerow([title for title, _ in COLUMNS])
        for api in apis:
            for row in api["rows"]:
                out.writerow([_cell(row.get(key)) for _, key in COLUMNS])
