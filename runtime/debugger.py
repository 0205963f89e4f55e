"""PrecisionDebugger: msprobe's API (constructor, start, stop, step, save, set_init_step, module_dump) over
the collector.

Construction only reads the configuration: no device is touched, nothing is patched, torch is not imported.
``start()`` builds the identity table, installs the global forward module hooks and parameter-gradient hooks,
and points the shims at the collector; ``stop()`` undoes all of it and flushes; ``step()`` flushes and begins
the next step. As in msprobe, ``PrecisionDebugger.start()`` (and stop, step, save, set_init_step) called on the
class reaches the debugger built last, so other modules need no reference to it.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import sys
import types
import weakref
from typing import TYPE_CHECKING, Any, Callable, List, NoReturn, Optional, Sequence, Tuple, Union, cast

from . import compiled_calls, compiled_regions, earlier_dumps, seeding, shims
from .config import load_config, read_dump_enable
from .debug_save import DebugJob, DebugRecords, DumpWriter, valid_variable
from .earlier_dumps import DumpPathError  # noqa: F401  (raised at start(); its home is earlier_dumps)
from .json_files import copy_records
from .open_calls import ModuleDump
from .records import copied
from .writer import PreparedJob, StepJob

if TYPE_CHECKING:  # imported at start(): construction imports no torch
    from .collector import Collector
    from .module_tracking import ModuleTracker, ObserveMode

logger = logging.getLogger("msprobe_runtime")


class _ClassOrInstance:
    """A method msprobe declares as a classmethod: ``debugger.step()`` runs on that debugger, and
    ``PrecisionDebugger.step()`` (from any module) on the one built last."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        self.__doc__ = function.__doc__
        self.__name__ = function.__name__

    def __get__(self, instance: Optional["PrecisionDebugger"], owner: "type[PrecisionDebugger]") -> Callable[..., Any]:
        if instance is None:
            instance = owner._instance
            if instance is None:
                return types.MethodType(_not_built, self.function.__name__)
        return types.MethodType(self.function, instance)


def _not_built(name: str, *args: Any, **kwargs: Any) -> NoReturn:
    raise RuntimeError(
        f"msprobe_runtime: PrecisionDebugger.{name}() needs a PrecisionDebugger built first "
        f"(PrecisionDebugger(config_path=..., dump_path=...))"
    )


