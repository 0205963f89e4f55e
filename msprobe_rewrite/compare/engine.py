"""Compare one pair of dumps (one step and rank of each run) in two streaming passes.

Pass 1 reads each dump's entry names (with call sites from stack.json and nesting from construct.json) and
aligns them. Pass 2 reads both dumps again side by side in the aligned order (alignment is monotone on both
sides, so each file is read front to back once), compares each matched entry's tensors, writes CSV rows as
it goes, and keeps per entry only a few numbers: whether inputs and outputs diverge, the worst error, and
the error of each statistic for the plot. Neither dump, nor any tensor, is ever held whole.
"""

from __future__ import annotations

import math
import os
from array import array
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import fp8
from .align import Pair, align
from .errors import CompareError
from .loading import RankDump, iter_entries, read_call_sites, read_construct, read_header
from .metrics import Thresholds, TensorDiff, apply_elementwise, compare_tensors
from .names import forward_name, is_module, split_name
from .nonfinite import NONFINITE_IN, NONFINITE_OUT, first_nonfinite, nonfinite_flags
from ..progress import Progress
from .propagation import Tracker
from .records import INPUT, OUTPUT, STATS, pair_tensors, tensors_of

CHAIN_LIMIT = 20
UNMATCHED_LIMIT = 1000

# flag bits per entry (and NONFINITE_IN, NONFINITE_OUT: 4, 8, from ``nonfinite``)
IN_DIFF, OUT_DIFF = 1, 2


class Side:
    """What pass 1 keeps of one dump: names, call sites, alignment keys, execution-order positions."""

    def __init__(self, dump: RankDump):
        self.dump = dump
        self.names: List[str] = []
        self.sites: List[Optional[str]] = []
        self.keys: List[Tuple[str, str, Optional[str]]] = []
        self.ends: List[int] = []
        self.parents = array("l")  # index of the enclosing module's entry (construct.json), -1 for none
        self.flags = bytearray()  # NONFINITE_* bits per entry, filled in pass 2


def _short_site(site: Optional[str]) -> Optional[str]:
    # two checkouts (or two machines) put the same file under different roots; the file name and line agree
    if site is None:
        return None
    path, _, line = site.rpartition(":")
    return f"{os.path.basename(path)}:{line}"


def index_side(dump: RankDump, progress: Progress) -> Side:
    side = Side(dump)
    sites = read_call_sites(dump)
    construct = read_construct(dump)
    position: Dict[str, int] = {}
    parents: List[Optional[str]] = []
    for count, (name, _entry) in enumerate(iter_entries(dump)):
        site = sites.get(name)
        if site is None:
            forward = forward_name(name)
            site = sites.get(forward) if forward else None
        base, direction, _index = split_name(name)
        side.names.append(name)
        side.sites.append(site)
        side.keys.append((fp8.twin_base(base), direction, _short_site(site)))
        position[name] = count
        parents.append(construct.get(name))
        progress.update(count + 1, f"reading {dump.label or dump.path}")
    del sites, construct
    # execution order by completion: a module's entry (often written when the module starts) ends after
    # its last nested entry, so an API inside a module comes before the module that contains it
    side.parents = array("l", (position.get(p, -1) if p is not None else -1 for p in parents))
    ends = list(range(len(side.names)))
    for index in range(len(ends) - 1, -1, -1):
        target = side.parents[index]
        if target >= 0 and ends[index] > ends[target]:
            ends[target] = ends[index]
    side.ends = ends
    side.flags = bytearray(len(side.names))
    return side


def _coarse(key):
    return key[0], key[1]


