"""``MonitorCallback``: msprobe's TrainerMon under transformers' ``Trainer``, as a ``TrainerCallback`` we ship.

    from msprobe_runtime.monitor import MonitorCallback
    trainer = Trainer(model, args, train_dataset=..., callbacks=[MonitorCallback("monitor_config.json")])

``on_train_begin`` is the first event at which the Trainer has made its optimizer (and wrapped it in accelerate's
``AcceleratedOptimizer``): the callback makes a TrainerMon there and hooks the model and the torch optimizer inside
the wrapper (the wrapper's own step runs none of torch's step hooks), with ``grad_acc_steps`` =
``args.gradient_accumulation_steps`` and ``start_iteration`` = ``state.global_step`` (a resumed run goes on counting
from its checkpoint's step). ``on_train_end`` closes it. Nothing else is needed per step: the monitor hangs on the
optimizer's step, so a step skipped by the gradient scaler is not counted, as with TrainerMon itself.
Importing ``msprobe_runtime`` or ``msprobe_runtime.monitor`` imports no transformers: this module loads on first
use of the name (tests/monitor/test_callback.py).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback

from ..foreign import instance_attribute, is_subclass
from .trainer_mon import TrainerMon


def torch_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside wrappers that keep it as ``.optimizer`` (accelerate's AcceleratedOptimizer,
    transformers' own), read from the wrapper's ``__dict__``: no code of the wrapper runs."""
    seen = 0
    while seen < 8:
        inner = instance_attribute(optimizer, "optimizer")
        if inner is None or not is_subclass(type(inner), torch.optim.Optimizer):
            return optimizer
        optimizer, seen = inner, seen + 1
    return optimizer


class MonitorCallback(TrainerCallback):
    """Runs a ``TrainerMon`` (docs/monitor.md) for the length of ``Trainer.train``; ``self.monitor`` is it."""

    def __init__(self, config_file_path: str, params_have_main_grad: bool = False) -> None:
        # params_have_main_grad: False by default, unlike TrainerMon: a Trainer's model has no megatron main_grad
        self.config_file_path = config_file_path
        self.params_have_main_grad = params_have_main_grad
        self.monitor: TrainerMon | None = None

    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kwargs: Any
    ) -> None:
        if self.monitor is not None:  # a second train() on the same Trainer: a fresh monitor, as a fresh run
            self.monitor.close()
        if model is None or optimizer is None:
            raise ValueError("MonitorCallback: the Trainer passed no model or optimizer to on_train_begin")
        monitor = TrainerMon(self.config_file_path, params_have_main_grad=self.params_have_main_grad)
        monitor.set_monitor(
            model,
            torch_optimizer(optimizer),
            grad_acc_steps=args.gradient_accumulation_steps,
            start_iteration=state.global_step,
        )
        self.monitor = monitor

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.close()
