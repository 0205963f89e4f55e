"""``msprobe-rewrite compare RUN_A RUN_B``: align two runs' dumps and name the first divergence.

Modules: ``loading`` finds and streams dumps, ``dump_format`` refuses one that lacks a member msprobe always
writes, ``names`` splits entry names, ``records`` flattens an entry's tensors, ``align`` pairs entries by
sequence alignment, ``metrics`` decides what diverges, ``elementwise`` adds task=tensor metrics (the only user
of torch), ``engine`` runs the two passes over one pair of dumps,
``propagation`` and ``noise`` name the suspects when every entry differs a little, ``headline`` says why
the first suspect and the first divergence differ, ``summary``, ``report_csv``, ``report_html`` and
``report_propagation`` write the results, ``cli`` is the command line; ``nonfinite`` finds where NaN/Inf
first appears in a dump, for compare and for ``msprobe-rewrite nan`` (``nan_origin``, ``nan_cli``);
the progress line is the package-wide ``msprobe_rewrite.progress``.

Neither libcst nor (for statistics dumps) torch is imported: the comparison runs anywhere Python does.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from .engine import check_compatible, compare_pair
from .errors import CompareError
from .loading import make_out_dir, pair_runs
from .metrics import Thresholds
from ..progress import Progress
from .report_csv import CsvSink
from .report_html import render
from .report_propagation import write_csv as write_suspects
from .summary import run_summary

SUMMARY_FILE = "compare_summary.json"
HTML_FILE = "compare_report.html"


def compare_runs(
    run_a: str,
    run_b: str,
    out_dir: Optional[str] = None,
    thresholds: Optional[Dict[str, float]] = None,
    top: int = 10,
    progress: Optional[Progress] = None,
) -> Dict[str, Any]:
    """Compare every paired dump of two runs; write the reports into ``out_dir`` (when given) and return
    the JSON summary (its ``first_divergence`` is None when the runs agree)."""
    limits = Thresholds(thresholds)
    progress = progress or Progress(enabled=False)
    pairs = pair_runs(run_a, run_b)
    tasks = [check_compatible(dump_a, dump_b)[0] for dump_a, dump_b in pairs]  # every error before any file
    if out_dir is not None:
        make_out_dir(out_dir)
    results = []
    for (dump_a, dump_b), task in zip(pairs, tasks):
        sink = None
        if out_dir is not None:
            tag = (dump_a.label or "dump").replace("/", "_")
            sink = CsvSink(os.path.join(out_dir, f"compare_result_{tag}.csv"), task == "tensor")
        try:
            results.append(compare_pair(dump_a, dump_b, limits, progress, sink))
        finally:
            if sink is not None:
                sink.close()
    summary = run_summary(run_a, run_b, results, {"default": limits.default, **limits.table}, top)
    summary["unpaired"] = {"a": list(getattr(pairs, "unpaired_a", [])), "b": list(getattr(pairs, "unpaired_b", []))}
    if out_dir is not None:
        with open(os.path.join(out_dir, SUMMARY_FILE), "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=1)
        with open(os.path.join(out_dir, HTML_FILE), "w", encoding="utf-8") as handle:
            handle.write(render(summary, results, limits.of("torch.float32")))
        for (dump_a, _), pair in zip(pairs, summary["pairs"]):
            tag = (dump_a.label or "dump").replace("/", "_")
            write_suspects(os.path.join(out_dir, f"compare_suspects_{tag}.csv"), pair["suspects"])
    return summary


__all__ = ["compare_runs", "CompareError"]
