"""msprobe_runtime: what instrumented code calls, and the debugger that collects.

Importing this package imports neither torch nor libcst: a rewritten tree imports it at the top of every
module, on machines that may have no libcst, and before torch_npu or any device is set up.
"""

from . import shims as _shims
from .shims import attr, aug, builtin, call, dyn, item, iterate, iterate_unpacked, truth  # noqa: F401  (the instrumented code's contract, docs/contract.md)

# the operator entry points (add, neg, iadd, ..., one per row of the operator table): the same objects for the
# life of the process, collecting or not (shims' docstring)
globals().update(_shims.OPERATOR_ENTRIES)
from . import compiled_regions as _compiled_regions  # noqa: E402

_compiled_regions.register_when_loaded()  # with torch.compile, the entries are traced as plain calls
# imports no torch: torch loads at start()
from .debugger import PrecisionDebugger, module_dump, module_dump_end  # noqa: F401
from .seeding import seed_all  # noqa: F401


def __getattr__(name: str) -> object:
    # TrainerMon imports torch: loaded on first use, so that importing this package still loads none
    if name == "TrainerMon":
        from .monitor.trainer_mon import TrainerMon

        return TrainerMon
    if name == "MonitorCallback":  # imports transformers: on first use only
        from .monitor.callback import MonitorCallback

        return MonitorCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__version__ = "0.1.0"
