# lint-args: --select MSP004
# Containers of APIs that are never used to reach one: identity tests (what Megatron does), keys only,
# an unused table; containers of non-APIs; a table built at call time (not at import time); a local that
# shadows the module-level name.
import torch
import torch.nn.functional as F

SUPPORTED = (F.gelu, F.silu)
NAMES = {"gelu": F.gelu}
UNUSED = [torch.relu]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
LAYERS = {"linear": torch.nn.Linear}


def check(fn):
    if fn not in SUPPORTED:
        raise ValueError("Only support fusion of gelu and swiglu")
    return [name for name in NAMES], DTYPES["fp16"], LAYERS["linear"]


def at_call_time(x, name):
    table = {"gelu": F.gelu}
    return table[name](x)


def shadow(x, NAMES):
    return NAMES["gelu"](x)
