"""Atomic file replacement: a reader (an import, an editor, a training job starting) sees either the old
bytes or the new ones, never a half-written file, and an interrupted run leaves no stray temp files.

The new content goes to a temporary file in the destination's own directory (so ``os.replace`` is a
rename within one file system) and is renamed over the destination, keeping the destination's mode, and
its owner and group where this process may set them (always as root). The result is a new inode with a
new modification time; a destination with other hard links is refused, since the rename would leave the
other names on the old bytes.
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


class HardLinked(OSError):
    """The destination has other hard links; replacing it would split them."""

    def __init__(self, path: str, links: int):
        super().__init__(
            f"{path} has {links} hard links; replacing it would leave the other "
            f"{links - 1} on the old bytes, so it is left as it is"
        )
        self.path, self.links = path, links


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


def _keep_owner(fd: int, existing: os.stat_result) -> None:
    """Give the temporary file the owner and group of the file it replaces, as far as allowed.

    Root may give a file to anyone; another user only to a group of their own, and to nobody else.
    What is not permitted is left as created (the user's own file stays theirs either way).
    """
    created = os.fstat(fd)
    if (created.st_uid, created.st_gid) == (existing.st_uid, existing.st_gid):
        return
    try:
        os.fchown(fd, existing.st_uid, existing.st_gid)
    except PermissionError:
        try:
            os.fchown(fd, -1, existing.st_gid)
        except PermissionError:
            pass


def write_atomic(
    path: str,
    data: bytes,
    mode: Optional[int] = None,
    unchanged_since: Optional[os.stat_result] = None,
    refuse_hard_links: bool = True,
) -> None:
    """Replace ``path`` with ``data``.

    ``mode``: the permission bits of the result; by default those of the file being replaced, or the
    umask default for a new file. Owner and group are those of the file being replaced where permitted.
    ``unchanged_since``: the stat of ``path`` when it was read; if the file has changed since, nothing is
    written and ``ModifiedMeanwhile`` is raised. ``refuse_hard_links``: if ``path`` has more than one
    link, nothing is written and ``HardLinked`` is raised.
    """
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=TEMP_SUFFIX, dir=directory or ".")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            try:
                existing: Optional[os.stat_result] = os.stat(path)
            except FileNotFoundError:
                existing = None
            if existing is not None and hasattr(os, "fchown"):
                _keep_owner(handle.fileno(), existing)
        if mode is None:
            mode = stat.S_IMODE(existing.st_mode) if existing is not None else _default_mode()
        # After the owner: chown clears the set-user-id and set-group-id bits.
        os.chmod(tmp, mode)
        if existing is not None or unchanged_since is not None:
            existing = os.stat(path)
            if unchanged_since is not None and not _same_file_state(existing, unchanged_since):
                raise ModifiedMeanwhile(f"{path} changed while it was being rewritten; left as it is")
            if refuse_hard_links and existing.st_nlink > 1:
                raise HardLinked(path, existing.st_nlink)
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
