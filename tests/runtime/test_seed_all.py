"""seed_all(seed, mode, rm_dropout, is_enhanced) as msprobe documents it, without a replaced torch attribute:
dropout is off (and torch's random APIs pinned) while the returned handle is in force, and every torch
attribute is the object it was before, during and after."""

import threading

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.nn.functional import dropout as dropout_bound_early  # noqa: E402  (msprobe's patch misses this)

from msprobe_runtime import PrecisionDebugger, seed_all  # noqa: E402

ATTRIBUTES = [
    (F, "dropout"),
    (F, "dropout2d"),
    (F, "dropout3d"),
    (torch, "dropout"),
    (torch, "rand"),
    (torch, "randn"),
    (torch.Tensor, "uniform_"),
]


def _snapshot():
    return [getattr(owner, name) for owner, name in ATTRIBUTES]


def _dropout_active():
    x, planes = torch.ones(4096), torch.ones(2, 64, 3, 3)
    return not (
        torch.equal(torch.nn.Dropout(0.5).train()(x), x)
        and torch.equal(F.dropout(x, 0.5), x)
        and torch.equal(dropout_bound_early(x, p=0.5), x)
        and torch.equal(F.dropout2d(planes), planes)
    )


def test_rm_dropout_is_off_during_and_torch_untouched_after():
    before = _snapshot()
    assert _dropout_active()
    with seed_all(1234, rm_dropout=True):
        assert not _dropout_active()
        assert all(a is b for a, b in zip(_snapshot(), before))  # nothing replaced while it is off
        assert torch.nn.Dropout(0.5).eval()(torch.ones(3)).tolist() == [1.0, 1.0, 1.0]
    assert all(a is b for a, b in zip(_snapshot(), before))
    assert _dropout_active()
    assert torch._C._len_torch_function_stack() == 0


def test_rm_dropout_while_the_debugger_collects(tmp_path):
    """The debugger's own observing mode is pushed above seed_all's and popped first; dropout stays off in the
    recorded call, and seed_all's mode outlives neither its handle nor the debugger's stop()."""
    import glob
    import json

    handle = seed_all(0, rm_dropout=True)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    debugger.start(model)
    x = torch.randn(4, 8)
    out = model(x)
    debugger.stop()
    assert torch.equal(out, model[0](x))
    handle.restore()
    assert torch._C._len_torch_function_stack() == 0 and _dropout_active()
    debugger.wait()
    [path] = glob.glob(str(tmp_path / "dump" / "step0" / "*" / "dump.json"))
    with open(path) as f:
        assert "Functional.dropout.0.forward" in json.load(f)["data"]


def test_is_enhanced_pins_torch_random_calls():
    with seed_all(7, is_enhanced=True):
        first, second = torch.rand(5), torch.rand(5)
        assert torch.equal(first, second)  # every random call starts from the state saved by seed_all
        assert torch.equal(torch.empty(5).uniform_(), torch.empty(5).uniform_())
    torch.manual_seed(7)
    assert torch.equal(torch.rand(5), first)
    assert not torch.equal(torch.rand(5), first)  # restored: the generator advances again


def test_seed_all_seeds_as_msprobe():
    seed_all(42)
    a = torch.randn(3)
    seed_all(42)
    assert torch.equal(a, torch.randn(3))
    assert torch._C._len_torch_function_stack() == 0  # nothing pushed without rm_dropout or is_enhanced
    with pytest.raises(ValueError):
        seed_all(-1)
    with pytest.raises(TypeError):
        seed_all(1, rm_dropout="yes")
    with pytest.raises(TypeError):
        seed_all(1, is_enhanced=1)


def test_a_second_call_replaces_the_first_and_other_threads():
    first = seed_all(1, rm_dropout=True)
    x = torch.ones(4096)
    seen = []

    def other_thread():
        seen.append(torch.equal(torch.nn.Dropout(0.5)(x), x))  # a module call: the forward hook covers it
        seen.append(torch.equal(F.dropout(x, 0.5), x))  # bare, on a thread whose mode stack torch keeps apart

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert seen == [True, False]
    second = seed_all(1, is_enhanced=True)
    assert torch._C._len_torch_function_stack() == 1 and _dropout_active()
    first.restore()  # already replaced: nothing to undo
    second.restore()
    assert torch._C._len_torch_function_stack() == 0


@pytest.mark.parametrize("reentrant", [True, False])
def test_dropout_stays_off_in_recomputation(reentrant):
    """Activation checkpointing recomputes the forward inside backward, where the autograd engine runs
    without the caller's torch function modes (Megatron's CheckpointFunction, torch's reentrant checkpoint):
    dropout must be off there too, or the recomputed activations differ from the forward's."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Dropout(0.5))
    x0 = torch.randn(4, 8)

    def grads(recompute):
        block.zero_grad()
        x = x0.clone().requires_grad_()
        out = checkpoint(block, x, use_reentrant=reentrant) if recompute else block(x)
        (out * 3).sum().backward()
        return [x.grad] + [p.grad.clone() for p in block.parameters()]

    with seed_all(0, rm_dropout=True):
        plain, recomputed = grads(False), grads(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, recomputed))
