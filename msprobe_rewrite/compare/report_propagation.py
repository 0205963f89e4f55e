"""The error-propagation part of the HTML report: each entry's output and input error along execution order
(log scale) over the noise band, the suspects marked; a suspect's mark links to its evidence, call site and
stack, shown by CSS ``:target`` (the report has no script)."""

from __future__ import annotations

import html
import math
import os
from typing import Any, Dict, List, Sequence

from .jsonstream import JsonStreamError, iter_members
from .names import forward_name

WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 960, 300, 60, 20, 20, 40
MAX_POINTS = 1500
LOW = 1e-12
STYLE = (
    ".stack{display:none;border:1px solid #d62728;padding:4px 8px;margin:4px 0}.stack:target{display:block}"
    "table.suspects td{vertical-align:top}"
)


CSV_COLUMNS = (
    "entry",
    "bench_entry",
    "direction",
    "op_class",
    "tensor",
    "statistic",
    "output_error",
    "input_error",
    "gain",
    "allowance",
    "noise_floor",
    "score",
    "score_rank",
    "call_site",
    "fp8_underflow",
)


def write_csv(path: str, suspects: List[Dict[str, Any]]) -> None:
    """The suspects of one pair of dumps, in execution order, one row each."""
    from ..csv_cells import SafeCsvWriter

    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = SafeCsvWriter(handle)
        writer.writerow(CSV_COLUMNS)
        for item in suspects:
            writer.writerow([item.get(column) for column in CSV_COLUMNS])


def read_stacks(dump_json: str, names: Sequence[str]) -> Dict[str, List[str]]:
    """Entry name -> frames from the stack.json beside ``dump_json``, for ``names`` only (a backward entry
    takes its forward entry's stack)."""
    wanted: Dict[str, str] = {}
    for name in names:
        wanted[name] = name
        forward = forward_name(name)
        if forward:
            wanted.setdefault(forward, name)
    path = os.path.join(os.path.dirname(dump_json), "stack.json")
    if not os.path.isfile(path):
        return {}
    found: Dict[str, List[str]] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for key, value in iter_members(handle):
                if isinstance(value, list) and len(value) == 2 and isinstance(value[0], list):
                    keys, frames = value
                else:
                    keys, frames = [key], value
                for item in keys:
                    if item in wanted and isinstance(frames, list):
                        found[item] = [str(frame) for frame in frames]
    except (OSError, JsonStreamError, UnicodeDecodeError):
        return {}
    out = {}
    for name in names:
        frames = found.get(name) or found.get(forward_name(name) or "")
        if frames:
            out[name] = frames
    return out


def _y(value: float, high: float) -> float:
    value = min(max(value, LOW), high)
    span = math.log10(high) - math.log10(LOW)
    return TOP + (HEIGHT - TOP - BOTTOM) * (1 - (math.log10(value) - math.log10(LOW)) / span)


