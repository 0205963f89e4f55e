"""The grading criteria: which standard an API is held to, per-dtype thresholds, and pass/warning/error.

Sources (docs/precheck.md cites them in full): mindstudio-probe 26.2's ``api_accuracy_checker``:
``precision_standard/standard_config.py`` (small value, atol, rtol, minimum error, ratio thresholds),
``compare/api_precision_standard.yaml`` (which APIs take the absolute-threshold, binary, ULP standards),
``compare/algorithm.py`` and ``precision_standard/ulp_compare.py`` (the metrics and the ULP rule), and
``core/common/const.py`` (ULP bounds 32 for float32, 1 for float16/bfloat16).

The rule that makes it a pre-check without a reference device: every metric of the device result is divided
by the same metric of the CPU replay in the same dtype (floored, so that an exact CPU result does not turn
noise into a failure), and the device fails when it is worse by more than the stated factor.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

BENCHMARK, ABSOLUTE, BINARY, ULP, EXACT = "benchmark", "absolute_threshold", "binary_consistency", "ulp", "exact"
PASS, WARNING, ERROR, SKIP, INFO = "pass", "warning", "error", "skip", "info"
SEVERITY = {ERROR: 4, WARNING: 3, SKIP: 2, PASS: 1, INFO: 0}

# msprobe compare/api_precision_standard.yaml


def _operator_dunders(*entries: str) -> frozenset:
    """The dunders (and reflected dunders) of operator-table rows, by entry: one spelling of each, there."""
    from msprobe_runtime import operators

    return frozenset(
        name for row in operators.TABLE if row.entry in entries for name in (row.dunder, row.reflected) if name
    )


ABSOLUTE_APIS = frozenset(
    """mul mul_ add add_ div div_ __div__ __idiv__ divide divide_ leaky_relu leaky_relu_ prelu
reciprocal reciprocal_ rsqrt rsqrt_ square square_ sub sub_ rsub""".split()
) | _operator_dunders("add", "sub", "mul", "truediv", "iadd", "isub", "imul", "itruediv")
BINARY_APIS = frozenset(
    """abs abs_ absolute absolute_ argmin argmax bitwise_and bitwise_and_ broadcast_to ceil ceil_
equal fill_ flatten floor floor_ gather greater greater_ greater_equal greater_equal_ histc isfinite isnan less
less_ less_equal less_equal_ logical_and logical_and_ logical_not logical_not_ logical_or logical_or_ masked_fill
masked_fill_ max_pool3d maximum minimum neg neg_ nonzero not_equal not_equal_ one_hot pad relu relu_ reshape
round round_ select sign sign_ sort tile topk transpose transpose_ tril tril_ triu triu_ type_as view permute
contiguous __getitem__ clone expand t unsqueeze squeeze cat stack split chunk narrow""".split()
) | _operator_dunders("neg")
ULP_APIS = _operator_dunders("matmul") | frozenset(
    """addbmm addbmm_ addmm addmm_ baddbmm baddbmm_ bilinear bmm
