"""The writer under a failing disk: the steps already written stay valid, no temporary file is left, one
clear message is given for the first failure of a kind, and collection resumes once writing works again."""
import errno
import glob
import json
import logging
import os

import pytest

torch = pytest.importorskip("torch")

from msprobe_runtime import PrecisionDebugger, writer  # noqa: E402


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

    monkeypatch.setattr(writer, "open", fake_open, raising=False)
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
