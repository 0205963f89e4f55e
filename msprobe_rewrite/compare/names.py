"""Dump entry names taken apart: the API or module, the direction, and the call index that alignment ignores.

``Functional.gelu.3.forward`` -> (``Functional.gelu``, ``forward``, 3);
``Module.net1.ln1.Linear.backward.0`` -> (``Module.net1.ln1.Linear``, ``backward``, 0);
``Module.net1.ln1.Linear.parameters_grad.0`` -> (``Module.net1.ln1.Linear``, ``parameters_grad``, 0).
"""
from __future__ import annotations

from typing import Optional, Tuple

DIRECTIONS = ("forward", "backward", "parameters_grad")


def split_name(name: str) -> Tuple[str, str, Optional[int]]:
    """(base, direction, index); a name of no known shape is its own base with direction ''."""
    parts = name.split(".")
    if len(parts) >= 3:
        if parts[-1] in DIRECTIONS and parts[-2].isdigit():  # API: Prefix.api.N.direction
            return ".".join(parts[:-2]), parts[-1], int(parts[-2])
        if parts[-2] in DIRECTIONS and parts[-1].isdigit():  # module: Module.path.Class.direction.N
            return ".".join(parts[:-2]), parts[-2], int(parts[-1])
    return name, "", None


def forward_name(name: str) -> Optional[str]:
    """The forward entry whose stack a backward (or parameters_grad) entry shares, or None."""
    parts = name.split(".")
    if len(parts) >= 3:
        if parts[-1] == "backward" and parts[-2].isdigit():
            return ".".join(parts[:-1] + ["forward"])
        if parts[-2] in ("backward", "parameters_grad") and parts[-1].isdigit():
            return ".".join(parts[:-2] + ["forward", parts[-1]])
    return None


def is_module(name: str) -> bool:
    return name.startswith("Module.") or name.startswith("Cell.")