class PrecisionDebugger:
    """Collect msprobe-compatible dumps from instrumented code (see docs/contract.md)."""

    _instance: Optional["PrecisionDebugger"] = None  # the debugger built last: class-level calls reach it
    _collecting: Optional["PrecisionDebugger"] = None  # collecting now: the shims route to one collector at a time
    _built = False

    def __new__(cls, *args: Any, **kwargs: Any) -> "PrecisionDebugger":
        # msprobe's debugger is a singleton, and scripts reach it from another file as ``PrecisionDebugger()``:
        # with no argument at all, that is the debugger already built. With arguments, a new one is built (and
        # becomes the one class-level calls reach), so two debuggers in one process stay independent.
        current = cls._instance
        if current is not None and not args and all(value is None for value in kwargs.values()):
            return current
        return super().__new__(cls)

    def __init__(
        self,
        config_path: Optional[Union[str, os.PathLike]] = None,
        task: Optional[str] = None,
        dump_path: Optional[Union[str, os.PathLike]] = None,
        level: Optional[str] = None,
        step: Optional[Sequence[int]] = None,
    ) -> None:
        if self._built:
            return
        self.config = load_config(config_path, task, dump_path, level, step)
        seeding.apply_config(self.config)  # config.json's seed / is_deterministic, as msprobe's seed_all
        self.current_step = 0
        self._collector: Optional[Collector] = None  # built at the first start()
        self._tracker: Optional[ModuleTracker] = None  # the global module hooks, while collecting
        self._param_handles: List[Any] = []  # the parameters' gradient hooks, while collecting
        self._session_mode: Optional[ObserveMode] = None  # start() from code that is not rewritten
        self._writer = DumpWriter()
        self._checked = False
        self._model: Any = None
        self._dirty = False
        self._debug = DebugRecords()
        self._rank_id: Optional[int] = None  # start(rank_id=...): the rank msprobe names the directory after
        self._tokens: Optional[_TokenWindow] = None  # start(token_range=...): the forwards that are collected
        self._module_dump: Optional[ModuleDump] = None  # while module_dump() is in force
        # dump_enable hot reload, as msprobe: only when the file had the key at construction
        self._reload_path = self.config.config_path if self.config.dump_enable is not None else None
        self._reload_signature = _signature(self._reload_path)
        self._built = True
        PrecisionDebugger._instance = self
        _eager_save()  # made now (when torch.compile is loaded), not first inside a compiled region
        self._refusal_said = False
        # held weakly: exit hooks must not keep a debugger (its collector, the model) alive for the process's life
        atexit.register(_at_exit, weakref.ref(self), self._writer)
        # multiprocessing children (mp.spawn) leave through os._exit, which skips atexit; its own exit
        # function still runs these finalizers, so the last flushed step reaches the disk there too
        multiprocessing.util.Finalize(None, _at_exit, args=(weakref.ref(self), self._writer), exitpriority=10)

    # ------------------------------------------------------------------ public API

    @_ClassOrInstance
    def start(
        self, model: Any = None, token_range: Optional[Sequence[int]] = None, rank_id: Optional[int] = None
    ) -> None:
        """Begin (or resume) collecting in the current step.

        ``token_range=[a, b]``: collect only during forwards ``a`` to ``b`` (counted from 0 at each start) of
        the model (its first chunk), msprobe's inference option. ``rank_id``: the rank to name the directory
        after and to filter on, for a process whose rank torch.distributed does not know."""
        _check_token_range(token_range)
        _check_rank_id(rank_id)
        self._reload_dump_enable()
        config = self.config
        if config.dump_enable is False:
            return
        if self._collector is not None and self._collector.collecting:
            return
        if self._other_collecting():
            return
        if not config.wants_step(self.current_step):
            return
        if rank_id is not None:
            self._rank_id = rank_id
        rank = self._rank()
        if not config.wants_rank(rank):
            return
        if config.level == "debug":
            return  # msprobe's debug level records only save()
        if config.level in ("L0", "mix") and model is None and self._model is None:
            raise ValueError(f"msprobe_runtime: level {config.level} records modules; pass the model to start()")
        if token_range is not None and not _chunks(model if model is not None else self._model):
            raise ValueError("msprobe_runtime: token_range counts the model's forwards; pass the model to start()")
        self._prepare_dump_path(rank)
        _eager_save()
        if model is not None and not _same_model(model, self._model):
            _check_model(model)
            self._model = model
            self._collector = None
        if self._collector is None:
            self._collector = self._build_collector()
        collector = self._collector
        from .module_tracking import ModuleTracker, ObserveMode, instrumented_globals

        collector.start_in(True)
        caller: Optional[types.FrameType] = sys._getframe(1)
        runtime_dir = os.path.dirname(os.path.abspath(__file__))
        while caller is not None and caller.f_code.co_filename.startswith(runtime_dir):
            caller = caller.f_back  # start() reached through a shim (dyn) of instrumented code
        if collector.plan.level_api and caller is not None and not instrumented_globals(caller.f_globals):
            # the caller is not rewritten: observe its torch calls with the mode, as msprobe would record them
            collector.start_in(False)
            self._session_mode = ObserveMode(collector)
            collector.push_mode(self._session_mode)
        if token_range is not None:
            # before the tracker's hooks, so the window opens (or closes) before the root's own call is seen
            self._tokens = _TokenWindow(collector, _chunks(self._model)[0][1], token_range)
        if collector.plan.level_module or collector.plan.level_api:
            self._tracker = ModuleTracker(collector)
            self._tracker.install()
        if collector.plan.level_module and collector.plan.want_backward:
            from .backward import hook_parameters

            self._param_handles = hook_parameters(collector)
            collector.note_parameter_hooks()
        if self._module_dump is not None:
            self._apply_module_dump()
        collector.set_collecting(True)
        PrecisionDebugger._collecting = self
        self._dirty = True
        compiled_regions.register_if_loaded()  # the modules start() loaded: Dynamo never compiles their frames
        shims.attach(collector)

    @_ClassOrInstance
    def stop(self) -> None:
        """Stop collecting and write this step's files (in the background)."""
        compiled_regions.register_if_loaded()
        if self._end_collection():
            self._flush()
        elif self._debug.dirty:
            self._flush(dump=False)
        self._reload_dump_enable()

    def _other_collecting(self) -> bool:
        """Whether another debugger collects now. The instrumented calls reach one collector at a time, so a
        start() inside another debugger's window is refused, said once, and the outer dump keeps every call;
        else the outer one would lose all that follows (tests/runtime/test_process_life.py)."""
        other = PrecisionDebugger._collecting
        if other is None or other is self:
            return False
        if not self._refusal_said:
            self._refusal_said = True
            logger.warning(
                "msprobe_runtime: start() of the debugger writing to %r is refused: the debugger "
                "writing to %r is collecting, and one debugger collects at a time. That one records "
                "every call; start this one after its stop().",
                self.config.dump_path,
                other.config.dump_path,
            )
        return True

    def _end_collection(self) -> bool:
        """Unhook everything start() hooked; whether collection was on."""
        collector = self._collector
        if collector is None or not collector.collecting:
            return False
        shims.detach()
        collector.set_collecting(False)
        if PrecisionDebugger._collecting is self:
            PrecisionDebugger._collecting = None
        if self._tokens is not None:
            self._tokens.remove()
            self._tokens = None
        if self._module_dump is not None and self._module_dump.narrowed is not None:
            self._undo_module_dump()
        if self._tracker is not None:
            self._tracker.remove()
            self._tracker = None
        for handle in self._param_handles:
            handle.remove()
        self._param_handles = []
        collector.set_hooked_parameters({})
        if self._session_mode is not None:
            from .module_tracking import on_top

            # not on top: stop() was called inside an instrumented module's forward, whose call set the mode
            # aside (module_tracking._set_aside); with the tracker gone, nothing pushes it back
            if on_top(self._session_mode):
                collector.pop_mode(self._session_mode)
            self._session_mode = None
        return True

    @_ClassOrInstance
    def step(self) -> None:
        """Flush this step, then count the next one (call indices restart)."""
        compiled_regions.register_if_loaded()
        collector = self._collector
        if collector is not None:
            if collector.collecting or self._dirty or self._debug.dirty:
                self._flush(handover=True, dump=collector.collecting or self._dirty)
            collector.reset()
        self._debug.snapshot(handover=True)  # anything left (nothing to write without a collector) is dropped
        self._dirty = False
        self.current_step += 1
        self._reload_dump_enable()
        if collector is not None and collector.collecting and not self.config.wants_step(self.current_step):
            self.stop()

    @_ClassOrInstance
    def save(self, variable: Any, name: str, save_backward: bool = True) -> None:
        """Record ``variable`` (a tensor, int, float or str, or lists, tuples and dicts of them) as
        ``{name}.{n}.debug`` in debug.json, and with ``save_backward`` its gradient as ``{name}_grad.{n}.debug``,
        msprobe's debug-level layout. For values no API call shows: the loss, ``main_grad``, a value inside a
        ``@jit_fuser`` body. Works at every level, between start() and stop() or not, in the steps and ranks
        the config selects. A variable of another type is skipped with a warning, as msprobe does."""
        # a @jit_fuser body is compiled by torch.compile: run save eagerly there (one graph break) rather than
        # let dynamo trace the runtime into the user's graph
        _eager_save()(self, variable, name, save_backward)

    def _save(self, variable: Any, name: str, save_backward: bool) -> None:
        import torch

        if type(name) is not str or type(save_backward) is not bool or not valid_variable(variable, torch.Tensor):
            logger.warning(
                "msprobe_runtime: save() takes a tensor, int, float or str (or lists, tuples and "
                "dicts with str keys of them), a str name and a bool save_backward; this call is skipped"
            )
            return
        if self.config.dump_enable is False or not self.config.wants_step(self.current_step):
            return
        rank = self._rank()
        if not self.config.wants_rank(rank):
            return
        self._prepare_dump_path(rank)
        try:
            if self._collector is None:
                self._collector = self._build_collector()
            self._debug.save(self._collector, variable, name, save_backward)
        except Exception as error:  # never into the training loop: the value is not recorded
            logger.warning(
                "msprobe_runtime: save(%r) failed (%s: %s); the value is not recorded",
                name,
                type(error).__name__,
                error,
            )

    @_ClassOrInstance
    def set_init_step(self, step: int) -> None:
        """Number the current step ``step`` (a resumed job's first step); later steps count on from it."""
        if type(step) is not int or step < 0:
            raise ValueError(f"msprobe_runtime: set_init_step takes an int >= 0, got {step!r}")
        self.current_step = step

    def wait(self) -> None:
        """Block until every flushed step is on disk (the training loop never needs this)."""
        self._writer.wait()

    # ------------------------------------------------------------------ module_dump

    def module_dump(self, module: Any, name: str) -> None:
        """Record ``module``'s calls as ``Module.{name}.{Class}.forward.{n}`` (and backward) and none of the
        API calls inside them, until ``module_dump_end()``: msprobe's module_dump, for level L1."""
        if self.config.level != "L1":
            logger.info(
                "msprobe_runtime: module_dump() is for level L1 (at %s the modules are recorded already); ignored",
                self.config.level,
            )
            return
        if self._module_dump is not None:
            self.module_dump_end()
        self._module_dump = ModuleDump(module, name)
        collector = self._collector
        if collector is not None and collector.collecting:
            self._apply_module_dump()

    def module_dump_end(self) -> None:
        if self._module_dump is None:
            return
        if self._module_dump.narrowed is not None:
            self._undo_module_dump()
        self._module_dump = None

    def _apply_module_dump(self) -> None:
        from . import dump_names
        from .foreign import type_name

        dump = cast(ModuleDump, self._module_dump)  # set by module_dump(), whose callers test it
        collector = cast("Collector", self._collector)  # built by start() before this runs
        prefix = dump_names.module_prefix(dump.name, type_name(type(dump.module)))
        # the module alone is recorded as a module (not its children), the APIs inside it not at all
        self._module_dump = dump._replace(narrowed=(collector.narrow_to_module(dump.module, prefix), prefix))

    def _undo_module_dump(self) -> None:
        collector = cast("Collector", self._collector)  # narrowed by _apply_module_dump, so built
        dump = cast(ModuleDump, self._module_dump)
        saved, prefix = dump.narrowed
        self._module_dump = dump._replace(narrowed=None)
        collector.restore_modules(saved)
        collector.forget_construct_under(prefix)  # construct.json stays {} at L1, as msprobe writes it

    # ------------------------------------------------------------------ internals

    def _build_collector(self) -> Collector:
        from .collector import Collector
        from .identity import build_identity

        identity, tensor_methods = build_identity(custom_op_namespaces=self.config.custom_op_namespaces)
        named = []
        for prefix, chunk in _chunks(self._model):
            # torch.compile(model): the modules are the original's, named as an eager run names them
            chunk = compiled_calls.unwrapped(chunk)
            for path, module in compiled_calls.named_as_eager(chunk):
                if module is chunk:
                    continue  # msprobe names children only; the root is the model itself
                named.append((prefix + path, module))
        return Collector(self.config, identity, tensor_methods, named)

    def _rank(self) -> Optional[int]:
        return self._rank_id if self._rank_id is not None else _rank()

    def _step_dir(self, step: int) -> str:
        rank = self._rank()
        leaf = f"rank{rank}" if rank is not None else f"proc{os.getpid()}"
        return os.path.join(self.config.dump_path, f"step{step}", leaf)

    def _prepare_dump_path(self, rank: Optional[int]) -> None:
        if not self._checked:
            earlier_dumps.refuse_or_replace(self.config.dump_path, rank)
            _check_writable(self.config.dump_path)
            self._checked = True

    def _flush(self, handover: bool = False, dump: bool = True) -> None:
        """Hand this step's records to the writer: dump.json, stack.json and construct.json (``dump``; never at
        level debug), and debug.json when save() recorded anything."""
        collector = cast("Collector", self._collector)  # every caller has a collector
        dump = dump and self.config.level != "debug"
        if dump:
            # not copied (``_detached``): a step prepared at once below is marshalled before any hook can add to it
            data, stacks, construct, tensors = collector.snapshot(handover)
            # read after: a record made meanwhile only counts against plain; the native lane's device records
            # are plain data (their numbers go beside them: records.device_numbers)
            plain = collector.step.tensor_records == 0
        else:
            tensors = collector.take_tensors()
        debug = self._debug.snapshot(handover) if self._debug.dirty else None
        # our own ops: never recorded as the user's calls, even while the session's mode is pushed
        on_host = False
        try:
            with collector.own_work:
                on_host = collector.stats.take()
        except Exception as error:  # never into the training loop: the step's statistics are written null
            collector.log_error("collecting the step's statistics", error)
        arenas = collector.stats.closed_arenas()  # whose numbers the native lane's device records name
        directory = self._step_dir(self.current_step)
        if dump:
            header = {
                "task": self.config.task,
                "level": self.config.level,
                "framework": "pytorch",
                "dump_data_dir": None,
            }
            job = StepJob(directory, header, data, stacks, construct, tensors, plain, arenas)
            if on_host and collector.plan.checksum_mode is None and self._writer.may_prepare():
                # every number is here: made into files now, in one go (writer.py says why not on its thread)
                try:
                    with collector.own_work:
                        job = self._writer.prepare(job)
                except Exception as error:  # the writer thread tries it again, and reports what fails
                    collector.log_error("preparing the step's files", error)
            if not handover:
                job = _detached(job)
            self._writer.submit(job)
            tensors = []  # written with the dump, in the same folder
        if debug is not None:
            tensor_dir = os.path.join(directory, "dump_tensor_data")
            header = {
                "task": self.config.task,
                "level": "debug",
                "framework": "pytorch",
                "dump_data_dir": tensor_dir if self.config.task == "tensor" else None,
            }
            self._writer.submit(DebugJob(directory, header, debug, tensors, tensor_dir))
        if dump:
            self._dirty = False

    def _reload_dump_enable(self) -> None:
        """msprobe's hot reload of ``dump_enable``: when the config file changed since it was last read, read the
        key again, so a running job can be switched on (or off) between steps by editing the file. Costs one
        ``stat`` per call; the file is parsed only when its size or modification time changed."""
        path = self._reload_path
        if path is None:
            return
        signature = _signature(path)
        if signature is None or signature == self._reload_signature:
            return
        self._reload_signature = signature
        try:
            value = read_dump_enable(path)
        except Exception as error:  # a half-written file: keep the last value, try again at the next change
            logger.warning(
                "msprobe_runtime: re-reading dump_enable from %s failed (%s); it stays %s",
                path,
                error,
                self.config.dump_enable,
            )
            return
        if value is None or value == self.config.dump_enable:
            return  # msprobe: removing the key keeps the last state
        logger.warning("msprobe_runtime: dump_enable is now %s (%s changed) at step %d", value, path, self.current_step)
        self.config.dump_enable = value
        collector = self._collector
        if (
            not value
            and self._end_collection()
            and collector is not None
            and (collector.step.data or collector.step.pending_backward)
        ):
            self._flush()  # what this step collected so far is written (not an empty step begun by step())


