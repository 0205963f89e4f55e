"""The monitor's config file: msprobe 26.2's TrainerMon keys, each honoured or refused with a ConfigError.

msprobe reads its monitor config with ``self.config.get(...)`` in ``pytorch/monitor/module_hook.py`` and
``config.get(...)`` in ``core/monitor/utils.py`` (validate_config); ``MSPROBE_KEYS`` is the snapshot of those names,
which tests/monitor/test_config.py regenerates from msprobe's source and compares. A key msprobe does not read is
refused with the nearest known key named (as runtime/config.py refuses config.json keys), and so is a value that
asks for a feature this monitor does not have yet: silently ignoring it would leave the user believing it ran.
Importing this module imports no torch.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, NoReturn

from ..config import INACTIVE, OURS, REFUSED, SUPPORTED, ConfigError, Key

# msprobe's MonitorConst (core/common/const.py)
OP_LIST = ("norm", "min", "max", "zeros", "nans", "id", "mean", "shape", "dtype")
RULE_NAMES = ("AnomalyTurbulence", "AnomalyNan")
OUR_RULE_NAMES = ("AnomalySpike",)  # ours: msprobe has no such rule (docs/monitor.md, "Flight recorder ...")
SPIKE_ARGS = {"k": 6.0, "window": 50, "warmup": 10}  # AnomalySpike's arguments and their defaults
CAPTURE_LEVELS = ("mix", "L0", "L1")
CAPTURE_SCOPES = ("anomalous", "all")
SA_ORDERS = ("s,b,h,d", "b,s,h,d")
FORMATS = ("csv", "tensorboard")
FLUSH_MODES = ("auto", "async", "sync")  # ours: how the flush's copy reaches the host (transfer.py)
MAX_NDIGITS = 20
L2_HOOKS = ("linear_hook", "attention_hook", "moe_router_weight_hook", "moe_router_logit_hook")

# The top-level keys msprobe 26.2's monitor reads, from its source (tests/monitor/test_config.py regenerates it).
MSPROBE_KEYS = (
    "alert",
    "all_xy",
    "append_output",
    "backward_only",
    "cc_distribution",
    "collect_times",
    "dynamic_on",
    "eps",
    "format",
    "forward_only",
    "l2_targets",
    "mg_direction",
    "mg_distribution",
    "module_ranks",
    "monitor_mbs_grad",
    "mv_distribution",
    "ndigits",
    "ops",
    "param_distribution",
    "print_struct",
    "recording_l2_features",
    "sa_order",
    "squash_name",
    "stack_info",
    "start_step",
    "step_count_per_record",
    "step_interval",
    "targets",
    "ur_distribution",
    "wg_distribution",
    "xy_distribution",
)

_NOT_YET = "not yet (docs/monitor.md)"

KEYS = {
    "targets": Key(
        SUPPORTED,
        "a dict whose keys are parameter-name prefixes ('fc1', '0:fc1'); {} = every "
        "parameter; with xy_distribution the modules whose name is a key (exactly, as msprobe); the values "
        "(msprobe's input/output fields) are checked to be dicts and not read, as in msprobe 26.2",
    ),
    "wg_distribution": Key(SUPPORTED, "a bool: weight-gradient statistics, grad_unreduced_* and grad_reduced_*"),
    "param_distribution": Key(
        SUPPORTED, "a bool: weight statistics before and after the step, param_origin_* and param_updated_*"
    ),
    "mv_distribution": Key(SUPPORTED, "a bool: Adam exp_avg and exp_avg_sq statistics, exp_avg_* and exp_avg_sq_*"),
    "ur_distribution": Key(
        OURS,
        "a bool: statistics of Adam's update m^/(sqrt(v^)+eps) and ratio m^/sqrt(v^), "
        "adam_update_* and adam_ratio_* (msprobe 26.2 cancels it with CSV output)",
    ),
    "ops": Key(SUPPORTED, f"a list of {', '.join(OP_LIST)}; shape and dtype are always added, as msprobe does"),
    "eps": Key(SUPPORTED, "a float: |x| < eps counts as a zero for the zeros op"),
    "ndigits": Key(SUPPORTED, f"a positive int up to {MAX_NDIGITS}: digits kept in the CSV"),
    "start_step": Key(SUPPORTED, "an int >= 0: the first step collected"),
    "step_interval": Key(SUPPORTED, "an int >= 1: collect every step_interval steps"),
    "collect_times": Key(SUPPORTED, "an int >= 0: stop (hooks removed) after this many collected steps"),
    "module_ranks": Key(SUPPORTED, "a list of ints: the ranks that collect; [] = every rank"),
    "format": Key(SUPPORTED, "csv, or tensorboard (torch's SummaryWriter; msprobe 26.2 falls back to csv)"),
    "alert": Key(
        SUPPORTED,
        "{'rules': [{'rule_name': 'AnomalyTurbulence', 'args': {'threshold': 0.5}}, "
        "{'rule_name': 'AnomalyNan'}], 'dump': true}; dump writes anomaly_detected/",
    ),
    "step_count_per_record": Key(SUPPORTED, "an int >= 1: steps per CSV file (grad_reduced_0-9.csv)"),
    "squash_name": Key(SUPPORTED, "a bool: shorten names to their layers.N... tail, as msprobe does"),
    "xy_distribution": Key(
        SUPPORTED,
        "a bool: activation statistics of the targeted modules' inputs and outputs (actv_*) and of their "
        "gradients (actv_grad_*); modules named exactly by targets' keys, every module if targets is empty",
    ),
    "all_xy": Key(SUPPORTED, "a bool: with xy_distribution, every module whatever targets says"),
    "forward_only": Key(SUPPORTED, "a bool: with xy_distribution, actv_* only"),
    "backward_only": Key(SUPPORTED, "a bool: with xy_distribution, actv_grad_* only"),
    "mg_direction": Key(
        SUPPORTED,
        "a bool: the share of gradient elements whose sign agrees with Adam's exp_avg, other_* (tag .../mg_direction)",
    ),
    "cc_distribution": Key(
        REFUSED,
        "communication statistics (cc_distribution) are not yet supported (docs/monitor.md); "
        "use {} or {'enable': false}",
    ),
    "print_struct": Key(REFUSED, f"printing the module structure is {_NOT_YET}", neutral=(False,)),
    "stack_info": Key(REFUSED, f"stack_info.csv is {_NOT_YET}", neutral=(False,)),
    "monitor_mbs_grad": Key(REFUSED, f"per-microbatch gradients are {_NOT_YET}", neutral=(False,)),
    "recording_l2_features": Key(REFUSED, f"L2 features are {_NOT_YET}", neutral=(False,)),
    "l2_targets": Key(REFUSED, f"L2 features are {_NOT_YET}", neutral=({},)),
    "append_output": Key(REFUSED, f"appending to an earlier output folder is {_NOT_YET}", neutral=([],)),
    "dynamic_on": Key(
        INACTIVE,
        "a bool; read by msprobe only under DYNAMIC_MONITOR=true, which is refused here "
        f"(reloading the config mid-run is {_NOT_YET})",
    ),
    "sa_order": Key(INACTIVE, f"one of {', '.join(SA_ORDERS)}; read only with recording_l2_features"),
    "mg_distribution": Key(INACTIVE, "a bool; msprobe validates it and never reads it"),
}


# ours, not msprobe's: read only here (KEYS stays msprobe's snapshot, which tests/monitor/test_config.py checks)
OUR_KEYS = {
    "flight_recorder": Key(
        OURS, "{'steps': K}: the last K collected steps' figures, written beside anomaly.json when a rule fires"
    ),
    "on_anomaly": Key(
        OURS,
        "{'level': 'mix', 'scope': 'anomalous', 'steps': 1}: a PrecisionDebugger dump of the next steps "
        "(and of the replay), limited to the modules the rule named",
    ),
    "flush": Key(
        OURS,
        "auto, async or sync: async reads a collected step's figures on the host one collected step later (no "
        "host sync); auto = async for figures on CUDA or an NPU unless on_anomaly or a replay is set, else sync",
    ),
}


@dataclass
class Rule:
    name: str
    threshold: float | None = None
    k: float | None = None  # AnomalySpike: standard deviations above the window's mean
    window: int | None = None  # AnomalySpike: values kept
    warmup: int | None = None  # AnomalySpike: values seen before it may fire


@dataclass
class OnAnomaly:
    level: str = "mix"
    scope: str = "anomalous"
    steps: int = 1
    times: int = 1  # captures (and replays) per run: a NaN that stays fires every step after


@dataclass
class MonitorConfig:
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)
    wg_distribution: bool = False
    param_distribution: bool = False
    mv_distribution: bool = False
    mg_direction: bool = False
    ur_distribution: bool = False
    ops: list[str] = field(default_factory=lambda: ["norm", "shape", "dtype"])
    eps: float = 1e-8
    ndigits: int = 6
    start_step: int = 0
    step_interval: int = 1
    collect_times: int = 100000000
    module_ranks: list[int] = field(default_factory=list)
    format: str = "csv"
    rules: list[Rule] = field(default_factory=list)
    anomaly_dump: bool = False
    step_count_per_record: int = 1
    squash_name: bool = False
    flight_recorder_steps: int = 0  # ours: 0 = no flight recorder
    on_anomaly: OnAnomaly | None = None  # ours: no deep capture when None
    flush: str = "auto"  # ours: FLUSH_MODES
    xy_distribution: bool = False
    all_xy: bool = False
    forward_only: bool = False
    backward_only: bool = False

    @property
    def numeric_ops(self) -> list[str]:
        """The ops computed on the device, in the CSV's column order (shape and dtype come from the tensor's
        metadata on the host)."""
        return [op for op in self.ops if op not in ("shape", "dtype")]


def _refuse(path: str, why: str) -> NoReturn:
    raise ConfigError(f"monitor config {path}: {why}")


def _nearest(name: str, known: Iterable[str], cutoff: float = 0.6) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(known))}"


def _bool(value: Any, path: str) -> bool:
    if type(value) is not bool:
        _refuse(path, f"expected true or false, got {value!r}")
    return value


def _int(value: Any, path: str, minimum: int, maximum: int | None = None) -> int:
    if type(value) is not int or value < minimum or (maximum is not None and value > maximum):
        bound = f"an int in [{minimum}, {maximum}]" if maximum is not None else f"an int >= {minimum}"
        _refuse(path, f"expected {bound}, got {value!r}")
    return value


def _ops(value: Any) -> list[str]:
    if not isinstance(value, list):
        _refuse("ops", f"expected a list of {', '.join(OP_LIST)}; got {value!r}")
    ops: list[str] = []
    for op in value:
        if op not in OP_LIST:
            _refuse("ops", f"{op!r} is not an op{_nearest(str(op), OP_LIST, 0.5)}")
        if op not in ops:
            ops.append(op)
    if not [op for op in ops if op not in ("shape", "dtype")]:
        ops.insert(0, OP_LIST[0])  # msprobe's validate_ops: no valid op -> norm
    for extra in ("shape", "dtype"):  # msprobe always adds both columns
        if extra not in ops:
            ops.append(extra)
    return ops


def _rules(alert: Any) -> tuple[list[Rule], bool]:
    if not isinstance(alert, dict):
        _refuse("alert", f"expected a dict with 'rules' and 'dump', got {alert!r}")
    for key in alert:
        if key not in ("rules", "dump"):
            _refuse(f"alert.{key}", f"not an alert key{_nearest(str(key), ('rules', 'dump'))}")
    specs = alert.get("rules") or []
    if not isinstance(specs, list):
        _refuse("alert.rules", f"expected a list of {{'rule_name': ..., 'args': {{'threshold': ...}}}}, got {specs!r}")
    rules: list[Rule] = []
    for index, spec in enumerate(specs):
        path = f"alert.rules[{index}]"
        if not isinstance(spec, dict):
            _refuse(path, f"expected a dict, got {spec!r}")
        for key in spec:
            if key not in ("rule_name", "args"):
                _refuse(f"{path}.{key}", f"not a rule key{_nearest(str(key), ('rule_name', 'args'))}")
        name = spec.get("rule_name")
        if name not in RULE_NAMES + OUR_RULE_NAMES:
            known = RULE_NAMES + OUR_RULE_NAMES
            _refuse(f"{path}.rule_name", f"{name!r} is not a rule{_nearest(str(name), known, 0.5)}")
        args = spec.get("args") or {}
        if not isinstance(args, dict):
            _refuse(f"{path}.args", f"expected a dict, got {args!r}")
        if name == "AnomalySpike":
            rules.append(_spike_rule(args, f"{path}.args"))
            continue
        for key in args:
            if key != "threshold":
                _refuse(f"{path}.args.{key}", f"not a rule argument{_nearest(str(key), ('threshold',))}")
        threshold = args.get("threshold")
        if threshold is not None and (type(threshold) not in (int, float) or threshold < 0):
            _refuse(f"{path}.args.threshold", f"expected a number >= 0, got {threshold!r}")
        if name == "AnomalyTurbulence" and threshold is None:
            # msprobe skips such a rule with a warning: a rule the user wrote would then never fire
            _refuse(f"{path}.args.threshold", "AnomalyTurbulence needs a threshold")
        rules.append(Rule(name, None if threshold is None else float(threshold)))
    dump = alert.get("dump", False)
    return rules, _bool(dump, "alert.dump")


def _spike_rule(args: dict[str, Any], path: str) -> Rule:
    for key in args:
        if key not in SPIKE_ARGS:
            _refuse(f"{path}.{key}", f"not an AnomalySpike argument{_nearest(str(key), SPIKE_ARGS)}")
    k = args.get("k", SPIKE_ARGS["k"])
    if type(k) not in (int, float) or not 0 < k < float("inf"):
        _refuse(f"{path}.k", f"expected a number > 0 (standard deviations), got {k!r}")
    window = _int(args.get("window", SPIKE_ARGS["window"]), f"{path}.window", 2, 100000)
    warmup = _int(args.get("warmup", min(int(SPIKE_ARGS["warmup"]), window)), f"{path}.warmup", 2, window)
    return Rule("AnomalySpike", k=float(k), window=window, warmup=warmup)


def _flight_recorder(value: Any) -> int:
    if not isinstance(value, dict):
        _refuse("flight_recorder", f"expected {{'steps': K}}, got {value!r}")
    for key in value:
        if key != "steps":
            _refuse(f"flight_recorder.{key}", f"not a flight_recorder key{_nearest(str(key), ('steps',))}")
    return _int(value.get("steps", 16), "flight_recorder.steps", 1, 100000)


def _on_anomaly(value: Any) -> OnAnomaly:
    if not isinstance(value, dict):
        _refuse("on_anomaly", f"expected {{'level': 'mix', 'scope': 'anomalous', 'steps': 1}}, got {value!r}")
    known = ("level", "scope", "steps", "times")
    for key in value:
        if key not in known:
            _refuse(f"on_anomaly.{key}", f"not an on_anomaly key{_nearest(str(key), known)}")
    out = OnAnomaly()
    out.level = value.get("level", out.level)
    if out.level not in CAPTURE_LEVELS:
        _refuse("on_anomaly.level", f"{out.level!r} is not one of {', '.join(CAPTURE_LEVELS)}")
    out.scope = value.get("scope", out.scope)
    if out.scope not in CAPTURE_SCOPES:
        _refuse("on_anomaly.scope", f"{out.scope!r} is not one of {', '.join(CAPTURE_SCOPES)}")
    if out.level == "L1" and out.scope == "anomalous":
        # the dump names modules only at L0 and mix; at L1 a module list selects nothing (runtime/selection.py)
        _refuse("on_anomaly.scope", "'anomalous' limits the dump to modules, which level L1 does not record; use mix")
    out.steps = _int(value.get("steps", out.steps), "on_anomaly.steps", 0, 1000)
    out.times = _int(value.get("times", out.times), "on_anomaly.times", 1, 1000)
    return out


def parse(raw: Any) -> MonitorConfig:
    """A MonitorConfig from the config file's dict; ConfigError names the first key it cannot honour."""
    if not isinstance(raw, dict):
        _refuse("", f"expected a JSON object, got {type(raw).__name__}")
    for key, value in raw.items():
        spec = KEYS.get(key) or OUR_KEYS.get(key)
        if spec is None:
            _refuse(key, f"not a monitor config key{_nearest(str(key), {**KEYS, **OUR_KEYS})}")
        if spec.status == REFUSED and not any(type(value) is type(n) and value == n for n in spec.neutral):
            if key == "cc_distribution" and isinstance(value, dict) and value.get("enable", False) is False:
                continue
            _refuse(key, f"{value!r} is not supported here: {spec.note}")
    config = MonitorConfig()
    targets = raw.get("targets", {})
    if not isinstance(targets, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in targets.items()):
        _refuse("targets", f"expected a dict of module name -> dict, got {targets!r}")
    config.targets = dict(targets)
    for name in (
        "wg_distribution",
        "param_distribution",
        "mv_distribution",
        "ur_distribution",
        "mg_direction",
        "squash_name",
        "xy_distribution",
        "all_xy",
        "forward_only",
        "backward_only",
    ):
        if name in raw:
            setattr(config, name, _bool(raw[name], name))
    if config.xy_distribution and config.forward_only and config.backward_only:
        # msprobe warns and hooks no module: the user would believe activations were collected
        _refuse("forward_only", "forward_only and backward_only together collect no activation; keep one")
    for name in ("dynamic_on", "mg_distribution"):
        if name in raw:
            _bool(raw[name], name)
    if "sa_order" in raw and str(raw["sa_order"]).replace(" ", "") not in SA_ORDERS:
        _refuse("sa_order", f"{raw['sa_order']!r} is not one of {', '.join(SA_ORDERS)}")
    config.ops = _ops(raw.get("ops", []))
    eps = raw.get("eps", 1e-8)
    if type(eps) is not float:
        _refuse("eps", f"expected a float, got {eps!r}")
    config.eps = eps
    if raw.get("ndigits") is not None:
        config.ndigits = _int(raw["ndigits"], "ndigits", 1, MAX_NDIGITS)
    config.start_step = _int(raw.get("start_step", 0), "start_step", 0)
    config.step_interval = _int(raw.get("step_interval", 1), "step_interval", 1)
    config.collect_times = _int(raw.get("collect_times", config.collect_times), "collect_times", 0)
    ranks = raw.get("module_ranks", [])
    if not isinstance(ranks, list) or any(type(rank) is not int for rank in ranks):
        _refuse("module_ranks", f"expected a list of ints, got {ranks!r}")
    config.module_ranks = list(ranks)
    fmt = raw.get("format", "csv")
    if fmt not in FORMATS:
        _refuse("format", f"{fmt!r} is not a format{_nearest(str(fmt), FORMATS, 0.3)}")
    config.format = fmt
    config.rules, config.anomaly_dump = _rules(raw.get("alert", {}))
    config.step_count_per_record = _int(raw.get("step_count_per_record", 1), "step_count_per_record", 1, 10**6)
    if "flight_recorder" in raw:
        config.flight_recorder_steps = _flight_recorder(raw["flight_recorder"])
    if "on_anomaly" in raw:
        config.on_anomaly = _on_anomaly(raw["on_anomaly"])
    flush = raw.get("flush", config.flush)
    if flush not in FLUSH_MODES:
        _refuse("flush", f"{flush!r} is not one of {', '.join(FLUSH_MODES)}{_nearest(str(flush), FLUSH_MODES, 0.3)}")
    config.flush = flush
    for key in ("flight_recorder", "on_anomaly"):
        if key in raw and not config.rules:  # both act when a rule fires: without one they would never act
            _refuse(key, "acts when an alert rule fires; add alert.rules (AnomalyNan, AnomalySpike, ...)")
    return config


def load(path: str) -> MonitorConfig:
    """Read and parse the config file at ``path``."""
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except OSError as error:
        raise ConfigError(f"cannot read monitor config {path}: {error.strerror}") from error
    except ValueError as error:
        raise ConfigError(f"monitor config {path} is not valid JSON: {error}") from error
    return parse(raw)
