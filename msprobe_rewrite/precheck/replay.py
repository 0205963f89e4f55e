"""Run one dumped call on the CPU: in float64 (the golden) or in its own dtypes, and its backward.

The golden casts every floating tensor (and every floating ``dtype=`` argument) to float64, complex to
complex128; integer and bool tensors stay as they are. Backward is replayed through autograd with the dumped
gradient of the output, and the gradients are read where the collector read them: a post-hook on the output's
``grad_fn`` (so ``Functional.linear``'s come in the node's order, bias, input, weightᵀ, as in the dump).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .values import flat_values, rebuild

GOLDEN, SAME = "golden", "same"
_WIDE = {True: torch.complex128, False: torch.float64}


def widen(dtype: torch.dtype) -> torch.dtype:
    if dtype.is_complex:
        return torch.complex128
    return torch.float64 if dtype.is_floating_point else dtype


class Inputs:
    """One call's arguments, built once per mode from the loaded tensors; ``leaves`` require grad."""

    def __init__(
        self,
        record_args,
        record_kwargs,
        load: Callable[[dict], torch.Tensor],
        mode: str,
        want_grad: bool,
        copy: bool = False,
    ):
        self.leaves: List[torch.Tensor] = []
        self.mode = mode

        def tensor(record: dict) -> torch.Tensor:
            value = load(record)
            if mode == GOLDEN and (value.is_floating_point() or value.is_complex()):
                value = value.to(widen(value.dtype))
            elif copy or want_grad:
                # an in-place op must not change the loaded tensor that the other mode (and the grading) reads,
                # and requires_grad must not stick to it
                value = value.clone()
            if want_grad and record.get("requires_grad") and (value.is_floating_point() or value.is_complex()):
                value.requires_grad_(True)
                self.leaves.append(value)
            return value

        args = rebuild(record_args if isinstance(record_args, list) else [], tensor)
        kwargs = rebuild(record_kwargs if isinstance(record_kwargs, dict) else {}, tensor)
        if mode == GOLDEN:
            args = [_widen_dtype(v) for v in args]
            kwargs = {k: _widen_dtype(v) for k, v in kwargs.items()}
        self.args, self.kwargs = args, kwargs


def _widen_dtype(value: Any) -> Any:
    if isinstance(value, torch.dtype) and (value.is_floating_point or value.is_complex):
        return widen(value)
    return value


def call(fn: Callable, inputs: Inputs, grad: bool) -> Any:
    with torch.set_grad_enabled(grad):
        return fn(*inputs.args, **inputs.kwargs)


def backward(result: Any, output_grads: List[Optional[torch.Tensor]]) -> Optional[List[Optional[torch.Tensor]]]:
    """Gradients w.r.t. the inputs of the nodes behind ``result``, in hook order (the collector's), or None when
    no output of the result takes part in autograd."""
    outputs = flat_values(result, [])
    nodes: Dict[Any, None] = {}
    roots, grads = [], []
    for position, tensor in enumerate(outputs):
        if tensor is None or tensor.grad_fn is None:
            continue
        grad = output_grads[position] if position < len(output_grads) else None
        if grad is None:
            continue
        nodes.setdefault(tensor.grad_fn, None)
        roots.append(tensor)
        grads.append(grad.to(tensor.dtype).reshape(tensor.shape))
    if not roots:
        return None
    captured: List[Optional[torch.Tensor]] = []
    handles = [node.register_hook(lambda grad_inputs, grad_outputs: captured.extend(grad_inputs)) for node in nodes]
    try:
        torch.autograd.backward(roots, grads)
    finally:
        for handle in handles:
            handle.remove()
    return captured


def dropout_parts(api_base: str, args: list, kwargs: dict) -> Tuple[float, bool]:
    """(p, training) of a dropout call, by F.dropout's and torch.dropout's signatures."""
    p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
    training = kwargs.get("training", kwargs.get("train", args[2] if len(args) > 2 else True))
    return float(p), bool(training)


def dropout_with_mask(mask: torch.Tensor, p: float) -> Callable:
    """Dropout with the mask the device drew (read from its output): ``input * (mask / (1 - p))``, as torch's
    own kernel scales, in whatever dtype the input has."""

    def replay(x, *args, **kwargs):
        noise = mask.to(x.dtype).div_(1.0 - p)
        return x * noise

    return replay
