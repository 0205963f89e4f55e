"""Which files a run works on: the ``.py`` files under the PATH arguments, minus ``--exclude`` globs and
directories that never hold the user's own source (VCS metadata, caches, virtual environments).

For ``--out`` the walk also reports every other file, so the copy of the tree is complete.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Sequence

# Directories that are tool state, never source. Virtual environments are recognised by their
# pyvenv.cfg rather than by name, so a package that happens to be called `env` is still walked.
SKIP_DIR_NAMES = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".tox",
        ".nox",
        ".eggs",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".hypothesis",
    }
)

PYTHON = "python"  # a .py file to rewrite (or restore)
OTHER = "other"  # any other file: copied as it is by --out, ignored otherwise
EXCLUDED = "excluded"  # a .py file matched by --exclude: reported as skipped, copied as it is by --out
LINK = "link"  # a symbolic link met while walking: never followed, recreated by --out
SPECIAL = "special"  # not a regular file (a named pipe, a socket, a device): never opened, never copied

NOT_REGULAR = "not a regular file"


@dataclass(frozen=True)
class Entry:
    path: str  # the path to open, built from the user's PATH argument so messages show it as typed
    rel: str  # relative to the PATH argument, '/'-separated: the name under --out and for --exclude
    kind: str


class PathNotFound(Exception):
    """A PATH argument that does not exist."""


def is_python(name: str) -> bool:
    return name.endswith(".py")


def _kind(mode: int, name: str) -> str:
    if stat.S_ISLNK(mode):
        return LINK
    if not stat.S_ISREG(mode):
        # Opening a named pipe blocks until something writes to it; reading a device never ends.
        return SPECIAL
    return PYTHON if is_python(name) else OTHER


def is_virtualenv(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, "pyvenv.cfg"))


def excluded(rel: str, globs: Sequence[str]) -> bool:
    """A glob matches the path relative to its PATH argument, or any single component of it.

    ``tests`` therefore drops every directory or file named tests, ``pkg/gen_*.py`` one pattern of files,
    and ``*_pb2.py`` generated modules anywhere.
    """
    if not globs:
        return False
    parts = rel.split("/")
    for glob in globs:
        glob = glob.replace(os.sep, "/").rstrip("/")
        if fnmatch.fnmatchcase(rel, glob) or any(fnmatch.fnmatchcase(part, glob) for part in parts):
            return True
    return False


def _walk(top: str, globs: Sequence[str]) -> Iterator[Entry]:
    # os.walk with sorted names keeps output order, and so the CLI's report, deterministic.
    for dirpath, dirnames, filenames in os.walk(top):
        rel_dir = os.path.relpath(dirpath, top).replace(os.sep, "/")
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        kept = []
        for name in sorted(dirnames):
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                yield Entry(full, rel_dir + name, LINK)
            elif name in SKIP_DIR_NAMES or is_virtualenv(full):
                continue
            elif excluded(rel_dir + name, globs):
                # Excluded directories are still part of the tree that --out copies.
                yield from (
                    Entry(e.path, rel_dir + name + "/" + e.rel, EXCLUDED if e.kind == PYTHON else e.kind)
                    for e in _walk(full, ())
                )
            else:
                kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = rel_dir + name
            try:
                kind = _kind(os.lstat(full).st_mode, name)
            except OSError:  # gone since the listing: reading it reports the error
                kind = PYTHON if is_python(name) else OTHER
            if kind == PYTHON and excluded(rel, globs):
                kind = EXCLUDED
            yield Entry(full, rel, kind)


def discover(paths: Iterable[str], globs: Sequence[str] = ()) -> List[Entry]:
    """Every file under ``paths``, in a stable order, each real file once.

    A file named directly on the command line is processed whatever its suffix (a script without
    ``.py``) and whatever --exclude says: naming it is the stronger statement.
    """
    paths = list(paths)
    for path in paths:
        if not os.path.lexists(path):
            raise PathNotFound(path)
    seen = set()
    entries: List[Entry] = []
    for path in paths:
        if os.path.isdir(path):
            found: Iterable[Entry] = _walk(path, globs)
        else:
            # Named directly: followed if a symbolic link, and taken as Python whatever its name.
            try:
                regular = stat.S_ISREG(os.stat(path).st_mode)
            except OSError:  # a dangling link, say: reading it reports the error
                regular = True
            found = [Entry(path, os.path.basename(path), PYTHON if regular else SPECIAL)]
        for entry in found:
            # Overlapping arguments (`src src/a.py`) must not hand the same file to two workers.
            key = os.path.realpath(entry.path) if entry.kind != LINK else os.path.abspath(entry.path)
            if key in seen:
                continue
            seen.add(key)
            entries.append(entry)
    return entries
