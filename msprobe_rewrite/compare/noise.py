"""The noise floor of a pair of runs, per output dtype and statistic, estimated from the pair's own errors:
a low quantile of the non-zero output errors (what one op adds on its own) times a headroom, capped at a few
dozen ulp of the dtype (a culprit early in the run leaves no noise-only part to measure). Mean and Norm are
sums whose own rounding grows like sqrt(n): they are pooled, and their floor given, per sqrt(n).
"""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

QUANTILE = 0.25
HEADROOM = 8.0
CAP_ULPS = 64.0
SUMS = ("Mean", "Norm")
EPS = {
    "torch.float64": 2.2e-16,
    "torch.float32": 1.19e-7,
    "torch.complex64": 1.19e-7,
    "torch.float16": 9.77e-4,
    "torch.bfloat16": 7.81e-3,
    "torch.float8_e4m3fn": 0.125,
    "torch.float8_e5m2": 0.25,
}


def eps(dtype: str) -> float:
    return EPS.get(dtype, EPS["torch.float32"])


def floors(samples: Dict[Tuple[str, str], List[float]]) -> Dict[str, Dict[str, float]]:
    """``{dtype: {metric: floor}}`` from ``{(dtype, metric): [non-zero errors]}``; for Mean and Norm the
    samples and the floor are per sqrt(numel) (see ``floor_of``)."""
    out: Dict[str, Dict[str, float]] = {}
    for (dtype, metric), values in samples.items():
        values = sorted(v for v in values if v == v and v != math.inf)
        if not values:
            continue
        low = values[min(len(values) - 1, int(QUANTILE * len(values)))]
        out.setdefault(dtype, {})[metric] = min(HEADROOM * low, CAP_ULPS * eps(dtype))
    return out


def floor_of(limits: Dict[str, float], metric: str, numel: int) -> float:
    """The floor of one tensor's ``metric`` from its dtype's ``limits`` (``floors()[dtype]``)."""
    value = limits.get(metric, 0.0)
    if metric in SUMS:
        root = math.sqrt(max(numel, 1))
        return max(value * root, limits.get("Max", 0.0) / root)
    return value
