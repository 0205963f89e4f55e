"""Megatron's DistributedDataParallel accumulates each parameter's gradient into ``param.main_grad`` from its
own hook on the gradient accumulator, and drops ``param.grad``; ``parameters_grad`` records ``main_grad`` then,
after that accumulation (msprobe reads it there too)."""

import glob
import json
import os

import pytest

torch = pytest.importorskip("torch")

from msprobe_runtime import PrecisionDebugger  # noqa: E402


def _megatron_style(model):
    """What megatron-core's DDP does to each parameter, in miniature."""
    keep = []
    for param in model.parameters():
        param.main_grad = torch.zeros_like(param)
        node = param.expand_as(param).grad_fn.next_functions[0][0]

        def accumulate(*_, param=param):
            param.main_grad.add_(param.grad)
            param.grad = None

        node.register_hook(accumulate)
        keep.append(node)
    return keep


def test_parameters_grad_is_main_grad_after_its_accumulation(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.GELU(), torch.nn.Linear(3, 2))
    nodes = _megatron_style(model)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L0")
    debugger.start(model)
    for _ in range(2):  # two microbatches
        model(torch.randn(5, 4)).sum().backward()
    debugger.stop()
    debugger.wait()
    assert all(p.grad is None for p in model.parameters()) and nodes
    [path] = glob.glob(os.path.join(str(tmp_path / "dump"), "step0", "*", "dump.json"))
    with open(path) as handle:
        data = json.load(handle)["data"]
    last = data["Module.2.Linear.parameters_grad.1"]["weight"]
    main_grad = model[2].weight.main_grad
    assert last["Max"] == pytest.approx(main_grad.max().item(), rel=1e-6)
    assert last["Norm"] == pytest.approx(main_grad.norm().item(), rel=1e-6)
    first = data["Module.2.Linear.parameters_grad.0"]["weight"]
    assert first["Norm"] != pytest.approx(last["Norm"], rel=1e-6)  # the running sum after microbatch 1, then 2
