"""Element-wise metrics of task=tensor dumps, as msprobe's compare reports them.

Cosine, EucDist, MaxAbsErr, MaxRelativeErr, and the One/Five Thousandth Err Ratio (the share of elements
whose relative error is below 0.001 / 0.005; a zero in the bench gets machine epsilon added on both sides,
as msprobe does). torch is imported here only, on the first tensor pair: statistics dumps never need it.
Tensors are loaded one pair at a time and dropped after.
"""

from __future__ import annotations

import math
import os
from typing import Dict, Optional

from msprobe_runtime.dump_names import is_plain_file_name

COLUMNS = ("Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio", "Five Thousandths Err Ratio")


class UnsafeTensorFile(Exception):
    """A record's tensor file that compare will not open: outside the dump's tensor directory, a link, or
    readable only by unpickling."""


def _load(directory: str, data_name: str):
    """The tensor of ``data_name``, a plain file name in ``directory``: a name with a folder in it, or a link,
    is refused (a dump is not trusted to name files elsewhere), and nothing is unpickled (``weights_only``;
    a torch without it is refused rather than trusted with the file)."""
    import torch

    if not is_plain_file_name(data_name):
        raise UnsafeTensorFile(f"data_name {data_name!r} is not a file name in the dump's tensor directory")
    try:
        fd = os.open(os.path.join(directory, data_name), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        if os.path.islink(os.path.join(directory, data_name)):
            raise UnsafeTensorFile(f"{data_name} is a link; compare does not follow it") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        try:
            value = torch.load(handle, map_location="cpu", weights_only=True)
        except TypeError:  # torch before 1.13 has no weights_only: a plain load would unpickle the file
            raise UnsafeTensorFile(
                "this torch cannot load tensors without unpickling (weights_only needs torch 1.13 or later)"
            ) from None
    if not isinstance(value, torch.Tensor):
        raise ValueError("not a tensor")
    return value


def _ulps(diff, b, dtype) -> Dict[str, float]:
    """The distribution of |a - b| in units in the last place of b (its dtype's spacing at |b|): median,
    99th percentile and max, for the propagation view's evidence (two devices differ by a few ulp)."""
    import torch

    info = torch.finfo(dtype)
    exponent = torch.floor(torch.log2(b.abs().clamp(min=info.tiny)))
    ulps = diff / (torch.exp2(exponent) * info.eps)
    ulps = ulps[torch.isfinite(ulps)]
    if ulps.numel() == 0:
        return {}
    ordered = ulps.sort().values
    return {
        "_ulp_median": float(ordered[ordered.numel() // 2]),
        "_ulp_p99": float(ordered[min(ordered.numel() - 1, int(0.99 * ordered.numel()))]),
        "_ulp_max": float(ordered[-1]),
    }


def tensor_metrics(dir_a: str, name_a: Optional[str], dir_b: str, name_b: Optional[str]) -> Dict[str, object]:
    """The metrics of one pair of saved tensors; ``Err_message`` says why a metric is missing."""
    if not name_a or not name_b:
        return {"Err_message": "no tensor data"}
    try:
        a = _load(dir_a, name_a)
        b = _load(dir_b, name_b)
    except ModuleNotFoundError:
        return {"Err_message": "torch is not installed: element-wise metrics need it"}
    except UnsafeTensorFile as error:
        return {"Err_message": f"tensor data not read: {error}"}
    except Exception as error:  # a missing or unreadable file is reported on its row, not fatal
        return {"Err_message": f"cannot load tensor data ({type(error).__name__}: {error})"}
    import torch

    if a.shape != b.shape:
        return {"Err_message": "Shape of NPU and bench tensor do not match."}
    if a.numel() == 0:
        return {"Err_message": "This is an empty tensor, can not calculate."}
    dtype = b.dtype
    a = a.detach().reshape(-1).to(torch.float64)
    b = b.detach().reshape(-1).to(torch.float64)
    out: Dict[str, object] = {}
    diff = (a - b).abs()
    if dtype.is_floating_point:
        out.update(_ulps(diff, b, dtype))
    norm_a, norm_b = float(a.norm()), float(b.norm())
    eps = float(torch.finfo(torch.float64).eps)
    if norm_a <= eps and norm_b <= eps:
        out["Cosine"] = 1.0
    elif norm_a <= eps or norm_b <= eps:
        out["Cosine"] = math.nan
    else:
        out["Cosine"] = float(torch.dot(a, b)) / (norm_a * norm_b)
    out["EucDist"] = float(diff.norm())
    out["MaxAbsErr"] = float(diff.max())
    zero = b == 0
    eps32 = float(torch.finfo(torch.float32).eps)
    rel = ((a + zero * eps32) - (b + zero * eps32)).abs() / (b + zero * eps32).abs()
    out["MaxRelativeErr"] = float(rel.max())
    if a.numel() > 1:
        out["One Thousandth Err Ratio"] = float((rel < 0.001).double().mean())
        out["Five Thousandths Err Ratio"] = float((rel < 0.005).double().mean())
    scale = max(float(a.abs().max()), float(b.abs().max()))
    out["_scaled_max_abs"] = out["MaxAbsErr"] / scale if scale > 0 else (0.0 if out["MaxAbsErr"] == 0 else math.inf)
    if math.isnan(out["_scaled_max_abs"]):
        out["_scaled_max_abs"] = 0.0 if torch.equal(a.isnan(), b.isnan()) else math.inf
    return out
