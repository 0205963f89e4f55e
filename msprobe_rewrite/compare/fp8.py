"""Float8 evidence for the compare: did a float8 record's share of zeros (underflow) rise?

A float8 record carries ``fp8_zero_fraction`` and ``fp8_saturated_fraction`` (docs/low-precision.md). An
entry's float8 zero share is set beside a reference, the first that is known of:

* the same tensor in the other run, when it is float8 there too (two FP8 recipes);
* the other run's tensor when that one is not float8 but its statistics say how many of its elements are zero:
  none when ``Min > 0`` or ``Max < 0``, all when both are 0;
* for an output, a floating input of the same entry and shape in the same run, known the same way (a cast).

A rise of more than ``ZERO_RISE`` of the elements is underflow the other side did not have. Where no reference
is known (a signed float tensor in a bf16 run: its zeros are not counted), a float8 zero share of at least
``NOTABLE`` is still reported, as what it is: a share of zeros with nothing to set it against.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

from .records import INPUT, OUTPUT, Tensor

ZERO_RISE = 1e-3   # 0.1 % of the elements: below it a rise is a handful of elements of a small tensor
NOTABLE = 1e-2     # with no reference, a share of zeros worth naming

# one finding: (tensor row, run whose record is float8, its zero share, the reference's share or None,
# what the reference is)
Finding = Tuple[str, str, float, Optional[float], str]


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def known_zero_share(tensor: Optional[Tensor]) -> Optional[float]:
    """The share of zeros of a tensor that is not float8, where its Max and Min say it; else None."""
    if tensor is None or tensor.fp8_zero is not None:
        return None
    high, low = _number(tensor.stats[0]), _number(tensor.stats[1])
    if high is None or low is None:
        return None
    if low > 0 or high < 0:
        return 0.0
    if high == 0 and low == 0:
        return 1.0
    return None


def _floating(tensor: Tensor) -> bool:
    dtype = tensor.dtype if isinstance(tensor.dtype, str) else ""
    return "float" in dtype or "bfloat" in dtype


def findings(pairs: List[Tuple[Optional[Tensor], Optional[Tensor]]]) -> List[Finding]:
    """The float8 zero-share findings of one matched entry, from its (run A, run B) tensor pairs."""
    out: List[Finding] = []
    for a, b in pairs:  # float8 in both runs: the higher share rose against the lower
        if a is not None and b is not None and a.fp8_zero is not None and b.fp8_zero is not None \
                and abs(a.fp8_zero - b.fp8_zero) > ZERO_RISE:
            high, low, run, other_run = (a, b, "A", "B") if a.fp8_zero > b.fp8_zero else (b, a, "B", "A")
            out.append((high.suffix, run, high.fp8_zero, low.fp8_zero, f"the same float8 tensor in run {other_run}"))
    for own, other_side in (("A", 1), ("B", 0)):
        mine = [pair[1 - other_side] for pair in pairs]
        other_run = "B" if own == "A" else "A"
        for pair in pairs:
            tensor, other = pair[1 - other_side], pair[other_side]
            if tensor is None or tensor.fp8_zero is None or (other is not None and other.fp8_zero is not None):
                continue
            share = tensor.fp8_zero
            reference = known_zero_share(other)
            source = (f"run {other_run}'s {other.dtype} tensor" if other is not None
                      else f"run {other_run} (no such tensor)")
            if reference is None and tensor.role == OUTPUT:
                for candidate in mine:
                    if candidate is not None and candidate.role == INPUT and candidate.shape == tensor.shape \
                            and _floating(candidate):
                        reference = known_zero_share(candidate)
                        if reference is not None:
                            source = f"its float input {candidate.suffix} in run {own}"
                            break
            if reference is not None:
                if share - reference > ZERO_RISE:
                    out.append((tensor.suffix, own, share, reference, source))
            elif share >= NOTABLE:
                out.append((tensor.suffix, own, share, None, source))
    return out


def _percent(value: float) -> str:
    return f"{100 * value:.3g} %"


def describe(found: List[Finding]) -> Optional[str]:
    """One sentence for an entry's findings, rises first; None when there are none."""
    if not found:
        return None
    ordered = sorted(found, key=lambda f: (f[3] is None, -(f[2] - (f[3] or 0.0))))
    parts = []
    for suffix, run, share, reference, source in ordered[:3]:
        if reference is not None:
            parts.append(f"{suffix} in run {run}: float8 zeros rose to {_percent(share)} from {_percent(reference)} "
                         f"in {source} (underflow)")
        else:
            parts.append(f"{suffix} in run {run}: {_percent(share)} of its float8 elements are zero (underflow or "
                         f"zeros before the cast; {source} has no zero count)")
    more = len(ordered) - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
