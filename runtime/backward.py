"""Backward data without touching the autograd graph.

API backward: a post-hook on each output's existing ``grad_fn`` (``Node.register_hook``) sees the gradients
w.r.t. the node's outputs and inputs. Module backward: tensor hooks (``Tensor.register_hook``) on the module's
output and input tensors. Parameter gradients: ``register_post_accumulate_grad_hook``. None of these creates
a node or changes an edge, so accumulation order, and therefore every gradient bit, stays as it was. Every hook
returns None: it observes, it never replaces a gradient.
"""

from __future__ import annotations

import torch  # imported by the collector already, whose module this is part of

from .foreign import is_subclass, mapping_items, own_parameters, sequence_items, subclass_test
from .open_calls import BackwardWait, HookedParameters

_TENSOR = torch.Tensor
_is_tensor_type = subclass_test(_TENSOR)  # one C call that asks the class nothing (foreign.subclass_test)


def flat_tensors(value, out, depth=0):
    """Tensors inside ``value`` (tuples, lists, dict values) in order; other leaves become None. Looked at by
    type only (``foreign``): a result or argument of the user's is never asked anything."""
    kind = type(value)
    if kind is _TENSOR or value is None:
        out.append(value)
        return out
    if kind is int or kind is float or kind is bool or kind is str:  # keyword arguments' usual values
        out.append(None)
        return out
    # a module's arguments, most results, keyword arguments: at each module call, so opened here in one loop
    items = value if kind is tuple or kind is list else dict.values(value) if kind is dict else None
    if items is not None and depth < 8:
        for item in items:
            if type(item) is _TENSOR or item is None:
                out.append(item)
            else:
                flat_tensors(item, out, depth + 1)
        return out
    if _is_tensor_type(kind):
        out.append(value)
        return out
    if depth < 8:
        items = sequence_items(value)
        if items is not None:
            for v in items:
                flat_tensors(v, out, depth + 1)
            return out
        items = mapping_items(value)
        if items is not None:
            for _, v in items:
                flat_tensors(v, out, depth + 1)
            return out
    out.append(None)
    return out


def hook_api_backward(collector, name, outputs):
    """Register post-hooks on the grad_fns behind ``outputs`` for the entry ``{name}.backward``."""
    nodes = {}
    for position, t in enumerate(outputs):
        if t is None:
            continue
        node = t.grad_fn
        if node is None:
            continue
        nodes.setdefault(node, []).append((position, t.output_nr))
    if not nodes:
        return
    token = collector.step.token
    width = len(outputs)
    for node, positions in nodes.items():
        collector.keep_hook(
            node.register_hook(_Observer(collector, token, "API backward hook", observe_api, (name, width, positions)))
        )


class _Observer:
    """A hook that runs ``observe(collector, *bound, *hook_args)`` only while ``token``'s step collects
    (``token`` None: any step), as the runtime's own work (``Collector.own_work``: our statistics ops are not
    seen as the user's API calls); an error of ours is logged and the record skipped. Always returns None: it
    observes, it never replaces a gradient.

    An object rather than a closure: a hook lives as long as the step's graph, and a closure with its cells
    was about ten objects for the garbage collector to carry into its oldest generation, where they brought
    on full collections, each a walk of the whole heap, every few steps (bench/gc_share.py; docs/benchmarks-log.md,
    'Reading the figures')."""

    __slots__ = ("collector", "token", "where", "observe", "bound")

    def __init__(self, collector, token, where, observe, bound):
        self.collector = collector
        self.token = token
        self.where = where
        self.observe = observe
        self.bound = bound

    def __call__(self, *args):
        collector = self.collector
        token = self.token
        if (token is not None and collector.step.token is not token) or not collector.collecting:
            return None
        try:
            with collector.own_work:
                fused = collector.stats._fused  # the Triton kernels: a device's gradients here in one launch
                if fused:
                    fused.begin()
                try:
                    self.observe(collector, *self.bound, *args)
                finally:
                    if fused:
                        collector.stats.end_call(fused)
        except Exception as error:
            collector.log_error(self.where, error)
        return None


def writable(entry, field):
    """``entry[field]``, a list of a backward entry's records, as a fresh list in its place, for this module's
    records to be written into: the native op may have sealed the entry after an earlier arrival (``Collector.
    seal_entry``), and a sealed list, which the garbage collector no longer looks into, must hold untracked records
    only, where these may be tracked (``TensorRecord``)."""
    items = entry[field] = list(entry[field])
    return items