class PairResult:
    """Everything reported about one pair of dumps."""

    def __init__(self, a: Side, b: Side, task: str, level: str):
        self.a, self.b = a, b
        self.task, self.level = task, level
        self.merged: List[Tuple[Optional[int], Optional[int]]] = []
        self.flags = bytearray()
        self.worst = array("d")
        self.stat_errors = [array("d") for _ in STATS]  # per merged position, max over outputs; NaN: none
        self.input_worst: Dict[int, float] = {}  # position -> worst input error, for diverging entries only
        self.details: Dict[int, tuple] = {}  # position -> DETAIL_FIELDS values, for diverging entries only
        self.first_divergence: Optional[Dict[str, Any]] = None
        self.nan_onset: Dict[str, Optional[Dict[str, Any]]] = {"a": None, "b": None}
        self.tensors_compared = 0
        self.tensors_diverged = 0
        self.propagation: Dict[str, Any] = {"noise_floor": {}, "suspects": [], "series": None}  # Tracker.finish
        # float8 zero-share findings (fp8.py): of matched entries by merged position (Tracker.fp8), of entries on
        # one side only by their index in that side
        self.fp8: Dict[int, list] = {}
        self.fp8_a: Dict[int, list] = {}
        self.fp8_b: Dict[int, list] = {}

    @property
    def label(self) -> str:
        return self.a.dump.label or "dump"

    def matched(self) -> int:
        return sum(1 for i, j in self.merged if i is not None and j is not None)

    def only(self, side: str) -> List[str]:
        if side == "a":
            return [self.a.names[i] for i, j in self.merged if j is None]
        return [self.b.names[j] for i, j in self.merged if i is None]


def check_compatible(a: RankDump, b: RankDump) -> Tuple[str, str]:
    ha, hb = read_header(a), read_header(b)
    for field in ("level", "task"):
        if ha.get(field) != hb.get(field):
            raise CompareError(
                f"the dumps have different {field}s: {a.path} is {field}={ha.get(field)!r}, "
                f"{b.path} is {field}={hb.get(field)!r}; dump both runs with the same {field}"
            )
    return str(ha.get("task")), str(ha.get("level"))


def _entry_flags(diffs: List[TensorDiff]) -> Tuple[int, int]:
    """(flags of A, flags of B): which of the entry's inputs/outputs diverge or hold NaN/Inf."""
    flags = 0
    nonfinite_a = nonfinite_b = 0
    for diff in diffs:
        tensor = diff.a or diff.b
        role_in = tensor.role == INPUT
        if diff.exceeds:
            flags |= IN_DIFF if role_in else OUT_DIFF
        if diff.nonfinite_a:
            nonfinite_a |= NONFINITE_IN if role_in else NONFINITE_OUT
        if diff.nonfinite_b:
            nonfinite_b |= NONFINITE_IN if role_in else NONFINITE_OUT
    return flags | nonfinite_a, nonfinite_b


class EntryReader:
    """One side's entries in the second pass, streamed; an entry asked for ahead of the stream's position
    leaves the ones read past in a buffer until they are asked for (only module entries paired out of order
    are, see ``pair_modules_by_name``), so memory holds just the entries between the two orders."""

    def __init__(self, entries: Iterator, side: Side):
        self.entries = entries
        self.side = side
        self.position = 0
        self.buffer: Dict[int, Any] = {}

    def get(self, index: int) -> Any:
        if index in self.buffer:
            return self.buffer.pop(index)
        while True:
            name, entry = next(self.entries, (None, None))
            position, self.position = self.position, self.position + 1
            if position >= len(self.side.names) or name != self.side.names[position]:
                raise CompareError(f"{self.side.dump.path} changed while it was being compared")
            if position == index:
                return entry
            self.buffer[position] = entry

    def drain(self) -> None:
        for _ in self.entries:
            pass


def pair_modules_by_name(merged: List[Pair], names_a: List[str], names_b: List[str]) -> List[Pair]:
    """Pair the module entries that the alignment left unmatched on both sides under the same name.

    A module's backward entry is written after its children's here and before them by msprobe (and its index
    counts the module's own calls, so the name says which call it is): in order, the two runs cross, and no
    order-keeping alignment can match both. Such an entry takes the place of its A side."""
    only_a = {
        fp8.twin_name(names_a[i]): position
        for position, (i, j) in enumerate(merged)
        if j is None and is_module(names_a[i])
    }
    matched_b = {}
    for position, (i, j) in enumerate(merged):
        if i is None and is_module(names_b[j]) and fp8.twin_name(names_b[j]) in only_a:
            matched_b[only_a[fp8.twin_name(names_b[j])]] = (position, j)
    if not matched_b:
        return merged
    dropped = {position for position, _ in matched_b.values()}
    out = []
    for position, (i, j) in enumerate(merged):
        if position in dropped:
            continue
        out.append((i, matched_b[position][1]) if position in matched_b else (i, j))
    return out


