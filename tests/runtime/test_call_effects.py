"""Which recorded calls may have their inputs read after they run (runtime/call_effects.py): torch's own
functions that leave their inputs alone; never one in place by name, by ``out=``, by an ``inplace`` switch given
by keyword or by position, by running statistics or by ``max_norm``, nor a call outside torch's namespaces.
The reading itself: tests/runtime/test_triton_stats.py."""

import pytest

pytest.importorskip("torch")

from msprobe_runtime.call_effects import CallEffects  # noqa: E402


@pytest.mark.parametrize(
    "api_name, args, kwargs",
    [
        ("Torch.matmul", (1, 2), {}),
        ("Tensor.view", (1, 2), {}),
        ("Tensor.__add__", (1, 2), {}),
        ("Tensor.__getitem__", (1, 2), {}),
        ("Functional.linear", (1, 2, 3), {}),
        ("Functional.silu", (1,), {}),
        ("Functional.silu", (1,), {"inplace": False}),
        ("Functional.dropout", (1, 0.1, True), {}),
        ("Functional.embedding", (1, 2, 0), {"max_norm": None}),
        ("Torch.layer_norm", (1, (4,)), {}),
        ("Torch.linalg.vector_norm", (1,), {}),
    ],
)
def test_calls_that_leave_their_inputs_alone(api_name, args, kwargs):
    assert CallEffects().reads_inputs_after(api_name, args, kwargs)


@pytest.mark.parametrize(
    "api_name, args, kwargs",
    [
        ("Tensor.add_", (1, 2), {}),
        ("Torch.relu_", (1,), {}),
        ("Tensor.__iadd__", (1, 2), {}),
        ("Tensor.__setitem__", (1, 2, 3), {}),
        ("Torch.add", (1, 2), {"out": 3}),
        ("Functional.silu", (1,), {"inplace": True}),
        ("Functional.silu", (1, False), {}),  # the switch by position: read first whatever its value
        ("Functional.dropout", (1, 0.1, True, True), {}),
        ("Functional.relu_", (1,), {}),
        ("Functional.batch_norm", (1, 2, 3), {}),
        ("Torch.native_batch_norm", (1, 2, 3, 4, 5, True, 0.1, 1e-5), {}),
        ("Functional.instance_norm", (1,), {}),
        ("Functional.embedding", (1, 2), {"max_norm": 1.0}),
        ("Functional.embedding", (1, 2, None, 1.0), {}),
        ("Tensor.backward", (1,), {}),
        ("NPU.npu_rms_norm", (1, 2), {}),
        ("Distributed.all_reduce", (1,), {}),
        ("MindSpeed.npu_rotary_position_embedding", (1,), {}),
        ("Compiled.step", (1,), {}),
        ("Functional.not_in_torch", (1,), {}),  # nothing known of it
        ("Torch.not_in_torch", (1,), {}),  # a user's catalogue names its own function so: not torch's
        ("Tensor.not_a_method", (1,), {}),
    ],
)
def test_calls_that_may_change_an_input_read_it_first(api_name, args, kwargs):
    assert not CallEffects().reads_inputs_after(api_name, args, kwargs)


def test_an_api_seen_changing_an_input_is_read_first_from_then_on():
    effects = CallEffects()
    assert effects.reads_inputs_after("Torch.exp", (1,), {})
    effects.learn("Torch.exp")
    assert not effects.reads_inputs_after("Torch.exp", (1,), {})
    assert effects.mutating == {"Torch.exp"}
    assert effects.reads_inputs_after("Torch.matmul", (1, 2), {})


def test_keyword_values_are_compared_by_identity_only():
    """A user's object as a keyword's value is never asked for its truth or equality (the runtime's rule)."""

    class Refuses:
        def __bool__(self):
            raise AssertionError("asked for its truth")

        def __eq__(self, other):
            raise AssertionError("compared")

        __hash__ = object.__hash__

    effects = CallEffects()
    assert not effects.reads_inputs_after("Functional.silu", (1,), {"inplace": Refuses()})
    assert not effects.reads_inputs_after("Functional.embedding", (1, 2), {"max_norm": Refuses()})
