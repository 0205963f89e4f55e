# lint-args: --select MSP001
import torch
import torch.nn.functional as F
from torch import distributed as dist


def by_name(x, name, op):
    y = getattr(torch, name)(x)
    act = getattr(F, "gelu")
    z = getattr(torch.nn.functional, name)
    dist_op = getattr(dist, op)
    tensor_method = getattr(torch.Tensor, name)
    return y, act, z, dist_op, tensor_method


def suppressed(x, name):
    a = getattr(torch, name)  # msprobe: noqa[MSP001]
    b = getattr(torch, name)  # msprobe: noqa
    c = getattr(torch, name)  # msprobe: noqa[MSP004]
    return a, b, c
