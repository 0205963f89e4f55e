"""Stacks captured raw on the training thread and resolved on the writer's equal what frames said at the call."""

import os
import sys

import pytest

from msprobe_runtime import call_stacks

RUNTIME = os.path.dirname(os.path.abspath(call_stacks.__file__)) + os.sep


def _live(frame):
    """(file, line, function) of every frame from ``frame`` outwards, read while they run."""
    out = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return tuple(out)


def _nested(depth, seen):
    if depth == 0:
        frame = sys._getframe()
        seen.append((_live(frame), call_stacks.capture(frame)))
        return
    if depth % 3 == 0:
        [_nested(depth - 1, seen) for _ in range(1)]  # a comprehension's own frame (3.11) in the chain
    else:
        _nested(depth - 1, seen)


def test_resolved_lines_equal_the_live_frames():
    seen = []
    _nested(20, seen)
    ((live, raw),) = seen
    assert call_stacks.Resolver(skip_files=()).resolve(raw) == live[: call_stacks.MAX_FRAMES]


def test_same_site_twice_captures_equal_raw_stacks():
    seen = []
    for _ in range(2):
        _nested(4, seen)
    assert seen[0][1] == seen[1][1]


def test_runtime_and_skipped_files_are_dropped_and_the_rest_capped():
    seen = []
    _nested(3, seen)
    live, raw = seen[0]
    here = __file__
    resolved = call_stacks.Resolver(skip_files=(here,)).resolve(raw)
    assert resolved == tuple(frame for frame in live if frame[0] != here)
    deep = []
    _nested(call_stacks.MAX_FRAMES + 10, deep)
    assert len(call_stacks.Resolver(skip_files=()).resolve(deep[0][1])) == call_stacks.MAX_FRAMES
    runtime_frame = (call_stacks.capture.__code__, 0)
    assert call_stacks.Resolver(skip_files=()).resolve((runtime_frame + raw[0][:2], None)) == live[:1]


MODEL = """
import torch
from torch import nn


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return __msprobe__.call("Functional.relu", torch.relu, self.fc(x))


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.seq = nn.Sequential(nn.Linear(4, 4), Inner())

    def forward(self, x):
        y = __msprobe__.call("Torch.sigmoid", torch.sigmoid, self.inner(x))
        return helper(self.seq(y))


def helper(y):
    return __msprobe__.call("Torch.tanh", torch.tanh, y)
"""


