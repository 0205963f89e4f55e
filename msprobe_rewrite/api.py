"""The compiler as functions on bytes: ``rewrite_source``, ``restore_source``, ``is_instrumented``.

Work in progress: the transformer lands in ``transformer.py``; until then these raise.
"""
from __future__ import annotations

from typing import Optional

from msprobe_runtime.catalogue import Catalogue


class RewriteError(Exception):
    """A file that cannot be decoded or parsed; the message says why. The file is left as it was."""


RUNTIME_IMPORT = "import msprobe_runtime as __msprobe__"


def is_instrumented(source: bytes) -> bool:
    """Whether ``source`` carries the runtime import that ``rewrite_source`` adds."""
    return RUNTIME_IMPORT.encode() in source


def rewrite_source(source: bytes, catalogue: Optional[Catalogue] = None, path: str = "<string>") -> bytes:
    """Instrument one module's source; an instrumented source is re-instrumented from its original."""
    raise NotImplementedError("not yet: the transformer is being written")


def restore_source(source: bytes, path: str = "<string>") -> bytes:
    """Give back the exact original bytes of an instrumented module (unchanged if not instrumented)."""
    raise NotImplementedError("not yet: the transformer is being written")