def align_sides(a: Side, b: Side) -> List[Pair]:
    """The matched and unmatched entries of two indexed dumps, in merged order (see ``align`` and
    ``pair_modules_by_name``)."""
    return pair_modules_by_name(align(a.keys, b.keys, _coarse), a.names, b.names)


def compare_pair(
    dump_a: RankDump, dump_b: RankDump, thresholds: Thresholds, progress: Progress, csv_sink=None
) -> PairResult:
    task, level = check_compatible(dump_a, dump_b)
    side_a = index_side(dump_a, progress)
    side_b = index_side(dump_b, progress)
    result = PairResult(side_a, side_b, task, level)
    result.merged = align_sides(side_a, side_b)
    tensor_task = task == "tensor"
    reader_a = EntryReader(iter(iter_entries(dump_a, checked=False)), side_a)
    reader_b = EntryReader(iter(iter_entries(dump_b, checked=False)), side_b)
    nan = math.nan
    total = len(result.merged)
    tracker = Tracker()
    for position, (i, j) in enumerate(result.merged):
        entry_a = reader_a.get(i) if i is not None else None
        entry_b = reader_b.get(j) if j is not None else None
        progress.update(position + 1, f"comparing {result.label}", total)
        if i is None or j is None:
            if i is not None:
                side_a.flags[i] = nonfinite_flags(entry_a)
            if j is not None:
                side_b.flags[j] = nonfinite_flags(entry_b)
            result.flags.append(0)
            result.worst.append(0.0)
            for errors in result.stat_errors:
                errors.append(nan)
            only = tensors_of(entry_a if i is not None else entry_b)
            if any(t.fp8_zero is not None for t in only):
                found_fp8 = fp8.findings([(t, None) if i is not None else (None, t) for t in only])
                if found_fp8:
                    (result.fp8_a if i is not None else result.fp8_b)[i if i is not None else j] = found_fp8
            if csv_sink is not None:
                csv_sink.unmatched(
                    side_a.names[i] if i is not None else None,
                    side_b.names[j] if j is not None else None,
                    only,
                    side_a.sites[i] if i is not None else None,
                )
            continue
        diffs = []
        for ta, tb in pair_tensors(tensors_of(entry_a), tensors_of(entry_b)):
            diff = compare_tensors(ta, tb, thresholds)
            if tensor_task and ta is not None and tb is not None:
                from .elementwise import tensor_metrics  # torch only for task=tensor dumps

                apply_elementwise(
                    diff, tensor_metrics(dump_a.tensor_dir, ta.data_name, dump_b.tensor_dir, tb.data_name), thresholds
                )
            diffs.append(diff)
            if ta is not None and tb is not None:
                result.tensors_compared += 1
                result.tensors_diverged += diff.exceeds
        flags_a, flags_b = _entry_flags(diffs)
        tracker.add(position, side_a.names[i], diffs)
        if position in tracker.fp8:  # for the entries that enclose it (fp8.note)
            result.fp8_a[i] = result.fp8_b[j] = tracker.fp8[position]
        side_a.flags[i] = flags_a & (NONFINITE_IN | NONFINITE_OUT)
        side_b.flags[j] = flags_b
        result.flags.append(flags_a)
        outputs = [d for d in diffs if (d.a or d.b).role == OUTPUT and d.a is not None and d.b is not None]
        worst = max(outputs, key=lambda d: d.worst, default=None)
        result.worst.append(worst.worst if worst is not None else 0.0)
        for index, errors in enumerate(result.stat_errors):
            values = [d.err[index] for d in outputs if d.err[index] is not None]
            errors.append(max(values) if values else nan)
        if flags_a & (IN_DIFF | OUT_DIFF):
            result.input_worst[position] = max(
                (d.worst for d in diffs if d.a is not None and d.b is not None and d.a.role == INPUT), default=0.0
            )
            exceeding = [d for d in diffs if d.exceeds]
            pick = worst if (worst is not None and worst.exceeds) else max(exceeding, key=lambda d: d.worst)
            result.details[position] = _detail(pick)
        if csv_sink is not None:
            csv_sink.matched(side_a.names[i], side_b.names[j], diffs, side_a.sites[i])
    reader_a.drain()
    reader_b.drain()
    progress.clear()
    result.fp8 = tracker.fp8
    _find_divergence(result)
    result.propagation = tracker.finish(result)
    return result


