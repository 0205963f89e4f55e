"""A self-contained HTML report: the summary, and per pair of dumps an inline SVG plot of each statistic's
error along execution order (log scale), the threshold and the first divergence marked, then the
error-propagation view (``report_propagation``). No script, no external stylesheet: the file opens anywhere,
offline, and can be attached to an issue.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any, Dict, List, Optional, Sequence

from .engine import PairResult
from .records import STATS
from .report_propagation import STYLE as PROPAGATION_STYLE, fmt as _number, section as propagation_section

WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 960, 320, 60, 20, 20, 40
MAX_POINTS = 1500  # longer runs are drawn as the maximum of each bucket of positions
COLOURS = {"Max": "#d62728", "Min": "#1f77b4", "Mean": "#2ca02c", "Norm": "#9467bd"}
FLOOR = 1e-12


def _buckets(values: Sequence[float], count: int) -> List[Optional[float]]:
    n = len(values)
    if n <= count:
        return [None if math.isnan(v) else v for v in values]
    out: List[Optional[float]] = []
    for b in range(count):
        chunk = [v for v in values[b * n // count : (b + 1) * n // count] if not math.isnan(v)]
        out.append(max(chunk) if chunk else None)
    return out


def _y(value: float, low: float, high: float) -> float:
    value = min(max(value, low), high)
    span = math.log10(high) - math.log10(low)
    return TOP + (HEIGHT - TOP - BOTTOM) * (1 - (math.log10(value) - math.log10(low)) / span)


def plot(result: PairResult, threshold: float) -> str:
    n = len(result.merged)
    if n == 0:
        return "<p>No entries.</p>"
    count = min(n, MAX_POINTS)
    series = {name: _buckets(result.stat_errors[k], count) for k, name in enumerate(STATS)}
    finite = [v for s in series.values() for v in s if v is not None and 0 < v < math.inf]
    low = FLOOR
    high = max([1.0, threshold * 10] + finite)
    high = 10 ** math.ceil(math.log10(high))
    plot_w = WIDTH - LEFT - RIGHT

    def x_of(index: int) -> float:
        return LEFT + plot_w * (index + 0.5) / count

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" font-family="sans-serif" font-size="11">',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{HEIGHT - TOP - BOTTOM}" fill="#fafafa" stroke="#ccc"/>',
    ]
    exponent = int(math.log10(low))
    while 10**exponent <= high:
        y = _y(10**exponent, low, high)
        if exponent % 2 == 0:
            parts.append(
                f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">1e{exponent}</text>'
            )
        exponent += 1
    if threshold > 0:
        y = _y(threshold, low, high)
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#888" '
            f'stroke-dasharray="4 3"/><text x="{WIDTH - RIGHT - 4}" y="{y - 4:.1f}" text-anchor="end" '
            f'fill="#666">threshold {threshold:g}</text>'
        )
    first = result.first_divergence
    if first is not None:
        x = x_of(first["position"] * count // n)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" stroke="#000" '
            f'stroke-width="1.5"/><text x="{x + 4:.1f}" y="{TOP + 12}">first divergence: '
            f"{html.escape(first['entry'])}</text>"
        )
    for name, values in series.items():
        points = []
        for index, value in enumerate(values):
            if value is None:
                continue
            shown = high if value == math.inf else max(value, low)
            points.append(f"{x_of(index):.1f},{_y(shown, low, high):.1f}")
        if points:
            parts.append(
                f'<polyline fill="none" stroke="{COLOURS[name]}" stroke-width="1" points="{" ".join(points)}"/>'
            )
    for k, name in enumerate(STATS):
        parts.append(
            f'<rect x="{LEFT + 10 + 80 * k}" y="{HEIGHT - 16}" width="10" height="10" '
            f'fill="{COLOURS[name]}"/><text x="{LEFT + 24 + 80 * k}" y="{HEIGHT - 7}">{name}</text>'
        )
    parts.append(
        f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 7}" text-anchor="end">execution order '
        f"({n} entries{', bucket maxima' if n > count else ''}); errors below {low:g} drawn at "
        f"{low:g}</text></svg>"
    )
    return "".join(parts)


def _where(item: Dict[str, Any]) -> str:
    return f" at <code>{html.escape(str(item['call_site']))}</code>" if item.get("call_site") else ""


def _headline(summary: Dict[str, Any]) -> List[str]:
    """The first suspect as the one headline, the threshold view under it and why the two differ, as the
    terminal prints them (summary.terminal_summary)."""
    out = []
    suspect = summary.get("first_suspect")
    if suspect is None:
        out.append(
            "<p class=ok><b>First suspect: none</b> (every output error is explained by its inputs' "
            "error and the noise).</p>"
        )
    else:
        out.append(
            f"<p class=bad><b>First suspect:</b> <code>{html.escape(suspect['entry'])}</code> in "
            f"{html.escape(str(suspect['pair']))}: output error {_number(suspect['output_error'])}, "
            f"input error {_number(suspect['input_error'])}, noise floor {_number(suspect['noise_floor'])}"
            + _where(suspect)
            + "</p>"
        )
    first = summary["first_divergence"]
    views = summary.get("views") or {}
    out.append('<div class="view">')
    if first is None:
        out.append("<p>Threshold view, first divergence: none (no tensor differs beyond its dtype's threshold).</p>")
    else:
        how = (
            "its outputs diverge while its inputs agree"
            if first["kind"] == "outputs"
            else "its inputs already diverge: the difference entered through code the dump does not show"
        )
        out.append(
            f"<p>Threshold view, first divergence: <code>{html.escape(first['entry'])}</code> in "
            f"{html.escape(str(first['pair']))} ({html.escape(how)})"
            + _where(first)
            + (" &mdash; the same entry" if suspect is not None and views.get("same") else "")
            + "</p>"
        )
    if views and not views.get("same"):
        out.append(f"<p><b>Why they differ:</b> {html.escape(str(views['reason']))}</p>")
    out.append("</div>")
    return out


def _chain(first: Dict[str, Any], index: int) -> str:
    """The first divergence and the diverging entries after it, in execution order, as the terminal's
    "followed by" line (there: five names; here: all the summary keeps)."""
    names = [first["entry"]] + list(first.get("chain") or [])
    more = int(first.get("chain_length") or 0) - len(first.get("chain") or [])
    items = "".join(f"<li><code>{html.escape(str(name))}</code></li>" for name in names)
    return (
        f'<h3 id="chain-{index}">Divergence chain</h3><p>The first divergence, then the '
        f"{first.get('chain_length', 0)} entries that diverge after it, in execution order:</p><ol>{items}</ol>"
        + (f"<p>(+{more} more)</p>" if more > 0 else "")
    )


TOP_COLUMNS = (
    ("entry", "the entry (run A's name)"),
    ("tensor", "which of its outputs"),
    ("statistic", "the statistic with the largest decision error"),
    ("a", "its value in run A"),
    ("b", "its value in run B"),
    ("error", "|A - B| / max(|A|, |B|, rms): the decision error"),
    ("call_site", "file:line of the call, from stack.json"),
)


def _top_divergences(pair: Dict[str, Any], index: int) -> str:
    items = pair["top_divergences"]
    if not items:
        return ""
    legend = "; ".join(f"<b>{name}</b>: {html.escape(text)}" for name, text in TOP_COLUMNS)
    rows = [
        "<tr>" + "".join(f"<td>{html.escape(str(item.get(k)))}</td>" for k, _ in TOP_COLUMNS) + "</tr>"
        for item in items
    ]
    return (
        f'<h3 id="top-{index}">Top divergences</h3><p>The {len(items)} entries with the largest output '
        f'error beyond the threshold, worst first. {legend}.</p><table class="top"><tr>'
        + "".join(f'<th title="{html.escape(text)}">{name}</th>' for name, text in TOP_COLUMNS)
        + "</tr>"
        + "".join(rows)
        + "</table>"
    )


def render(summary: Dict[str, Any], results: List[PairResult], threshold: float) -> str:
    body = [
        "<h1>msprobe-rewrite compare</h1>",
        f"<p>A: <code>{html.escape(str(summary['run_a']))}</code><br>"
        f"B: <code>{html.escape(str(summary['run_b']))}</code></p>",
    ]
    body.extend(_headline(summary))
    for index, (result, pair) in enumerate(zip(results, summary["pairs"])):
        body.append(f"<h2>{html.escape(pair['pair'])}</h2>")
        body.append(
            f"<p>{pair['matched']} entries matched, {pair['unmatched_a_count']} only in A, "
            f"{pair['unmatched_b_count']} only in B; {pair['diverged_entries']} entries diverge.</p>"
        )
        for side in ("a", "b"):
            onset = (pair.get("nan_onset") or {}).get(side)
            if onset:
                body.append(
                    f"<p class=bad>NaN/Inf first appears in {side.upper()} at "
                    f"<code>{html.escape(str(onset['entry']))}</code>"
                    + (f" (<code>{html.escape(str(onset['call_site']))}</code>)" if onset.get("call_site") else "")
                    + "</p>"
                )
        body.append("<p>Decision error of each output statistic, |A - B| / max(|A|, |B|, rms), per entry:</p>")
        body.append(plot(result, threshold))
        body.append(propagation_section(result, pair, index))
        if pair.get("first_divergence"):
            body.append(_chain(pair["first_divergence"], index))
        body.append(_top_divergences(pair, index))
        for side in ("a", "b"):
            names = pair[f"unmatched_{side}"]
            if names:
                body.append(
                    f"<details><summary>{pair[f'unmatched_{side}_count']} entries only in "
                    f"{side.upper()}</summary><pre>{html.escape(chr(10).join(names))}</pre></details>"
                )
    body.append(
        "<details><summary>JSON summary</summary><pre>"
        + html.escape(json.dumps(summary, indent=1))
        + "</pre></details>"
    )
    style = (
        "body{font-family:sans-serif;margin:2em;max-width:1000px}table{border-collapse:collapse;"
        "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}.bad{color:#a00}.ok{color:#070}"
        "pre{font-size:11px;overflow:auto}.view{margin-left:2em}" + PROPAGATION_STYLE
    )
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>msprobe-rewrite compare</title>'
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>"
    )
