"""The writer under a failing disk: the steps already written stay valid, no temporary file is left, one
clear message is given for the first failure of a kind, and collection resumes once writing works again.
Both where the writing process writes the files and where the writer thread does (no process, or it died)."""

import errno
import glob
import json
import logging
import os
import signal

import pytest

torch = pytest.importorskip("torch")

from msprobe_runtime import PrecisionDebugger, json_files, writing_process  # noqa: E402


class _Failing:
    """A file object whose writes fail as a full disk (or a revoked permission) makes them fail."""

    def __init__(self, handle, code):
        self.handle, self.code = handle, code

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()
        return False

    def write(self, text):
        self.handle.write(text[: len(text) // 2])  # some bytes land before the disk is full
        raise OSError(self.code, os.strerror(self.code))


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES])
def test_failing_writes_leave_the_written_steps_valid_and_nothing_behind(monkeypatch, tmp_path, caplog, code):
    failing = {"on": False}
    real_open = open

    def fake_open(path, *args, **kwargs):
        handle = real_open(path, *args, **kwargs)
        return _Failing(handle, code) if failing["on"] else handle

    # the writer thread's own writing (the files are written in this process, where the fault is injected)
    monkeypatch.setenv("MSPROBE_WRITER_PROCESS", "0")
    writing_process.close_shared()
    monkeypatch.setattr(json_files, "open", fake_open, raising=False)
    dump = tmp_path / "dump"
    debugger = PrecisionDebugger(dump_path=str(dump), level="L1")
    x = torch.ones(3)
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        for step in range(5):
            failing["on"] = step in (1, 2, 3)  # the disk fills after step 0, and is freed for step 4
            debugger.start()
            torch.relu(x)
            debugger.stop()
            debugger.step()
            debugger.wait()
    leftovers = [p for p in glob.glob(str(dump / "**" / "*"), recursive=True) if ".tmp" in os.path.basename(p)]
    leftovers += glob.glob(str(dump / "**" / ".*"), recursive=True)
    assert leftovers == []
    for step in (0, 4):
        [path] = glob.glob(str(dump / f"step{step}" / "*" / "dump.json"))
        with open(path) as handle:
            assert "Torch.relu.0.forward" in json.load(handle)["data"]
    for step in (1, 2, 3):
        assert glob.glob(str(dump / f"step{step}" / "*" / "dump.json")) == []
    failures = [r for r in caplog.records if "writing the dump of" in r.getMessage()]
    assert len(failures) == 1 and failures[0].levelno == logging.ERROR
    assert os.strerror(code) in failures[0].getMessage()
    assert "works again" in caplog.text
    assert len(debugger._writer.errors) == 3


def _run_steps(debugger, steps, before_step=lambda step: None):
    x = torch.ones(3)
    for step in range(steps):
        before_step(step)
        debugger.start()
        torch.relu(x)
        debugger.stop()
        debugger.step()
        debugger.wait()


def _written_steps(dump):
    return sorted(
        int(os.path.basename(os.path.dirname(os.path.dirname(p)))[4:])
        for p in glob.glob(str(dump / "step*" / "*" / "dump.json"))
    )


def test_the_writing_process_writes_the_files_and_reports_its_failures(fresh_process, caplog):
    """A failure in the writing process (here a step folder that cannot be made: a file is in its place) is
    the writer thread's failure, said once, and later steps are written again."""
    dump = fresh_process
    debugger = PrecisionDebugger(dump_path=str(dump), level="L1")

    def block(step):
        if step == 1:
            for blocked in (1, 2, 3):
                (dump / f"step{blocked}").write_text("not a folder")
        if step == 4:
            for blocked in (1, 2, 3):
                (dump / f"step{blocked}").unlink()

    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        _run_steps(debugger, 5, block)
    assert writing_process.shared().pid() is not None  # the process wrote them, and serves on
    assert _written_steps(dump) == [0, 4]
    failures = [r for r in caplog.records if "writing the dump of" in r.getMessage()]
    assert len(failures) == 1 and failures[0].levelno == logging.ERROR
    assert "step1" in failures[0].getMessage()
    assert "works again" in caplog.text
    assert len(debugger._writer.errors) == 3 and all(isinstance(e, OSError) for e in debugger._writer.errors)
    leftovers = [p for p in glob.glob(str(dump / "**" / ".*"), recursive=True)]
    assert leftovers == []


def test_a_writing_process_that_dies_loses_no_step(fresh_process, caplog):
    dump = fresh_process
    debugger = PrecisionDebugger(dump_path=str(dump), level="L1")

    def kill(step):
        if step == 2:
            os.kill(writing_process.shared().pid(), signal.SIGKILL)

    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        _run_steps(debugger, 4, kill)
    assert _written_steps(dump) == [0, 1, 2, 3]
    assert debugger._writer.errors == []
    assert len([r for r in caplog.records if "writing process ended" in r.getMessage()]) == 1
    assert writing_process.shared().pid() is None


def test_without_the_writing_process_the_writer_thread_writes(monkeypatch, tmp_path):
    monkeypatch.setenv("MSPROBE_WRITER_PROCESS", "0")
    writing_process.close_shared()
    dump = tmp_path / "dump"
    _run_steps(PrecisionDebugger(dump_path=str(dump), level="L1"), 2)
    assert _written_steps(dump) == [0, 1]
    assert writing_process.shared().pid() is None


