"""``AnomalySpike`` (ours, not msprobe's): the loss or the global gradient norm beyond ``k`` standard deviations
above the mean of a rolling window of its earlier values, evaluated on the device.

Each series (``loss``, ``grad_norm``) keeps its last ``window`` values in a device tensor, a NaN marking a slot
not yet filled or a value that was not finite (the NaN rule's business, kept out of the window). At a collected
step the value, the window's mean and standard deviation (of the values before this one) and whether the rule
fires are four float32 figures on the device that travel in the flush's one host copy (trainer_mon._flush): no
host sync. The rule fires when at least ``warmup`` finite values are in the window and the value exceeds
``mean + k * max(std, 1e-3 * |mean|)``: the floor keeps a flat series (std 0) from firing on rounding noise. Only
upward spikes fire: a loss or norm that drops is not an incident. The value then enters the window, so a lasting
change of level fires at most until the window has taken it in. tests/monitor/test_flight_recorder.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .config import Rule

SERIES = ("loss", "grad_norm")
# the record's tag for each series, msprobe's "name/rank/kind" layout: grad_norm is a backward figure there
TAGS = {"loss": "loss/rank{rank}/loss", "grad_norm": "grad_norm/rank{rank}/post_grad"}
OPS = {"loss": "id", "grad_norm": "norm"}
RELATIVE_FLOOR = 1e-3
WIDTH = 4  # value, mean, std, fired


class SpikeWindow:
    def __init__(self, rule: Rule) -> None:
        assert rule.k is not None and rule.window is not None and rule.warmup is not None  # config._spike_rule
        self.rule = rule
        self.values: torch.Tensor | None = None
        self.position = 0

    def evaluate(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` 0-d on the device -> [value, mean, std, fired] float32 on that device."""
        rule = self.rule
        value = value.detach().to(torch.float32).reshape(())
        if self.values is None or self.values.device != value.device:
            self.values = torch.full((int(rule.window or 2),), float("nan"), device=value.device)
        kept = self.values
        present = torch.isfinite(kept)
        count = present.sum()
        zero = torch.zeros((), device=value.device)
        mean = torch.where(present, kept, zero).sum() / count.clamp(min=1)
        spread = torch.where(present, (kept - mean) ** 2, zero).sum() / count.clamp(min=1)
        std = spread.sqrt()
        limit = mean + float(rule.k or 0) * torch.maximum(std, RELATIVE_FLOOR * mean.abs())
        fired = (count >= int(rule.warmup or 2)) & torch.isfinite(value) & (value > limit)
        kept[self.position % kept.numel()] = torch.where(torch.isfinite(value), value, float("nan"))
        self.position += 1
        return torch.stack([value, mean, std, fired.to(torch.float32)])


def global_norm(norms: torch.Tensor) -> torch.Tensor:
    """The gradient norm of the whole model from the per-parameter norms of one step: sqrt(sum of squares)."""
    return norms.to(torch.float32).square().sum().sqrt()
