"""msprobe_runtime: what instrumented code calls, and the debugger that collects.

Importing this package imports neither torch nor libcst: a rewritten tree imports it at the top of every
module, on machines that may have no libcst, and before torch_npu or any device is set up.
"""
from . import shims as _shims
from .operators import STORE as _STORE, TABLE as _OPERATORS
from .shims import attr, aug, call, dyn, item  # noqa: F401  (the instrumented code's contract, docs/contract.md)

# the operator entry points (add, neg, iadd, ...), one per row of the operator table
globals().update({_row.entry: getattr(_shims, _row.entry) for _row in _OPERATORS if _row.kind != _STORE})
truth = _shims.truth
# while no debugger collects, truth, dyn and the operators are the plain operations (start() swaps them)
_shims.set_collecting(False)
# imports no torch: torch loads at start()
from .debugger import PrecisionDebugger, module_dump, module_dump_end  # noqa: F401
from .seeding import seed_all  # noqa: F401

__version__ = "0.1.0"
