"""On an accelerator (CUDA here; any torch.accelerator device the same way): statistics stay on the device,
the training thread never synchronises, and training is bit-identical. Skipped where no accelerator exists.

``torch.cuda.set_sync_debug_mode("error")`` makes every synchronising call (``.item()``, a blocking copy to the
host, ``nonzero``...) raise, so any sync of ours inside forward/backward would fail the step.
"""

import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SOURCE = """
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.seq = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.LayerNorm(64))

    def forward(self, x):
        h = F.gelu(self.fc(x))
        return self.seq(h) + h


def step(model, x):
    loss = model(x).square().mean()
    loss.backward()
    return loss
"""


def _load(tmp_path):
    import importlib.util

    from msprobe_rewrite.api import rewrite_source

    path = tmp_path / "accelerator_model.py"
    path.write_bytes(rewrite_source(SOURCE.encode()))
    spec = importlib.util.spec_from_file_location("accelerator_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("level", ["L1", "L0", "mix"])
def test_cuda_no_sync_and_bit_identical(tmp_path, level):
    from msprobe_runtime import PrecisionDebugger

    module = _load(tmp_path)
    device = torch.device("cuda")

    def run(collect):
        torch.manual_seed(0)
        model = module.Block().to(device)
        x = torch.randn(32, 64, device=device)
        debugger = PrecisionDebugger(dump_path=str(tmp_path / f"dump-{level}"), level=level) if collect else None
        losses, grads = [], []
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            if debugger:
                debugger.start(model)
            torch.cuda.set_sync_debug_mode("error")
            try:
                loss = module.step(model, x)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            if debugger:
                debugger.stop()
                debugger.step()
            losses.append(loss.detach().cpu())
            grads.append([p.grad.detach().cpu() for p in model.parameters()])
        if debugger:
            debugger.wait()
        return losses, grads

    plain_losses, plain_grads = run(False)
    losses, grads = run(True)
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, losses))
    assert all(torch.equal(a, b) for step_a, step_b in zip(plain_grads, grads) for a, b in zip(step_a, step_b))
    import glob
    import json

    [path] = glob.glob(os.path.join(str(tmp_path / f"dump-{level}"), "step1", "*", "dump.json"))
    with open(path) as handle:
        data = json.load(handle)["data"]
    records = [r for entry in data.values() for r in entry.get("input_args", []) if isinstance(r, dict)]
    assert records and all(
        r["Max"] is not None
        for r in records
        if r.get("type") == "torch.Tensor" and r["shape"] and r["dtype"] == "torch.float32"
    )
