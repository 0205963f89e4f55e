"""``msprobe-rewrite monitor-report DIR``: an HTML page and a terminal summary from a training monitor's output.

DIR is ``$MONITOR_OUTPUT_DIR`` (one ``{stamp}-rank{R}-{id}`` folder per rank, and ``anomaly_detected/``) or one of
those rank folders. The CSV files are msprobe's layout, ``{kind}_{first}-{last}.csv`` with the columns
``vpp_stage,name,step,<ops...>,shape,dtype`` (runtime/monitor/writer.py writes them, msprobe's CSVWriterWithAD too),
and the anomalies ``anomaly_detected/rank{R}/anomaly.json`` (msprobe's GradAnomalyData records).

The page: one plot per metric (kind and op) and layer over steps, inline SVG written here (no plotting library, no
network: one file), grouped per kind and op in collapsible sections so that hundreds of layers stay readable; a plot
keeps at most ``--max-points`` points, downsampled per bucket of steps to the bucket's min and max so that a spike is
never averaged away; NaN/Inf steps are marked on the plot's top edge, anomalies as red dots, both from the full
series. The anomalies are listed in a table, in msprobe's execution order.

The terminal summary names the layers whose gradient norms grew first (``growth_onsets``, docs/monitor.md):
a layer's onset is the first step at which its gradient norm is NaN/Inf, or above ``--factor`` times the median of
its earlier norms (with at least ``MIN_HISTORY`` earlier steps); layers are ranked by onset step, then a layer whose
own weight was NaN/Inf at that step first (the source rather than a receiver), then by growth (norm over median),
then model order.

Exit status: 0 the page was written; 2 bad input (no such folder, no CSV files, TensorBoard output only, a CSV
without msprobe's columns, an unreadable anomaly.json), said in one line on stderr, no traceback.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import html
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from msprobe_runtime.monitor.names import TAG_SUFFIX

PROG = "msprobe-rewrite monitor-report"
EXIT_OK = 0
EXIT_ERROR = 2

# msprobe's MonitorConst.OUTPUT_DIR_PATTERN (core/common/const.py) and csv2tb's CSV_FILE_SUFFIX
RANK_FOLDER = re.compile(r"([\w-]{0,20})-rank(\d{1,5})-")
CSV_NAME = re.compile(r"^(?P<kind>.+)_(?P<first>\d+)-(?P<last>\d+)\.csv$")
NOT_OPS = ("vpp_stage", "name", "step", "shape", "dtype")
# the last part of msprobe's tag name -> the CSV kind (msprobe's name2tag, reversed)
KIND_OF_TAG = {suffix: kind for kind, suffix in TAG_SUFFIX.items()} | {"actv": "actv", "actv_grad": "actv_grad"}
# the kinds in the page's order: gradients first, as the summary reads them
KIND_ORDER = (
    "grad_reduced",
    "grad_unreduced",
    "param_origin",
    "param_updated",
    "exp_avg",
    "exp_avg_sq",
    "adam_update",
    "adam_ratio",
    "other",
    "actv",
    "actv_grad",
)
# msprobe's MonitorConst.TRAIN_STAGE, for GradAnomalyData's order (runtime/monitor/anomalies.py execution_order)
TRAIN_STAGE = {"actv": 0, "actv_grad": 1, "pre_grad": 1, "post_grad": 1, "acc_grad": 1, "exp_avg": 2, "exp_avg_sq": 2}
MESSAGE_OP = re.compile(r"in \('[^']*', '(?P<op>\w+)'\) at step")
MESSAGE_VALUE = re.compile(r"current value (?P<value>\S+?),")

MIN_HISTORY = 3  # earlier steps a median needs before a finite norm can count as growth
WIDTH, HEIGHT, PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 300, 120, 58, 8, 10, 18
MAX_TABLE_ROWS = 1000  # the anomaly table's rows; every anomaly is still marked on its plot
LONG_WORK_S = 2.0  # past this, progress lines on stderr


class ReportError(Exception):
    """Bad input: the message is the one line the user sees."""


@dataclass
class Series:
    rank: int
    kind: str
    layer: str  # "vpp:name", as msprobe's tag
    order: int  # the row's first position in its kind's files: the model's order
    values: Dict[str, Dict[int, float]] = field(default_factory=dict)  # op -> step -> value


@dataclass
class MonitorData:
    series: Dict[Tuple[int, str, str], Series]
    ops: List[str]
    files: int
    rows: int
    anomalies: List[Dict[str, Any]]
    ranks: List[int]


# ---------------------------------------------------------------------------------------------------- reading


def _number(text: str) -> float:
    text = text.strip()
    if text.lower() in ("", "none", "nan"):
        return math.nan
    try:
        return float(text)
    except ValueError:
        return math.nan  # msprobe writes a failed op's figure as None; a text is no figure either


def _rank_folders(root: str) -> List[Tuple[int, str]]:
    found = []
    for entry in sorted(os.listdir(root)):
        path = os.path.join(root, entry)
        match = RANK_FOLDER.match(entry)
        if match and os.path.isdir(path):
            found.append((int(match.group(2)), path))
    return found


def _has_events(folder: str) -> bool:
    return any(name.startswith("events.out.tfevents") for name in os.listdir(folder))


def locate(path: str) -> Tuple[List[Tuple[int, str]], List[str]]:
    """``path`` -> ([(rank, folder with CSV files)], [anomaly.json paths])."""
    if not os.path.exists(path):
        raise ReportError(f"{path}: no such folder")
    if not os.path.isdir(path):
        raise ReportError(f"{path}: not a folder (give $MONITOR_OUTPUT_DIR or one of its *-rank*-* folders)")
    path = os.path.abspath(path)
    folders = _rank_folders(path)
    if folders:
        base = path
    else:
        match = RANK_FOLDER.match(os.path.basename(path))
        folders = [(int(match.group(2)) if match else 0, path)]
        base = os.path.dirname(path)
    with_csv = [(rank, folder) for rank, folder in folders if any(CSV_NAME.match(n) for n in os.listdir(folder))]
    if not with_csv:
        if any(_has_events(folder) for _, folder in folders):
            raise ReportError(
                f'{path}: TensorBoard event files only; the report reads the CSV output: set "format": "csv" in '
                "the monitor config (msprobe's default)"
            )
        raise ReportError(
            f"{path}: no monitor CSV files ({{kind}}_{{first}}-{{last}}.csv) here nor in *-rank*-* folders below it"
        )
    ranks = {rank for rank, _ in with_csv}
    anomaly_files = []
    detected = os.path.join(base, "anomaly_detected")
    if os.path.isdir(detected):
        for entry in sorted(os.listdir(detected)):
            rank_match = re.fullmatch(r"rank(\d+)", entry)
            candidate = os.path.join(detected, entry, "anomaly.json")
            if rank_match and int(rank_match.group(1)) in ranks and os.path.isfile(candidate):
                anomaly_files.append(candidate)
    return with_csv, anomaly_files


def execution_order(item: Dict[str, Any]) -> Tuple[int, ...]:
    """msprobe's GradAnomalyData.__lt__ (runtime/monitor/anomalies.py execution_order)."""
    stage = TRAIN_STAGE.get(str(item.get("tag_name", "")).split("/")[-1], -1)
    sign = 1 if stage == 0 else -1
    return (
        int(item.get("step", 0)),
        int(item.get("micro_step", 0)),
        stage,
        sign * int(item.get("vpp_stage", 0)),
        sign * int(item.get("pp_stage", 0)),
        int(item.get("call_id", 0)),
    )


