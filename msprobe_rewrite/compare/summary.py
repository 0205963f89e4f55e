"""The JSON summary of a comparison and the terminal summary of its top divergences."""

from __future__ import annotations

import heapq
import math
from typing import Any, Dict, List, Optional

from .engine import IN_DIFF, OUT_DIFF, UNMATCHED_LIMIT, PairResult, detail
from .headline import relate
from .propagation import pair_suspects


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float as a string: JSON has no NaN or Infinity, and strict readers
    (JavaScript, jq) reject Python's extension."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict_json(v) for v in value]
    return value


def top_divergences(result: PairResult, count: int) -> List[Dict[str, Any]]:
    """The ``count`` matched entries with the largest output error beyond threshold, worst first."""
    positions = [p for p in result.details if result.flags[p] & OUT_DIFF]
    best = heapq.nlargest(count, positions, key=lambda p: result.worst[p])
    out = []
    for position in best:
        i, j = result.merged[position]
        item = {"entry": result.a.names[i], "bench_entry": result.b.names[j], "call_site": result.a.sites[i]}
        item.update(detail(result, position))
        out.append(item)
    return out


def pair_summary(result: PairResult, top: int) -> Dict[str, Any]:
    only_a, only_b = result.only("a"), result.only("b")
    diverged = sum(1 for f in result.flags if f & (IN_DIFF | OUT_DIFF))
    return {
        "pair": result.label,
        "a": result.a.dump.path,
        "b": result.b.dump.path,
        "step": result.a.dump.step,
        "rank": result.a.dump.rank,
        "task": result.task,
        "level": result.level,
        "entries_a": len(result.a.names),
        "entries_b": len(result.b.names),
        "matched": result.matched(),
        "diverged_entries": diverged,
        "tensors_compared": result.tensors_compared,
        "tensors_diverged": result.tensors_diverged,
        "unmatched_a": only_a[:UNMATCHED_LIMIT],
        "unmatched_b": only_b[:UNMATCHED_LIMIT],
        "unmatched_a_count": len(only_a),
        "unmatched_b_count": len(only_b),
        "first_divergence": result.first_divergence,
        "nan_onset": result.nan_onset,
        "top_divergences": top_divergences(result, top),
        **pair_suspects(result),
    }


def run_summary(
    run_a: str, run_b: str, results: List[PairResult], thresholds: Dict[str, float], top: int
) -> Dict[str, Any]:
    pairs = [pair_summary(r, top) for r in results]
    first: Optional[Dict[str, Any]] = None
    for pair in pairs:  # pairs are in step order, then rank order: the earliest step's divergence wins
        if pair["first_divergence"] is not None:
            first = dict(pair["first_divergence"], pair=pair["pair"], step=pair["step"], rank=pair["rank"])
            break
    suspect: Optional[Dict[str, Any]] = None
    for pair in pairs:  # the same order: the earliest step's first suspect
        if pair["suspects"]:
            suspect = dict(pair["suspects"][0], pair=pair["pair"], step=pair["step"], rank=pair["rank"])
            break
    by_label = {result.label: result for result in results}

    def order_of(label: str, position: int):
        result = by_label.get(label)
        if result is None or not 0 <= position < len(result.merged) or result.merged[position][0] is None:
            return None
        index = result.merged[position][0]
        return result.a.ends[index], -index  # completion order, as the first divergence and the suspects use

    return strict_json(
        {
            "run_a": run_a,
            "run_b": run_b,
            "thresholds": thresholds,
            "first_divergence": first,
            "first_suspect": suspect,
            "views": relate(first, suspect, order_of),
            "pairs": pairs,
        }
    )


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _suspect_line(item: Dict[str, Any], name: bool = True) -> str:
    head = f"{item['entry']:<50} " if name else ""
    return (
        f"{head}{item['tensor']} {item['statistic']}: output error {_fmt(item['output_error'])}, "
        f"input error {_fmt(item['input_error'])} (gain {_fmt(item['gain'])}, {item['op_class']} allows "
        f"{_fmt(item['allowance'])}), noise floor {_fmt(item['noise_floor'])}"
    )


