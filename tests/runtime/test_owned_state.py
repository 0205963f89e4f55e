"""The collector's state is owned: what is recorded is a frozen ``Plan`` (module_dump swaps in a narrowed one and
puts the old one back), what a step collects is a ``StepState`` made fresh at each step, whose hooks go with it,
and the records passed between the halves of a call are named."""

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import msprobe_runtime as rt  # noqa: E402
from msprobe_runtime import PrecisionDebugger  # noqa: E402
from msprobe_runtime.open_calls import ApiCall, ModuleCall, TrackerFrame  # noqa: E402
from msprobe_runtime.recording_plan import Plan  # noqa: E402
from msprobe_runtime.step_state import StepState  # noqa: E402

STEP = """
def step(model, x):
    y = __msprobe__.call("Torch.tanh", torch.tanh, model(x))
    __msprobe__.call("Tensor.sum", torch.Tensor.sum, y).backward()
"""


class _Config:
    def __init__(self, level="mix", task="statistics", summary_mode="statistics", data_mode=("all",)):
        self.level, self.task, self.summary_mode, self.data_mode = level, task, summary_mode, list(data_mode)


@pytest.mark.parametrize(
    "data_mode, wanted",
    [
        (["all"], (True, True, True, True)),
        ([], (True, True, True, True)),
        (["forward"], (True, False, True, True)),
        (["backward", "output"], (False, True, False, True)),
        (["input"], (True, True, True, False)),
    ],
)
def test_the_plan_reads_msprobes_data_mode(data_mode, wanted):
    plan = Plan.of(_Config(data_mode=data_mode))
    assert (plan.want_forward, plan.want_backward, plan.want_input, plan.want_output) == wanted


@pytest.mark.parametrize(
    "level, api, module, construct",
    [("L0", False, True, False), ("L1", True, False, False), ("mix", True, True, True), ("debug", False, False, False)],
)
def test_the_plan_reads_the_level(level, api, module, construct):
    plan = Plan.of(_Config(level=level))
    assert (plan.level_api, plan.level_module, plan.construct_apis) == (api, module, construct)


def test_the_plan_is_frozen_and_narrowed_by_a_copy():
    plan = Plan.of(_Config(level="L1", task="tensor", summary_mode="md5"))
    assert plan.tensor_task and plan.checksum_mode == "md5" and not plan.statistics_only
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.level_api = False
    narrowed = plan.narrowed_to_modules()
    assert (narrowed.level_api, narrowed.level_module) == (False, True)
    assert (plan.level_api, plan.level_module) == (True, False)
    assert Plan.of(_Config()).statistics_only


def test_step_state_declares_every_table():
    state = StepState()
    with pytest.raises(AttributeError):
        state.undeclared = {}  # __slots__: a new table is declared, with its comment, in step_state.py


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def test_each_step_gets_a_fresh_state_and_its_hooks_go_with_it(tmp_path):
    namespace = {"__msprobe__": rt, "torch": torch}
    exec(compile(STEP, "<instrumented>", "exec"), namespace)
    model = _model()  # not rewritten: the observing mode records its calls
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix", task="statistics")
    debugger.start(model=model)
    collector = debugger._collector
    first = collector.step
    namespace["step"](model, torch.randn(3, 4, requires_grad=True))
    assert "Torch.tanh.0.forward" in first.data and "Module.0.Linear.forward.0" in first.data
    counts = {"Functional.linear": 2, "Functional.relu": 1, "Torch.tanh": 1, "Tensor.sum": 1}
    assert first.api_counts == counts
    handles = list(first.hooks)
    debugger.stop()
    debugger.step()
    assert collector.step is not first and collector.step.token is not first.token
    assert first.hooks == [] and not collector.step.data and not collector.step.api_counts
    # a removed handle's hook is gone from its tensor or node: removing it again is a no-op, and the step's list
    # no longer holds it (a tensor that outlives the step keeps no dead hook)
    for handle in handles:
        handle.remove()
    debugger.start(model=model)
    namespace["step"](model, torch.randn(3, 4, requires_grad=True))
    debugger.stop()
    assert collector.step.api_counts == counts  # indices restart with the step
    debugger.wait()