def _at_exit(debugger_ref: "weakref.ref[PrecisionDebugger]", writer: DumpWriter) -> None:
    """At the interpreter's exit (an uncaught exception included, as msprobe writes what it has then): the step
    being collected is written, then every file waits to reach the disk (tests/runtime/test_process_life.py)."""
    debugger = debugger_ref()
    try:
        if (
            debugger is not None
            and debugger._collector is not None
            and (debugger._collector.collecting or debugger._debug.dirty)
        ):
            debugger.stop()
    except Exception as error:  # noqa: BLE001 - at exit the user's own traceback must stay the last word
        logger.error("msprobe_runtime: writing the last step at exit failed: %s", error)
    writer.wait()


def _detached(job: Any) -> Any:
    """``job`` holding none of the collector's entries that hooks may still fill in this step (collection goes
    on after a flush that is no hand-over): a message made already holds none; files, or a step left to the
    writer thread, get copies (``records.copied``)."""
    if type(job) is PreparedJob:
        if job.files is not None:
            job.files = [(name, copy_records(obj)) for name, obj in job.files]
        return job
    job.data = copied(job.data)
    return job


class DumpPathNotWritable(OSError):
    """The dump path cannot hold a dump: found at start(), before the first step trains."""


def _check_writable(root: str) -> None:
    """Make ``root`` and write a file in it, or say why not (a writer-thread failure would only show after
    training, as one warning per step)."""
    import tempfile

    try:
        os.makedirs(root, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".msprobe-write-check.", dir=root)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise DumpPathNotWritable(
            f"msprobe_runtime: dump_path {root!r} cannot hold a dump: "
            f"{error.strerror or error}; choose a writable folder"
        ) from None


