"""msprobe's config.json fields, merged with PrecisionDebugger's arguments (arguments win).

Every key of msprobe 26.2's PyTorch config is in ``keys()``: it works as msprobe documents it, or loading the
config refuses it with a message that names the key and the nearest supported option. Unknown keys get a
did-you-mean, and every value is type-checked. Only reads files; touches no device and imports no torch. The
environment's ``MSPROBE_*`` switches are read through ``switches``.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, field
from typing import List, Optional

from . import dump_names
from .checksums import MODES as CHECKSUM_MODES  # md5 (msprobe's) and fingerprint (ours); checksums imports no torch

TASKS = ("statistics", "tensor")
SUMMARY_MODES = ("statistics",) + tuple(CHECKSUM_MODES)
LEVELS = ("L0", "L1", "mix", "debug")  # debug: only PrecisionDebugger.save() records (debug.json)
DATA_MODES = ("all", "input", "output", "forward", "backward")
STEP_RANK_MAX = 10**6  # msprobe's bound on a step or rank number
DEFAULT_CUSTOM_OP_NAMESPACES = ("_C_ascend",)  # msprobe's DebuggerConfig.DEFAULT_CUSTOM_OP_NAMESPACES
SEED_MAX = 2**32 - 1

SUPPORTED = "supported"
REFUSED = "refused"
OURS = "supported (not in msprobe 26.2)"
INACTIVE = "accepted, not read"


class ConfigError(ValueError):
    """A config.json or argument value that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Key:
    """How one config.json key is handled: ``status`` is one of the constants above; ``note`` says what it
    does here, or why it is refused and what to use instead (the refusal's message)."""

    status: str
    note: str
    neutral: tuple = ()  # values of a refused key that change nothing in msprobe either: accepted


_MSPROBE_ONLY_TASK = (
    "task {task!r} is not supported, so its section is never read (as msprobe reads only the "
    "section of the task it runs)"
)

COMMON_KEYS = {
    "task": Key(
        SUPPORTED,
        "statistics or tensor; msprobe's other tasks (acc_check, structure, diff_check, nan_check) are refused",
    ),
    "dump_path": Key(
        SUPPORTED,
        "a non-empty string; the constructor's dump_path wins; one that holds a dump is "
        "refused (DumpPathError), where msprobe overwrites, unless MSPROBE_DUMP_OVERWRITE=1",
    ),
    "rank": Key(SUPPORTED, "a list of ints and 'a-b' ranges; [] = every rank"),
    "step": Key(SUPPORTED, "a list of ints and 'a-b' ranges; [] = every step; the constructor's step wins"),
    "level": Key(SUPPORTED, "L0, L1, mix, or debug (only save() records, into debug.json); L2 is refused"),
    "dump_enable": Key(
        SUPPORTED, "a bool; re-read from the file between steps, as msprobe does (config.read_dump_enable)"
    ),
    "extra_info": Key(
        SUPPORTED, "true only (msprobe's default): stack.json and construct.json are always written; false is refused"
    ),
    "async_dump": Key(
        SUPPORTED, "a bool; the dump is always written by a background thread, so both values give the same files"
    ),
    "precision": Key(SUPPORTED, "'low' only (msprobe's default); 'high' is refused"),
    "risk_level": Key(SUPPORTED, "'ALL' only: every API is recorded; FOCUS and CORE are refused"),
    "custom_op_namespaces": Key(
        SUPPORTED,
        "a list of torch.ops namespaces (identifiers); null = msprobe's "
        "['_C_ascend']: every op of them with a default overload is recorded "
        "as '{namespace}.{op}', as msprobe does (docs/custom-ops.md)",
    ),
    "load": Key(
        REFUSED,
        "replacing module inputs with dumped tensors is not supported; load the .pt files of a "
        "task 'tensor' dump yourself",
    ),
    # kept from earlier msprobe releases, whose PrecisionDebugger called seed_all(seed, mode=is_deterministic)
    "seed": Key(OURS, "an int in [0, 2**32-1]; seed_all(seed, mode=is_deterministic) runs when the debugger is built"),
    "is_deterministic": Key(
        OURS, "a bool; with seed (1234 if absent), asks for deterministic algorithms (seed_all's mode)"
    ),
}

LOAD_KEYS = {
    name: Key(REFUSED, "part of 'load', which is refused")
    for name in ("path", "modules", "step", "rank", "dump_after_load")
}

