"""Find the dumps of a run and read them entry by entry.

A run is a dump directory (``step*/rank*``), a step directory (``rank*`` or ``proc*``), a rank directory
holding ``dump.json``, or a ``dump.json`` itself. Two runs are paired step by step and rank by rank by number;
``proc{pid}`` directories (no rank) are paired only when each side has exactly one.

Nothing here holds a whole dump: ``iter_entries`` streams ``dump.json``; the stack and construct tables
keep one short string per entry.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .dump_format import HEADER, EntryChecker, check_header
from .errors import CompareError
from .jsonstream import JsonStreamError, iter_members

_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^rank(\d+)$")
_PROC = re.compile(r"^proc(\d+)$")


@dataclass
class RankDump:
    """One ``dump.json`` with its siblings: the unit that is compared against its counterpart."""

    path: str  # the dump.json
    step: Optional[int] = None
    rank: Optional[int] = None
    label: str = ""  # "step0/rank1", for messages and reports
    header: Dict[str, Any] = field(default_factory=dict)

    @property
    def directory(self) -> str:
        return os.path.dirname(self.path)

    @property
    def tensor_dir(self) -> str:
        configured = self.header.get("dump_data_dir")
        local = os.path.join(self.directory, "dump_tensor_data")
        # the recorded path is absolute on the machine that wrote it; a copied dump keeps it beside dump.json
        if os.path.isdir(local) or not isinstance(configured, str):
            return local
        return configured


def _rank_key(name: str) -> Optional[Tuple[str, int]]:
    match = _RANK.match(name)
    if match:
        return ("rank", int(match.group(1)))
    if name == "rank":
        return ("rank", 0)
    match = _PROC.match(name)
    if match:
        return ("proc", int(match.group(1)))
    return None


def _ranks_in(step_dir: str) -> List[Tuple[Tuple[str, int], str]]:
    found = []
    for name in sorted(os.listdir(step_dir)):
        key = _rank_key(name)
        path = os.path.join(step_dir, name, "dump.json")
        if key is not None and os.path.isfile(path):
            found.append((key, path))
    return found


def discover(run: str) -> List[RankDump]:
    """Every dump.json of ``run``, with the step and rank it belongs to."""
    if not os.path.exists(run):
        raise CompareError(f"{run}: no such file or directory")
    if os.path.isfile(run):
        return [RankDump(run, label=os.path.basename(os.path.dirname(os.path.abspath(run))))]
    if os.path.isfile(os.path.join(run, "dump.json")):
        return [RankDump(os.path.join(run, "dump.json"), label=os.path.basename(os.path.abspath(run)))]
    try:
        names = sorted(os.listdir(run))
    except OSError as error:
        raise CompareError(f"{run}: cannot list ({error.strerror})") from None
    steps = [(int(m.group(1)), n) for n in names if (m := _STEP.match(n))]
    dumps: List[RankDump] = []
    if steps:
        for number, name in sorted(steps):
            for (kind, value), path in _ranks_in(os.path.join(run, name)):
                dumps.append(
                    RankDump(
                        path,
                        number,
                        value if kind == "rank" else None,
                        f"{name}/{os.path.basename(os.path.dirname(path))}",
                    )
                )
    else:
        for (kind, value), path in _ranks_in(run):
            dumps.append(
                RankDump(path, None, value if kind == "rank" else None, os.path.basename(os.path.dirname(path)))
            )
    if not dumps:
        raise CompareError(
            f"{run}: no dump.json found (expected a dump directory with step*/rank*/, a step "
            "directory with rank*/ or proc*/, a rank directory, or a dump.json)"
        )
    return dumps


class Pairs(list):
    """``[(dump of A, dump of B)]``, with the dumps of each side that have no partner (``unpaired_a``,
    ``unpaired_b``: their labels)."""

    unpaired_a: List[str] = []
    unpaired_b: List[str] = []


def pair_runs(run_a: str, run_b: str) -> Pairs:
    """Pair the two runs' dumps by step and rank number; a dump with no partner is named on stderr and in
    the result's ``unpaired_a``/``unpaired_b``."""
    side_a, side_b = discover(run_a), discover(run_b)
    if len(side_a) == 1 and len(side_b) == 1:
        return Pairs([(side_a[0], side_b[0])])

    def by_step(dumps):
        table: Dict[Optional[int], List[RankDump]] = {}
        for dump in dumps:
            table.setdefault(dump.step, []).append(dump)
        return table

    steps_a, steps_b = by_step(side_a), by_step(side_b)
    pairs = []
    for step in sorted(set(steps_a) & set(steps_b), key=lambda s: -1 if s is None else s):
        ranks_a, ranks_b = steps_a[step], steps_b[step]
        if len(ranks_a) == 1 and len(ranks_b) == 1:
            pairs.append((ranks_a[0], ranks_b[0]))
            continue
        numbered_b = {dump.rank: dump for dump in ranks_b if dump.rank is not None}
        for dump in ranks_a:
            if dump.rank is not None and dump.rank in numbered_b:
                pairs.append((dump, numbered_b[dump.rank]))
    if not pairs:
        raise CompareError(f"{run_a} and {run_b} have no step and rank in common")
    # a dump is unpaired when no pair holds it (labels alone can differ between paired dumps: proc{pid})
    paired = {id(dump) for pair in pairs for dump in pair}
    result = Pairs(pairs)
    result.unpaired_a = [d.label for d in side_a if id(d) not in paired]
    result.unpaired_b = [d.label for d in side_b if id(d) not in paired]
    for side, labels in (("A", result.unpaired_a), ("B", result.unpaired_b)):
        if labels:
            print(f"msprobe-rewrite compare: not paired, only in {side}: {', '.join(labels)}", file=sys.stderr)
    return result


