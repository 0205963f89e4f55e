"""One training run of the tiny MLP under a monitor, for tests/monitor/test_side_by_side.py: msprobe's own
TrainerMon (run in msprobe's venv) or ours, on the same model, data, seed and config.

    python side_by_side_run.py {msprobe|ours} CONFIG OUTPUT_DIR STEPS [main_grad] [lr@STEP]

Writes the monitor's output under OUTPUT_DIR ($MONITOR_OUTPUT_DIR) and prints one JSON line: the parameters'
names, the error the run raised, if any, and (ours) every anomaly record made.
"""

import json
import os
import sys

which, config, output, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
main_grad = "main_grad" in sys.argv[5:]
# lr@STEP: the learning rate x1000 from that step (tests/monitor/test_anomalies.py's fault)
spike = next((int(arg[3:]) for arg in sys.argv[5:] if arg.startswith("lr@")), None)
os.environ["MONITOR_OUTPUT_DIR"] = output
if which == "msprobe":
    # msprobe patches megatron's gradient buckets when megatron imports (optimizer_collect.py patch_grad_sync)
    # and then hooks no weight gradients of a plain module: no grad_unreduced files. Our venv has megatron;
    # a user of a bare module has not: hide it, so msprobe takes its plain-module path (_hook_weights).
    sys.modules["megatron"] = None  # type: ignore[assignment]
    from msprobe.pytorch import TrainerMon
else:
    from msprobe_runtime import TrainerMon

import torch  # noqa: E402


class MLP(torch.nn.Module):  # tests/monitor/conftest.py's
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.head(torch.nn.functional.gelu(self.fc2(torch.nn.functional.gelu(self.fc1(x)))))


torch.manual_seed(0)
model = MLP()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data, target = torch.randn(64, 16), torch.randn(64, 4)
monitor = TrainerMon(config, params_have_main_grad=main_grad)
monitor.set_monitor(model, optimizer)
error = None
try:
    for step in range(steps):
        if step == spike:
            for group in optimizer.param_groups:
                group["lr"] *= 1000.0
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(data), target).backward()
        optimizer.step()
except Exception as raised:  # reported, not raised: the test compares what each monitor does
    error = f"{type(raised).__name__}: {raised}"
# ours keeps every record in memory (the file gets the earliest 8 of each step): the records made, as msprobe's
records = [dict(item) for item in getattr(monitor, "anomalies", [])] if which == "ours" else None
print(json.dumps({"params": [name for name, _ in model.named_parameters()], "error": error, "anomalies": records}))