def observe_api(collector, name, width, positions, grad_inputs, grad_outputs):
    entry = collector.backward_entry(name, width, 0)
    if entry is None:
        return
    describe = collector.describe
    # file stems as msprobe names them ({name}.input.0.pt, {name}.output.0.pt): with task 'tensor' the
    # gradients are saved too, so that the API pre-check can replay the backward from the dump
    if "input" in entry:
        slots = writable(entry, "input")
        for position, output_nr in positions:
            if output_nr < len(grad_outputs):
                slots[position] = describe(grad_outputs[output_nr], collector.file_stem(name, "input", str(position)))
    if "output" in entry:
        sent = writable(entry, "output")
        if not collector.plan.tensor_task:  # no file names: the native op describes them in one call
            sent.extend(collector.describe_seq(grad_inputs, None))
            return
        start = len(sent)
        sent.extend(describe(g, collector.file_stem(name, "output", str(start + i))) for i, g in enumerate(grad_inputs))


def hook_module_backward(collector, name, inputs, outputs, params=()):
    """Backward of one module call, observed without any new node.

    ``input`` (gradients w.r.t. the module's outputs): a tensor hook on each output. ``output`` (gradients
    w.r.t. the module's inputs): the module's own share, as msprobe reports it, even when an input also feeds
    other modules. It is read from post-hooks on the nodes *inside* the module that consume the input (found by
    walking the module's part of the graph, which the forward just built), summed over those edges. An input
    with no such edge (a module that returns its input) falls back to a tensor hook on the input.
    The entry joins dump.json when its last part arrives (the gradients of its inputs and the accumulation of
    its parameters' gradients), which is where msprobe writes it. Where the native op serves, it puts these
    hooks on in one call (``Recorder.hook_module``), and torch's serve a leaf; else torch's serve throughout.
    """
    wait = BackwardWait(name)
    recorder = collector.recorder if collector.native_backward else None
    want_output = collector.plan.want_output
    if recorder is not None:  # the native op's hooks, where every value is None or a plain tensor
        index = collector.number_module_backward(wait)  # before any hook can name it (Collector.take_arrivals)
        hooked = recorder.hook_module(index, inputs, outputs, want_output, _MAX_WALK)
        if hooked is not None:
            n_out, n_in, leaves = hooked
            if n_out:
                _wait_for_parts(collector, wait, n_out, n_in, params)
                for t, field, slot in leaves:  # a leaf's hooks run in its gradient accumulator: torch's serve it
                    _tensor_hook(collector, t, (wait, FIELDS[field], slot))
            return
    out_positions = [p for p, t in enumerate(outputs) if t is not None and t.requires_grad]
    if not out_positions:
        return
    in_positions = []
    targets = {}
    if want_output:
        targets, in_positions = gradient_targets(inputs)
    # msprobe lists only the tensors that take part in backward: outputs and inputs that require grad
    n_out, n_in = len(out_positions), len(in_positions)
    _wait_for_parts(collector, wait, n_out, n_in, params)
    in_slot = {position: i for i, position in enumerate(in_positions)}
    for slot, position in enumerate(out_positions):
        _tensor_hook(collector, outputs[position], (wait, "input", slot))
    consumers = consumer_edges(collector.graph_walk, inputs, outputs, targets) if targets else ()
    taken = set()
    for _, edges in consumers:
        for _, position in edges:
            taken.add(position)
            slot = in_slot[position]
            wait.left[slot] = wait.left.get(slot, 0) + 1
    for position in in_positions:
        if position not in taken:
            _tensor_hook(collector, inputs[position], (wait, "output", in_slot[position]))
    for node, edges in consumers:
        edges = [(edge, in_slot[position]) for edge, position in edges]
        collector.keep_hook(
            node.register_hook(
                _Observer(collector, collector.step.token, "module backward hook", _observe_consumers, (wait, edges))
            )
        )


def _tensor_hook(collector, t, bound):
    """torch's tensor hook of a module's backward on ``t`` (``observe_tensor(collector, *bound, grad)``), removed
    when the step ends."""
    collector.keep_hook(
        t.register_hook(_Observer(collector, collector.step.token, "module backward hook", observe_tensor, bound))
    )


