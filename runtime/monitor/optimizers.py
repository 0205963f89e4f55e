"""Where a monitored optimizer keeps its step, its Adam state and its fp32 main parameters (msprobe's
pytorch/monitor/optimizer_collect.py, ``OptimizerMonFactory``), read without running the optimizer's code.

- torch's optimizers (``torch.optim.Optimizer``): their own step pre/post hooks; the state is keyed by the model's
  parameters.
- megatron-core's optimizers (``MegatronOptimizer``: ``FP32Optimizer``, ``Float16OptimizerWithFloat16Params``,
  ``DistributedOptimizer``, ``ChainedOptimizer`` of these) are not torch optimizers and have no step hooks. The
  instance's ``step`` is wrapped, on that instance only (an instance attribute that shadows the class's method,
  removed again by ``remove``), as msprobe's ``patch_step`` does: megatron's classes are left alone, so a second
  optimizer, or a model that is not monitored, is untouched. The pre-hook then runs before megatron's whole step
  (before it copies main_grad into the fp32 main parameters, clips and updates) and the post-hook after it (after
  the fp32 main parameters are copied back into the model's), where the figures mean what they mean for torch's
  optimizers. Hooking the inner torch optimizer instead would read the model's weights before megatron copies the
  updated main parameters back (mixed precision), so ``param_updated`` would be a step late.
- The Adam state lives in the inner torch optimizer(s) (``.optimizer``, or each of ``.chained_optimizers``),
  keyed by the fp32 main parameter: ``fp32_from_float16_groups`` for ``Float16OptimizerWithFloat16Params``, the
  shards ``shard_fp32_from_float16_groups``/``shard_fp32_groups`` for ``DistributedOptimizer``, the model's own
  parameter otherwise. msprobe maps the model's parameter to its main parameter by zipping these groups; so does
  ``OptimizerView``. A distributed optimizer's shard is a slice of the flattened parameter: its offset is read from
  the model-side shard view (``shard_float16_groups``/``shard_fp32_groups``, views of the model parameter), so
  ``grad_reduced`` is the rank's slice of ``main_grad`` (msprobe guesses it from the first and last parameter).

Every attribute of megatron's objects is read from the instance's ``__dict__`` (runtime/foreign.py), and the
classes are told apart by the names in their MRO, as msprobe's factory tells them apart by class name.
tests/monitor/test_optimizers.py checks the mapping; tests/monitor/test_megatron_monitor.py trains with both.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch

from ..foreign import class_attribute, instance_attribute, is_subclass, sequence_items, type_name

Hook = Callable[[Any, tuple[Any, ...], dict[str, Any]], None]


def _mro_names(obj: Any) -> set[str]:
    return {type_name(klass) for klass in type.__getattribute__(type(obj), "__mro__")}


def _items(value: Any) -> list[Any]:
    found = sequence_items(value)
    return list(found) if found is not None else []


class _InstanceStep:
    """The wrapped ``step`` of one optimizer instance; ``remove`` puts back what was there."""

    def __init__(self, optimizer: Any, pre: Hook, post: Hook) -> None:
        self.optimizer = optimizer
        self.had_own = "step" in object.__getattribute__(optimizer, "__dict__")
        own = instance_attribute(optimizer, "step")
        if self.had_own:
            original = own
        else:
            function = class_attribute(type(optimizer), "step")
            if function is None:
                raise TypeError(f"{type_name(type(optimizer))} has no step method")
            original = types.MethodType(function, optimizer)
        self.original = original

        def step(*args: Any, **kwargs: Any) -> Any:
            pre(optimizer, args, kwargs)
            out = original(*args, **kwargs)
            post(optimizer, args, kwargs)
            return out

        self.wrapper = step
        object.__setattr__(optimizer, "step", step)

    def remove(self) -> None:
        if instance_attribute(self.optimizer, "step") is not self.wrapper:
            return  # someone wrapped it again after us: theirs calls ours, which then only passes through
        if self.had_own:
            object.__setattr__(self.optimizer, "step", self.original)
        else:
            object.__delattr__(self.optimizer, "step")


class OptimizerView:
    """One monitored optimizer: how to hook its step, and where a model parameter's state and main parameter are."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self.is_torch = is_subclass(type(optimizer), torch.optim.Optimizer)
        self.kind = type_name(type(optimizer))
        # id(model parameter) -> (the parameter, its main parameter in the inner optimizer)
        self.main: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # id(model parameter) -> (start, numel) of this rank's shard in the flattened parameter
        self.shard: dict[int, tuple[int, int]] = {}
        self.inner: list[Any] = []
        if self.is_torch:
            self.inner = [optimizer]
        elif "MegatronOptimizer" in _mro_names(optimizer):
            chained = instance_attribute(optimizer, "chained_optimizers")
            parts = _items(chained) if chained is not None else [optimizer]
            if chained is not None and parts:
                self.kind = "Chained" + type_name(type(parts[0]))  # msprobe's factory's name for it
            for part in parts:
                self._map(part)
        else:
            raise TypeError(
                f"{self.kind} is neither a torch.optim.Optimizer nor one of megatron-core's optimizers "
                "(docs/monitor.md)"
            )

    def _map(self, part: Any) -> None:
        inner = instance_attribute(part, "optimizer")
        if inner is not None and is_subclass(type(inner), torch.optim.Optimizer):
            self.inner.append(inner)
        # (model groups, main groups, model-side shard views or None)
        pairs = (
            ("float16_groups", "fp32_from_float16_groups", None),  # Float16OptimizerWithFloat16Params
            ("model_float16_groups", "shard_fp32_from_float16_groups", "shard_float16_groups"),  # Distributed
            ("model_fp32_groups", "shard_fp32_groups", "shard_fp32_groups"),
        )
        for model_key, main_key, view_key in pairs:
            model_groups = _items(instance_attribute(part, model_key))
            main_groups = _items(instance_attribute(part, main_key))
            view_groups = _items(instance_attribute(part, view_key)) if view_key else []
            for index, (model_group, main_group) in enumerate(zip(model_groups, main_groups)):
                views = _items(view_groups[index]) if index < len(view_groups) else []
                for position, (param, main) in enumerate(zip(_items(model_group), _items(main_group))):
                    if type(param) not in (torch.Tensor, torch.nn.Parameter) or main is None:
                        continue
                    self.main[id(param)] = (param, main)
                    view = views[position] if position < len(views) else None
                    if type(view) is torch.Tensor and view.numel() != param.numel():
                        self.shard[id(param)] = (view.storage_offset() - param.storage_offset(), view.numel())

    def install(self, pre: Hook, post: Hook) -> list[Any]:
        """Hook the step: torch's step hooks, or the instance's wrapped ``step``; handles with ``remove``."""
        if self.is_torch:
            return [self.optimizer.register_step_pre_hook(pre), self.optimizer.register_step_post_hook(post)]
        return [_InstanceStep(self.optimizer, pre, post)]

    def main_param(self, param: torch.Tensor) -> torch.Tensor:
        entry = self.main.get(id(param))
        return entry[1] if entry is not None and entry[0] is param else param

    def local_grad(self, param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor | None:
        """This rank's part of a model parameter's (reduced) gradient: its shard's slice under the distributed
        optimizer, None where this rank holds no shard of it, the gradient otherwise."""
        entry = self.shard.get(id(param))
        if entry is None:
            if self.main and id(param) not in self.main and not self.is_torch and self._sharded():
                return None  # the distributed optimizer holds no state of it on this rank
            return grad
        start, numel = entry
        return grad.reshape(-1)[start : start + numel]

    def _sharded(self) -> bool:
        return bool(self.shard)

    def states(self) -> tuple[dict[int, Any], dict[int, Any]]:
        """(id(main parameter) -> state, id(main parameter) -> param group) over the inner optimizers; keyed by id:
        a parameter's hash is the user's (runtime/foreign.py)."""
        states: dict[int, Any] = {}
        groups: dict[int, Any] = {}
        for inner in self.inner:
            states.update({id(param): state for param, state in inner.state.items()})
            groups.update({id(param): group for group in inner.param_groups for param in group["params"]})
        return states, groups
