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

from typing import Any, Dict, List, Optional, Tuple

from .records import INPUT, OUTPUT, Tensor

# a module that a float8 recipe puts in the place of another, by class name: torchao's convert_to_float8_training
# swaps each nn.Linear for a Float8Linear (same path, same parameters); the alignment pairs them
# (tests/compare/test_fp8.py, tests/realworld/test_float8_training.py)
TWINS = {"Float8Linear": "Linear"}

ZERO_RISE = 1e-3  # 0.1 % of the elements: below it a rise is a handful of elements of a small tensor
NOTABLE = 1e-2  # with no reference, a share of zeros worth naming

# one finding: (tensor row, run whose record is float8, its zero share, the reference's share or None,
# what the reference is)
Finding = Tuple[str, str, float, Optional[float], str]


def twin_base(base: str) -> str:
    """A module entry's base (``Module.path.Class``) with a float8 twin's class named as the class it replaced."""
    if not base.startswith("Module."):
        return base
    path, _, cls = base.rpartition(".")
    twin = TWINS.get(cls)
    return f"{path}.{twin}" if twin is not None else base


def twin_name(name: str) -> str:
    """A module entry's full name with a float8 twin's class named as the class it replaced."""
    for cls, twin in TWINS.items():
        if f".{cls}." in name and name.startswith("Module."):
            return name.replace(f".{cls}.", f".{twin}.")
    return name


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
        if (
            a is not None
            and b is not None
            and a.fp8_zero is not None
            and b.fp8_zero is not None
            and abs(a.fp8_zero - b.fp8_zero) > ZERO_RISE
        ):
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
            source = (
                f"run {other_run}'s {other.dtype} tensor"
                if other is not None
                else f"run {other_run}, which has no such tensor,"
            )
            if reference is None and tensor.role == OUTPUT:
                for candidate in mine:
                    if (
                        candidate is not None
                        and candidate.role == INPUT
                        and candidate.shape == tensor.shape
                        and _floating(candidate)
                    ):
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
    text = f"{100 * value:.3g}"
    if text == "100" and value < 1:  # 8191 of 8192 is not all of them
        text = f"{100 * value:.4g}"
    return f"{text} %"


def describe(found: List[Finding]) -> Optional[str]:
    """One sentence for an entry's findings, rises first; None when there are none."""
    if not found:
        return None
    ordered = sorted(found, key=lambda f: (f[3] is None, -(f[2] - (f[3] or 0.0))))
    parts = []
    for suffix, run, share, reference, source in ordered[:3]:
        if reference is not None:
            parts.append(
                f"{suffix} in run {run}: float8 zeros rose to {_percent(share)} from {_percent(reference)} "
                f"in {source} (underflow)"
            )
        else:
            parts.append(
                f"{suffix} in run {run}: {_percent(share)} of its float8 elements are zero (underflow, or "
                f"zeros before the cast: {source} gives no zero count to set against it)"
            )
    more = len(ordered) - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _nested(side, found: Dict[int, List[Finding]]) -> Dict[int, List[int]]:
    """Enclosing module's index -> the indices of the entries with findings inside it (construct.json)."""
    out: Dict[int, List[int]] = {}
    parents = side.parents
    for index in found:
        parent = parents[index] if index < len(parents) else -1
        depth = 0
        while parent >= 0 and depth < 256:
            out.setdefault(parent, []).append(index)
            parent = parents[parent]
            depth += 1
    return out


def note(result, position: int) -> Optional[str]:
    """The float8 sentence for the matched entry at ``position`` of a compared pair (engine.PairResult): its own
    findings, then those of the entries recorded inside it (a module whose float8 matmul the other run does not
    have: torchao's ``Torch.mm`` inside a ``Float8Linear``, where run B has a bfloat16 ``Functional.linear``)."""
    if not (result.fp8 or result.fp8_a or result.fp8_b):
        return None
    i, j = result.merged[position]
    parts = []
    own = describe(result.fp8.get(position, []))
    if own:
        parts.append(own)
    nested = getattr(result, "_fp8_nested", None)
    if nested is None:
        nested = result._fp8_nested = (_nested(result.a, result.fp8_a), _nested(result.b, result.fp8_b))
    inside, seen = [], set()
    for side, found, index, names in ((0, result.fp8_a, i, result.a.names), (1, result.fp8_b, j, result.b.names)):
        for k in sorted(nested[side].get(index, [])) if index is not None else []:
            # one float8 tensor passes through several entries (the cast, a reshape, the matmul): named once,
            # at the first in execution order
            key = (side, tuple((f[1], f[2], f[3]) for f in found[k]))
            if key in seen:
                continue
            seen.add(key)
            inside.append((max(f[2] - (f[3] or 0.0) for f in found[k]), names[k], found[k]))
    for _, name, found_k in sorted(inside, key=lambda item: -item[0])[:2]:
        parts.append(f"inside it, {name}: {describe(found_k)}")
    if len(inside) > 2:
        parts.append(f"and {len(inside) - 2} more float8 tensors inside it")
    return "; ".join(parts) or None