_SECTION_KEYS = {
    "scope": Key(
        SUPPORTED,
        "two full dump names, the start and the end of a range, as msprobe: "
        "['Torch.relu.1.forward', 'Functional.gelu.3.forward'] (forward entries), backward "
        "names for backward entries, module names at L0 and mix",
    ),
    "list": Key(
        SUPPORTED,
        "full dump names or substrings of them; at mix a module entry also selects the "
        "forward entries called inside that module",
    ),
    "data_mode": Key(SUPPORTED, "a list of all, input, output, forward, backward ('all' alone)"),
    "summary_mode": Key(SUPPORTED, f"one of {', '.join(SUMMARY_MODES)} (docs/bit-exact.md); xor is refused"),
    "slice": Key(
        REFUSED, "tensor slicing is not supported; use task 'tensor' and slice the saved .pt files", neutral=(None, [])
    ),
    "request_id": Key(
        REFUSED,
        "request slicing (an inference feature built on slice) is not supported; use step to choose what is dumped",
        neutral=(None, ""),
    ),
    "diff_nums": Key(
        REFUSED,
        "used only by msprobe's diff_check task, which is not supported; use 'msprobe-rewrite compare' on two dumps",
        neutral=(None, 1),
    ),
    "tensor_list": Key(
        REFUSED,
        "saving full tensors of some APIs during a statistics dump is not supported; "
        "run task 'tensor' with list set to those APIs",
        neutral=(None, []),
    ),
    "bench_path": Key(
        REFUSED,
        "used only by msprobe's benchmark comparison, which is not supported; "
        "use 'msprobe-rewrite compare' on two dumps",
        neutral=(None, ""),
    ),
    # ours: exact NaN and Inf counts per floating tensor (msprobe has none). On by default: the native
    # statistics pass (native_stats.py) counts them at no measurable cost (a tensor is read a second time
    # only where it holds a NaN or an Inf; docs/benchmarks-log.md, 'One fused pass per tensor'). Where that op
    # cannot be built the torch-op fallback pays two more passes per tensor; false turns them off.
    "nan_inf_count": Key(OURS, "a bool, default true: exact NaN and Inf counts per floating tensor"),
}

# msprobe 26.2's section keys per task (its pt_config classes); sections of tasks we do not run are only
# checked for being objects, as msprobe ignores every section but the chosen task's
_MSPROBE_SECTION_KEYS = {
    "statistics": ("scope", "list", "data_mode", "summary_mode", "slice", "request_id", "diff_nums", "tensor_list"),
    "tensor": ("scope", "list", "data_mode", "summary_mode", "slice", "request_id", "diff_nums", "bench_path"),
    "acc_check": (
        "scope",
        "list",
        "data_mode",
        "summary_mode",
        "slice",
        "request_id",
        "diff_nums",
        "white_list",
        "black_list",
        "error_data_path",
    ),
    "structure": ("scope", "list", "data_mode", "summary_mode", "slice", "request_id", "diff_nums"),
    "diff_check": ("scope", "list", "data_mode", "summary_mode", "slice", "request_id", "diff_nums"),
    "nan_check": ("scope", "list", "data_mode", "summary_mode", "slice", "request_id", "diff_nums", "tensor_list"),
}


def _section_table():
    table = {}
    for task, names in _MSPROBE_SECTION_KEYS.items():
        if task in TASKS:
            keys = dict.fromkeys(names + ("nan_inf_count",))
            table[task] = {name: _SECTION_KEYS[name] for name in keys}
        else:
            table[task] = {name: Key(INACTIVE, _MSPROBE_ONLY_TASK.format(task=task)) for name in names}
    return table


SECTION_KEYS = _section_table()  # task -> key -> Key

# refusals of values of supported keys: (key, value) -> why, and what to use instead
REFUSED_TASKS = {
    "acc_check": "collect with task 'tensor' at level L1 for one step, then 'msprobe-rewrite precheck DUMP' "
    "replays every API against a float64 golden on the CPU ('msprobe-rewrite precheck --help')",
    "structure": "use task 'statistics': construct.json is written with every dump",
    "diff_check": "dump both runs with task 'statistics' and compare them with 'msprobe-rewrite compare'",
    "nan_check": "use task 'statistics': NaN shows in Max/Min, and NaN and Inf are counted (nan_inf_count)",
}
REFUSED_LEVELS = {
    "L2": "kernel dumps need the NPU runtime's own dump; use L1 for APIs",
}


def keys():
    """Every handled key as ``{"dotted.path": Key}``: the table behind docs/msprobe-compatibility.md."""
    out = {}
    for name, key in COMMON_KEYS.items():
        out[name] = key
    for name, key in LOAD_KEYS.items():
        out[f"load.{name}"] = key
    for task, table in SECTION_KEYS.items():
        out[task] = Key(
            SUPPORTED if task in TASKS else INACTIVE,
            f"the options of task {task!r}" if task in TASKS else _MSPROBE_ONLY_TASK.format(task=task),
        )
        for name, key in table.items():
            out[f"{task}.{name}"] = key
    return out


