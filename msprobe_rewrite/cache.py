"""The result cache: what rewriting (or restoring) a given source produced, so that a second run over
an unchanged tree reads and hashes files instead of parsing them.

An entry is keyed by the sha256 of the source bytes, the mode (rewrite or restore) and a salt that names
everything else the result depends on: the tool version, a fingerprint of the compiler's own source (an
editable install keeps its version number while its code changes), the libcst version and the catalogue
digest. Entries are written atomically and carry a checksum of their payload, so a truncated or corrupt
entry reads as a miss. Each salt gets its own folder (a generation); only the most recently used
``KEEP_GENERATIONS`` are kept, so an editable install that changes on every edit does not fill the disk. Any error of
the cache itself disables it for the rest of the run: it must never
be why a rewrite fails.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from typing import List, Optional, Tuple

from ._version import __version__
from .atomic import write_atomic

_MAGIC = b"msprobe-rewrite-cache 1\n"

# Entry kinds.
SAME = "same"  # the result equals the source
NEW = "new"  # the payload is the result
FAIL = "fail"  # the payload is the reason the source cannot be rewritten (utf-8)
_KINDS = frozenset({SAME, NEW, FAIL})


def default_directory() -> str:
    """``$MSPROBE_REWRITE_CACHE_DIR`` (kept for compatibility), else ``rewrite/`` in the tool's one cache folder
    (``msprobe_runtime.cache_folders``), which the runtime's native op build shares."""
    from msprobe_runtime.cache_folders import rewrite_cache_folder

    return rewrite_cache_folder()


def fingerprint_files() -> List[str]:
    """The files whose text decides a rewrite: the compiler package's own modules, and the runtime modules it
    reads the contract from (the operator table and the catalogue loader, which sets the dump-name prefixes
    written into rewritten files). An edit to any of them in an editable install must miss the cache."""
    from msprobe_runtime import catalogue, operators

    package = os.path.dirname(os.path.abspath(__file__))
    files = [os.path.join(package, name) for name in sorted(os.listdir(package)) if name.endswith(".py")]
    return files + [os.path.abspath(catalogue.__file__), os.path.abspath(operators.__file__)]


def compiler_fingerprint(files: Optional[List[str]] = None) -> str:
    """Tool version, a digest of ``fingerprint_files()``, and the libcst version."""
    digest = hashlib.sha256(__version__.encode())
    for path in fingerprint_files() if files is None else files:
        with open(path, "rb") as handle:
            digest.update(os.path.basename(path).encode() + b"\0" + handle.read() + b"\0")
    try:
        from importlib.metadata import version

        digest.update(version("libcst").encode())
    except Exception:  # the fingerprint is best effort; the package digest already covers our code
        pass
    return digest.hexdigest()


def source_digest(source: bytes) -> str:
    return hashlib.sha256(source).hexdigest()


# Marks a folder as ours (and, by the CACHEDIR.TAG convention, as a cache that backups may skip).
# Pruning deletes only folders that carry it, so a cache root pointed at a shared folder stays safe.
TAG_NAME = "CACHEDIR.TAG"
TAG_TEXT = b"Signature: 8a477f597d28d172789f06886806bc55\n# msprobe-rewrite result cache\n"
# Every edit of an editable install or of a catalogue starts a new generation of entries (a whole
# tree's worth of rewritten sources); only the most recently used few are kept.
KEEP_GENERATIONS = 8


class ResultCache:
    def __init__(self, root: str, salt: str):
        self.root = root
        self._salt = salt.encode()
        # One sub-folder per salt (a "generation"), so stale generations go as a whole.
        self.directory = os.path.join(root, hashlib.sha256(self._salt).hexdigest()[:16])
        self.enabled = True
        self.problem: Optional[str] = None  # why the cache was turned off, for one warning
        self.hits = 0
        self.misses = 0
        self._claimed = False

    def _claim(self) -> None:
        """Mark this generation as ours and as just used, then drop the least recently used others."""
        if self._claimed:
            return
        self._claimed = True
        os.makedirs(self.directory, exist_ok=True)
        tag = os.path.join(self.directory, TAG_NAME)
        if not os.path.exists(tag):
            write_atomic(tag, TAG_TEXT, mode=0o644)
        os.utime(self.directory)
        try:
            generations = [
                entry
                for entry in os.scandir(self.root)
                if entry.is_dir(follow_symlinks=False) and entry.path != self.directory and _is_ours(entry.path)
            ]
            generations.sort(key=lambda entry: entry.stat(follow_symlinks=False).st_mtime, reverse=True)
        except OSError:
            return
        for stale in generations[KEEP_GENERATIONS - 1 :]:
            shutil.rmtree(stale.path, ignore_errors=True)

    def key(self, digest: str, mode: str) -> str:
        # surrogatepass: a module name from an undecodable file name (tests/compiler/test_cli.py)
        return hashlib.sha256(
            self._salt + b"\0" + mode.encode("utf-8", "surrogatepass") + b"\0" + digest.encode()
        ).hexdigest()

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
            return None
        self.hits += 1
        try:
            self._claim()
        except OSError as error:
            self._disable(error)
        return entry

    def put(self, key: str, kind: str, payload: bytes = b"") -> None:
        if not self.enabled:
            return
        path = self._path(key)
        blob = _MAGIC + kind.encode() + b"\n" + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
        try:
            self._claim()
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomic(path, blob, mode=0o644)
        except OSError as error:
            self._disable(error)

    def _disable(self, error: OSError) -> None:
        self.enabled = False
        self.problem = f"cache {self.root} disabled: {error}"


def _is_ours(directory: str) -> bool:
    try:
        with open(os.path.join(directory, TAG_NAME), "rb") as handle:
            return handle.read() == TAG_TEXT
    except OSError:
        return False


def _decode(blob: bytes) -> Optional[Tuple[str, bytes]]:
    if not blob.startswith(_MAGIC):
        return None
    rest = blob[len(_MAGIC) :]
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
