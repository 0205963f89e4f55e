# lint-args: --select MSP004
import torch
import torch.nn.functional as F

ACTIVATIONS = {"gelu": F.gelu, "silu": F.silu, "relu": torch.relu}
NORMS = [F.layer_norm, F.rms_norm]
REDUCTIONS = dict(sum=torch.sum, mean=torch.mean)
NESTED = {"gelu": (F.gelu, True)}


def activate(x, name):
    return ACTIVATIONS[name](x)


def later(x, name):
    act = ACTIVATIONS.get(name, F.relu)
    return act(x)


def every_norm(x):
    for norm in NORMS:
        x = norm(x, x.shape[-1:])
    return x


def every_reduction(x):
    return [fn(x) for fn in REDUCTIONS.values()]


def nested(x, name):
    fn, _ = NESTED[name]
    return fn(x)


class Block:
    ACT = {"tanh": torch.tanh}

    def forward(self, x, name):
        return self.ACT[name](x)


def suppressed(x, name):
    return ACTIVATIONS[name](x)  # msprobe: noqa[MSP004]


REGISTRY = {}
REGISTRY["softmax"] = F.softmax
REGISTRY["identity"] = lambda x: x


def from_registry(x, name):
    return REGISTRY[name](x)