chain_matmul hspmm linear matmul mm mv smm sspaddmm""".split()
)

# standard_config.py, keyed by dtype name; float64 (a float64 device) gets thresholds in the same spirit
_SMALL_VALUE = {"torch.float16": 2**-10, "torch.bfloat16": 2**-10, "torch.float32": 2**-20, "torch.float64": 2**-40}
_SMALL_ATOL = {"torch.float16": 2**-16, "torch.bfloat16": 2**-16, "torch.float32": 2**-30, "torch.float64": 2**-60}
_RTOL = {"torch.float16": 2**-10, "torch.bfloat16": 2**-8, "torch.float32": 2**-20, "torch.float64": 2**-40}
_MIN_ERR = {"torch.float16": 2**-11, "torch.bfloat16": 2**-8, "torch.float32": 2**-14, "torch.float64": 2**-40}
# compare_utils.ULP_PARAMETERS (min exponent, mantissa bits) and const.ULP_FLOAT*_THRESHOLD
_ULP = {"torch.float16": (-14, 10, 1.0), "torch.bfloat16": (-126, 7, 1.0), "torch.float32": (-126, 23, 32.0)}
FP32_MEAN_ULP_BOUND = 64.0  # standard_config._fp32_mean_ulp_err_threshold
FP32_ULP_PROPORTION = 0.05  # standard_config._fp32_ulp_err_proportion
HALF_ULP_PROPORTION = 0.001  # standard_config._fp16_ulp_err_proportion

# (warning factor, error factor) of device / max(cpu, floor): standard_config.get_benchmark_ratio_threshold, L0
RATIO_FACTORS = {
    "max_rel_err": (5.0, 10.0),
    "mean_rel_err": (1.5, 2.0),
    "rmse": (1.5, 2.0),
    "small_value_err_ratio": (1.5, 2.0),
    "eb": (1.5, 2.0),
    "rel_bias": (1.5, 2.0),
}
# shares that a correct op keeps at zero (absolute threshold, exactness, NaN/Inf): an error when the device
# has more than this factor times the CPU's share (any at all when the CPU has none)
SHARE_FACTOR = 2.0
ULP_FACTOR = 2.0

# Where the reports send a reader for the criteria: a command every install has (it prints criteria_text()),
# where docs/precheck.md is only in a checkout (test_reports_point_at_criteria_a_pip_user_has).
CRITERIA_HINT = "msprobe-rewrite precheck --help"


def _key(dtype) -> str:
    return str(dtype)


def small_value(dtype) -> float:
    return _SMALL_VALUE.get(_key(dtype), 2**-20)


def small_atol(dtype) -> float:
    return _SMALL_ATOL.get(_key(dtype), 2**-30)


def rtol(dtype) -> float:
    return _RTOL.get(_key(dtype), 2**-20)


def minimum_error(dtype) -> float:
    return _MIN_ERR.get(_key(dtype), 2**-14)


def ulp_parameters(dtype) -> Optional[Tuple[int, int, float]]:
    return _ULP.get(_key(dtype))


def standard_for(api_base: str, dtype) -> str:
    name = _key(dtype)
    if not (name.startswith("torch.float") or name.startswith("torch.bfloat") or name.startswith("torch.complex")):
        return EXACT
    if api_base in BINARY_APIS:
        return BINARY
    if api_base in ULP_APIS and ulp_parameters(dtype) is not None:
        return ULP
    if api_base in ABSOLUTE_APIS:
        return ABSOLUTE
    return BENCHMARK


Row = Dict[str, object]


def _row(metric, device, cpu, ratio, threshold, status, message="") -> Row:
    return {
        "metric": metric,
        "device": device,
        "cpu": cpu,
        "ratio": ratio,
        "threshold": threshold,
        "status": status,
        "message": message,
    }


def _by_ratio(metric: str, device: float, cpu: Optional[float], floor: float) -> Row:
    warn, err = RATIO_FACTORS[metric]
    reference = max(cpu or 0.0, floor)
    ratio = device / reference if reference > 0 else (0.0 if device == 0 else math.inf)
    status = ERROR if ratio > err else WARNING if ratio > warn else PASS
    return _row(metric, device, cpu, ratio, f"device <= {err:g} x max(cpu, {floor:.3g})", status)


def _by_share(metric: str, device: float, cpu: Optional[float], factor: float = SHARE_FACTOR) -> Row:
    reference = cpu or 0.0
    status = ERROR if device > 0 and device > factor * reference else PASS
    ratio = device / reference if reference > 0 else (0.0 if device == 0 else math.inf)
    return _row(metric, device, cpu, ratio, f"device <= {factor:g} x cpu" if factor != 1 else "device <= cpu", status)


def grade(standard: str, dtype, device: Dict[str, float], cpu: Optional[Dict[str, float]]) -> List[Row]:
    """One row per graded metric (and info rows for the rest) of one result tensor."""
    c = cpu or {}
    rows: List[Row] = []
    if standard == EXACT:
        return [_by_share("mismatch_ratio", device["mismatch_ratio"], c.get("mismatch_ratio"), 1.0)]
    floor = minimum_error(dtype)
    rows.append(_by_share("nonfinite_mismatch", device["nonfinite_mismatch"], c.get("nonfinite_mismatch"), 1.0))
    if standard == BINARY:
        rows.append(_by_share("mismatch_ratio", device["mismatch_ratio"], c.get("mismatch_ratio"), 1.0))
        return rows
    if standard == ABSOLUTE:
        for metric in ("rel_err_ratio", "abs_err_ratio"):
            rows.append(_by_share(metric, device[metric], c.get(metric)))
        rows.append(_by_ratio("rel_bias", device["rel_bias"], c.get("rel_bias"), floor))
        return rows
    if standard == ULP:
        rows.append(_ulp_row(dtype, device, c))
        rows.append(_row("mean_ulp_err", device["mean_ulp_err"], c.get("mean_ulp_err"), None, "", INFO))
        rows.append(_row("max_ulp_err", device["max_ulp_err"], c.get("max_ulp_err"), None, "", INFO))
        rows.append(_by_ratio("rel_bias", device["rel_bias"], c.get("rel_bias"), floor))
        return rows
    for metric in ("max_rel_err", "mean_rel_err", "small_value_err_ratio", "rel_bias"):
        rows.append(_by_ratio(metric, device[metric], c.get(metric), floor))
    rows.append(_by_ratio("rmse", device["rmse"], c.get("rmse"), floor * max(device["golden_rms"], floor)))
    # a fair coin's balance has a standard deviation of 1/sqrt(n): below three of them it is no evidence
    count = max(device.get("count", 1.0), 1.0)
    rows.append(_by_ratio("eb", device["eb"], c.get("eb"), max(floor, 3.0 / math.sqrt(count))))
    return rows


def _ulp_row(dtype, device, cpu) -> Row:
    proportion = device["ulp_err_proportion"]
    reference = cpu.get("ulp_err_proportion") or 0.0
    limit = max(ULP_FACTOR * reference, FP32_ULP_PROPORTION if _key(dtype) == "torch.float32" else HALF_ULP_PROPORTION)
    passed = proportion <= limit
    if _key(dtype) == "torch.float32" and device["mean_ulp_err"] < FP32_MEAN_ULP_BOUND:
        passed = True
    ratio = proportion / reference if reference > 0 else (0.0 if proportion == 0 else math.inf)
    proportion_floor = FP32_ULP_PROPORTION if _key(dtype) == "torch.float32" else HALF_ULP_PROPORTION
    return _row(
        "ulp_err_proportion",
        proportion,
        cpu.get("ulp_err_proportion"),
        ratio,
        f"mean ulp < {FP32_MEAN_ULP_BOUND:g} (float32) or proportion <= max({ULP_FACTOR:g} x cpu, "
        f"{limit if not reference else proportion_floor:g})",
        PASS if passed else ERROR,
    )


def worst(statuses) -> str:
    best = INFO
    for status in statuses:
        if SEVERITY.get(status, 0) > SEVERITY[best]:
            best = status
    return best


def criteria_text(width: int = 100) -> str:
    """The criteria as `msprobe-rewrite precheck --help` prints them, from the constants above: the reports point
    there, since a pip install has no docs/ folder (test_reports_point_at_criteria_a_pip_user_has)."""
    import textwrap

    standards = [
        ("exact", "integer and bool results", "mismatch_ratio"),
        ("binary consistency", "relu, abs, neg, reshape, transpose, gather, sort, topk, cat, ...", "mismatch_ratio"),
        (
            "ULP",
            "matmul, linear, mm, bmm, addmm, baddbmm, ...",
            f"ulp_err_proportion (share above {_ULP['torch.float32'][2]:g} ULP in float32, "
            f"{_ULP['torch.float16'][2]:g} in float16/bfloat16; float32 also passes with a mean below "
            f"{FP32_MEAN_ULP_BOUND:g} ULP), rel_bias",
        ),
        (
            "absolute threshold",
            "add, sub, mul, div, rsqrt, reciprocal, square, ... and their operators",
            "rel_err_ratio, abs_err_ratio, rel_bias",
        ),
        ("benchmark", "every other API", ", ".join(RATIO_FACTORS)),
    ]
    others = sorted({factors for metric, factors in RATIO_FACTORS.items() if metric != "max_rel_err"})
    factors = f"max_rel_err {RATIO_FACTORS['max_rel_err'][0]:g} / {RATIO_FACTORS['max_rel_err'][1]:g}, " + ", ".join(
        f"the others {w:g} / {e:g}" for w, e in others
    )
    lines = [
        textwrap.fill(
            "Criteria: the dumped result (the device) and the CPU replay in the same dtype are both measured "
            "against a float64 CPU golden, and the device fails when it is worse than the CPU by more than a "
            "factor. Each API is held to one standard, chosen as msprobe's api_precision_standard.yaml does:",
            width,
        ),
        "",
    ]
    for name, apis, metrics in standards:
        lines.append(
            textwrap.fill(f"{name}: {apis}; grades {metrics}", width, initial_indent="  ", subsequent_indent="      ")
        )
    for text in (
        "Every floating result also grades nonfinite_mismatch (NaN or Inf where the golden has none, or the reverse).",
        "Ratio metrics: device / max(cpu, the dtype's minimum error); warning / error above " + factors + ".",
        f"Shares (rel_err_ratio, abs_err_ratio): an error when the device has any and more than "
        f"{SHARE_FACTOR:g}x the CPU's; mismatch_ratio and nonfinite_mismatch: when it has more than the CPU.",
        "Float8 records (standard 'float8 range', from the dump records, replayed or not): an error when "
        "fp8_saturated_fraction exceeds --fp8-saturated, a warning when fp8_zero_fraction exceeds --fp8-zero.",
        "Each row of precheck_result.csv names the metric, both figures and the threshold it was held to; an "
        "API's status is its worst row.",
    ):
        lines += ["", textwrap.fill(text, width)]
    return "\n".join(lines)
