# lint-args: --select MSP001
# getattr that reaches no catalogued API: dtypes and other non-API attributes, objects that are not
# catalogued namespaces, a getattr of the module's own, a single argument.
import os

import torch


def dtypes(name, obj, attr):
    fp8 = getattr(torch, "float8_e4m3fn", None)
    device = getattr(torch.accelerator.current_accelerator(), "type", "cpu")
    mine = getattr(obj, attr)
    env = getattr(os, attr)
    return fp8, device, mine, env


def shadowed(name):
    def getattr(obj, attr):
        return None

    return getattr(torch, name)
