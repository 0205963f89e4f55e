"""``PrecisionDebugger.save``: values the API list cannot see, in msprobe's debug-level layout (debug.json).

Entries are ``{name}.{n}.debug`` (the value as a dump record, nested lists and dicts kept) and, with
``save_backward``, ``{name}_grad.{n}.debug``: the same structure with null everywhere until a tensor hook
on each saved tensor that requires grad fills in its gradient. A tensor hook adds no autograd node and
returns None, so gradients stay bit-identical.
"""

from __future__ import annotations

import logging

from .foreign import is_subclass, key_text, mapping_items, sequence_items
from .json_files import copy_records
from .records import resolve
from .writer import Writer

logger = logging.getLogger("msprobe_runtime")

_MAX_DEPTH = 16
_SCALARS = (int, float, str)  # msprobe's check_save_param: Tensor, int, float, str, nested in list/tuple/dict


def valid_variable(value, tensor_type, depth=0):
    """Whether msprobe's save accepts ``value`` (looked at by type only: ``foreign``)."""
    kind = type(value)
    if is_subclass(kind, tensor_type) or is_subclass(kind, _SCALARS):
        return True
    if depth >= _MAX_DEPTH:
        return False
    items = sequence_items(value)
    if items is not None:
        return all(valid_variable(v, tensor_type, depth + 1) for v in items)
    items = mapping_items(value)
    if items is not None:
        return all(type(k) is str and valid_variable(v, tensor_type, depth + 1) for k, v in items)
    return False


def _skeleton(value, tensor_type, depth=0):
    """msprobe's all-None structure for a gradient entry: lists and dicts kept, every leaf None."""
    if depth < _MAX_DEPTH and not is_subclass(type(value), tensor_type):
        items = sequence_items(value)
        if items is not None:
            return [_skeleton(v, tensor_type, depth + 1) for v in items]
        items = mapping_items(value)
        if items is not None:
            return {key_text(k): _skeleton(v, tensor_type, depth + 1) for k, v in items}
    return None


def _tensors(value, tensor_type, path, out, depth=0):
    """``(path, tensor)`` for every tensor inside ``value``; ``path`` is the list of indexes and keys."""
    if is_subclass(type(value), tensor_type):
        out.append((list(path), value))
        return out
    if depth < _MAX_DEPTH:
        items = sequence_items(value)
        if items is not None:
            for index, v in enumerate(items):
                _tensors(v, tensor_type, path + [index], out, depth + 1)
            return out
        items = mapping_items(value)
        if items is not None:
            for k, v in items:
                _tensors(v, tensor_type, path + [key_text(k)], out, depth + 1)
    return out


class DebugRecords:
    """The debug entries of one step: filled by ``save`` and by gradient hooks, handed to the writer at flushes."""

    def __init__(self):
        self.token = object()
        self.counts = {}
        self.data = {}
        self.handles = []

    @property
    def dirty(self):
        return bool(self.data)

    def save(self, collector, variable, name, save_backward):
        import torch

        count = self.counts.get(name, 0)
        self.counts[name] = count + 1
        forward = f"{name}.{count}.debug"
        with collector.own_work:
            self.data[forward] = collector.describe(variable, forward)
            if not save_backward:
                return
            grad_name = f"{name}_grad.{count}.debug"
            holder = self.data
            holder[grad_name] = _skeleton(variable, torch.Tensor)
            token = self.token
            for path, tensor in _tensors(variable, torch.Tensor, [], []):
                if not tensor.requires_grad:
                    continue  # msprobe hooks only what can have a gradient; its entry stays null
                hook = _grad_hook(self, collector, token, holder, grad_name, path)
                self.handles.append(tensor.register_hook(hook))

    def snapshot(self, handover):
        """The entries for the writer; ``handover``: this step is over (gradients later than this are lost,
        as msprobe writes debug.json at step()); otherwise copies, since gradients may still arrive."""
        if handover:
            data, self.data = self.data, {}
            self.token = object()
            self.counts = {}
            for handle in self.handles:
                handle.remove()  # a saved parameter would otherwise keep one dead hook per step
            self.handles = []
            return data
        return {name: copy_records(entry) for name, entry in self.data.items()}


def _grad_hook(records, collector, token, holder, grad_name, path):
    def hook(grad):
        if records.token is not token:
            return None  # a hook left from an earlier step
        try:
            stem = ".".join([grad_name] + [str(p) for p in path])
            with collector.own_work:
                record = collector.describe(grad, stem)
            if not path:
                holder[grad_name] = record
            else:
                target = holder[grad_name]
                for part in path[:-1]:
                    target = target[part]
                target[path[-1]] = record
        except Exception as error:  # never into backward: that gradient is left null
            collector.log_error(f"recording the gradient of {grad_name}", error)
        return None  # observe only: the gradient is never replaced

    return hook


class DebugJob:
    """debug.json of one step (and its tensors, when only debug entries are dumped)."""

    __slots__ = ("directory", "header", "data", "tensors", "tensor_dir")

    def __init__(self, directory, header, data, tensors, tensor_dir):
        self.directory = directory
        self.header = header
        self.data = data
        self.tensors = tensors
        self.tensor_dir = tensor_dir


class DumpWriter(Writer):
    """The writer thread, which also writes debug.json jobs (in submission order with the step's dump)."""

    def _write(self, job):
        if type(job) is not DebugJob:
            return super()._write(job)
        out = dict(job.header)
        out["data"] = {name: resolve(entry) for name, entry in job.data.items()}
        # the numbers its device records name (none yet: save() reads outside any call, which the native lane
        # never serves) were sent with the step's dump, made into files before it
        self.write_files(job.directory, [("debug.json", out)], job.tensors, job.tensor_dir, numbers=self.last_numbers())
