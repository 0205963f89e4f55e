"""Our Triton kernels' launches, past the first of each specialisation, straight to the compiled kernel.

Triton's ``JITFunction.run`` binds and specialises every argument, builds a cache key and looks the compiled kernel
up on each launch; with the statistics' one launch a call, that is the largest host cost of the device path
(bench/triton_dispatch.py measures it without a GPU). ``KernelLaunch`` launches a kernel through ``JITFunction.run``
once for each specialisation, keeps the compiled kernel that launch returned under a key at least as fine as
Triton's own, and from then on launches that kernel as ``JITFunction.run`` does, with the same arguments:
``kernel.run(grid, 1, 1, stream, kernel.function, kernel.packed_metadata, None, None, None, *the bound arguments)``.
Inductor's generated launchers call a compiled kernel's ``run`` the same way. Where that ``run`` is Triton's CUDA
launcher and the kernel needs no scratch memory, its C ``launch`` is called instead, with what the launcher's Python
``__call__`` would have given it (``direct_call``).

The key, for Triton's specialisation rules (``native_specialize_impl``): the current device (Triton keeps a cache a
device); the options the run takes from Triton's knobs; the constexpr values; the type of every argument; a tensor's
dtype, and whether its address is a multiple of 16 where its parameter is specialised; whether a specialised int is
1, and whether it is a multiple of 16; and every int within int32 (else Triton's own run: one that needs int64).
tests/runtime/test_triton_launch.py checks, against Triton's binder, that two launches of one key are Triton's one key
too, and that the direct launch passes what ``JITFunction.run`` passes.

Triton's own run serves instead where the kernel is not a ``JITFunction`` (Triton's interpreter, a test's stub), where
a launch hook or a pre-run hook is set (a profiler's: ``knobs.runtime.launch_enter_hook``), for a Triton whose
``run`` this was not checked against (``_CHECKED``), or where ``MSPROBE_TRITON_DIRECT=0``.
"""

from __future__ import annotations

from operator import itemgetter

import torch
import triton
from .switches import switched_on

try:
    from triton import knobs
    from triton.knobs import HookChain
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction
except ImportError:  # a Triton before 3.3 has no knobs: Triton's run at every launch (``_CHECKED``)
    knobs = HookChain = driver = JITFunction = None

# the Triton versions whose JITFunction.run this mirrors (its options from knobs, its launch call): 3.6 and 3.9 read
_CHECKED = ((3, 6), (3, 7), (3, 8), (3, 9))
_I32 = 1 << 31
_TENSORS = (torch.Tensor, torch.nn.Parameter)  # the tensors we launch with: exact types, no subclass


def _version():
    try:
        return tuple(int(part) for part in triton.__version__.split(".")[:2])
    except ValueError:
        return (0, 0)


_DIRECT = knobs is not None and _version() in _CHECKED and switched_on("MSPROBE_TRITON_DIRECT")


# the options JITFunction.run reads from Triton's knobs at each launch (part of its key): (knobs object, attribute)
KNOB_OPTIONS = tuple(
    (space, name)
    for space, name in (
        (getattr(knobs, "runtime", None), "debug"),
        (getattr(knobs, "compilation", None), "instrumentation_mode"),
        (getattr(knobs, "compilation", None), "fpsan_homomorphic_casts"),  # Triton 3.9
    )
    if knobs is not None and hasattr(space, name)
)


def knob_options():
    """The values of ``KNOB_OPTIONS`` now."""
    return tuple([getattr(space, name) for space, name in KNOB_OPTIONS])


# Triton's CUDA launcher (``CompiledKernel.run``), whose ``__call__`` runs Python at every launch before its C
# ``launch``: where a kernel needs no scratch memory, all it adds is fixed per kernel, so a launch can call ``launch``
# itself (``direct_call``), in the form of the Triton versions read here. tests/runtime/test_triton_launch.py checks,
# through the fake driver's launcher (Triton's own class, its C launch a recorder), that ``launch`` receives what
# ``__call__`` gives it.
_LAUNCHER_FORMS = {(3, 6): "3.6", (3, 9): "3.9"}
try:
    from triton.backends.nvidia.driver import CudaLauncher
except Exception:  # no CUDA backend in this Triton: its launcher's ``__call__`` at every launch
    CudaLauncher = None


