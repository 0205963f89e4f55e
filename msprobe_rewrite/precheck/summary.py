"""Per-API verdicts from the rows: an API's status is its worst graded row (error, warning, pass), or skip
when it could not be replayed at all."""

from __future__ import annotations

from typing import Any, Dict, List

from . import standards
from .fp8 import STANDARD as FP8_STANDARD

ORDER = {standards.ERROR: 0, standards.WARNING: 1, standards.SKIP: 2, standards.PASS: 3}


def verdicts(results: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One dict per API call, in dump order: api, label, status, reason (first failing metric or skip reason),
    rows, plots."""
    out = []
    for result in results:
        rows = result["rows"]
        if not rows:
            continue
        graded = [r["status"] for r in rows if r["status"] != standards.INFO]
        status = standards.worst(graded) if graded else standards.PASS
        # forward graded, backward not replayable: the skip is in its row (a float8 range row that passes is no
        # replay: a call that could not be replayed at all stays skip)
        if status == standards.SKIP and any(
            r["status"] == standards.PASS and r.get("standard") != FP8_STANDARD for r in rows
        ):
            status = standards.PASS
        reason = ""
        for row in rows:
            if row["status"] == status and status != standards.PASS:
                where = f"{row['direction']} {row['tensor']}".strip()
                if row.get("standard") == FP8_STANDARD:
                    reason = f"{where}: {row['metric']} {_fmt(row['device'])} (limit {row['threshold']})"
                else:
                    reason = f"{where}: {row['metric']}" + (
                        f" {_fmt(row['device'])} vs cpu {_fmt(row['cpu'])}"
                        if row["metric"] != "replay"
                        else f": {row['message']}"
                    )
                break
        out.append(
            {
                "api": rows[0]["api"],
                "label": rows[0].get("label", ""),
                "status": status,
                "reason": reason,
                "rows": rows,
                "plots": result.get("plots", {}),
                "problem": result.get("problem"),
            }
        )
    return out


def failing_first(apis: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return sorted(apis, key=lambda a: ORDER.get(a["status"], 9))  # stable: dump order within a status


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def counts(apis: List[Dict[str, Any]]) -> Dict[str, int]:
    result = {status: 0 for status in (standards.PASS, standards.WARNING, standards.ERROR, standards.SKIP)}
    for api in apis:
        result[api["status"]] = result.get(api["status"], 0) + 1
    return result