@dataclass
class DebuggerConfig:
    task: str = "statistics"
    dump_path: Optional[str] = None
    rank: List[int] = field(default_factory=list)
    step: List[int] = field(default_factory=list)
    level: str = "L1"
    async_dump: bool = False
    dump_enable: Optional[bool] = None  # None: not in the file, so never re-read (msprobe's static mode)
    scope: List[str] = field(default_factory=list)
    list: List[str] = field(default_factory=list)
    data_mode: List[str] = field(default_factory=lambda: ["all"])
    summary_mode: str = "statistics"
    nan_inf_count: bool = True
    custom_op_namespaces: List[str] = field(default_factory=lambda: list(DEFAULT_CUSTOM_OP_NAMESPACES))
    seed: Optional[int] = None
    is_deterministic: bool = False
    config_path: Optional[str] = None

    def wants_step(self, step):
        return not self.step or step in self.step

    def wants_rank(self, rank):
        return not self.rank or rank is None or rank in self.rank


# ----------------------------------------------------------------- value checks


def _refuse(path, why):
    raise ConfigError(f"{path}: {why}")


def _did_you_mean(name, known):
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(sorted(known))}"


def _bool(value, path):
    if type(value) is not bool:  # "false" and 0 are not booleans: a string "false" would read as true
        _refuse(path, f"expected true or false, got {value!r} ({type(value).__name__})")
    return value