def _stacks(tmp_path, name, monkeypatch=None):
    import glob
    import json
    import os

    import torch

    import msprobe_runtime
    from msprobe_runtime import PrecisionDebugger

    namespace = {"__msprobe__": msprobe_runtime, "__name__": "anchored_model"}
    exec(compile(MODEL, "anchored_model.py", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Outer"]()
    debugger = PrecisionDebugger(dump_path=str(tmp_path / name), task="statistics", level="mix")
    debugger.start(model)
    model(torch.randn(2, 4)).sum().backward()
    debugger.stop()
    debugger.wait()
    [directory] = glob.glob(os.path.join(str(tmp_path / name), "step0", "*"))
    with open(os.path.join(directory, "stack.json")) as handle:
        return {entry: lines for names, lines in json.load(handle).values() for entry in names}


def _native_capture():
    from msprobe_runtime import native_stats

    made = call_stacks.capture_function(native_stats.load())
    if made is call_stacks.capture:
        pytest.skip("the native op has no stack capture here (no compiler, or Python before 3.11)")
    return made


@pytest.mark.parametrize("how", ["python", "native"])
def test_stacks_through_module_anchors_equal_full_walks(tmp_path, monkeypatch, how):
    """A collector's stacks, each walked only to its module call's anchor (by the Python capture, or the
    native op's), equal the same run's stacks walked whole by the Python capture."""
    runs, through_anchor = {}, []
    capture = call_stacks.capture
    chosen = _native_capture() if how == "native" else capture

    def spy(frame, anchor=None, outer=None, *limit):
        through_anchor.append(anchor is not None)
        return chosen(frame, anchor, outer, *limit)

    for name in ("anchored", "walked"):
        if name == "anchored":
            monkeypatch.setattr(call_stacks, "capture_function", lambda native=None: spy)
        else:
            monkeypatch.setattr(call_stacks.Anchors, "capture", lambda self, frame: capture(frame))
        runs[name] = _stacks(tmp_path, name)  # one line: the outermost frames are the same
    assert through_anchor.count(True) > through_anchor.count(False)  # the anchors were used
    anchored = runs["anchored"]
    assert anchored == runs["walked"]
    # the calls inside nested modules, and a module inside a Sequential, are all there, with our frames gone
    for name in (
        "Functional.relu.1.forward",
        "Torch.tanh.0.forward",
        "Module.seq.1.Inner.forward.0",
        "Functional.linear.1.forward",
    ):
        assert anchored[name] and not any(line.startswith(f"File {RUNTIME}") for line in anchored[name]), name
    assert "in helper" in anchored["Torch.tanh.0.forward"][0]
    assert "in forward" in anchored["Functional.relu.1.forward"][0]


@pytest.mark.parametrize("how", ["python", "native"])
def test_a_stack_captured_again_is_the_same_pair(how):
    """Equal stacks are one object (what the resolver's tables go by): the same instruction, walked whole or to
    an anchor, gives back the pair it gave before; another instruction or another outer part does not."""
    capture = _native_capture() if how == "native" else call_stacks.capture
    here = sys._getframe()
    outer, other = ("outer", None), ("other", None)
    rounds = []
    for _ in range(2):
        rounds.append(
            [capture(here, None, None, 256), capture(here, here, outer, 256), capture(here, here, other, 256)]
        )
    first, second = rounds
    assert all(a is b for a, b in zip(first, second))
    whole, anchored, elsewhere = first
    assert anchored[1] is outer and elsewhere[1] is other and anchored is not elsewhere and whole[1] is None
    again = capture(here, None, None, 256)  # another instruction of this frame: another pair, the same code
    assert again is not whole and again[0][0] is whole[0][0] and again[0][1] != whole[0][1]


def test_native_capture_makes_the_python_captures_pairs():
    """The native op's capture gives the very pair the Python one gives: the same code objects and offsets,
    stopping at the anchor (with its outer part) or at the limit (with None), from a frame or from None."""
    native = _native_capture()
    frame = sys._getframe().f_back  # the caller's: its offset stays put while both capture it
    outer = ("outer frames", None)
    for args in (
        (frame,),
        (frame, frame, outer),
        (frame, frame.f_back, outer),
        (None,),
        (frame, None, None, 2),
        (frame, frame.f_back.f_back, outer, 1),
    ):
        full = args + (None, None, 256)[len(args) - 1 :]
        assert native(*full) == call_stacks.capture(*args), args
    made = native(frame, frame, outer, 256)
    assert made[1] is outer and all(a is b for a, b in zip(made[0], call_stacks.capture(frame, frame, outer)[0]))
    with pytest.raises(TypeError):
        native("not a frame", None, None, 256)


def test_equal_stacks_resolve_to_one_tuple_whatever_their_outer_parts():
    """Two module calls made from the same place have outer parts that are different objects with the same
    frames; their stacks resolve to one tuple, which stack.json's grouping (by id) relies on, also after the
    resolver's tables start over."""
    seen = []
    _nested(3, seen)
    live, (inner, _) = seen[0]
    outer = call_stacks.capture(sys._getframe())
    twin = (tuple(list(outer[0])), outer[1])  # equal content, another object
    resolver = call_stacks.Resolver(skip_files=())
    first = resolver.resolve((inner, outer))
    alone = call_stacks.Resolver(skip_files=())
    assert first == (alone.resolve((inner, None)) + alone.resolve(outer))[: call_stacks.MAX_FRAMES]
    assert first[: len(live)] == live[: call_stacks.MAX_FRAMES]
    assert resolver.resolve((tuple(list(inner)), twin)) is first
    resolver._LIMIT = 0  # trim starts every table over
    resolver.trim()
    again = resolver.resolve((inner, twin))
    assert again == first and resolver.resolve((inner, outer)) is again
