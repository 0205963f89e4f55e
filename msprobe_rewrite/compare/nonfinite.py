"""Where NaN or Inf first appears in one dump: per-entry flags and the first entry, in execution order,
that holds one. Shared by ``compare`` (the NaN/Inf onset of each side) and ``msprobe-rewrite nan`` (the
origin across steps and ranks, ``nan_origin``).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from .names import split_name
from .records import INPUT, tensors_of

# flag bits per entry (compare's engine keeps its IN_DIFF and OUT_DIFF bits in the same byte)
NONFINITE_IN, NONFINITE_OUT = 4, 8


def nonfinite_flags(entry: Any) -> int:
    """NONFINITE_IN and/or NONFINITE_OUT: whether the entry's inputs, outputs hold NaN or Inf."""
    flags = 0
    for tensor in tensors_of(entry):
        if tensor.nonfinite():
            flags |= NONFINITE_IN if tensor.role == INPUT else NONFINITE_OUT
    return flags


def can_make(name: str) -> bool:
    """Whether a clean-input entry of this name computed its own outputs: a ``parameters_grad`` entry has no
    inputs at all (its gradients come from the module's backward), so it cannot be where NaN was made."""
    return split_name(name)[1] != "parameters_grad"


def first_nonfinite(
    names: Sequence[str], flags: Sequence[int], ends: Sequence[int]
) -> Tuple[Optional[int], Optional[int]]:
    """(the first entry that holds NaN/Inf anywhere, the first that makes it out of finite inputs), indices
    into ``names`` or None, in completion order (``ends``: an API inside a module before the module)."""
    ordered = sorted((t for t in range(len(names)) if flags[t]), key=lambda t: (ends[t], -t))
    made = next(
        (t for t in ordered if flags[t] & NONFINITE_OUT and not flags[t] & NONFINITE_IN and can_make(names[t])), None
    )
    return (ordered[0] if ordered else None), made
