"""The collector: what the shims delegate to while a debugger collects.

It names each call (``Functional.gelu.0``), describes inputs and outputs as records whose statistics are being
computed on the device, runs the user's call exactly once with the user's own arguments, and attaches
observe-only backward hooks. Any error of its own is logged once and that record is skipped; the user's call
is never repeated and never sees the error.
"""

from __future__ import annotations

import builtins
import logging
import sys
import threading
import types
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from . import backward as bw
from . import call_stacks, compiled_calls, dump_names, native_stats, operators
from .compiled_regions import POLYFILLED as _POLYFILLED
from .module_tracking import ObserveMode, instrumented_globals, mode_active, on_top
from .module_tracking import tracing as _tracing
from .switches import switched_on
from .foreign import (
    BOUND_METHOD_TYPES,
    bound_self,
    children,
    class_attribute,
    defines_before,
    instance_attribute,
    is_subclass,
    key_text,
    mapping_items,
    method_name,
    subclass_test,
    own_parameters,
    sequence_items,
    type_name,
)
from .open_calls import ApiBackwardHook, ApiCall, Boundary, ModuleCall, make
from .recording_plan import Plan
from .records import TensorRecord, describe_builtin
from .selection import Selection
from .contract import RUNTIME_MODULE
from .shims import FOREIGN_CALL, MODULE_CALL, NOT_ROUTED
from .call_effects import CallEffects
from .checksums import checksum_of
from .statistics import (
    KIND_EMPTY,
    LATER,
    Slot,
    StatBuffer,
    float8_scaling,
    float8_view,
    low_precision_dtypes,
    tensor_kind,
)
from .step_state import StepState

logger = logging.getLogger("msprobe_runtime")

# tensors remembered for reuse of their statistics (output of one call, input of the next); 8 served a few more
# views on the wide GPT but held more tensors alive, which cost the MLP's L1 step more than the wide GPT gained
# (docs/benchmarks-log.md, 'The JSON out of the training process', views reused)
_RECENT = 4
_REUSE_MIN = 4096  # smaller tensors are cheaper to recompute than to look up


def _reuse_min():
    """The least elements of a tensor whose statistics may be served again; none with MSPROBE_STATS_REUSE=0
    (every record read afresh: to rule reuse out when a statistic looks wrong, or to compare against)."""
    return _REUSE_MIN if switched_on("MSPROBE_STATS_REUSE") else sys.maxsize


_PLAIN_SCALARS = (bool, int, float, complex)
_TENSOR = torch.Tensor
# whether a class from ``type()`` is a tensor's: one C call that asks the class nothing (foreign.subclass_test)
_is_tensor_type = subclass_test(_TENSOR)
_PARAMETER = torch.nn.Parameter
_inference_mode = torch.is_inference_mode_enabled
_SIZE = torch.Size
_DTYPE = torch.dtype
_DEVICE = torch.device
_MEMORY_FORMAT = torch.memory_format
_STRIDED = torch.strided
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction
_modes_on = torch._C._is_torch_function_mode_enabled  # a TorchFunctionMode active on this thread: ours or a user's
_grad_enabled = torch.is_grad_enabled
# module_tracking.tracing is asked only until the polyfills are registered (``_POLYFILLED``, a list: empty until
# then): from then on Dynamo never traces the collector's entries (compiled_regions)
_BUILTIN_METHOD, _METHOD_WRAPPER, _METHOD = BOUND_METHOD_TYPES
_FUNCTION = types.FunctionType
_COMPILE_WRAPPER = compiled_calls.WRAPPER_NAME


class _WorkDepth(threading.local):
    """A thread's depth of recorded API calls and the runtime's own work (``Collector.work``): per thread, so
    that a call on one thread is never taken for another thread's own work and dropped
    (tests/runtime/test_threads.py); 0 in a thread that has done none."""

    depth = 0


class _OwnWork:
    """``with collector.own_work:`` around the runtime's own work (hooks, flushes): a routed call that arrives
    meanwhile on this thread passes straight through (``busy``), and torch function handling is off while a mode is
    active (an observing mode of ours, or a user's: our reads and statistics ops are not the user's calls, as in
    ``Collector.api``). Reentrant; one instance per collector, so entering allocates nothing but the guard."""

    __slots__ = ("collector", "guards")

    def __init__(self, collector):
        self.collector = collector
        self.guards = []

    def __enter__(self):
        collector = self.collector
        collector.work.depth += 1  # Collector.enter_own_work
        guard = None
        if _modes_on():
            guard = _NO_TORCH_FUNCTION()
            guard.__enter__()
        self.guards.append(guard)
        return collector

    def __exit__(self, kind, value, traceback):
        guard = self.guards.pop()
        if guard is not None:
            guard.__exit__(kind, value, traceback)
        self.collector.work.depth -= 1  # Collector.leave_own_work
        return False


