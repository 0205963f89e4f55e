"""``precheck_summary.json``: counts, the failing APIs with the metric that failed them, the skipped APIs with
their reasons, and the input problems."""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List

from . import standards
from .summary import counts


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def build(dump: str, apis: List[Dict[str, Any]], no_tensor: int, seconds: float, jobs: int) -> Dict[str, Any]:
    return {
        "dump": dump,
        "criteria": standards.CRITERIA_HINT,
        "apis": len(apis),
        "counts": counts(apis),
        "entries_without_tensors": no_tensor,
        "seconds": round(seconds, 3),
        "jobs": jobs,
        "failing": [
            {
                "api": a["api"],
                "rank": a["label"],
                "status": a["status"],
                "reason": a["reason"],
                "metrics": [
                    {
                        k: _clean(r.get(k))
                        for k in ("direction", "tensor", "metric", "device", "cpu", "ratio", "threshold", "status")
                    }
                    for r in a["rows"]
                    if r["status"] in (standards.ERROR, standards.WARNING)
                ],
            }
            for a in apis
            if a["status"] in (standards.ERROR, standards.WARNING)
        ],
        "skipped": [
            {"api": a["api"], "rank": a["label"], "reason": a["reason"]} for a in apis if a["status"] == standards.SKIP
        ],
        "input_problems": [
            {"api": a["api"], "rank": a["label"], "problem": a["problem"]} for a in apis if a.get("problem")
        ],
    }


def write(path: str, summary: Dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=1, ensure_ascii=False)
        handle.write("\n")