@pytest.mark.parametrize("enabled", [True, False])
def test_the_flush_leaves_the_garbage_collector_as_it_found_it(tmp_path, enabled):
    """The training thread prepares a host-only step with the collector paused; the user's setting stays."""
    import gc

    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1")
    paused = []
    real_files = debugger._writer._step_files

    def watching(job):
        paused.append(gc.isenabled())
        return real_files(job)

    debugger._writer._step_files = watching
    was = gc.isenabled()
    try:
        if not enabled:
            gc.disable()
        _run_steps(debugger, 2)
        assert gc.isenabled() is enabled
    finally:
        if was:
            gc.enable()
    assert paused == [False, False]  # prepared on the training thread, with the collector paused
    assert _written_steps(tmp_path / "dump") == [0, 1]


def test_a_program_that_is_not_python_is_never_started_as_the_writing_process(monkeypatch, fresh_process):
    """A frozen application or a program that embeds Python has itself as ``sys.executable``: started with the
    writing process's arguments it would run something else, so the writer thread writes instead."""
    import sys

    started = []
    import subprocess

    real_popen = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a) or real_popen(*a, **k))
    monkeypatch.setattr(sys, "executable", "/bin/true")
    _run_steps(PrecisionDebugger(dump_path=str(fresh_process), level="L1"), 2)
    assert _written_steps(fresh_process) == [0, 1]
    assert started == [] and writing_process.shared().pid() is None


def test_steps_posted_by_the_training_thread_are_written_in_order(fresh_process, posted):
    """A prepared step is posted to the writing process at the flush, without the writer thread, where that
    cannot block; its answer is read later (the next post, or wait). Every step lands, in order."""
    dump = fresh_process
    debugger = PrecisionDebugger(dump_path=str(dump), level="L1")
    _run_steps(debugger, 1)  # the first step starts the process, through the writer thread
    x = torch.ones(3)
    for _ in range(3):  # no wait: a step is posted, or queued behind what the writer thread still has
        debugger.start()
        torch.relu(x)
        debugger.stop()
        debugger.step()
    debugger.wait()
    assert _written_steps(dump) == [0, 1, 2, 3]
    assert posted[:2] == [False, True]  # step 0: no process yet; step 1, after a wait: posted
    assert writing_process.shared().collect() == []  # wait read every answer
    assert debugger._writer.errors == []


def test_a_posted_step_whose_process_dies_unanswered_is_written_anyway(fresh_process, caplog):
    dump = fresh_process
    debugger = PrecisionDebugger(dump_path=str(dump), level="L1")
    _run_steps(debugger, 1)  # starts the process
    pid = writing_process.shared().pid()
    os.kill(pid, signal.SIGSTOP)  # it cannot read what is posted next
    try:
        x = torch.ones(3)
        debugger.start()
        torch.relu(x)
        debugger.stop()
        debugger.step()
        assert writing_process.shared()._due  # posted, not answered
    finally:
        os.kill(pid, signal.SIGKILL)
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        debugger.wait()
    assert _written_steps(dump) == [0, 1]
    assert debugger._writer.errors == []
    assert len([r for r in caplog.records if "writing process ended" in r.getMessage()]) == 1


@pytest.mark.parametrize("failing", ["take", "prepare"])
def test_a_step_sent_unprepared_does_not_cost_the_steps_after_it(fresh_process, monkeypatch, caplog, failing):
    """A step whose statistics take or whose preparation fails on the training thread goes to the writer thread
    unprepared. The next step used to be prepared at once and take the keys of the kept files (stack.json,
    construct.json) first, so the earlier step was sent by a key the writing process did not hold yet and was
    lost: 3 of 8 steps. Every step is written now, with no wait between steps."""
    from msprobe_runtime import statistics
    from msprobe_runtime.writer import Writer

    dump = fresh_process
    debugger = PrecisionDebugger(dump_path=str(dump), level="L1")
    _run_steps(debugger, 1)  # the writing process started
    calls = {"n": 0}
    if failing == "take":
        real = statistics.StatBuffer.take

        def flaky(self):
            calls["n"] += 1
            if calls["n"] % 2 == 1:
                real(self)
                raise RuntimeError("a take that fails")
            return real(self)

        monkeypatch.setattr(statistics.StatBuffer, "take", flaky)
    else:
        real = Writer.prepare

        def flaky(self, job):
            calls["n"] += 1
            if calls["n"] % 2 == 1:
                raise RuntimeError("a prepare that fails")
            return real(self, job)

        monkeypatch.setattr(Writer, "prepare", flaky)
    x = torch.ones(3)
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        for step in range(1, 9):
            debugger.start()
            torch.relu(x)
            if step % 2:  # another stack.json every step: each step sends its kept files under a new key
                torch.tanh(x)
            debugger.stop()
            debugger.step()
        debugger.wait()
    assert _written_steps(dump) == list(range(9))
    assert debugger._writer.errors == [] and "not written" not in caplog.text
    for step in range(9):
        [path] = glob.glob(str(dump / f"step{step}" / "*" / "dump.json"))
        with open(path) as handle:
            names = list(json.load(handle)["data"])
        assert names == ["Torch.relu.0.forward"] + (["Torch.tanh.0.forward"] if step % 2 else [])


def test_a_count_that_is_no_number_is_written_null_and_the_record_kept():
    # a kernel's counts are sums of whole numbers; numbers it never wrote (an arena's memory) can be NaN or infinite,
    # which int() raises for: the step's whole file failed on one record (seen with the fake Triton driver)
    record = ("torch.float32", (2,), False, False, (1.0, 0.0, 0.5, 1.0, float("nan"), float("inf")))
    out = json_files.native_json(record)
    assert out["NaN_count"] is None and out["Inf_count"] is None and out["Max"] == 1.0
    counted = json_files.native_json(record[:4] + ((1.0, 0.0, 0.5, 1.0, 2.0, 0.0),))
    assert (counted["NaN_count"], counted["Inf_count"]) == (2, 0) and type(counted["NaN_count"]) is int
