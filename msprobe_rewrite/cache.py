"""The result cache: what rewriting (or restoring) a given source produced, so that a second run over
an unchanged tree reads and hashes files instead of parsing them.

An entry is keyed by the sha256 of the source bytes, the mode (rewrite or restore) and a salt that names
everything else the result depends on: the tool version, a fingerprint of the compiler's own source (an
editable install keeps its version number while its code changes), the libcst version and the catalogue
digest. Entries are written atomically and carry a checksum of their payload, so a truncated or corrupt
entry reads as a miss. Any error of the cache itself disables it for the rest of the run: it must never
be why a rewrite fails.
"""
from __future__ import annotations

import hashlib
import os
from typing import Optional, Tuple

from . import __version__
from .atomic import write_atomic

ENV_DIR = "MSPROBE_REWRITE_CACHE_DIR"
_MAGIC = b"msprobe-rewrite-cache 1\n"

# Entry kinds.
SAME = "same"  # the result equals the source
NEW = "new"    # the payload is the result
FAIL = "fail"  # the payload is the reason the source cannot be rewritten (utf-8)
_KINDS = frozenset({SAME, NEW, FAIL})


def default_directory() -> str:
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "msprobe-rewrite")


def compiler_fingerprint() -> str:
    """Tool version, a digest of the compiler package's own files, and the libcst version."""
    digest = hashlib.sha256(__version__.encode())
    package = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(package)):
        if name.endswith(".py"):
            with open(os.path.join(package, name), "rb") as handle:
                digest.update(name.encode() + b"\0" + handle.read() + b"\0")
    try:
        from importlib.metadata import version
        digest.update(version("libcst").encode())
    except Exception:  # the fingerprint is best effort; the package digest already covers our code
        pass
    return digest.hexdigest()


def source_digest(source: bytes) -> str:
    return hashlib.sha256(source).hexdigest()


class ResultCache:
    def __init__(self, directory: str, salt: str):
        self.directory = directory
        self._salt = salt.encode()
        self.enabled = True
        self.problem: Optional[str] = None  # why the cache was turned off, for one warning
        self.hits = 0
        self.misses = 0

    def key(self, digest: str, mode: str) -> str:
        return hashlib.sha256(self._salt + b"\0" + mode.encode() + b"\0" + digest.encode()).hexdigest()

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key[2:])

    def get(self, key: str) -> Optional[Tuple[str, bytes]]:
        if not self.enabled:
            return None
        try:
            with open(self._path(key), "rb") as handle:
                blob = handle.read()
        except FileNotFoundError:
            self.misses += 1
            return None
        except OSError as error:
            self._disable(error)
            return None
        entry = _decode(blob)
        if entry is None:
            self.misses += 1
        else:
            self.hits += 1
        return entry

    def put(self, key: str, kind: str, payload: bytes = b"") -> None:
        if not self.enabled:
            return
        path = self._path(key)
        blob = _MAGIC + kind.encode() + b"\n" + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomic(path, blob, mode=0o644)
        except OSError as error:
            self._disable(error)

    def _disable(self, error: OSError) -> None:
        self.enabled = False
        self.problem = f"cache {self.directory} disabled: {error}"


def _decode(blob: bytes) -> Optional[Tuple[str, bytes]]:
    if not blob.startswith(_MAGIC):
        return None
    rest = blob[len(_MAGIC):]
    parts = rest.split(b"\n", 2)
    if len(parts) != 3:
        return None
    kind, checksum, payload = parts
    try:
        kind_text = kind.decode("ascii")
    except UnicodeDecodeError:
        return None
    if kind_text not in _KINDS or hashlib.sha256(payload).hexdigest().encode() != checksum:
        return None
    return kind_text, payload
