"""Activation statistics per targeted module (msprobe's ``xy_distribution``): ``actv_*.csv`` and
``actv_grad_*.csv``, as msprobe 26.2's ``TrainerMon._hook_module`` names them, without a module backward hook.

msprobe (pytorch/monitor/module_hook.py) hangs a forward hook (with kwargs) and a full backward hook on each
targeted module. Names, as there: ``{vpp}:{module}.input`` / ``.output``, with ``_{i}`` after the field when it
holds more than one item, then ``:{micro_step}`` (the module's call count modulo ``grad_acc_steps``, a CSV column
of its own) and ``/rank{R}/actv`` or ``/actv_grad``. Forward inputs are the tensors among the positional arguments
and then the keyword arguments; outputs a tensor, or each item of a tuple/list (a non-tensor item is a NaN row; a
dict output gives none). Backward inputs are the positional arguments (a non-tensor or one without a gradient is
a NaN row, as msprobe's ``None``), outputs as in the forward. ``all_xy`` (or empty ``targets``) takes every
module; otherwise a module is taken where ``{vpp}:{squashed name}`` or ``{vpp}:{name}`` is a key of ``targets``
(a key without ``:`` stands for every vpp stage), exactly as msprobe's ``_is_target_module``.

Why no module backward hook: ``register_full_backward_hook`` wraps the module's inputs and outputs in an
identity autograd function, which adds nodes to the graph and can change the order in which gradients are summed
(the project's rule, tests/monitor/test_activations.py checks bit-identity). Here:
- the output's gradient comes from a tensor hook on each output (``Tensor.register_hook``, returning None: it
  reads the gradient that reaches the output, as msprobe's ``grad_output``);
- the input's gradient, as msprobe's ``grad_input``, is this module's share of the gradient of the input, which
  is not the input tensor's whole gradient where the input has other consumers (a residual). The forward hook
  walks the autograd graph the module's forward made (nodes numbered from the sequence number read in the
  forward pre-hook, so the walk stays inside the module) and puts a post-hook (returning None) on each node with
  an edge into an input; the module's share is the sum over those edges.
Nothing is added to the graph and no gradient is changed. Figures are taken on collected steps only, in the
module's training mode only and never in a recomputation (a forward inside a backward: activation
checkpointing), as msprobe; they stay on the device in ``TrainerMon._rows`` and go out with the step's one flush.
The runtime never runs user code here: only tensors of type exactly ``torch.Tensor``/``Parameter`` are read; a
tensor subclass counts as an item (its NaN row keeps msprobe's numbering) and is not read.
"""

from __future__ import annotations

import logging
import weakref
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch

from ..foreign import instance_attribute, is_subclass, mapping_items, sequence_items, type_name
from . import metrics
from .names import squash_param_name

if TYPE_CHECKING:
    from .config import MonitorConfig

    # (figures on the device, shape, dtype); shape and dtype None for a non-tensor (written nan)
    Figures = tuple[torch.Tensor, tuple[int, ...] | None, torch.dtype | None]

    class TrainerMon(Protocol):
        """What this module reads of its ``trainer_mon.TrainerMon`` (importing that module here, even for its
        type, would make an import cycle: tests/test_import_graph.py)."""

        config: MonitorConfig
        ops: list[str]
        rank: int
        micro_batch_number: int
        _collect_now: bool
        _dropped: bool
        _rows: dict[tuple[str, str], Figures]

        def _guarded(self, where: str, work: Callable[..., object], *args: Any) -> None: ...


logger = logging.getLogger("msprobe_runtime")

_PLAIN = (torch.Tensor, torch.nn.Parameter)
# the most autograd nodes one module's walk visits before its input gradients are given up (NaN rows, one log
# line): a module reading a tensor of the step from outside its arguments could otherwise walk the graph before it
NODE_LIMIT = 100000
ACTV, ACTV_GRAD = "actv", "actv_grad"


def _is_tensor(value: Any) -> bool:
    kind = type(value)
    return kind is torch.Tensor or kind is torch.nn.Parameter or is_subclass(kind, torch.Tensor)


