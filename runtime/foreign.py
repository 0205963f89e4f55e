"""How the runtime looks at objects it did not create: by ``type()`` and identity only.

Library classes override ``__getattribute__``, ``__getattr__``, ``__class__``, ``__eq__``, ``__hash__``,
``__bool__``, ``__len__``, ``__iter__``, ``__format__`` and their metaclasses' versions of these. When such an
override calls a routed function, any ``isinstance``, attribute read, hash, truth test, iteration or
formatting of ours re-enters the runtime, or runs code the program never asked to run (a transformers config
made every model recurse until the stack ran out: ``isinstance`` reads ``__class__`` through the config's
``__getattribute__``). Every helper here reads only what CPython keeps in the object's C struct (``type(x)``,
a bound method's ``__self__``), walks a class's MRO through ``type``'s own descriptors, or calls the base
type's slot directly (``tuple.__iter__(x)``), so no Python code of the object's class or metaclass runs.
"""

from __future__ import annotations

import types

_BUILTIN_METHOD = types.BuiltinMethodType
_METHOD_WRAPPER = types.MethodWrapperType
_METHOD = types.MethodType
_FUNCTION = types.FunctionType
_TYPE_GETATTR = type.__getattribute__
_OBJECT_GETATTR = object.__getattribute__

# the bound methods whose ``__self__`` CPython keeps in the object's C struct (``bound_self``), for a caller that
# tests them inline, at a call that runs for every routed call
BOUND_METHOD_TYPES = (_BUILTIN_METHOD, _METHOD_WRAPPER, _METHOD)

_subclass_cache = {}  # (id(base), id(cls)) -> (cls, bool); keyed by id: a metaclass may define __hash__


def is_subclass(cls, base):
    """``issubclass(cls, base)`` for a class from ``type(obj)`` (``base`` a class or a tuple of them), through
    the MRO that CPython stores, never a metaclass's ``__subclasscheck__`` or ``__hash__``/``__eq__``."""
    if cls is base:
        return True
    key = (id(base), id(cls))
    known = _subclass_cache.get(key)
    if known is not None and known[0] is cls:
        return known[1]
    bases = base if type(base) is tuple else (base,)
    answer = any(klass is b for klass in _TYPE_GETATTR(cls, "__mro__") for b in bases)
    if len(_subclass_cache) > 4096:
        _subclass_cache.clear()
    _subclass_cache[key] = (cls, answer)  # the class is held, so its id is not reused while cached
    return answer


def subclass_test(base):
    """``kind -> issubclass(kind, base)`` for a class from ``type(obj)``, as one C call where that is safe: the
    bound ``__subclasscheck__`` of ``type`` itself on ``base`` (``torch.Tensor``'s metaclass is torch's C
    ``_TensorMeta``, which keeps it), which walks ``kind``'s stored MRO (``PyType_IsSubtype``) and asks ``kind``
    nothing. Where ``base``'s metaclass defines its own, ``is_subclass`` in Python. One bound method looked up
    once, for the tests that run at every routed call (tests/runtime/test_user_code_hazards.py)."""
    for klass in _TYPE_GETATTR(type(base), "__mro__"):
        if klass is type:
            return _TYPE_SUBCLASSCHECK.__get__(base, type(base))
        if "__subclasscheck__" in _TYPE_GETATTR(klass, "__dict__"):
            break
    return lambda kind: is_subclass(kind, base)


_TYPE_SUBCLASSCHECK = _TYPE_GETATTR(type, "__dict__")["__subclasscheck__"]


def defines_before(cls, name, base):
    """Whether a class of ``cls``'s MRO that comes before ``base`` has ``name`` in its own namespace (a tensor
    subclass's own ``__torch_dispatch__``), read from the MRO and class dicts that CPython stores."""
    for klass in _TYPE_GETATTR(cls, "__mro__"):
        if klass is base:
            return False
        if name in _TYPE_GETATTR(klass, "__dict__"):
            return True
    return False


def type_name(cls):
    """``cls.__name__`` without the metaclass's ``__getattribute__``."""
    return _TYPE_GETATTR(cls, "__name__")


def bound_self(fn):
    """The object a bound method (C or Python) is bound to, or None for any other callable; its type is
    looked at first, so a callable object of the user's is never asked for ``__self__``."""
    kind = type(fn)
    if kind is _BUILTIN_METHOD or kind is _METHOD_WRAPPER or kind is _METHOD:
        return fn.__self__
    return None


def method_name(fn):
    """The name of a bound method (as ``bound_self`` accepts), or None."""
    kind = type(fn)
    if kind is _BUILTIN_METHOD or kind is _METHOD_WRAPPER:
        return fn.__name__
    if kind is _METHOD:
        function = fn.__func__
        if type(function) is _FUNCTION:
            return function.__name__
    return None


def class_attribute(cls, name):
    """``name`` as found in the ``__dict__`` of ``cls`` or its bases, without running a descriptor, a
    ``__getattr__`` or a metaclass (``inspect.getattr_static`` for classes); None when absent."""
    for klass in _TYPE_GETATTR(cls, "__mro__"):
        namespace = _TYPE_GETATTR(klass, "__dict__")
        if name in namespace:
            return namespace[name]
    return None


def function_globals(function):
    """A plain function's globals, or None for any other object."""
    if type(function) is _FUNCTION:
        return function.__globals__
    return None


def instance_attribute(obj, name, default=None):
    """An attribute stored in ``obj``'s own ``__dict__`` (``module._parameters``), read through ``object``'s
    lookup, not the class's ``__getattribute__``/``__getattr__``."""
    try:
        return _OBJECT_GETATTR(obj, "__dict__").get(name, default)
    except AttributeError:
        return default


def key_text(key):
    """A mapping key as text for a record's field name: str, int, float and bool as Python writes them,
    any other key by its type's name (its ``__str__``/``__format__`` are the user's)."""
    kind = type(key)
    if kind is str:
        return key
    if kind is int or kind is bool or kind is float:
        return repr(key)
    return f"<{type_name(kind)}>"


def sequence_items(value):
    """The items of a tuple or list (subclasses too: namedtuples, torch's return types) through the base
    type's own iterator, or None for anything else."""
    kind = type(value)
    if kind is tuple or kind is list:
        return value
    if is_subclass(kind, tuple):
        return tuple(tuple.__iter__(value))
    if is_subclass(kind, list):
        return list(list.__iter__(value))
    return None


def mapping_items(value):
    """``(key, value)`` pairs of a dict or dict subclass (``ModelOutput``, ``OrderedDict``) through ``dict``'s
    own ``items``, or None for anything else."""
    kind = type(value)
    if kind is dict or is_subclass(kind, dict):
        return dict.items(value)
    return None


def own_parameters(module):
    """``module.named_parameters(recurse=False)`` read from the module's ``_parameters`` dict: no method of
    the module's class runs. Unset (None) entries and a parameter registered twice are left out, as there."""
    found, seen = [], set()
    parameters = instance_attribute(module, "_parameters")
    items = dict.items(parameters) if type(parameters) is dict else mapping_items(parameters)  # torch's: a dict
    for name, param in items or ():
        if param is not None and id(param) not in seen:
            seen.add(id(param))
            found.append((name, param))
    return found


def children(module):
    """``module.children()``, read from its ``_modules`` dict (unset entries left out)."""
    modules = instance_attribute(module, "_modules")
    items = dict.values(modules) if type(modules) is dict else [child for _, child in mapping_items(modules) or ()]
    return [child for child in items if child is not None]
