"""What ``torch.compile`` sees of the runtime: every entry point traced as the plain operation it forwards to.

Inside a region Dynamo traces, a routed call must become exactly the call the original program made: no record,
no graph break, and no guard on the runtime's state (a guard on ``shims._collector`` would recompile every
compiled function at each ``start()`` and ``stop()``, and megatron's ``jit_fuser`` functions reach their limit of
recompilations within a few steps, then run eagerly, with other numerics). Each entry is registered with
``torch.compiler.substitute_in_graph``: Dynamo then traces the polyfill below in its place, and guards only on
the entry's identity, which never changes (``shims``).

Registration needs ``torch._dynamo``, whose import loads torch's compiler stack, so it is never imported here: the
polyfills are registered at the runtime's import where Dynamo is loaded already, else as Dynamo's own import
ends (``_WhenDynamoLoads``), and again at every ``start()``, ``stop()`` and ``step()`` (``register_if_loaded``),
which also keeps Dynamo from compiling the frames of the runtime's modules loaded since. Nothing can have been
compiled before Dynamo was loaded. Where another finder took Dynamo's import before ours saw it, a function
compiled before the next of these calls is traced through the shim itself, which reads ``_collector`` (a guard
on its value): it compiles once more at most, when that value changes; the collector's own entries return the
plain call while Dynamo traces them, so nothing is recorded and no graph breaks (tests/compile/test_unregistered.py).
"""

from __future__ import annotations

import importlib.util
import operator
import sys
import types

from . import operators, shims

_tried = []  # one item once registration was tried in this process (with Dynamo loaded)
POLYFILLED = []  # one item once the polyfills are registered: Dynamo traces no shim nor collector code from then


def _plain_call(api_name, fn, /, *args, **kwargs):
    return fn(*args, **kwargs)


def _plain_dyn(fn, /, *args, **kwargs):
    return fn(*args, **kwargs)


def _plain_truth(value, /):
    return bool(value)


def _plain_iterate(value, /):
    return value


def _plain_builtin(fn, /):
    return fn


def _plain_store(container, key, value, /):
    container[key] = value


def _plain_aug(ref, op_name, value, /):
    result = getattr(operator, op_name)(ref.value, value)
    if ref.is_item:
        ref.container[ref.key] = result
    else:
        setattr(ref.container, ref.key, result)


def _plain_binary(name):
    python_op = getattr(operator, name)

    def plain(a, b, /):
        return python_op(a, b)

    plain.__name__ = plain.__qualname__ = f"plain_{name}"
    return plain


def _plain_unary(name):
    python_op = getattr(operator, name)

    def plain(a, /):
        return python_op(a)

    plain.__name__ = plain.__qualname__ = f"plain_{name}"
    return plain


def polyfills():
    """``[(entry, what Dynamo traces in its place)]`` for every entry point that reads the collector."""
    pairs = [
        (shims.call, _plain_call),
        (shims.dyn, _plain_dyn),
        (shims.truth, _plain_truth),
        (shims.iterate, _plain_iterate),
        (shims.builtin, _plain_builtin),
        (shims.iterate_unpacked, _plain_iterate),
        (shims.store, _plain_store),
        (shims.aug, _plain_aug),
    ]
    for row in operators.rows(operators.BINARY, operators.COMPARISON, operators.AUGMENTED):
        pairs.append((shims.OPERATOR_ENTRIES[row.entry], _plain_binary(row.entry)))
    for row in operators.rows(operators.UNARY):
        pairs.append((shims.OPERATOR_ENTRIES[row.entry], _plain_unary(row.entry)))
    return pairs


class _WhenDynamoLoads:
    """A finder on ``sys.meta_path`` that answers no import but ``torch._dynamo``'s, which it lets the other finders
    find, and then registers once that module has run (a post-import hook, as wrapt's). The runtime is imported
    before Dynamo in a rewritten package (megatron's own modules load it, at ``import megatron.core.jit``): with no
    debugger ever started, nothing else would register, and a rewritten program would not compile as the
    original. It takes itself off the path at its first answer."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch._dynamo":
            return None
        _forget_watcher(self)
        try:
            spec = importlib.util.find_spec(fullname)
        except (ImportError, ValueError):
            return None
        loader = getattr(spec, "loader", None) if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        spec.loader = _RegisteringLoader(loader)
        return spec

    def invalidate_caches(self):
        pass


class _RegisteringLoader:
    """``torch._dynamo``'s loader, which registers the runtime once the module has run."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:  # the module keeps its own loader: no trace of ours
            spec.loader = self.loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        try:
            register_if_loaded()
        except Exception as error:  # never into the program's import of torch
            import logging

            logging.getLogger("msprobe_runtime").warning(
                "msprobe_runtime: registering with torch.compile failed (%s: %s); compiled code that reaches "
                "the runtime may break its graph there",
                type(error).__name__,
                error,
            )

    def __getattr__(self, name):  # get_code, get_source, is_package, ... of the real loader
        return getattr(self.loader, name)