def _choice(value, path, allowed, refused=None):
    if not isinstance(value, str):
        _refuse(path, f"expected a string, one of {', '.join(allowed)}; got {value!r}")
    if refused and value in refused:
        _refuse(path, f"{value!r} is accepted by msprobe but not supported here: {refused[value]}")
    if value not in allowed:
        close = difflib.get_close_matches(value, list(allowed), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        _refuse(path, f"{value!r} is not one of {', '.join(allowed)}{hint}")
    return value


def parse_ints(value, name):
    """msprobe's step/rank lists: ints and ``"a-b"`` ranges, each in [0, 10**6]."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        _refuse(
            name,
            f"expected a list of ints and 'a-b' ranges, got {value!r}; write [{value!r}]"
            if isinstance(value, int) and not isinstance(value, bool)
            else f"expected a list of ints and 'a-b' ranges, got {value!r}",
        )
    out = []
    for item in value:
        if type(item) is int:
            numbers = [item]
        elif isinstance(item, str) and re.fullmatch(r"\s*\d+\s*-\s*\d+\s*", item):
            lo, hi = (int(part) for part in item.split("-"))
            if hi < lo:
                _refuse(name, f"range {item!r} runs backwards")
            numbers = [lo, hi]
        else:
            _refuse(name, f"{item!r} is not an int or an 'a-b' range of ints")
        for number in numbers:
            if not 0 <= number <= STEP_RANK_MAX:
                _refuse(name, f"{number} is outside [0, {STEP_RANK_MAX}]")
        out.extend(range(numbers[0], numbers[-1] + 1))
    return sorted(set(out))


def _strings(value, path):
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        _refuse(path, f"expected a list of strings, got {value!r}")
    return list(value)


def _namespaces(value, path):
    """config.json's ``custom_op_namespaces``: msprobe's list of strings (null: its default). A string that is
    not an identifier is refused: ``"torch.ops.mylib"`` or ``"mylib::op"`` record nothing in msprobe, silently,
    and a namespace torch allows but Python cannot spell (``my-lib``) is never written ``torch.ops.<ns>.op``
    in a call site. The message gives the spelling meant where the mistake is a common one."""
    if value is None:
        return list(DEFAULT_CUSTOM_OP_NAMESPACES)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        _refuse(path, f'expected a list of torch.ops namespace names (strings), such as ["mylib"]; got {value!r}')
    for name in value:
        if name.isidentifier():
            continue
        hint = ""
        if name.startswith("torch.ops.") and name[len("torch.ops.") :].isidentifier():
            hint = f"; did you mean {name[len('torch.ops.') :]!r}?"
        elif "::" in name and name.split("::", 1)[0].isidentifier():
            hint = f"; give the namespace alone: {name.split('::', 1)[0]!r}"
        _refuse(
            path, f"{name!r} is not a torch.ops namespace name (an identifier, as in torch.ops.mylib.op: 'mylib'){hint}"
        )
    return list(dict.fromkeys(value))


def _path(value, path):
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        _refuse(path, f"expected a path string, got {value!r} ({type(value).__name__})")
    if not value.strip():
        _refuse(path, "is empty; give the folder the dump is written to")
    return value


def _scope(value, path, level):
    names = _strings(value, path)
    if not names:
        return []
    if len(names) != 2:
        _refuse(
            path,
            f"give exactly two full dump names, the start and the end of the range "
            f"(got {len(names)}); to select single names use list",
        )
    kinds = []
    for name in names:
        kind = dump_names.scope_kind(name)  # msprobe's scope check of a full dump name
        if kind is not None:
            kinds.append(kind)
        else:
            hint = ""
            if dump_names.scope_kind(name + ".forward") == "api":
                hint = f"; did you mean {name + '.forward'!r}?"
            _refuse(
                path,
                f"{name!r} is not a full dump name such as 'Torch.relu.1.forward' or "
                f"'Module.net1.Linear.forward.0'{hint}",
            )
    if level == "L1" and "module" in kinds:
        _refuse(path, "at level L1 only APIs are recorded, so a module name never matches; use level mix, or API names")
    if level == "L0" and "api" in kinds:
        _refuse(
            path, "at level L0 only modules are recorded, so an API name never matches; use level mix, or module names"
        )
    if level != "mix" and kinds[0] != kinds[1]:
        _refuse(path, "a range from an API to a module (or back) needs level mix")
    return names


def _list(value, path):
    names = _strings(value, path)
    for name in names:
        if not name:
            _refuse(path, "an empty string would match every name; remove it")
        if name.startswith("name-regex(") and name.endswith(")"):
            _refuse(
                path,
                f"{name!r}: msprobe matches name-regex() only for MindSpore; list entries are "
                f"substrings of dump names here",
            )
    return names


def _data_mode(value, path):
    modes = _strings(value, path) or ["all"]
    for mode in modes:
        _choice(mode, path, DATA_MODES)
    if "all" in modes and len(modes) != 1:
        _refuse(path, "'all' cannot be combined with other modes")
    if len(modes) >= len(DATA_MODES):
        _refuse(path, f"at most {len(DATA_MODES) - 1} modes; use ['all']")
    return modes


def _check_keys(raw, table, where):
    for name in raw:
        if name not in table:
            label = f"{where}.{name}" if where else name
            _refuse(label, f"unknown key{_did_you_mean(name, table)}")
        key = table[name]
        if key.status == REFUSED and not any(
            raw[name] == value and type(raw[name]) is type(value) for value in key.neutral
        ):
            label = f"{where}.{name}" if where else name
            _refuse(label, f"accepted by msprobe but not supported here: {key.note}")


# ----------------------------------------------------------------- loading


def read_json(config_path):
    """The config file's top-level object."""
    try:
        with open(config_path, "r", encoding="utf-8") as handle:
            raw = json.load(handle)
    except OSError as error:
        raise ConfigError(f"cannot read config {config_path}: {error.strerror}") from error
    except json.JSONDecodeError as error:
        raise ConfigError(f"config {config_path} is not valid JSON: {error}") from error
    if not isinstance(raw, dict):
        raise ConfigError(f"config {config_path}: expected a JSON object")
    return raw


def read_dump_enable(config_path):
    """``dump_enable`` as the file says now (msprobe re-reads it between steps); None when the key is absent.

    Raises ConfigError when the file cannot be read or the value is not a bool, so a caller doing hot reload
    can keep its last value and warn.
    """
    raw = read_json(config_path)
    if raw.get("dump_enable") is None:
        return None
    return _bool(raw["dump_enable"], "dump_enable")


def load_config(config_path=None, task=None, dump_path=None, level=None, step=None):
    """The effective configuration: config.json (if any), then the constructor's arguments."""
    raw = {}
    if config_path is not None:
        config_path = _path(config_path, "config_path")
        raw = read_json(config_path)
    return config_from_dict(raw, task, dump_path, level, step, config_path)


def accepts_value(key, value):
    """Whether config.json may set ``key`` (a common key, or a key of the statistics section) to ``value``;
    ``data_mode`` is tried as the one-element list ``[value]``."""
    raw = {"dump_path": "dump"}
    if key in COMMON_KEYS:
        raw[key] = value
    else:
        raw["statistics"] = {key: [value] if key == "data_mode" else value}
    try:
        config_from_dict(raw)
    except ConfigError:
        return False
    return True


def config_from_dict(raw, task=None, dump_path=None, level=None, step=None, config_path=None):
    """``load_config`` on an already parsed config.json object."""
    table = dict(COMMON_KEYS)
    table.update({name: Key(SUPPORTED, "") for name in SECTION_KEYS})
    _check_keys(raw, table, "")
    config = DebuggerConfig(config_path=config_path)

    if task is not None:
        config.task = _choice(task, "task (argument)", TASKS, REFUSED_TASKS)
    elif raw.get("task") is not None:
        config.task = _choice(raw["task"], "task", TASKS, REFUSED_TASKS)
    if level is not None:
        config.level = _choice(level, "level (argument)", LEVELS, REFUSED_LEVELS)
    elif raw.get("level") is not None:
        config.level = _choice(raw["level"], "level", LEVELS, REFUSED_LEVELS)

    if dump_path is not None:
        config.dump_path = _path(dump_path, "dump_path (argument)")
    elif raw.get("dump_path") is not None:
        config.dump_path = _path(raw["dump_path"], "dump_path")
    elif "dump_path" in raw:
        _refuse("dump_path", "is null; give the folder the dump is written to")
    else:
        raise ConfigError("dump_path is required (argument or config.json)")
    config.rank = parse_ints(raw.get("rank"), "rank")
    config.step = parse_ints(step, "step (argument)") if step is not None else parse_ints(raw.get("step"), "step")

    if raw.get("dump_enable") is not None:
        config.dump_enable = _bool(raw["dump_enable"], "dump_enable")
    if not _bool(raw.get("extra_info", True), "extra_info"):
        _refuse(
            "extra_info",
            "false is accepted by msprobe but not supported here: stack.json and "
            "construct.json are always written (they cost nothing while collection is off); "
            "remove the key",
        )
    config.async_dump = _bool(raw.get("async_dump", False), "async_dump")
    if raw.get("precision") is not None:
        _choice(
            raw["precision"],
            "precision",
            ("low",),
            {
                "high": "msprobe's 'high' leaves Mean and Norm out; here they are always computed, "
                "as msprobe's default 'low' does"
            },
        )
    if raw.get("risk_level") is not None:
        _choice(
            raw["risk_level"],
            "risk_level",
            ("ALL",),
            {
                "FOCUS": "it drops APIs such as reshape, cat and float; every API is recorded here "
                "(risk_level ALL); use list to narrow the dump",
                "CORE": "every API is recorded here (risk_level ALL); use list to narrow the dump",
            },
        )
    if raw.get("seed") is not None:
        seed = raw["seed"]
        if type(seed) is not int or not 0 <= seed <= SEED_MAX:
            _refuse("seed", f"expected an int in [0, {SEED_MAX}], got {seed!r}")
        config.seed = seed
    config.is_deterministic = _bool(raw.get("is_deterministic", False), "is_deterministic")
    config.custom_op_namespaces = _namespaces(raw.get("custom_op_namespaces"), "custom_op_namespaces")

    for name in SECTION_KEYS:  # other tasks' sections: msprobe never reads them, but they must be objects
        if name in raw and raw[name] is not None and not isinstance(raw[name], dict):
            _refuse(name, f"expected an object, got {raw[name]!r}")
    section = raw.get(config.task)
    if section is None:
        section = {}
    where = config.task
    _check_keys(section, SECTION_KEYS[config.task], where)
    config.scope = _scope(section.get("scope"), f"{where}.scope", config.level)
    config.list = _list(section.get("list"), f"{where}.list")
    config.data_mode = _data_mode(section.get("data_mode"), f"{where}.data_mode")
    if section.get("summary_mode") is not None:
        # msprobe's XOR of 64-bit words misses swapped words and cancels two flips of the same bit
        refused = {
            "xor": "its XOR of 64-bit words misses swapped words; use 'fingerprint' (a position-aware "
            "hash on the device, docs/bit-exact.md) or 'md5' (msprobe's CRC32)"
        }
        config.summary_mode = _choice(section["summary_mode"], f"{where}.summary_mode", SUMMARY_MODES, refused)
    config.nan_inf_count = _bool(section.get("nan_inf_count", True), f"{where}.nan_inf_count")
    config.dump_path = _utf8_path(os.path.abspath(os.path.expanduser(config.dump_path)))
    return config


def _utf8_path(path):
    """``path``, where its name is UTF-8 (checked whole: a relative dump_path takes the working folder's
    name). dump.json records the tensor folder's path as UTF-8 text, and msprobe's readers need it so; a name
    of other bytes (``os.fsdecode`` gives it lone surrogates) made every tensor-task step fail at its write,
    so it is refused here, before the first step trains (tests/runtime/test_config.py)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        _refuse(
            "dump_path",
            f"{os.fsencode(path)!r} is not a UTF-8 name, and dump.json records it as UTF-8 "
            "text; choose a folder whose path is UTF-8",
        )
    return path