def _chunks(model: Any) -> List[Tuple[str, Any]]:
    """``(name prefix, module)`` for the model given to ``start()``: a list or tuple of model chunks (Megatron's
    virtual pipeline stages) names each chunk's modules under its index, ``Module.0.decoder...``, as msprobe."""
    if model is None:
        return []
    if type(model) is list or type(model) is tuple:
        return [(f"{index}.", chunk) for index, chunk in enumerate(model)]
    return [("", model)]


def _same_model(a: Any, b: Any) -> bool:
    """Whether ``start()`` got the model it already knows (a list is compared chunk by chunk, by identity)."""
    if a is b:
        return True
    if type(a) in (list, tuple) and type(b) in (list, tuple):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))
    return False


def _check_model(model: Any) -> None:
    import torch

    from .foreign import is_subclass, type_name

    for index, (_, chunk) in enumerate(_chunks(model)):
        if not is_subclass(type(chunk), torch.nn.Module):
            where = f"item {index} of the list" if type(model) in (list, tuple) else "the model"
            raise TypeError(
                f"msprobe_runtime: start() takes a torch.nn.Module or a list or tuple of them; "
                f"{where} is a {type_name(type(chunk))}"
            )


def _rank() -> Optional[int]:
    """The process-group rank, or None without one (then the directory is ``proc{pid}``)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:
        return None
    return None


def _signature(path: Optional[str]) -> Optional[Tuple[int, int, int]]:
    if path is None:
        return None
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size, info.st_ino


def _check_token_range(token_range: Any) -> None:
    """msprobe's checks: a list or tuple of two ints, 0 <= start <= end."""
    if token_range is None:
        return
    if type(token_range) not in (list, tuple) or len(token_range) != 2:
        raise ValueError(f"msprobe_runtime: token_range must be a list or tuple [start, end], got {token_range!r}")
    start, end = token_range
    if type(start) is not int or type(end) is not int or not 0 <= start <= end:
        raise ValueError(f"msprobe_runtime: token_range takes two ints with 0 <= start <= end, got {token_range!r}")


