"""The partial figures of DTensor shards (runtime/monitor/sharded.py), merged as the flush's all-reduces merge
them (SUM, MIN, MAX), give the figures of the whole tensor (metrics.py) within float32 rounding; an empty shard
(FSDP2's uneven sharding) changes nothing; a tensor empty on every rank gives NaN, as metrics.figures does.
tests/monitor/test_fsdp2_monitor.py runs the collectives on two ranks."""

import math

import pytest
import torch

from msprobe_runtime.monitor import metrics, sharded

OPS = ("min", "max", "norm", "mean", "zeros", "nans")


def _merged(shards, eps=1e-8):
    parts = torch.stack([sharded.partials(shard, eps) for shard in shards])
    reduced = torch.cat([parts[:, :5].sum(0), parts[:, 5].min().reshape(1), parts[:, 6].max().reshape(1)]).reshape(
        1, -1
    )
    return sharded._final(reduced, OPS)[0]


@pytest.mark.parametrize("rows", [(3, 2), (5, 0), (1, 1, 3)])
def test_merged_shards_give_the_whole_tensors_figures(rows):
    torch.manual_seed(0)
    whole = torch.randn(sum(rows), 7)
    whole[0, 0] = 0.0  # a zero for "zeros"
    got = _merged(list(torch.split(whole, list(rows))))
    want = metrics.figures(whole, OPS, 1e-8)
    assert got[0] == want[0] and got[1] == want[1]  # min, max: exact
    assert got[2].item() == pytest.approx(want[2].item(), rel=1e-6)
    assert abs(got[3].item() - want[3].item()) <= 1e-6 * whole.abs().max().item()
    assert got[4] == want[4] and got[5] == want[5]


def test_nans_are_counted_and_an_all_empty_tensor_is_nan():
    whole = torch.ones(4, 2)
    whole[3, 1] = float("nan")
    got = _merged([whole[:2], whole[2:]])
    assert got[5].item() == 1.0
    empty = _merged([torch.ones(0, 2), torch.ones(0, 2)])
    assert all(math.isnan(value) for value in empty.tolist())
