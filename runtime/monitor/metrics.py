"""The figures of one tensor, on its device, as one float32 vector: no host sync.

msprobe (pytorch/monitor/features.py) computes each op as its own 0-d tensor and reads each with ``.item()`` when
it writes; here the ops of one tensor are stacked into one vector that stays on the device until the flush copies
every vector of the step at once (trainer_mon.py). Norm and mean accumulate in float32 or finer (msprobe casts the
whole tensor to float64 first, a copy twice the tensor's size): the figures agree within float32 rounding
(tests/monitor/test_trainer_mon.py compares them with float64 figures).

Three paths, the first that serves a tensor is taken (``figures``):
- the native op's ``monitor_figures`` (runtime/native/stats_op.cpp, built and cached by ``native_stats``, whose
  failed build is remembered there): a CPU float32, float16 or bfloat16 tensor read once for every op;
- the Triton kernels' ``monitor_figures`` (runtime/triton_stats.py) for such a CUDA tensor: one read, two
  launches, nothing read back (``MSPROBE_TRITON=0`` or no Triton: the torch ops);
- the torch ops (``torch_figures``): one op per msprobe op, for every other tensor (float64, an NPU tensor, a
  turned-off or unbuilt native op).
They agree with each other within float32 rounding of Mean and Norm and exactly elsewhere
(tests/monitor/test_figures_paths.py). A run keeps the path its first tensor of a kind took, as long as the
switches stay as they are: the native op is loaded (or found unbuildable) once, at the first figures.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .. import native_stats
from ..switches import switched_on

_NAN = float("nan")

# msprobe's op names -> the native op's and the Triton kernel's codes (stats_op.cpp's MonitorCode)
CODES = {"min": 0, "max": 1, "norm": 2, "mean": 3, "zeros": 4, "nans": 5, "id": 6}

_codes: dict[tuple[str, ...], list[int] | None] = {}
# the loaded native module (False: not there), the Triton module (False: not there); None until first asked
_native: list[Any] = [None]
_triton: list[Any] = [None]


def _codes_of(ops: Sequence[str]) -> list[int] | None:
    key = tuple(ops)
    codes = _codes.get(key, False)
    if codes is False:
        codes = _codes[key] = [CODES[op] for op in ops] if all(op in CODES for op in ops) else None
    return codes  # type: ignore[return-value]


def _native_module() -> Any:
    module = _native[0]
    if module is None:
        module = _native[0] = native_stats.load() or False
    return module


def _triton_module() -> Any:
    module = _triton[0]
    if module is None:
        module = False
        if switched_on("MSPROBE_TRITON"):
            try:
                from .. import triton_stats

                module = triton_stats
            except Exception:  # no Triton here (an NPU, a CPU-only install): the torch ops serve
                module = False
        _triton[0] = module
    return module


def reset() -> None:
    """Forget the paths found (tests: a switch changed)."""
    _native[0] = None
    _triton[0] = None


def native_figures(tensor: torch.Tensor, ops: Sequence[str], eps: float) -> torch.Tensor | None:
    """``figures`` by the native op, or None where it does not serve (not built, switched off, not a non-empty
    CPU float32/float16/bfloat16 tensor)."""
    module = _native_module()
    codes = _codes_of(ops)
    if module is False or codes is None:
        return None
    return module.monitor_figures(tensor, codes, eps)


def triton_figures(tensor: torch.Tensor, ops: Sequence[str], eps: float) -> torch.Tensor | None:
    """``figures`` by the Triton kernels, or None where they do not serve. Called by ``figures`` for CUDA
    tensors only; tests call it with CPU tensors under ``TRITON_INTERPRET=1``."""
    module = _triton_module()
    codes = _codes_of(ops)
    if module is False or codes is None:
        return None
    from ..statistics import dense_view

    if type(tensor) is torch.nn.Parameter:  # the kernels take exact torch.Tensors: a weight as its plain view
        tensor = tensor.detach()
    return module.monitor_figures(tensor, codes, eps, dense_view)


def figures(tensor: torch.Tensor, ops: Sequence[str], eps: float) -> torch.Tensor:
    """A float32 vector with one figure per op in ``ops`` (msprobe's names: min, max, norm, mean, zeros, nans,
    id), on the tensor's device, by the fastest path that serves ``tensor`` (see above). An empty or
    non-floating tensor gives NaN everywhere, as msprobe's ``Metric.get_metric`` does when an op fails.
    ``tensor`` is a plain torch.Tensor or Parameter (trainer_mon.py checks its type first)."""
    out = native_figures(tensor, ops, eps)
    if out is not None:
        return out
    if tensor.is_cuda:
        out = triton_figures(tensor, ops, eps)
        if out is not None:
            return out
    return torch_figures(tensor, ops, eps)


def torch_figures(tensor: torch.Tensor, ops: Sequence[str], eps: float) -> torch.Tensor:
    """``figures`` by torch ops, one per msprobe op: every tensor, the fallback of the one-pass paths."""
    x = tensor.detach()
    if x.numel() == 0 or not x.is_floating_point():
        return torch.full((len(ops),), _NAN, dtype=torch.float32, device=x.device)
    parts: list[torch.Tensor] = []
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    low: torch.Tensor | None = None  # set together, at the first min or max
    high: torch.Tensor | None = None
    for op in ops:
        if op in ("min", "max"):
            if low is None or high is None:
                low, high = torch.aminmax(x)
            parts.append(low if op == "min" else high)
        elif op == "norm":  # float64 is not narrowed by torch's dtype= (an error): summed in float64
            parts.append(torch.linalg.vector_norm(x, 2, dtype=wide))
        elif op == "mean":
            parts.append(torch.mean(x, dtype=wide))
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