def _wait_for_parts(collector, wait, n_out, n_in, params):
    """The parts a module's backward entry waits for: its outputs' and inputs' gradients, and the accumulation
    of its parameters' (msprobe writes a module whose inputs need no gradient as soon as its outputs' arrive)."""
    if not n_in:
        params = ()
    wait.n_out, wait.n_in = n_out, n_in
    wait.parts = n_out + n_in + len(params)
    if params:
        collector.when_accumulated(params, wait)


FIELDS = ("input", "output")  # a module entry's fields that its tensor hooks fill; the native op's field codes


def _part_done(collector, wait):
    wait.parts -= 1
    if wait.parts == 0:
        collector.commit_backward(wait.name)


_MAX_WALK = 20000


def gradient_targets(inputs):
    """``({an input's gradient edge: [the input, its positions, its grad_fn]}, positions of the inputs that
    require grad)``: the edges ``consumer_edges`` looks for (a non-leaf's grad_fn and output number, or a leaf
    itself). The grad_fn is held with its key: see ``_consumer_edges`` on ids."""
    targets, positions = {}, []
    for position, t in enumerate(inputs):
        if t is not None and t.requires_grad:
            node = t.grad_fn
            key = (id(node), t.output_nr) if node is not None else ("leaf", id(t))
            targets.setdefault(key, [t, [], node])[1].append(position)
            positions.append(position)
    return targets, positions


def consumer_edges(native_walk, inputs, outputs, targets):
    """``[(node, [(edge index, input position)])]``: the module's nodes that take an input's gradient edge
    (``gradient_targets``), walked by the native op (``native_walk``, ``Collector.graph_walk``) where it has
    one and every value is a plain tensor, else in Python; empty past ``_MAX_WALK`` nodes."""
    if native_walk is not None and _plain_tensors(inputs) and _plain_tensors(outputs):
        return native_walk(inputs, outputs, list(targets.values()), _MAX_WALK) or []
    return _consumer_edges(inputs, outputs, targets) or []


def _plain_tensors(values):
    """Whether every item is None or a plain tensor or Parameter: the native walk reads their autograd data
    directly, where a subclass's own ``grad_fn`` would be asked in Python."""
    tensor, parameter = torch.Tensor, torch.nn.Parameter
    for value in values:
        kind = type(value)
        if value is not None and kind is not tensor and kind is not parameter:
            return False
    return True


def _consumer_edges(inputs, outputs, targets):
    """``[(node, [(edge index, input position)])]`` for the module's nodes that consume an input (``targets``:
    an input's gradient edge -> [the input, its positions]), or None past ``_MAX_WALK`` nodes. The native op's
    ``consumer_edges`` walks the same way (``Collector.graph_walk``).

    Walks from the outputs' nodes through ``next_functions``, expanding only nodes created after the inputs
    (by autograd sequence number), so the walk covers the module's part of the graph and stops at its inputs.
    A leaf input is met as its ``AccumulateGrad`` node, told by type; each node's ``next_functions`` (a new
    tuple at every read) is read once.

    Nodes are told apart by the ids of their Python objects, so every object whose id is kept is held until
    the walk ends (``seen`` maps an id to its object; ``targets`` holds the inputs' grad_fns). Before torch
    2.13 a node's Python object lives only as long as its references: one let go gives its id to the next
    node asked for, and the walk then found other nodes than its inputs' consumers, a different set in each
    run (torch 2.11: tests/runtime/test_graph_walk.py; the bit-exact compare of two identical runs, issue 37).
    """
    accumulate_grad = torch._C._functions.AccumulateGrad
    threshold = -1
    for t in inputs:
        if t is not None and t.grad_fn is not None:
            threshold = max(threshold, t.grad_fn._sequence_nr())
    stack, seen, found = [], {}, {}
    for t in outputs:
        node = t.grad_fn if t is not None else None
        if node is not None and id(node) not in seen:
            seen[id(node)] = node
            stack.append(node)
    walked = 0
    get = targets.get
    while stack:
        node = stack.pop()
        if node._sequence_nr() <= threshold:
            continue
        walked += 1
        if walked > _MAX_WALK:
            return None
        index = -1
        for child, output_nr in node.next_functions:
            index += 1
            if child is None:
                continue
            if type(child) is accumulate_grad:
                target = get(("leaf", id(child.variable)))
            else:
                target = get((id(child), output_nr))
            if target is not None:
                entry = found.get(id(node))
                if entry is None:
                    entry = found[id(node)] = (node, [])
                for position in target[1]:
                    entry[1].append((index, position))
                continue
            if id(child) not in seen:
                seen[id(child)] = child
                stack.append(child)
    return list(found.values())