DETAIL_FIELDS = ("tensor", "role", "statistic", "error", "a", "b", "nonfinite_a", "nonfinite_b", "message")


def _detail(diff: TensorDiff) -> tuple:
    # a tuple, not a dict: after a divergence nearly every later entry diverges, and there may be 1e5 of them
    tensor = diff.a or diff.b
    index = STATS.index(diff.worst_stat) if diff.worst_stat in STATS else None
    return (
        tensor.suffix,
        tensor.role,
        diff.worst_stat,
        diff.worst,
        diff.a.stats[index] if index is not None and diff.a else None,
        diff.b.stats[index] if index is not None and diff.b else None,
        diff.nonfinite_a,
        diff.nonfinite_b,
        diff.message.strip(),
    )


def detail(result: "PairResult", position: int) -> Dict[str, Any]:
    """The worst diverging tensor of the entry at ``position``, as a dict ({} when nothing diverges)."""
    values = result.details.get(position)
    return dict(zip(DETAIL_FIELDS, values)) if values is not None else {}


def _describe(result: PairResult, position: int) -> Dict[str, Any]:
    i, j = result.merged[position]
    out: Dict[str, Any] = {
        "entry": result.a.names[i],
        "bench_entry": result.b.names[j],
        "call_site": result.a.sites[i],
        "bench_call_site": result.b.sites[j],
        "position": position,
    }
    out.update(detail(result, position))
    underflow = fp8.note(result, position)
    if underflow:
        out["fp8_underflow"] = underflow
    return out


def _find_divergence(result: PairResult) -> None:
    """The first entry, in completion order, where anything diverges.

    Kind "outputs": its outputs diverge while its inputs agree, so this entry computed the difference (the
    issue's definition). Kind "inputs": its inputs already diverge, so the difference entered through code
    the dump does not show (an API outside the catalogue, a module's own code at L0, weights changed between
    steps); ``parent`` then names the module that encloses it. A later entry whose outputs diverge with
    agreeing inputs is not preferred over it: after a divergence, entries with no tensor inputs
    (parameter gradients) or an amplifying op on sub-threshold drift would qualify without being the cause.
    """
    ends = result.a.ends
    order = sorted(
        (p for p, (i, j) in enumerate(result.merged) if i is not None and j is not None),
        key=lambda p: (ends[result.merged[p][0]], -result.merged[p][0]),
    )
    diverging = [p for p in order if result.flags[p] & (IN_DIFF | OUT_DIFF)]
    if diverging:
        first = diverging[0]
        found = _describe(result, first)
        found["kind"] = "inputs" if result.flags[first] & IN_DIFF else "outputs"
        found["input_error"] = result.input_worst.get(first, 0.0)
        parent = result.a.parents[result.merged[first][0]]
        found["parent"] = result.a.names[parent] if parent >= 0 else None
        after = diverging[1:]
        found["chain"] = [result.a.names[result.merged[p][0]] for p in after[:CHAIN_LIMIT]]
        found["chain_length"] = len(after)
        nonfinite = bool(result.flags[first] & NONFINITE_OUT) or bool(
            result.b.flags[result.merged[first][1]] & NONFINITE_OUT
        )
        found["nan_onset"] = nonfinite
        result.first_divergence = found
    for key, side in (("a", result.a), ("b", result.b)):
        seen, made = first_nonfinite(side.names, side.flags, side.ends)
        # where NaN/Inf first comes out of an entry that did not receive any; else wherever it is first seen
        onset = made if made is not None else seen
        if onset is not None:
            result.nan_onset[key] = {"entry": side.names[onset], "call_site": side.sites[onset]}
