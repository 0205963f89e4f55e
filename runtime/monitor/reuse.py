"""Figures computed once per tensor state: a tensor read again unchanged gives the vector of its last read.

Two kinds of the monitor read the same tensor twice where nothing wrote it in between: ``grad_unreduced`` (the
post-accumulate-grad hook) and ``grad_reduced`` (the optimizer's pre-step hook) read the same gradient when no
data-parallel reduction, clipping or scaling touched it; ``param_updated`` (post-step hook of step N) and
``param_origin`` (pre-step hook of the next collected step) read the same weight when nothing but forward and
backward ran between them. Whether anything wrote a tensor is told by its identity (the same object, held here
so that its id cannot be reused) and its version counter, which torch's in-place ops bump (an optimizer's
foreach or for-loop update, ``clip_grad_norm_``'s ``_foreach_mul_``, an accumulation into ``.grad``, a
``copy_``; tests/monitor/test_figures_paths.py). The version counter is read only on tensors whose type is
exactly torch.Tensor or Parameter (trainer_mon.py checks it before): a subclass's attributes run its own code.

Some writes do not bump it (tests/monitor/test_figures_paths.py shows each), and so limit the reuse:
- the fused optimizers' kernels (``fused=True``): ``param_updated`` is therefore never served from an earlier
  read, only kept for the next step's ``param_origin``, with no optimizer step in between;
- collectives (``all_reduce``, ``all_gather`` into a weight): no reuse at all in a world of more than one rank;
- GradScaler's unscale (``_amp_foreach_non_finite_check_and_unscale_``, run by ``scaler.step`` just before
  the optimizer's step): no gradient reuse in a step whose optimizer step runs under torch's GradScaler
  (``scaler.step``) or megatron's optimizers (which unscale their own way), told by the code objects of the
  calling frames (``_scaled_step``: no attribute of any object is read);
- writes through ``.data``: not seen (``p.data.mul_``, ``p.grad.data.clamp_``: older optimizers and clipping
  code, weight clamping, EMA). Since no check can see them, the reuse is off unless the user turns it on with
  ``MSPROBE_MONITOR_REUSE=1`` for a loop known to make no such writes (docs/monitor.md).

Gradients are held until the end of the step (``end_step``: a gradient set to None by ``zero_grad`` is then
freed as before), weights as long as the monitor holds its parameters.
"""

from __future__ import annotations

from typing import Sequence

import sys
from types import CodeType, FrameType

import torch

from ..switches import switched_on
from . import metrics

STEP_KINDS = frozenset(("grad_unreduced", "grad_reduced"))  # forgotten at the end of each step
KEPT_KINDS = frozenset(("param_origin", "param_updated"))  # kept from one collected step to the next


def single_process() -> bool:
    """No collective can write a tensor between two reads: torch.distributed off, or a world of one rank."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return not distributed or torch.distributed.get_world_size() == 1


_scaler_codes: set[CodeType] = set()
_MEGATRON_OPTIMIZER = ("megatron", "core", "optimizer")  # megatron/core/optimizer/*.py: its optimizers' steps


def _scaled_step() -> bool:
    """Whether the optimizer step being run was called by torch's GradScaler (``scaler.step``, which unscales
    the gradients in place without a version bump just before) or by a megatron optimizer: the calling frames'
    code objects and file names only."""
    if not _scaler_codes:
        _scaler_codes.add(_scaled_step.__code__)  # a placeholder: the set is filled once, found or not
        try:  # torch's own class: a torch without it (or without these methods) has no scaler to tell
            from torch.amp.grad_scaler import GradScaler

            for name in ("step", "_maybe_opt_step"):
                code = getattr(getattr(GradScaler, name, None), "__code__", None)
                if code is not None:
                    _scaler_codes.add(code)
        except ImportError:
            pass
    frame: FrameType | None = sys._getframe(1)
    depth = 0
    while frame is not None and depth < 64:
        code = frame.f_code
        if code in _scaler_codes:
            return True
        parts = code.co_filename.replace("\\", "/").split("/")
        if len(parts) > 3 and tuple(parts[-4:-1]) == _MEGATRON_OPTIMIZER:
            return True
        frame = frame.f_back
        depth += 1
    return False


def version_of(tensor: torch.Tensor) -> int | None:
    """``tensor``'s version counter, or None where it has none (an inference tensor)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


class Figures:
    """``of(kind, tensor)``: ``metrics.figures`` of ``tensor``, or the vector of an earlier read of the same
    tensor at the same version, for the kinds above; ``computed`` counts the vectors made (tests)."""

    def __init__(self, ops: Sequence[str], eps: float) -> None:
        self.ops = ops
        self.eps = eps
        self.computed = 0
        # opt-in (docs/monitor.md): a write the counter misses would leave a stale figure, in a tool that
        # exists to see such writes' results
        self.enabled = switched_on("MSPROBE_MONITOR_REUSE", default="0") and single_process()
        self._scaled: bool | None = None  # this step's optimizer step under a grad scaler: asked once a step
        # id(tensor) -> (tensor, version, figures)
        self._step: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}
        self._kept: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}

    def of(self, kind: str, tensor: torch.Tensor) -> torch.Tensor:
        table = self._step if kind in STEP_KINDS else self._kept if kind in KEPT_KINDS else None
        if not self.enabled:
            table = None
        version = version_of(tensor) if table is not None else None
        # param_updated follows the optimizer's update, which a fused optimizer makes without a version bump
        if kind == "grad_reduced" and table is not None:
            if self._scaled is None:
                self._scaled = _scaled_step()
            if self._scaled:
                table = None  # unscaled in place just before: read again, and not kept
        if table is not None and version is not None and kind != "param_updated":
            entry = table.get(id(tensor))
            if entry is not None and entry[0] is tensor and entry[1] == version:
                return entry[2]
        values = metrics.figures(tensor, self.ops, self.eps)
        self.computed += 1
        if table is not None and version is not None:
            table[id(tensor)] = (tensor, version, values)
        return values

    def end_step(self) -> None:
        """Forget the gradients (the step is over: the next reads a new gradient or a changed one); a process
        group made since is seen here."""
        self._step.clear()
        self._scaled = None
        if self.enabled and not single_process():
            self.enabled = False
            self._kept.clear()

    def clear(self) -> None:
        self._step.clear()
        self._kept.clear()
