# lint-args: --select MSP901
# No torch import: nothing here can call a torch API, so unresolved calls are not worth reporting.
import numpy as np


def f(obj, x):
    return obj.method(x) + np.sum(x)
