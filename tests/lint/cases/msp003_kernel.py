# lint-args: --select MSP003
import torch
import torch.nn.functional as F
from megatron.core.jit import jit_fuser
from mypkg.kernels import triton  # a re-export of triton: recognised by the decorator's last name


@jit_fuser
def bias_gelu(bias, y):
    x = bias + y
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


@torch.jit.script
def swiglu(y):
    y_1, y_2 = torch.chunk(y, 2, -1)
    return F.silu(y_1) * y_2


@torch.compile(mode="max-autotune")
def compiled(x):
    def inner(v):
        return torch.sigmoid(v)

    return inner(x) + torch.erf(x)  # msprobe: noqa[MSP003]


@triton.jit
def kernel(x):
    return torch.exp(x)
