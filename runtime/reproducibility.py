"""seed_all's rm_dropout and is_enhanced without patching torch.

msprobe assigns new functions to ``F.dropout``/``F.dropout2d``/``F.dropout3d`` (rm_dropout) and wraps every
random API of ``torch``, ``torch.Tensor``, ``random`` and ``numpy.random`` (is_enhanced), for good. Here one
``TorchFunctionMode`` at the bottom of the calling thread's mode stack does both: a dropout call runs with
``p=0.0`` (what msprobe's replacement passes on), and a torch random call runs between two resets of the
random state saved by ``seed_all`` (what msprobe's wrappers do). Every torch attribute stays the object it
was, so ``from torch.nn.functional import dropout`` bound earlier is covered too, and ``restore()`` leaves
nothing behind. torch's mode stack is per thread and the autograd engine runs backward without it, so a global
*forward* module hook also puts the mode on the stack for each module call where it is missing: a recomputation
in backward (Megatron's and torch's reentrant checkpoint) and module calls on other threads drop out too.
"""

from __future__ import annotations

import random
import threading

import torch
from torch.overrides import TorchFunctionMode

# msprobe's random_api_list.yaml (torch_random, tensor_random)
_TORCH_RANDOM = (
    "bernoulli",
    "multinomial",
    "normal",
    "poisson",
    "rand",
    "rand_like",
    "randint",
    "randint_like",
    "randn",
    "randn_like",
    "randperm",
)
_TENSOR_RANDOM = (
    "bernoulli_",
    "cauchy_",
    "exponential_",
    "geometric_",
    "log_normal_",
    "multinomial",
    "normal_",
    "random_",
    "uniform_",
)


def _table(owner, names):
    return {id(fn): fn for fn in (getattr(owner, name, None) for name in names) if fn is not None}


def _dropouts():
    import torch.nn.functional as F

    found = _table(F, ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"))
    # torch's own kernels, which F's functions call and which code may call directly
    found.update(
        _table(
            torch,
            (
                "dropout",
                "dropout_",
                "feature_dropout",
                "feature_dropout_",
                "alpha_dropout",
                "alpha_dropout_",
                "feature_alpha_dropout",
                "feature_alpha_dropout_",
            ),
        )
    )
    return found


_DROPOUTS = _dropouts()
_RANDOM = {**_table(torch, _TORCH_RANDOM), **_table(torch.Tensor, _TENSOR_RANDOM)}


def _without_p(args, kwargs):
    """The call's arguments with the dropout probability 0.0 (``p`` is second in every dropout signature)."""
    if len(args) > 1:
        return (args[0], 0.0) + tuple(args[2:]), kwargs
    kwargs = dict(kwargs)
    kwargs["p"] = 0.0
    return args, kwargs


def _random_state():
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy
    except ImportError:
        numpy = None
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    npu = getattr(torch, "npu", None)
    if npu is not None and npu.is_available():
        state["npu"] = npu.get_rng_state_all()
    return state


def _set_random_state(state):
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "npu" in state:
        torch.npu.set_rng_state_all(state["npu"])


class ReproducibleMode(TorchFunctionMode):
    """Dropout off and/or torch's random APIs pinned to one saved state; everything else passes through."""

    def __init__(self, rm_dropout, fixed_state):
        super().__init__()
        self.rm_dropout = rm_dropout
        self.fixed_state = fixed_state

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        key = id(func)
        if self.rm_dropout and _DROPOUTS.get(key) is func:
            args, kwargs = _without_p(args, kwargs)
        elif self.fixed_state is not None and _RANDOM.get(key) is func:
            _set_random_state(self.fixed_state)
            try:
                return func(*args, **kwargs)
            finally:
                _set_random_state(self.fixed_state)
        return func(*args, **kwargs)


class _ModuleCalls:
    """Global forward hooks (never backward ones) that put ``mode`` at the bottom of the mode stack for a module
    call where it is not on the stack, and take it off when that call ends."""

    def __init__(self, mode):
        from torch.nn.modules import module as nn_module

        self.mode = mode
        self.local = threading.local()
        self.handles = [
            nn_module.register_module_forward_pre_hook(self._pre),
            nn_module.register_module_forward_hook(self._post, always_call=True),
        ]

    def _pre(self, module, args):
        pushed = self.local.__dict__.setdefault("pushed", [])
        missing = not _on_stack(self.mode)
        if missing:
            _insert_at_bottom(self.mode)
        pushed.append(missing)
        return None

    def _post(self, module, args, output):
        pushed = self.local.__dict__.get("pushed")
        if pushed and pushed.pop():
            _remove(self.mode)
        return None

    def remove(self):
        for handle in self.handles:
            handle.remove()
        self.handles = []


class Reproducibility:
    """What ``seed_all`` turned on; ``restore()`` (or leaving a ``with`` block) turns it off. Outside module
    calls it holds on the thread that called ``seed_all`` (torch's mode stack is per thread)."""

    def __init__(self, rm_dropout=False, is_enhanced=False):
        self.mode = None
        self._calls = None
        self._thread = threading.get_ident()
        if rm_dropout or is_enhanced:
            self.mode = ReproducibleMode(rm_dropout, _random_state() if is_enhanced else None)
            _insert_at_bottom(self.mode)
            self._calls = _ModuleCalls(self.mode)
            _active.append(self)

    def restore(self):
        """Dropout and random APIs behave as torch's own again (call it on the thread that called ``seed_all``)."""
        mode, self.mode = self.mode, None
        if mode is None:
            return
        if threading.get_ident() != self._thread:
            self.mode = mode
            raise RuntimeError("msprobe_runtime: restore() must run on the thread that called seed_all()")
        self._calls.remove()
        _remove(mode)
        if self in _active:
            _active.remove(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()
        return False


_active = []  # every Reproducibility still in force; a new seed_all replaces the one of its thread


def replace_for_thread():
    """Undo an earlier seed_all's mode on this thread, so two calls never stack two modes."""
    ident = threading.get_ident()
    for earlier in [r for r in _active if r._thread == ident]:
        earlier.restore()


def _stack():
    """Pop this thread's whole torch function mode stack, bottom first in the list."""
    modes = []
    while torch._C._len_torch_function_stack():
        modes.append(torch._C._pop_torch_function_stack())
    modes.reverse()
    return modes


def _on_stack(mode):
    for index in range(torch._C._len_torch_function_stack()):
        if torch._C._get_function_stack_at(index) is mode:
            return True
    return False


def _insert_at_bottom(mode):
    # at the bottom, so that no mode pushed later (the debugger's observing mode, the user's own) is ever
    # popped in its place: every other mode keeps its own push and pop order
    modes = _stack()
    for item in [mode] + modes:
        torch._C._push_on_torch_function_stack(item)


def _remove(mode):
    modes = _stack()
    for item in modes:
        if item is not mode:
            torch._C._push_on_torch_function_stack(item)
