"""The native op's build folder: it appears only whole, with a record, and is loaded only while it matches it.

A build's ``ready`` marker is its record, written once the library is complete: the library's file name, its
size and its sha256. A process loads the cached library only if it still matches. One that no longer does (a
copy of a home cut short by a full disk, a file system repaired after a crash, an edit) was loaded as it was,
and a truncated library killed the training process with SIGBUS as soon as the loader touched a page past
its end (tests/runtime/test_native_build_cache.py). The record and the library are opened without following a
link; hashing the library is small next to the import it guards, and done once per process.

A build runs in a private folder beside its final one (``building_folder``) and is renamed into place whole,
library and record together (``publish``): the final name never holds half a build, and a build killed midway
leaves only its private folder (a few MB, left there: no process can tell it from the folder of a build still
running on another machine that shares the cache). Processes of one machine take ``build_lock`` to build once; where
another
build got there first anyway (machines sharing a cache), the one in place is checked and kept.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile

try:
    import fcntl
except ImportError:  # not POSIX: no lock, the rename alone keeps a build folder whole
    fcntl = None

from .dump_names import is_plain_file_name

RECORD = "ready"
_NO_LINK = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_READ = os.O_RDONLY | _NO_LINK


def read_text(path, limit=4096):
    """The first ``limit`` characters of the file at ``path``, or None where there is none or it cannot be
    read; a link planted at ``path`` is not followed (a planted file is not taken as ours)."""
    try:
        fd = os.open(path, _READ)
    except OSError:
        return None
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as handle:
        try:
            return handle.read(limit)
        except OSError:
            return None


def _size_and_sha256(path):
    """``(size, sha256 hex)`` of the regular file at ``path``, opened without following a link."""
    fd = os.open(path, _READ)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        digest = hashlib.sha256()
        size = 0
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def write_record(folder, library):
    """Record in ``folder`` what its build made: ``library`` (a file in ``folder``), its size and sha256."""
    from .json_files import atomic_write_text

    size, sha256 = _size_and_sha256(library)
    record = {"library": os.path.basename(library), "size": size, "sha256": sha256}
    atomic_write_text(os.path.join(folder, RECORD), json.dumps(record) + "\n")


def checked_library(folder):
    """``(path, None)`` of the library in ``folder`` where it is what its build recorded; ``(None, None)`` where
    ``folder`` records no build; ``(None, why)`` where the record or the library is not what a build left."""
    text = read_text(os.path.join(folder, RECORD))
    if text is None:
        return None, None
    try:
        record = json.loads(text)
        name, size, sha256 = record["library"], record["size"], record["sha256"]
    except (ValueError, TypeError, KeyError):
        return None, f"its {RECORD} marker records no library, size and sha256"
    if not (isinstance(name, str) and is_plain_file_name(name) and type(size) is int and isinstance(sha256, str)):
        return None, f"its {RECORD} marker records no library, size and sha256"
    path = os.path.join(folder, name)
    try:
        found_size, found_sha256 = _size_and_sha256(path)
    except OSError as error:
        return None, f"{name} cannot be read ({error.strerror or error})"
    if found_size != size:
        return None, f"{name} holds {found_size} bytes where its build made {size}"
    if found_sha256 != sha256:
        return None, f"{name}'s sha256 is not its build's"
    return path, None


def discard(folder):
    """Take ``folder`` away: renamed first to a name of its own beside it (so no process finds half of it at
    its name), then removed. A process that has its library loaded keeps it: a removed file stays mapped."""
    parent, base = os.path.split(folder)
    aside = tempfile.mkdtemp(prefix=f"{base}.", suffix=".discarded", dir=parent)
    try:
        os.rename(folder, os.path.join(aside, base))
    except FileNotFoundError:
        pass  # another process took it away first
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def building_folder(folder):
    """A new folder beside ``folder`` to build in, under a name no one can guess (``tempfile.mkdtemp``): on the
    same file system, so that ``publish`` is one rename."""
    parent, base = os.path.split(folder)
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"{base}.", suffix=".building", dir=parent)


def publish(building, folder):
    """Rename the whole build in ``building`` (its library and record written) to ``folder``: True where it is
    there now; False where another process's whole build was there first, which stays (the processes that
    loaded it keep it) while ``building`` is removed. A folder at ``folder`` that is not a whole build (a
    corrupt one, a failure note of another build) is taken away for this one."""
    os.chmod(building, 0o755)  # as the folders made by makedirs: others may load what only its owner writes
    for _attempt in range(3):
        try:
            os.rename(building, folder)  # atomic; over an existing folder only where it is empty
            return True
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        if checked_library(folder)[0] is not None:
            shutil.rmtree(building, ignore_errors=True)
            return False
        discard(folder)
    raise OSError(errno.EEXIST, f"{folder} was taken by other builds three times while this one was put there")


@contextlib.contextmanager
def build_lock(folder, waiting):
    """Hold ``<folder>.lock`` (``flock``) around a build, so that the processes of one machine build once: the
    others wait (``waiting()`` is called when one starts to), then find the build. The kernel releases the lock
    when its holder dies. torch's own lock (a file that exists while a build runs, in the build folder) stayed
    behind a build killed midway, and every later process waited for it forever; it is now in the killed
    build's private folder, which no one waits on. Where no lock can be had, builds run side by side and
    ``publish`` keeps the folder whole."""
    fd = None
    if fcntl is not None:
        try:
            os.makedirs(os.path.dirname(folder), exist_ok=True)
            fd = os.open(f"{folder}.lock", os.O_RDWR | os.O_CREAT | _NO_LINK, 0o644)
        except OSError:
            fd = None
    try:
        if fd is not None:
            _take(fd, waiting)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _take(fd, waiting):
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        waiting()
    except OSError:
        return  # a file system without locks
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        pass
