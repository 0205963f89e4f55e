"""The writer thread: turns a flushed step into dump.json, stack.json and construct.json, atomically.

The training thread only enqueues; this thread waits for the device-to-host copy, resolves statistics slots
into numbers, formats call stacks and hands the files to the writing process (``writing_process``), which
encodes and writes each through a temporary file and ``os.replace``, so a reader never sees a half-written
file and a crash loses at most the step not yet flushed. Where no writing process serves, this thread writes
them (``json_files``).

A step whose numbers are all on the host already (CPU tensors, no checksum to compute) is prepared by the
training thread itself at the flush (``prepare``): done in one go there, it costs the training thread less than
the same Python work done here, where every torch op that released the GIL had to wait to get it back.
"""

from __future__ import annotations

import gc
import itertools
import linecache
import logging
import os
import queue
import sys
import threading
import weakref

from . import json_files, writing_process
from .call_stacks import Resolver
from .dump_names import is_plain_file_name
from .records import device_numbers, resolve

logger = logging.getLogger("msprobe_runtime")
_WRITER_SWITCH_INTERVAL = 0.0002
_KEPT = frozenset({"stack.json", "construct.json"})  # files that stay the same from step to step
_STREAMS = itertools.count(1)  # one per writer: its kept files are its own in the writing process (shared)
_VERSIONS = itertools.count(1)
_KEYS_HELD = 64  # kept files whose objects a writer holds: the messages not yet answered may name them


def format_stack(frames):
    """msprobe's stack lines: ``File {path}, line {n}, in {func}, \\n {source}``, innermost first."""
    lines = []
    for filename, lineno, funcname in frames:
        source = linecache.getline(filename, lineno).strip()
        lines.append(f"File {filename}, line {lineno}, in {funcname}, \n {source}")
    return lines


class StepJob:
    """Everything the writer needs for one flush of one step, snapshotted on the training thread."""

    __slots__ = ("directory", "header", "data", "stacks", "construct", "tensors", "plain", "arenas", "numbers")

    def __init__(self, directory, header, data, stacks, construct, tensors, plain=False, arenas=()):
        self.directory = directory
        self.header = header
        self.data = data
        self.stacks = stacks
        self.construct = construct
        self.tensors = tensors  # [(file name, device tensor clone)] for task=tensor
        self.plain = plain  # no TensorRecord in ``data``: its entries are written as they are
        # the Triton arenas closed at this flush (StatBuffer.closed_arenas), whose numbers device records name
        self.arenas = arenas
        self.numbers = None  # theirs and the last step's, once read (``Writer._step_files``: the same if tried again)


class PreparedJob:
    """A step whose files the training thread made already (``Writer.prepare``): only writing is left."""

    __slots__ = ("directory", "files", "message", "tensors", "numbers")

    def __init__(self, directory, files, message, tensors, numbers=None):
        self.directory = directory
        self.files = files  # [(file name, JSON-ready object)], in writing order; None: in ``message``
        self.message = message  # the same for the writing process (json_files.encode), or None
        self.tensors = tensors
        self.numbers = numbers  # the device records' numbers of ``files`` (records.device_numbers)


