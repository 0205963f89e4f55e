"""Module calls and torch's own code, observed forward-only while collecting.

A global *forward* pre-hook and forward hook (never a backward hook) see every module call, including those
that torch's containers make (``nn.Sequential``, loops over ``ModuleList``). Module names come from the model
given to ``start()``. When a module's ``forward`` is not instrumented (torch's ``nn.Linear``, ``nn.Sequential``),
a ``TorchFunctionMode`` is pushed for the duration of that call, so API calls inside torch's source
(``Functional.linear`` inside ``nn.Linear``) are recorded as msprobe records them. The mode only observes:
it calls the original function once, with the original arguments.
"""

from __future__ import annotations

import dis
import sys
import types
from collections import OrderedDict

import torch
from torch.nn.modules import module as _nn_module
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from . import operators
from .compiled_calls import original_module
from .contract import RUNTIME_NAME
from .foreign import class_attribute, function_globals
from .open_calls import TrackerFrame, make

# True only while Dynamo traces (a constant to it; in eager, False in one Python frame): a hook or mode of ours, or
# a collector entry, met inside a compiled region is the plain call there, never a record nor a graph break
# (compiled_regions)
tracing = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)


def is_instrumented(function):
    """Whether ``function`` is a plain function of a rewritten module (its globals carry the runtime)."""
    namespace = function_globals(function)
    return namespace is not None and instrumented_globals(namespace)


def instrumented_globals(namespace):
    """Whether a module's globals (a frame's ``f_globals``) carry the runtime import."""
    return RUNTIME_NAME in namespace


class ObserveMode(TorchFunctionMode):
    """Records catalogued torch calls made by uninstrumented code; everything else passes through."""

    def __init__(self, collector):
        super().__init__()
        self.collector = collector

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if tracing():
            return func(*args, **kwargs)
        collector = self.collector
        if collector.plan.level_api and not collector.busy() and collector.in_uninstrumented_code():
            name = collector.identity.get(id(func))
            if name is not None:
                if name.startswith("Tensor.") and _OPERATOR_CODES:
                    name = _operator_name(sys._getframe(1), name, collector.tensor_methods)
                record_args, record_kwargs = fold_keywords(func, args, kwargs)
                return collector.api(name, func, args, kwargs, record_args, None, record_kwargs)
        return func(*args, **kwargs)


def _operator_tables():
    """Bytecode of the operators whose tensor calls reach the mode as plain methods (``a + b`` arrives as
    ``Tensor.add``); CPython 3.11+ only, where ``BINARY_OP``/``COMPARE_OP`` carry the operator."""
    if sys.version_info < (3, 11) or "BINARY_OP" not in dis.opmap:
        return None
    binary = {}
    for index, (nb_name, _symbol) in enumerate(getattr(dis, "_nb_ops", ())):
        base = nb_name[3:]
        inplace = base.startswith("INPLACE_")
        base = base[len("INPLACE_") :] if inplace else base
        row = _NB_ROWS.get(base)
        if row is not None:
            binary[index] = operators.INPLACE_OF[row.entry].dunder if inplace else row.dunder
    shift = 0 if sys.version_info < (3, 12) else (4 if sys.version_info < (3, 13) else 5)
    compare = {i: _CMP_DUNDERS[op] for i, op in enumerate(dis.cmp_op) if op in _CMP_DUNDERS}
    return dis.opmap["BINARY_OP"], binary, dis.opmap["COMPARE_OP"], compare, shift


_NB_ROWS = {row.nb_name: row for row in operators.rows(operators.BINARY)}
_CMP_DUNDERS = {row.spelling: row.dunder for row in operators.rows(operators.COMPARISON)}
_OPERATOR_CODES = _operator_tables()


def _operator_name(frame, name, tensor_methods):
    """msprobe's name for a tensor operator written in uninstrumented code (``Tensor.__add__`` for ``a + b``,
    which reaches the mode as ``Tensor.add``), read from the instruction the calling frame is executing.
    A reflected operator (``1 + t``) cannot be told apart here and keeps the left-operand name."""
    try:
        code, offset = frame.f_code.co_code, frame.f_lasti
        opcode, arg = code[offset], code[offset + 1]
    except (AttributeError, IndexError):
        return name
    binary_op, binary, compare_op, compare, shift = _OPERATOR_CODES
    if opcode == binary_op:
        dunder = binary.get(arg)
    elif opcode == compare_op:
        dunder = compare.get(arg >> shift)
    else:
        return name
    return tensor_methods.get(dunder, name) if dunder else name


_POSITIONAL = {}
_FUNCTION = types.FunctionType


