"""Stacks captured raw on the training thread and resolved on the writer's equal what frames said at the call."""
import sys

from msprobe_runtime import call_stacks


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
    (live, raw), = seen
    assert call_stacks.Resolver(skip_files=()).resolve(raw) == live[:call_stacks.MAX_FRAMES]


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
    assert call_stacks.Resolver(skip_files=()).resolve(runtime_frame + raw[:2]) == live[:1]
