"""A tiny MLP trained with AdamW, with or without the monitor, and where msprobe 26.2's source is."""

import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import pytest
import torch

MSPROBE_SOURCE = Path("/tmp/msp/msp26/msprobe")
ROOT = Path(__file__).resolve().parents[2]


def msprobe_source():
    """msprobe's package folder (its source read as text), or None: /tmp/msp's unpacked copy, else an installed
    mindstudio-probe."""
    if (MSPROBE_SOURCE / "pytorch" / "monitor" / "module_hook.py").exists():
        return MSPROBE_SOURCE
    try:
        spec = importlib.util.find_spec("msprobe")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / "pytorch" / "monitor" / "module_hook.py").exists():
            return Path(folder)
    return None


@pytest.fixture
def msprobe_root():
    root = msprobe_source()
    if root is None:
        pytest.skip("msprobe 26.2's source is not here (/tmp/msp, or an installed mindstudio-probe)")
    return root


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.head(torch.nn.functional.gelu(self.fc2(torch.nn.functional.gelu(self.fc1(x)))))


@pytest.fixture
def train(tmp_path, monkeypatch):
    """``train(config, steps=30, foreach=None, monitor=True, fault=None, grad_acc_steps=1, ...)`` -> a result with
    the losses, the gradients and weights of every step, the monitor and the model. ``fault``: ``("nan", step,
    param name)`` puts a NaN (``"inf"``: an infinity) into that weight before the step; ``("lr", step, factor)``
    multiplies the learning rate from that step."""
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "monitor_output"))
    counter = [0]

    def run(
        config=None,
        steps=30,
        foreach=None,
        monitor=True,
        fault=None,
        grad_acc_steps=1,
        window=None,
        model_class=None,
        fused=None,
    ):
        torch.manual_seed(0)
        model = (model_class or MLP)()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=foreach, fused=fused)
        # the same batches every step (full-batch regression): gradients then change smoothly, and msprobe's
        # turbulence rule stays quiet in a clean run (tests/monitor/test_anomalies.py)
        data = torch.randn(grad_acc_steps, 64, 16)
        target = torch.randn(grad_acc_steps, 64, 4)
        mon = None
        if monitor:
            from msprobe_runtime import TrainerMon

            counter[0] += 1
            path = tmp_path / f"config{counter[0]}.json"
            path.write_text(json.dumps(config))
            mon = TrainerMon(str(path), params_have_main_grad=False)
            mon.set_monitor(model, optimizer, grad_acc_steps=grad_acc_steps)
        losses, grads, weights = [], [], []  # weights: before each step's update
        for step in range(steps):
            if fault and fault[1] == step:
                if fault[0] in ("nan", "inf"):
                    with torch.no_grad():
                        dict(model.named_parameters())[fault[2]].view(-1)[3] = float(fault[0])
                else:
                    for group in optimizer.param_groups:
                        group["lr"] *= fault[2]
            optimizer.zero_grad()
            if window is not None:
                window[0] = True
            for micro in range(grad_acc_steps):
                loss = torch.nn.functional.mse_loss(model(data[micro]), target[micro])
                loss.backward()
                losses.append(loss.detach().clone())
            grads.append([p.grad.clone() for p in model.parameters()])
            weights.append([p.detach().clone() for p in model.parameters()])
            optimizer.step()
            if window is not None:
                window[0] = False
        if mon is not None:
            mon.close()
        return type(
            "Run",
            (),
            {
                "losses": losses,
                "grads": grads,
                "weights": weights,
                "monitor": mon,
                "model": model,
                "output": tmp_path / "monitor_output",
            },
        )

    return run


HOST_READS = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__")


@pytest.fixture
def host_reads(monkeypatch):
    """Every host read of a tensor (as tests/runtime/test_host_sync.py spies on them) made under the monitor's code,
    torch code it called included: ``host_reads.calls`` gets (read, the monitor's function, ``host_reads.window[0]``),
    the window being a flag a training loop may set around its forward, backward and step; ``host_reads.tensors``
    the tensor read by each call, in the same order."""
    import msprobe_runtime.monitor as package

    monitor_dir = os.path.dirname(os.path.abspath(package.__file__))
    reads = types.SimpleNamespace(calls=[], window=[False], tensors=[])

    def spy(name, original):
        def wrapper(self, *args, **kwargs):
            frame = sys._getframe(1)
            while frame is not None:  # a read made by torch code that the monitor called counts too
                if frame.f_code.co_filename.startswith(monitor_dir):
                    reads.calls.append((name, frame.f_code.co_name, reads.window[0]))
                    reads.tensors.append(self)
                    break
                frame = frame.f_back
            return original(self, *args, **kwargs)

        return wrapper

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, spy(name, getattr(torch.Tensor, name)))
    return reads


@pytest.fixture
def net(tmp_path, monkeypatch):
    """fixtures/monitor_capture/model.py's ``Net``, rewritten by the compiler (a dump records calls in
    instrumented code only: tests/monitor/test_deep_capture.py), with the monitor's output under ``tmp_path``."""
    from msprobe_rewrite.api import rewrite_source

    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "monitor_output"))
    path = tmp_path / "capture_model.py"
    path.write_bytes(rewrite_source((ROOT / "fixtures" / "monitor_capture" / "model.py").read_bytes()))
    spec = importlib.util.spec_from_file_location("capture_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Net
