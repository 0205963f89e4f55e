"""Tensor records inside dump records, found without torch (the parent process never imports it)."""

from __future__ import annotations

from typing import Any, List


def is_tensor_record(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("type"), str)
        and "Tensor" in value["type"]
        and "dtype" in value
    )


def flat_records(records: Any, out: List[Any], depth: int = 0) -> List[Any]:
    """Tensor records (and None for other leaves) of an output or gradient list, depth first."""
    if isinstance(records, list) and depth < 32:
        for item in records:
            flat_records(item, out, depth + 1)
    elif isinstance(records, dict) and not is_tensor_record(records) and "type" not in records and depth < 32:
        for item in records.values():
            flat_records(item, out, depth + 1)
    else:
        out.append(records if is_tensor_record(records) else None)
    return out