def _bucket(values: List[float], count: int) -> List[float]:
    n = len(values)
    if n <= count:
        return values
    return [max(values[b * n // count : (b + 1) * n // count] or [0.0]) for b in range(count)]


def plot(series, suspects: List[Dict[str, Any]], band: float, anchor: str) -> str:
    positions, out_errors, in_errors = series or ((), (), ())
    n = len(positions)
    if n == 0:
        return "<p>No matched entries.</p>"
    count = min(n, MAX_POINTS)
    outs = _bucket(list(out_errors), count)
    ins = _bucket(list(in_errors), count)
    finite = [v for v in outs + ins if 0 < v < math.inf]
    high = 10 ** math.ceil(math.log10(max([1.0] + finite)))
    plot_w = WIDTH - LEFT - RIGHT
    order = {position: k for k, position in enumerate(positions)}

    def x_of(rank: int) -> float:
        return LEFT + plot_w * (rank * count // n + 0.5) / count

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" font-family="sans-serif" font-size="11">',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{HEIGHT - TOP - BOTTOM}" fill="#fafafa" stroke="#ccc"/>',
    ]
    if band > 0:
        y = _y(band, high)
        parts.append(
            f'<rect x="{LEFT}" y="{y:.1f}" width="{plot_w}" height="{HEIGHT - BOTTOM - y:.1f}" '
            f'fill="#e8e8e8"/><text x="{WIDTH - RIGHT - 4}" y="{y - 4:.1f}" text-anchor="end" '
            f'fill="#666">noise floor {band:.2g}</text>'
        )
    exponent = int(math.log10(LOW))
    while 10**exponent <= high:
        if exponent % 2 == 0:
            y = _y(10**exponent, high)
            parts.append(
                f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">1e{exponent}</text>'
            )
        exponent += 1
    for values, colour, width in ((ins, "#1f77b4", 1), (outs, "#d62728", 1.2)):
        points = " ".join(
            f"{LEFT + plot_w * (k + 0.5) / count:.1f},{_y(v if v < math.inf else high, high):.1f}"
            for k, v in enumerate(values)
        )
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="{width}" points="{points}"/>')
    for number, item in enumerate(suspects, 1):
        rank = order.get(item["position"])
        if rank is None:
            continue
        x, y = x_of(rank), _y(item["output_error"] if item["output_error"] < math.inf else high, high)
        parts.append(
            f'<a href="#{anchor}-{number}"><title>{html.escape(item["entry"])}</title>'
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6" fill="none" stroke="#000" stroke-width="1.5"/>'
            f'<text x="{x + 7:.1f}" y="{y - 7:.1f}">{number}</text></a>'
        )
    parts.append(
        f'<rect x="{LEFT + 10}" y="{HEIGHT - 16}" width="10" height="10" fill="#d62728"/>'
        f'<text x="{LEFT + 24}" y="{HEIGHT - 7}">output error</text>'
        f'<rect x="{LEFT + 120}" y="{HEIGHT - 16}" width="10" height="10" fill="#1f77b4"/>'
        f'<text x="{LEFT + 134}" y="{HEIGHT - 7}">input error</text>'
        f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 7}" text-anchor="end">execution order ({n} matched '
        f"entries{', bucket maxima' if n > count else ''}); circles: suspects</text></svg>"
    )
    return "".join(parts)


SUSPECT_COLUMNS = (
    ("#", "its number on the plot; the entry's name shows its call site and stack"),
    ("entry", "the API or module entry (run A's name)"),
    ("tensor", "the output whose error is largest against its budget"),
    ("statistic", "which statistic of that output (Max, Min, Mean, Norm; MaxAbsErr from tensor dumps)"),
    ("output error", "that statistic's difference over the tensor's own scale"),
    ("input error", "the largest such error of its inputs (for a backward entry also of what its forward saved)"),
    ("gain", "output error / input error"),
    ("allowance", "how many times its input error the entry's op class may pass on"),
    ("noise floor", "the error rounding alone gives, for this dtype and statistic, estimated from the pair"),
    ("score", "output error / (allowance x input error + noise floor): a suspect scores above 1"),
    ("rank by score", "1 for the highest score among the pair's suspects"),
)


def fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else html.escape(str(value))


def section(result, pair: Dict[str, Any], index: int) -> str:
    """The propagation view of one pair of dumps."""
    suspects = pair.get("suspects") or []
    floors = pair.get("noise_floor") or {}
    band = max(
        (v.get("Max", 0.0) for v in floors.values() if isinstance(v, dict) and isinstance(v.get("Max", 0.0), float)),
        default=0.0,
    )
    anchor = f"suspect-{index}"
    body = [
        "<h3>Error propagation</h3>",
        "<p>Scale-aware error of each entry's outputs (red) and inputs (blue) against the other run: a "
        "statistic's difference over the tensor's own scale (max |x| for Max and Min, Norm/&radic;n for "
        "Mean). A suspect's output error exceeds what its inputs' error, times its op class's allowance, "
        "and the noise floor explain. Noise floor per dtype and statistic (Mean and Norm: per &radic;n): "
        + html.escape(
            ", ".join(
                f"{d.replace('torch.', '')} " + " ".join(f"{m} {v:.2g}" for m, v in s.items())
                for d, s in floors.items()
            )
            or "none (no difference)"
        )
        + ".</p>",
        # the plot reads the suspects' numbers before JSON cleaning (an infinite error is a float there)
        plot(result.propagation.get("series"), result.propagation.get("suspects") or [], band, anchor),
    ]
    if not suspects:
        body.append("<p class=ok>No suspect: every output error is explained by its inputs and the noise.</p>")
        return "".join(body)
    stacks = read_stacks(result.a.dump.path, [s["entry"] for s in suspects])
    # the columns are explained where they are read, not only above the plot (tests/compare/test_html_report.py)
    body.append(
        "<p>Suspects in execution order. "
        + "; ".join(f"<b>{html.escape(name)}</b>: {html.escape(text)}" for name, text in SUSPECT_COLUMNS)
        + ".</p>"
    )
    body.append(
        '<table class="suspects"><tr>'
        + "".join(f'<th title="{html.escape(text)}">{html.escape(name)}</th>' for name, text in SUSPECT_COLUMNS)
        + "</tr>"
    )
    for number, item in enumerate(suspects, 1):
        body.append(
            f'<tr><td>{number}</td><td><a href="#{anchor}-{number}"><code>{html.escape(item["entry"])}'
            "</code></a></td>"
            + "".join(
                f"<td>{fmt(item.get(k))}</td>"
                for k in (
                    "tensor",
                    "statistic",
                    "output_error",
                    "input_error",
                    "gain",
                    "allowance",
                    "noise_floor",
                    "score",
                    "score_rank",
                )
            )
            + "</tr>"
        )
    body.append("</table>")
    for number, item in enumerate(suspects, 1):
        frames = stacks.get(item["entry"]) or []
        body.append(
            f'<div class="stack" id="{anchor}-{number}"><b>{number}. {html.escape(item["entry"])}</b> '
            f"({html.escape(item['op_class'])}, {html.escape(item['direction'])})<br>call site: "
            f"<code>{html.escape(str(item.get('call_site')))}</code>"
            + (f"<br>float8 underflow: {html.escape(item['fp8_underflow'])}" if item.get("fp8_underflow") else "")
            + f"<pre>{html.escape(chr(10).join(frames) or 'no stack recorded')}</pre></div>"
        )
    return "".join(body)
