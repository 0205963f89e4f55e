"""Backward data without touching the autograd graph.

API backward: a post-hook on each output's existing ``grad_fn`` (``Node.register_hook``) sees the gradients
w.r.t. the node's outputs and inputs. Module backward: tensor hooks (``Tensor.register_hook``) on the module's
output and input tensors. Parameter gradients: ``register_post_accumulate_grad_hook``. None of these creates
a node or changes an edge, so accumulation order, and therefore every gradient bit, stays as it was. Every hook
returns None: it observes, it never replaces a gradient.
"""
from __future__ import annotations


def flat_tensors(value, out, depth=0):
    """Tensors inside ``value`` (tuples, lists, dict values) in order; other leaves become None."""
    import torch

    if isinstance(value, torch.Tensor):
        out.append(value)
    elif depth < 8 and isinstance(value, (list, tuple)):
        for v in value:
            flat_tensors(v, out, depth + 1)
    elif depth < 8 and isinstance(value, dict):
        for v in value.values():
            flat_tensors(v, out, depth + 1)
    else:
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
    token = collector.token
    width = len(outputs)
    for node, positions in nodes.items():
        node.register_hook(_api_post_hook(collector, token, name, width, positions))


def _api_post_hook(collector, token, name, width, positions):
    def hook(grad_inputs, grad_outputs):
        if collector.token is not token or not collector.collecting:
            return None
        collector.in_api += 1  # our own statistics ops must not be seen as the user's API calls
        try:
            entry = collector.backward_entry(name, width, 0)
            if entry is None:
                return None
            describe = collector.describe
            if "input" in entry:
                for position, output_nr in positions:
                    if output_nr < len(grad_outputs):
                        entry["input"][position] = describe(grad_outputs[output_nr], None)
            if "output" in entry:
                entry["output"].extend(describe(g, None) for g in grad_inputs)
        except Exception as error:
            collector.log_error("API backward hook", error)
        finally:
            collector.in_api -= 1
        return None

    return hook


def hook_module_backward(collector, name, inputs, outputs):
    """Tensor hooks on a module's outputs (backward ``input``) and inputs (backward ``output``)."""
    token = collector.token
    n_in, n_out = len(inputs), len(outputs)
    registered = False
    for position, t in enumerate(outputs):
        if t is not None and t.requires_grad:
            t.register_hook(_tensor_hook(collector, token, name, n_out, n_in, "input", position))
            registered = True
    if not registered:
        return
    for position, t in enumerate(inputs):
        if t is not None and t.requires_grad:
            t.register_hook(_tensor_hook(collector, token, name, n_out, n_in, "output", position))


def _tensor_hook(collector, token, name, n_out, n_in, field, position):
    def hook(grad):
        if collector.token is not token or not collector.collecting:
            return None
        collector.in_api += 1
        try:
            entry = collector.backward_entry(name, n_out, n_in)
            if entry is not None and field in entry:
                entry[field][position] = collector.describe(grad, None)
        except Exception as error:
            collector.log_error("module backward hook", error)
        finally:
            collector.in_api -= 1
        return None

    return hook


def hook_parameters(collector):
    """``register_post_accumulate_grad_hook`` on every parameter of every named module; returns handles."""
    handles = []
    for module, prefix in collector.modules.values():
        for param_name, param in module.named_parameters(recurse=False):
            if param.requires_grad:
                handles.append(param.register_post_accumulate_grad_hook(
                    _param_hook(collector, prefix, param_name)))
    return handles


def _param_hook(collector, prefix, param_name):
    def hook(param):
        if not collector.collecting:
            return None
        collector.in_api += 1
        try:
            collector.record_param_grad(prefix, param_name, param)
        except Exception as error:
            collector.log_error("parameter gradient hook", error)
        finally:
            collector.in_api -= 1
        return None

    return hook
