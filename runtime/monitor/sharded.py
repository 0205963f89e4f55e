"""Figures of FSDP2 / DTensor parameters: the local shard's, and with ``dp_group`` the reduced global figure.

A DTensor is torch's own tensor subclass (``torch.distributed.tensor.DTensor``), not the user's: for a value whose
type is *exactly* that class, the monitor reads the rank's shard through DTensor's documented ``to_local()`` (and
its ``placements`` and ``device_mesh.ndim``), which run torch's code only. The rule "no dispatch into a tensor
subclass" (runtime/foreign.py) is about code we were not asked to run; DTensor's code is torch's, as much as
``aminmax`` is. A subclass *of* DTensor, or any other subclass, is still left alone (trainer_mon.py).

Without ``dp_group`` the figures are the local shard's (shape: the local shape). With ``dp_group`` a tensor
sharded (``Shard`` on a one-dimensional mesh) is reduced over that group: each rank keeps, on the device, the
partial figures of its shard (sum of squares, sum, element count, count below eps, NaN count, min, max); at the
flush the partials of all such tensors of the step are stacked and reduced with one all-reduce per kind (SUM,
MIN, MAX), then norm = sqrt(sum of squares), mean = sum / count, zeros = count below eps / count. No host read:
the collectives run on device tensors, and the flush's one ``tolist`` reads the results. Replicated tensors keep
their local figures (the local tensor is the whole); other placements and meshes of more dimensions keep the
local figures, with one warning (not yet). tests/monitor/test_fsdp2_monitor.py compares the global figures with
those of the same unsharded model.

Every rank of ``dp_group`` must collect the same steps (the all-reduces pair up across ranks): ``module_ranks``
that leave a rank of the group out, or a step one rank drops after an error of ours, would leave the others
waiting in the all-reduce. docs/monitor.md says so.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import torch

PARTS = 7  # sum of squares, sum, count, zeros, nans, min, max
_SUMS = 5
_NAN = float("nan")


def dtensor_type() -> Any:
    """torch's DTensor class where it is loaded (no DTensor exists before), else None."""
    module = sys.modules.get("torch.distributed.tensor")
    return None if module is None else module.__dict__.get("DTensor")


def is_dtensor(value: Any) -> bool:
    kind = dtensor_type()
    return kind is not None and type(value) is kind


def layout(tensor: Any) -> str:
    """ "shard" (Shard on a 1-D mesh: reducible), "replicate" (every placement Replicate) or "other"."""
    from torch.distributed.tensor import Replicate, Shard

    placements = tuple(tensor.placements)
    kinds = {type(placement) for placement in placements}
    if kinds <= {Replicate}:
        return "replicate"
    if tensor.device_mesh.ndim == 1 and kinds <= {Shard}:
        return "shard"
    return "other"


def partials(local: torch.Tensor, eps: float) -> torch.Tensor:
    """The partial figures of one shard, float64 on its device (an empty shard: zeros, +inf, -inf)."""
    x = local.detach()
    device = x.device
    if x.numel() == 0 or not x.is_floating_point():
        # a non-floating tensor gives NaN as metrics.figures does: its count is 0 on every rank, NaN at the end
        return torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, float("inf"), float("-inf")], dtype=torch.float64, device=device)
    low, high = torch.aminmax(x)
    norm = torch.linalg.vector_norm(x, 2, dtype=torch.float32).to(torch.float64)
    parts = [
        norm * norm,
        torch.sum(x, dtype=torch.float32).to(torch.float64),
        torch.full((), float(x.numel()), dtype=torch.float64, device=device),
        torch.count_nonzero(x.abs() < eps).to(torch.float64),
        torch.count_nonzero(torch.isnan(x)).to(torch.float64),
        low.to(torch.float64),
        high.to(torch.float64),
    ]
    return torch.stack(parts)


def _final(reduced: torch.Tensor, ops: Sequence[str]) -> torch.Tensor:
    """(rows, PARTS) reduced partials -> (rows, len(ops)) float32 figures."""
    count = reduced[:, 2]
    empty = count == 0
    columns = []
    for op in ops:
        if op == "min":
            column = reduced[:, 5]
        elif op == "max":
            column = reduced[:, 6]
        elif op == "norm":
            column = torch.sqrt(reduced[:, 0])
        elif op == "mean":
            column = reduced[:, 1] / count
        elif op == "zeros":
            column = reduced[:, 3] / count
        elif op == "nans":
            column = reduced[:, 4]
        else:  # "id": the value of a 0-d tensor; a sharded tensor is never 0-d
            column = torch.full_like(count, _NAN)
        columns.append(torch.where(empty, torch.full_like(column, _NAN), column))
    return torch.stack(columns, dim=1).to(torch.float32)


def finalize(rows: dict[Any, Any], keys: Sequence[Any], ops: Sequence[str], group: Any) -> None:
    """Replace the partials of ``rows[key]`` (for ``key`` in ``keys``) by the global figures, in place: one
    all-reduce per kind over ``group`` for all of them."""
    if not keys:
        return
    import torch.distributed as dist

    stacked = torch.stack([rows[key][0] for key in keys])
    sums = stacked[:, :_SUMS].contiguous()
    lows = stacked[:, 5].contiguous()
    highs = stacked[:, 6].contiguous()
    dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)
    dist.all_reduce(lows, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(highs, op=dist.ReduceOp.MAX, group=group)
    reduced = torch.cat([sums, lows[:, None], highs[:, None]], dim=1)
    figures = _final(reduced, ops)
    for index, key in enumerate(keys):
        _, shape, dtype = rows[key]
        rows[key] = (figures[index], shape, dtype)