def _observe_consumers(collector, wait, edges, grad_inputs, grad_outputs):
    partial, left = wait.partial, wait.left
    for index, position in edges:
        grad = grad_inputs[index] if index < len(grad_inputs) else None
        if grad is not None:
            known = partial.get(position)
            partial[position] = grad if known is None else known + grad
        left[position] -= 1
        if left[position] == 0:
            entry = collector.backward_entry(wait.name, wait.n_out, wait.n_in, deferred=True)
            if entry is not None and "output" in entry:
                writable(entry, "output")[position] = collector.describe(partial.pop(position, None), None)
            _part_done(collector, wait)


def observe_tensor(collector, wait, field, position, grad):
    entry = collector.backward_entry(wait.name, wait.n_out, wait.n_in, deferred=True)
    if entry is not None and field in entry:
        writable(entry, field)[position] = collector.describe(grad, None)
    _part_done(collector, wait)


def hook_parameters(collector):
    """``register_post_accumulate_grad_hook`` on every parameter of every named module; returns handles. Each
    module's parameters, and those hooked, are left in ``collector.hooked_parameters`` for the step's module calls.

    A parameter with a ``main_grad`` (Megatron's DistributedDataParallel: its own post-hook on the gradient
    accumulator adds ``param.grad`` into ``main_grad`` and drops ``param.grad``) is read as msprobe reads it:
    ``main_grad``, from a post-hook on the same accumulator node, registered after Megatron's and so run after
    its accumulation."""
    handles = []
    listed = {}  # Collector.hooked_parameters
    # our own reads, not calls of the user's: with torch function handling on, each read of a parameter and each
    # registration would take a Python round trip through a mode pushed now (the session's, where start() is
    # called from code that is not rewritten), most of what hooking a parameter cost here (docs/benchmarks-log.md,
    # 'Nothing of a step outlives it, a module's hooks in one call')
    with torch._C.DisableTorchFunction():
        for module, prefix in collector.modules.values():
            own = own_parameters(module)
            hooked = []
            listed[id(module)] = HookedParameters(module, own, hooked)
            for param_name, param in own:
                if not param.requires_grad:
                    continue
                hooked.append(param)
                main_grad = param.__dict__.get("main_grad")
                if main_grad is not None and is_subclass(type(main_grad), torch.Tensor):
                    with torch.enable_grad():
                        node = param.expand_as(param).grad_fn.next_functions[0][0]
                    handle = node.register_hook(
                        _Observer(
                            collector, None, "parameter gradient hook", _observe_main_grad, (prefix, param_name, param)
                        )
                    )
                    handles.append(_Keep(handle, node))
                else:
                    handles.append(param.register_post_accumulate_grad_hook(_ParamHook(collector, prefix, param_name)))
    collector.set_hooked_parameters(listed)
    return handles


class _Keep:
    """A hook's handle that also holds the node it is on (a parameter keeps its accumulator only weakly)."""

    def __init__(self, handle, node):
        self.handle, self.node = handle, node

    def remove(self):
        self.handle.remove()
        self.node = None


class _ParamHook:
    """A parameter's post-accumulate-grad hook: ``Collector.record_param_grad`` of its gradient while any step
    collects. ``_Observer`` written out for this one use, which runs for every parameter at every step: no
    bound tuple unpacked, no helper frame."""

    __slots__ = ("collector", "prefix", "param_name")

    def __init__(self, collector, prefix, param_name):
        self.collector = collector
        self.prefix = prefix
        self.param_name = param_name

    def __call__(self, param):
        collector = self.collector
        if not collector.collecting:
            return None
        try:
            with collector.own_work:
                collector.record_param_grad(self.prefix, self.param_name, param, param.grad)
        except Exception as error:
            collector.log_error("parameter gradient hook", error)
        return None


def _observe_main_grad(collector, prefix, param_name, param, grad_inputs, grad_outputs):
    collector.record_param_grad(prefix, param_name, param, param.main_grad)