class Writer:
    """One background thread per debugger; jobs are written in order."""

    def __init__(self):
        self._queue = queue.Queue()
        self._thread = None
        self._lock = threading.Lock()
        _LIVE.add(self)
        self.errors = []  # every failed step's error; the first of a kind is logged, loudly, the rest counted
        self._reported = set()
        self._failing = False
        self._resolver = None  # call_stacks.Resolver, made at the first write (torch is imported by then)
        self._formatted = {}  # id(frames) -> (frames, stack.json's lines), across steps (the same sites come back)
        self._files_lock = threading.Lock()  # the resolver and its caches: this thread, or the training one
        self._stacks = None  # (the raw stacks of the last step written, its stack.json object)
        # the device records' numbers of the last step made into files (records.device_numbers): sent again with the
        # next step's, whose records may name an arena this flush closed (one made as the flush ran, its entry
        # stored after the step's were taken)
        self._last_numbers = {}
        self._stream = next(_STREAMS)  # this writer's files kept by the writing process: (stream, version)
        self._sent = {}  # file name -> (object, key, child) last sent whole to the writing process
        self._keys = {}  # key -> object, the last few sent whole: to write a message here (Unavailable)
        self._report_lock = threading.Lock()  # errors: this thread, or a training thread reading posts' answers
        # steps queued for this thread to make into files: while there are any, no later step may be made into
        # files elsewhere (``may_prepare``), since a kept file is sent by key to the writing process in the
        # order messages are made, and they must be made in the order they are written
        self._unprepared = 0

    def forget_parent_thread(self):
        """In a child forked from the process this writer serves: no thread of the parent runs here, so the
        handle of its writer thread, its queue (the parent writes what it holds) and any lock it may have held at
        the fork are dropped; the child's steps get a thread of their own. Else the child's ``wait()`` waits on
        the parent's queue forever (tests/runtime/test_process_life.py)."""
        self._queue = queue.Queue()
        self._thread = None
        self._lock = threading.Lock()
        self._files_lock = threading.Lock()
        self._report_lock = threading.Lock()
        self._unprepared = 0
        self._sent = {}  # sent to the parent's writing process; the child's has none of them

    def submit(self, job):
        """Write ``job`` in the background. A prepared step (its message made, no tensor files) is posted to
        the writing process here when that cannot block (``WritingProcess.post``) and nothing is queued before
        it; everything else goes to the writer thread, in order."""
        if type(job) is PreparedJob and job.message is not None and not job.tensors and self._idle():
            try:
                if self._post(job):
                    return
            except Exception as error:  # never into the training loop: the writer thread takes the job
                logger.debug("msprobe_runtime: posting a step failed (%s)", error)
        self.submit_to_thread(job)

    def may_prepare(self):
        """Whether a step may be made into its files now, on the calling thread (``prepare``): not while an
        earlier step waits for this thread to make its files (a failed statistics take or prepare sends one
        here unprepared; the next step, prepared first, took its kept files' keys: tests/runtime/
        test_writer_faults.py)."""
        return self._unprepared == 0

    def _idle(self):
        # no job queued or being written (a stale answer only sends this job the slow way)
        return self._queue.unfinished_tasks == 0

    def _post(self, job):
        try:
            posted, answers = writing_process.shared().post(self, job.directory, job.message)
        except writing_process.Unavailable as gone:
            self._write_unanswered(gone.unwritten, queue=True)
            return False
        _report(answers)
        return posted

    def wait(self):
        """Block until every submitted job is on disk (tests and interpreter exit call this)."""
        if self._thread is not None:
            self._queue.join()
        try:
            answers = writing_process.shared().collect()
        except writing_process.Unavailable as gone:
            self._write_unanswered(gone.unwritten)
            return
        _report(answers)

    def _write_unanswered(self, unwritten, queue=False):
        """Steps posted to a writing process that died before it answered: written by the writer thread
        (``queue``: the training thread found them) or here, each reported to the writer that posted it."""
        for owner, directory, message in unwritten:
            if queue:
                owner.submit_to_thread(PreparedJob(directory, None, message, ()))
                continue
            try:
                owner.write_files(directory, None, message=message)
            except Exception as error:  # noqa: BLE001 - reported as the writer thread reports it
                owner._failed(directory, error)
            else:
                owner._written(directory)

    def submit_to_thread(self, job):
        """Queue ``job`` for the writer thread (started on first use)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="msprobe-runtime-writer", daemon=True)
            self._thread.start()
        if type(job) is StepJob:
            with self._lock:
                self._unprepared += 1
        self._queue.put(job)

    def _run(self):
        while True:
            job = self._queue.get()
            # While this thread holds the GIL the training thread waits for the switch interval (5 ms by
            # default) after each GIL-releasing torch op; a short interval while writing keeps that wait short.
            interval = sys.getswitchinterval()
            sys.setswitchinterval(min(interval, _WRITER_SWITCH_INTERVAL))
            try:
                self._write(job)
                self._written(job.directory)
            except Exception as error:  # never let the writer die, nor the training loop see it
                self._failed(job.directory, error)
            finally:
                sys.setswitchinterval(interval)
                if type(job) is StepJob:
                    with self._lock:
                        self._unprepared -= 1
                self._queue.task_done()

    def _written(self, directory):
        with self._report_lock:
            if not self._failing:
                return
            self._failing = False
            logger.warning(
                "msprobe_runtime: writing dumps works again (%s); %d step(s) before it were not written",
                directory,
                len(self.errors),
            )

    def _failed(self, directory, error):
        """One loud message for the first failure of a kind (a full disk, a permission): later steps are still
        tried, each on its own, so collection resumes once the cause is gone; their failures are counted."""
        with self._report_lock:
            self.errors.append(error)
            self._failing = True
            kind = (type(error).__name__, getattr(error, "errno", None))
            if kind in self._reported:
                return
            self._reported.add(kind)
        logger.error(
            "msprobe_runtime: writing the dump of %s failed: %s. Steps written before it are complete; "
            "this step is not written (no partial file is left), and each later step is tried again "
            "(further failures of this kind are not reported one by one).",
            directory,
            error,
        )

    def _lines(self, frames):
        # by id: the resolver gives equal stacks as one tuple, which this table holds alive
        known = self._formatted.get(id(frames))
        if known is None or known[0] is not frames:
            if len(self._formatted) >= 100_000:
                self._formatted.clear()
            known = self._formatted[id(frames)] = (frames, format_stack(frames))
        return known[1]

    def prepare(self, job):
        """``job`` (a StepJob whose numbers are on the host) made into its files, on the calling thread.

        With the garbage collector paused: the files are thousands of new lists and dicts, which die as soon
        as they are marshalled; a collection in between would move them, and every record of the step that
        they point to, to an older generation, and bring the next full collection nearer."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            files, numbers = self._step_files(job)
            message = self._encoded(job.directory, files, numbers)
            if message is not None:
                # the message alone (the files are read back from it if the process cannot serve); the files
                # are freed here, before the collector runs again, and its counts go back to where they were
                files = numbers = None
            return PreparedJob(job.directory, files, message, job.tensors, numbers)
        finally:
            if enabled:
                gc.enable()

    def _write(self, job):
        """A step's files, dump.json last: a step folder with a dump.json holds the whole step."""
        if type(job) is PreparedJob:
            self.write_files(job.directory, job.files, job.tensors, message=job.message, numbers=job.numbers)
        else:
            files, numbers = self._step_files(job)
            self.write_files(job.directory, files, job.tensors, numbers=numbers)

    def _step_files(self, job):
        """The step's files, and the numbers its device records name (``records.device_numbers``)."""
        # its own numbers read before the lock: on a GPU that waits for their copy to the host
        own = device_numbers(job.arenas) if job.arenas and job.numbers is None else {}
        # stack.json groups forward entries that share one call stack, as msprobe does; the training thread
        # captured each raw (call_stacks.capture), and the resolver remembers stacks it has seen
        with self._files_lock:
            numbers = job.numbers
            if numbers is None:  # once a job: a step whose preparing failed is made again on the writer thread
                numbers = job.numbers = {**self._last_numbers, **own}
                self._last_numbers = own
            if self._resolver is None:
                self._resolver = Resolver()
            # the same entries at the same call sites as the step before (a training loop's steps): its
            # stack.json, the same object, which the writing process is not sent again (``_encoded``); the
            # raw stacks of a call site are one object from step to step (call_stacks.capture), so this
            # comparison costs little more than a look at each
            if self._stacks is not None and self._stacks[0] == job.stacks:
                stack = self._stacks[1]
            else:
                self._resolver.trim()
                stack_of = self._resolver.resolve
                groups = {}  # by id: equal stacks are one tuple (Resolver)
                for name, raw in job.stacks.items():
                    frames = stack_of(raw)
                    group = groups.get(id(frames))
                    if group is None:
                        group = groups[id(frames)] = (frames, [])
                    group[1].append(name)
                stack = {str(i): [names, self._lines(frames)] for i, (frames, names) in enumerate(groups.values())}
                self._stacks = (job.stacks, stack)
        dump = dict(job.header)
        if job.tensors or job.header.get("task") == "tensor":
            dump["dump_data_dir"] = os.path.join(job.directory, "dump_tensor_data")
        # entries of plain data and native records only need no walk here (the writing process expands them)
        dump["data"] = job.data if job.plain else {name: resolve(entry) for name, entry in job.data.items()}
        return [("stack.json", stack), ("construct.json", job.construct), ("dump.json", dump)], numbers

    def last_numbers(self):
        """The numbers of the device records of the last step made into files (a debug.json written after it)."""
        return self._last_numbers

    def write_files(self, directory, files, tensors=(), tensor_dir=None, message=None, numbers=None):
        """The tensors of task ``tensor`` (here: torch), then the JSON files in order (the writing process);
        ``numbers``: those that the files' device records name (``records.device_numbers``)."""
        if tensors:
            import torch

            tensor_dir = tensor_dir or os.path.join(directory, "dump_tensor_data")
            os.makedirs(tensor_dir, exist_ok=True)
            for name, tensor in tensors:
                if not is_plain_file_name(name):
                    raise ValueError(f"tensor file name {name!r} is not one name in {tensor_dir}")
                path = os.path.join(tensor_dir, name)
                fd, tmp = json_files.exclusive_temp(path)
                try:
                    with open(fd, "wb") as handle:
                        torch.save(tensor.to("cpu"), handle)
                    os.replace(tmp, path)
                except BaseException:
                    json_files.remove_quietly(tmp)
                    raise
        if message is None:
            message = self._encoded(directory, files, numbers)
        if message is not None:
            try:
                answers, error = writing_process.shared().send(message)
            except writing_process.Unavailable as gone:
                self._write_unanswered(gone.unwritten)  # posted before this one: written first, in order
            else:
                _report(answers)
                if error is not None:
                    raise error
                return
        if files is None:
            job = json_files.decode(message)
            directory, files = job[:2]
            numbers = job[2] if len(job) > 2 else None
            files = [self._whole(item) for item in files]
        json_files.write_files(directory, files, numbers=numbers)

    def _encoded(self, directory, files, numbers=None):
        """The files as the writing process reads them, with ``numbers`` (their device records'), or None where
        marshal cannot hold them (a type it does not know; never expected, as records are plain data) or no process
        serves: this thread writes them.
        A file of ``_KEPT`` equal to the one this writer last sent the same child goes as its key only
        (``json_files.write_files``: the child writes the text it kept)."""
        process = writing_process.shared()
        if not process.serves():
            return None
        child = process.child()  # None before it starts: the first message it reads has every file whole
        sent, whole = [], []
        with self._files_lock:
            for name, obj in files:
                if name not in _KEPT:
                    sent.append((name, obj))
                    continue
                last = self._sent.get(name)
                if (
                    last is not None and child is not None and last[2] is child and (last[0] is obj or last[0] == obj)
                ):  # plain data: no user type is asked
                    sent.append((name, None, last[1]))
                    continue
                key = (self._stream, next(_VERSIONS))
                sent.append((name, obj, key))
                whole.append((name, obj, key))
            try:
                message = json_files.encode((directory, sent, numbers) if numbers else (directory, sent))
            except ValueError:
                return None
            for name, obj, key in whole:  # only once the message exists: the child is sent what it keeps
                self._sent[name] = (obj, key, child)
                self._keys[key] = obj
                while len(self._keys) > _KEYS_HELD:
                    del self._keys[next(iter(self._keys))]
        return message

    def _whole(self, item):
        """A file of a message that this thread writes (its process gone) as ``(name, object)``."""
        if len(item) == 2:
            return item
        name, obj, key = item
        if obj is None:
            with self._files_lock:
                obj = self._keys.get(tuple(key))
            if obj is None:
                raise KeyError(f"{name} sent earlier ({key}) is no longer held")
        return name, obj


_LIVE = weakref.WeakSet()  # every writer of this process: a forked child resets them all


def _forget_parent_threads():
    for writer in list(_LIVE):
        writer.forget_parent_thread()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_forget_parent_threads)


def _report(answers):
    """The answers of steps posted to the writing process, each to the writer that posted it."""
    for owner, directory, error in answers:
        if error is None:
            owner._written(directory)
        else:
            owner._failed(directory, error)