def terminal_summary(summary: Dict[str, Any], top: int) -> str:
    lines = []
    for pair in summary["pairs"]:
        lines.append(
            f"{pair['pair']}: {pair['matched']} entries matched, {pair['unmatched_a_count']} only in A, "
            f"{pair['unmatched_b_count']} only in B; {pair['diverged_entries']} diverge "
            f"({pair['tensors_diverged']} of {pair['tensors_compared']} tensors)"
        )
        for side in ("a", "b"):
            names = pair[f"unmatched_{side}"]
            if names:
                more = pair[f"unmatched_{side}_count"] - min(len(names), 5)
                lines.append(f"  only in {side.upper()}: {', '.join(names[:5])}" + (f" (+{more} more)" if more else ""))
        for side in ("a", "b"):
            onset = pair["nan_onset"].get(side)
            if onset:
                lines.append(
                    f"  NaN/Inf first appears in {side.upper()} at {onset['entry']}"
                    + (f" ({onset['call_site']})" if onset.get("call_site") else "")
                )
        suspects = pair.get("suspects") or []
        if suspects:
            lines.append(
                "  suspects (output error beyond what the inputs' error and the noise floor explain), "
                "in execution order:"
            )
            for item in suspects[:top]:
                lines.append(
                    "    "
                    + _suspect_line(item)
                    + (f"; float8 underflow: {item['fp8_underflow']}" if item.get("fp8_underflow") else "")
                )
        tops = pair["top_divergences"][:top]
        if tops:
            lines.append("  top divergences (decision error of the worst output statistic):")
            for item in tops:
                lines.append(
                    f"    {item['entry']:<50} {item['tensor']:<12} {_fmt(item.get('statistic'))}: "
                    f"A={_fmt(item.get('a'))} B={_fmt(item.get('b'))} error={_fmt(item.get('error'))}"
                )
    suspect = summary.get("first_suspect")
    # one headline, the suspect; the threshold view below it, and why the two differ when they do
    # (tests/compare/test_headline.py)
    if suspect is None:
        lines.append("first suspect: none (every output error is explained by its inputs' error and the noise)")
    else:
        lines.append(
            f"first suspect: {suspect['entry']} in {suspect['pair']}"
            + (f" at {suspect['call_site']}" if suspect.get("call_site") else "")
        )
        lines.append("  " + _suspect_line(suspect, name=False))
        if suspect.get("fp8_underflow"):
            lines.append(f"  float8 underflow: {suspect['fp8_underflow']}")
    first = summary["first_divergence"]
    views = summary.get("views") or {}
    if first is None:
        lines.append("  threshold view, first divergence: none (no tensor differs beyond its dtype's threshold)")
    else:
        if first["kind"] == "outputs":
            how = "its outputs diverge while its inputs agree"
        else:
            how = "its inputs already diverge: the difference entered through code the dump does not show" + (
                f", inside {first['parent']}" if first.get("parent") else ""
            )
        same = suspect is not None and views.get("same")
        lines.append(
            f"  threshold view, first divergence: {first['entry']} in {first['pair']} ({how})"
            + (" - the same entry" if same else "")
        )
        if first.get("call_site") and not same:
            lines.append(f"    at {first['call_site']}")
        if first.get("statistic"):
            lines.append(
                f"    {first['tensor']} {first['statistic']}: A={_fmt(first.get('a'))} "
                f"B={_fmt(first.get('b'))} error={_fmt(first.get('error'))}"
                + (" (NaN/Inf onset)" if first.get("nan_onset") else "")
            )
        if first.get("fp8_underflow"):
            lines.append(f"    float8 underflow: {first['fp8_underflow']}")
        if first.get("chain"):
            lines.append(
                f"    followed by {first['chain_length']} diverging entries: "
                f"{', '.join(first['chain'][:5])}" + (" ..." if first["chain_length"] > 5 else "")
            )
    if views and not views.get("same"):
        lines.append(f"  why they differ: {views['reason']}")
    return "\n".join(lines)
