"""What one step collects, made fresh at each step: a ``StepState`` per step, so that nothing of a step
outlives it by accident, and every table of a step is declared in one place.

The collector owns it (``Collector.step``) and replaces it in ``Collector.reset``; its hooks are removed then
(``remove_hooks``). Nothing else writes to it (tests/test_single_source.py).
"""

from __future__ import annotations

from typing import Any, Dict, List, Set, Tuple


class StepState:
    """The counters, entries, stacks, construct, saved tensors and backward bookkeeping of one step."""

    __slots__ = (
        "token",
        "hooks",
        "api_counts",
        "module_counts",
        "param_counts",
        "data",
        "stacks",
        "construct",
        "tensors",
        "tensor_records",
        "recent",
        "recent_checksums",
        "leaves",
        "api_backward_hooks",
        "module_backward_hooks",
        "backward_parents",
        "backward_names",
        "pending_backward",
        "param_waiters",
        "skipped_backward",
        "module_parameters",
    )

    def __init__(self) -> None:
        # a new object each step, held by this step's Python backward hooks: a hook whose step has ended stays
        # silent (backward._Observer). Not the StepState itself, so that a hook does not keep the step's tables.
        self.token = object()
        # torch's hooks of this step (backward.py's Python hooks): a tensor may outlive the step, as a parameter
        # that a module returns or takes does (megatron's linear layers return their bias), and a node with it
        # (a cache computed with grad). The native op drops its own (native/stats_op.cpp's drop_stale).
        self.hooks: List[Any] = []
        self.api_counts: Dict[str, int] = {}  # API dump name -> calls so far ("Functional.gelu" -> 3)
        self.module_counts: Dict[str, int] = {}  # module prefix -> calls so far
        self.param_counts: Dict[Tuple[str, str], int] = {}  # (module prefix, parameter name) -> gradients so far
        self.data: Dict[str, Any] = {}  # dump.json's entries, in the order they completed
        self.stacks: Dict[str, Any] = {}  # stack.json: forward entry -> its call stack
        self.construct: Dict[str, Any] = {}  # construct.json: entry -> its parent (or None)
        self.tensors: List[Any] = []  # task tensor: (file name, the tensor's copy) to write
        self.tensor_records = 0  # TensorRecords made this step (none: the flush need not look for them)
        self.recent: Dict[int, Any] = {}  # Collector._reuse's last few tensors read (the native Recorder's own)
        self.leaves: Dict[Any, Any] = {}  # Collector._reuse's parameters read this step, by place
        self.recent_checksums: Dict[int, Any] = {}  # Collector._checksum's last few tensors hashed
        # (backward entry name, its outputs counted) at each native API hook's index (Recorder.hook_api)
        self.api_backward_hooks: List[Any] = []
        # open_calls.ModuleBackwardHook at each module call's index (Recorder.hook_module)
        self.module_backward_hooks: List[Any] = []
        self.backward_parents: Dict[str, Any] = {}  # backward entry -> its parent module's forward entry
        self.backward_names: Dict[str, str] = {}  # a parent module's forward entry -> its backward entry
        self.pending_backward: Dict[str, Any] = {}  # module backward entries still waiting for some gradients
        # id(parameter) -> open_calls.BackwardWait of module backward entries waiting for its accumulation
        self.param_waiters: Dict[int, List[Any]] = {}
        self.skipped_backward: Set[str] = set()  # backward entries that scope left out, this step
        # id(module) -> (module, its parameters, recursively): Collector._parameters
        self.module_parameters: Dict[int, Any] = {}

    def remove_hooks(self) -> None:
        """Remove the torch hooks this step registered: a tensor or node that outlives its step would otherwise
        keep one dead hook a step."""
        for handle in self.hooks:
            handle.remove()
        self.hooks = []