def _check_rank_id(rank_id: Any) -> None:
    if rank_id is not None and (type(rank_id) is not int or rank_id < 0):
        raise ValueError(f"msprobe_runtime: rank_id must be an int >= 0, got {rank_id!r}")


class _TokenWindow:
    """start(token_range=[a, b]): collection pauses outside forwards a..b of the root model, counted from 0 at
    each start(). Counted by a global forward pre-hook (no hook on the user's model); pausing is the runtime's
    own-work state on this thread, in which every routed call, observed call and module call passes through."""

    def __init__(self, collector: Collector, root: Any, token_range: Sequence[int]) -> None:
        from torch.nn.modules import module as nn_module

        self.collector = collector
        self.root = root
        self.first, self.last = token_range
        self.count = 0
        self.paused = False
        self._pause()  # nothing before the first counted forward
        self.handle = nn_module.register_module_forward_pre_hook(self._pre)

    def _pre(self, module: Any, args: Any) -> None:
        if module is not self.root:
            return None
        index = self.count
        self.count += 1
        if self.first <= index <= self.last:
            self._resume()
        else:
            self._pause()
        return None

    def _pause(self) -> None:
        if not self.paused:
            self.collector.enter_own_work()
            self.paused = True

    def _resume(self) -> None:
        if self.paused:
            self.collector.leave_own_work()
            self.paused = False

    def remove(self) -> None:
        self.handle.remove()
        self._resume()


