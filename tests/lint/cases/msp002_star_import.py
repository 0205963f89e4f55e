# lint-args: --select MSP002
from torch import *
from torch.nn.functional import *
from torch.distributed import *  # msprobe: noqa[MSP002]


def f(x):
    return relu(x)
