"""stack.json and construct.json are the same from step to step in a training loop: the writer sends each to
the writing process once while it does not change (``writer.Writer._encoded``), and every step's folder still
holds both, whole, also where the process dies and the writer thread writes a step sent that way."""

import json
import os
import signal

import pytest

torch = pytest.importorskip("torch")

from msprobe_runtime import PrecisionDebugger, json_files, writing_process  # noqa: E402


@pytest.fixture
def messages(monkeypatch):
    """Every message written to the writing process, decoded: ``[(directory, files)]``."""
    seen = []
    real_write = writing_process.WritingProcess._write

    def spy(self, child, message):
        seen.append(json_files.decode(message))
        return real_write(self, child, message)

    monkeypatch.setattr(writing_process.WritingProcess, "_write", spy)
    return seen


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x, extra=False):
        y = torch.relu(self.fc(x))
        return torch.sigmoid(y) if extra else y


def _step(debugger, model, extra=False):
    debugger.start(model)
    model(torch.ones(2, 3), extra).sum().backward()
    debugger.stop()
    debugger.step()
    debugger.wait()


def _files(dump, step, name):
    (path,) = [os.path.join(root, name) for root, _, names in os.walk(dump / f"step{step}") if name in names]
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _forms(message):
    """file name -> "plain" (name, object), "whole" (name, object, key) or "key" (name, None, key)."""
    _, files = message
    return {item[0]: "plain" if len(item) == 2 else ("key" if item[1] is None else "whole") for item in files}


def test_unchanged_files_are_sent_once_and_every_step_holds_them_whole(fresh_process, messages):
    dump = fresh_process
    debugger = PrecisionDebugger(dump_path=str(dump), level="mix")
    model = Block()
    for _ in range(4):
        _step(debugger, model)
    forms = [_forms(m) for m in messages]
    assert [f["dump.json"] for f in forms] == ["plain"] * 4
    # the first message starts the process; the second is the first its child is known to have read
    assert [f["stack.json"] for f in forms] == ["whole", "whole", "key", "key"]
    assert [f["construct.json"] for f in forms] == ["whole", "whole", "key", "key"]
    stacks = [_files(dump, step, "stack.json") for step in range(4)]
    constructs = [_files(dump, step, "construct.json") for step in range(4)]
    assert stacks[3] == stacks[0] and constructs[3] == constructs[0]
    names = {name for group in stacks[3].values() for name in group[0]}
    assert "Torch.relu.0.forward" in names and "Module.fc.Linear.forward.0" in names
    assert constructs[3]["Module.fc.Linear.forward.0"] is None
    assert set(_files(dump, 3, "dump.json")["data"]) >= names


def test_a_file_that_changed_is_sent_whole_again(fresh_process, messages):
    dump = fresh_process
    debugger = PrecisionDebugger(dump_path=str(dump), level="mix")
    model = Block()
    for extra in (False, False, False, True, True):  # one call more from step 3: a new entry, with its stack
        _step(debugger, model, extra)
    assert [_forms(m)["stack.json"] for m in messages] == ["whole", "whole", "key", "whole", "key"]
    for step, extra in ((2, False), (3, True), (4, True)):
        names = {name for group in _files(dump, step, "stack.json").values() for name in group[0]}
        assert ("Torch.sigmoid.0.forward" in names) is extra


def test_the_process_writes_a_kept_file_only_for_the_key_it_keeps(tmp_path):
    kept = {}
    stack = {"0": [["Torch.relu.0.forward"], ["File a.py, line 1, in f, \n relu(x)"]]}
    json_files.write_files(str(tmp_path / "a"), [("stack.json", stack, (7, 1)), ("dump.json", {"data": {}})], kept)
    json_files.write_files(str(tmp_path / "b"), [("stack.json", None, (7, 1)), ("dump.json", {"data": {}})], kept)
    assert json.loads((tmp_path / "b" / "stack.json").read_text()) == stack
    for key in ((7, 2), (8, 1)):  # another version of the file, another writer's
        with pytest.raises(KeyError):
            json_files.write_files(str(tmp_path / "c"), [("stack.json", None, key), ("dump.json", {})], kept)
    assert not (tmp_path / "c").exists()  # nothing of a step whose kept file is missing


def test_a_posted_step_sent_by_key_is_written_whole_when_the_process_dies(fresh_process, messages):
    dump = fresh_process
    debugger = PrecisionDebugger(dump_path=str(dump), level="mix")
    model = Block()
    pid = None
    try:
        for step in range(3):  # one loop: the same call sites every step
            if step == 2:
                pid = writing_process.shared().pid()
                os.kill(pid, signal.SIGSTOP)  # it cannot read what is posted next
            debugger.start(model)
            model(torch.ones(2, 3)).sum().backward()
            debugger.stop()
            debugger.step()
            if step < 2:
                debugger.wait()
        assert writing_process.shared()._due  # posted, not answered
        assert _forms(messages[-1])["stack.json"] == "key"
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
    debugger.wait()
    assert debugger._writer.errors == []
    assert _files(dump, 2, "stack.json") == _files(dump, 1, "stack.json")
    assert _files(dump, 2, "construct.json") == _files(dump, 1, "construct.json")
    assert "Torch.relu.0.forward" in _files(dump, 2, "dump.json")["data"]
