"""Dump records back into Python values: tensors read from their ``.pt`` files, the rest from the record.

Record shapes are msprobe's (msprobe-facts.md): ``{"type": "torch.Tensor", "dtype", "shape", ...,
"data_name"}``, ``{"type": "int", "value": 3}``, ``slice``, ``ellipsis``, ``torch.Size``, ``torch.dtype``,
``torch.device``, ``torch.memory_format``, lists for sequences, plain dicts for mappings, and null for None.
A tensor is read only when its entry is replayed (the worker), so memory holds one call's tensors at a time.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any, Callable, List

import torch

from .errors import Unreplayable
from .records import is_tensor_record

_DTYPES = {
    str(getattr(torch, name)): getattr(torch, name)
    for name in dir(torch)
    if isinstance(getattr(torch, name, None), torch.dtype)
}


def dtype_of(name: Any):
    return _DTYPES.get(name) if isinstance(name, str) else None


def load_tensor(record: dict, tensor_dir: str) -> torch.Tensor:
    """The tensor a record names, on the CPU; Unreplayable (an input problem) when its file is missing or bad."""
    data_name = record.get("data_name")
    if not isinstance(data_name, str):
        shape = record.get("shape")
        dtype = dtype_of(record.get("dtype"))
        if isinstance(shape, list) and 0 in shape and dtype is not None:
            return torch.empty(shape, dtype=dtype)  # an empty tensor has no data to save
        raise Unreplayable(
            "a tensor of this entry was not saved (statistics only); re-collect with task 'tensor'", input_problem=True
        )
    path = os.path.join(tensor_dir, os.path.basename(data_name))
    if not os.path.isfile(path):
        raise Unreplayable(f"missing tensor file {path}", input_problem=True)
    try:
        # mmap: the file's pages are read once, by the first use (the cast to float64), not copied first
        value = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile, Exception) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise Unreplayable(
            f"cannot read tensor file {path}: truncated or not a torch.save file ({first})", input_problem=True
        ) from None
    if not isinstance(value, torch.Tensor):
        raise Unreplayable(f"tensor file {path} holds a {type(value).__name__}, not a tensor", input_problem=True)
    return value


def rebuild(record: Any, tensor: Callable[[dict], Any], depth: int = 0) -> Any:
    """The value of ``record``; each tensor record becomes ``tensor(record)``."""
    if depth > 32:
        raise Unreplayable("arguments nested deeper than 32 levels")
    if record is None:
        return None
    if isinstance(record, list):
        return [rebuild(item, tensor, depth + 1) for item in record]
    if not isinstance(record, dict):
        return record
    if is_tensor_record(record):
        return tensor(record)
    kind = record.get("type")
    if kind is None:
        return {key: rebuild(item, tensor, depth + 1) for key, item in record.items()}
    value = record.get("value")
    if kind in ("int", "float", "bool", "str"):
        return value
    if kind == "slice":
        return slice(*(value if isinstance(value, list) else [None, None, None]))
    if kind == "ellipsis":
        return Ellipsis
    if kind == "torch.Size":
        return torch.Size(value)
    if kind == "torch.dtype":
        found = dtype_of(value)
        if found is None:
            raise Unreplayable(f"unknown dtype {value!r} in the arguments")
        return found
    if kind == "torch.device":
        return torch.device("cpu")  # the replay runs on the CPU whatever device the call named
    if kind == "torch.memory_format":
        return getattr(torch, str(record.get("format", "")).rsplit(".", 1)[-1], torch.preserve_format)
    if "value" in record:  # an IntEnum or str subclass, recorded as its base value
        return value
    raise Unreplayable(f"cannot rebuild an argument of type {kind!r}")


def flat_values(value: Any, out: List[Any], depth: int = 0) -> List[Any]:
    """Tensors of a call's result in the same order as ``flat_records`` walks its record."""
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)) and depth < 32:
        for item in value:
            flat_values(item, out, depth + 1)
    elif isinstance(value, dict) and depth < 32:
        for item in value.values():
            flat_values(item, out, depth + 1)
    else:
        out.append(None)
    return out
