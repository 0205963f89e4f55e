"""The entry points that instrumented code calls (see docs/contract.md).

This is the hot path: with no debugger collecting, each entry point only forwards, exactly as the original
expression would have run. Every parameter is positional-only so that no keyword of the user's call collides.
"""
from __future__ import annotations

import operator as _op
import sys

from . import operators

_collector = None  # set by the debugger while it collects; None means forward only


def call(api_name, fn, /, *args, **kwargs):
    """A call whose callee resolved statically to the catalogued API ``api_name``."""
    if _collector is None:
        return fn(*args, **kwargs)
    return _collector.call(api_name, fn, args, kwargs)


def dyn(fn, /, *args, **kwargs):
    """A call whose callee is known only at run time."""
    if _collector is None:
        return fn(*args, **kwargs)
    return _collector.dyn(fn, args, kwargs)


def truth(value, /):
    """``bool(value)`` for a truth test (``if value:``), recorded while collecting. Instrumented code reaches
    it as ``__msprobe__.truth``, which is the builtin ``bool`` itself while no debugger collects (see
    ``set_collecting``): a test costs a C call, not a Python frame."""
    if _collector is None or type(value) is bool:  # a bool is never recorded (most tests: 561 of 567 a step
        return bool(value)                           # on the tiny GPT), and costs no second frame
    return _collector.truth(value)


def set_collecting(collecting):
    """Point the package's entries at the recorders below (collecting) or at the plain operations they
    forward to (not): ``truth`` at ``bool``, each operator entry at its ``operator`` function, and ``dyn`` at
    ``operator.call`` (Python 3.11+). Instrumented code looks each entry up on the package at every call, so
    with no debugger collecting a routed operator or call costs a C call, not a Python frame as well."""
    package = sys.modules[__package__]
    here = globals()
    for name, plain in PLAIN.items():
        setattr(package, name, here[name] if collecting else plain)


def _binary(name, python_op):
    def shim(a, b, /):
        if _collector is None:
            return python_op(a, b)
        return _collector.operator(name, python_op, a, b)

    shim.__name__ = shim.__qualname__ = name
    shim.__doc__ = f"Exactly ``operator.{name}(a, b)``, recorded while collecting."
    return shim


def _unary(name, python_op):
    def shim(a, /):
        if _collector is None:
            return python_op(a)
        return _collector.operator(name, python_op, a)

    shim.__name__ = shim.__qualname__ = name
    shim.__doc__ = f"Exactly ``operator.{name}(a)``, recorded while collecting."
    return shim


for _row in operators.rows(operators.BINARY, operators.COMPARISON, operators.AUGMENTED):
    globals()[_row.entry] = _binary(_row.entry, getattr(_op, _row.entry))
for _row in operators.rows(operators.UNARY):
    globals()[_row.entry] = _unary(_row.entry, getattr(_op, _row.entry))

# entry -> what it is while no debugger collects (set_collecting); the others stay Python functions
PLAIN = {"truth": bool}
PLAIN.update((_row.entry, getattr(_op, _row.entry)) for _row in operators.rows(
    operators.BINARY, operators.COMPARISON, operators.AUGMENTED, operators.UNARY))
if hasattr(_op, "call"):  # Python 3.11+
    PLAIN["dyn"] = _op.call
del _row


class _Ref:
    """The target of an augmented assignment, loaded once: ``container``, ``key``, current ``value``."""

    __slots__ = ("container", "key", "value", "is_item")

    def __init__(self, container, key, value, is_item):
        self.container = container
        self.key = key
        self.value = value
        self.is_item = is_item


class _ItemLoader:
    __slots__ = ("container",)

    def __init__(self, container):
        self.container = container

    def __getitem__(self, key):
        container = self.container
        return _Ref(container, key, container[key], True)

    def __setitem__(self, key, value):
        """``item(obj)[k] = v``: the store ``obj[k] = v`` (Python has already evaluated v, obj, k in order)."""
        if _collector is None:
            self.container[key] = value
        else:
            _collector.operator("setitem", _op.setitem, self.container, key, value)


def attr(obj, name, /):
    """Load ``obj.name`` for ``obj.name op= value``."""
    return _Ref(obj, name, getattr(obj, name), False)


def item(obj, /):
    """``item(obj)[k]`` loads ``obj[k]`` for ``obj[k] op= value``, and ``item(obj)[k] = v`` stores; the
    subscript keeps its own syntax."""
    return _ItemLoader(obj)


def aug(ref, op_name, value, /):
    """Finish ``target op= value``: the in-place operation, then the store, as Python does."""
    result = globals()[op_name](ref.value, value)
    if ref.is_item:
        ref.container[ref.key] = result
    else:
        setattr(ref.container, ref.key, result)
