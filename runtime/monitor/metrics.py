"""The figures of one tensor, on its device, as one float32 vector: no host sync.

msprobe (pytorch/monitor/features.py) computes each op as its own 0-d tensor and reads each with ``.item()`` when
it writes; here the ops of one tensor are stacked into one vector that stays on the device until the flush copies
every vector of the step at once (trainer_mon.py). Norm and mean accumulate in float32 (msprobe casts the whole
tensor to float64 first, a copy twice the tensor's size): the figures agree within float32 rounding
(tests/monitor/test_trainer_mon.py compares them with float64 figures).
"""

from __future__ import annotations

from typing import Sequence

import torch

_NAN = float("nan")


def figures(tensor: torch.Tensor, ops: Sequence[str], eps: float) -> torch.Tensor:
    """A float32 vector with one figure per op in ``ops`` (msprobe's names: min, max, norm, mean, zeros, nans,
    id), on the tensor's device. An empty or non-floating tensor gives NaN everywhere, as msprobe's
    ``Metric.get_metric`` does when an op fails."""
    x = tensor.detach()
    if x.numel() == 0 or not x.is_floating_point():
        return torch.full((len(ops),), _NAN, dtype=torch.float32, device=x.device)
    parts: list[torch.Tensor] = []
    low: torch.Tensor | None = None  # set together, at the first min or max
    high: torch.Tensor | None = None
    for op in ops:
        if op in ("min", "max"):
            if low is None or high is None:
                low, high = torch.aminmax(x)
            parts.append(low if op == "min" else high)
        elif op == "norm":
            parts.append(torch.linalg.vector_norm(x, 2, dtype=torch.float32))
        elif op == "mean":
            parts.append(torch.mean(x, dtype=torch.float32))
        elif op == "zeros":
            parts.append(torch.count_nonzero(x.abs() < eps) / x.numel())
        elif op == "nans":
            parts.append(torch.count_nonzero(torch.isnan(x)))
        elif op == "id":  # msprobe: the value of a 0-d tensor, None (written nan) otherwise
            parts.append(x.reshape(()) if x.dim() == 0 else torch.full((), _NAN, device=x.device))
        else:
            raise ValueError(f"unknown op {op!r}")
    return torch.stack([part.to(torch.float32) for part in parts])


def sign_matches(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """msprobe's get_sign_matches (features.py): (mean of sign(x) * sign(y) + 1) / 2, 1.0 for an empty y."""
    if y.numel() == 0:
        return torch.ones((), device=x.device)
    return ((x.sign() * y.sign()).sum() / y.numel() + 1) / 2
