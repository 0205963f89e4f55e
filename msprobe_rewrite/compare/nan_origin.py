"""``msprobe-rewrite nan DUMP``: where NaN or Inf started, from one run's dump (no second run).

Per dump (one step of one rank): the first entry, in execution order, that holds NaN or Inf, and whether it
made it (its inputs finite, an output not) or received it (already in its inputs: it came through code the
dump does not record). Across the run: the earliest step that holds any; within it, the rank that had it
before a collective spread it: the one with the fewest collectives (``Distributed.*``) completed before its
onset (collectives are the only points where ranks wait for one another, so their count is the one clock the
ranks share; a rank that receives NaN through an all_reduce shows it only after that all_reduce, in the next
entry's inputs, as the collective writes in place); at the same count, an onset that is not a collective's
output, then one that made it, then the lowest rank number. msprobe's overflow_check answers the
same question by dumping only the APIs whose outputs overflow; this reads an ordinary statistics (or tensor)
dump, ours or msprobe's.

Each dump is streamed twice (names and nesting, then flags) and a third time up to its onset, to describe
it; nothing is held whole.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .engine import index_side
from .loading import RankDump, discover, iter_entries, read_header
from .names import split_name
from .nonfinite import NONFINITE_IN, can_make, first_nonfinite, nonfinite_flags
from .records import INPUT, tensors_of
from ..progress import Progress

COLLECTIVE_PREFIX = "Distributed."


def is_collective(name: str) -> bool:
    return name.startswith(COLLECTIVE_PREFIX)


def _tensor_text(tensor) -> Dict[str, Any]:
    out: Dict[str, Any] = {"tensor": tensor.suffix, "dtype": tensor.dtype}
    for key, value in zip(("Max", "Min", "Mean", "Norm"), tensor.stats):
        out[key] = value
    if tensor.nan is not None:
        out["NaN_count"] = tensor.nan
    if tensor.inf is not None:
        out["Inf_count"] = tensor.inf
    return out


def _describe(dump: RankDump, index: int) -> Dict[str, List[Dict[str, Any]]]:
    """The non-finite inputs and outputs of the entry at ``index`` (read again, up to that entry only)."""
    for position, (_name, entry) in enumerate(iter_entries(dump, checked=False)):
        if position == index:
            tensors = tensors_of(entry)
            return {
                "nonfinite_inputs": [_tensor_text(t) for t in tensors if t.role == INPUT and t.nonfinite()],
                "nonfinite_outputs": [_tensor_text(t) for t in tensors if t.role != INPUT and t.nonfinite()],
                "inputs": sum(1 for t in tensors if t.role == INPUT),
            }
    return {"nonfinite_inputs": [], "nonfinite_outputs": [], "inputs": 0}


def scan_dump(dump: RankDump, progress: Progress) -> Dict[str, Any]:
    """The first NaN/Inf of one dump: ``{"label", "step", "rank", "entries", "onset"}``, ``onset`` None when
    the dump holds none. CompareError (exit 2) for a dump.json that is unreadable or malformed."""
    read_header(dump)
    side = index_side(dump, progress)  # checks every entry (dump_format) as it reads the names
    for index, (_name, entry) in enumerate(iter_entries(dump, checked=False)):
        side.flags[index] = nonfinite_flags(entry)
        progress.update(index + 1, f"scanning {dump.label or dump.path}", len(side.names))
    progress.clear()
    seen, _made = first_nonfinite(side.names, side.flags, side.ends)
    found: Dict[str, Any] = {
        "label": dump.label or dump.path,
        "path": dump.path,
        "step": dump.step,
        "rank": dump.rank,
        "entries": len(side.names),
        "onset": None,
    }
    if seen is None:
        return found
    name = side.names[seen]
    flags = side.flags[seen]
    if flags & NONFINITE_IN:
        how = "received"  # already in its inputs: made by code the dump does not record, or by another rank
    elif can_make(name):
        how = "made"
    else:
        how = "gradient"  # a parameter gradient, computed by a backward the dump does not record
    onset_at = (side.ends[seen], -seen)
    before = sorted(
        (
            t
            for t, other in enumerate(side.names)
            if is_collective(other) and split_name(other)[1] == "forward" and (side.ends[t], -t) < onset_at
        ),
        key=lambda t: (side.ends[t], -t),
    )
    collectives = len(before)
    # the call site of a backward entry is its forward's (index_side)
    onset: Dict[str, Any] = {
        "entry": name,
        "how": how,
        "call_site": side.sites[seen],
        "collective": is_collective(name),
        "collectives_before": collectives,
        "last_collective": side.names[before[-1]] if before else None,
        "position": seen,
    }
    parent = side.parents[seen]
    onset["inside"] = side.names[parent] if parent >= 0 else None
    onset.update(_describe(dump, seen))
    found["onset"] = onset
    return found


def _origin_key(dump: Dict[str, Any]):
    onset = dump["onset"]
    step = dump["step"] if dump["step"] is not None else -1
    rank = dump["rank"] if dump["rank"] is not None else float("inf")
    # the collectives clock first; at the same count, an onset at a collective's output received it from a
    # rank that made it before that collective, and one that made it beats one that found it in its inputs
    return (step, onset["collectives_before"], onset["collective"], onset["how"] != "made", rank, dump["label"])


def find_origin(run: str, progress: Optional[Progress] = None) -> Dict[str, Any]:
    """Every dump of ``run`` scanned, and the origin: the dump and entry where NaN/Inf started (None when no
    dump holds any)."""
    progress = progress or Progress(enabled=False)
    dumps = [scan_dump(dump, progress) for dump in discover(run)]
    with_onset = [d for d in dumps if d["onset"] is not None]
    origin = None
    if with_onset:
        best = min(with_onset, key=_origin_key)
        origin = dict(best["onset"], label=best["label"], step=best["step"], rank=best["rank"], path=best["path"])
        same_step = [d for d in with_onset if d["step"] == best["step"] and d is not best]
        origin["other_ranks"] = [
            {
                "label": d["label"],
                "rank": d["rank"],
                "entry": d["onset"]["entry"],
                "how": d["onset"]["how"],
                "collective": d["onset"]["collective"],
                "last_collective": d["onset"]["last_collective"],
            }
            for d in sorted(same_step, key=_origin_key)
        ]
    return {"run": run, "dumps": dumps, "dumps_with_nonfinite": len(with_onset), "origin": origin}