def _forget_watcher(watcher):
    try:
        sys.meta_path.remove(watcher)
    except ValueError:
        pass


def register_when_loaded():
    """Register now if Dynamo is loaded, else as soon as it is (``_WhenDynamoLoads``); at the runtime's import."""
    if register_if_loaded():
        return
    if "torch._dynamo" in sys.modules or any(type(finder) is _WhenDynamoLoads for finder in sys.meta_path):
        return
    sys.meta_path.insert(0, _WhenDynamoLoads())


def register_if_loaded():
    """Once Dynamo is loaded (never importing it): register the polyfills, and keep Dynamo from compiling a frame
    of the runtime's own (``_skip_runtime_frames``); whether the polyfills are registered. Cheap when nothing
    changed: it runs at every ``start()``, ``stop()`` and ``step()``."""
    if "torch._dynamo" not in sys.modules:
        return False
    if not _tried:
        _register_polyfills()
    modules = len(sys.modules)
    if modules != _modules_seen[0]:
        _modules_seen[0] = modules
        _skip_runtime_frames()
    return bool(POLYFILLED)


def _register_polyfills():
    compiler = sys.modules.get("torch.compiler")
    substitute = getattr(compiler, "substitute_in_graph", None) if compiler is not None else None
    _tried.append(True)
    if substitute is None:  # torch before 2.5: Dynamo traces the shims themselves
        return
    for entry, plain in polyfills():
        try:
            substitute(entry, skip_signature_check=True)(plain)
        except ValueError:  # registered already (a second copy of this module, reloaded by a test)
            pass
    POLYFILLED.append(True)


_modules_seen = [0]  # len(sys.modules) when the runtime's modules were last looked for
_skipped = set()  # the runtime's modules whose code Dynamo is told to skip


def _skip_runtime_frames():
    """Tell Dynamo never to compile a frame of the runtime's own code, while still compiling the frames it calls.

    Past a graph break inside a routed call, Dynamo runs the entry (``dyn``) as a frame of its own and would
    compile that frame: one code object for every call site and every callee, so that its guards on the callee
    (``fn``'s type) recompile it until Dynamo's limit, and the call falls back to eager with other numerics (the
    tiny megatron GPT under ``torch.compile(model)``). Skipped, the callee's frame is the one Dynamo compiles,
    as in the original program. The same holds for the collector's code that a routed call runs meanwhile.
    Each module once, when it is loaded (the runtime imports torch-side modules at ``start()``)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    skip_code = getattr(eval_frame, "skip_code", None) if eval_frame is not None else None
    if skip_code is None:
        return
    package = __name__.rpartition(".")[0]
    for name in list(sys.modules):
        if name in _skipped or not (name == package or name.startswith(package + ".")):
            continue
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path is None:
            continue
        _skipped.add(name)
        for code in _codes_of(module, path):
            skip_code(code)


def _codes_of(module, path):
    """Every code object defined in ``module``'s file: its functions, its classes' methods, the functions these
    define (closures), read from the module's and the classes' dicts."""
    found, seen = [], set()

    def add(code):
        if type(code) is types.CodeType and code.co_filename == path and id(code) not in seen:
            seen.add(id(code))
            found.append(code)
            for const in code.co_consts:
                add(const)

    def add_value(value):
        function = getattr(value, "__func__", value)  # staticmethod, classmethod
        code = getattr(function, "__code__", None) if type(function) is types.FunctionType else None
        if code is not None:
            add(code)
        elif type(value) is property:
            for accessor in (value.fget, value.fset, value.fdel):
                if type(accessor) is types.FunctionType:
                    add(accessor.__code__)

    for value in list(vars(module).values()):
        if isinstance(value, type):
            if value.__module__ == module.__name__:
                for member in list(vars(value).values()):
                    add_value(member)
        else:
            add_value(value)
    return found