class Collector:
    """State of one collecting step: counters, entries, stacks, construct, the statistics buffer."""

    def __init__(self, config, identity, tensor_methods, named_modules, stats=None):
        self.config = config
        self.plan = Plan.of(config)  # what is recorded (recording_plan): replaced only by module_dump's narrowing
        self.identity = identity  # id(callable) -> dump name, for dyn and the mode
        self.tensor_methods = tensor_methods  # method name -> "Tensor.name"
        self.operator_names = operators.dump_names(tensor_methods)  # entry -> (left name, reflected name)
        self.truth_name = tensor_methods.get("__bool__")  # a truth test's dump name (Tensor.__bool__)
        self.stats = stats or StatBuffer(config.nan_inf_count)
        self.effects = CallEffects()  # which calls may have their inputs read after them (call_effects)
        # a call's arguments and outputs described in one native call where it serves (describe_seq)
        self._reuse_min = _reuse_min()
        # the native op's Recorder, None where it does not serve (also backward.hook_module_backward's hooks)
        # (summary_mode fingerprint: the records of its lane onto the Triton kernels only, with their fingerprints)
        self.recorder = (
            self.stats.native_recorder(self._reuse_min, _RECENT)
            if self.plan.statistics_only
            else self.stats.native_recorder(self._reuse_min, _RECENT, fingerprints=True)
            if self.plan.fingerprints_only
            else None
        )
        self._optimizer_hooks = []  # while collecting: any torch optimizer's step opens and ends its phase
        # msprobe's optimizer status: "optimizer" during a torch optimizer's step, "clip_grad" during torch's
        # gradient clipping called from instrumented code; at mix, each API entry made then has it as its parent
        # in construct.json, the phase itself a root (``"optimizer": null``) once a step, as msprobe writes it
        self.phase = None
        # The native op's backward hooks (Recorder.hook_api, hook_module, where
        # ``native_backward``) put their records here, in the order they ran, until the next entry joins
        # ``data`` (take_arrivals). The Recorder holds the collector by a weak reference only: nothing of the
        # collector outlives the debugger's use of it.
        self._arrivals = []
        self.native_backward = False  # set by set_collecting
        if self.recorder is not None:
            self.recorder.observe_backward(
                self._arrivals, _api_backward_fallback, _module_backward_fallback, weakref.ref(self)
            )
        # config.json's scope and list, matched as msprobe does (selection.py); None: everything is recorded
        self.selection = (
            Selection(config.scope, config.list, config.level, config.task) if config.scope or config.list else None
        )
        self.modules = {}  # id(module) -> (module, "Module.net1.ln1.Linear.")
        # calls into compiled code (compiled_calls): its wrappers, and the model's modules compiled in place
        self.compiled = compiled_calls.CompiledCallables()
        self.compiled_modules = {}  # id(module) -> module, for module.compile()'d modules
        for path, module in named_modules:
            cls = type(module)
            if self.compiled.is_optimized_module(cls):  # torch.compile(child): named as the eager run names it
                original = compiled_calls.original_module(module)
                cls = type(original) if original is not None else cls
            elif compiled_calls.compiled_in_place(module):
                self.compiled_modules[id(module)] = module
            self.modules[id(module)] = (module, dump_names.module_prefix(path, type_name(cls)))
        self.collecting = False
        self.param_hooks = False  # set by start() when parameter-gradient hooks are installed
        # id(module) -> (module, own [(name, parameter)], those of them hooked): backward.hook_parameters's reads
        # at start(), used by the module calls until stop() (the hooks are what a module's backward waits for)
        self.hooked_parameters = {}
        self.step = StepState()  # what this step collects (step_state): a new one at every reset
        # The session's state of execution, changed only through the methods below: ``work.depth`` is this
        # thread's depth of the API calls and own work it runs (``busy``, ``own_work``), the one test of
        # whether a routed call is the user's, read inline by every entry (an attribute read, no frame);
        # ``mode_depth`` observing modes pushed (``push_mode``); ``ctx`` whether the code running is
        # instrumented (``enter_code``).
        self.work = _WorkDepth()
        self.ctx = [True]
        self.mode_depth = 0
        self.own_work = _OwnWork(self)
        self.module_frames = []
        self.tracker = None  # the ModuleTracker while collecting (set_tracker): compiled calls set collection aside
        self.compiled_depth = 0  # calls into compiled code running now (enter_compiled)
        native = native_stats.load()  # loaded already (the StatBuffer's): its stack capture and graph walk
        self.anchors = call_stacks.Anchors(call_stacks.capture_function(native))  # module calls running now
        self.graph_walk = getattr(native, "consumer_edges", None)  # backward.hook_module_backward's walk
        # a finished entry of the op's records untracked by the garbage collector (its ``seal``): kept tracked to
        # its flush, a step's entries brought on full collections (bench/per_entry.py --steady). A backward entry
        # is sealed as an arrival of the op leaves it, and the Python hooks write into fresh lists
        # (``backward.writable``): a sealed list holds untracked records only
        self.seal_entry = getattr(native, "seal", None)
        seal_types = getattr(native, "seal_types", None)
        if seal_types is not None:  # the Python path's records and their slots too, where nothing they hold is tracked
            seal_types((TensorRecord, Slot))
        self.module_stack = []
        self._lock = threading.Lock()
        self._logged = set()
        self._unreadable = set()  # kinds of tensors already said to have no statistics
        self.error_count = 0
        self.reset()

    # ----------------------------------------------------------------- execution state

    def busy(self):
        """Whether this thread is inside a recorded API call or the runtime's own work."""
        return bool(self.work.depth)

    def enter_own_work(self):
        self.work.depth += 1  # this thread's own: no lock needed

    def leave_own_work(self):
        self.work.depth -= 1

    def push_mode(self, mode):
        """Push an observing ``TorchFunctionMode``."""
        mode.__enter__()
        self.mode_depth += 1

    def pop_mode(self, mode):
        self.mode_depth -= 1
        mode.__exit__(None, None, None)

    def enter_code(self, instrumented):
        """A module call begins whose ``forward`` is (or is not) instrumented."""
        self.ctx.append(instrumented)

    def leave_code(self):
        self.ctx.pop()

    def start_in(self, instrumented):
        """``start()`` was called from instrumented (or uninstrumented) code."""
        self.ctx[:] = [instrumented]

    def in_uninstrumented_code(self):
        return not self.ctx[-1]

    def enter_foreign(self, fn):
        """A plain function that was not rewritten begins, called from instrumented code (``shims.dyn``): its
        torch calls are observed by the mode as those of an uninstrumented module's ``forward`` are (pushed here
        unless one is active already); returns what ``leave_foreign`` restores: the mode pushed (or None) and
        the phase before (torch's gradient clipping is msprobe's ``clip_grad``)."""
        self.ctx.append(False)
        phase = self.phase
        if _CLIPPING.get(id(fn)) is fn:
            self.phase = "clip_grad"
        if self.mode_depth and mode_active():
            return None, phase
        mode = ObserveMode(self)
        self.push_mode(mode)
        return mode, phase

    def leave_foreign(self, begun):
        mode, self.phase = begun
        if mode is not None and on_top(mode):  # not on top: the function left a mode of its own pushed
            self.pop_mode(mode)
        if len(self.ctx) > 1:  # one only: start() inside the function began the context afresh
            self.ctx.pop()

    def enter_compiled(self):
        """A call into compiled code begins on this thread: nothing inside it is recorded, not even the eager
        code that runs past a graph break (``busy``)."""
        self.compiled_depth += 1
        self.enter_own_work()

    def leave_compiled(self):
        self.leave_own_work()
        self.compiled_depth -= 1

    def set_tracker(self, tracker):
        """The module tracker installed for this session (None: removed)."""
        self.tracker = tracker

    def forget_open_modules(self):
        """Forget the module calls a previous session left open (stopped inside a forward), and their anchors."""
        self.module_frames.clear()
        self.anchors.clear()

    def enter_module(self, frame, anchor):
        """A module call begins: its tracker frame pushed, and its anchor for the stacks of the calls inside."""
        self.module_frames.append(frame)
        self.anchors.push(anchor)

    def leave_module(self):
        """The innermost module call ends: its tracker frame popped and returned, with its anchor (None: none)."""
        frames = self.module_frames
        if not frames:
            return None
        frame = frames.pop()
        self.anchors.pop()
        return frame

    def set_hooked_parameters(self, listed):
        """Each module's parameters and those hooked (``backward.hook_parameters``); ``{}`` once unhooked."""
        self.hooked_parameters = listed

    def note_parameter_hooks(self):
        """Parameter-gradient hooks are installed: a module's backward waits for its parameters' gradients."""
        self.param_hooks = True

    def narrow_to_module(self, module, prefix):
        """Record ``module`` alone, as a module, and no API (module_dump); returns what it replaced."""
        saved = (self.modules, self.plan)
        self.modules = {id(module): (module, prefix)}
        self.plan = self.plan.narrowed_to_modules()
        return saved

    def restore_modules(self, saved):
        """Undo ``narrow_to_module``: the modules and levels it replaced come back."""
        self.modules, self.plan = saved

    def forget_construct_under(self, prefix):
        """Drop this step's construct entries whose names begin with ``prefix``."""
        for entry in [entry for entry in self.step.construct if entry.startswith(prefix)]:
            del self.step.construct[entry]

    def set_collecting(self, collecting):
        """Collection on or off (``start``, ``stop``). When on, an API's backward is observed by the native op's
        hooks where it serves: statistics with no checksum, no scope nor list, and no compiled autograd (whose
        graph capture asks every hook for ``compiled_args``, which only torch's Python hooks have)."""
        self.collecting = collecting
        recorder = self.recorder
        if recorder is not None:
            recorder.collecting = collecting
        if collecting:
            # (with fingerprints, once its lane makes them: else the native hooks would hand each call to the Python
            # records, which make every record of a CPU tensor then)
            self.native_backward = (
                recorder is not None
                and (self.plan.statistics_only or recorder.fingerprinting)
                and self.selection is None
                and not _compiled_autograd()
            )
        self.forget_reads()
        for handle in self._optimizer_hooks:
            handle.remove()
        self._optimizer_hooks = []
        self.phase = None
        if collecting:
            # an optimizer may write its parameters without moving their version counters (a fused kernel,
            # megatron's copy through ``.data``): any torch optimizer's step ends what is known of them
            self._optimizer_hooks = [
                register_optimizer_step_pre_hook(self._optimizer_begins),
                register_optimizer_step_post_hook(self._optimizer_ends),
            ]

    def _optimizer_begins(self, *_hook_args):
        self.phase = "optimizer"

    def _optimizer_ends(self, *_hook_args):
        self.phase = None
        self.forget_reads()

    def lane_reads(self):
        """Device tensors the native Recorder queued for the Triton kernels this step (``TritonStats.attach``):
        their records name their numbers by place, which the writing process is sent (records.device_numbers)."""
        recorder = self.recorder
        return recorder.lane_reads if recorder is not None and hasattr(recorder, "lane_reads") else 0

    def forget_reads(self, *_hook_args):
        """The tensors read so far may change from here without moving their version counters (start, stop, an
        optimizer's step: a fused kernel, megatron's copy through ``.data``): each is read afresh at its next
        record (``_reuse``'s tables, the native Recorder's own)."""
        self.step.recent = {}
        self.step.leaves = {}
        self.step.recent_checksums = {}
        if self.recorder is not None:
            try:
                self.recorder.forget()
            except Exception as error:  # from start(), stop() or the optimizer's step: never into training
                self.log_error("forgetting the tensors read", error)

    # ----------------------------------------------------------------- step state

    def reset(self):
        """Start a new step: a fresh ``StepState`` (counters, entries, stacks and construct begin empty), the
        hooks of the step before removed."""
        self.step.remove_hooks()
        self.step = StepState()
        if self.recorder is not None:
            self.recorder.clear()  # hooks of earlier steps stay silent from now on
        del self._arrivals[:]
        if self.selection is not None:
            self.selection.reset()

    def keep_hook(self, handle):
        """Keep a torch hook's handle registered in this step: ``reset`` removes it."""
        self.step.hooks.append(handle)

    def take_tensors(self):
        """This step's saved tensors, handed over: the collector's list begins empty again."""
        with self._lock:
            tensors, self.step.tensors = self.step.tensors, []
        return tensors

    def snapshot(self, handover=False):
        """The step's tables for the writer. ``handover``: the caller resets right after, so the tables
        themselves go; otherwise collection may go on in this step, and the entries are the collector's own
        still: the caller makes its files from them at once, or copies those that later hooks may fill
        (``records.copied``: backward, parameter gradients). Forward entries are complete once stored."""
        if self._arrivals:
            self.take_arrivals()
        with self._lock:
            data = self.step.data if handover else dict(self.step.data)
            data.update(self.step.pending_backward)  # incomplete ones still show what arrived
            tensors, self.step.tensors = self.step.tensors, []
        if self.selection is not None:
            self.selection.end_step()
        if handover:
            return data, self.step.stacks, self.step.construct, tensors
        return data, dict(self.step.stacks), dict(self.step.construct), tensors

    def log_error(self, where, error):
        self.error_count += 1
        key = (where, type(error).__name__, str(error)[:200])
        if key not in self._logged:
            self._logged.add(key)
            logger.warning(
                "msprobe_runtime: %s failed (%s: %s); that record is skipped", where, type(error).__name__, error
            )

    # ----------------------------------------------------------------- entry points (from the shims)

    def call(self, api_name, fn, args, kwargs):
        if not _POLYFILLED and _tracing():
            return fn(*args, **kwargs)
        if type(fn) is _FUNCTION and fn.__code__.co_name == _COMPILE_WRAPPER and self.compiled.function(fn) is not None:
            return self.compiled_call(fn, args, kwargs, sys._getframe(2), api_name)
        if self.work.depth or not self.plan.level_api:
            return fn(*args, **kwargs)
        record_args = args
        if api_name.startswith("Tensor."):
            owner = _tensor_owner(fn)
            if owner is not None:
                record_args = (owner,) + args
        return self.api(api_name, fn, args, kwargs, record_args, sys._getframe(2))

    def dyn(self, fn, args, kwargs):
        """The result of a routed call of ``fn``, or NOT_ROUTED (MODULE_CALL) where ``fn`` is not recorded, in
        eager code: the entry (``shims.dyn``) then calls it, one frame less deep."""
        if not _POLYFILLED and _tracing():
            return fn(*args, **kwargs)  # the plain call, which Dynamo traces (tests/compile)
        if self.compiled_depth and self.work.depth:
            return NOT_ROUTED  # eager code inside a compiled call (past a graph break): nothing recorded
        kind = type(fn)
        # a call into compiled code, told by type and the code's name first: most callees are none, and Dynamo
        # may have been loaded since start() (compiled_calls)
        if kind is _FUNCTION or kind is _METHOD:
            function = fn if kind is _FUNCTION else fn.__func__
            if (
                type(function) is _FUNCTION
                and function.__code__.co_name == _COMPILE_WRAPPER
                and self.compiled.function(function) is not None
            ):
                return self.compiled_call(fn, args, kwargs, sys._getframe(2))
        elif kind is self.compiled.optimized_module or self.compiled_modules.get(id(fn)) is fn:
            return self.compiled_call(fn, args, kwargs, sys._getframe(2))
        if self.work.depth or not self.plan.level_api:
            return _not_routed(kind)
        name = self.identity.get(id(fn))
        if name is not None:
            return self.api(name, fn, args, kwargs, args, sys._getframe(2))
        # a tensor's bound method (``t.view``: a new object at each call, so not in ``identity``), its type
        # looked at first as foreign's bound_self does, written out here: most callees here are none (a
        # function, a module, a class: on megatron's step 500 calls a step), and each helper is a Python frame
        if kind is _BUILTIN_METHOD or kind is _METHOD_WRAPPER or kind is _METHOD:
            owner = fn.__self__
            owner_kind = type(owner)
            if _is_tensor_type(owner_kind):
                name = self.tensor_methods.get(method_name(fn) if kind is _METHOD else fn.__name__)
                if name is not None:
                    return self.api(name, fn, args, kwargs, (owner,) + args, sys._getframe(2))
        if kind is _FUNCTION or kind is _METHOD:
            if self.ctx[-1] and _foreign(fn if kind is _FUNCTION else fn.__func__):
                return FOREIGN_CALL  # called by the entry with the mode on (enter_foreign)
        return _not_routed(kind)

    def operator(self, name, python_op, *operands):
        if (not _POLYFILLED and _tracing()) or self.work.depth or not self.plan.level_api:
            return python_op(*operands)
        first = operands[0]
        kind = type(first)
        if _is_tensor_type(kind):
            api_name, record_args = self.operator_names[name][0], operands
        elif (
            len(operands) == 2
            and (kind is int or kind is float or is_subclass(kind, _PLAIN_SCALARS))
            and (_is_tensor_type(type(operands[1])))
        ):
            # Python reaches the tensor's reflected method: msprobe records that one, self first
            api_name, record_args = self.operator_names[name][1], (operands[1], first)
        else:
            return python_op(*operands)
        if api_name is None:
            return python_op(*operands)
        return self.api(api_name, python_op, operands, {}, record_args, sys._getframe(2))

    def builtin(self, fn):
        """The callee of a rewritten call of a builtin that runs tensor methods (``shims.builtin``): in
        instrumented code, ``fn`` called with the mode on, which records them as the plain run's mode does
        (``zip(t, u)``'s ``unbind``, ``sum(ts)``'s additions); else ``fn`` itself (a name rebound at run time
        included)."""
        if not self._observes_instrumented_code() or _OBSERVED_BUILTINS.get(id(fn)) is not fn:
            return fn
        return _ObservedBuiltin(self, fn)

    def _observes_instrumented_code(self):
        """Whether a call from instrumented code here is to run with the mode on: collecting APIs, eager, not
        inside a recorded call, and no mode already watching (``ctx[-1]`` false: uninstrumented code's mode
        sees the call by itself)."""
        return not (
            (not _POLYFILLED and _tracing())
            or not self.collecting
            or self.work.depth
            or not self.plan.level_api
            or not self.ctx[-1]
        )

    def call_observed(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` with the observing mode on, as ``shims.dyn`` calls a foreign function."""
        begun = self.enter_foreign(fn)
        try:
            return fn(*args, **kwargs)
        finally:
            self.leave_foreign(begun)

    def iterate(self, value):
        """What a rewritten ``for``, comprehension or unpacking iterates (``shims.iterate``): for a tensor, in
        instrumented code, its iterator made with the mode on, which records what ``Tensor.__iter__`` runs
        (``unbind``) as the plain run's mode does; anything else as it is, for Python to iterate."""
        if not self._observes_instrumented_code():
            return value
        kind = type(value)
        if not _is_tensor_type(kind):
            return value
        return self.call_observed(iter, value)

    def iterate_unpacked(self, value):
        """``iterate`` for a ``for`` target that unpacks each item (``for h, w in sizes``): each item that is a
        tensor is unpacked by the target through ``iterate``, as the plain run unpacks it with the mode on."""
        if (not _POLYFILLED and _tracing()) or not self.collecting:
            return value
        return _each_iterated(self, iter(self.iterate(value)))

    def truth(self, value):
        """A truth test: recorded as the tensor's ``__bool__`` (msprobe's ``Tensor.__bool__``, and what the
        observing mode records for ``if t:`` in uninstrumented code); any other value is only tested."""
        if (
            (not _POLYFILLED and _tracing())
            or self.work.depth
            or not self.plan.level_api
            or self.truth_name is None
            or not _is_tensor_type(type(value))
        ):
            return bool(value)
        return self.api(self.truth_name, bool, (value,), {}, (value,), sys._getframe(2))

    # ----------------------------------------------------------------- compiled code

    def compiled_call(self, fn, args, kwargs, frame, api_name=None):
        """A call into compiled code from eager code (``compiled_calls``): one entry at its boundary, with its
        inputs and outputs, and nothing inside it; collection is set aside meanwhile (``ModuleTracker.set_aside``),
        so that Dynamo compiles and guards exactly what it would with no debugger."""
        tracker = self.tracker
        modes = tracker.set_aside() if tracker is not None else None
        try:
            begun = None
            if not self.work.depth:
                try:
                    with self.own_work:
                        begun = self.begin_compiled(fn, args, kwargs, api_name)
                except Exception as error:
                    self.log_error("compiled call boundary", error)
            self.enter_compiled()
            try:
                result = fn(*args, **kwargs)
            except BaseException:
                if begun is not None and begun.kind == "module" and begun.record is not None:
                    self.module_forward_abort(begun.record)  # its name leaves the stack of modules running
                raise
            finally:
                self.leave_compiled()
            if begun is not None:
                try:
                    with self.own_work:
                        self.end_compiled(begun, kwargs, result, frame)
                except Exception as error:
                    self.log_error("compiled call boundary", error)
            return result
        finally:
            if tracker is not None:
                tracker.put_back(modes)

    def begin_compiled(self, fn, args, kwargs, api_name=None):
        """The boundary entry of a call into compiled code, begun (None: the level records none): a module
        named in the model is its module entry (L0, mix), anything else an API entry (L1, mix) named by the
        catalogue or ``Compiled.{name}``."""
        kind = type(fn)
        if kind is _FUNCTION or kind is _METHOD:
            if not self.plan.level_api:
                return None
            if api_name is None:
                original = self.compiled.function(fn)
                api_name = self.identity.get(id(fn)) or compiled_calls.function_name(original, self.identity)
            return Boundary("api", self._begin_api(api_name, args, kwargs), fn)
        original = compiled_calls.original_module(fn) if kind is self.compiled.optimized_module else fn
        return self.begin_compiled_module(fn, original if original is not None else fn, args, kwargs)

    def begin_compiled_module(self, module, original, args, kwargs=None):
        """A compiled module's boundary entry, begun (``module``: the module called, ``original`` the one it
        compiled, by whose class it is named). ``kwargs`` None: not known yet (the module hooks see them at the
        end of the call: ``end_compiled_module``)."""
        if self.plan.level_module:
            known = self.modules.get(id(module))
            if known is None or known[0] is not module:
                known = self.modules.get(id(original))
                module = original
            if known is not None and known[0] is module:
                return Boundary("module", self.module_forward_begin(module, args), module)
        if not self.plan.level_api:
            return None
        return Boundary("api", self._begin_api(compiled_calls.module_name(original), args, kwargs or {}), module)

    def end_compiled(self, begun, kwargs, result, frame=None):
        kind, record, target = begun
        if record is None:
            return
        if kind == "module":
            self.module_forward_end(record, target, kwargs, result)
        else:
            self._finish_api(record, result, frame)

    def end_compiled_module(self, begun, module, kwargs, result, failed):
        """The end of a compiled module's call seen by the module hooks (``ModuleTracker._enter_optimized``)."""
        kind, record, target = begun
        if record is None:
            return
        if failed:
            if kind == "module":
                self.module_forward_abort(record)
            return
        entry = record.entry if kind == "api" else None
        if kwargs and entry is not None and "input_kwargs" in entry:  # the pre-hook had the positional ones only
            entry["input_kwargs"] = self.describe_map(
                kwargs, self.file_stem(record.forward, "input") if self.plan.tensor_task else None
            )
        self.end_compiled(begun, kwargs, result)

    # ----------------------------------------------------------------- APIs

    def api(self, api_name, fn, args, kwargs, record_args, frame, record_kwargs=None):
        """Record one API call around ``fn(*args, **kwargs)``, which runs exactly once.

        ``work.depth`` stays raised throughout: calls nested inside the API, and our own statistics ops, are not
        recorded as the user's calls. While a ``TorchFunctionMode`` is active (an observing mode of ours, or a
        user's), torch function handling is off around our own work: without it, every metadata read and
        statistics op of ours would take a Python round trip through the mode (about twenty per recorded tensor),
        and a user's mode would see them as the program's calls. Never around the user's
        call. Written as two branches rather than one ``with`` over a null context: this runs at every entry.
        """
        self.enter_own_work()
        try:
            try:
                if record_kwargs is None:
                    record_kwargs = kwargs
                if _modes_on():
                    with _NO_TORCH_FUNCTION():
                        begun = self._begin_api(api_name, record_args, record_kwargs)
                else:
                    begun = self._begin_api(api_name, record_args, record_kwargs)
            except Exception as error:
                self.log_error(f"recording {api_name}", error)
                begun = None
            result = fn(*args, **kwargs)
            if begun is not None:
                try:
                    if _modes_on():
                        with _NO_TORCH_FUNCTION():
                            self._finish_api(begun, result, frame)
                    else:
                        self._finish_api(begun, result, frame)
                except Exception as error:
                    self.log_error(f"recording {api_name}", error)
            return result
        finally:
            self.leave_own_work()

    def _begin_api(self, api_name, record_args, record_kwargs):
        """Before the call: (call name, forward entry name, entry or None, backward selected), or None when
        neither direction is recorded. The entry holds the inputs' records."""
        selection = self.selection
        with self._lock:  # threads count under one lock: each call its own index (and scope moves in that order)
            index = self.step.api_counts.get(api_name, 0)
            self.step.api_counts[api_name] = index + 1
            name, forward_name = dump_names.api_call_forward(api_name, index)
            if selection is None:
                forward = backward = True
            else:
                forward, backward = selection.api(forward_name, dump_names.api_backward(name))
                if not (forward or backward):
                    return None
        entry = None
        if forward and self.plan.want_forward:
            entry = {}
            if self.plan.want_input:
                prefix = self.file_stem(forward_name, "input") if self.plan.tensor_task else None
                fused = self.stats._fused  # the Triton kernels: a device's tensors of the call in one launch
                after = False
                if fused:
                    # inputs the call leaves as they are: read after it, with its output (call_effects)
                    after = (
                        self.plan.want_output
                        and self.effects.reads_inputs_after(api_name, record_args, record_kwargs)
                        and not _inference_mode()
                    )
                    fused.begin(api_name if after else None)
                try:
                    entry["input_args"] = self.describe_seq(record_args, prefix)
                    # kwargs is the dict Python packed for the call (or fold_keywords' copy): ours to test
                    entry["input_kwargs"] = self.describe_map(record_kwargs, prefix) if record_kwargs else {}
                finally:
                    if after:
                        fused.hold()
                    elif fused:
                        self.stats.end_call(fused)
        return make(ApiCall, (name, forward_name, entry, backward))

    def _finish_api(self, begun, result, frame):
        name, forward, entry, backward_selected = begun
        plan, step = self.plan, self.step
        if entry is not None:
            if plan.want_output:
                fused = self.stats._fused
                if fused:
                    fused.begin(None, name)  # its outputs may wait for the next call's launch (MSPROBE_CARRY_OUTPUTS)
                try:
                    entry["output"] = self.describe_output(
                        result, self.file_stem(forward, "output") if plan.tensor_task else None
                    )
                finally:
                    if fused:
                        self.stats.end_call(fused)
                        if fused.changed:
                            self._inputs_changed(fused)
            if self._arrivals:
                self.take_arrivals()
            if self.seal_entry is not None:
                self.seal_entry(entry)
            with self._lock:
                step.data[forward] = entry
            step.stacks[forward] = self.anchors.capture(frame if frame is not None else sys._getframe(1))
            if plan.construct_apis:
                phase = self.phase
                construct = step.construct
                if phase is None:
                    construct[forward] = self.module_stack[-1] if self.module_stack else None
                else:
                    if phase not in construct:
                        construct[phase] = None
                    construct[forward] = phase
        if backward_selected and plan.want_backward and _grad_enabled():
            if type(result) is _TENSOR:  # the common case, without flattening
                if not result.requires_grad:
                    return
                outputs = [result]
            else:
                outputs = bw.flat_tensors(result, [])
                if not any(t is not None and t.requires_grad for t in outputs):
                    return
            parent = self.module_stack[-1] if (plan.construct_apis and self.module_stack) else None
            backward = dump_names.api_backward(name)
            step.backward_parents[backward] = parent
            if self.native_backward:
                table = step.api_backward_hooks
                hook = make(ApiBackwardHook, (backward, len(outputs)))
                if self.seal_entry is not None:  # a str and an int: nothing for the garbage collector to walk
                    self.seal_entry(hook)
                table.append(hook)
                self.recorder.hook_api(outputs, len(table) - 1)
            else:
                bw.hook_api_backward(self, backward, outputs)

    def _inputs_changed(self, fused):
        """Calls that changed an input read after them (``TritonStats.changed``): its statistics are null; each
        API is said once, and has its inputs read before it from now on. A call's tensors that waited for the next
        call's launch (``("outputs", call name)``: MSPROBE_CARRY_OUTPUTS) and changed meanwhile: null too, said
        once; no call's wait for the next launch from then on, and that API's inputs are read before it."""
        with self._lock:
            names, fused.changed[:] = list(fused.changed), []
        for api_name in names:
            if type(api_name) is tuple:
                call_name = api_name[1]
                api_name = call_name.rpartition(".")[0]
                if fused.carrying:
                    fused.carrying = False
                    logger.warning(
                        "msprobe_runtime: a tensor of %s changed before its statistics were read with the next "
                        "call's (MSPROBE_CARRY_OUTPUTS); they are null, and each call's are read at its end from now "
                        "on",
                        call_name,
                    )
                self.effects.learn(api_name)  # in case the call itself changed an input it was thought to leave
                continue
            if api_name not in self.effects.mutating:
                logger.warning(
                    "msprobe_runtime: %s changed an input in place; that input's statistics in this call are null, "
                    "and its inputs are read before it from now on",
                    api_name,
                )
            self.effects.learn(api_name)

    def take_arrivals(self):
        """The backward entries of the hooks that the native op ran, made in the order the hooks ran: an API's
        (``Recorder.hook_api``: ``(index, [(position, record)], [records])``) and a module's parts
        (``hook_module``: ``(index, field, slot, record)``, the entry committed at its last
        part, as ``backward``'s Python hooks do). Called before any other entry joins ``data``, and by
        ``snapshot``, so that dump.json keeps the order of execution, as with the Python hooks."""
        arrivals = self._arrivals
        with self._lock:  # each arrival taken once; the hooks append meanwhile, holding the GIL only
            count = len(arrivals)
            batch = arrivals[:count]
            del arrivals[:count]
        for arrival in batch:
            try:
                if len(arrival) == 3:
                    self._api_arrival(*arrival)
                else:
                    self._module_arrival(*arrival)
            except Exception as error:  # called from the flush and from hooks: never into the training loop
                self.log_error("backward hook", error)

    def _api_arrival(self, index, received, sent):
        name, width = self.step.api_backward_hooks[index]
        entry = self._backward_entry(name, width, 0)
        if entry is None:
            return
        if "input" in entry:
            slots = entry["input"]
            for position, record in received:
                slots[position] = record
        if "output" in entry:
            entry["output"].extend(sent)
        if self.seal_entry is not None:  # the op's records only (untracked), as any later arrival of the op writes
            self.seal_entry(entry)

    def _module_arrival(self, index, field, slot, record):
        wait = self.step.module_backward_hooks[index]
        name = wait.name
        entry = self._backward_entry(name, wait.n_out, wait.n_in, True)
        key = bw.FIELDS[field]
        if entry is not None and key in entry:
            entry[key][slot] = record
        wait.parts -= 1
        if wait.parts == 0:
            self._commit_backward(name)

    def backward_entry(self, name, input_width, output_width, deferred=False):
        """The backward entry ``name``, created the first time a hook reaches it. A deferred entry (a module's)
        joins dump.json at ``commit_backward``, when its last part arrived."""
        if self._arrivals:
            self.take_arrivals()
        return self._backward_entry(name, input_width, output_width, deferred)

    def _backward_entry(self, name, input_width, output_width, deferred=False):
        entry = self.step.data.get(name)
        if entry is None:
            entry = self.step.pending_backward.get(name)
        if entry is None:
            if self.selection is not None:
                with self._lock:  # backward hooks of several devices may run on several threads
                    skipped = name in self.step.skipped_backward or not self.selection.backward(name)
                    if skipped:
                        self.step.skipped_backward.add(name)  # later parts of a module's backward: the same answer
                if skipped:
                    return None
            entry = {}
            if self.plan.want_input:
                entry["input"] = [None] * input_width
            if self.plan.want_output:
                entry["output"] = [None] * output_width
            with self._lock:
                if deferred:
                    self.step.pending_backward[name] = entry
                else:
                    self.step.data[name] = entry
            parents = self.step.backward_parents
            if name in parents:
                parent = parents[name]
                if parent is not None:
                    # each module's backward name made once a step: many entries share a parent
                    backward_names = self.step.backward_names
                    parent_backward = backward_names.get(parent)
                    if parent_backward is None:
                        parent_backward = backward_names[parent] = dump_names.module_backward(parent)
                    self.step.construct[name] = parent_backward
                elif self.plan.construct_apis or self.plan.level_module:
                    self.step.construct[name] = None
        return entry

    def commit_backward(self, name):
        if self._arrivals:
            self.take_arrivals()
        self._commit_backward(name)

    def _commit_backward(self, name):
        with self._lock:
            entry = self.step.pending_backward.pop(name, None)
            if entry is not None:
                self.step.data[name] = entry
        if entry is not None and self.seal_entry is not None:  # its last part arrived (backward.writable)
            self.seal_entry(entry)

    # ----------------------------------------------------------------- modules (from module_tracking)

    def module_forward_begin(self, module, args):
        known = self.modules.get(id(module))
        if known is None or known[0] is not module:
            return None
        prefix = known[1]
        with self._lock:
            index = self.step.module_counts.get(prefix, 0)
            self.step.module_counts[prefix] = index + 1
        name = dump_names.module_forward(prefix, index)
        parent = self.module_stack[-1] if self.module_stack else None
        self.module_stack.append(name)
        forward = backward = True
        if self.selection is not None:
            forward, backward = self.selection.module_begin(name, dump_names.module_backward(name))
        # the record's args also say whether to hook the backward (module_forward_end)
        backward_args = args if backward else None
        plan = self.plan
        if not forward or not plan.want_forward:
            return make(ModuleCall, (name, None, parent, backward_args))
        entry = {}
        if plan.want_input:
            # a device's tensors in one launch, as the module's end does, before its forward runs (it may change them)
            with self.stats.one_launch():
                entry["input_args"] = self.describe_seq(
                    args, self.file_stem(name, "input") if plan.tensor_task else None
                )
            entry["input_kwargs"] = {}
        # the entry joins dump.json when the forward ends, after the calls inside it, as in msprobe's order
        step = self.step
        step.construct[name] = parent
        step.stacks[name] = self.anchors.capture(sys._getframe(1))
        return make(ModuleCall, (name, entry, parent, backward_args))

    def module_forward_abort(self, record):
        if self.selection is not None:
            self.selection.module_end(record.name)
        if self.module_stack and self.module_stack[-1] == record.name:
            self.module_stack.pop()

    def module_forward_end(self, record, module, kwargs, result):
        name, entry, parent, args = record
        if self.selection is not None:
            self.selection.module_end(name)
        if self.module_stack and self.module_stack[-1] == name:
            self.module_stack.pop()
        if entry is not None:
            with self.stats.one_launch():  # a device's tensors of the module's records: one launch
                if self.plan.want_input and kwargs:
                    entry["input_kwargs"] = self.describe_map(
                        kwargs, self.file_stem(name, "input") if self.plan.tensor_task else None
                    )
                if self.plan.want_output:
                    entry["output"] = self.describe_output(
                        result, self.file_stem(name, "output") if self.plan.tensor_task else None
                    )
                listed = self.hooked_parameters.get(id(module))
                own = listed.own if listed is not None and listed.module is module else own_parameters(module)
                if own:
                    if self.plan.tensor_task:
                        entry["parameters"] = {
                            param_name: self.describe(param, self.file_stem(name, "parameters", param_name))
                            for param_name, param in own
                        }
                    else:
                        entry["parameters"] = dict(
                            zip(
                                [param_name for param_name, _ in own],
                                self.describe_seq([param for _, param in own], None),
                            )
                        )
            if self._arrivals:
                self.take_arrivals()
            if self.seal_entry is not None:
                self.seal_entry(entry)
            with self._lock:
                self.step.data[name] = entry
        if args is not None and self.plan.want_backward and torch.is_grad_enabled():
            outputs = bw.flat_tensors(result, [])
            for t in outputs:  # any output that takes part in backward (a loop: no generator resumed per item)
                if t is not None and t.requires_grad:
                    break
            else:
                outputs = None
            if outputs is not None:
                inputs = bw.flat_tensors(args, [])
                if kwargs:
                    bw.flat_tensors(kwargs, inputs)
                backward_name = dump_names.module_backward(name)
                self.step.backward_parents[backward_name] = parent
                # wait for the parameters' accumulation only where their hooks report it (not for module_dump at L1)
                params = self._parameters(module) if self.param_hooks else []
                bw.hook_module_backward(self, backward_name, inputs, outputs, params)

    def _parameters(self, module):
        """The parameters of ``module`` and the modules inside it whose gradients are hooked (each once, read by
        ``foreign``), made from its children's lists where this step made them already (a module's forward ends
        after those of the modules it calls), so the tree is walked once a step. A module that ``start()`` did
        not list (added to the model since) has none hooked of its own."""
        known = self.step.module_parameters.get(id(module))
        if known is not None and known[0] is module:
            return known[1]
        found, seen = [], set()
        self.step.module_parameters[id(module)] = (module, found)  # held: no other module takes its id this step;
        listed = self.hooked_parameters.get(id(module))  # and a module inside itself adds nothing twice
        for param in listed.hooked if listed is not None and listed.module is module else ():
            seen.add(id(param))
            found.append(param)
        for child in children(module):
            for param in self._parameters(child):
                if id(param) not in seen:
                    seen.add(id(param))
                    found.append(param)
        return found

    def record_param_grad(self, prefix, param_name, param, grad):
        """One post-accumulate-grad hook call: ``{prefix}parameters_grad.{n}[param_name]``."""
        key = (prefix, param_name)
        with self._lock:
            index = self.step.param_counts.get(key, 0)
            self.step.param_counts[key] = index + 1
        name = dump_names.parameters_grad(prefix, index)
        if self.selection is not None and not self.selection.parameters_grad(name):
            self.param_accumulated(param)
            return
        if self._arrivals:
            self.take_arrivals()
        entry = self.step.data.get(name)
        if entry is None:
            entry = {}
            with self._lock:
                self.step.data[name] = entry
        stem = self.file_stem(name, param_name) if self.plan.tensor_task else None
        # within a call's records: on a device, its statistics and fingerprint in one launch as the hook ends (the
        # native lane's record where it serves), not one launch each
        with self.stats.one_launch():
            entry[param_name] = self._tensor(grad, stem) if type(grad) is _TENSOR else self.describe(grad, stem)
        self.param_accumulated(param)

    def param_accumulated(self, param):
        """A parameter's gradient is accumulated: module backward entries waiting for it may be complete."""
        for wait in self.step.param_waiters.pop(id(param), ()):
            wait.parts -= 1
            if wait.parts == 0:
                self.commit_backward(wait.name)

    def when_accumulated(self, params, wait):
        """Count each of ``params``' accumulation this step as one of the parts of a module's backward entry
        (``wait``, an open_calls.BackwardWait), committed at its last."""
        waiters = self.step.param_waiters
        for param in params:
            waiting = waiters.get(id(param))
            if waiting is None:
                waiters[id(param)] = [wait]
            else:
                waiting.append(wait)

    def number_module_backward(self, wait):
        """The index by which the native op's hooks name a module call's backward (``Recorder.hook_module``,
        ``take_arrivals``): ``wait`` is kept at it for this step."""
        table = self.step.module_backward_hooks
        table.append(wait)
        return len(table) - 1

    # ----------------------------------------------------------------- describing values

    def file_stem(self, entry, *fields):
        """The stem of a record's tensor files (``dump_names.stem``), or None where no file is written: the
        names are built only for task ``tensor``, and None passes down through ``describe``. The callers that
        run at every entry test ``tensor_task`` first, so that the other tasks make no call here."""
        return dump_names.stem(entry, *fields) if self.plan.tensor_task else None

    def describe_output(self, value, prefix):
        """msprobe's output field: always a list (a tuple's items, or the single value)."""
        if type(value) is _TENSOR:
            if prefix is None:
                recorder = self.recorder
                if recorder is not None:  # describe_seq, written out: most calls return one tensor
                    records, todo = recorder.records((value,))
                    if todo:  # declined by the native op: the torch ops serve it
                        records[0] = self._tensor(value, None, False)
                    return records
                return self.describe_seq((value,), None)
            return [self._tensor(value, f"{prefix}.0")]
        items = sequence_items(value)
        if prefix is None:
            if items is not None:
                return self.describe_seq(items, None)
            return [self.describe(value, None, 1)]
        if items is not None:
            return [self.describe(v, f"{prefix}.{i}", 1) for i, v in enumerate(items)]
        return [self.describe(value, f"{prefix}.0", 1)]

    def describe_seq(self, values, prefix):
        """The records of a tuple's or list's items (``describe``); without file names, the native op makes
        those it can in one call, and the rest are described here."""
        if prefix is None:
            recorder = self.recorder
            if recorder is not None and (type(values) is tuple or type(values) is list):
                records, todo = recorder.records(values)
                if todo:
                    for i, record in enumerate(records):
                        if record is LATER:
                            value = values[i]
                            kind = type(value)
                            records[i] = (
                                self._tensor(value, None, False)
                                if kind is _TENSOR or kind is _PARAMETER
                                else self.describe(value, None, 1)
                            )
                return records
            return [self._tensor(v, None) if type(v) is _TENSOR else self.describe(v, None, 1) for v in values]
        return [self.describe(v, f"{prefix}.{i}", 1) for i, v in enumerate(values)]

    def describe_map(self, values, prefix):
        if prefix is None and self.recorder is not None:
            items = dict.items(values) if type(values) is dict else mapping_items(values)  # keyword arguments
            if items is not None:
                items = list(items)
                return dict(
                    zip(
                        [k if type(k) is str else key_text(k) for k, _ in items],
                        self.describe_seq([v for _, v in items], None),
                    )
                )
        out = {}
        for k, v in mapping_items(values):
            text = key_text(k)
            out[text] = self.describe(v, f"{prefix}.{text}" if prefix is not None else None, 1)
        return out

    def describe(self, value, file_stem, depth=0):
        """The record of one value, looked at by ``type()`` only (``foreign``): no method of the value's class
        runs, so an object whose ``__class__``, ``__iter__`` or ``__getattr__`` calls routed code is safe."""
        kind = type(value)
        if _is_tensor_type(kind):
            return self._tensor(value, file_stem)
        if value is None:
            return None
        if kind is _SIZE:  # a tuple, but msprobe gives it a typed record
            return {"type": "torch.Size", "value": list(value)}
        if depth < 16:
            items = sequence_items(value)
            if items is not None:
                return [
                    self.describe(v, f"{file_stem}.{i}" if file_stem else None, depth + 1) for i, v in enumerate(items)
                ]
            items = mapping_items(value)
            if items is not None:
                out = {}
                for k, v in items:
                    text = key_text(k)
                    out[text] = self.describe(v, f"{file_stem}.{text}" if file_stem else None, depth + 1)
                return out
        if kind is _DTYPE:
            return {"type": "torch.dtype", "value": str(value)}
        if kind is _DEVICE:
            return {"type": "torch.device", "value": str(value)}
        if kind is _MEMORY_FORMAT:
            return {"type": "torch.memory_format", "format": str(value)}
        return describe_builtin(value)

    def _tensor(self, t, file_stem, native_records=True):
        """The record of tensor ``t``; ``native_records``: the native Recorder may make it (not where it
        declined it already). It checks dtype, device, layout and data itself: a tensor it serves needs none
        of the reads below (each a Python call, several while an observing mode is pushed)."""
        recorder = self.recorder if native_records else None
        if recorder is not None and (type(t) is _TENSOR or type(t) is _PARAMETER):
            records, todo = recorder.records((t,))  # as describe_seq: the native op's record, and its reuse
            if not todo:
                return records[0]
            recorder = None  # declined: the torch ops serve it
        requires_grad = t.requires_grad
        if type(t) is not _TENSOR:
            local = _documented_part(t)
            if local is not None:
                t = local
                if recorder is not None:  # a DTensor's shard, recorded with the DTensor's own requires_grad
                    records, todo = recorder.records((t,))
                    if not todo:
                        record = records[0]
                        return record[:2] + (requires_grad,) + record[3:]
            elif _dispatches_to_python(type(t)):
                # its values are reached only through the subclass's own __torch_dispatch__ (a wrapper subclass
                # has no storage of its own: the native op read garbage, the torch ops ran the user's dispatch
                # 32 times a call): dtype, shape and requires_grad from the tensor's struct, statistics null
                # (tests/runtime/test_tensor_subclasses.py)
                self._say_opaque(type(t))
                self.step.tensor_records += 1
                return TensorRecord(
                    "torch.Tensor",
                    _dtype_name(t.dtype),
                    tuple(t.shape),
                    requires_grad,
                    KIND_EMPTY,
                    None,
                    None,
                    None,
                    None,
                )
        kind = tensor_kind(t)
        readable = None
        if kind != KIND_EMPTY:
            readable = self._has_readable_data(t)
            if not readable:
                kind = KIND_EMPTY  # its record keeps dtype, shape and requires_grad; statistics null
        slot = counts = None
        has_values = kind != KIND_EMPTY
        if kind != KIND_EMPTY:
            try:
                # statistics slots (``StatBuffer.add``), shared with an earlier record of the same tensor
                slot, counts = self._reuse(t, self.step.recent, self.stats.add, kind)
            except Exception as error:  # a statistic torch cannot compute for this dtype: null, the record kept
                self._no_statistics(t, error)
                kind = KIND_EMPTY  # null statistics; its values are still saved (task tensor) and hashed
        data_name = None
        if self.plan.tensor_task and file_stem is not None and has_values:
            data_name = dump_names.tensor_file_name(file_stem)
            self.step.tensors.append((data_name, t.detach().clone()))
        checksum = None
        if self.plan.checksum_mode is not None:
            if readable is None:  # empty or complex: no statistics, but bytes to hash where there are any
                readable = t.numel() == 0 or self._has_readable_data(t)
            # the checksum of the same tensor object recorded just before, unchanged (a call's output, the next
            # call's input: tests/runtime/test_triton_fingerprint.py), not a view's: it may order its bytes otherwise
            checksum = self._reuse(
                t,
                self.step.recent_checksums,
                checksum_of,
                self.plan.checksum_mode,
                readable,
                self.stats,
                by_place=False,
            )
        self.step.tensor_records += 1
        return TensorRecord(
            "torch.Tensor", _dtype_name(t.dtype), tuple(t.shape), requires_grad, kind, slot, counts, data_name, checksum
        )

    def _has_readable_data(self, t):
        """Whether the statistics ops can read ``t``'s values: not a meta tensor (no data), nor a sparse,
        quantized, nested or MKL-DNN one (other kernels, or none). Each such kind is said once a session."""
        if t.is_meta:
            what = "meta"
        elif t.layout is not _STRIDED:
            what = str(t.layout).replace("torch.", "")
        elif t.is_quantized:
            what = "quantized"
        elif t.is_nested:
            what = "nested"
        else:
            return True
        if what not in self._unreadable:
            self._unreadable.add(what)
            logger.warning("msprobe_runtime: %s tensors are recorded without statistics (dtype and shape only)", what)
        return False

    def _say_opaque(self, kind):
        if kind not in self._unreadable:
            self._unreadable.add(kind)
            logger.warning(
                "msprobe_runtime: tensors of class %s are recorded with dtype and shape and null "
                "statistics: their values are reached only through the class's own "
                "__torch_dispatch__, which the runtime does not run",
                type_name(kind),
            )

    def _no_statistics(self, t, error):
        """Say once per dtype that its tensors are recorded with null statistics, and why (torch has no
        ``amax`` for uint16/32/64 on the CPU): the entry keeps its record, as an unreadable tensor's."""
        if t.dtype not in self._unreadable:
            self._unreadable.add(t.dtype)
            lines = str(error).strip().splitlines()
            logger.warning(
                "msprobe_runtime: statistics of %s tensors cannot be computed here (%s: %s); they are "
                "recorded with dtype and shape and null statistics",
                _dtype_name(t.dtype),
                type(error).__name__,
                lines[0][:200] if lines else "",
            )

    def _reuse(self, t, recent, compute, *args, by_place=True):
        """``compute(t, *args)``, or its result for an earlier record of the same unchanged tensor.

        A call's output is usually the next call's input, and in backward one node's input gradient is the
        next node's output gradient. The last few such tensors are remembered in ``recent`` (with their
        version counter, so an in-place change is seen) to skip a second pass over the same data; they are held
        strongly because a gradient's Python object dies between two hooks, and only a handful at a time.

        A parameter (a leaf that requires grad) is remembered by place and weakly until the step ends, collection
        starts or stops, or a torch optimizer steps (``forget_reads``): the weights of a layer are read again
        in every microbatch, and at mix once more for the module's record, after more calls than the last few
        reach back over.

        A view with exactly the elements of a remembered tensor (a transpose, a reshape, a ``view``, a
        ``detach``: the same block of memory, ``_place``) is served too, since no statistic depends on the
        order: views share their base's version counter, so one that moved is seen, and the remembered tensor
        keeps that memory from being freed and taken by another. On the wide GPT a third of the passes were
        such views (megatron's transposes of activations and weights; docs/benchmarks-log.md, the wide GPT).

        ``by_place=False`` (a checksum, which depends on the bytes' order): the same tensor object only, whatever its
        size, and no parameter by place.
        """
        if t.is_inference() or by_place and t.numel() < self._reuse_min:
            return compute(t, *args)
        key = id(t)
        known = recent.get(key)
        version = t._version
        if known is not None and known[0] is t and known[1] == version:
            return known[2]
        place = _place(t) if by_place else None
        result = None
        if place is not None:
            for held, held_version, held_result, held_place in tuple(recent.values()):
                if held_place == place and held_version == version and held._version == version:
                    result = held_result
                    break
        if result is None and place is not None:
            # a parameter read earlier this step (an earlier microbatch, or before many calls of its layer)
            # that the last few no longer hold: weakly held, so the entry is checked against the tensor itself
            held = self.step.leaves.get(place)
            if held is not None:
                leaf = held[0]()
                if leaf is not None and held[1] == version and leaf._version == version and _place(leaf) == place:
                    result = held[2]
        if result is None:
            result = compute(t, *args)
            if place is not None and t.requires_grad and t.is_leaf:
                self.step.leaves[place] = (weakref.ref(t), version, result)
        with self._lock:  # another thread may be trimming the same table
            recent[key] = (t, version, result, place)
            if len(recent) > _RECENT:
                del recent[next(iter(recent))]
        return result


def _api_backward_fallback(owner, index, positions, grad_inputs, grad_outputs):
    """A native API backward hook met a gradient the op does not record (another dtype or device, a subclass):
    the collector's Python records that call's gradients (``backward.observe_api``), as its own hooks do."""
    collector = owner()
    if collector is None:
        return
    try:
        name, width = collector.step.api_backward_hooks[index]
        with collector.own_work:
            _in_one_launch(collector, bw.observe_api, name, width, positions, grad_inputs, grad_outputs)
        entry = collector.step.data.get(name)
        if entry is not None and collector.seal_entry is not None:  # as an arrival of the op leaves its entry
            collector.seal_entry(entry)
    except Exception as error:
        collector.log_error("API backward hook", error)


def _module_backward_fallback(owner, index, field, slot, grad):
    """A native module hook met a gradient the op does not record: the collector's Python records it
    (``backward.observe_tensor``), as its own tensor hooks do."""
    collector = owner()
    if collector is None:
        return
    try:
        wait = collector.step.module_backward_hooks[index]
        with collector.own_work:
            _in_one_launch(collector, bw.observe_tensor, wait, bw.FIELDS[field], slot, grad)
    except Exception as error:
        collector.log_error("module backward hook", error)


def _in_one_launch(collector, observe, *args):
    """``observe(collector, *args)``, a hook's records, with a device's gradients in one launch (as backward's own
    hooks make them: ``_PythonHook``)."""
    fused = collector.stats._fused
    if fused:
        fused.begin()
    try:
        observe(collector, *args)
    finally:
        if fused:
            collector.stats.end_call(fused)


def _compiled_autograd():
    """Whether torch's compiled autograd is on (``torch._dynamo``'s flag, or its config for torch.compile); not
    imported: not on."""
    module = sys.modules.get("torch._dynamo.compiled_autograd")
    if module is not None and getattr(module, "compiled_autograd_enabled", False):
        return True
    config = sys.modules.get("torch._dynamo.config")
    return bool(config is not None and getattr(config, "compiled_autograd", False))


def _place(t):
    """``(address, elements, dtype)`` of the one block of memory that holds exactly ``t``'s elements, each
    once, or None (a broadcast or a strided slice, a negative view, another kind of tensor): two tensors with
    one place hold the same values, perhaps in another order. Metadata only."""
    kind = type(t)
    if kind is not _TENSOR and kind is not _PARAMETER:
        return None
    if float8_scaling(t) is not None:
        return None  # a scaled float8 view: its statistics are not those of the float8 data it shares memory with
    try:
        if t.is_neg():
            return None
        if not t.is_contiguous():
            expected = 1
            for stride, size in sorted(zip(t.stride(), t.shape)):
                if size == 1:
                    continue
                if stride != expected:
                    return None
                expected *= size
        return (t.data_ptr(), t.numel(), t.dtype)
    except Exception:  # no storage (a meta or sparse tensor): no place
        return None


_MODULE_CALL_IMPL = getattr(torch.nn.Module, "_wrapped_call_impl", None)  # nn.Module's own ``__call__``
_MODULE_CALLS = {}  # id(class) -> (class, whether it is called through nn.Module's own __call__)


_RUNTIME_PACKAGE = RUNTIME_MODULE + "."
# torch's gradient clipping, which msprobe wraps to tag its calls ``clip_grad``: id -> function
_CLIPPING = {
    id(f): f
    for f in (getattr(torch.nn.utils, name, None) for name in ("clip_grad_norm_", "clip_grad_norm", "clip_grad_value_"))
    if f is not None
}


def _foreign(function):
    """Whether ``function`` is a plain Python function that was not rewritten and is not the runtime's own
    (``debugger.stop``, called from instrumented code, ends the very context the call would open)."""
    if type(function) is not _FUNCTION:
        return False
    namespace = function.__globals__
    if instrumented_globals(namespace):
        return False
    module = namespace.get("__name__")
    return not (type(module) is str and (module == RUNTIME_MODULE or module.startswith(_RUNTIME_PACKAGE)))


class _ObservedBuiltin:
    """A builtin called with the observing mode on (``Collector.builtin``), as ``dyn`` calls a foreign function."""

    __slots__ = ("collector", "fn")

    def __init__(self, collector, fn):
        self.collector = collector
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.collector.call_observed(self.fn, *args, **kwargs)


def _each_iterated(collector, iterator):
    for item in iterator:
        yield collector.iterate(item)


_OBSERVED_BUILTINS = {id(b): b for b in (getattr(builtins, name) for name in operators.OBSERVED_BUILTINS)}


def _not_routed(kind):
    """What ``Collector.dyn`` answers for a callee of type ``kind`` it does not record: MODULE_CALL for a module
    that nn.Module's own ``__call__`` calls (the entry then runs that method's two lines itself, a frame less
    deep: test_nesting_depth.py), NOT_ROUTED for anything else. Read from the class's MRO, by id (a metaclass
    may define ``__hash__``)."""
    known = _MODULE_CALLS.get(id(kind))
    if known is None or known[0] is not kind:
        plain = (
            _MODULE_CALL_IMPL is not None
            and is_subclass(kind, torch.nn.Module)
            and class_attribute(kind, "__call__") is _MODULE_CALL_IMPL
        )
        if len(_MODULE_CALLS) > 4096:
            _MODULE_CALLS.clear()
        known = _MODULE_CALLS[id(kind)] = (kind, plain)  # the class is held: its id is not reused meanwhile
    return MODULE_CALL if known[1] else NOT_ROUTED


_DOCUMENTED_READERS = {}  # tensor subclass -> how its values are read as a plain tensor, or None
_DISPATCHING_TYPES = {}  # tensor subclass -> whether it defines its own __torch_dispatch__


def _dtensor_shard(t):
    # this rank's shard, read as a plain attribute: no dispatch, no collective, no autograd node (``to_local()``
    # would add one). Reductions on the DTensor itself would give Partial placements that ``torch.stack`` cannot
    # mix (``P(max)`` to ``P(avg)``), or redistribute with a collective on the training thread; msprobe records
    # tensor-parallel shards per rank too
    return t._local_tensor


def _collective_result(t):
    # what its own dispatch does before any op reads it (``trigger_wait``: the collective waited for once, on
    # the stream); its values are then a plain tensor's
    return t.trigger_wait()


_MEMBER = types.MemberDescriptorType


def _stored(obj, name):
    """An attribute stored in the instance: its ``__dict__`` entry, or its ``__slots__`` member read through the
    member descriptor itself (C code: a property, ``__getattr__`` or ``__getattribute__`` of the class never
    runs); None when absent or unset."""
    value = instance_attribute(obj, name)
    if value is not None:
        return value
    member = class_attribute(type(obj), name)
    if type(member) is not _MEMBER:
        return None
    try:
        return member.__get__(obj, type(obj))
    except AttributeError:  # an unset slot
        return None


def _torchao_float8(t):
    # torchao's Float8TrainingTensor: ``_data`` (float8) = values * ``_scale``, dequantized by its class as
    # ``_data.to(orig_dtype) / _scale``. Read from the instance's slots (no property, no dispatch); a layout
    # other than two plain tensors (an FSDP shard's DTensor) is not read: null statistics, as before
    data, scale = _stored(t, "_data"), _stored(t, "_scale")
    if type(data) is not _TENSOR or type(scale) is not _TENSOR or data.dtype not in low_precision_dtypes()[1]:
        return None
    return float8_view(data, scale, True)


def _te_format(fp8_dtype):
    # Transformer Engine names the format by its own enum (``transformer_engine_torch.DType``), compared by
    # identity with the enum's members: no ``==`` or ``name`` of an object the runtime did not make. A member
    # made afresh on the C++ side is not recognised, and its tensor keeps null statistics.
    enum = getattr(sys.modules.get("transformer_engine_torch"), "DType", None)
    if enum is None:
        return None
    for name, dtype in (("kFloat8E4M3", "float8_e4m3fn"), ("kFloat8E5M2", "float8_e5m2")):
        member = class_attribute(enum, name)
        if member is not None and fp8_dtype is member:
            return getattr(torch, dtype, None)
    return None


def _te_float8(t):
    # Transformer Engine's Float8Tensor: ``_data`` (uint8 bytes of the format ``_fp8_dtype``, or float8 itself)
    # times ``_scale_inv``; ``_data`` is None when only the transposed copy is kept (null statistics then)
    data, scale_inv = _stored(t, "_data"), _stored(t, "_scale_inv")
    if type(data) is not _TENSOR or type(scale_inv) is not _TENSOR:
        return None
    if data.dtype is torch.uint8:
        dtype = _te_format(_stored(t, "_fp8_dtype"))
        if dtype is None:
            return None
        data = data.view(dtype)
    elif data.dtype not in low_precision_dtypes()[1]:
        return None
    return float8_view(data, scale_inv, False)


# tensor subclasses whose values the runtime reads through their documented layout, never their own dispatch;
# a float8 class's reader gives a ``float8_view`` that knows its scale (docs/low-precision.md)
_DOCUMENTED = (
    ("torch.distributed.tensor", "DTensor", _dtensor_shard),
    ("torch.distributed._functional_collectives", "AsyncCollectiveTensor", _collective_result),
    ("torchao.float8.float8_training_tensor", "Float8TrainingTensor", _torchao_float8),
    ("transformer_engine.pytorch.tensor.float8_tensor", "Float8Tensor", _te_float8),
)


def _documented_part(t):
    """The plain tensor that holds the values of ``t``, a tensor subclass of torch's whose layout torch
    documents (a DTensor's local shard, a functional collective's result), or None for any other tensor.
    The classes are looked up in ``sys.modules``: where their module was never imported, none exists."""
    kind = type(t)
    try:
        reader = _DOCUMENTED_READERS[kind]
    except KeyError:
        reader = None
        for module_name, class_name, read in _DOCUMENTED:
            module = sys.modules.get(module_name)
            cls = getattr(module, class_name, None) if module is not None else None
            if cls is not None and is_subclass(kind, cls):
                reader = read
                break
        _DOCUMENTED_READERS[kind] = reader
    return reader(t) if reader is not None else None


def _dispatches_to_python(kind):
    """Whether tensors of subclass ``kind`` define their own ``__torch_dispatch__`` (a wrapper subclass, a
    tensor of a quantization library): every op on them, a statistic's too, runs that Python code."""
    known = _DISPATCHING_TYPES.get(kind)
    if known is None:
        known = _DISPATCHING_TYPES[kind] = defines_before(kind, "__torch_dispatch__", _TENSOR)
    return known


def _tensor_owner(fn):
    """The tensor a bound method ``fn`` belongs to, or None (looked at by type only: ``foreign``)."""
    owner = bound_self(fn)
    return owner if owner is not None and _is_tensor_type(type(owner)) else None


_DTYPE_NAMES = {}


def _dtype_name(dtype):
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name
