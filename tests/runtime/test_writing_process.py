"""The writing process's loop (``json_files.serve``): while steps keep coming it naps and looks at the pipe
rather than blocking in a read (so the training thread's write wakes nobody), and still writes every message,
those that come while it naps and those that come after it went back to blocking. The training thread posts a
step to it without waiting, also while it is behind (``WritingProcess.post``)."""

import io
import json
import os
import signal
import threading
import time

import pytest

from msprobe_runtime import json_files


def test_every_message_is_written_whether_it_came_while_napping_or_blocked(tmp_path, monkeypatch):
    monkeypatch.setattr(json_files, "_AWAKE", 0.2)
    looks = []
    real_await = json_files._await

    def counted(source, last):
        begin = time.monotonic()
        real_await(source, last)
        looks.append(time.monotonic() - begin)

    monkeypatch.setattr(json_files, "_await", counted)
    read_end, write_end = os.pipe()
    answers = io.BytesIO()
    source = os.fdopen(read_end, "rb", buffering=0)
    server = threading.Thread(target=json_files.serve, args=(source, answers))
    server.start()
    try:
        for step, pause in enumerate((0.0, 0.05, 0.5)):  # the last one after the awake window: a blocking read
            time.sleep(pause)
            os.write(
                write_end, json_files.encode((str(tmp_path / f"step{step}"), [("dump.json", {"data": {"step": step}})]))
            )
    finally:
        os.close(write_end)
        server.join(timeout=30)
        source.close()
    assert not server.is_alive()
    for step in range(3):
        assert json.loads((tmp_path / f"step{step}" / "dump.json").read_text()) == {"data": {"step": step}}
    message = answers.getvalue()
    replies = []
    while message:
        size = json_files._LENGTH.unpack(message[: json_files._LENGTH.size])[0] + json_files._LENGTH.size
        replies.append(json_files.decode(message[:size]))
        message = message[size:]
    assert replies == [(0, "")] * 3
    # the second message was looked for while napping (found well before the window's end); the third only after
    # the window ended, in the read that blocked (the end of input is read by that same kind of read)
    assert len(looks) == 3
    assert looks[0] < 0.15
    assert 0.15 <= looks[1] < 0.3


def test_a_step_is_posted_while_the_process_still_writes_an_earlier_one(fresh_process, posted):
    """The training thread posts a step while earlier ones are unanswered (the process reads or writes them
    still), as long as the pipe holds them all: nothing waits, and every step lands, in order."""
    torch = pytest.importorskip("torch")
    from msprobe_runtime import PrecisionDebugger, writing_process

    dump = fresh_process
    debugger = PrecisionDebugger(dump_path=str(dump), level="L1")
    x = torch.ones(3)
    pid = None
    try:
        for step in range(4):
            if step == 1:
                debugger.wait()  # the process runs
                pid = writing_process.shared().pid()
                os.kill(pid, signal.SIGSTOP)  # it reads nothing more until it goes on
            debugger.start()
            torch.relu(x)
            debugger.stop()
            debugger.step()
        assert posted[1:] == [True, True, True]
        assert len(writing_process.shared()._due) == 3
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
    debugger.wait()
    assert debugger._writer.errors == []
    written = sorted(int(p.parent.parent.name[4:]) for p in dump.glob("step*/*/dump.json"))
    assert written == [0, 1, 2, 3]


def test_a_pipe_that_select_cannot_watch_is_read_as_before(monkeypatch):
    """Where select cannot watch a pipe (Windows), the loop does not nap: it reads, and the read blocks."""

    def refuse(*args):
        raise OSError(10038, "not a socket")

    monkeypatch.setattr(json_files.select, "select", refuse)
    read_end, write_end = os.pipe()
    try:
        with os.fdopen(read_end, "rb", buffering=0) as source:
            begin = time.monotonic()
            json_files._await(source, time.monotonic())
            assert time.monotonic() - begin < 0.5
    finally:
        os.close(write_end)
