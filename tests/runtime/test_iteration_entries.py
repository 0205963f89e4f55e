"""The entries a rewritten loop, unpacking or builtin call goes through (``iterate``, ``iterate_unpacked``,
``builtin``) change nothing the program sees: with no debugger they hand back their argument itself, and while
collecting, the same values and the same errors as the plain program, on tensors and on anything else.
Coverage (what they record) is tests/runtime/test_window_coverage.py's."""

import builtins

import pytest

torch = pytest.importorskip("torch")

from msprobe_rewrite.api import rewrite_source  # noqa: E402
from msprobe_runtime import PrecisionDebugger, shims  # noqa: E402

PROGRAM = b'''
import torch


class Rows:
    """Iterable whose __iter__ counts: called once per loop, as in the plain program."""
    def __init__(self):
        self.iterations = 0

    def __iter__(self):
        self.iterations += 1
        return iter([(1, 2), (3, 4)])


def loops(t, rows):
    seen = []
    for row in t:
        seen.append(row.clone())
    for a, b in rows:
        seen.append((a, b))
    for h, w in t:
        seen.append(h + w)
    first, *rest = t
    seen.extend([first, *rest])
    seen.append(sum(x * x for x in t))
    seen.append(sorted(t[0]))
    return seen


def start(debugger, model):
    debugger.start(model)  # from rewritten code, as ``msprobe-rewrite run`` starts it


def failure(callable_):
    try:
        callable_()
    except Exception as error:
        return type(error).__name__, str(error)
    return None


def errors(t):
    def unpack_too_many():
        a, b = t

    def unpack_too_few():
        a, b, c, d = t

    def loop_unpack_row():
        for a, b, c in t:
            pass

    def scalar():
        for x in t[0, 0]:
            pass

    return [failure(unpack_too_many), failure(unpack_too_few), failure(loop_unpack_row), failure(scalar)]
'''


def _modules():
    plain, rewritten = {}, {}
    exec(compile(PROGRAM, "plain.py", "exec"), plain)
    exec(compile(rewrite_source(PROGRAM), "rewritten.py", "exec"), rewritten)
    return plain, rewritten


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_with_no_debugger_each_entry_hands_back_its_argument():
    t = torch.ones(2, 2)
    items = iter([1])
    assert shims.iterate(t) is t and shims.iterate_unpacked(items) is items
    assert shims.builtin(zip) is zip and shims.builtin(sum) is builtins.sum


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_collecting_the_rewritten_program_sees_the_plain_values_and_errors(tmp_path, level):
    plain, rewritten = _modules()
    assert b"__msprobe__.iterate_unpacked(t)" in rewrite_source(PROGRAM)  # the forms under test are there
    t = torch.arange(6.0).reshape(3, 2)
    expected_rows = plain["Rows"]()
    expected = plain["loops"](t, expected_rows), plain["errors"](t)
    assert all(expected[1])  # each error case raises in the plain program

    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level=level)
    rewritten["start"](debugger, torch.nn.Linear(2, 2))
    try:
        rows = rewritten["Rows"]()
        seen = rewritten["loops"](t, rows), rewritten["errors"](t)
    finally:
        debugger.stop()
        debugger.wait()
    assert _same(seen[0], expected[0])
    assert seen[1] == expected[1]
    assert rows.iterations == expected_rows.iterations == 1


def test_a_builtin_name_bound_to_something_else_is_called_as_it_is(tmp_path):
    """``builtin(fn)`` observes only the builtins it knows by identity: a name the program rebound at run time
    (the compiler saw the builtin) is handed back as it is, and called once, by the program."""
    calls = []

    def fake_sum(values):
        calls.append(values)
        return 0

    _plain, rewritten = _modules()
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1")
    rewritten["start"](debugger, None)
    try:
        callee = shims.builtin(fake_sum)
        observed = shims.builtin(sum)
    finally:
        debugger.stop()
        debugger.wait()
    assert callee is fake_sum
    assert observed is not sum and observed([1, 2]) == 3  # the builtin itself, run with the mode on
    assert calls == []