def _open(path: str):
    try:
        return open(path, encoding="utf-8")
    except OSError as error:
        raise CompareError(f"{path}: cannot open ({error.strerror})") from None


def read_header(dump: RankDump) -> Dict[str, Any]:
    """The members of dump.json other than ``data`` (task, level, framework, ...), without reading data;
    CompareError where one that msprobe always writes is missing (``dump_format``)."""
    header: Dict[str, Any] = {}
    has_data = []
    with _open(dump.path) as handle:
        try:
            for _ in iter_members(handle, "data", header.__setitem__, lambda: has_data.append(True)):
                if all(member in header for member in HEADER if member != "data"):
                    break  # both runtimes write the header first: no need to read on
        except JsonStreamError as error:
            raise CompareError(f"{dump.path}: not a readable dump.json ({error})") from None
        except UnicodeDecodeError:
            raise CompareError(f"{dump.path}: not a readable dump.json (not UTF-8 text)") from None
    check_header(dump.path, header, bool(has_data))
    dump.header = header
    return header


def iter_entries(dump: RankDump, checked: bool = True) -> Iterator[Tuple[str, Any]]:
    """(name, entry) for every entry of ``data``, in the order written (execution order); with ``checked``,
    CompareError at the first entry that lacks a member msprobe always writes (``dump_format``). A second
    pass over a file the first pass checked need not check again."""
    checker = EntryChecker(dump.path, dump.header.get("task")) if checked else None
    with _open(dump.path) as handle:
        try:
            for name, entry in iter_members(handle, "data", dump.header.setdefault):
                if checker is not None:
                    checker.check(name, entry)
                yield name, entry
        except JsonStreamError as error:
            raise CompareError(f"{dump.path}: not a readable dump.json ({error})") from None
        except UnicodeDecodeError:
            raise CompareError(f"{dump.path}: not a readable dump.json (not UTF-8 text)") from None


def _sibling(dump: RankDump, name: str) -> Optional[str]:
    path = os.path.join(dump.directory, name)
    return path if os.path.isfile(path) else None


_FRAME = re.compile(r"^File (?P<file>.*?), line (?P<line>\d+), in (?P<func>[^,]*)")
# the tools' frames (msprobe's, this runtime's and compiler's, in dumps made before they were left out) are
# never a call site; torch's are not the user's line (Functional.batch_norm is called at batchnorm.py:210
# inside the user's ``self.bn1(x)``), so the call site is the first frame outside both
# (tests/runtime/test_tool_frames.py)
_TOOLS = tuple(os.sep + name + os.sep for name in ("msprobe", "msprobe_runtime", "msprobe_rewrite"))
_TORCH = os.sep + "torch" + os.sep


def call_site(frames: Any) -> Optional[str]:
    """``file:line`` of the innermost frame outside torch and the tools: the user's line that led to the call;
    where every frame is torch's, the innermost that is not the tools'."""
    if not isinstance(frames, list):
        return None
    first = None
    for frame in frames:
        if not isinstance(frame, str):
            continue
        match = _FRAME.match(frame)
        if match is None:
            continue
        path = match.group("file")
        if any(part in path for part in _TOOLS):
            continue
        site = f"{path}:{match.group('line')}"
        if _TORCH not in path:
            return site
        if first is None:
            first = site
    return first


def read_call_sites(dump: RankDump) -> Dict[str, str]:
    """Forward entry name -> call site, from stack.json (msprobe's grouped form or the older name -> frames)."""
    path = _sibling(dump, "stack.json")
    if path is None:
        return {}
    sites: Dict[str, str] = {}
    interned: Dict[str, str] = {}
    with _open(path) as handle:
        try:
            for key, value in iter_members(handle):
                if (
                    isinstance(value, list)
                    and len(value) == 2
                    and isinstance(value[0], list)
                    and isinstance(value[1], list)
                ):
                    names, frames = value
                else:
                    names, frames = [key], value
                site = call_site(frames)
                if site is None:
                    continue
                site = interned.setdefault(site, site)
                for name in names:
                    if isinstance(name, str):
                        sites[name] = site
        except (JsonStreamError, UnicodeDecodeError) as error:
            print(
                f"msprobe-rewrite compare: warning: {path} is unreadable ({error}); call sites are not used",
                file=sys.stderr,
            )
            return {}
    return sites


def read_construct(dump: RankDump) -> Dict[str, Optional[str]]:
    """Entry name -> its parent module's entry name (or None), from construct.json."""
    path = _sibling(dump, "construct.json")
    if path is None:
        return {}
    table: Dict[str, Optional[str]] = {}
    with _open(path) as handle:
        try:
            for key, value in iter_members(handle):
                table[key] = value if isinstance(value, str) else None
        except (JsonStreamError, UnicodeDecodeError) as error:
            print(
                f"msprobe-rewrite compare: warning: {path} is unreadable ({error}); module nesting is not used",
                file=sys.stderr,
            )
            return {}
    return table


def make_out_dir(out_dir: str) -> None:
    """Create the report directory, or raise a CompareError that says why not."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as error:
        raise CompareError(f"{out_dir}: cannot create ({error.strerror})") from None
