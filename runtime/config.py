"""msprobe's config.json fields, merged with PrecisionDebugger's arguments (arguments win).

Only reads files and validates values; touches no device and imports no torch.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import List, Optional

TASKS = ("statistics", "tensor")
ACCEPTED_TASKS = TASKS + ("acc_check", "structure", "overflow_check", "free_benchmark", "grad_probe")
LEVELS = ("L0", "L1", "mix")
DATA_MODES = ("all", "input", "output", "forward", "backward")


class ConfigError(ValueError):
    """A config.json or argument value that cannot be used; the message names the field."""


@dataclass
class DebuggerConfig:
    task: str = "statistics"
    dump_path: Optional[str] = None
    rank: List[int] = field(default_factory=list)
    step: List[int] = field(default_factory=list)
    level: str = "L1"
    async_dump: bool = False
    scope: List[str] = field(default_factory=list)
    list: List[str] = field(default_factory=list)
    data_mode: List[str] = field(default_factory=lambda: ["all"])
    summary_mode: str = "statistics"
    # ours, opt-in: exact NaN and Inf counts per floating tensor (msprobe has none). Off by default because
    # counting costs two more passes over every tensor with torch's elementwise kernels (about 3x the
    # collection overhead on CPU); Max/Min already show NaN (Max is NaN) and +-Inf without them.
    nan_inf_count: bool = False
    seed: Optional[int] = None
    is_deterministic: bool = False

    def wants_step(self, step):
        return not self.step or step in self.step

    def wants_rank(self, rank):
        return not self.rank or rank is None or rank in self.rank


def parse_ints(value, name):
    """msprobe's step/rank lists: ints and ``"a-b"`` ranges."""
    if value is None:
        return []
    if isinstance(value, (int, str)):
        value = [value]
    out = []
    for item in value:
        if isinstance(item, bool):
            raise ConfigError(f"{name}: {item!r} is not an int")
        if isinstance(item, int):
            out.append(item)
        elif isinstance(item, str) and "-" in item.strip("-"):
            lo, hi = item.split("-", 1)
            try:
                lo, hi = int(lo), int(hi)
            except ValueError:
                raise ConfigError(f"{name}: {item!r} is not an int or an 'a-b' range") from None
            if hi < lo:
                raise ConfigError(f"{name}: range {item!r} runs backwards")
            out.extend(range(lo, hi + 1))
        else:
            try:
                out.append(int(item))
            except (TypeError, ValueError):
                raise ConfigError(f"{name}: {item!r} is not an int or an 'a-b' range") from None
    return sorted(set(out))


def _strings(value, name):
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{name}: expected a list of strings, got {value!r}")
    return list(value)


def load_config(config_path=None, task=None, dump_path=None, level=None, step=None):
    """The effective configuration: config.json (if any), then the constructor's arguments."""
    raw = {}
    if config_path is not None:
        try:
            with open(config_path, "r", encoding="utf-8") as handle:
                raw = json.load(handle)
        except OSError as error:
            raise ConfigError(f"cannot read config {config_path}: {error.strerror}") from error
        except json.JSONDecodeError as error:
            raise ConfigError(f"config {config_path} is not valid JSON: {error}") from error
        if not isinstance(raw, dict):
            raise ConfigError(f"config {config_path}: expected a JSON object")
    config = DebuggerConfig()
    config.task = task or raw.get("task") or "statistics"
    if config.task not in ACCEPTED_TASKS:
        raise ConfigError(f"task: {config.task!r} is not one of {', '.join(TASKS)}")
    if config.task not in TASKS:
        raise ConfigError(f"task: {config.task!r} is accepted by msprobe but not supported here; "
                          f"use {' or '.join(TASKS)}")
    config.dump_path = dump_path if dump_path is not None else raw.get("dump_path")
    config.rank = parse_ints(raw.get("rank"), "rank")
    config.step = parse_ints(step if step is not None else raw.get("step"), "step")
    config.level = level or raw.get("level") or "L1"
    if config.level not in LEVELS:
        raise ConfigError(f"level: {config.level!r} is not one of {', '.join(LEVELS)}")
    config.async_dump = bool(raw.get("async_dump", False))  # always asynchronous here; accepted as is
    config.seed = raw.get("seed")
    config.is_deterministic = bool(raw.get("is_deterministic", False))
    section = raw.get(config.task) or {}
    if not isinstance(section, dict):
        raise ConfigError(f"{config.task}: expected an object")
    config.scope = _strings(section.get("scope"), f"{config.task}.scope")
    if len(config.scope) not in (0, 1, 2):
        raise ConfigError(f"{config.task}.scope: give a start and an end name")
    config.list = _strings(section.get("list"), f"{config.task}.list")
    config.data_mode = _strings(section.get("data_mode"), f"{config.task}.data_mode") or ["all"]
    for mode in config.data_mode:
        if mode not in DATA_MODES:
            raise ConfigError(f"{config.task}.data_mode: {mode!r} is not one of {', '.join(DATA_MODES)}")
    config.summary_mode = section.get("summary_mode", "statistics")
    if config.summary_mode != "statistics":
        raise ConfigError(f"{config.task}.summary_mode: only 'statistics' is supported")
    config.nan_inf_count = bool(section.get("nan_inf_count", False))
    if config.dump_path is None:
        raise ConfigError("dump_path is required (argument or config.json)")
    config.dump_path = os.path.abspath(os.path.expanduser(os.fspath(config.dump_path)))
    return config
