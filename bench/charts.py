"""Horizontal bar charts as SVG for docs/ (no matplotlib needed), shared by the benchmarks."""


def bar_chart(rows, title, marks, path, left=300, width=760):
    """``rows``: (label, value or None, text, colour); a row without a value shows its text in red.
    ``marks``: (value, label) dashed vertical lines."""
    bar, gap = 16, 6
    values = [value for _, value, _, _ in rows if value is not None]
    scale = (width - left - 110) / max(values + [mark for mark, _ in marks] + [1e-9])
    height = 40 + len(rows) * (bar + gap) + 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<text x="{left}" y="18" font-weight="bold">{title}</text>',
    ]
    y = 34
    for label, value, text, colour in rows:
        parts.append(f'<text x="{left - 8}" y="{y + bar - 4}" text-anchor="end">{label}</text>')
        if value is not None:
            parts.append(f'<rect x="{left}" y="{y}" width="{value * scale:.1f}" height="{bar}" fill="{colour}"/>')
            parts.append(f'<text x="{left + value * scale + 4:.1f}" y="{y + bar - 4}">{text}</text>')
        else:
            parts.append(f'<text x="{left + 4}" y="{y + bar - 4}" fill="#c33">{text}</text>')
        y += bar + gap
    for mark, label in marks:
        x = left + mark * scale
        parts.append(f'<line x1="{x:.1f}" y1="28" x2="{x:.1f}" y2="{y}" stroke="#333" stroke-dasharray="3,3"/>')
        parts.append(f'<text x="{x:.1f}" y="{y + 14}" text-anchor="middle">{label}</text>')
    parts.append("</svg>")
    with open(path, "w") as handle:
        handle.write("\n".join(parts) + "\n")
