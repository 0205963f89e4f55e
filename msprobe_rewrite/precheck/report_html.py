"""``precheck_report.html``: one self-contained page; failing APIs first, each with its failing metrics and an
error-distribution plot (inline SVG: share of elements per decade of relative error, device against the CPU
replay in the same dtype), then skipped APIs with their reasons, then the APIs that passed."""

from __future__ import annotations

import html
from typing import Any, Dict, List

from . import standards
from .summary import counts, failing_first

_COLOURS = {
    standards.ERROR: "#c0392b",
    standards.WARNING: "#d68910",
    standards.SKIP: "#7f8c8d",
    standards.PASS: "#1e8449",
}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else html.escape(str(value))


def _plot(title: str, series: Dict[str, Dict[str, Any]]) -> str:
    """Grouped bars: one group per decade of relative error, one bar per series (device, cpu)."""
    width, height, left, bottom = 560, 170, 40, 30
    first = next(iter(series.values()))
    bins = first["bins"]
    step = (width - left - 10) / len(bins)
    colours = {"device": "#c0392b", "cpu": "#2e86c1"}
    parts = [
        f'<svg width="{width}" height="{height}" role="img" aria-label="{html.escape(title)}">',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - 10}" y2="{height - bottom}" stroke="#555"/>',
    ]
    for s, (name, data) in enumerate(series.items()):
        total = max(sum(data["counts"]), 1)
        for i, count in enumerate(data["counts"]):
            share = count / total
            bar = share * (height - bottom - 20)
            x = left + i * step + s * step / 2.2
            parts.append(
                f'<rect x="{x:.1f}" y="{height - bottom - bar:.1f}" width="{step / 2.4:.1f}" '
                f'height="{bar:.1f}" fill="{colours.get(name, "#888")}"><title>{name}: {count} '
                f"elements ({share:.1%}) at 1e{bins[i]}</title></rect>"
            )
    for i, decade in enumerate(bins):
        if i % 2 == 0:
            parts.append(
                f'<text x="{left + i * step:.1f}" y="{height - bottom + 14}" font-size="10">'
                f"{'≤' if i == 0 else ''}1e{decade}</text>"
            )
    legend = " ".join(f'<tspan fill="{colours.get(n, "#888")}">■ {n}</tspan>' for n in series)
    parts.append(
        f'<text x="{left}" y="12" font-size="11">{html.escape(title)} — {legend} '
        "(share of elements per decade of |relative error|)</text></svg>"
    )
    return "".join(parts)


def write(path: str, dump: str, apis: List[Dict[str, Any]], summary: Dict[str, Any]) -> None:
    totals = counts(apis)
    out = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>API pre-check</title><style>",
        "body{font-family:sans-serif;margin:1.5em} table{border-collapse:collapse;margin:.5em 0} "
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px} th{background:#eee} "
        ".api{margin:1em 0;padding:.5em;border-left:4px solid #c0392b}</style></head><body>",
        f"<h1>API pre-check of {html.escape(dump)}</h1>",
        "<p>"
        + ", ".join(f'<b style="color:{_COLOURS[s]}">{n} {s}</b>' for s, n in totals.items())
        + f" — {summary.get('entries_without_tensors', 0)} API entries without tensors; criteria: "
        f"<code>{html.escape(standards.CRITERIA_HINT)}</code></p>",
    ]
    ordered = failing_first(apis)
    failing = [a for a in ordered if a["status"] in (standards.ERROR, standards.WARNING)]
    out.append(f"<h2>Failing APIs ({len(failing)})</h2>")
    for api in failing:
        out.append(
            f'<div class="api" style="border-color:{_COLOURS[api["status"]]}"><h3>{html.escape(api["api"])}'
            f' <small>{html.escape(api["label"])}</small> — <span style="color:{_COLOURS[api["status"]]}">'
            f"{api['status']}</span></h3><table><tr><th>direction</th><th>tensor</th><th>dtype</th>"
            "<th>metric</th><th>device</th><th>cpu same dtype</th><th>ratio</th><th>threshold</th>"
            "<th>status</th></tr>"
        )
        for row in api["rows"]:
            if row["status"] in (standards.ERROR, standards.WARNING):
                out.append(
                    "<tr>"
                    + "".join(
                        f"<td>{_fmt(row.get(k))}</td>"
                        for k in (
                            "direction",
                            "tensor",
                            "dtype",
                            "metric",
                            "device",
                            "cpu",
                            "ratio",
                            "threshold",
                            "status",
                        )
                    )
                    + "</tr>"
                )
        out.append("</table>")
        for key, series in api["plots"].items():
            out.append(_plot(f"{api['api']} {key}", series) + "<br>")
        out.append("</div>")
    skipped = [a for a in ordered if a["status"] == standards.SKIP]
    out.append(f"<h2>Not replayed ({len(skipped)})</h2><table><tr><th>API</th><th>rank</th><th>why</th></tr>")
    out += [
        f"<tr><td>{html.escape(a['api'])}</td><td>{html.escape(a['label'])}</td>"
        f"<td>{html.escape(a['reason'])}</td></tr>"
        for a in skipped
    ]
    out.append("</table>")
    passed = [a for a in ordered if a["status"] == standards.PASS]
    out.append(f"<h2>Passed ({len(passed)})</h2><p>" + ", ".join(html.escape(a["api"]) for a in passed) + "</p>")
    out.append("</body></html>")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(out))
