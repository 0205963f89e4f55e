"""The flight recorder: the last K collected steps' figures, kept on the host after the flush (no extra device
read), written beside anomaly.json when a rule fires, so the lead-up is on disk even if the job dies next.

The file is ``{MONITOR_OUTPUT_DIR}/anomaly_detected/rank{R}/flight_recorder_step{N}.json``, N the step a rule
fired at::

    {"rank": R, "step": N, "ops": ["min", "max", "norm"],
     "anomalies": [the step's records, msprobe's shape, earliest first],
     "steps": [{"step": N-K+1, "loss": 0.51, "grad_norm": 2.3,
                "figures": {"grad_reduced": {"0:fc1.weight/rank0/post_grad": [min, max, norm]}, ...}},
               ..., {"step": N, ...}]}

Figures are the ops' values in ``ops`` order (shape and dtype are in the CSV); a value that is not finite is
written as the string ``"nan"``, ``"inf"`` or ``"-inf"`` (strict JSON has none), ``loss``/``grad_norm`` are null
where not observed. Written atomically (a temporary file opened with O_EXCL and O_NOFOLLOW, then os.replace), in
a folder under the output directory that is checked not to be a link: a link planted at the folder or file name is
never written through (tests/monitor/test_flight_recorder.py).
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import stat
from typing import Any, Sequence

from ..json_files import atomic_write_text

logger = logging.getLogger("msprobe_runtime")


def plain_number(value: float | None) -> float | str | None:
    if value is None:
        return None
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def safe_folder(base: str, *parts: str) -> str:
    """``base/parts...``, made where missing; OSError when any part is a link or not a folder, so a file written
    in it stays under ``base``."""
    folder = base
    os.makedirs(base, exist_ok=True)
    for part in parts:
        if part in ("", ".", "..") or os.sep in part:
            raise OSError(f"{part!r} is not a plain folder name")
        folder = os.path.join(folder, part)
        try:
            os.mkdir(folder)
        except FileExistsError:
            pass
        mode = os.lstat(folder).st_mode
        if not stat.S_ISDIR(mode):  # lstat: a link is a link, whatever it points to
            raise OSError(f"{folder} is a link or not a folder: nothing is written through it")
    return folder


def write_json(folder: str, name: str, obj: Any) -> str:
    path = os.path.join(folder, name)
    atomic_write_text(path, json.dumps(obj, indent=1, allow_nan=False))
    return path


class FlightRecorder:
    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.kept: collections.deque[dict[str, Any]] = collections.deque(maxlen=steps)
        self.last_written: int | None = None

    def add(
        self,
        step: int,
        groups: Sequence[tuple[str, Sequence[tuple[str, Sequence[float], Any, Any]]]],
        loss: float | None,
        grad_norm: float | None,
    ) -> None:
        """One collected step's figures, as the flush read them: (prefix, [(tag, figures, shape, dtype)]). The
        flush's own lists are kept, not copied: made into JSON only when written (``figures``)."""
        self.kept.append({"step": step, "loss": loss, "grad_norm": grad_norm, "groups": groups})

    @staticmethod
    def figures(entry: dict[str, Any]) -> dict[str, dict[str, list[float | str | None]]]:
        return {
            prefix: {tag: [plain_number(value) for value in values] for tag, values, _, _ in rows}
            for prefix, rows in entry["groups"]
        }

    def due(self, step: int) -> bool:
        """Whether a rule firing at ``step`` writes a file: the first time, then once the last file's K steps have
        passed (a NaN that stays fires every step; each file would hold the same steps)."""
        return self.last_written is None or step - self.last_written >= self.steps

    def write(self, folder: str, rank: int, step: int, ops: Sequence[str], records: Sequence[dict[str, Any]]) -> str:
        self.last_written = step
        steps = [
            {
                "step": entry["step"],
                "loss": plain_number(entry["loss"]),
                "grad_norm": plain_number(entry["grad_norm"]),
                "figures": self.figures(entry),
            }
            for entry in self.kept
        ]
        body = {"rank": rank, "step": step, "ops": list(ops), "anomalies": list(records), "steps": steps}
        return write_json(folder, f"flight_recorder_step{step}.json", body)
