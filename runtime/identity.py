"""Resolve the catalogue to live objects, so that a callable met at run time is named by identity.

Built once per ``start()``: ``id(object) -> dump name`` for every catalogued attribute that exists, the ops of
config.json's ``custom_op_namespaces`` (``custom_operators``), and the Tensor method names. Optional packages
are looked at only when they are already imported (megatron, mindspeed) or installed (torch_npu, which is then
imported here, at start, never at import of msprobe_runtime).
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


def custom_operators(namespaces):
    """``[(object, dump name)]`` for the ops of the ``torch.ops`` namespaces listed, named as msprobe 26.2 names
    them (its ``PrecisionDebugger._auto_register_custom_ops``): an op is one whose JIT schema has no overload
    name (``mylib::op(Tensor x) -> Tensor``; an op with named overloads only, ``mylib::op.out(...)``, is not
    registered by msprobe either), its dump name is ``{namespace}.{op}``.

    msprobe replaces the attribute ``torch.ops.<ns>.<op>`` with a wrapper, so it records calls through the
    packet only (a call of ``.default`` then fails, and the function ``torch.library.custom_op`` returned
    reaches the op without the attribute, unrecorded). Here the op is named by identity, so every way of
    calling it is recorded under that one name: the packet, each of its overloads (what ``TorchFunctionMode``
    sees of a ``custom_op`` function's call in uninstrumented code), and the ``CustomOpDef`` itself (the
    compiler routes calls of a ``@custom_op`` function through ``dyn``: tests/runtime/test_custom_ops.py).
    A namespace that is not loaded yields nothing; the table is built at ``start()``, as msprobe scans at its
    first ``start()``."""
    if not namespaces:
        return []
    import torch

    wanted = set(namespaces)
    try:
        schemas = torch._C._jit_get_all_schemas()
    except Exception:
        return []
    ops = sorted(
        {schema.name for schema in schemas if not schema.overload_name and schema.name.partition("::")[0] in wanted}
    )
    try:
        from torch._library.custom_ops import OPDEFS  # qualified name -> CustomOpDef, of torch.library.custom_op
    except Exception:
        OPDEFS = {}
    out = []
    for qualified in ops:
        namespace, _, op = qualified.partition("::")
        name = f"{namespace}.{op}"
        try:
            packet = getattr(getattr(torch.ops, namespace), op)
            overloads = [getattr(packet, overload) for overload in packet.overloads()]
        except Exception:  # an op whose registration went away, or a namespace torch.ops cannot load
            continue
        out.append((packet, name))
        out.extend((overload, name) for overload in overloads)
        definition = OPDEFS.get(qualified)
        if definition is not None:
            out.append((definition, name))
    return out


def build_identity(extra_files=(), custom_op_namespaces=()):
    """``(identity, tensor_methods)``: id(callable) -> dump name, and Tensor method name -> dump name."""
    catalogue = load_catalogue(extra_files)
    identity = {}
    keep = []  # hold the objects, so an id is never reused while the table lives
    tensor_methods = {}
    items = sorted(
        catalogue.by_qualname.items(),
        key=lambda kv: next((i for i, p in enumerate(_PRIORITY) if kv[1].startswith(p)), len(_PRIORITY)),
        reverse=True,
    )
    for qualname, dump_name in items:
        if qualname.startswith("torch.Tensor."):
            tensor_methods[qualname[len("torch.Tensor.") :]] = dump_name
        obj = _resolve(qualname)
        if obj is None or not callable(obj):
            continue
        identity[id(obj)] = dump_name
        keep.append(obj)
    for obj, dump_name in custom_operators(custom_op_namespaces):
        if id(obj) not in identity:  # a catalogued API keeps its catalogue name (torch_npu's ops are both)
            identity[id(obj)] = dump_name
            keep.append(obj)
    identity_table = _IdentityTable(identity)
    identity_table.keep = keep
    return identity_table, tensor_methods


class _IdentityTable(dict):
    """A dict that also holds references to its keys' objects."""

    keep = ()
