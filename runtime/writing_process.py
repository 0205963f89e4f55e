"""The writing process: one child interpreter per training process that encodes and writes the JSON files.

Each step's files reach it marshalled, behind a length (``json_files``): posted by the training thread at
the flush where that cannot block (``post``: the pipe, enlarged to 1 MiB on Linux, holds it beside every
message not yet answered), else sent by the writer thread, which waits for the answer without the GIL.
Answers are read in order, the posted ones later (the next post, the writer thread, or ``Writer.wait``), so
a step is on disk, in order, when ``wait()`` returns, as before.
One process serves every debugger of this process (tests make hundreds); it is started on first use and ends
when the training process closes its stdin, at exit or at death.

Where it cannot start (``MSPROBE_WRITER_PROCESS=0``, a ``sys.executable`` that is not a Python interpreter:
a frozen application or a program that embeds Python; a platform without ``subprocess``) or dies, ``send``
raises ``Unavailable`` and the writer thread writes the files itself, as it always did: slower for training,
never lost. A forked child of the training process (a DataLoader worker)
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
from .switches import switched_on

logger = logging.getLogger("msprobe_runtime")
_SCRIPT = os.path.abspath(json_files.__file__)


class Unavailable(Exception):
    """No writing process serves: the caller writes the files itself, and those of ``unwritten``: the
    ``(owner, directory, message)`` of messages posted earlier whose answer never came (the process died)."""

    def __init__(self, unwritten=()):
        super().__init__()
        self.unwritten = list(unwritten)


def enabled():
    return switched_on("MSPROBE_WRITER_PROCESS")


class WritingProcess:
    """The child, its pipes (one writer at a time: the lock), and the messages posted whose answers are due.

    Two ways in: ``send`` (the writer thread) writes a message and waits for its answer; ``post`` (the
    training thread, at a flush) writes one without waiting, and only where that cannot block, so that the
    writer thread need not wake up, take the GIL from training and hand it back, several times a step. The
    answers of posted messages are read later, in order: by the next ``post`` where they have come, by
    ``send``, or by ``collect`` (``Writer.wait``). Each keeps its message until then, so that a child that
    dies loses no step: the messages it did not answer are written by the caller (``Unavailable.unwritten``).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._child = None
        self._failed = False  # it could not start, or died: never tried again in this process
        self._due = []  # (owner, directory, message) posted, in order, whose answers are not read yet
        self._capacity = 0  # bytes the pipe to the child holds (enlarged where the system allows): post's bound

    def send(self, message):
        """Have the child write the files of ``message`` (``json_files.encode((directory, files))``); returns
        once they are on disk: ``(answers, error)``, the answers of earlier posted messages (as ``collect``)
        and the OSError the write raised there, or None. Raises ``Unavailable`` when no child serves."""
        with self._lock:
            child = self._running()
            answers = self._read_due(child, block=True)
            self._write(child, message)
            return answers, self._answer(child)

    def post(self, owner, directory, message):
        """Write ``message`` to the child without waiting for its answer, if that cannot block: a child runs,
        no other thread is writing to it, and the pipe holds the whole message beside every message still
        unanswered (at most those are unread in it: the child may still be reading or writing an earlier
        step). Returns ``(posted, answers)``: ``answers`` are the ``(owner, directory, OSError or None)`` of
        earlier posts read here (``owner``: whoever posted, to report it). Raises ``Unavailable`` (with the
        messages it did not answer) when the child died."""
        if not self._lock.acquire(blocking=False):
            return False, []
        try:
            child = self._child
            if child is None or len(message) > self._capacity:
                return False, []
            answers = self._read_due(child, block=False)
            if sum(len(due[2]) for due in self._due) + len(message) > self._capacity:
                return False, answers  # the child is behind by more than the pipe holds
            self._write(child, message)
            self._due.append((owner, directory, message))
            return True, answers
        finally:
            self._lock.release()

    def collect(self):
        """Wait for the answers of every posted message: ``[(owner, directory, OSError or None)]``. Raises
        ``Unavailable`` (with the messages it did not answer) when the child died."""
        with self._lock:
            child = self._child
            if child is None:
                return []
            return self._read_due(child, block=True)

    def _read_due(self, child, block):
        answers = []
        while self._due and (block or _answer_waiting(child)):
            error = self._answer(child)
            owner, directory, _ = self._due.pop(0)
            answers.append((owner, directory, error))
        return answers

    def _write(self, child, message):
        try:
            child.stdin.write(message)
            child.stdin.flush()
        except (OSError, ValueError) as error:  # a broken pipe: it died
            self._gone(f"{type(error).__name__}: {error}")
            raise Unavailable(self._take_due()) from error

    def _answer(self, child):
        """The OSError of the child's next answer, or None: the files are written. Its answers are read from
        the raw pipe (a buffered read could take in the answer after it too, which ``_answer_waiting`` would
        then not see); ``Unavailable`` where the pipe ended."""
        why = None
        try:
            answer = json_files.read_message(child.stdout.raw)
        except (OSError, ValueError) as error:
            answer, why = None, f"{type(error).__name__}: {error}"
        if answer is None:
            self._gone(why or f"exit status {child.poll()}")  # polled only here: a system call per answer
            raise Unavailable(self._take_due())
        code, text = answer
        return OSError(code if code > 0 else None, text) if code else None

    def _take_due(self):
        due, self._due = self._due, []
        return due

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
            logger.info(
                "msprobe_runtime: no Python executable to start the writing process with (%r); the "
                "writer thread writes the dumps",
                executable,
            )
            raise Unavailable()
        try:
            import subprocess

            # -I -S: the standard library only (no site, no user paths); its own stderr is ours, so a crash shows
            self._child = subprocess.Popen(
                [executable, "-I", "-S", _SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True
            )
        except Exception as error:  # noqa: BLE001 - any failure to start means: write in this process
            self._failed = True
            logger.info(
                "msprobe_runtime: the writing process could not start (%s); the writer thread writes the dumps", error
            )
            raise Unavailable() from error
        self._capacity = _enlarge(self._child.stdin.fileno())
        return self._child

    def _gone(self, why):
        self._failed = True
        child, self._child = self._child, None
        logger.warning(
            "msprobe_runtime: the writing process ended (%s); the writer thread writes the dumps from now on", why
        )
        if child is not None:
            _close(child)

    def child(self):
        """The child serving now (None before it starts, or once gone): what it keeps dies with it."""
        return self._child

    def pid(self):
        """The child's process id while it serves, else None."""
        child = self._child
        return child.pid if child is not None and child.poll() is None else None

    def close(self):
        """End the child once it has written what it was given (interpreter exit; tests): the answers still due
        are not read (``Writer.wait`` reads them first)."""
        with self._lock:
            child, self._child = self._child, None
            self._due = []
        if child is not None:
            _close(child)


_PIPE_BYTES = 1 << 20  # Linux's default limit for an unprivileged process (/proc/sys/fs/pipe-max-size)


def _enlarge(fd):
    """Make the pipe to the child hold a step's message (Linux's F_SETPIPE_SZ); the bytes it holds, or 0
    where the size cannot be set or known (then nothing is posted: the writer thread sends every message)."""
    try:
        import fcntl

        return fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        return 0


def _answer_waiting(child):
    """Whether the child's next answer can be read now (an answer is one write of a few bytes: whole)."""
    import select

    try:
        return bool(select.select([child.stdout.fileno()], [], [], 0)[0])
    except (OSError, ValueError):
        return True  # let the read find out what is wrong


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


def _unlock_in_child():
    # the parent's writer thread may hold the lock at the fork; no thread of the child ever releases it
    global _shared_lock
    _shared_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_unlock_in_child)


# after every debugger's own atexit wait (registered later, so run earlier): the child has written everything
atexit.register(close_shared)