def fold_keywords(func, args, kwargs):
    """The call as torch's own code wrote it, for the record.

    A Python API such as ``F.batch_norm`` reaches ``__torch_function__`` with the arguments it re-packed
    (``weight=``, ``eps=`` ... as keywords) although ``nn.BatchNorm1d`` passed them by position; msprobe,
    wrapping the function itself, records them by position. Keywords that continue the positional run of the
    signature are moved back to positions (only in the record; the call keeps its own arguments).
    """
    if not kwargs:
        return args, kwargs
    names = _POSITIONAL.get(func)
    if names is None:
        names = ()
        code = func.__code__ if type(func) is _FUNCTION else None
        if code is not None:
            names = code.co_varnames[: code.co_argcount]
        _POSITIONAL[func] = names
    if len(names) <= len(args) or names[len(args)] not in kwargs:
        return args, kwargs
    args, kwargs = list(args), dict(kwargs)
    while len(args) < len(names) and names[len(args)] in kwargs:
        args.append(kwargs.pop(names[len(args)]))
    return tuple(args), kwargs


def mode_active():
    """Whether an ObserveMode is on this thread's torch function mode stack now. ``mode_depth`` counts the modes
    pushed, but the autograd engine runs backward (and a recomputation in it, Megatron's CheckpointFunction)
    without the caller's modes: there the count says one is pushed while none is active."""
    if torch._C._current_graph_task_id() == -1:
        return True  # outside backward the count is the stack
    for index in range(torch._C._len_torch_function_stack()):
        if type(torch._C._get_function_stack_at(index)) is ObserveMode:
            return True
    return False


def _innermost_mode():
    depth = torch._C._len_torch_function_stack()
    return torch._C._get_function_stack_at(depth - 1) if depth else None


def on_top(mode):
    """Whether ``mode`` is the innermost torch function mode now."""
    return _innermost_mode() is mode


def _set_aside(collector):
    """Pop the observing mode on top of the torch function stack for an instrumented module's call, and return
    it (None where the top is not ours). Inside, the shims record every call and the mode records nothing (its
    context says instrumented), yet each torch call, each tensor method and attribute, would still take a
    Python round trip through it. The module's forward hook pushes it back."""
    top = _innermost_mode()
    if type(top) is not ObserveMode:
        return None
    collector.pop_mode(top)
    return top


_MODULE_FILE = torch.nn.Module._call_impl.__code__.co_filename  # nn.Module's call machinery calls the hooks


_INSTALLED = []  # the ModuleTrackers installed now, in order (two debuggers may collect at once)
_HOOK_IDS = []  # (pre-hook's key, hook's key) in torch's tables, the same at every install
_ASIDE = [0]  # calls into compiled code running now, with the hooks taken out of torch's tables


def _global_pre_hook(module, args):
    """The global forward pre-hook: the installed tracker's ``_pre``. A function of its own, under the same key at
    every install: Dynamo, tracing a module call inside a compiled region that the runtime did not see the
    boundary of, guards on the hook tables' keys and on the hooks' identity; new ones at each ``start()`` would
    recompile such a region at every step (tests/compile/test_boundaries.py)."""
    if tracing():
        return None  # a compiled region's module call (the hook after it skips it too)
    for tracker in _INSTALLED:
        tracker._pre(module, args)
    return None


def _global_hook(module, args, *rest):
    if tracing():
        return None
    for tracker in _INSTALLED:
        tracker._post(module, args, *rest)
    return None


def _hook_ids():
    if not _HOOK_IDS:
        table = OrderedDict()  # torch's handles count their keys process-wide: two that no other hook gets
        _HOOK_IDS.extend((RemovableHandle(table).id, RemovableHandle(table).id))
    return _HOOK_IDS


def _put_hooks():
    """Our two global forward hooks into torch's tables, under their keys, as ``register_module_forward_pre_hook``
    and ``register_module_forward_hook(with_kwargs=True, always_call=True)`` put them."""
    pre, post = _hook_ids()
    _nn_module._global_forward_pre_hooks[pre] = _global_pre_hook
    _nn_module._global_forward_hooks[post] = _global_hook
    _nn_module._global_forward_hooks_with_kwargs[post] = True
    _nn_module._global_forward_hooks_always_called[post] = True


def _take_hooks():
    """Our hooks out of torch's tables, each mark with them (torch's own handle leaves the with_kwargs one)."""
    pre, post = _hook_ids()
    _nn_module._global_forward_pre_hooks.pop(pre, None)
    for table in (
        _nn_module._global_forward_hooks,
        _nn_module._global_forward_hooks_with_kwargs,
        _nn_module._global_forward_hooks_always_called,
    ):
        table.pop(post, None)


