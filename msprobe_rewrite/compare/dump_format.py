"""The members a dump.json must hold: those msprobe always writes and the readers (compare, the bit-exact
compare, the pre-check) rely on. A dump that lacks one is malformed: a CompareError that names the file, the
entry and the member (exit status 2), never read as though the member were there. Before, a dump without
``data`` was an empty run that agreed with anything, a tensor record without ``type`` or ``dtype`` was
skipped, and one without a statistic compared as equal (tests/compare/test_malformed_dumps.py).

Decided from msprobe's writer (mindstudio-probe 26.2.0: ``json_writer.py``, ``pytorch_processor.py``) and
ours (``runtime/json_files.py``, ``runtime/records.py``):

- the top level: ``task``, ``level``, ``dump_data_dir`` (null without tensor files) and ``data``. Not
  ``framework``: msprobe releases before it did not write it, msprobe's own compare defaults it to pytorch,
  and nothing here reads it.
- inside an entry's inputs and outputs, every value is a record (an object with ``type``), a list or a
  mapping of them, or null; msprobe writes ``{}`` for a type it does not support, and never a bare number
  or string, so one there is a record that lost its ``type``.
- a tensor record (its ``type`` names a Tensor; a record with ``value`` is an enum or number): ``dtype`` and
  ``shape``. With task statistics or tensor, ``Max``, ``Min``, ``Mean`` and ``Norm`` (null where not
  computed), but for summary_mode xor, where msprobe writes ``md5`` in their place.
- a checksum (``md5``, or our ``fingerprint``) is on every tensor record of a dump or on none: summary_mode
  md5 writes it on each (null where the bytes cannot be read); without it, or with async_dump, there is none.
- with task tensor, ``data_name`` on every tensor record with statistics of an API's entry: both writers save
  every such tensor whose values they read (meta, fake and empty tensors have null statistics and no file).
  Not of a module's: our runtime saves no file for a module's backward gradients (those of the APIs inside
  it are saved), while msprobe does.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from .errors import CompareError
from .names import is_module, split_name
from .records import ARGUMENT_KEYS, CHECKSUM_KEYS, STATS

HEADER = ("task", "level", "dump_data_dir", "data")
_SCALARS = (str, int, float, bool)
MAX_DEPTH = 64


def check_header(path: str, header: Dict[str, Any], has_data: bool) -> None:
    """CompareError naming the first top-level member ``path`` lacks."""
    for member in HEADER:
        if member not in header and not (member == "data" and has_data):
            raise CompareError(
                f"{path}: malformed dump.json: no {member!r} member at the top level "
                "(msprobe writes task, level, dump_data_dir and data in every dump.json)"
            )


def is_tensor_record(record: dict) -> bool:
    kind = record.get("type")
    return isinstance(kind, str) and "Tensor" in kind and "value" not in record


class EntryChecker:
    """Checks the entries of one dump.json in the order read (the checksum rule spans records)."""

    def __init__(self, path: str, task: Any):
        self.path = path
        self.statistics = task in ("statistics", "tensor")
        self.tensor_task = task == "tensor"
        self.files_required = False  # data_name required in the entry being checked
        self.first_checksum: Optional[Tuple[str, str, str]] = None  # (key, entry, where) of the first seen
        self.first_without: Optional[Tuple[str, str]] = None  # (entry, where) of the first tensor without one

    def check(self, name: str, entry: Any) -> None:
        if not isinstance(entry, dict):
            raise CompareError(f"{self.path}: malformed dump.json: entry {name!r} is not an object")
        self.files_required = self.tensor_task and not is_module(name)
        if any(key in entry for key in ARGUMENT_KEYS):
            for key in ARGUMENT_KEYS:
                if key in entry:
                    self._walk(name, entry[key], key, 0)
        elif split_name(name)[1] == "parameters_grad":  # parameter name -> its gradient's record
            for key, value in entry.items():
                self._walk(name, value, key, 0)

    def _fail(self, name: str, where: str, problem: str) -> None:
        raise CompareError(f"{self.path}: malformed dump.json: entry {name!r}, {where}: {problem}")

    def _walk(self, name: str, value: Any, where: str, depth: int) -> None:
        if value is None or depth > MAX_DEPTH:
            return
        if isinstance(value, list):
            for index, item in enumerate(value):
                self._walk(name, item, f"{where}.{index}", depth + 1)
        elif isinstance(value, dict):
            if "type" in value:
                if is_tensor_record(value):
                    self._tensor(name, value, where)
                return
            if any(isinstance(item, _SCALARS) for item in value.values()):
                self._fail(name, where, "no 'type' member (a record without its type)")
            for key, item in value.items():
                self._walk(name, item, f"{where}.{key}", depth + 1)
        else:
            self._fail(name, where, "no 'type' member (a bare value where msprobe writes a record)")

    def _tensor(self, name: str, record: dict, where: str) -> None:
        for member in ("dtype", "shape"):
            if member not in record:
                self._fail(name, where, f"no {member!r} member in a tensor record")
        if self.statistics:
            absent = [member for member in STATS if member not in record]
            # summary_mode xor: msprobe writes md5 in place of all four statistics
            if absent and not (len(absent) == len(STATS) and "md5" in record):
                self._fail(
                    name,
                    where,
                    f"no {absent[0]!r} member in a tensor record (msprobe writes Max, Min, "
                    "Mean and Norm in every record of task statistics and tensor)",
                )
        keys = [key for key in CHECKSUM_KEYS if key in record]
        if keys:
            if self.first_checksum is None:
                self.first_checksum = (keys[0], name, where)
            if self.first_without is not None:
                self._missing_checksum(*self.first_without)
        elif self.first_checksum is not None:
            self._missing_checksum(name, where)
        elif self.first_without is None:
            self.first_without = (name, where)
        if self.files_required and record.get("Max") is not None and "data_name" not in record:
            self._fail(
                name,
                where,
                "no 'data_name' member in a tensor record with statistics (task tensor saves "
                "every tensor of an API whose values were read)",
            )

    def _missing_checksum(self, name: str, where: str) -> None:
        key, other, other_where = self.first_checksum
        self._fail(
            name,
            where,
            f"no {key!r} member in a tensor record, while entry {other!r}, {other_where} has "
            "one (a checksum is written in every tensor record of a dump or in none)",
        )
