"""Resolve the catalogue to live objects, so that a callable met at run time is named by identity.

Built once per ``start()``: ``id(object) -> dump name`` for every catalogued attribute that exists, and the
Tensor method names. Optional packages are looked at only when they are already imported (megatron, mindspeed)
or installed (torch_npu, which is then imported here, at start, never at import of msprobe_runtime).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys

from .catalogue import load_catalogue

# sections whose module is imported only when installed, or only when the program already imported it
_IMPORT_IF_INSTALLED = ("torch_npu",)
# torch first so that objects reachable under two names keep msprobe's name (torch.lstm is Torch.lstm, not VF)
_PRIORITY = ("Torch.", "Functional.", "Tensor.", "Distributed.", "NPU.")


def _module(name):
    if name in sys.modules:
        return sys.modules[name]
    root = name.split(".")[0]
    if root == "torch" or root in _IMPORT_IF_INSTALLED:
        if root != "torch" and importlib.util.find_spec(root) is None:
            return None
        try:
            return importlib.import_module(name)
        except Exception:
            return None
    return None  # megatron, mindspeed, ...: only when the program imported them itself


def _resolve(qualname):
    """The object at ``qualname`` (``torch.nn.functional.gelu``, ``torch.Tensor.add``) or None."""
    parts = qualname.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = _module(".".join(parts[:cut]))
        if module is None:
            continue
        obj = module
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def build_identity(extra_files=()):
    """``(identity, tensor_methods)``: id(callable) -> dump name, and Tensor method name -> dump name."""
    catalogue = load_catalogue(extra_files)
    identity = {}
    keep = []  # hold the objects, so an id is never reused while the table lives
    tensor_methods = {}
    items = sorted(catalogue.by_qualname.items(),
                   key=lambda kv: next((i for i, p in enumerate(_PRIORITY) if kv[1].startswith(p)),
                                       len(_PRIORITY)), reverse=True)
    for qualname, dump_name in items:
        if qualname.startswith("torch.Tensor."):
            tensor_methods[qualname[len("torch.Tensor."):]] = dump_name
        obj = _resolve(qualname)
        if obj is None or not callable(obj):
            continue
        identity[id(obj)] = dump_name
        keep.append(obj)
    identity_table = _IdentityTable(identity)
    identity_table.keep = keep
    return identity_table, tensor_methods


class _IdentityTable(dict):
    """A dict that also holds references to its keys' objects."""

    keep = ()
