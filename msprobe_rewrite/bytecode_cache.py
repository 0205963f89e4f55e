"""The import hook's bytecode cache: instrumented code objects beside the normal ``.pyc`` files.

A cache file lives where ``importlib.util.cache_from_source`` puts the normal one (so ``sys.pycache_prefix``
and ``-O`` levels are honoured), under a tag of its own (``mod.cpython-311.msprobe-rewrite.pyc``), and holds
a header and the marshalled code. The header carries a key: a hash of the source bytes, the package the
module is imported in, the tool version and the catalogue and options. Validity is decided by content, never by
modification time, so an edit within
the same second is picked up. Files are written atomically (``atomic.write_atomic``: a temporary file of a
name no one can guess, opened exclusively, then ``os.replace``), so two processes importing the same cold
package at once both leave a valid file and a link planted beside the cache is never written through;
anything unreadable, truncated or from another key is ignored and rewritten.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import sys
from types import CodeType
from typing import Optional

from .atomic import write_atomic

TAG = "msprobe-rewrite"
_HEADER = b"msprobe-rewrite-bytecode\x00" + importlib.util.MAGIC_NUMBER
_KEY_SIZE = 32


def cache_key(source: bytes, fingerprint: str, package: str) -> bytes:
    """What a cached code object must match: the source bytes, the compiler's fingerprint and the package the
    module is imported in (its relative imports, and so which calls are catalogued, resolve against it: the
    same file imported as ``megatron.core.x`` and as ``core.x`` is rewritten differently)."""
    digest = hashlib.sha256(fingerprint.encode())
    digest.update(b"\x00")
    digest.update(package.encode("utf-8", "surrogatepass"))
    digest.update(b"\x00")
    digest.update(source)
    return digest.digest()


def cache_path(source_path: str) -> Optional[str]:
    try:
        normal = importlib.util.cache_from_source(source_path)
    except (NotImplementedError, ValueError):
        return None
    stem, ext = os.path.splitext(normal)
    return f"{stem}.{TAG}{ext}"


def read(path: Optional[str], key: bytes) -> Optional[CodeType]:
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    start = len(_HEADER) + _KEY_SIZE
    if len(data) <= start or not data.startswith(_HEADER) or data[len(_HEADER) : start] != key:
        return None
    try:
        code = marshal.loads(data[start:])
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


def write(path: Optional[str], key: bytes, code: CodeType) -> bool:
    """Write the cache file atomically; False (and nothing left behind) where the folder is not writable."""
    if path is None or sys.dont_write_bytecode:
        return False
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, _HEADER + key + marshal.dumps(code), mode=0o644, refuse_hard_links=False)
        return True
    except OSError:  # write_atomic leaves no temporary file behind
        return False
