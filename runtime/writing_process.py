"""The writing process: one child interpreter per training process that encodes and writes the JSON files.

The writer thread hands it each step's files (``json_files``: marshalled, behind a length) and waits for its
answer without the GIL, so a step is on disk, in order, when the writer's queue is done with it, as before.
One process serves every debugger of this process (tests make hundreds); it is started on first use and ends
when the training process closes its stdin, at exit or at death.

Where it cannot start (``MSPROBE_WRITER_PROCESS=0``, a ``sys.executable`` that is not a Python interpreter:
a frozen application or a program that embeds Python; a platform without ``subprocess``) or dies, ``send`` raises ``Unavailable`` and the writer thread writes the files itself, as it
always did: slower for training, never lost. A forked child of the training process (a DataLoader worker)
never writes through its parent's pipe: it starts its own process if it needs one.
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import threading

from . import json_files

logger = logging.getLogger("msprobe_runtime")
_SCRIPT = os.path.abspath(json_files.__file__)


class Unavailable(Exception):
    """No writing process serves: the caller writes the files itself."""


def enabled():
    return os.environ.get("MSPROBE_WRITER_PROCESS", "1").strip().lower() not in ("0", "false", "no", "off")


class WritingProcess:
    """The child, its pipes, and one job in flight at a time (the lock)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._child = None
        self._failed = False  # it could not start, or died: never tried again in this process

    def send(self, message):
        """Have the child write the files of ``message`` (``json_files.encode((directory, files))``); returns
        once they are on disk. Raises OSError as the write raised it there, and ``Unavailable`` when no child
        serves."""
        with self._lock:
            child = self._running()
            try:
                child.stdin.write(message)
                child.stdin.flush()
                answer = json_files.read_message(child.stdout)
            except (OSError, ValueError) as error:  # a broken pipe: it died
                self._gone(f"{type(error).__name__}: {error}")
                raise Unavailable() from error
            if answer is None:
                self._gone(f"exit status {child.poll()}")
                raise Unavailable()
        code, text = answer
        if code:
            raise OSError(code if code > 0 else None, text)

    def serves(self):
        """Whether a child serves or may yet be started (a step's message is worth making)."""
        return not self._failed and enabled()

    def _running(self):
        if self._child is not None:
            return self._child
        if not self.serves():
            raise Unavailable()
        executable = sys.executable
        if not _is_python(executable):
            self._failed = True
            logger.info("msprobe_runtime: no Python executable to start the writing process with (%r); the "
                        "writer thread writes the dumps", executable)
            raise Unavailable()
        try:
            import subprocess

            # -I -S: the standard library only (no site, no user paths); its own stderr is ours, so a crash shows
            self._child = subprocess.Popen([executable, "-I", "-S", _SCRIPT], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, close_fds=True)
        except Exception as error:  # noqa: BLE001 - any failure to start means: write in this process
            self._failed = True
            logger.info("msprobe_runtime: the writing process could not start (%s); the writer thread writes "
                        "the dumps", error)
            raise Unavailable() from error
        return self._child

    def _gone(self, why):
        self._failed = True
        child, self._child = self._child, None
        logger.warning("msprobe_runtime: the writing process ended (%s); the writer thread writes the dumps "
                       "from now on", why)
        if child is not None:
            _close(child)

    def pid(self):
        """The child's process id while it serves, else None."""
        child = self._child
        return child.pid if child is not None and child.poll() is None else None

    def close(self):
        """End the child once it has written what it was given (interpreter exit; tests)."""
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            _close(child)


def _is_python(executable):
    """Whether ``executable`` is a Python interpreter to run the child with: not a frozen application nor a
    program that embeds Python (uWSGI, a C++ host), whose ``sys.executable`` is the program itself, which
    started with our arguments would run something else entirely."""
    if not executable or getattr(sys, "frozen", False) or not os.path.isfile(executable):
        return False
    return re.fullmatch(r"python[0-9.]*(\.exe)?", os.path.basename(executable), re.IGNORECASE) is not None


def _close(child):
    try:
        child.stdin.close()
    except OSError:
        pass
    try:
        child.wait(timeout=30)
    except Exception:  # noqa: BLE001 - a hung child is left to the system
        pass
    try:
        child.stdout.close()
    except OSError:
        pass


_shared = {"process": None, "pid": None}
_shared_lock = threading.Lock()


def shared():
    """This process's writing process (made once; a forked child makes its own)."""
    with _shared_lock:
        if _shared["process"] is None or _shared["pid"] != os.getpid():
            _shared["process"] = WritingProcess()
            _shared["pid"] = os.getpid()
        return _shared["process"]


def close_shared():
    """Close this process's writing process, if it has one (atexit, after the writers' queues are done)."""
    with _shared_lock:
        process = _shared["process"] if _shared["pid"] == os.getpid() else None
        _shared["process"] = None
    if process is not None:
        process.close()


# after every debugger's own atexit wait (registered later, so run earlier): the child has written everything
atexit.register(close_shared)
