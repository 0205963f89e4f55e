"""Decorators whose functions are compiled, traced or scripted: their bodies must stay plain torch.

Shared by the libcst transformer, the ast transformer of the import hook and the lint, so all three leave the
same bodies alone.
"""

from __future__ import annotations

from .resolver import qualify
from .scopes import Scope

KERNEL_DECORATORS = frozenset(
    {
        "torch.jit.script",
        "torch.jit.script_method",
        "torch.jit.ignore",
        "torch.jit.unused",
        "torch.jit.trace",
        "torch.compile",
        "torch.compiler.disable",
        "torch._dynamo.disable",
        "torch.fx.wrap",
        "triton.jit",
        "triton.autotune",
        "triton.heuristics",
        "tilelang.jit",
        "tilelang.language.prim_func",
        "megatron.core.jit.jit_fuser",
    }
)
# Re-exports (Megatron-LM reaches triton.jit through its own modules) are caught by the last name.
KERNEL_DECORATOR_NAMES = frozenset(
    {"jit", "jit_fuser", "script", "script_method", "prim_func", "autotune", "heuristics", "compile"}
)


def is_kernel_decorator(dotted: str, scope: Scope, configured=frozenset()) -> bool:
    """Whether the decorator spelled ``dotted`` (resolved through ``scope``) compiles its function's body."""
    qualname = qualify(dotted, scope) or dotted
    last = qualname.rsplit(".", 1)[-1]
    return (
        qualname in KERNEL_DECORATORS
        or last in KERNEL_DECORATOR_NAMES
        or qualname in configured
        or dotted in configured
        or last in configured
    )
