"""msprobe_runtime: what instrumented code calls, and the debugger that collects.

Importing this package imports neither torch nor libcst: a rewritten tree imports it at the top of every
module, on machines that may have no libcst, and before torch_npu or any device is set up.
"""
from .shims import (  # noqa: F401  (the instrumented code's contract, docs/contract.md)
    add, and_, attr, aug, call, dyn, eq, floordiv, ge, gt, iadd, iand, ifloordiv, ilshift, imatmul, imod,
    imul, invert, ior, ipow, irshift, isub, item, itruediv, ixor, le, lshift, lt, matmul, mod, mul, ne,
    neg, or_, pos, pow, rshift, sub, truediv, xor,
)
from .debugger import PrecisionDebugger  # noqa: F401  (imports no torch: torch loads at start())
from .seeding import seed_all  # noqa: F401

__version__ = "0.1.0"
