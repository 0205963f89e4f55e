"""The monitor's output: msprobe's CSV files, or TensorBoard event files through torch's SummaryWriter.

CSV as msprobe's ``CSVWriterWithAD`` (pytorch/monitor/data_writers.py) writes it with pandas: one file per prefix
and block of ``step_count_per_record`` steps, ``{prefix}_{first}-{last}.csv``, header ``vpp_stage,name,step`` and
then the ops; a row per parameter: its vpp stage and name (the tag's ``0:fc1.weight`` split at ``:``), the step,
the figures rounded to ``ndigits`` (NaN written ``nan``), the shape as a list and the dtype. msprobe's csv2tb reads
these files (tests/monitor/test_output.py runs its parser on ours).
"""

from __future__ import annotations

import csv
import math
import os
from typing import IO, TYPE_CHECKING, Any, Iterable, Sequence

from ..config import ConfigError
from .flight_recorder import safe_folder

_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

if TYPE_CHECKING:
    import torch

    # one tensor's row: (tag name, figures in the numeric ops' order, shape, dtype)
    Row = tuple[str, Sequence[float], Sequence[int] | None, torch.dtype | None]


def _cell(op: str, value: float, ndigits: int) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if op == "nans":  # msprobe's count is an int tensor: pandas writes it as an int
        return str(int(value))
    return repr(round(value, ndigits))


class CSVWriter:
    def __init__(self, folder: str, ops: Sequence[str], ndigits: int, step_count_per_record: int) -> None:
        self.folder = folder
        self.ops = list(ops)
        self.ndigits = ndigits
        self.per_record = step_count_per_record
        # prefix -> (path, open file, its csv writer): a file stays open while its block of steps is written (an
        # open per prefix and step was most of the flush's time once the figures took one pass: bench/
        # monitor_overhead.py); each write is flushed to the file, so that what was written is there if the job
        # dies
        self._files: dict[str, tuple[str, IO[str], Any]] = {}
        safe_folder(os.path.dirname(folder) or ".", os.path.basename(folder))  # not a planted link

    def path(self, prefix: str, step: int) -> str:
        first = step // self.per_record * self.per_record
        return os.path.join(self.folder, f"{prefix}_{first}-{first + self.per_record - 1}.csv")

    def write(self, prefix: str, step: int, rows: Iterable[Row]) -> None:
        """``rows``: (tag name, figures in the numeric ops' order, shape, dtype) per tensor."""
        path = self.path(prefix, step)
        held = self._files.get(prefix)
        if held is None or held[0] != path:
            if held is not None:
                del self._files[prefix]
                held[1].close()
            fresh = not os.path.exists(path)
            # O_NOFOLLOW: a link planted at the file's name is refused, never written through (the flush's
            # guard logs it and drops the step: tests/monitor/test_output.py)
            opened: IO[str] = os.fdopen(os.open(path, _APPEND, 0o644), "a", encoding="utf-8", newline="")
            held = self._files[prefix] = (path, opened, csv.writer(opened, lineterminator="\n"))
            if fresh:  # activation names carry the micro step (fc1.input:0): msprobe's CSV_HEADER_MICRO_STEP
                micro = ["micro_step"] if prefix in ("actv", "actv_grad") else []
                held[2].writerow(["vpp_stage", "name", "step"] + micro + self.ops)
        handle, out = held[1], held[2]
        try:
            for tag, values, shape, dtype in rows:
                line: list[Any] = tag.split("/")[0].split(":")
                line.insert(2, step)
                figures = iter(values)
                for op in self.ops:
                    if op == "shape":  # None: a non-tensor activation, all nan as msprobe writes it
                        line.append(str(list(shape)) if shape is not None else "nan")
                    elif op == "dtype":
                        line.append(str(dtype) if dtype is not None else "nan")
                    else:
                        line.append(_cell(op, next(figures), self.ndigits))
                out.writerow(line)
        finally:
            handle.flush()

    def close(self) -> None:
        files, self._files = self._files, {}
        for _, handle, _ in files.values():
            handle.close()


class TensorBoardWriter:
    """One scalar per tag and op, tagged as msprobe's SummaryWriterWithAD does:
    ``0:fc1.weight/rank0/post_grad_norm``."""

    def __init__(self, folder: str, ops: Sequence[str]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise ConfigError(
                "monitor config format: 'tensorboard' needs the tensorboard package (pip install "
                f"tensorboard), or use format 'csv' ({error})"
            ) from error
        os.makedirs(folder, exist_ok=True)
        self.numeric_ops = [op for op in ops if op not in ("shape", "dtype")]
        self.summary = SummaryWriter(folder)

    def write(self, prefix: str, step: int, rows: Iterable[Row]) -> None:
        for tag, values, _shape, _dtype in rows:
            for op, value in zip(self.numeric_ops, values):
                self.summary.add_scalar(f"{tag}_{op}", value, step)

    def close(self) -> None:
        self.summary.close()