def direct_call(compiled):
    """How a direct launch calls ``compiled``, a kernel ``JITFunction.run`` returned: ``(callee, head, packed)``,
    for ``callee(grid, 1, 1, stream, *head, *arguments)``, or with ``packed`` ``callee(grid, 1, 1, stream, *head,
    arguments)``. Its ``run`` as ``JITFunction.run`` calls it, but for Triton's CUDA launcher of a version read here
    with no scratch memory (nor Triton's global sanitizer), whose C ``launch`` it calls with what its ``__call__``
    would pass: the launcher's ``__call__`` is Python at each launch."""
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    plain = (run, (function, metadata, None, None, None), False)
    form = _LAUNCHER_FORMS.get(_version())
    if form is None or CudaLauncher is None or type(run) is not CudaLauncher:
        return plain
    try:
        if run.global_scratch_size != 0 or run.profile_scratch_size != 0 or getattr(run, "gsan_enabled", False):
            return plain
        launch, cooperative, pdl = run.launch, run.launch_cooperative_grid, run.launch_pdl
        if form == "3.6":  # launch(grid, stream, function, cooperative, pdl, scratch, profile scratch, *its args)
            return (launch, (function, cooperative, pdl, None, None, metadata, None, None, None), False)
        # 3.9: launch(grid, stream, function, cooperative, pdl, metadata, launch metadata, hooks, scratches,
        # annotations, signature, the arguments as a tuple)
        hooks_and_scratch = (None, None, None, None, None)  # launch metadata, enter and exit hooks, two scratches
        head = (function, cooperative, pdl, metadata, *hooks_and_scratch, run.arg_annotations, run.kernel_signature)
        return (launch, head, True)
    except AttributeError:  # a launcher of another make: its own __call__
        return plain


def direct_on():
    """Whether launches go straight to compiled kernels (this Triton was checked, ``MSPROBE_TRITON_DIRECT`` on)."""
    return _DIRECT


def current_device():
    """The device Triton launches on now (its kernels are cached per device)."""
    return driver.active.get_current_device()


class _Plan:
    """How to key the launches of one kernel with arguments of these types and these constexpr names, and the
    arguments ``kernel.run`` takes after the positional ones (the constexprs and defaults, in parameter order)."""

    __slots__ = ("tensors", "aligned", "ints", "special", "tail_names", "defaults", "places")

    def __init__(self, kernel, types, names):
        params = kernel.params
        if len(types) > len(params):
            raise TypeError("more arguments than parameters")
        self.tensors, self.aligned, self.ints, self.special = [], [], [], []
        for k, kind in enumerate(types):
            param = params[k]
            if param.is_constexpr:
                raise TypeError(f"{param.name}: a constexpr given by position")
            if kind in _TENSORS:
                self.tensors.append(k)
                if not param.do_not_specialize and not param.do_not_specialize_on_alignment:
                    self.aligned.append(k)
            elif kind is int:
                self.ints.append(k)
                if not param.do_not_specialize:
                    self.special.append(k)
            elif kind is not float:
                raise TypeError(f"{param.name}: {kind.__name__}")
        self.places = tuple(self.tensors)  # the tensors' positions (``addresses``)
        self.tensors, self.aligned, self.ints, self.special = (
            _getter(self.tensors),
            _getter(self.aligned),
            _getter(self.ints),
            _getter(self.special),
        )
        by_name = {param.name: param for param in params}
        for name in names:
            if name not in by_name or by_name[name].num < len(types):
                raise TypeError(f"{name}: not a parameter after the positional ones")
        self.tail_names = [param.name for param in params[len(types) :]]
        defaults = {}
        for param in params[len(types) :]:
            default = param._param.default
            if param.name not in names:
                if default is param._param.empty:
                    raise TypeError(f"{param.name}: not given")
                defaults[param.name] = default
        self.defaults = defaults

    def key(self, args):
        """The part of the key that ``args`` decide; None where an int needs more than int32."""
        if self.ints:
            ints = self.ints(args)
            if max(ints) >= _I32 or min(ints) < -_I32:
                return None
        key = [t.dtype for t in self.tensors(args)] if self.tensors else []
        if self.aligned:
            key += [t.data_ptr() & 15 == 0 for t in self.aligned(args)]
        if self.special:
            key += [(v == 1, v & 15 == 0) for v in self.special(args)]
        return tuple(key)

    def addresses(self, args):
        """``args`` with each tensor given by its address: Triton's launcher takes an int for a pointer as it is,
        where a tensor costs it a call of its ``data_ptr()`` and a ``cuPointerGetAttribute`` check each
        (tests/runtime/test_triton_launch.py counts them with the fake driver)."""
        args = list(args)
        for k in self.places:
            args[k] = args[k].data_ptr()
        return args

    def tail(self, names, constants):
        given = dict(zip(names, constants))
        return tuple(given[name] if name in given else self.defaults[name] for name in self.tail_names)


