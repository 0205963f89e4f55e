"""Where ``grad_unreduced`` is read from ``param.main_grad`` under megatron-core's DistributedDataParallel.

Megatron's DDP hooks each parameter's gradient accumulator (the ``AccumulateGrad`` node): its hook adds
``param.grad`` into ``param.main_grad`` (a view of the DDP grad buffer) and drops ``param.grad``. So:

- A post-accumulate-grad hook on the parameter runs *before* that node hook (torch runs tensor hooks inside the
  node, node post-hooks after it): ``main_grad`` would lack the microbatch just computed. The monitor hooks the
  same ``AccumulateGrad`` node, after megatron (node post-hooks run in the order registered; megatron registers
  when DDP wraps the module, before ``set_monitor``), as msprobe's ``_hook_weights`` does.
- With ``overlap_grad_reduce``, megatron's hook for the last parameter of a bucket group starts that group's
  reduction (``start_grad_sync``: it scales the buffer by 1/dp and launches the all-reduce or reduce-scatter) before
  the monitor's hook for that parameter runs. msprobe wraps ``start_grad_sync`` on megatron's class to read the
  bucket's gradients first; here ``start_grad_sync`` is wrapped on each bucket-group *instance* of the monitored
  DDP chunks (an instance attribute that shadows the method, removed on close), and reads the monitored
  parameters of that group not read yet this step, so every ``grad_unreduced`` is read before the reduce.

Only ``type()``, identity and instance ``__dict__`` reads touch megatron's objects (runtime/foreign.py);
``expand_as`` on a plain parameter is torch's. tests/monitor/test_megatron_monitor.py trains with both.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch

from ..foreign import class_attribute, instance_attribute, sequence_items


class _Restore:
    def __init__(self, owner: Any, name: str, wrapper: Any, original: Any, had_own: bool) -> None:
        self.owner, self.name, self.wrapper, self.original, self.had_own = owner, name, wrapper, original, had_own

    def remove(self) -> None:
        if instance_attribute(self.owner, self.name) is not self.wrapper:
            return
        if self.had_own:
            object.__setattr__(self.owner, self.name, self.original)
        else:
            object.__delattr__(self.owner, self.name)


def hook_accumulator(param: torch.Tensor, hook: Callable[[], None]) -> tuple[Any, Any]:
    """A post-hook on ``param``'s ``AccumulateGrad`` node (after the hooks already there); ``(handle, node)``:
    the caller keeps the node alive, as megatron keeps its ``grad_accs``."""
    with torch.enable_grad():
        view = param.expand_as(param).grad_fn
        assert view is not None  # param requires grad (the monitor hooks only those), so its view has a grad_fn
        node = view.next_functions[0][0]
    assert node is not None  # a leaf that requires grad has its AccumulateGrad node
    handle = node.register_hook(lambda *unused: hook())
    return handle, node


def _items(value: Any) -> list[Any]:
    found = sequence_items(value)
    return list(found) if found is not None else []


def bucket_groups(chunks: list[Any]) -> list[tuple[Any, list[torch.Tensor]]]:
    """(bucket group, its parameters) of every megatron DDP chunk in ``chunks``; none for any other module."""
    found = []
    for chunk in chunks:
        for key in ("bucket_groups", "expert_parallel_bucket_groups"):
            for group in _items(instance_attribute(chunk, key)):
                params = []
                for bucket in _items(instance_attribute(group, "buckets")):
                    params.extend(_items(instance_attribute(bucket, "params_list")))
                if params and class_attribute(type(group), "start_grad_sync") is not None:
                    found.append((group, params))
    return found


def wrap_start_grad_sync(group: Any, before: Callable[[], None]) -> _Restore:
    """Run ``before()`` ahead of this bucket group's ``start_grad_sync`` (this instance only)."""
    had_own = "start_grad_sync" in object.__getattribute__(group, "__dict__")
    if had_own:
        original = instance_attribute(group, "start_grad_sync")
    else:
        original = types.MethodType(class_attribute(type(group), "start_grad_sync"), group)

    def start_grad_sync(*args: Any, **kwargs: Any) -> Any:
        before()
        return original(*args, **kwargs)

    object.__setattr__(group, "start_grad_sync", start_grad_sync)
    return _Restore(group, "start_grad_sync", start_grad_sync, original, had_own)
