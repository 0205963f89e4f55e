"""``compare --bit-exact``: the first operator whose inputs are bit-identical in both runs and whose outputs
are not, read from bit-level checksums (msprobe's ``md5``, a CRC32, or our ``fingerprint``).

This is how msprobe's training guide hunts non-determinism and cross-device bit differences: two runs with
``summary_mode`` md5, then the first operator that received the same bits and gave different ones. Entries
are paired as the statistics compare pairs them (``engine``: by API or module, direction, call site and
order) and read in one streaming pass; the verdict follows completion order, so an API inside a module comes
before the module.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

from ..csv_cells import SafeCsvWriter
from .engine import EntryReader, align_sides, check_compatible, index_side
from .errors import CompareError
from .loading import iter_entries, make_out_dir, pair_runs
from ..progress import Progress
from .records import INPUT, pair_tensors, tensors_of

SUMMARY_FILE = "compare_summary.json"
DIFFERING_LIMIT = 8


class _Entry:
    """What the verdict needs of one matched entry."""

    __slots__ = ("position", "inputs_differ", "outputs_differ", "outputs", "differing")

    def __init__(self, position):
        self.position = position
        self.inputs_differ = False
        self.outputs_differ = False
        self.outputs = 0
        self.differing: List[Dict[str, Any]] = []


def _checksum_kind(kinds: set, path: str) -> str:
    if not kinds:
        raise CompareError(
            f"{path} has no md5 or fingerprint values: collect both runs with summary_mode "
            f"'md5' (msprobe's) or 'fingerprint' to compare them bit for bit"
        )
    if len(kinds) > 1:
        raise CompareError(f"{path} mixes checksum kinds {sorted(kinds)}")
    return next(iter(kinds))


def compare_pair_bit_exact(dump_a, dump_b, progress: Progress, writer=None) -> Dict[str, Any]:
    check_compatible(dump_a, dump_b)
    side_a = index_side(dump_a, progress)
    side_b = index_side(dump_b, progress)
    merged = align_sides(side_a, side_b)
    reader_a = EntryReader(iter(iter_entries(dump_a, checked=False)), side_a)
    reader_b = EntryReader(iter(iter_entries(dump_b, checked=False)), side_b)
    kinds_a, kinds_b = set(), set()
    entries: List[_Entry] = []
    tensors = differ = 0
    for position, (i, j) in enumerate(merged):
        entry_a = reader_a.get(i) if i is not None else None
        entry_b = reader_b.get(j) if j is not None else None
        progress.update(position + 1, f"comparing {dump_a.label or 'dump'} bit for bit", len(merged))
        if i is None or j is None:
            continue
        entry = _Entry(position)
        for ta, tb in pair_tensors(tensors_of(entry_a), tensors_of(entry_b)):
            tensor = ta or tb
            role_in = tensor.role == INPUT
            if not role_in:
                entry.outputs += 1
            sum_a = ta.checksum if ta is not None else None
            sum_b = tb.checksum if tb is not None else None
            if sum_a is not None:
                kinds_a.add(sum_a[0])
            if sum_b is not None:
                kinds_b.add(sum_b[0])
            if ta is not None and tb is not None and sum_a is None and sum_b is None:
                continue  # neither side could read the bytes (a meta tensor): nothing to tell
            tensors += 1
            same = (
                ta is not None
                and tb is not None
                and sum_a is not None
                and sum_b is not None
                and sum_a[1] == sum_b[1]
                and ta.dtype == tb.dtype
                and ta.shape == tb.shape
            )
            if writer is not None:
                writer.writerow(
                    [
                        side_a.names[i],
                        side_b.names[j],
                        tensor.suffix,
                        tensor.role,
                        sum_a[1] if sum_a else "",
                        sum_b[1] if sum_b else "",
                        "equal" if same else "differs",
                    ]
                )
            if same:
                continue
            differ += 1
            if role_in:
                entry.inputs_differ = True
            else:
                entry.outputs_differ = True
            if len(entry.differing) < DIFFERING_LIMIT:
                entry.differing.append(
                    {
                        "tensor": tensor.suffix,
                        "role": tensor.role,
                        "a": sum_a[1] if sum_a else None,
                        "b": sum_b[1] if sum_b else None,
                        "dtype_a": ta.dtype if ta else None,
                        "dtype_b": tb.dtype if tb else None,
                        "shape_a": ta.shape if ta else None,
                        "shape_b": tb.shape if tb else None,
                    }
                )
        entries.append(entry)
    reader_a.drain()
    reader_b.drain()
    progress.clear()
    kind_a = _checksum_kind(kinds_a, dump_a.path)
    kind_b = _checksum_kind(kinds_b, dump_b.path)
    if kind_a != kind_b:
        raise CompareError(
            f"the dumps carry different checksums: {dump_a.path} has {kind_a}, {dump_b.path} has "
            f"{kind_b}; collect both runs with the same summary_mode"
        )
    ends = side_a.ends
    order = sorted(entries, key=lambda e: (ends[merged[e.position][0]], -merged[e.position][0]))

    def describe(entry: Optional[_Entry], kind: str) -> Optional[Dict[str, Any]]:
        if entry is None:
            return None
        i, j = merged[entry.position]
        return {
            "entry": side_a.names[i],
            "bench_entry": side_b.names[j],
            "call_site": side_a.sites[i],
            "bench_call_site": side_b.sites[j],
            "kind": kind,
            "differing": entry.differing,
        }

    culprit = next((e for e in order if e.outputs_differ and not e.inputs_differ), None)
    first = next((e for e in order if e.outputs_differ or e.inputs_differ), None)
    return {
        "label": dump_a.label or "dump",
        "checksum": kind_a,
        "entries_compared": len(entries),
        "tensors_compared": tensors,
        "tensors_differ": differ,
        "culprit": describe(culprit, "outputs"),
        "first_difference": describe(first, "inputs" if first is not None and first.inputs_differ else "outputs"),
        "only_a": [side_a.names[i] for i, j in merged if j is None][:100],
        "only_b": [side_b.names[j] for i, j in merged if i is None][:100],
    }


def compare_runs_bit_exact(
    run_a: str, run_b: str, out_dir: Optional[str] = None, progress: Optional[Progress] = None
) -> Dict[str, Any]:
    """Compare every paired dump of two runs bit for bit; the summary's ``culprit`` is the first pair's first
    operator with identical inputs and different outputs (None when every paired tensor is identical)."""
    progress = progress or Progress(enabled=False)
    pairs = pair_runs(run_a, run_b)
    for dump_a, dump_b in pairs:
        check_compatible(dump_a, dump_b)  # every error before any file
    if out_dir is not None:
        make_out_dir(out_dir)
    results = []
    for dump_a, dump_b in pairs:
        handle = writer = None
        if out_dir is not None:
            tag = (dump_a.label or "dump").replace("/", "_")
            handle = open(os.path.join(out_dir, f"compare_result_{tag}.csv"), "w", newline="", encoding="utf-8")
            writer = SafeCsvWriter(handle)
            writer.writerow(["NPU Name", "Bench Name", "Tensor", "Role", "NPU checksum", "Bench checksum", "Result"])
        try:
            results.append(compare_pair_bit_exact(dump_a, dump_b, progress, writer))
        finally:
            if handle is not None:
                handle.close()
    culprit = next((r["culprit"] for r in results if r["culprit"] is not None), None)
    first = next((r["first_difference"] for r in results if r["first_difference"] is not None), None)
    summary = {
        "mode": "bit-exact",
        "run_a": run_a,
        "run_b": run_b,
        "pairs": results,
        "culprit": culprit,
        "first_difference": first,
        "unpaired": {"a": list(getattr(pairs, "unpaired_a", [])), "b": list(getattr(pairs, "unpaired_b", []))},
    }
    if out_dir is not None:
        with open(os.path.join(out_dir, SUMMARY_FILE), "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=1)
    return summary


def terminal_summary(summary: Dict[str, Any]) -> str:
    lines = []
    for pair in summary["pairs"]:
        lines.append(
            f"{pair['label']}: {pair['entries_compared']} entries, {pair['tensors_compared']} tensors "
            f"compared by {pair['checksum']}, {pair['tensors_differ']} differ"
        )
    culprit, first = summary["culprit"], summary["first_difference"]
    if first is None:
        lines.append("bit-identical: every paired tensor has the same bits in both runs")
        return "\n".join(lines)
    if culprit is not None:
        lines.append(
            f"first operator with bit-identical inputs and different outputs: {culprit['entry']}"
            + (f" at {culprit['call_site']}" if culprit["call_site"] else "")
        )
        for item in culprit["differing"]:
            lines.append(f"  {item['tensor']}: {item['a']} != {item['b']}")
    if first is not None and (culprit is None or first["entry"] != culprit["entry"]):
        lines.append(
            f"the first difference is in the inputs of {first['entry']}: it entered through code the "
            f"dump does not record"
        )
    return "\n".join(lines)