def _items(output: Any) -> list[Any]:
    """msprobe's build_tbtag_tensor_map: a tensor is one item, a tuple or list its items, anything else none."""
    if _is_tensor(output):
        return [output]
    items = sequence_items(output)
    return list(items) if items is not None else []


def _labels(base: str, count: int) -> list[str]:
    return [base] if count == 1 else [f"{base}_{index}" for index in range(count)]


class _Call:
    """One forward call of a module on a collected step, whose backward figures are awaited."""

    __slots__ = ("name", "micro", "inputs", "outputs", "pending", "sums", "order")

    def __init__(self, name: str, micro: int, inputs: int, outputs: int) -> None:
        self.name = name
        self.micro = micro
        self.inputs: list[Figures | None] = [None] * inputs
        self.outputs: list[Figures | None] = [None] * outputs
        self.pending = [0] * inputs  # edges into each input whose gradient has not arrived
        self.sums: list[torch.Tensor | None] = [None] * inputs  # a partial sum where an input has several edges
        self.order: int | None = None  # when its last gradient arrived: the backward order of the modules


class Activations:
    """The hooks and the pending figures of ``xy_distribution`` for one TrainerMon."""

    def __init__(self, monitor: TrainerMon) -> None:
        cfg = monitor.config
        self.monitor = monitor
        self.forward = not cfg.backward_only
        self.backward = not cfg.forward_only
        self.names: list[str] = []
        self.forward_micro: list[int] = []
        self.backward_micro: list[int] = []
        self.starts: list[list[int]] = []  # per module, the sequence numbers of its forward calls in progress
        self.calls: list[_Call] = []
        self.arrivals = 0
        self._nan: dict[torch.device, torch.Tensor] = {}
        # id -> (weak reference, version, figures) of the step's tensors read: one module's output (or its
        # gradient) is often the next one's input (a chain, a container's own input and output), read once
        self._seen: dict[int, tuple[Any, int, Figures]] = {}
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ setup

    def register(self, chunks: list[Any]) -> list[Any]:
        """Hook the targeted modules of every chunk; the handles, for TrainerMon to remove."""

        cfg = self.monitor.config
        every = cfg.all_xy or not cfg.targets
        targets = set()
        for key in cfg.targets:
            targets.update([key] if ":" in key else [f"{stage}:{key}" for stage in range(len(chunks))])
        handles = []
        for stage, chunk in enumerate(chunks):
            prefix = f"{stage}:"
            for module_name, module in chunk.named_modules():
                squashed = prefix + squash_param_name(module_name, cfg.squash_name)
                if every or squashed in targets:
                    name = squashed
                elif prefix + module_name in targets:
                    name = prefix + module_name
                else:
                    continue
                if type_name(type(module)) == "FullyShardedDataParallel":  # msprobe passes over FSDP1's wrapper
                    continue
                index = len(self.names)
                self.names.append(name)
                self.forward_micro.append(0)
                self.backward_micro.append(0)
                self.starts.append([])
                if self.backward:
                    handles.append(module.register_forward_pre_hook(partial(self._pre, index)))
                handles.append(module.register_forward_hook(partial(self._post, index), with_kwargs=True))
        if not self.names:
            logger.warning("monitor: xy_distribution is on but no module matches targets: no activations")
        return handles

    def end_step(self) -> None:
        """Forget the step's calls; the micro-step counts start again at 0 (msprobe's run on modulo
        grad_acc_steps, which is the same where every step makes grad_acc_steps forward calls)."""
        self.calls = []
        self.arrivals = 0
        self._seen = {}
        for index in range(len(self.names)):
            self.forward_micro[index] = 0
            self.backward_micro[index] = 0
            self.starts[index] = []

    # ------------------------------------------------------------------ forward

    def _pre(self, index: int, module: Any, args: Any) -> None:
        if self.monitor._collect_now:
            self.starts[index].append(torch._C._autograd._get_sequence_nr())

    def _post(self, index: int, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        if not self.monitor._collect_now:
            return
        start = self.starts[index].pop() if self.starts[index] else None
        if self.monitor._dropped:  # an error of ours earlier in this step: it is not written, nothing to read
            return
        self.monitor._guarded("activation hook", self._forward, index, module, args, kwargs, output, start)

    def _forward(self, index: int, module: Any, args: Any, kwargs: Any, output: Any, start: int | None) -> None:
        # msprobe: only the training stage, and never a recomputed forward (here: a forward run by a backward)
        if instance_attribute(module, "training") is not True or torch._C._current_graph_task_id() != -1:
            return
        name = self.names[index]
        outputs = _items(output)
        positional = list(sequence_items(args) or ())
        if self.forward:
            micro = self.forward_micro[index]
            self.forward_micro[index] = (micro + 1) % self.monitor.micro_batch_number
            inputs = [value for value in positional if _is_tensor(value)]
            inputs += [value for _, value in mapping_items(kwargs) or () if _is_tensor(value)]
            rows = self.monitor._rows
            rank = self.monitor.rank
            for base, items in ((f"{name}.input", inputs), (f"{name}.output", outputs)):
                for label, item in zip(_labels(base, len(items)), items):
                    rows[(ACTV, f"{label}:{micro}/rank{rank}/{ACTV}")] = self._cached_figures(item)
        if self.backward:
            self._watch(index, name, positional, outputs, start)

    # ------------------------------------------------------------------ backward, read by hooks on the graph

    def _watch(self, index: int, name: str, inputs: list[Any], outputs: list[Any], start: int | None) -> None:
        watched = [(j, item) for j, item in enumerate(outputs) if type(item) in _PLAIN and item.requires_grad]
        if not watched:
            return  # no gradient reaches this call: msprobe's backward hook does not fire either
        micro = self.backward_micro[index]
        self.backward_micro[index] = (micro + 1) % self.monitor.micro_batch_number
        call = _Call(name, micro, len(inputs), len(outputs))
        self.calls.append(call)
        for j, item in watched:
            item.register_hook(partial(self._on_output_grad, call, j))
        edges: dict[tuple[int, int], int] = {}  # (id of the input's node, output_nr) -> input index
        # a node's Python object may be made afresh each time it is asked for, and an id reused once it is
        # freed: every node whose id is compared is held here until the walk ends
        held = []
        for i, item in enumerate(inputs):
            if type(item) in _PLAIN and item.requires_grad:
                edge = torch.autograd.graph.get_gradient_edge(item)
                held.append(edge.node)
                edges.setdefault((id(edge.node), edge.output_nr), i)
        if edges and start is not None:
            roots = [torch.autograd.graph.get_gradient_edge(item).node for _, item in watched]
            self._hook_inputs(call, edges, roots, start, held)

    def _hook_inputs(
        self, call: _Call, edges: dict[tuple[int, int], int], roots: list[Any], start: int, held: list[Any]
    ) -> None:
        inputs = {node_id for node_id, _ in edges}
        found: dict[int, tuple[Any, list[tuple[int, int]]]] = {}  # id(node) -> (node, [(edge index, input)])
        seen: set[int] = set()
        stack = list(roots)
        visited = 0
        while stack:
            node = stack.pop()
            if id(node) in seen or id(node) in inputs:
                continue
            seen.add(id(node))
            held.append(node)  # its id stays its own while the walk runs
            if node._sequence_nr() < start:
                continue  # made before this call's forward: outside the module
            visited += 1
            if visited > NODE_LIMIT:
                self._warn_once(
                    "limit",
                    f"monitor: {call.name}: more than {NODE_LIMIT} autograd nodes from its "
                    "outputs to its inputs; its input gradients are not collected (NaN rows)",
                )
                return
            for position, (child, output_nr) in enumerate(node.next_functions):
                if child is None:
                    continue
                target = edges.get((id(child), output_nr))
                if target is not None:
                    found.setdefault(id(node), (node, []))[1].append((position, target))
                    call.pending[target] += 1
                if id(child) not in inputs:
                    stack.append(child)
        for node, pairs in found.values():
            node.register_hook(partial(self._on_input_grads, call, pairs))

    def _on_output_grad(self, call: _Call, j: int, grad: Any) -> None:
        if self.monitor._dropped:
            return
        self.monitor._guarded("activation gradient hook", self._output_grad, call, j, grad)

    def _output_grad(self, call: _Call, j: int, grad: Any) -> None:
        self._arrived(call)
        call.outputs[j] = self._cached_figures(grad)

    def _on_input_grads(self, call: _Call, pairs: list[tuple[int, int]], grad_inputs: Any, grad_outputs: Any) -> None:
        if self.monitor._dropped:
            return
        self.monitor._guarded("activation gradient hook", self._input_grads, call, pairs, grad_inputs)

    def _input_grads(self, call: _Call, pairs: list[tuple[int, int]], grad_inputs: Any) -> None:
        self._arrived(call)
        grads = sequence_items(grad_inputs) or ()
        for position, i in pairs:
            call.pending[i] -= 1
            grad = grads[position] if position < len(grads) else None
            plain = type(grad) in _PLAIN
            if call.pending[i] == 0 and call.sums[i] is None:
                # the only edge (or the last, with none before it): the gradient itself, read through the cache
                # (one module's input share is often the previous module's output gradient, the same tensor)
                if plain:
                    call.inputs[i] = self._cached_figures(grad)
                continue
            if plain and grad is not None:  # detached: no graph is made, without the cost of a no_grad context
                so_far = call.sums[i]
                if so_far is None:
                    # more edges to come; autograd may later sum into its own buffer in place: keep a copy
                    call.sums[i] = grad.detach().clone()
                else:
                    so_far.add_(grad.detach())  # our own copy
            if call.pending[i] == 0 and call.sums[i] is not None:
                call.inputs[i] = self._figures(call.sums[i])
                call.sums[i] = None

    def _arrived(self, call: _Call) -> None:
        # the last arrival orders the call: msprobe's full backward hook fires once the inputs' gradients are in
        call.order = self.arrivals
        self.arrivals += 1

    # ------------------------------------------------------------------ the step's rows

    def finish(self) -> None:
        """Put the step's actv_grad rows into the monitor's rows, in backward order (msprobe's order: the
        modules as their backward hooks fired, each module's input rows and then its output rows)."""
        rows = self.monitor._rows
        rank = self.monitor.rank
        for call in sorted((c for c in self.calls if c.order is not None), key=lambda c: c.order or 0):
            for i, partial_sum in enumerate(call.sums):  # an edge whose gradient never came: what did come
                if partial_sum is not None:
                    call.inputs[i] = self._figures(partial_sum)
                    call.sums[i] = None
            for base, slots in ((f"{call.name}.input", call.inputs), (f"{call.name}.output", call.outputs)):
                for label, slot in zip(_labels(base, len(slots)), slots):
                    key = (ACTV_GRAD, f"{label}:{call.micro}/rank{rank}/{ACTV_GRAD}")
                    rows[key] = slot if slot is not None else self._figures(None)
        self.calls = []

    def _cached_figures(self, item: Any) -> Figures:
        if type(item) not in _PLAIN:
            return self._figures(item)
        known = self._seen.get(id(item))
        # the live weak reference proves the id is still this tensor; the version, that it was not written since
        if known is not None and known[0]() is item and known[1] == item._version:
            return known[2]
        found = self._figures(item)
        self._seen[id(item)] = (weakref.ref(item), item._version, found)
        return found

    def _figures(self, item: Any) -> Figures:
        monitor = self.monitor
        if type(item) in _PLAIN:  # figures() reads item.detach(): no graph, and no no_grad context to pay for
            return metrics.figures(item.detach(), monitor.ops, monitor.config.eps), tuple(item.shape), item.dtype
        # msprobe's get_metrics: a non-tensor (or here a subclass, not read) gives NaN for every op
        device = torch.device("cpu")
        nan = self._nan.get(device)
        if nan is None:
            nan = self._nan[device] = torch.full((len(monitor.ops),), float("nan"))
        return nan, None, None

    def _warn_once(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(text)
