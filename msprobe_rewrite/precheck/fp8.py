"""The float8 range check: rows for the float8 records of one call, from their ``fp8_saturated_fraction`` and
``fp8_zero_fraction`` (docs/low-precision.md), read from the dump records alone (no tensor, no torch, no
replay), so a call that cannot be replayed is still checked.

* saturated share above ``--fp8-saturated`` (default ``SATURATED``): **error**. Per-tensor dynamic scaling maps
  the tensor's largest magnitude to the format's max, so one element there (1/numel) is by design; a share of
  1 % is a scale that lagged behind the data (delayed scaling) or values clipped in the cast.
* zero share above ``--fp8-zero`` (default ``ZERO``): **warning**. The share counts what underflowed to zero in
  the cast together with the zeros the tensor held before it (a ReLU's output is half zeros), so it is a hint,
  not a proof; ``compare`` sets it against a reference run.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import standards
from .records import is_tensor_record

STANDARD = "float8 range"
SATURATED = 0.01
ZERO = 0.5
FIELDS = (("fp8_saturated_fraction", standards.ERROR), ("fp8_zero_fraction", standards.WARNING))


def _records(value: Any, path: str, depth: int = 0) -> Iterator[Tuple[str, dict]]:
    if depth > 32:
        return
    if is_tensor_record(value):
        yield path, value
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _records(item, f"{path}.{index}", depth + 1)
    elif isinstance(value, dict) and "type" not in value:
        for key, item in value.items():
            yield from _records(item, f"{path}.{key}", depth + 1)


def _tensors(item: Dict[str, Any]) -> Iterator[Tuple[str, str, dict]]:
    """(direction, tensor label as the other rows name it, record) of every tensor of the call."""
    forward = item.get("forward") or {}
    yield from (("forward", label, r) for label, r in _records(forward.get("input_args"), "input"))
    kwargs = forward.get("input_kwargs")
    if isinstance(kwargs, dict):
        for key, value in kwargs.items():
            yield from (("forward", label, r) for label, r in _records(value, f"input.{key}"))
    yield from (("forward", label, r) for label, r in _records(forward.get("output"), "output"))
    backward = item.get("backward")
    if isinstance(backward, dict):
        yield from (("backward", label, r) for label, r in _records(backward.get("input"), "grad_output"))
        yield from (("backward", label, r) for label, r in _records(backward.get("output"), "grad_input"))


def _share(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def rows(base: Dict[str, Any], item: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Two rows (saturated, zero) per float8 record of the call; none for a call without float8 records."""
    limits = item.get("fp8_limits") or {}
    out = []
    for direction, label, record in _tensors(item):
        for field, severity in FIELDS:
            share = _share(record.get(field))
            if share is None:
                continue
            limit = limits.get(field, SATURATED if field == "fp8_saturated_fraction" else ZERO)
            over = share > limit
            message = ""
            if over:
                message = (
                    "saturated at the float8 format's max: the scale lags the data, or the cast clips"
                    if field == "fp8_saturated_fraction"
                    else "zero in float8: underflow in the cast, or zeros before it"
                )
            dtype = str(record.get("dtype", "")).replace("torch.", "")
            out.append(
                dict(
                    base,
                    direction=direction,
                    tensor=label,
                    dtype=dtype,
                    shape=str(record.get("shape")),
                    standard=STANDARD,
                    metric=field,
                    device=share,
                    cpu=None,
                    ratio=None,
                    threshold=f"<= {limit:g}",
                    status=severity if over else standards.PASS,
                    message=message,
                )
            )
    return out
