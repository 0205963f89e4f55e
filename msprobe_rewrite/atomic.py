"""Atomic file replacement: a reader (an import, an editor, a training job starting) sees either the old
bytes or the new ones, never a half-written file, and an interrupted run leaves no stray temp files.

The new content goes to a temporary file in the destination's own directory (so ``os.replace`` is a
rename within one file system) and is renamed over the destination, keeping the destination's mode.
There is no fsync: the guarantee is against a crash of this process, not against power loss, and an
fsync per file would make a rewrite of a large tree several times slower.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from typing import Optional

TEMP_SUFFIX = ".msprobe-tmp"


class ModifiedMeanwhile(OSError):
    """The destination changed after it was read; replacing it would lose someone else's edit."""


_umask: Optional[int] = None


def _default_mode() -> int:
    # mkstemp creates files 0600; a new file should get what open() would have given it. The umask can
    # only be read by setting it, so it is read once.
    global _umask
    if _umask is None:
        _umask = os.umask(0)
        os.umask(_umask)
    return 0o666 & ~_umask


def _same_file_state(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_mtime_ns, a.st_size, a.st_ino) == (b.st_mtime_ns, b.st_size, b.st_ino)


def write_atomic(path: str, data: bytes, mode: Optional[int] = None,
                 unchanged_since: Optional[os.stat_result] = None) -> None:
    """Replace ``path`` with ``data``.

    ``mode``: the permission bits of the result; by default those of the file being replaced, or the
    umask default for a new file. ``unchanged_since``: the stat of ``path`` when it was read; if the file
    has changed since, nothing is written and ``ModifiedMeanwhile`` is raised.
    """
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=TEMP_SUFFIX, dir=directory or ".")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        if mode is None:
            try:
                mode = stat.S_IMODE(os.stat(path).st_mode)
            except FileNotFoundError:
                mode = _default_mode()
        os.chmod(tmp, mode)
        if unchanged_since is not None and not _same_file_state(os.stat(path), unchanged_since):
            raise ModifiedMeanwhile(f"{path} changed while it was being rewritten; left as it is")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def copy_atomic(src: str, dst: str) -> None:
    """Copy ``src`` to ``dst`` with its mode and times, replacing ``dst`` atomically."""
    directory, name = os.path.split(dst)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=TEMP_SUFFIX, dir=directory or ".")
    os.close(fd)
    try:
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