class ModuleTracker:
    """Installs the global forward hooks; keeps the instrumented/uninstrumented context stack; sets collection
    aside around a call into compiled code (``set_aside``/``put_back``)."""

    def __init__(self, collector):
        self.collector = collector
        self._instrumented = {}  # id(type) -> (type, bool or None); by id: a metaclass may define __hash__

    def install(self):
        # module calls a previous session left open (stopped inside a forward) are not this session's
        self.collector.forget_open_modules()
        _INSTALLED.append(self)
        if _ASIDE[0] == 0:
            _put_hooks()
        self.collector.set_tracker(self)

    def remove(self):
        if self in _INSTALLED:
            _INSTALLED.remove(self)
        if not _INSTALLED:
            _take_hooks()
        self.collector.set_tracker(None)

    # ----------------------------------------------------------------- compiled code

    def set_aside(self):
        """Before a call into compiled code: Dynamo, tracing it, must find torch as the program without collection
        left it: no global module hook of ours (it guards on their number, and would trace them) and no observing
        mode of ours on the torch function stack (it guards on the stack). Both come back at ``put_back``; the
        modes set aside are returned for it. Reentrant (compiled code may call compiled code eagerly, past a
        graph break)."""
        collector = self.collector
        modes = []
        top = _innermost_mode()
        while type(top) is ObserveMode:
            collector.pop_mode(top)
            modes.append(top)
            top = _innermost_mode()
        _ASIDE[0] += 1
        if _ASIDE[0] == 1:
            _take_hooks()
        return modes

    def put_back(self, modes):
        _ASIDE[0] -= 1
        if _ASIDE[0] == 0 and _INSTALLED:
            _put_hooks()
        for mode in reversed(modes):
            self.collector.push_mode(mode)

    def _enter_optimized(self, module, args):
        """The forward pre-hook of a ``torch.compile(module)`` call: its boundary entry begins, collection is set
        aside for the compiled call, and an always-called forward hook of the module's own, registered for this
        call (the global ones are gone by then), ends both."""
        collector = self.collector
        original = original_module(module)
        begun = None
        try:
            with collector.own_work:
                begun = collector.begin_compiled_module(module, original, args)
        except Exception as error:
            collector.log_error("compiled module boundary", error)
        modes = self.set_aside()
        collector.enter_compiled()
        state = [None]

        def leave(module, args, kwargs, result):
            state[0].remove()
            collector.leave_compiled()
            self.put_back(modes)
            failed = result is None and sys.exc_info()[0] is not None
            if begun is not None:
                try:
                    with collector.own_work:
                        collector.end_compiled_module(begun, module, kwargs, result, failed)
                except Exception as error:
                    collector.log_error("compiled module boundary", error)
            return None

        state[0] = module.register_forward_hook(leave, with_kwargs=True, always_call=True)

    # ----------------------------------------------------------------- module calls

    def _learn_type(self, cls):
        """Whether ``cls``'s ``forward`` is instrumented (None: ``cls`` is torch.compile's wrapper of a module),
        remembered in ``_instrumented`` (which ``_pre`` looks up first); read statically: the class (or its
        metaclass) may compute attributes in routed code."""
        compiled = self.collector.compiled
        compiled.refresh()
        if compiled.is_optimized_module(cls):
            instrumented = None
        else:
            instrumented = is_instrumented(class_attribute(cls, "forward"))
        self._instrumented[id(cls)] = (cls, instrumented)
        return instrumented

    def _pre(self, module, args):
        collector = self.collector
        mode = record = aside = None
        pushed = False
        try:
            cls = type(module)
            known = self._instrumented.get(id(cls))
            instrumented = known[1] if known is not None and known[0] is cls else self._learn_type(cls)
            if instrumented is None:
                self._enter_optimized(module, args)
                return None
            collector.enter_code(instrumented)
            pushed = True
            busy = collector.work.depth  # Collector.busy, as an attribute read: every module call
            if instrumented and collector.mode_depth:
                aside = _set_aside(collector)
            elif (
                not instrumented
                and collector.plan.level_api
                and not busy
                and (collector.mode_depth == 0 or not mode_active())
            ):
                mode = ObserveMode(collector)
                collector.push_mode(mode)
            if collector.plan.level_module and not busy:
                with collector.own_work:
                    record = collector.module_forward_begin(module, args)
        except Exception as error:
            collector.log_error("module forward pre-hook", error)
        caller = sys._getframe(2)  # past _global_pre_hook
        # nn.Module's call frame (``_call_impl``'s ``inner``), where the stacks of the calls inside this module
        # leave it (call_stacks.Anchors); held, so that no other frame can take its identity
        anchor = caller if caller.f_code.co_filename == _MODULE_FILE else None
        collector.enter_module(make(TrackerFrame, (mode, record, pushed, aside)), anchor)
        return None

    def _post(self, module, args, *rest):
        collector = self.collector
        frame = collector.leave_module()
        if frame is None:
            return None
        mode, record, pushed, aside = frame
        try:
            if pushed:
                collector.leave_code()
            if mode is not None:
                collector.pop_mode(mode)
            if aside is not None:
                collector.push_mode(aside)
            if record is not None:
                with collector.own_work:
                    if len(rest) == 2:
                        collector.module_forward_end(record, module, rest[0], rest[1])
                    else:
                        collector.module_forward_abort(record)
        except Exception as error:
            collector.log_error("module forward hook", error)
        return None
