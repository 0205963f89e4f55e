"""Tensor subclasses: one with its own ``__torch_dispatch__`` (a wrapper subclass, as quantization and
tracing libraries make) is read through nothing but its tensor struct (dtype, shape, requires_grad), its
statistics null: the runtime never runs the user's dispatch, and never reads the storage a wrapper does not
have (the native op read garbage there). A subclass without its own dispatch is read as a tensor."""

import glob
import json
import logging
import os

import pytest

torch = pytest.importorskip("torch")
from torch.utils._pytree import tree_map  # noqa: E402

from msprobe_runtime import PrecisionDebugger  # noqa: E402

DISPATCHED = []


class Wrapped(torch.Tensor):
    """A wrapper subclass: no storage of its own, every op unwraps ``inner`` in Python."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, dtype=inner.dtype, device=inner.device, requires_grad=inner.requires_grad
        )

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        DISPATCHED.append(str(func))
        unwrap = lambda x: x.inner if type(x) is Wrapped else x  # noqa: E731
        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(lambda x: Wrapped(x) if type(x) is torch.Tensor else x, out)


class Tagged(torch.Tensor):
    """A subclass with no dispatch of its own: its values are a tensor's."""


def _entry(dump, name):
    [path] = glob.glob(os.path.join(str(dump), "step0", "*", "dump.json"))
    with open(path) as handle:
        return json.load(handle)["data"][name], os.path.dirname(path)


def _config(tmp_path, mode):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"dump_path": str(tmp_path / "dump"), "level": "L1", "statistics": {"summary_mode": mode}})
    )
    return str(config)


@pytest.mark.parametrize("how", ["statistics", "md5", "tensor"])
def test_a_subclass_with_its_own_dispatch_is_never_dispatched_into(tmp_path, caplog, how):
    if how == "md5":
        debugger = PrecisionDebugger(config_path=_config(tmp_path, "md5"))
    else:
        debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1", task=how)
    wrapped = Wrapped(torch.tensor([1.0, -2.0, 3.0]))
    DISPATCHED.clear()
    torch.clone(wrapped)
    plain = list(DISPATCHED)
    DISPATCHED.clear()
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        debugger.start()
        out = torch.clone(wrapped)
        torch.clone(wrapped)
        debugger.stop()
    debugger.wait()
    assert type(out) is Wrapped and out.inner.tolist() == [1.0, -2.0, 3.0]
    assert DISPATCHED == plain + plain  # the user's two calls, and nothing of ours
    entry, directory = _entry(tmp_path / "dump", "Torch.clone.0.forward")
    for record in (entry["input_args"][0], entry["output"][0]):
        assert record["dtype"] == "torch.float32" and record["shape"] == [3]
        assert record["Max"] is None and record["Min"] is None and record["Norm"] is None
        assert record.get("md5") is None and record.get("data_name") is None
    assert caplog.text.count("tensors of class Wrapped are recorded with dtype and shape and null") == 1
    assert not os.path.exists(os.path.join(directory, "dump_tensor_data")) or not os.listdir(
        os.path.join(directory, "dump_tensor_data")
    )


def test_a_subclass_without_its_own_dispatch_is_read_as_a_tensor(tmp_path):
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1")
    tagged = torch.tensor([1.0, -2.0, 3.0]).as_subclass(Tagged)
    debugger.start()
    torch.clone(tagged)
    debugger.stop()
    debugger.wait()
    entry, _ = _entry(tmp_path / "dump", "Torch.clone.0.forward")
    record = entry["input_args"][0]
    assert (record["Max"], record["Min"], record["Mean"]) == (3.0, -2.0, pytest.approx(2.0 / 3.0))