class KernelLaunch:
    """The launches of the kernel named ``name`` in ``namespace`` (looked up at each launch, so that a test's stub or
    a reloaded module is the one launched), with constexprs ``names`` (their values given at each launch) and Triton
    ``options`` (``enable_fp_fusion``...). ``launch(grid, args, constants)``: ``kernel[(grid,)](*args, **dict(zip(names,
    constants)), **options)``, in effect."""

    def __init__(self, namespace, name, names=(), **options):
        self._namespace = namespace
        self._name = name
        self._names = tuple(names)
        self._options = options
        self._kernel = None
        self._plans: dict = {}  # argument types -> _Plan, or None where this kernel takes them through Triton's run
        self._last = (None, None)  # the last launch's argument types and their plan: one tuple, read at once
        self._compiled: dict = {}  # key -> what ``__call__`` returns
        self.direct = 0  # launches made straight to a compiled kernel (tests, benches)

    def __call__(self, grid, args, constants=()):
        """Launch ``grid`` programs. Returns ``(compiled kernel, the arguments after the positional ones, whether its
        key is the tensors' dtypes and addresses' alignment only, how a launch calls it: ``direct_call``)`` where the
        launch went straight to it or kept it for the next, else None (Triton's run, nothing kept)."""
        kernel = self._namespace[self._name]
        if kernel is not self._kernel:  # another kernel under the name (a stub, a reload): what was kept is not its
            self._kernel = kernel
            self._plans.clear()
            self._compiled.clear()
            self._last = (None, None)
        key = self._key(kernel, args, constants) if _DIRECT and type(kernel) is JITFunction else None
        if key is None:
            kernel[(grid,)](*args, **dict(zip(self._names, constants)), **self._options)
            return None
        kept = self._compiled.get(key)
        if kept is None:  # the first launch of this specialisation: Triton's run, which compiles it where needed
            compiled = kernel[(grid,)](*args, **dict(zip(self._names, constants)), **self._options)
            if _launchable(compiled):
                plan = key[3]  # this launch's, whatever another thread's launch has made the last since
                call = direct_call(compiled)
                kept = (compiled, plan.tail(self._names, constants), plan.special is None, call)
                self._compiled[key] = kept
            return kept
        _, tail, _, (callee, head, packed) = kept
        stream = driver.active.get_current_stream(key[0])
        # JITFunction.run's launch, with no metadata and no hooks where no hook is set (``_key``)
        args = key[3].addresses(args)  # the tensors by their addresses (``_Plan.addresses``)
        if packed:
            callee(grid, 1, 1, stream, *head, (*args, *tail))
        else:
            callee(grid, 1, 1, stream, *head, *args, *tail)
        self.direct += 1
        return kept

    def _key(self, kernel, args, constants):
        """The key of this launch, at least as fine as Triton's; None where Triton's run must serve it (a hook set,
        an argument this cannot key)."""
        runtime = knobs.runtime
        if not _unhooked(runtime.launch_enter_hook) or not _unhooked(runtime.launch_exit_hook) or kernel.pre_run_hooks:
            return None
        types = tuple(map(type, args))
        last = self._last
        if types == last[0]:  # the common case: the types of the last launch
            plan = last[1]
        else:
            plan = self._plans.get(types, False)
            if plan is False:
                plan = self._plans[types] = self._make_plan(kernel, types)
            self._last = (types, plan)
        if plan is None:
            return None
        part = plan.key(args)
        if part is None:
            return None
        return (driver.active.get_current_device(), knob_options(), constants, plan, part)

    def _make_plan(self, kernel, types):
        try:
            return _Plan(kernel, types, self._names)
        except (TypeError, AttributeError):  # an argument it cannot key (Triton's run serves it)
            return None


def _getter(positions):
    """A function of the arguments giving those at ``positions``, as a tuple; None where there are none."""
    if not positions:
        return None
    if len(positions) == 1:
        k = positions[0]
        return lambda args: (args[k],)
    return itemgetter(*positions)


def _unhooked(hook):
    """Whether a launch hook of Triton's knobs calls nothing: None, or a chain of no hooks (Triton 3.6's default),
    which the launcher would call with metadata for nothing."""
    return hook is None or type(hook) is HookChain and not hook.calls


def _launchable(compiled):
    """Whether what ``JITFunction.run`` returned is a compiled kernel this module can launch as it did."""
    try:
        return callable(compiled.run) and hasattr(compiled, "packed_metadata") and hasattr(compiled, "function")
    except Exception:  # an object of another Triton, whose handles failed to load: its run serves
        return False
