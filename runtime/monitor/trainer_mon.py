"""``TrainerMon``: msprobe 26.2's monitor (pytorch/monitor/module_hook.py), same constructor and ``set_monitor``.

Where the figures come from, and why there (tests/monitor/test_trainer_mon.py checks each):
- grad_unreduced: a post-accumulate-grad hook on each parameter, at the last microbatch of the step; the gradient
  is final and nothing is inserted into the autograd graph, so gradients stay bit-identical (msprobe hooks the
  AccumulateGrad node the same way; module backward hooks would change them). Under megatron's DDP the gradient
  is ``main_grad``, read after megatron's own accumulator hook and before its reduce (megatron_ddp.py).
- grad_reduced, exp_avg, exp_avg_sq, adam_update, adam_ratio, param_origin: torch's optimizer step pre-hook, with
  the optimizer state as it is before this step's update (msprobe's optimizer_pre_step_hook reads it there too).
- param_updated: the optimizer step post-hook; then the step's figures are flushed. megatron-core's optimizers
  have no step hooks: their instance's step is wrapped (optimizers.py). DTensor shards: sharded.py.
Every figure stays on the device (metrics.py) until the flush, which stacks the step's figures, the rules' running
averages and codes into one tensor and copies it to the host once (``_flush``): no host sync in forward, backward
or the optimizer's update. On an accelerator the copy does not block: it is read one collected step later
(``_drain``, transfer.py; docs/monitor.md, "The asynchronous flush"). An error of ours is logged once and the
step's figures are dropped; it never reaches the training loop.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import multiprocessing.util
import os
import uuid
import weakref
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..config import ConfigError
from ..foreign import instance_attribute, is_subclass
from . import activations as xy
from . import anomalies, deep_capture, megatron_ddp, metrics, optimizers, reuse, sharded, transfer
from . import config as monitor_config
from .names import TAG_SUFFIX, squash_param_name
from . import writer as writers

if TYPE_CHECKING:
    # one tensor's row as collected: (tag, figures on the device, shape, dtype)
    DeviceRow = tuple[str, torch.Tensor, tuple[int, ...] | None, torch.dtype | None]
    # the same row once the figures are on their way to the host: (tag, shape, dtype)
    HostRow = tuple[str, tuple[int, ...] | None, torch.dtype | None]

logger = logging.getLogger("msprobe_runtime")

_TZ = datetime.timezone(datetime.timedelta(hours=8))  # msprobe names its folders in Asia/Shanghai time


_PLAIN = (torch.Tensor, torch.nn.Parameter)


class TrainerMon:
    """msprobe's ``TrainerMon`` for a module trained with torch's optimizers (docs/monitor.md)."""

    def __init__(
        self,
        config_file_path: str,
        process_group: Any = None,
        params_have_main_grad: bool = True,
        opt_ty: Any = None,
    ) -> None:
        # opt_ty: kept by msprobe for callers before 1.2.2 and not read there either
        if os.getenv("DYNAMIC_MONITOR", "False").lower() == "true":
            raise ConfigError(
                "DYNAMIC_MONITOR=true: reloading the monitor config mid-run is not yet supported "
                "(docs/monitor.md); unset it"
            )
        if process_group is not None:
            raise ConfigError(
                "TrainerMon process_group: pipeline-parallel groups are not yet supported (docs/monitor.md); pass None"
            )
        self.config_file_path = config_file_path
        self.config = monitor_config.load(config_file_path)
        self.params_have_main_grad = params_have_main_grad
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.rank = torch.distributed.get_rank() if distributed else 0
        self.unique_id = str(uuid.uuid4())[:8]
        self.output_base_dir = os.getenv("MONITOR_OUTPUT_DIR", "./monitor_output")
        stamp = datetime.datetime.now(_TZ).strftime("%b%d_%H-%M-%S")
        self.tensorboard_dir = os.path.join(self.output_base_dir, f"{stamp}-rank{self.rank}-{self.unique_id}")
        cfg = self.config
        self.collects = not cfg.module_ranks or self.rank in cfg.module_ranks
        self.ops = cfg.numeric_ops
        self.summary_writer: writers.CSVWriter | writers.TensorBoardWriter | None = None
        self.anomaly_file: anomalies.AnomalyFile | None = None
        if self.collects:
            if cfg.format == "tensorboard":
                self.summary_writer = writers.TensorBoardWriter(self.tensorboard_dir, cfg.ops)
            else:
                self.summary_writer = writers.CSVWriter(
                    self.tensorboard_dir, cfg.ops, cfg.ndigits, cfg.step_count_per_record
                )
            if cfg.rules and cfg.anomaly_dump:
                try:
                    self.anomaly_file = anomalies.AnomalyFile(self.output_base_dir, self.rank)
                except OSError as error:  # a link planted in the output folder: written nowhere, said once
                    logger.warning("monitor: anomaly.json is not written (%s)", error)
        self.rules = anomalies.DeviceRules(cfg.rules, self.ops) if cfg.rules else None
        # a gradient or weight read again unchanged keeps its figures (reuse.py)
        self._figures = reuse.Figures(self.ops, cfg.eps)
        self.monitoring = self.collects and cfg.collect_times > 0
        self.step = 0
        self.has_collect_times = 0
        self.micro_batch_number = 1
        self.params: list[tuple[str, torch.nn.Parameter]] = []  # (name, parameter), in named_parameters order
        self.handles: list[Any] = []  # each with remove(): torch's handles, or optimizers/megatron_ddp wrappers
        self.optimizer: Any = None
        # every anomaly record made, in order (the file keeps the earliest of each step)
        self.anomalies: list[dict[str, Any]] = []
        # (prefix, tag) -> (figures, shape, dtype), in call order, for the step being collected
        self._rows: dict[tuple[str, str], tuple[torch.Tensor, tuple[int, ...] | None, torch.dtype | None]] = {}
        self._micro: list[int] = []
        self._collect_now = False
        self._failed: set[str] = set()
        self._dropped = False
        self._warned_main_grad = False
        # ours (deep_capture.py): the spike rule, the flight recorder, on_anomaly's capture and the replay
        self.param_paths: dict[str, tuple[int, str]] = {}  # monitor name -> (chunk index, parameter name)
        self.chunks: list[Any] = []
        self.chunked = False  # set_monitor got a list of model chunks: the dump names modules Module.{i}....
        self._quiet: Any = None  # the capture's own_work while it collects: our hooks' ops are not recorded
        self.responder: deep_capture.Responder | None = deep_capture.Responder(self)
        if not self.responder.wanted:
            self.responder = None
        self.activations: xy.Activations | None = None  # xy_distribution's hooks (activations.py)
        # megatron, FSDP2 and the process groups (docs/monitor.md, "Megatron, FSDP2 and process groups")
        self._view: optimizers.OptimizerView | None = None
        self._dp_group: Any = None
        self._duplicate: set[str] = set()  # names whose grad_reduced another rank writes (msprobe's duplicate_param)
        self._partial: list[tuple[str, str]] = []  # rows holding DTensor partials until the flush reduces them
        self._nodes: list[Any] = []  # the AccumulateGrad nodes hooked, kept alive as megatron keeps its grad_accs
        # the asynchronous flush (transfer.py): the collected step whose figures are on their way to the host
        self._pending: transfer.InFlight | None = None
        # an exit with a step in flight (an exception out of the loop, no close) still writes it: held weakly, as
        # the debugger's exit hook (runtime/debugger.py), so that the hook keeps no monitor alive; mp.spawn's
        # children leave through os._exit, which skips atexit and runs multiprocessing's finalizers
        atexit.register(_at_exit, weakref.ref(self))
        multiprocessing.util.Finalize(None, _at_exit, args=(weakref.ref(self),), exitpriority=10)

    # ------------------------------------------------------------------ msprobe's entry points

    def set_monitor(
        self,
        model: Any,
        optimizer: Any,
        grad_acc_steps: int = 1,
        tp_group: Any = None,
        dp_group: Any = None,
        start_iteration: int = 0,
    ) -> None:
        """Hook ``model`` (a module, or a list of virtual-pipeline chunks) and ``optimizer``."""
        if type(grad_acc_steps) is not int or grad_acc_steps < 1:
            raise ConfigError(f"set_monitor grad_acc_steps: expected an int >= 1, got {grad_acc_steps!r}")
        if type(start_iteration) is not int or start_iteration < 0:
            raise ConfigError(f"set_monitor start_iteration: expected an int >= 0, got {start_iteration!r}")
        for label, group in (("tp_group", tp_group), ("dp_group", dp_group)):
            if group is not None and not (
                torch.distributed.is_available() and is_subclass(type(group), torch.distributed.ProcessGroup)
            ):
                raise ConfigError(f"set_monitor {label}: expected a torch.distributed ProcessGroup or None")
        if self.optimizer is not None:
            raise ConfigError("set_monitor: this TrainerMon already monitors an optimizer")
        self.micro_batch_number = grad_acc_steps
        self.step = start_iteration
        chunks = model if type(model) is list else [model]
        self.chunks, self.chunked = chunks, type(model) is list
        self._register_params(chunks)
        try:
            self._view = optimizers.OptimizerView(optimizer)
        except TypeError as error:
            raise ConfigError(f"set_monitor optimizer: {error}") from None
        self.optimizer = optimizer
        self._dp_group = dp_group
        self._mark_duplicates(tp_group, dp_group)
        if not self.monitoring:
            return
        cfg = self.config
        if cfg.wg_distribution:
            self._hook_gradients(chunks)
        self.handles.extend(self._view.install(self._pre_step, self._post_step))
        if cfg.xy_distribution:
            self.activations = xy.Activations(self)
            self.handles.extend(self.activations.register(chunks))
        self._collect_now = self._wants(self.step)

    def monitor_gnorm_with_ad(
        self,
        model: Any,
        optimizer: Any = None,
        grad_acc_steps: int = 1,
        tp_group: Any = None,
        dp_group: Any = None,
        start_iteration: int = 0,
    ) -> None:
        """msprobe's name before 1.2.2."""
        optimizer = optimizer if optimizer is not None else getattr(self, "optimizer_trans", None)
        if optimizer is None:
            raise ConfigError("monitor_gnorm_with_ad: call set_wrapped_optimizer first, or pass the optimizer")
        self.set_monitor(model, optimizer, grad_acc_steps, tp_group, dp_group, start_iteration)

    def _mark_duplicates(self, tp_group: Any, dp_group: Any) -> None:
        # msprobe's _register_chunk: with tp_group, a parameter that megatron does not mark tensor_model_parallel
        # is the same on every tensor-parallel rank and only tp rank 0 writes its grad_reduced; with dp_group only
        # dp rank 0 writes grad_reduced (msprobe's fetch_grad skips the duplicates). A DTensor is reduced instead
        # (sharded.py) and written on every rank.
        tp_rank = torch.distributed.get_rank(group=tp_group) if tp_group is not None else 0
        dp_rank = torch.distributed.get_rank(group=dp_group) if dp_group is not None else 0
        for name, param in self.params:
            if sharded.is_dtensor(param):
                continue
            if tp_rank != 0 and not instance_attribute(param, "tensor_model_parallel", False):
                self._duplicate.add(name)
            if dp_rank != 0:
                self._duplicate.add(name)

    def _hook_gradients(self, chunks: list[Any]) -> None:
        # grad_unreduced: main_grad (megatron's DDP) is read after megatron's AccumulateGrad hook has added the
        # microbatch into it, and before a bucket's reduction starts (megatron_ddp.py); a plain .grad by torch's
        # post-accumulate-grad hook; a DTensor's gradient is only made after FSDP2's reduce-scatter: not yet
        self._micro = [0] * len(self.params)
        main_grad_ids: dict[int, int] = {}
        for index, (_, param) in enumerate(self.params):
            if sharded.is_dtensor(param):
                continue
            if self.params_have_main_grad and instance_attribute(param, "main_grad") is not None:
                handle, node = megatron_ddp.hook_accumulator(param, partial(self._on_grad, index, param))
                self.handles.append(handle)
                self._nodes.append(node)
                main_grad_ids[id(param)] = index
            else:
                self.handles.append(param.register_post_accumulate_grad_hook(partial(self._on_grad, index)))
        for group, params in megatron_ddp.bucket_groups(chunks):
            indices = [main_grad_ids[id(p)] for p in params if id(p) in main_grad_ids]
            if indices:
                self.handles.append(megatron_ddp.wrap_start_grad_sync(group, partial(self._on_sync, indices)))

    def _on_sync(self, indices: list[int]) -> None:
        self._guarded("gradient sync hook", self._collect_before_sync, indices)

    def _collect_before_sync(self, indices: list[int]) -> None:
        # a bucket group's reduction starts: read the gradients of its parameters that the accumulator hooks have
        # not read yet (with overlap_grad_reduce, the last one of the group is read here, before the 1/dp scaling)
        if not self._collect_now:
            return
        for index in indices:
            name, param = self.params[index]
            if ("grad_unreduced", self._tag("grad_unreduced", name)) in self._rows:
                continue
            grad = self._grad_of(param)
            if grad is not None:
                self._add("grad_unreduced", name, grad)

    def set_wrapped_optimizer(self, optimizer: Any) -> None:
        self.optimizer_trans: Any = optimizer

    def observe_loss(self, loss: Any) -> None:
        """Ours: the step's loss (a 0-d tensor, kept on the device, detached: no sync) for the AnomalySpike rule
        and the flight recorder; call it after backward, before the optimizer step (several calls in a step, one
        per microbatch, are averaged)."""
        if self.responder is not None and (self._collect_now or self.responder.replaying):
            try:
                self.responder.observe_loss(loss)
            except Exception as error:  # never into the training loop
                logger.warning("monitor: observe_loss failed (%s: %s); ignored", type(error).__name__, error)

    def set_replay(self, closure: Callable[[], Any] | None) -> None:
        """Ours: ``closure()`` reruns the forward and backward of the current batch (and may return the loss);
        when a rule fires, it runs once more under the deep capture and says whether the anomaly came back
        (docs/monitor.md). None removes it."""
        if closure is not None and not callable(closure):
            raise ConfigError(f"set_replay: expected a callable or None, got {type(closure).__name__}")
        if closure is not None and self.config.flush == "async":
            # the asynchronous flush reads step N's rules at step N + 1, when N's batch is gone (docs/monitor.md)
            raise ConfigError(
                'set_replay: the replay needs the step\'s verdict before the next batch; "flush": '
                '"async" reads it a step later: use "auto" or "sync"'
            )
        if self.responder is None:
            self.responder = deep_capture.Responder(self)
        self.responder.replay = closure

    def close(self) -> None:
        """Write the step still in flight, remove the hooks and close the writer (msprobe does this in
        ``__del__``)."""
        self._drain_at_end()
        if self.responder is not None:
            self.responder.close()
        self._remove_hooks()
        if self.summary_writer is not None:
            self.summary_writer.close()

    def __del__(self) -> None:
        # msprobe closes its writer here; at interpreter exit the writer may be half torn down: nothing to raise
        try:
            self._drain_at_end()
            if self.summary_writer is not None:
                self.summary_writer.close()
        except Exception:
            pass

    def _drain_at_end(self) -> None:
        """The step in flight, read and written now (close, ``__del__``, the interpreter's exit)."""
        if getattr(self, "_pending", None) is None:  # (a constructor that raised left none)
            return
        quiet = self._quiet  # a capture still running: our reads are not the user's calls
        if quiet is None:
            self._drain(self.step, wait=True)
        else:
            with quiet:
                self._drain(self.step, wait=True)

    # ------------------------------------------------------------------ setup

    def _register_params(self, chunks: list[Any]) -> None:
        targets = list(self.config.targets) or [""]
        seen: set[str] = set()
        for stage, chunk in enumerate(chunks):
            prefix = f"{stage}:"
            for param_name, param in chunk.named_parameters():
                if type(param) not in _PLAIN and not sharded.is_dtensor(param):
                    # a tensor subclass (DTensor of FSDP2, a float8 weight) runs its own code for every op and
                    # attribute read, collectives included: not yet supported (docs/monitor.md)
                    logger.warning(
                        "monitor: %s is a %s, not a plain tensor: not monitored (not yet supported)",
                        prefix + param_name,
                        type(param).__name__,
                    )
                    continue
                if not param.requires_grad:
                    continue
                squashed = prefix + squash_param_name(param_name, self.config.squash_name)
                full = prefix + param_name
                if not any(param_name.startswith(t) or squashed.startswith(t) or full.startswith(t) for t in targets):
                    continue
                name = full if squashed in seen else squashed
                seen.add(name)
                self.params.append((name, param))
                self.param_paths[name] = (stage, param_name)

    def _wants(self, step: int) -> bool:
        cfg = self.config
        return (
            self.monitoring
            and step >= cfg.start_step
            and (step - cfg.start_step) % cfg.step_interval == 0
            and self.has_collect_times < cfg.collect_times
        )

    def _remove_hooks(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self._nodes = []
        self._figures.clear()
        self.monitoring = False
        self._collect_now = False

    # ------------------------------------------------------------------ the figures, on the device

    def _tag(self, prefix: str, name: str) -> str:
        return f"{name}/rank{self.rank}/{TAG_SUFFIX[prefix]}"

    def _add(self, prefix: str, name: str, tensor: torch.Tensor) -> None:
        if sharded.is_dtensor(tensor):  # torch's own subclass: its local shard, reduced with dp_group (sharded.py)
            self._add_dtensor(prefix, name, tensor)
            return
        if type(tensor) not in _PLAIN:  # a gradient or optimizer state that is a subclass: as in _register_params
            if "subclass" not in self._failed:
                self._failed.add("subclass")
                logger.warning(
                    "monitor: %s of %s is a %s, not a plain tensor: not monitored (not yet supported)",
                    TAG_SUFFIX[prefix],
                    name,
                    type(tensor).__name__,
                )
            return
        with torch.no_grad():
            values = self._figures.of(prefix, tensor)
        self._rows[(prefix, self._tag(prefix, name))] = (values, tuple(tensor.shape), tensor.dtype)

    def _add_dtensor(self, prefix: str, name: str, tensor: Any) -> None:
        with torch.no_grad():
            local = tensor.to_local()
            placement = sharded.layout(tensor)
            key = (prefix, self._tag(prefix, name))
            if placement == "shard" and self._dp_group is not None:
                self._rows[key] = (sharded.partials(local, self.config.eps), tuple(tensor.shape), local.dtype)
                self._partial.append(key)
                return
            if placement == "other" and "dtensor layout" not in self._failed:
                self._failed.add("dtensor layout")
                logger.warning(
                    "monitor: %s of %s is a DTensor placed %s: figures of the local shard only (not yet reduced)",
                    TAG_SUFFIX[prefix],
                    name,
                    tuple(tensor.placements),
                )
            values = metrics.figures(local, self.ops, self.config.eps)
        self._rows[key] = (values, tuple(local.shape), local.dtype)

    def _grad_of(self, param: torch.nn.Parameter) -> torch.Tensor | None:
        if self.params_have_main_grad:
            main_grad = instance_attribute(param, "main_grad")
            if main_grad is not None:
                return main_grad
            if not self._warned_main_grad:
                self._warned_main_grad = True
                logger.warning(
                    "monitor: params_have_main_grad=True but a parameter has no main_grad; reading "
                    ".grad (pass params_have_main_grad=False for a module without megatron's DDP)"
                )
        return param.grad

    def _guarded(self, where: str, work: Callable[..., object], *args: Any) -> None:
        try:
            if self.responder is not None and self.responder.replaying:
                return  # the replay's backward (deep_capture.py) is not a step of training
            quiet = self._quiet
            if quiet is None:
                work(*args)
            else:
                with quiet:
                    work(*args)
        except Exception as error:  # an error of ours never reaches the training loop: log once, drop the step
            if where not in self._failed:
                self._failed.add(where)
                logger.warning(
                    "monitor: %s failed (%s: %s); this step's figures are dropped", where, type(error).__name__, error
                )
            self._rows = {}
            self._partial = []
            self._dropped = True  # a partial step is not written: the post-step hook skips its flush

    def _on_grad(self, index: int, param: torch.nn.Parameter) -> None:
        self._guarded("gradient hook", self._collect_grad, index, param)

    def _collect_grad(self, index: int, param: torch.nn.Parameter) -> None:
        self._micro[index] += 1
        if self._micro[index] < self.micro_batch_number:
            return
        self._micro[index] = 0
        name = self.params[index][0]
        if self._collect_now and ("grad_unreduced", self._tag("grad_unreduced", name)) not in self._rows:
            grad = self._grad_of(param)  # (already read where a bucket's reduction started first: megatron_ddp.py)
            if grad is not None:
                self._add("grad_unreduced", name, grad)

    def _pre_step(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._guarded("optimizer pre-step hook", self._collect_pre, optimizer)

    def _collect_pre(self, optimizer: Any) -> None:
        if not self._collect_now:
            return
        cfg = self.config
        if cfg.wg_distribution:
            for name, param in self.params:
                grad = self._grad_of(param)
                if grad is not None and self._view is not None:
                    grad = self._view.local_grad(param, grad)  # the distributed optimizer's shard of it
                if grad is not None and name not in self._duplicate:
                    self._add("grad_reduced", name, grad)
        if cfg.mv_distribution or cfg.ur_distribution:
            self._collect_moments(optimizer)
        if cfg.param_distribution:
            for name, param in self.params:
                if param.numel():
                    self._add("param_origin", name, param)
        if cfg.mg_direction:
            self._collect_directions(optimizer)

    def _collect_directions(self, optimizer: Any) -> None:
        # msprobe's mg_direction: the share of a gradient's elements whose sign agrees with Adam's exp_avg before
        # this step's update; 1.0 before the first step; written as other_*.csv, tag .../mg_direction
        assert self._view is not None  # set with the hooks (set_monitor)
        states, _ = self._view.states()
        for name, param in self.params:
            grad = self._grad_of(param)
            if grad is not None:
                grad = self._view.local_grad(param, grad)
            if grad is None:
                continue
            exp_avg = (states.get(id(self._view.main_param(param))) or {}).get("exp_avg")
            with torch.no_grad():
                if exp_avg is None:
                    ratio = torch.ones((), device=grad.device)
                else:
                    ratio = metrics.sign_matches(grad, exp_avg)
            self._add("other", name, ratio)

    def _collect_moments(self, optimizer: Any) -> None:
        # the state and groups are looked up by id: a parameter's hash is the user's (runtime/foreign.py)
        assert self._view is not None  # set with the hooks (set_monitor)
        states, groups = self._view.states()  # megatron's: keyed by the fp32 main parameter (optimizers.py)
        updates = []
        for name, model_param in self.params:
            param = self._view.main_param(model_param)
            state = states.get(id(param))
            if not state:
                continue  # before the first step: msprobe writes no rows either
            exp_avg, exp_avg_sq = state.get("exp_avg"), state.get("exp_avg_sq")
            if exp_avg is None or exp_avg_sq is None:
                continue
            if self.config.mv_distribution:
                self._add("exp_avg", name, exp_avg)
                self._add("exp_avg_sq", name, exp_avg_sq)
            group = groups.get(id(param))
            if self.config.ur_distribution and group is not None and "step" in state:
                updates.append((name, exp_avg, exp_avg_sq, state["step"], group))
        ratios = []
        with torch.no_grad():
            for name, exp_avg, exp_avg_sq, step, group in updates:
                beta1, beta2 = group["betas"]
                if type(step) is torch.Tensor:
                    # 1 - 0.999 ** step loses 4 digits in float32, the dtype torch keeps the step in; torch's
                    # AdamW computes it in Python floats (tests/monitor/test_trainer_mon.py)
                    step = step.to(torch.float64)
                exp_avg_hat = exp_avg / (1 - beta1**step)
                root = torch.sqrt(exp_avg_sq / (1 - beta2**step))
                self._add("adam_update", name, exp_avg_hat / (root + group["eps"]))
                ratios.append((name, exp_avg_hat / root))
        for name, ratio in ratios:  # msprobe writes the two files apart: keep each file's rows together
            self._add("adam_ratio", name, ratio)

    def _post_step(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        step = self.step
        self._guarded("optimizer post-step hook", self._finish_step)
        if self._pending is not None and self._pending.step < step:
            # an earlier step's copy (this step not collected, or dropped): read if done, without waiting
            self._guarded("optimizer post-step hook", self._drain, step, False)
        self._dropped = False  # a failure here drops this step, never the next
        if self.responder is not None:
            self.responder.end_step(step)

    def _finish_step(self) -> None:
        try:
            if self._collect_now and not self._dropped:
                if self.config.param_distribution:
                    for name, param in self.params:
                        if param.numel():
                            self._add("param_updated", name, param)
                if self.activations is not None:
                    self.activations.finish()
                self._flush(self.step)
                self.has_collect_times += 1
        finally:  # the step is counted whatever failed, so that the steps written stay the optimizer's
            self._rows = {}
            self._partial = []
            self._figures.end_step()
            self._dropped = False
            if self.activations is not None:
                self.activations.end_step()
            self.step += 1
            if self.monitoring and self.has_collect_times >= self.config.collect_times:
                self._drain(self.step - 1, wait=True)  # no later flush will read it
                self._remove_hooks()
            self._collect_now = self._wants(self.step)

    # ------------------------------------------------------------------ the flush, once per collected step

    def _asynchronous(self, backend: transfer.Backend) -> bool:
        """Whether this flush's copy is read at the next collected step (docs/monitor.md, "The asynchronous
        flush"): a replay closure needs the step's verdict while its batch is the current one, so it keeps the
        flush synchronous; ``auto`` keeps it for on_anomaly too, whose capture then records the very next step."""
        mode = self.config.flush
        if mode == "sync" or (self.responder is not None and self.responder.replay is not None):
            return False
        if mode == "async":
            return True
        return backend.accelerated and self.config.on_anomaly is None

    def _flush(self, step: int) -> None:
        # the previous collected step's figures first, so that the host handles the steps in order
        self._drain(step, wait=True)
        if not self._rows:
            return
        if self._partial:  # DTensor shards: one all-reduce per kind for all of them, on the device (sharded.py)
            sharded.finalize(self._rows, self._partial, self.ops, self._dp_group)
            self._partial = []
        # prefix -> [(tag, figures, shape, dtype)], prefixes in the order of their first row
        groups: dict[str, list[DeviceRow]] = {}
        for (prefix, tag), (on_device, shape, dtype) in self._rows.items():
            groups.setdefault(prefix, []).append((tag, on_device, shape, dtype))
        device = next(iter(self._rows.values()))[0].device
        parts: list[torch.Tensor] = []
        layout: list[tuple[str, list[HostRow]]] = []
        stacks: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            # the rules' running averages and the spike windows are updated here, on the device, whichever way
            # the figures then travel: the host never feeds them back (tests/monitor/test_async_flush.py)
            for prefix, rows in groups.items():
                stacked = torch.stack([values.to(device) for _, values, _, _ in rows])
                stacks[prefix] = stacked
                parts.append(stacked.reshape(-1))
                if self.rules is not None:
                    averages, rule_codes = self.rules.evaluate(prefix, tuple(tag for tag, _, _, _ in rows), stacked)
                    parts.extend((averages.reshape(-1), rule_codes.reshape(-1)))
                layout.append((prefix, [(tag, shape, dtype) for tag, _, shape, dtype in rows]))
            series: list[tuple[int, str]] = []
            if self.responder is not None:  # the spike rule's figures travel in the same copy
                parts.extend(part.to(device) for part in self.responder.device_parts(stacks, device))
                series = list(self.responder.series_layout)
            flat = torch.cat(parts)
            backend = transfer.backend_for(device.type)
            if self._asynchronous(backend):
                buffer, event = backend.start(flat)  # read at the next collected step's flush (_drain)
                self._pending = transfer.InFlight(step, buffer, event, (layout, series), flat)
                return
            host = flat.tolist()  # the one device-to-host copy of the step, read now
        # outside no_grad: the replay (deep_capture.py) runs the user's forward and backward from here
        self._write(step, host, layout, series, step)

    def _drain(self, now: int, wait: bool) -> None:
        """The host part of the step whose copy is in flight, if any: at once if the copy is done, else only with
        ``wait`` (the next flush, the last collected step, close). ``now``: the optimizer step whose post-step hook
        runs (the deep capture starts after it). An error here drops that step alone, said once."""
        pending = self._pending
        if pending is None or not (wait or pending.ready()):
            return
        self._pending = None
        try:
            layout, series = pending.layout
            self._write(pending.step, pending.values(), layout, series, now)
        except Exception as error:  # never into the training loop; the step being collected is kept
            if "host part" not in self._failed:
                self._failed.add("host part")
                logger.warning(
                    "monitor: writing step %d's figures failed (%s: %s); that step is dropped",
                    pending.step,
                    type(error).__name__,
                    error,
                )

    def _write(
        self,
        step: int,
        host: list[float],
        layout: list[tuple[str, list[HostRow]]],
        series: list[tuple[int, str]],
        now: int,
    ) -> None:
        """Everything the host does with step ``step``'s figures: the CSV or TensorBoard rows, the anomaly records,
        anomaly.json, the log line, the flight recorder, the spike rule's records and the deep capture."""
        width = len(self.ops)
        position = 0
        call_id = 0
        found = []
        fired: list[tuple[dict[str, Any], Any, str, float, float]] = []  # (record, rule, op, value, history)
        written: list[tuple[str, list[Any]]] = []  # (prefix, rows as written), for the flight recorder
        for prefix, rows in layout:
            count = len(rows) * width
            figures = host[position : position + count]
            position += count
            if self.rules is not None:
                history = host[position : position + count]
                codes = host[position + count : position + 2 * count]
                position += 2 * count
            out = []
            for row, (tag, shape, dtype) in enumerate(rows):
                values = figures[row * width : (row + 1) * width]
                out.append((tag, values, shape, dtype))
                if self.rules is not None and shape is not None:  # None: a non-tensor's NaN row (activations.py)
                    for column in range(width):
                        code = int(codes[row * width + column])
                        if code:
                            rule = self.config.rules[code - 1].name
                            text = anomalies.message(
                                rule, tag, self.ops[column], step, values[column], history[row * width + column]
                            )
                            found.append(anomalies.record(self.rank, step, call_id, tag, text, [self.rank]))
                            fired.append(
                                (
                                    found[-1],
                                    self.config.rules[code - 1],
                                    self.ops[column],
                                    values[column],
                                    history[row * width + column],
                                )
                            )
                            break  # msprobe's record key is the tag, step and call: one record per tag
                call_id += 1
            assert self.summary_writer is not None  # set whenever the hooks are (__init__, self.collects)
            self.summary_writer.write(prefix, step, out)
            written.append((prefix, out))
        if self.responder is not None:
            found.extend(self.responder.spike_records(step, host[position:], call_id, series))
        if found:
            found.sort(key=anomalies.execution_order)
            self.anomalies.extend(found)
            logger.warning(
                "monitor: step %d: %d tensor(s) with anomalies, earliest: %s", step, len(found), found[0]["message"]
            )
            if self.anomaly_file is not None:
                self.anomaly_file.add(found[: anomalies.RECORDS_PER_STEP])
        if self.responder is not None:
            self.responder.after_flush(step, written, found, fired, now)


def _at_exit(monitor_ref: weakref.ref[TrainerMon]) -> None:
    """At the interpreter's exit (an uncaught exception included): the step whose copy is in flight is written."""
    monitor = monitor_ref()
    if monitor is None:
        return
    try:
        monitor._drain_at_end()
    except Exception as error:  # at exit the user's own traceback must stay the last word
        logger.error("monitor: writing the last step at exit failed: %s", error)
