"""The tensors of one dump entry, flattened into named rows with their role (input or output).

Row names follow msprobe's compare CSV: ``{entry}.input.0``, ``{entry}.input.{kwarg}``, ``{entry}.output.0``,
``{entry}.parameters.weight``, nested items as ``.input.0.1``, and ``{entry}.weight`` for parameter gradients.
Parameters count as inputs of a module's forward; parameter gradients are outputs of their entry.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, List, Optional, Tuple

INPUT, OUTPUT = "input", "output"
STATS = ("Max", "Min", "Mean", "Norm")
# the members of an entry that hold its inputs and outputs (any other entry is parameter name -> gradient)
ARGUMENT_KEYS = ("input_args", "input_kwargs", "output", "parameters", "input")
FP8_ZERO, FP8_SATURATED = "fp8_zero_fraction", "fp8_saturated_fraction"
_NONFINITE_TEXT = {"nan", "inf", "-inf", "+inf", "infinity", "-infinity"}  # how some writers spell them


class Tensor:
    """One tensor record, reduced to what the comparison reads."""

    __slots__ = (
        "suffix",
        "role",
        "dtype",
        "shape",
        "stats",
        "requires_grad",
        "nan",
        "inf",
        "data_name",
        "checksum",
        "fp8_zero",
        "fp8_saturated",
    )

    def __init__(self, suffix: str, role: str, record: dict):
        self.suffix = suffix
        self.role = role
        self.dtype = record.get("dtype")
        self.shape = record.get("shape")
        self.stats = tuple(record.get(key) for key in STATS)
        self.requires_grad = record.get("requires_grad")
        self.nan = record.get("NaN_count")
        self.inf = record.get("Inf_count")
        self.data_name = record.get("data_name")
        self.checksum = checksum_of(record)
        # float8 records only (docs/low-precision.md); None elsewhere
        self.fp8_zero = _fraction(record.get(FP8_ZERO))
        self.fp8_saturated = _fraction(record.get(FP8_SATURATED))

    @property
    def numel(self) -> Optional[int]:
        if not isinstance(self.shape, list):
            return None
        count = 1
        for size in self.shape:
            if not isinstance(size, int):
                return None
            count *= size
        return count

    def nonfinite(self) -> bool:
        """Whether the tensor holds NaN or Inf: from the counts when written, else from the statistics."""
        if self.nan or self.inf:
            return True
        if self.nan is not None or self.inf is not None:
            return False
        return any(
            (isinstance(v, float) and not math.isfinite(v))
            or (isinstance(v, str) and v.strip().lower() in _NONFINITE_TEXT)
            for v in self.stats
        )


def _fraction(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


CHECKSUM_KEYS = ("md5", "fingerprint")  # msprobe's summary_mode md5 (a CRC32), and ours


def checksum_of(record: dict) -> Optional[Tuple[str, str]]:
    """``(key, value)`` of a record's bit-level checksum, or None where it has none."""
    for key in CHECKSUM_KEYS:
        value = record.get(key)
        if isinstance(value, str):
            return key, value
    return None


def _is_tensor(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("type"), str)
        and "Tensor" in value["type"]
        and "dtype" in value
    )


def _walk(value: Any, suffix: str, role: str, out: List[Tensor], depth: int = 0) -> None:
    if depth > 32:
        return
    if _is_tensor(value):
        out.append(Tensor(suffix, role, value))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _walk(item, f"{suffix}.{index}", role, out, depth + 1)
    elif isinstance(value, dict) and "type" not in value:
        for key, item in value.items():
            _walk(item, f"{suffix}.{key}", role, out, depth + 1)


def tensors_of(entry: Any) -> List[Tensor]:
    """Every tensor of an entry, inputs first, in record order."""
    out: List[Tensor] = []
    if not isinstance(entry, dict):
        return out
    if any(key in entry for key in ARGUMENT_KEYS):
        _walk(entry.get("input_args"), "input", INPUT, out)
        kwargs = entry.get("input_kwargs")
        if isinstance(kwargs, dict):
            for key, item in kwargs.items():
                _walk(item, f"input.{key}", INPUT, out)
        _walk(entry.get("input"), "input", INPUT, out)
        params = entry.get("parameters")
        if isinstance(params, dict):
            for key, item in params.items():
                _walk(item, f"parameters.{key}", INPUT, out)
        _walk(entry.get("output"), "output", OUTPUT, out)
    else:  # parameters_grad: parameter name -> gradient record
        for key, item in entry.items():
            _walk(item, key, OUTPUT, out)
    return out


def pair_tensors(a: List[Tensor], b: List[Tensor]) -> Iterator[Tuple[Optional[Tensor], Optional[Tensor]]]:
    """Tensors of two matched entries paired by row name; a row on one side only pairs with None."""
    by_suffix = {t.suffix: t for t in b}
    seen = set()
    for tensor in a:
        other = by_suffix.get(tensor.suffix)
        if other is not None:
            seen.add(tensor.suffix)
        yield tensor, other
    for tensor in b:
        if tensor.suffix not in seen:
            yield None, tensor
