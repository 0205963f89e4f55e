"""The error of one result tensor against its golden: every number the criteria (``standards``) grade.

All in float64 on the CPU, in as few passes as the metrics allow. For a floating tensor:

- ``max_rel_err``, ``mean_rel_err``: |a - g| / |g| over the normal region (|g| above the dtype's small value);
- ``small_value_err_ratio``: share of the small region (|g| <= small value) whose |a - g| exceeds its atol;
- ``rmse``: root mean square of a - g over the finite positions;
- ``eb``: error balance, |#(a > g) - #(a < g)| / n (msprobe's systematic-bias measure: rounding that leans
  one way); ``rel_bias``: |mean((a - g) / g)| over the normal region (a bias proportional to the value, which
  ``eb`` cannot see when the values change sign);
- ``mean_ulp_err``, ``max_ulp_err``, ``ulp_err_proportion``: error in units in the last place of the dtype at
  the golden's magnitude, and the share above the dtype's ULP bound;
- ``rel_err_ratio``, ``abs_err_ratio``: shares above the absolute-threshold standard's rtol and atol;
- ``mismatch_ratio``: share that differs from the golden rounded to the dtype (exact ops, integers, bools);
- ``nonfinite_mismatch``: share where NaN/Inf disagree with the golden rounded to the dtype.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import torch

from . import standards


def _share(mask: torch.Tensor, within: Optional[torch.Tensor] = None) -> float:
    if within is not None:
        total = int(within.sum())
        return float((mask & within).sum()) / total if total else 0.0
    return float(mask.sum()) / mask.numel() if mask.numel() else 0.0


def measure(
    actual: torch.Tensor, golden: torch.Tensor, dtype: torch.dtype, standard: Optional[str] = None
) -> Dict[str, float]:
    """Metrics of ``actual`` (the dtype under test) against ``golden`` (float64, or exact for integers); only
    those ``standard`` grades (all when None). Each costs passes over the data, so a finite result (the usual
    case, known from one reduction) takes the path without masks."""
    if actual.shape != golden.shape:
        raise ValueError(f"shape {list(actual.shape)} differs from the golden's {list(golden.shape)}")
    if not (dtype.is_floating_point or dtype.is_complex):
        return {"mismatch_ratio": _share(actual.ne(golden.to(actual.dtype)))}
    if dtype.is_complex:
        actual, golden = (
            torch.view_as_real(actual.to(torch.complex128)),
            torch.view_as_real(golden.to(torch.complex128)),
        )
        dtype = torch.float64 if dtype == torch.complex128 else torch.float32
    want = (lambda name: True) if standard is None else (lambda name: name in _NEEDS.get(standard, ()))
    g = golden.detach().to(torch.float64).reshape(-1)
    if g.numel() == 0:
        return {}
    fast = _measure_normal(actual.detach().reshape(-1), g, dtype, want)
    if fast is not None:
        return fast
    a = actual.detach().to(torch.float64).reshape(-1)
    n = a.numel()
    err = a - g
    abs_err = err.abs()
    abs_g = g.abs()
    finite = math.isfinite(float(abs_err.max())) and float(abs_g.max()) <= torch.finfo(dtype).max
    if finite:
        both, n_both, nonfinite_mismatch = None, n, 0.0
    else:
        rounded = g.to(dtype).to(torch.float64)  # what the dtype holds of the golden (inf where it overflows)
        same_nonfinite = (a == rounded) | (torch.isnan(a) & torch.isnan(rounded))
        nonfinite_mismatch = _share(~(torch.isfinite(a) & torch.isfinite(rounded)) & ~same_nonfinite)
        both = torch.isfinite(a) & torch.isfinite(g)
        n_both = int(both.sum())
        err = torch.where(both, err, 0.0)
        abs_err = err.abs()
    small_value, small_atol, rtol = standards.small_value(dtype), standards.small_atol(dtype), standards.rtol(dtype)
    small = abs_g <= small_value
    if both is not None:
        small &= both
    n_small = int(small.sum())
    if n_small == 0 and both is None:  # every position is in the normal region
        normal, n_normal = None, n
        quotient = err / g
    else:
        normal = ~small if both is None else (both & ~small)
        n_normal = int(normal.sum())
        quotient = torch.where(normal, err / torch.where(normal, g, 1.0), 0.0)
    rel = quotient.abs()
    out = {
        "max_rel_err": float(rel.max()) if n_normal else 0.0,
        "mean_rel_err": float(rel.sum()) / n_normal if n_normal else 0.0,
        "rel_bias": abs(float(quotient.sum())) / n_normal if n_normal else 0.0,
        "rmse": math.sqrt(float(torch.dot(err, err)) / n_both) if n_both else 0.0,
        "nonfinite_mismatch": nonfinite_mismatch,
        "count": float(n_both),
    }
    small_errors = float(((abs_err > small_atol) & small).sum()) / n_small if n_small else 0.0
    if want("small_value_err_ratio"):
        out["small_value_err_ratio"] = small_errors
        gg = g if both is None else torch.where(both, g, 0.0)
        out["golden_rms"] = math.sqrt(float(torch.dot(gg, gg)) / n_both) if n_both else 0.0
    if want("eb"):
        out["eb"] = abs(float(torch.sign(err).sum())) / n_both if n_both else 0.0
    if want("rel_err_ratio"):
        out["rel_err_ratio"] = float((rel > rtol).sum()) / n_normal if n_normal else 0.0
        out["abs_err_ratio"] = small_errors
    if want("mismatch_ratio"):
        rounded = g.to(dtype).to(torch.float64)
        mismatch = a.ne(rounded)
        out["mismatch_ratio"] = _share(mismatch if both is None else mismatch & both)
    ulp = standards.ulp_parameters(dtype)
    if ulp is not None and want("ulp_err_proportion"):
        min_exponent, mantissa, bound = ulp
        # |g| = m * 2**e with m in [0.5, 1): floor(log2 |g|) = e - 1, one pass instead of log2 and floor
        exponent = (torch.frexp(g).exponent - 1).clamp_(min=min_exponent)
        ulp_err = torch.ldexp(abs_err, mantissa - exponent)
        out["mean_ulp_err"] = float(ulp_err.sum()) / n_both if n_both else 0.0
        out["max_ulp_err"] = float(ulp_err.max())
        out["ulp_err_proportion"] = float((ulp_err > bound).sum()) / n_both if n_both else 0.0
    return out


def _measure_normal(a: torch.Tensor, g: torch.Tensor, dtype: torch.dtype, want) -> Optional[Dict[str, float]]:
    """The usual case, every element finite, with the cheapest reductions (a sum or a dot product is much
    faster than a max over |x| on the CPU) and one mask, of the small region; None when the
    general path (NaN, Inf, overflow) is needed."""
    n = g.numel()
    golden64 = g
    if dtype.itemsize <= 4 and a.dtype.itemsize <= 4:
        # a float32 (or narrower) result: its error and the golden carry all the digits the metrics need in
        # float32 (24 bits of an error of ~1e-7 relative), and float32 passes move half the bytes
        err = a.to(torch.float64).sub_(g).to(torch.float32)  # the difference taken in float64, kept in float32
        g = g.to(torch.float32)
    else:
        err = torch.sub(a, g)  # a new tensor: ``a`` may already be float64, and must stay as loaded
    golden_square = float(torch.dot(g, g))
    # a NaN or Inf anywhere makes the sum non-finite; a golden whose norm exceeds the dtype's range may
    # overflow in it: both go the general way
    if not math.isfinite(float(err.sum())) or not math.sqrt(golden_square) <= torch.finfo(dtype).max:
        return None
    small = g.abs() <= standards.small_value(dtype)
    n_small = int(small.sum())
    n_normal = n - n_small
    quotient = err / g
    if n_small:  # relative errors are taken over the normal region only (a zero golden gives inf here)
        quotient.masked_fill_(small, 0.0)
    rel = quotient.abs()
    out = {
        "max_rel_err": float(rel.max()) if n_normal else 0.0,
        "mean_rel_err": float(rel.sum()) / n_normal if n_normal else 0.0,
        "rel_bias": abs(float(quotient.sum())) / n_normal if n_normal else 0.0,
        "rmse": math.sqrt(float(torch.dot(err, err)) / n),
        "nonfinite_mismatch": 0.0,
        "count": float(n),
    }
    # the small region is sparse: its errors are gathered, not masked
    small_errors = (float((err[small].abs() > standards.small_atol(dtype)).sum()) / n_small) if n_small else 0.0
    if want("small_value_err_ratio"):
        out["small_value_err_ratio"] = small_errors
        out["golden_rms"] = math.sqrt(golden_square / n)
    if want("eb"):
        out["eb"] = abs(float(torch.sign(err).sum())) / n
    if want("rel_err_ratio"):
        out["rel_err_ratio"] = float((rel > standards.rtol(dtype)).sum()) / n_normal if n_normal else 0.0
        out["abs_err_ratio"] = small_errors
    if want("mismatch_ratio"):
        out["mismatch_ratio"] = float(a.ne(golden64.to(a.dtype)).sum()) / n  # rounded once, from float64
    ulp = standards.ulp_parameters(dtype)
    if ulp is not None and want("ulp_err_proportion"):
        min_exponent, mantissa, bound = ulp
        exponent = (torch.frexp(g).exponent - 1).clamp_(min=min_exponent)
        # |err| * 2**(mantissa - exponent); exp2 on floats is faster than ldexp on the CPU
        ulp_err = err.abs_().mul_(torch.exp2((mantissa - exponent).to(err.dtype)))
        out["mean_ulp_err"] = float(ulp_err.sum()) / n
        out["max_ulp_err"] = float(ulp_err.max())
        out["ulp_err_proportion"] = float((ulp_err > bound).sum()) / n
    return out


_NEEDS = {
    standards.BENCHMARK: ("small_value_err_ratio", "eb"),
    standards.ABSOLUTE: ("rel_err_ratio",),
    standards.BINARY: ("mismatch_ratio",),
    standards.ULP: ("ulp_err_proportion",),
}


BINS = list(range(-16, 1))  # log10 of the relative error, 1e-16 .. 1 and above


def histogram(actual: torch.Tensor, golden: torch.Tensor) -> Dict[str, List[int]]:
    """Counts of log10 relative error per decade (first bin: below 1e-16, exact included), for the HTML plot."""
    a = actual.detach().to(torch.float64).reshape(-1)
    g = golden.detach().to(torch.float64).reshape(-1)
    both = torch.isfinite(a) & torch.isfinite(g)
    rel = (a - g).abs()[both] / g.abs()[both].clamp(min=torch.finfo(torch.float64).tiny)
    decade = torch.floor(torch.log10(rel.clamp(min=1e-300))).clamp(min=BINS[0], max=BINS[-1])
    counts = torch.bincount((decade - BINS[0]).to(torch.int64), minlength=len(BINS))
    return {"bins": BINS, "counts": [int(c) for c in counts[: len(BINS)]], "nonfinite": int((~both).sum())}
