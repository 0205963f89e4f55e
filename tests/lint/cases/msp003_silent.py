# lint-args: --select MSP003
# Plain functions are instrumented; a kernel body that calls only Tensor methods and operators has no
# catalogued API call to lose; an opted-out function (# msprobe: skip) is the user's choice.
import functools

import torch
from megatron.core.jit import jit_fuser


def plain(x):
    return torch.tanh(x)


@functools.lru_cache(maxsize=None)
def cached(n):
    return torch.zeros(n)


@jit_fuser
def only_tensor_methods(x):
    return x.sigmoid() * x + 1


def skipped(x):  # msprobe: skip
    return torch.relu(x)
