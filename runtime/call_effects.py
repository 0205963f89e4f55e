"""Which recorded calls leave their tensor inputs as they found them.

Where the Triton kernels read a device's tensors (``triton_stats``), a call that cannot change its inputs has them
read after it, in one launch with its output: one launch per recorded call where there were two (issue 31;
tests/runtime/test_triton_stats.py, tests/runtime/test_call_effects.py). They still hold the values they had at the
call, which is what msprobe's pre-hook reads. A call may change its inputs when it is in place by name (``add_``,
``__iadd__``, ``__setitem__``), writes an ``out=`` tensor, has an ``inplace`` switch (torch.nn.functional's
activations and dropouts), updates running statistics (the batch and instance norms), renormalises its weight
(``embedding``'s ``max_norm``), runs other recorded code (``backward``), or is not one of torch's own functions
(NPU, distributed, MindSpeed, compiled code, a name in torch's namespaces that torch does not have): those have
their inputs read before the call, as every call did before.

torch bumps a tensor's version counter at every in-place write made through its dispatcher, so a call that changes a
deferred input anyway is caught when the launch is made (``TritonStats``): that input's statistics are null, never
the values after the call, and ``learn`` keeps the API's inputs read before it for the rest of the run. A write that
bypasses the dispatcher (an extension's kernel writing through a pointer) moves no counter: that is why only torch's
own functions are read after.
"""

from __future__ import annotations

# torch's own namespaces: NPU, distributed and MindSpeed calls, custom entries and compiled code keep reading first
_FAMILIES = ("Torch.", "Tensor.", "Functional.")
# in place by what they do rather than by name: running statistics, an observer's state, hooks that record
_MUTATING_PARTS = ("batch_norm", "instance_norm", "fake_quant", "backward", "setitem", "delitem")
# functional -> position of ``max_norm``: a weight renormalised in place when it is given
_RENORM = {"Functional.embedding": 3, "Functional.embedding_bag": 3}
_ANY_ARGUMENTS = 0x04 | 0x08  # CO_VARARGS | CO_VARKEYWORDS


class CallEffects:
    """The answer per API name, learned once (``_decide``), and the APIs seen changing an input anyway."""

    __slots__ = ("_known", "mutating")

    def __init__(self):
        self._known = {}  # API name -> None (never deferred) or the position of its ``inplace`` switch (-1: none)
        self.mutating = set()

    def reads_inputs_after(self, api_name, args, kwargs):
        """Whether this call of ``api_name`` (with ``args`` as recorded, a Tensor method's tensor first, and the
        ``kwargs`` dict Python packed for the call) may have its inputs read after it runs. Only the lengths
        and keys of ``args`` and ``kwargs`` are read, and a keyword's value compared by identity."""
        known = self._known.get(api_name, False)
        if known is False:
            known = self._known[api_name] = _decide(api_name)
        if known is None:
            return False
        if kwargs:
            if "out" in kwargs:
                return False
            if "inplace" in kwargs:
                value = kwargs["inplace"]
                if value is not False and value is not None:
                    return False
            renorm = _RENORM.get(api_name)
            if renorm is not None and kwargs.get("max_norm") is not None:
                return False
        if known >= 0 and len(args) > known:  # the switch given by position: read first, whatever its value
            return False
        renorm = _RENORM.get(api_name)
        return renorm is None or len(args) <= renorm

    def learn(self, api_name):
        """``api_name`` changed an input it was thought to leave alone: its inputs are read first from now on."""
        self.mutating.add(api_name)
        self._known[api_name] = None


def _decide(api_name):
    """None where no call of ``api_name`` is deferred; else the position of its ``inplace`` argument, or -1."""
    if not api_name.startswith(_FAMILIES):
        return None
    method = api_name[api_name.index(".") + 1 :]
    if method.startswith("__"):
        if method.startswith("__i") or not method.endswith("__"):  # __iadd__ and the other augmented forms
            return None
    elif method.endswith("_"):
        return None
    if any(part in method for part in _MUTATING_PARTS):
        return None
    if api_name.startswith("Functional."):
        return _inplace_position(method)
    # a name a user's catalogue gave a function of its own (``custom``) is not torch's: nothing known of it
    return -1 if _torch_attribute(api_name.startswith("Tensor."), method) is not None else None


def _torch_attribute(of_tensor, dotted):
    """torch's (or torch.Tensor's) attribute ``dotted`` (``linalg.norm``), or None where torch has none."""
    import torch

    found = torch.Tensor if of_tensor else torch
    for part in dotted.split("."):
        found = getattr(found, part, None)
        if found is None:
            return None
    return found


def _inplace_position(name):
    """The position of ``inplace`` among torch.nn.functional.``name``'s parameters (-1: it has none); None where
    the name is not one of its Python functions or C builtins (nothing known of it)."""
    import torch.nn.functional as functional

    fn = getattr(functional, name, None)
    if fn is None:
        return None
    code = getattr(fn, "__code__", None)
    if code is None:  # a C builtin of torch (conv2d, avg_pool2d): no inplace switch
        return -1 if type(fn).__name__ == "builtin_function_or_method" else None
    if code.co_flags & _ANY_ARGUMENTS:  # a wrapper's (*args, **kwargs): where its switch is is not known
        return None
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return names.index("inplace") if "inplace" in names else -1
