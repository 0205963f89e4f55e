"""Differences between two records of the same tensor, and the thresholds that call them a divergence.

Two measures per statistic (Max, Min, Mean, Norm):

* msprobe's, for the CSV: the difference ``a - b`` and the relative error ``|a - b| / |b|`` (b is the bench,
  run B);
* the decision measure ``|a - b| / max(|a|, |b|, rms)``, where ``rms = Norm / sqrt(numel)`` of the bench
  tensor. A plain relative error explodes on a Mean near zero (a zero-mean activation's Mean is noise), which
  would fire on two runs that differ only in summation order; scaled by the tensor's own magnitude it does
  not, while a 1 % change of the tensor still moves Max, Min and Norm by 1 %.

A tensor pair diverges when its decision measure exceeds the threshold of its dtype (the looser of the two
when the dtypes differ), when NaN or Inf appears on one side only, or when the shapes differ.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional

from .records import STATS, Tensor

# float32 statistics of one computation on two devices agree to about 1e-5 relative; 1e-3 leaves a wide
# margin above that noise and still sits 10x below a 1 % error. Half precisions are looser by their epsilon.
DEFAULT_THRESHOLDS: Dict[str, float] = {
    "torch.float64": 1e-6,
    "torch.float32": 1e-3,
    "torch.complex64": 1e-3,
    "torch.float16": 5e-3,
    "torch.bfloat16": 2e-2,
    "torch.float8_e4m3fn": 1.5e-1,
    "torch.float8_e5m2": 2.5e-1,
}
EXACT_PREFIXES = ("torch.int", "torch.uint", "torch.bool")  # integers and booleans must agree exactly
FALLBACK_THRESHOLD = 1e-3


class Thresholds:
    """Per-dtype thresholds: the defaults, overridden by ``dtype=value`` settings."""

    def __init__(self, overrides: Optional[Dict[str, float]] = None):
        self.table = dict(DEFAULT_THRESHOLDS)
        self.default = FALLBACK_THRESHOLD
        for key, value in (overrides or {}).items():
            if key == "default":
                self.default = value
            else:
                self.table[key if key.startswith("torch.") else f"torch.{key}"] = value

    def of(self, dtype: Optional[str]) -> float:
        if dtype in self.table:
            return self.table[dtype]
        if isinstance(dtype, str) and dtype.startswith(EXACT_PREFIXES):
            return 0.0
        return self.default

    def for_pair(self, a: Optional[str], b: Optional[str]) -> float:
        return max(self.of(a), self.of(b))


def _number(value) -> Optional[float]:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):  # msprobe writes "inf", "-inf", "nan" as strings in some versions
        try:
            return float(value)
        except ValueError:
            return None
    return None


class TensorDiff:
    """The comparison of one tensor in run A (``a``) with its counterpart in run B (``b``)."""

    __slots__ = (
        "a",
        "b",
        "diff",
        "rel",
        "err",
        "worst",
        "worst_stat",
        "exceeds",
        "nonfinite_a",
        "nonfinite_b",
        "message",
        "elementwise",
    )

    def __init__(self, a: Optional[Tensor], b: Optional[Tensor]):
        self.a, self.b = a, b
        self.diff: List[Optional[float]] = [None] * 4
        self.rel: List[Optional[float]] = [None] * 4
        self.err: List[Optional[float]] = [None] * 4
        self.worst = 0.0
        self.worst_stat: Optional[str] = None
        self.exceeds = False
        self.nonfinite_a = a.nonfinite() if a is not None else False
        self.nonfinite_b = b.nonfinite() if b is not None else False
        self.message = ""
        self.elementwise: Optional[Dict[str, object]] = None


def _scale(b: Tensor) -> float:
    norm = _number(b.stats[3])
    numel = b.numel
    if norm is None or not numel or not math.isfinite(norm):
        return 0.0
    return abs(norm) / math.sqrt(numel)


def _decision_error(x: float, y: float, floor: float) -> float:
    if x == y or (math.isnan(x) and math.isnan(y)):
        return 0.0
    if not (math.isfinite(x) and math.isfinite(y)):
        return math.inf
    denominator = max(abs(x), abs(y), floor)
    return abs(x - y) / denominator if denominator > 0 else math.inf


def compare_tensors(a: Optional[Tensor], b: Optional[Tensor], thresholds: Thresholds) -> TensorDiff:
    result = TensorDiff(a, b)
    if a is None or b is None:
        result.message = "No bench data matched." if b is None else "No target data matched."
        return result
    # msprobe's md5 (or our fingerprint) on both sides: other bits are a divergence, as msprobe's compare says
    checksum_differs = (
        a.checksum is not None
        and b.checksum is not None
        and a.checksum[0] == b.checksum[0]
        and a.checksum[1] != b.checksum[1]
    )
    if (
        a.stats == b.stats
        and a.shape == b.shape
        and a.nan == b.nan
        and a.inf == b.inf
        and not result.nonfinite_a
        and not checksum_differs
    ):
        # the common case before any divergence: equal records (NaN never equals itself, hence the guard)
        result.diff = [None if v is None else 0.0 for v in a.stats]
        result.rel = list(result.diff)
        result.err = list(result.diff)
        return result
    limit = thresholds.for_pair(a.dtype, b.dtype)
    if a.shape != b.shape:
        result.message = "Shape of NPU and bench tensor do not match. "
        result.exceeds = True
        result.worst = math.inf
    floor = _scale(b)
    for index, name in enumerate(STATS):
        x, y = _number(a.stats[index]), _number(b.stats[index])
        if x is None or y is None:
            continue
        if x == y or (math.isnan(x) and math.isnan(y)):
            result.diff[index] = result.rel[index] = result.err[index] = 0.0
            continue
        result.diff[index] = x - y if math.isfinite(x) and math.isfinite(y) else math.nan
        result.rel[index] = abs(x - y) / abs(y) if y != 0 and math.isfinite(x - y) else math.inf
        err = _decision_error(x, y, floor)
        result.err[index] = err
        if err > result.worst or result.worst_stat is None and err > 0:
            result.worst, result.worst_stat = err, name
    if result.nonfinite_a != result.nonfinite_b or (a.nan or 0) != (b.nan or 0) or (a.inf or 0) != (b.inf or 0):
        result.worst = math.inf
        result.message += (
            "NaN or Inf on one side only. "
            if result.nonfinite_a != result.nonfinite_b
            else "NaN or Inf counts differ. "
        )
    if result.worst > limit:
        result.exceeds = True
    if checksum_differs:
        result.exceeds = True
        result.message += f"{a.checksum[0]} differs. "
        if result.worst_stat is None:
            result.worst_stat = a.checksum[0]
    return result


def apply_elementwise(result: TensorDiff, metrics: Dict[str, object], thresholds: Thresholds) -> None:
    """Fold task=tensor metrics into ``result``: a large normalised max absolute error also diverges."""
    result.elementwise = metrics
    scaled = metrics.get("_scaled_max_abs")
    if isinstance(scaled, float) and result.a is not None and result.b is not None:
        if scaled > result.worst:
            result.worst, result.worst_stat = scaled, "MaxAbsErr"
        if scaled > thresholds.for_pair(result.a.dtype, result.b.dtype):
            result.exceeds = True
