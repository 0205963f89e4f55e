"""Which entries of a dump the pre-check replays, read through the one dump reader (``compare.loading``),
so ours and msprobe's dumps, and every layout compare accepts (a dump directory, a step, a rank, a dump.json),
are read alike.

An item is one API call: its forward record, its backward record when the dump has one, and where its
tensors lie. Items are plain data (JSON records), cheap to send to a worker process; no tensor is read here.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Tuple

from msprobe_runtime import dump_names

from ..compare.errors import CompareError
from ..compare.loading import RankDump, discover, iter_entries, read_header
from .errors import PrecheckError
from .records import flat_records

RECOLLECT = (
    're-collect with task \'tensor\' (config.json: "task": "tensor", "level": "L1") for one step, '
    "so that every API's inputs, outputs and gradients are saved"
)


def dumps(path: str) -> List[RankDump]:
    """Every rank dump under ``path``, with its header read; PrecheckError when none can be checked."""
    try:
        found = discover(path)
        for dump in found:
            read_header(dump)
    except CompareError as error:
        raise PrecheckError(str(error)) from None
    return found


def _has_tensor(entry: Any) -> bool:
    if not isinstance(entry, dict):
        return False
    for key in ("input_args", "input_kwargs", "output"):
        if any(r is not None for r in flat_records(entry.get(key), [])):
            return True
    return False


def _saved(entry: dict) -> bool:
    return any(
        isinstance(r, dict) and isinstance(r.get("data_name"), str)
        for key in ("input_args", "input_kwargs", "output")
        for r in flat_records(entry.get(key), [])
    )


def items(dump: RankDump) -> Tuple[List[Dict[str, Any]], int]:
    """(the API calls of one dump with tensors, in execution order; the count of API entries without any)."""
    task = dump.header.get("task")
    if task not in (None, "tensor", "acc_check"):
        raise PrecheckError(
            f"{dump.path}: a task {task!r} dump holds statistics only, no tensors to replay; " + RECOLLECT
        )
    calls: Dict[str, Dict[str, Any]] = {}
    order: List[str] = []
    no_tensor = 0
    try:
        for name, entry in iter_entries(dump):
            if dump_names.is_module(name):
                continue
            base, direction, index = dump_names.split_name(name)
            if index is None or direction not in (dump_names.FORWARD, dump_names.BACKWARD):
                continue
            call = dump_names.api_call(base, index)
            if direction == dump_names.FORWARD:
                if not _has_tensor(entry):
                    no_tensor += 1
                    continue
                calls[call] = {
                    "name": call,
                    "api": base,
                    "forward": entry,
                    "backward": None,
                    "tensor_dir": dump.tensor_dir,
                    "label": dump.label,
                }
                order.append(call)
            elif call in calls:
                calls[call]["backward"] = entry
    except CompareError as error:
        raise PrecheckError(str(error)) from None
    found = [calls[name] for name in order]
    if found and not any(_saved(item["forward"]) for item in found):
        raise PrecheckError(f"{dump.path}: no tensor of this dump was saved (a statistics-only dump); " + RECOLLECT)
    return found, no_tensor


def all_items(path: str) -> Iterator[Tuple[RankDump, List[Dict[str, Any]], int]]:
    for dump in dumps(path):
        found, no_tensor = items(dump)
        yield dump, found, no_tensor
