"""Static resolution of a call's callee: a catalogued API, something that is certainly no API, or unknown.

Only dotted names are resolved (``relu``, ``F.gelu``, ``torch.nn.functional.gelu``); the root name goes
through the scope's binding table, so aliases and ``from`` imports resolve however they were spelled, and a
local that shadows an import is not mistaken for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from msprobe_runtime.catalogue import Catalogue

from .scopes import DEFINITION, IMPORT, STDLIB_VALUE, Scope, is_stdlib

API, UNKNOWN, NOT_API = "api", "unknown", "not-api"

# Builtins that read their caller's frame: called through a shim they would read the shim's frame instead
# (zero-argument super() would fail outright), so they are never routed, even where a star import could
# in principle have rebound them.
FRAME_READING_BUILTINS = frozenset({"super", "locals", "vars", "globals", "dir", "eval", "exec", "breakpoint"})


@dataclass(frozen=True)
class Resolution:
    kind: str  # API, UNKNOWN or NOT_API
    api_name: Optional[str] = None  # the dump name of an API
    qualname: Optional[str] = None  # the qualified name the callee resolved to, where it did


def qualify(dotted: str, scope: Scope) -> Optional[str]:
    """The qualified name ``dotted`` refers to through imports, or None."""
    root, dot, rest = dotted.partition(".")
    binding, _builtin = scope.lookup(root)
    if binding is None or binding.kind != IMPORT:
        return None
    return binding.qualname + dot + rest


class Resolver:
    def __init__(self, catalogue: Catalogue):
        self.catalogue = catalogue

    def resolve_dotted(self, dotted: Optional[str], scope: Scope) -> Resolution:
        """The decision for a callee spelled ``a.b.c`` (None: not a dotted name). The libcst transformer, the
        ast transformer and the lint all call this, so they resolve alike."""
        if dotted is None:
            return Resolution(UNKNOWN)
        root, _, _ = dotted.partition(".")
        binding, builtin = scope.lookup(root)
        if binding is None:
            return Resolution(NOT_API if builtin or dotted in FRAME_READING_BUILTINS else UNKNOWN)
        kind = binding.kind
        if kind == IMPORT:
            qualname = qualify(dotted, scope)
            api_name = self.catalogue.dump_name(qualname)
            if api_name is not None:
                return Resolution(API, api_name, qualname)
            # The standard library re-exports no torch API; anything else may (a package re-exporting
            # F.gelu, a module object), so the runtime decides by identity.
            return Resolution(NOT_API if is_stdlib(qualname) else UNKNOWN, qualname=qualname)
        if kind == DEFINITION:
            # A function or class the module defines is an API where the catalogue names it: apex's modules
            # call the catalogued functions of their own file (FusedRMSNorm.forward -> fused_rms_norm_affine),
            # which on a GPU is the fused kernel (tests/realworld/test_fused_libraries.py).
            module = scope.module
            if module.qualname is not None and module.bindings.get(root) is binding:
                qualname = f"{module.qualname}.{dotted}"
                api_name = self.catalogue.dump_name(qualname)
                if api_name is not None:
                    return Resolution(API, api_name, qualname)
            if root == dotted:
                return Resolution(NOT_API)
        if kind == STDLIB_VALUE:
            return Resolution(NOT_API)
        return Resolution(UNKNOWN)