def test_module_dump_narrows_the_plan_and_restores_the_same_one(tmp_path):
    model = _model()
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1", task="statistics")
    debugger.start(model=model)
    collector = debugger._collector
    plan = collector.plan
    debugger.module_dump(model[0], "first")
    assert collector.plan is not plan and (collector.plan.level_api, collector.plan.level_module) == (False, True)
    debugger.module_dump_end()
    assert collector.plan is plan
    debugger.stop()
    debugger.wait()


def test_the_records_between_the_halves_of_a_call_are_named(tmp_path):
    """A call's begin hands its end a named record (``_begin_api``, ``module_forward_begin``, the tracker's
    frame), not a positional list."""
    model = _model()
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix", task="statistics")
    debugger.start(model=model)
    collector = debugger._collector
    seen = []
    begin_api, begin_module, enter = collector._begin_api, collector.module_forward_begin, collector.enter_module

    def spy_api(*args):
        seen.append(begin_api(*args))
        return seen[-1]

    def spy_module(*args):
        seen.append(begin_module(*args))
        return seen[-1]

    def spy_enter(frame, anchor):
        seen.append(frame)
        return enter(frame, anchor)

    collector._begin_api, collector.module_forward_begin, collector.enter_module = spy_api, spy_module, spy_enter
    try:
        namespace = {"__msprobe__": rt, "torch": torch}
        exec(compile(STEP, "<instrumented>", "exec"), namespace)
        namespace["step"](model, torch.randn(3, 4, requires_grad=True))
    finally:
        del collector._begin_api, collector.module_forward_begin, collector.enter_module
        debugger.stop()
        debugger.wait()
    kinds = {type(record) for record in seen if record is not None}  # None: the root, which has no entry
    assert kinds == {ApiCall, ModuleCall, TrackerFrame}
    api = next(record for record in seen if type(record) is ApiCall and record.name.startswith("Torch.tanh"))
    assert api.forward == "Torch.tanh.0.forward" and api.name == "Torch.tanh.0" and api.backward
    assert set(api.entry) == {"input_args", "input_kwargs", "output"}


def test_the_tensor_type_test_asks_the_class_nothing():
    """``foreign.subclass_test(torch.Tensor)``, the one tensor type test of the hot path: a C call where the
    base's metaclass keeps type's ``__subclasscheck__``; a metaclass of the user's that would run code on any
    question is never asked (its ``__subclasscheck__``, ``__hash__``, ``__eq__``, attributes)."""
    from msprobe_runtime.foreign import subclass_test

    asked = []

    class Loud(type):
        def __subclasscheck__(cls, other):
            asked.append("subclasscheck")
            return True

        def __instancecheck__(cls, other):
            asked.append("instancecheck")
            return True

        def __hash__(cls):
            asked.append("hash")
            return 0

        def __eq__(cls, other):
            asked.append("eq")
            return True

    class Plain(metaclass=Loud):
        pass

    loud_tensor_meta = type("LoudTensorMeta", (type(torch.Tensor),), dict(Loud.__dict__))

    class LoudTensor(torch.Tensor, metaclass=loud_tensor_meta):
        pass

    is_tensor_type = subclass_test(torch.Tensor)
    assert type(is_tensor_type).__name__ == "builtin_function_or_method"  # a C call: no Python frame
    assert [is_tensor_type(k) for k in (torch.Tensor, torch.nn.Parameter, LoudTensor, Plain, int)] == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert asked == []
    # a base whose own metaclass defines the check: answered from the stored MRO instead, still asking nothing
    by_mro = subclass_test(LoudTensor)
    assert [by_mro(k) for k in (LoudTensor, torch.Tensor, Plain)] == [True, False, False]
    assert asked == []


def test_a_routed_call_is_the_users_only_on_a_thread_that_is_not_busy(tmp_path):
    """``work.depth`` is per thread: the runtime's own work on one thread leaves another thread's calls
    recorded."""
    import threading

    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1", task="statistics")
    debugger.start()
    collector = debugger._collector
    try:
        seen = {}
        with collector.own_work:
            assert collector.busy()
            worker = threading.Thread(target=lambda: seen.update(busy=collector.busy()))
            worker.start()
            worker.join()
        assert seen == {"busy": False} and not collector.busy()
    finally:
        debugger.stop()
        debugger.wait()
