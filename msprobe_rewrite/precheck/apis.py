"""Dump names to callables, and the calls that cannot be replayed as they are.

A dump name (``Functional.gelu``, ``Tensor.__mul__``, ``Torch.matmul``, ``Megatron.bias_gelu_impl``) is
looked up in the same catalogue the collector named it from (``msprobe_runtime.catalogue``), so a user's own
``--catalogue`` file names the same APIs here. ``Tensor.*`` names are called unbound, with the tensor as the
first argument, which is how the collector recorded them. Imports no torch until a callable is resolved.
"""

from __future__ import annotations

import importlib
from typing import Dict, Iterable, Optional, Tuple

from msprobe_runtime import operators

from .errors import Unreplayable

# Their results depend on the generator state, which a dump does not hold. Dropout is replayed from the
# dumped output instead (``replay.dropout``); the rest are reported.
RANDOM = frozenset(
    {
        "alpha_dropout",
        "feature_alpha_dropout",
        "bernoulli",
        "bernoulli_",
        "multinomial",
        "normal",
        "normal_",
        "rand",
        "rand_like",
        "randint",
        "randint_like",
        "randn",
        "randn_like",
        "randperm",
        "rrelu",
        "rrelu_",
        "poisson",
        "uniform_",
        "random_",
        "exponential_",
        "geometric_",
        "cauchy_",
        "log_normal_",
        "gumbel_softmax",
        "fractional_max_pool2d",
        "fractional_max_pool3d",
        "fractional_max_pool2d_with_indices",
        "fractional_max_pool3d_with_indices",
        "native_dropout",
        "_fused_dropout",
        "alpha_dropout_",
        "feature_alpha_dropout_",
    }
)
DROPOUT = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "feature_dropout", "dropout_"})
# augmented assignments and the subscript store, from the one operator table
INPLACE_DUNDERS = frozenset(row.dunder for row in operators.TABLE if row.kind in ("augmented", "store"))
COMMUNICATION_PREFIXES = ("Distributed.",)


def base_name(api: str) -> str:
    """``Functional.gelu`` -> ``gelu``; ``Megatron.bias_gelu_impl`` -> ``bias_gelu_impl``."""
    return api.rsplit(".", 1)[-1]


def is_inplace(api: str, kwargs: dict) -> bool:
    name = base_name(api)
    if name in INPLACE_DUNDERS or (name.endswith("_") and not name.endswith("__")):
        return True
    return kwargs.get("inplace") is True or kwargs.get("out") is not None


def load_table(extra_files: Iterable[str] = ()) -> Dict[str, str]:
    """Dump name -> qualified name, from the shipped catalogue and ``extra_files`` (the first qualified name
    of a dump name wins, as the collector's identity table keeps torch's name over an alias)."""
    from msprobe_runtime.catalogue import load_catalogue

    table: Dict[str, str] = {}
    for qualname, dump_name in load_catalogue(list(extra_files)).by_qualname.items():
        table.setdefault(dump_name, qualname)
    return table


def resolve(api: str, table: Dict[str, str]) -> Tuple[object, str]:
    """``(callable, qualified name)`` of a dump name, or Unreplayable saying why not."""
    if api.startswith(COMMUNICATION_PREFIXES):
        raise Unreplayable(
            "communication op: its result needs the other ranks' data, which one rank's dump does not hold"
        )
    qualname = table.get(api)
    if qualname is None:
        raise Unreplayable(
            f"the catalogue does not know API {api!r}; pass the catalogue that named it with --catalogue FILE",
            input_problem=True,
        )
    obj = _lookup(qualname)
    if obj is None:
        root = qualname.split(".")[0]
        if root == "torch":
            where = "this CPU build of torch"
        elif root in ("torch_npu", "mindspeed"):
            where = f"this CPU build ({root}, the accelerator's operator library, is not installed here)"
        else:
            where = f"this environment ({root} is not importable)"
        raise Unreplayable(f"{qualname} is missing from {where}")
    return obj, qualname


def _lookup(qualname: str) -> Optional[object]:
    parts = qualname.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:  # a missing optional package, or one that fails to import on this machine
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj if callable(obj) else None
    return None
