"""The entry points that instrumented code calls (see docs/contract.md).

This is the hot path: with no debugger collecting, each entry point only forwards, exactly as the original
expression would have run. Every parameter is positional-only so that no keyword of the user's call collides.

Each entry is one Python function for the life of the process, collecting or not: ``torch.compile`` guards on
the identity of every callable it traces, so an entry that changed with collection would recompile every
compiled function that reaches it at each ``start()`` and ``stop()`` (tests/compile). Inside a region Dynamo
traces, each entry is traced as the plain operation it forwards to (``compiled_regions``), never reading
``_collector``.
"""

from __future__ import annotations

import operator as _op
from typing import Any, Callable, Dict

from . import operators

_collector = None  # set by the debugger while it collects (attach/detach); None means forward only


def attach(collector: Any) -> None:
    """Route the entries to ``collector`` (``start()``)."""
    global _collector
    _collector = collector


def detach() -> None:
    """Forward only (``stop()``)."""
    global _collector
    _collector = None


def call(api_name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """A call whose callee resolved statically to the catalogued API ``api_name``."""
    if _collector is None:
        return fn(*args, **kwargs)
    return _collector.call(api_name, fn, args, kwargs)


# Collector.dyn's answers for a callee it does not record, which the entry then calls itself: not inside
# Collector.dyn, so that a level of nested modules costs one frame more than in the plain program, not three
# (tests/runtime/test_nesting_depth.py)
NOT_ROUTED = object()
MODULE_CALL = object()  # a module called through nn.Module's own __call__ (``_wrapped_call_impl``)
# a plain function that was not rewritten (torch's ``optimizer.step``, ``clip_grad_norm_``): called with the
# observing mode on, which records the torch calls it makes, as it records those of torch's own modules
# (tests/runtime/test_window_coverage.py)
FOREIGN_CALL = object()


def dyn(fn: Any, /, *args: Any, **kwargs: Any) -> Any:  # any callable: a module, a class, a function
    """A call whose callee is known only at run time."""
    collector = _collector
    if collector is None:
        return fn(*args, **kwargs)
    result = collector.dyn(fn, args, kwargs)
    if result is NOT_ROUTED:
        return fn(*args, **kwargs)
    if result is MODULE_CALL:
        # nn.Module._wrapped_call_impl's body, the same reads in the same order: with collection on, torch's
        # hooks add a frame of their own (``_call_impl``'s ``inner``), and this one takes the place of that
        if fn._compiled_call_impl is not None:
            return fn._compiled_call_impl(*args, **kwargs)
        return fn._call_impl(*args, **kwargs)
    if result is FOREIGN_CALL:
        begun = collector.enter_foreign(fn)
        try:
            return fn(*args, **kwargs)
        finally:
            collector.leave_foreign(begun)
    return result


def truth(value: object, /) -> bool:
    """``bool(value)`` for a truth test (``if value:``), recorded while collecting."""
    if _collector is None or type(value) is bool:  # a bool is never recorded (most tests: 561 of 567 a step
        return bool(value)  # on the tiny GPT), and costs no second frame
    return _collector.truth(value)


def builtin(fn: Callable[..., Any], /) -> Callable[..., Any]:
    """The callee of ``fn(...)`` where ``fn`` is a builtin that runs tensor methods (``zip``, ``sum``, ``abs``:
    ``operators.OBSERVED_BUILTINS``): ``fn`` itself, or while collecting, ``fn`` to be called with the observing
    mode on. The callee is wrapped, not the call, so that ``sum(x for x in y)`` keeps its bare generator."""
    if _collector is None:
        return fn
    return _collector.builtin(fn)


def iterate(value: Any, /) -> Any:
    """The value a ``for`` loop, a comprehension or an unpacking assignment iterates: ``value`` itself, or
    while collecting, for a tensor, its iterator made as the plain run makes it (``Tensor.unbind`` recorded)."""
    if _collector is None:
        return value
    return _collector.iterate(value)


def iterate_unpacked(value: Any, /) -> Any:
    """As ``iterate``, for a ``for`` target that unpacks each item (``for a, b in t``): while collecting, each
    tensor item is handed on as its iterator, made as the plain run's unpacking makes it."""
    if _collector is None:
        return value
    return _collector.iterate_unpacked(value)


def _binary(name: str, python_op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def shim(a: Any, b: Any, /) -> Any:
        if _collector is None:
            return python_op(a, b)
        return _collector.operator(name, python_op, a, b)

    shim.__name__ = shim.__qualname__ = name
    shim.__doc__ = f"Exactly ``operator.{name}(a, b)``, recorded while collecting."
    return shim


def _unary(name: str, python_op: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def shim(a: Any, /) -> Any:
        if _collector is None:
            return python_op(a)
        return _collector.operator(name, python_op, a)

    shim.__name__ = shim.__qualname__ = name
    shim.__doc__ = f"Exactly ``operator.{name}(a)``, recorded while collecting."
    return shim


# entry name -> shim, one per row of the operator table but the subscript store
OPERATOR_ENTRIES: Dict[str, Callable[..., Any]] = {}
for _row in operators.rows(operators.BINARY, operators.COMPARISON, operators.AUGMENTED):
    OPERATOR_ENTRIES[_row.entry] = globals()[_row.entry] = _binary(_row.entry, getattr(_op, _row.entry))
for _row in operators.rows(operators.UNARY):
    OPERATOR_ENTRIES[_row.entry] = globals()[_row.entry] = _unary(_row.entry, getattr(_op, _row.entry))
del _row


class _Ref:
    """The target of an augmented assignment, loaded once: ``container``, ``key``, current ``value``."""

    __slots__ = ("container", "key", "value", "is_item")

    def __init__(self, container: Any, key: Any, value: Any, is_item: bool) -> None:
        self.container = container
        self.key = key
        self.value = value
        self.is_item = is_item


class _ItemLoader:
    __slots__ = ("container",)

    def __init__(self, container: Any) -> None:
        self.container = container

    def __getitem__(self, key: Any) -> _Ref:
        container = self.container
        return _Ref(container, key, container[key], True)

    def __setitem__(self, key: Any, value: Any) -> None:
        """``item(obj)[k] = v``: the store ``obj[k] = v`` (Python has already evaluated v, obj, k in order)."""
        store(self.container, key, value)


def store(container: Any, key: Any, value: Any, /) -> None:
    """``container[key] = value``, recorded while collecting (``Tensor.__setitem__``)."""
    if _collector is None:
        container[key] = value
    else:
        _collector.operator("setitem", _op.setitem, container, key, value)


def attr(obj: Any, name: str, /) -> _Ref:
    """Load ``obj.name`` for ``obj.name op= value``."""
    return _Ref(obj, name, getattr(obj, name), False)


def item(obj: Any, /) -> _ItemLoader:
    """``item(obj)[k]`` loads ``obj[k]`` for ``obj[k] op= value``, and ``item(obj)[k] = v`` stores; the
    subscript keeps its own syntax."""
    return _ItemLoader(obj)


def aug(ref: _Ref, op_name: str, value: Any, /) -> None:
    """Finish ``target op= value``: the in-place operation, then the store, as Python does."""
    result = OPERATOR_ENTRIES[op_name](ref.value, value)
    if ref.is_item:
        store(ref.container, ref.key, result)  # ``Tensor.__setitem__``, as the plain store records it
    else:
        setattr(ref.container, ref.key, result)