def _read_anomalies(paths: Iterable[str]) -> List[Dict[str, Any]]:
    records: List[Dict[str, Any]] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as handle:
                loaded = json.load(handle)
        except (OSError, ValueError) as error:
            raise ReportError(f"{path}: not readable as JSON ({error})") from None
        items = loaded.values() if isinstance(loaded, dict) else loaded if isinstance(loaded, list) else None
        if items is None:
            raise ReportError(f"{path}: expected msprobe's anomaly records (a JSON object of records)")
        for item in items:
            if not isinstance(item, dict) or "tag_name" not in item or "step" not in item:
                raise ReportError(f"{path}: a record without tag_name and step: {str(item)[:120]}")
            tag = str(item["tag_name"]).split("/")
            match = MESSAGE_OP.search(str(item.get("message", "")))
            value = MESSAGE_VALUE.search(str(item.get("message", "")))
            enriched = dict(item)
            enriched["layer"] = tag[0]
            enriched["kind"] = KIND_OF_TAG.get(tag[-1], tag[-1])
            enriched["op"] = match.group("op") if match else None
            enriched["value"] = _number(value.group("value")) if value else math.nan
            records.append(enriched)
    records.sort(key=lambda item: (execution_order(item), int(item.get("rank", 0))))
    return records


def read(path: str, progress: "Progress") -> MonitorData:
    folders, anomaly_files = locate(path)
    series: Dict[Tuple[int, str, str], Series] = {}
    ops: List[str] = []
    files = rows = 0
    order: Dict[Tuple[int, str], int] = {}
    for rank, folder in folders:
        names = sorted(
            (name for name in os.listdir(folder) if CSV_NAME.match(name)),
            key=lambda name: (int(CSV_NAME.match(name).group("first")), name),  # type: ignore[union-attr]
        )
        for name in names:
            kind = CSV_NAME.match(name).group("kind")  # type: ignore[union-attr]
            file_path = os.path.join(folder, name)
            try:
                with open(file_path, newline="", encoding="utf-8") as handle:
                    reader = csv.reader(handle)
                    header = next(reader, None)
                    if header is None:
                        continue  # an empty file: a step cut short
                    if "name" not in header or "step" not in header:
                        raise ReportError(
                            f"{file_path}: not a monitor CSV (expected msprobe's columns vpp_stage,name,step,<ops>; "
                            f"got {','.join(header)[:120]})"
                        )
                    at = {column: index for index, column in enumerate(header)}
                    file_ops = [column for column in header if column not in NOT_OPS]
                    for op in file_ops:
                        if op not in ops:
                            ops.append(op)
                    for line_number, line in enumerate(reader, 2):
                        if not line:
                            continue
                        if len(line) < len(header):
                            raise ReportError(
                                f"{file_path}:{line_number}: {len(line)} fields, the header has {len(header)}"
                            )
                        try:
                            step = int(line[at["step"]])
                        except ValueError:
                            raise ReportError(
                                f"{file_path}:{line_number}: step {line[at['step']]!r} is not a whole number"
                            ) from None
                        vpp = line[at["vpp_stage"]] if "vpp_stage" in at else "0"
                        layer = f"{vpp}:{line[at['name']]}"
                        key = (rank, kind, layer)
                        entry = series.get(key)
                        if entry is None:
                            position = order.setdefault((rank, kind), 0)
                            order[(rank, kind)] = position + 1
                            entry = series[key] = Series(rank, kind, layer, position)
                        for op in file_ops:
                            entry.values.setdefault(op, {})[step] = _number(line[at[op]])
                        rows += 1
            except (OSError, UnicodeDecodeError, csv.Error) as error:
                raise ReportError(f"{file_path}: not readable ({error})") from None
            files += 1
            progress.tick(f"read {files} CSV files, {rows} rows")
    if not series:
        raise ReportError(f"{path}: the monitor CSV files hold no rows")
    return MonitorData(series, ops, files, rows, _read_anomalies(anomaly_files), sorted({r for r, _ in folders}))


