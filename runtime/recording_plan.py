"""What a session records, fixed when its collector is built: config.json's level, data_mode, task and
summary_mode, read once into a frozen ``Plan`` that the hot path reads attribute by attribute.

``module_dump()`` narrows it (``Plan.narrowed_to_modules``) and its end restores the plan it replaced: the
plan itself never changes (tests/runtime/test_recording_plan.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from .checksums import FINGERPRINT_KEY, MODES as CHECKSUM_MODES


@dataclass(frozen=True)
class Plan:
    """What is recorded: the levels, the directions and fields of each entry, the task, the checksum."""

    __slots__ = (
        "level_api",
        "level_module",
        "construct_apis",
        "tensor_task",
        "checksum_mode",
        "want_forward",
        "want_backward",
        "want_input",
        "want_output",
    )

    level_api: bool  # API calls get entries (L1, mix)
    level_module: bool  # module calls get entries (L0, mix)
    construct_apis: bool  # API entries have a parent in construct.json (mix)
    tensor_task: bool  # task "tensor": each record's values are saved to a file as well
    checksum_mode: Optional[str]  # summary_mode's checksum (md5, fingerprint...), or None
    want_forward: bool  # data_mode: forward entries
    want_backward: bool  # data_mode: backward entries
    want_input: bool  # data_mode: an entry's inputs
    want_output: bool  # data_mode: an entry's outputs

    @classmethod
    def of(cls, config: Any) -> "Plan":
        """The plan of a config (``runtime.config``): msprobe's data_mode, where no direction named means both
        and no side named means both."""
        modes = set(config.data_mode)
        everything = "all" in modes or not modes
        no_direction = not ({"forward", "backward"} & modes)
        no_side = not ({"input", "output"} & modes)
        return cls(
            level_api=config.level in ("L1", "mix"),
            level_module=config.level in ("L0", "mix"),
            construct_apis=config.level == "mix",
            tensor_task=config.task == "tensor",
            checksum_mode=config.summary_mode if config.summary_mode in CHECKSUM_MODES else None,
            want_forward=everything or "forward" in modes or no_direction,
            want_backward=everything or "backward" in modes or no_direction,
            want_input=everything or "input" in modes or no_side,
            want_output=everything or "output" in modes or no_side,
        )

    @property
    def statistics_only(self) -> bool:
        """No tensor file and no checksum: the native op, where it serves, is a record's only read."""
        return not self.tensor_task and self.checksum_mode is None

    @property
    def fingerprints_only(self) -> bool:
        """No tensor file, and summary_mode fingerprint: the native op's lane onto the Triton kernels may make a
        record, its fingerprint with its statistics."""
        return not self.tensor_task and self.checksum_mode == FINGERPRINT_KEY

    def narrowed_to_modules(self) -> "Plan":
        """``module_dump``'s plan: modules recorded, and no API."""
        return replace(self, level_module=True, level_api=False)
