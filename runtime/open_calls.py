"""The named records that pass between the halves of one call while it runs: what a call's begin hands its end
(an API's, a module's, a compiled call's boundary), the module tracker's frame, and the bookkeeping of a module's
backward entry while its gradients arrive.

Each is a NamedTuple, made on the hot path with ``tuple.__new__(Kind, (...))`` (``make``): a NamedTuple's own
``__new__`` is a Python function, one more frame per call (bench/python_calls.py counts them), where
``tuple.__new__`` and the field reads are C.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional

make = tuple.__new__


class ApiCall(NamedTuple):
    """An API call begun (``Collector._begin_api``)."""

    name: str  # the call's name, ``Functional.gelu.0``
    forward: str  # its forward entry, ``Functional.gelu.0.forward``
    entry: Optional[Dict[str, Any]]  # the forward entry with the inputs' records, or None (not recorded)
    backward: bool  # whether its backward is selected


class ModuleCall(NamedTuple):
    """A module call begun (``Collector.module_forward_begin``)."""

    name: str  # ``Module.net.ln.LayerNorm.forward.0``
    entry: Optional[Dict[str, Any]]  # the forward entry with the inputs' records, or None
    parent: Optional[str]  # the module call it runs inside, or None
    backward_args: Any  # the call's positional arguments where its backward is hooked, else None


class Boundary(NamedTuple):
    """A call into compiled code begun (``Collector.begin_compiled``)."""

    kind: str  # "api" or "module"
    record: Any  # its ApiCall or ModuleCall (None: nothing recorded)
    target: Any  # the callable called (a module: the one whose entry it is)


class TrackerFrame(NamedTuple):
    """What a module call's pre-hook left for its post-hook (``module_tracking.ModuleTracker``)."""

    mode: Any  # the observing mode pushed for an uninstrumented forward, or None
    record: Optional[ModuleCall]  # the module's forward record, or None
    pushed: bool  # whether a code context was entered (``Collector.enter_code``)
    aside: Any  # the mode set aside for an instrumented forward, to push back, or None


class ApiBackwardHook(NamedTuple):
    """An API's native backward hook, at its index (``StepState.api_backward_hooks``)."""

    name: str  # the backward entry
    width: int  # its outputs counted


class HookedParameters(NamedTuple):
    """A module's parameters at ``start()`` (``backward.hook_parameters``)."""

    module: Any
    own: Any  # [(name, parameter)] of its own
    hooked: Any  # those of them whose gradients are hooked


class BackwardWait:
    """A module call's backward entry while its parts arrive: its outputs' and inputs' gradients and its
    parameters' accumulation; committed when ``parts`` reaches 0 (``backward.hook_module_backward``). The native
    op's hooks name it by its index in ``StepState.module_backward_hooks``."""

    __slots__ = ("name", "n_out", "n_in", "parts", "partial", "left")

    def __init__(self, name: str) -> None:
        self.name = name  # the backward entry
        self.n_out = 0  # gradients of its outputs (the entry's input field)
        self.n_in = 0  # gradients of its inputs (the entry's output field)
        self.parts = 0  # parts still to come
        self.partial: Dict[int, Any] = {}  # input slot -> the sum of its consumers' gradients so far
        self.left: Dict[int, int] = {}  # input slot -> consumer edges still to report


class ModuleDump(NamedTuple):
    """``module_dump(module, name)`` in force (``PrecisionDebugger``): ``narrowed`` is what the collector's
    narrowing replaced, and the prefix, while collecting; None otherwise."""

    module: Any
    name: str
    narrowed: Any = None