def module_dump(module: Any, dump_name: str) -> None:
    """msprobe's ``module_dump``: record ``module`` as ``Module.{dump_name}.{Class}`` without the API calls
    inside it, until ``module_dump_end()``; reaches the debugger built last."""
    import torch

    from .foreign import is_subclass, type_name

    if not is_subclass(type(module), torch.nn.Module):
        raise TypeError(f"msprobe_runtime: module_dump takes a torch.nn.Module, got a {type_name(type(module))}")
    if type(dump_name) is not str:
        raise TypeError("msprobe_runtime: module_dump's dump_name must be a str")
    _current("module_dump").module_dump(module, dump_name)


def module_dump_end() -> None:
    """End ``module_dump``: API calls are recorded again."""
    _current("module_dump_end").module_dump_end()


def _current(name: str) -> "PrecisionDebugger":
    debugger = PrecisionDebugger._instance
    if debugger is None:
        _not_built(name)
    return debugger


_EAGER_SAVE: List[Callable[..., None]] = []


def _eager_save() -> Callable[..., None]:
    """``PrecisionDebugger._save`` behind dynamo's ``disable``, once dynamo is loaded (nothing is compiled
    before; importing it here would cost seconds)."""
    if _EAGER_SAVE:
        return _EAGER_SAVE[0]
    dynamo = sys.modules.get("torch._dynamo")
    disable = getattr(dynamo, "disable", None) if dynamo is not None else None
    if disable is None:
        return PrecisionDebugger._save
    _EAGER_SAVE.append(disable(PrecisionDebugger._save))
    return _EAGER_SAVE[0]
