"""Compiled callables met at run time: told apart by type and code identity, and named for their boundary entry.

A call into code that ``torch.compile`` compiled is recorded as one entry at its boundary, with its inputs and
outputs; nothing inside it is (the shims there are traced as plain calls: ``compiled_regions``). Three shapes:

- a compiled function or method: ``torch.compile(fn)``, ``@torch.compile``, megatron's ``@jit_fuser``: a plain
  function whose code is Dynamo's ``compile_wrapper``, the original in its ``__wrapped__``;
- a compiled module, ``torch.compile(module)``: an ``OptimizedModule``, the original in ``_orig_mod``;
- a module compiled in place, ``module.compile()``: its ``_compiled_call_impl`` is such a function.

Only what CPython keeps for a plain function (its code, its ``__dict__``) and torch's own dicts of a module are
read: no attribute lookup runs code of the user's (``foreign``).
"""

from __future__ import annotations

import sys
import types

from .foreign import type_name

COMPILED_PREFIX = "Compiled"  # the dump name of a compiled callable the catalogue does not name
WRAPPER_NAME = "compile_wrapper"  # the name of the function torch.compile returns for a function

_FUNCTION = types.FunctionType
_METHOD = types.MethodType
_OBJECT_GETATTR = object.__getattribute__
_FUNCTION_DICT = _FUNCTION.__dict__["__dict__"].__get__  # a plain function's own __dict__, no lookup


class CompiledCallables:
    """What Dynamo's wrappers look like in this process, read from ``torch._dynamo.eval_frame`` once it is loaded
    (before that, nothing can be compiled)."""

    def __init__(self):
        self.wrapper_code = None  # the code of every ``torch.compile`` wrapper function
        self.optimized_module = None  # torch._dynamo.eval_frame.OptimizedModule
        self.refresh()

    def refresh(self):
        """Look for Dynamo again (``start()``): it may have been loaded since."""
        if self.wrapper_code is not None:
            return
        eval_frame = sys.modules.get("torch._dynamo.eval_frame")
        if eval_frame is None:
            return
        context = getattr(eval_frame, "_TorchDynamoContext", None)
        call = getattr(context, "__call__", None) if context is not None else None
        code = getattr(call, "__code__", None)
        for const in getattr(code, "co_consts", ()):
            if type(const) is types.CodeType and const.co_name == WRAPPER_NAME:
                self.wrapper_code = const
        self.optimized_module = optimized_module_class()

    def function(self, fn):
        """The original function of a compiled function or bound method ``fn``, or None."""
        code = self.wrapper_code
        if code is None:
            self.refresh()  # Dynamo loaded since start(): a library compiling at its first call
            code = self.wrapper_code
            if code is None:
                return None
        kind = type(fn)
        if kind is _METHOD:
            fn = fn.__func__
            kind = type(fn)
        if kind is not _FUNCTION or fn.__code__ is not code:
            return None
        return _FUNCTION_DICT(fn).get("__wrapped__", fn)

    def is_optimized_module(self, cls):
        return cls is self.optimized_module and cls is not None


def optimized_module_class():
    """torch's ``OptimizedModule`` (what ``torch.compile(module)`` returns), or None while Dynamo is not loaded:
    then nothing is compiled."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", None) if eval_frame is not None else None


def original_module(module):
    """An ``OptimizedModule``'s original module (torch keeps it in ``_modules``), or None."""
    try:
        return _OBJECT_GETATTR(module, "__dict__")["_modules"].get("_orig_mod")
    except (AttributeError, KeyError, TypeError):
        return None


def unwrapped(module):
    """The module ``torch.compile(module)`` compiled, or ``module`` itself."""
    optimized = optimized_module_class()
    if optimized is None or type(module) is not optimized:
        return module
    original = original_module(module)
    return original if original is not None else module


def named_as_eager(root):
    """``root.named_modules()``, each path without the ``_orig_mod`` level that ``torch.compile(child)`` adds, so
    that a compiled run names its modules and parameters as an eager run of the same model does."""
    optimized = optimized_module_class()
    wrappers = set()
    for path, module in root.named_modules():
        if optimized is not None and type(module) is optimized:
            wrappers.add(path)
        if wrappers and "_orig_mod" in path:
            parts = path.split(".")
            path = ".".join(
                part for i, part in enumerate(parts) if not (part == "_orig_mod" and ".".join(parts[:i]) in wrappers)
            )
        yield path, module


def compiled_in_place(module):
    """Whether ``module.compile()`` was called: its calls run a compiled ``_call_impl``."""
    try:
        return _OBJECT_GETATTR(module, "__dict__").get("_compiled_call_impl") is not None
    except (AttributeError, TypeError):
        return False


def function_name(function, identity):
    """The dump name of a compiled function's boundary: the catalogue's name for the original (or for the wrapper),
    else ``Compiled.{qualified name}``, its dots made underscores so the name keeps msprobe's grammar."""
    name = identity.get(id(function))
    if name is not None:
        return name
    if type(function) is not _FUNCTION:
        return f"{COMPILED_PREFIX}.{type_name(type(function))}"
    qualname = function.__qualname__.replace(".<locals>", "").replace("<", "").replace(">", "")
    return f"{COMPILED_PREFIX}.{qualname.replace('.', '_')}"


def module_name(module):
    """The dump name of a compiled module's boundary as an API entry: ``Compiled.{class of the original}``."""
    return f"{COMPILED_PREFIX}.{type_name(type(module))}"
