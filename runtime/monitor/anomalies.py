"""msprobe's alert rules, evaluated on the device, and its ``anomaly_detected`` records, made on the host.

msprobe (core/monitor/anomaly_processor.py, pytorch/monitor/data_writers.py) reads every figure to the host with
``.item()`` and keeps a running average per (tag, op) in Python. Here the average is a device tensor per group of
rows, the rules give a code per figure on the device (0: none; 1 + the index of the first rule that fires, as
``AnomalyScanner.scan`` returns the first), and the codes travel to the host with the figures in the flush's one
copy (trainer_mon.py). The records have ``GradAnomalyData``'s fields and order, so msprobe's anomaly_analyse reads
``anomaly_detected/rank{R}/anomaly.json`` (tests/monitor/test_anomalies.py).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..json_files import atomic_write_text
from .flight_recorder import safe_folder

if TYPE_CHECKING:  # torch loads at the first evaluate: importing this module imports none
    import torch

    from .config import Rule

BETA = 0.99  # msprobe's BaseWriterWithAD.beta
TURBULENCE_OPS = ("norm", "mean")  # msprobe reports the turbulence rule only for these ops
RECORDS_PER_STEP = 8  # msprobe's anomaly_analyse shows the earliest 8 (its -k default)

# msprobe's MonitorConst.TRAIN_STAGE: the tag's last part -> forward 0, backward 1, optimizer 2, others -1
_TRAIN_STAGE = {"actv": 0, "actv_grad": 1, "pre_grad": 1, "post_grad": 1, "acc_grad": 1, "exp_avg": 2, "exp_avg_sq": 2}


class DeviceRules:
    """The running averages and rule codes of every group of rows (one group per CSV prefix)."""

    def __init__(self, rules: Iterable[Rule], ops: Iterable[str]) -> None:
        self.rules = list(rules)
        self.ops = list(ops)
        # group -> (row names, average tensor [rows, ops])
        self._averages: dict[str, tuple[tuple[str, ...], torch.Tensor]] = {}
        # device -> (turbulence columns, ruled columns): made once, a host-to-device copy
        self._columns: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _masks(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        masks = self._columns.get(device)
        if masks is None:
            masks = (
                torch.tensor([op in TURBULENCE_OPS for op in self.ops], device=device),
                torch.tensor([op != "id" for op in self.ops], device=device),
            )
            self._columns[device] = masks
        return masks

    def evaluate(self, group: str, names: tuple[str, ...], values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``values`` [rows, ops] on the device -> (history, code), both [rows, ops] float32 on that device:
        history is the running average of |value| before this step (msprobe's ``history mean``)."""
        import torch

        magnitude = values.abs()
        known = self._averages.get(group)
        history = known[1] if known is not None and known[0] == names else magnitude
        self._averages[group] = (names, BETA * history + (1 - BETA) * magnitude)
        code = torch.zeros_like(values)
        fired_before = torch.zeros_like(values, dtype=torch.bool)
        turbulence_columns, ruled_columns = self._masks(values.device)
        for index, rule in enumerate(self.rules):
            if rule.name == "AnomalySpike":
                continue  # ours, on the loss and the global gradient norm: spike.py
            if rule.name == "AnomalyTurbulence":
                assert rule.threshold is not None  # config.parse refuses an AnomalyTurbulence without one
                fired = magnitude > history * (1 + rule.threshold)
                reported = fired & turbulence_columns
            else:  # AnomalyNan, which here also fires on an infinity
                fired = ~torch.isfinite(values)
                if rule.threshold is not None:
                    fired = fired | (magnitude > rule.threshold)
                reported = fired
            # the first rule that fires decides, as AnomalyScanner.scan does; a turbulence on min or max is
            # then dropped (data_writers.py), even where a later rule would fire too
            first = fired & ~fired_before
            code = torch.where(first & reported & ruled_columns, float(index + 1), code)
            fired_before = fired_before | fired
        return history, code


def train_stage(tag_name: str) -> int:
    return _TRAIN_STAGE.get(tag_name.split("/")[-1], -1)


def record(rank: int, step: int, call_id: int, tag_name: str, message: str, group_mates: list[int]) -> dict[str, Any]:
    """One anomaly in msprobe's ``GradAnomalyData`` shape (its fields in its order)."""
    name = tag_name.split("/")[0]
    vpp_stage = int(name.split(":")[0]) if ":" in name else 0
    return {
        "rank": rank,
        "step": step,
        "micro_step": 0,
        "pp_stage": 0,
        "vpp_stage": vpp_stage,
        "call_id": call_id,
        "tag_name": tag_name,
        "message": message,
        "group_mates": group_mates,
    }


def execution_order(item: dict[str, Any]) -> tuple[int, ...]:
    """msprobe's ``GradAnomalyData.__lt__``: step, micro step, stage, later vpp/pp stages first outside the
    forward, then the call order."""
    stage = train_stage(item["tag_name"])
    sign = 1 if stage == 0 else -1
    return (item["step"], item["micro_step"], stage, sign * item["vpp_stage"], sign * item["pp_stage"], item["call_id"])


def message(rule_name: str, tag_name: str, op: str, step: int, value: float, history: float) -> str:
    # msprobe's text, word for word, so that logs read the same
    return (
        f"Rule {rule_name} reports anomaly signal in {(tag_name, op)} at step {step}, "
        f"current value {value}, history mean {history}."
    )


def record_key(item: dict[str, Any]) -> str:
    return f"{item['tag_name']}_step_{item['step']}_call_{item['call_id']}"


class AnomalyFile:
    """``{output}/anomaly_detected/rank{R}/anomaly.json``, as msprobe's AnomalyDataWriter keeps it: emptied when
    the monitor starts, then each collected step's records merged in."""

    def __init__(self, output_base_dir: str, rank: int) -> None:
        # no link planted at anomaly_detected/ or rank{R}/ is written through, and the file itself is replaced,
        # never written through (tests/monitor/test_anomalies.py)
        self.folder = safe_folder(output_base_dir, "anomaly_detected", f"rank{rank}")
        self.path = os.path.join(self.folder, "anomaly.json")
        self._records: dict[str, dict[str, Any]] = {}
        self._save()

    def _save(self) -> None:
        atomic_write_text(self.path, json.dumps(self._records, indent=1))

    def add(self, items: Sequence[dict[str, Any]]) -> None:
        if not items:
            return
        self._records.update({record_key(item): item for item in items})
        self._save()