# ---------------------------------------------------------------------------------------------------- analysis


def downsample(points: Sequence[Tuple[int, float]], cap: int) -> List[Tuple[int, float]]:
    """At most ``cap`` of the finite ``points`` (step order kept): each of ``cap // 2`` buckets of consecutive
    points keeps its smallest and its largest, so a one-step spike or dip survives any cap."""
    finite = [point for point in points if math.isfinite(point[1])]
    if len(finite) <= cap:
        return finite
    buckets = max(1, cap // 2)
    kept: List[Tuple[int, float]] = []
    for index in range(buckets):
        chunk = finite[index * len(finite) // buckets : (index + 1) * len(finite) // buckets]
        if not chunk:
            continue
        low = min(range(len(chunk)), key=lambda i: chunk[i][1])
        high = max(range(len(chunk)), key=lambda i: chunk[i][1])
        kept.extend(chunk[i] for i in sorted({low, high}))
    return kept


def _median(ordered: Sequence[float]) -> float:
    count = len(ordered)
    if not count:
        return math.nan
    middle = count // 2
    return ordered[middle] if count % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclass
class Onset:
    rank: int
    layer: str
    kind: str
    step: int
    norm: float
    median: float
    weight_bad: bool
    order: int

    @property
    def growth(self) -> float:
        if not math.isfinite(self.norm):
            return math.inf
        return self.norm / self.median if self.median > 0 else math.inf


def growth_onsets(data: MonitorData, factor: float) -> List[Onset]:
    """The layers whose gradient norm grew, first first (the module's docstring defines the order)."""
    onsets = []
    wanted = "grad_reduced" if any(key[1] == "grad_reduced" for key in data.series) else "grad_unreduced"
    for (rank, kind, layer), entry in data.series.items():
        if kind != wanted or "norm" not in entry.values:
            continue
        norms = sorted(entry.values["norm"].items())
        earlier: List[float] = []  # the finite norms of the earlier steps, sorted: the median in O(1)
        for step, norm in norms:
            median = _median(earlier)
            grew = not math.isfinite(norm) or (len(earlier) >= MIN_HISTORY and norm > factor * median)
            if grew:
                weight = data.series.get((rank, "param_origin", layer))
                weight_bad = weight is not None and any(
                    not math.isfinite(values.get(step, 0.0)) or (op == "nans" and values.get(step, 0.0) > 0)
                    for op, values in weight.values.items()
                    if op in ("min", "max", "norm", "mean", "nans")
                )
                onsets.append(Onset(rank, layer, kind, step, norm, median, weight_bad, entry.order))
                break
            bisect.insort(earlier, norm)
    onsets.sort(key=lambda onset: (onset.step, not onset.weight_bad, -onset.growth, onset.rank, onset.order))
    return onsets


# ---------------------------------------------------------------------------------------------------- the page


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"


def _svg(entry: Series, op: str, marks: List[Dict[str, Any]], cap: int, anchor: str, title: str) -> Tuple[str, int]:
    values = entry.values.get(op, {})
    points = sorted(values.items())
    kept = downsample(points, cap)
    bad = [step for step, value in points if not math.isfinite(value)]
    steps = [step for step, _ in points] or [0]
    x_low, x_high = min(steps), max(steps)
    finite = [value for _, value in points if math.isfinite(value)]
    y_low, y_high = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if y_high == y_low:
        y_low, y_high = y_low - 0.5 * (abs(y_low) or 1.0), y_high + 0.5 * (abs(y_high) or 1.0)
    plot_w, plot_h = WIDTH - PAD_LEFT - PAD_RIGHT, HEIGHT - PAD_TOP - PAD_BOTTOM

    def x_of(step: int) -> float:
        return PAD_LEFT + (plot_w * (step - x_low) / (x_high - x_low) if x_high > x_low else plot_w / 2)

    def y_of(value: float) -> float:
        return PAD_TOP + plot_h * (y_high - value) / (y_high - y_low)

    parts = [
        f'<svg class="plot" id="{anchor}" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'data-kind="{html.escape(entry.kind)}" data-op="{html.escape(op)}" data-layer="{html.escape(entry.layer)}" '
        f'data-rank="{entry.rank}" data-points="{len(kept)}" data-steps="{len(points)}">',
        f"<title>{html.escape(title)}</title>",
        f'<rect x="{PAD_LEFT}" y="{PAD_TOP}" width="{plot_w}" height="{plot_h}" class="frame"/>',
        f'<text x="{PAD_LEFT - 3}" y="{PAD_TOP + 8}" class="yl">{_fmt(y_high)}</text>',
        f'<text x="{PAD_LEFT - 3}" y="{PAD_TOP + plot_h}" class="yl">{_fmt(y_low)}</text>',
        f'<text x="{PAD_LEFT}" y="{HEIGHT - 4}" class="xl">{x_low}</text>',
        f'<text x="{WIDTH - PAD_RIGHT}" y="{HEIGHT - 4}" class="xl end">{x_high}</text>',
    ]
    # one polyline per run of finite points: a NaN step breaks the line rather than joining across it
    runs: List[List[Tuple[int, float]]] = [[]]
    previous = None
    for step, value in kept:
        if previous is not None and bisect.bisect_right(bad, previous) < bisect.bisect_left(bad, step):
            runs.append([])
        runs[-1].append((step, value))
        previous = step
    for run in runs:
        if len(run) == 1:
            step, value = run[0]
            parts.append(f'<circle class="pt" cx="{x_of(step):.1f}" cy="{y_of(value):.1f}" r="1.5"/>')
        elif run:
            coordinates = " ".join(f"{x_of(step):.1f},{y_of(value):.1f}" for step, value in run)
            parts.append(f'<polyline class="line" points="{coordinates}"/>')
    # one mark per run of consecutive NaN/Inf steps (a NaN that stays for 10,000 steps is one band, not 10,000)
    index_of = {step: index for index, (step, _) in enumerate(points)} if bad else {}
    spans: List[List[int]] = []
    for step in bad:
        if spans and index_of[step] == index_of[spans[-1][1]] + 1:
            spans[-1][1] = step
        else:
            spans.append([step, step])
    for first, last in spans:
        left, right = x_of(first) - 3, x_of(last) + 3
        what = sorted({str(values[step]) for step in (first, last)})
        parts.append(
            f'<path class="nonfinite" data-step="{first}" data-last="{last}" d="M{left:.1f},{PAD_TOP - 1} '
            f'L{right:.1f},{PAD_TOP - 1} L{right - 3:.1f},{PAD_TOP + 5} L{left + 3:.1f},{PAD_TOP + 5}Z"><title>'
            f"steps {first}-{last}: {'/'.join(what)}</title></path>"
        )
    for mark in marks:
        step = int(mark["step"])
        value = values.get(step, mark.get("value", math.nan))
        y = y_of(value) if math.isfinite(value) else PAD_TOP + 2
        y = min(max(y, PAD_TOP), PAD_TOP + plot_h)
        parts.append(
            f'<circle class="anomaly" data-step="{step}" cx="{x_of(step):.1f}" cy="{y:.1f}" r="4">'
            f"<title>{html.escape(str(mark.get('message', '')))}</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts), len(kept)


STYLE = """
body{font-family:system-ui,sans-serif;margin:1em 2em;color:#222}
h1{font-size:1.3em} h2{font-size:1.1em}
table{border-collapse:collapse;font-size:.85em} td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
details{margin:.3em 0} summary{cursor:pointer;font-weight:600}
details details{margin-left:1.2em} .grid{display:flex;flex-wrap:wrap;gap:6px}
figure{margin:0;border:1px solid #eee} figcaption{font-size:.75em;max-width:300px;overflow-wrap:anywhere}
svg .frame{fill:#fafafa;stroke:#ccc} svg .line{fill:none;stroke:#1f77b4;stroke-width:1.2}
svg .pt{fill:#1f77b4} svg .anomaly{fill:#d62728;fill-opacity:.8} svg .nonfinite{fill:#ff7f0e}
svg text{font-size:9px;fill:#555} svg .yl{text-anchor:end} svg .end{text-anchor:end}
.bad{color:#d62728}
"""


def _kind_rank(kind: str) -> Tuple[int, str]:
    return (KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER), kind)


def render(
    data: MonitorData, onsets: List[Onset], source: str, cap: int, ops: Sequence[str], progress: "Progress"
) -> Tuple[str, int]:
    """The page's text and the number of plots."""
    many_ranks = len(data.ranks) > 1
    marks: Dict[Tuple[int, str, str, str], List[Dict[str, Any]]] = {}
    for record in data.anomalies:
        for op in [record["op"]] if record["op"] else ops:
            marks.setdefault((int(record.get("rank", 0)), record["kind"], record["layer"], op), []).append(record)
    kinds = sorted({kind for _, kind, _ in data.series}, key=_kind_rank)
    steps = sorted({step for entry in data.series.values() for per in entry.values.values() for step in per})
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>monitor report</title>',
        f"<style>{STYLE}</style></head><body>",
        "<h1>Training monitor report</h1>",
        f"<p>{html.escape(source)}: {len(data.ranks)} rank(s), {len(kinds)} kind(s), "
        f"{len({layer for _, _, layer in data.series})} layer(s), steps {steps[0]}–{steps[-1]} ({len(steps)} with "
        f"figures), {data.files} CSV files. A plot keeps at most {cap} points: the min and max of each bucket of "
        "steps. Red dots: anomalies; orange triangles: NaN/Inf.</p>",
    ]
    anchors: Dict[Tuple[int, str, str, str], str] = {}
    plot_number = 0
    sections = []
    for kind in kinds:
        layers = sorted(
            (entry for (_, k, _), entry in data.series.items() if k == kind), key=lambda e: (e.rank, e.order)
        )
        kind_parts = []
        kind_marked = False
        for op in ops:
            if not any(op in entry.values for entry in layers):
                continue
            figures = []
            op_marked = False
            for entry in layers:
                if op not in entry.values:
                    continue
                plot_number += 1
                anchor = f"p{plot_number}"
                key = (entry.rank, kind, entry.layer, op)
                anchors[key] = anchor
                own = marks.get(key, [])
                op_marked = op_marked or bool(own) or any(not math.isfinite(v) for v in entry.values[op].values())
                label = (f"rank{entry.rank} " if many_ranks else "") + entry.layer
                svg, _ = _svg(entry, op, own, cap, anchor, f"{kind} {op} {label}")
                figures.append(
                    f"<figure>{svg}<figcaption>{html.escape(label)}{' ⚠' if own else ''}</figcaption></figure>"
                )
                progress.tick(f"wrote {plot_number} plots")
            kind_marked = kind_marked or op_marked
            opened = " open" if op_marked or (kind == kinds[0] and op == "norm") else ""
            kind_parts.append(
                f'<details class="op" data-op="{html.escape(op)}"{opened}><summary>{html.escape(kind)} · '
                f'{html.escape(op)} ({len(figures)} layers)</summary><div class="grid">{"".join(figures)}</div>'
                "</details>"
            )
        opened = " open" if kind_marked or kind == kinds[0] else ""
        sections.append(
            f'<details class="kind" data-kind="{html.escape(kind)}"{opened}><summary>{html.escape(kind)} '
            f"({len(layers)} layers)</summary>{''.join(kind_parts)}</details>"
        )
    out.append(f"<h2>Anomalies ({len(data.anomalies)})</h2>")
    if data.anomalies:
        out.append(
            '<table class="anomalies"><tr><th>#</th><th>step</th><th>rank</th><th>layer</th><th>kind</th><th>op</th>'
            "<th>value</th><th>message</th></tr>"
        )
        for number, record in enumerate(data.anomalies[:MAX_TABLE_ROWS], 1):
            link = anchors.get((int(record.get("rank", 0)), record["kind"], record["layer"], record["op"] or "norm"))
            layer = html.escape(record["layer"])
            cell = f'<a href="#{link}">{layer}</a>' if link else layer
            out.append(
                f'<tr class="anomaly" data-step="{record["step"]}" data-layer="{layer}"><td>{number}</td>'
                f"<td>{record['step']}</td><td>{record.get('rank', 0)}</td><td>{cell}</td>"
                f"<td>{html.escape(record['kind'])}</td><td>{html.escape(str(record['op']))}</td>"
                f"<td>{_fmt(record['value'])}</td><td>{html.escape(str(record.get('message', '')))}</td></tr>"
            )
        out.append("</table>")
        if len(data.anomalies) > MAX_TABLE_ROWS:
            out.append(f"<p>... and {len(data.anomalies) - MAX_TABLE_ROWS} more (marked on the plots).</p>")
    else:
        out.append("<p>None recorded (no anomaly_detected/rank*/anomaly.json, or no rule fired).</p>")
    out.append(f"<h2>Gradient norms that grew first ({len(onsets)})</h2>")
    if onsets:
        out.append(
            '<table class="onsets"><tr><th>#</th><th>layer</th><th>step</th><th>norm</th><th>median before</th>'
            "<th>growth</th><th>own weight NaN/Inf</th></tr>"
        )
        for number, onset in enumerate(onsets, 1):
            out.append(
                f'<tr class="onset" data-layer="{html.escape(onset.layer)}" data-step="{onset.step}"><td>{number}</td>'
                f"<td>{html.escape(_label(onset, many_ranks))}</td><td>{onset.step}</td><td>{_fmt(onset.norm)}</td>"
                f"<td>{_fmt(onset.median)}</td><td>{_fmt(onset.growth)}</td><td>{'yes' if onset.weight_bad else ''}"
                "</td></tr>"
            )
        out.append("</table>")
    else:
        out.append("<p>No layer's gradient norm grew past the threshold.</p>")
    out.append("<h2>Plots</h2>")
    out.extend(sections)
    out.append("</body></html>\n")
    return "\n".join(out), plot_number


def _label(onset: Onset, many_ranks: bool) -> str:
    return (f"rank{onset.rank} " if many_ranks else "") + onset.layer


# ---------------------------------------------------------------------------------------------------- the command


class Progress:
    """Progress lines on stderr once the work has taken ``LONG_WORK_S``, at most one a second."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.start = self.last = time.monotonic()

    def tick(self, text: str) -> None:
        now = time.monotonic()
        if self.quiet or now - self.start < LONG_WORK_S or now - self.last < 1.0:
            return
        self.last = now
        print(f"{PROG}: {text} ...", file=sys.stderr)

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"{PROG}: {text}", file=sys.stderr)


def summary_lines(data: MonitorData, onsets: List[Onset], factor: float, top: int) -> List[str]:
    many_ranks = len(data.ranks) > 1
    lines = []
    if data.anomalies:
        first = data.anomalies[0]
        lines.append(
            f"anomalies: {len(data.anomalies)}; earliest: step {first['step']}, "
            + (f"rank {first.get('rank', 0)}, " if many_ranks else "")
            + f"{first['layer']} ({first['kind']} {first['op']} = {_fmt(first['value'])})"
        )
    else:
        lines.append("anomalies: none recorded")
    if onsets:
        lines.append(f"gradient norms that grew first (NaN/Inf, or above {factor:g}x the median of earlier steps):")
        for number, onset in enumerate(onsets[:top], 1):
            why = "NaN/Inf" if not math.isfinite(onset.norm) else f"{_fmt(onset.growth)}x median {_fmt(onset.median)}"
            weight = ", own weight NaN/Inf" if onset.weight_bad else ""
            lines.append(
                f"  {number}. {_label(onset, many_ranks)}  step {onset.step}  norm {_fmt(onset.norm)} ({why}{weight})"
            )
        if len(onsets) > top:
            lines.append(f"  ... {len(onsets) - top} more in the report")
    else:
        lines.append(f"gradient norms: none grew past {factor:g}x the median of earlier steps, none NaN/Inf")
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Write an HTML report of a training monitor's output (TrainerMon, ours or msprobe's: CSV "
        "format): one plot per metric and layer over steps, anomalies marked and listed; print which layers' "
        "gradient norms grew first.",
        epilog="DIR is $MONITOR_OUTPUT_DIR (its *-rank*-* folders and anomaly_detected/) or one *-rank*-* folder. "
        "A layer's onset is the first step its gradient norm (grad_reduced, else grad_unreduced) is NaN/Inf or "
        "above FACTOR times the median of its earlier norms (3 earlier steps at least); layers are ranked by "
        "onset step, then those whose own weight was NaN/Inf then, then by growth. Exit status: 0 report "
        "written, 2 bad input.",
    )
    parser.add_argument("dir", metavar="DIR")
    parser.add_argument("-o", "--output", metavar="FILE", help="the HTML file (default DIR/monitor_report.html)")
    parser.add_argument(
        "--factor", type=float, default=10.0, help="growth over the median of earlier steps that counts (10)"
    )
    parser.add_argument("--top", type=int, default=10, metavar="N", help="layers listed on the terminal (10)")
    parser.add_argument(
        "--max-points", type=int, default=200, metavar="N", help="points kept per plot: min and max per bucket (200)"
    )
    parser.add_argument("--ops", metavar="OPS", help="comma-separated ops to plot (default: every op in the CSV)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    progress = Progress(args.quiet)
    try:
        if args.max_points < 4:
            raise ReportError(f"--max-points: at least 4, got {args.max_points}")
        if not args.factor > 1:
            raise ReportError(f"--factor: above 1, got {args.factor}")
        data = read(args.dir, progress)
        numeric = [op for op in data.ops if any(op in entry.values for entry in data.series.values())]
        if args.ops:
            ops = [op.strip() for op in args.ops.split(",") if op.strip()]
            unknown = [op for op in ops if op not in numeric]
            if unknown:
                raise ReportError(f"--ops: {', '.join(unknown)} not in the CSV files (they hold {', '.join(numeric)})")
        else:
            ops = numeric
        progress.say(
            f"read {data.files} CSV files ({data.rows} rows, {len(data.ranks)} rank(s)) and "
            f"{len(data.anomalies)} anomaly record(s)"
        )
        onsets = growth_onsets(data, args.factor)
        page, plots = render(data, onsets, args.dir, args.max_points, ops, progress)
        output = args.output or os.path.join(args.dir, "monitor_report.html")
        folder = os.path.dirname(os.path.abspath(output))
        try:
            os.makedirs(folder, exist_ok=True)
            temporary = output + ".tmp"
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.write(page)
            os.replace(temporary, output)
        except OSError as error:
            raise ReportError(f"{output}: cannot write ({error})") from None
    except ReportError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    progress.say(f"wrote {plots} plots to {output} ({len(page.encode()) // 1024} KiB)")
    if not args.quiet:
        print("\n".join(summary_lines(data, onsets, args.factor, args.top)))
    return EXIT_OK
