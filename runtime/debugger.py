"""PrecisionDebugger: msprobe's API (constructor, start, stop, step) over the collector.

Construction only reads the configuration: no device is touched, nothing is patched, torch is not imported.
``start()`` builds the identity table, installs the global forward module hooks and parameter-gradient hooks,
and points the shims at the collector; ``stop()`` undoes all of it and flushes; ``step()`` flushes and begins
the next step.
"""
from __future__ import annotations

import atexit
import glob
import logging
import multiprocessing.util
import os
import sys

from . import shims
from .config import load_config
from .writer import StepJob, Writer

logger = logging.getLogger("msprobe_runtime")


class DumpPathError(FileExistsError):
    """The dump path already holds a dump from another run; nothing was overwritten."""


class PrecisionDebugger:
    """Collect msprobe-compatible dumps from instrumented code (see docs/contract.md)."""

    def __init__(self, config_path=None, task=None, dump_path=None, level=None, step=None):
        self.config = load_config(config_path, task, dump_path, level, step)
        self.current_step = 0
        self._collector = None
        self._tracker = None
        self._param_handles = []
        self._session_mode = None
        self._writer = Writer()
        self._checked = False
        self._model = None
        self._dirty = False
        atexit.register(self._writer.wait)
        # multiprocessing children (mp.spawn) leave through os._exit, which skips atexit; its own exit
        # function still runs these finalizers, so the last flushed step reaches the disk there too
        multiprocessing.util.Finalize(None, self._writer.wait, exitpriority=10)

    # ------------------------------------------------------------------ public API

    def start(self, model=None):
        """Begin (or resume) collecting in the current step."""
        config = self.config
        if self._collector is not None and self._collector.collecting:
            return
        if not config.wants_step(self.current_step):
            return
        rank = _rank()
        if not config.wants_rank(rank):
            return
        if config.level in ("L0", "mix") and model is None and self._model is None:
            raise ValueError(f"msprobe_runtime: level {config.level} records modules; pass the model to start()")
        if not self._checked:
            self._refuse_existing_dump(rank)
            _check_writable(self.config.dump_path)
            self._checked = True
        if model is not None and not _same_model(model, self._model):
            _check_model(model)
            self._model = model
            self._collector = None
        if self._collector is None:
            self._collector = self._build_collector()
        collector = self._collector
        from .module_tracking import ModuleTracker, ObserveMode, instrumented_globals

        collector.start_in(True)
        caller = sys._getframe(1)
        runtime_dir = os.path.dirname(os.path.abspath(__file__))
        while caller is not None and caller.f_code.co_filename.startswith(runtime_dir):
            caller = caller.f_back  # start() reached through a shim (dyn) of instrumented code
        if collector.level_api and caller is not None and not instrumented_globals(caller.f_globals):
            # the caller is not rewritten: observe its torch calls with the mode, as msprobe would record them
            collector.start_in(False)
            self._session_mode = ObserveMode(collector)
            collector.push_mode(self._session_mode)
        if collector.level_module or collector.level_api:
            self._tracker = ModuleTracker(collector)
            self._tracker.install()
        if collector.level_module and collector.want_backward:
            from .backward import hook_parameters

            self._param_handles = hook_parameters(collector)
        collector.collecting = True
        self._dirty = True
        shims._collector = collector
        shims.set_truth(True)

    def stop(self):
        """Stop collecting and write this step's files (in the background)."""
        collector = self._collector
        if collector is None or not collector.collecting:
            return
        shims._collector = None
        shims.set_truth(False)
        collector.collecting = False
        if self._tracker is not None:
            self._tracker.remove()
            self._tracker = None
        for handle in self._param_handles:
            handle.remove()
        self._param_handles = []
        if self._session_mode is not None:
            collector.pop_mode(self._session_mode)
            self._session_mode = None
        self._flush()

    def step(self):
        """Flush this step, then count the next one (call indices restart)."""
        collector = self._collector
        if collector is not None:
            if collector.collecting or self._dirty:
                self._flush(handover=True)
            collector.reset()
        self._dirty = False
        self.current_step += 1
        if collector is not None and collector.collecting and not self.config.wants_step(self.current_step):
            self.stop()

    def wait(self):
        """Block until every flushed step is on disk (the training loop never needs this)."""
        self._writer.wait()

    # ------------------------------------------------------------------ internals

    def _build_collector(self):
        from .collector import Collector
        from .identity import build_identity

        identity, tensor_methods = build_identity()
        named = []
        for prefix, chunk in _chunks(self._model):
            for path, module in chunk.named_modules():
                if module is chunk:
                    continue  # msprobe names children only; the root is the model itself
                named.append((prefix + path, module))
        return Collector(self.config, identity, tensor_methods, named)

    def _step_dir(self, step):
        rank = _rank()
        leaf = f"rank{rank}" if rank is not None else f"proc{os.getpid()}"
        return os.path.join(self.config.dump_path, f"step{step}", leaf)

    def _flush(self, handover=False):
        collector = self._collector
        data, stacks, construct, tensors = collector.snapshot(handover)
        # our own ops: never recorded as the user's calls, even while the session's mode is pushed
        try:
            with collector.own_work:
                collector.stats.take()
        except Exception as error:  # never into the training loop: the step's statistics are written null
            collector.log_error("collecting the step's statistics", error)
        header = {"task": self.config.task, "level": self.config.level, "framework": "pytorch",
                  "dump_data_dir": None}
        self._writer.submit(StepJob(self._step_dir(self.current_step), header, data, stacks, construct, tensors))
        self._dirty = False

    def _refuse_existing_dump(self, rank):
        root = self.config.dump_path
        leaf = f"rank{rank}" if rank is not None else "*"
        existing = sorted(glob.glob(os.path.join(glob.escape(root), "step*", leaf, "dump.json")))
        if existing:
            raise DumpPathError(
                f"msprobe_runtime: {root!r} already holds a dump ({os.path.relpath(existing[0], root)}); "
                f"nothing was overwritten. Choose a new dump_path or remove the old dump.")


class DumpPathNotWritable(OSError):
    """The dump path cannot hold a dump: found at start(), before the first step trains."""


def _check_writable(root):
    """Make ``root`` and write a file in it, or say why not (a writer-thread failure would only show after
    training, as one warning per step)."""
    import tempfile

    try:
        os.makedirs(root, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".msprobe-write-check.", dir=root)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise DumpPathNotWritable(f"msprobe_runtime: dump_path {root!r} cannot hold a dump: "
                                  f"{error.strerror or error}; choose a writable folder") from None


def _chunks(model):
    """``(name prefix, module)`` for the model given to ``start()``: a list or tuple of model chunks (Megatron's
    virtual pipeline stages) names each chunk's modules under its index, ``Module.0.decoder...``, as msprobe."""
    if model is None:
        return []
    if type(model) is list or type(model) is tuple:
        return [(f"{index}.", chunk) for index, chunk in enumerate(model)]
    return [("", model)]


def _same_model(a, b):
    """Whether ``start()`` got the model it already knows (a list is compared chunk by chunk, by identity)."""
    if a is b:
        return True
    if type(a) in (list, tuple) and type(b) in (list, tuple):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))
    return False


def _check_model(model):
    import torch

    from .foreign import is_subclass, type_name

    for index, (_, chunk) in enumerate(_chunks(model)):
        if not is_subclass(type(chunk), torch.nn.Module):
            where = f"item {index} of the list" if type(model) in (list, tuple) else "the model"
            raise TypeError(f"msprobe_runtime: start() takes a torch.nn.Module or a list or tuple of them; "
                            f"{where} is a {type_name(type(chunk))}")


def _rank():
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
