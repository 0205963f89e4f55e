"""MonitorCallback (runtime/monitor/callback.py): TrainerMon under transformers' Trainer, on a tiny Llama built
from a config in code (no network), trained a few steps on CPU with gradient accumulation."""

import csv
import glob
import json
import os
import subprocess
import sys
import pytest
import torch

STEPS = 4
ACCUMULATION = 2
CONFIG = {
    "targets": {"model.layers.0.mlp": {}},
    "xy_distribution": True,
    "all_xy": True,  # activations of every module (attention with keyword tensors, a ModelOutput root output)
    "wg_distribution": True,
    "param_distribution": True,
    "mv_distribution": True,
    "ops": ["norm", "min", "max"],
}


def test_importing_the_package_imports_no_transformers():
    code = (
        "import sys, msprobe_runtime, msprobe_runtime.monitor\n"
        "assert 'transformers' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)\n"
        "print('clean')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "clean", out.stderr


@pytest.mark.slow  # imports transformers
def test_the_wrapped_optimizer_is_unwrapped_without_running_its_code():
    pytest.importorskip("transformers")
    from msprobe_runtime.monitor.callback import torch_optimizer

    inner = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])

    class Wrapper(torch.optim.Optimizer):
        def __init__(self, optimizer):
            self.optimizer = optimizer

        def __getattribute__(self, name):  # any attribute read through the class would fail the test
            raise AssertionError(f"read {name}")

    assert torch_optimizer(Wrapper(Wrapper(inner))) is inner
    assert torch_optimizer(inner) is inner


def _train(tmp_path, callback, recorder_events):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    class Recorder(TrainerCallback):
        """Each optimizer step's gradients, read before the step (the test's own eyes, not the monitor's)."""

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            recorder_events.append([p.grad.detach().clone() for p in model.parameters()])

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, 128, (STEPS * ACCUMULATION * 2, 16))
    dataset = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(
        output_dir=str(tmp_path / "trainer"),
        max_steps=STEPS,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=ACCUMULATION,
        learning_rate=1e-3,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    callbacks = [Recorder()] + ([callback] if callback is not None else [])
    trainer = Trainer(model=model, args=args, train_dataset=dataset, callbacks=callbacks)
    trainer.train()
    return model


@pytest.mark.slow
def test_trainer_with_the_callback_writes_the_layers_and_trains_bit_identically(tmp_path, monkeypatch):
    from msprobe_runtime.monitor import MonitorCallback

    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "monitor_output"))
    path = tmp_path / "monitor.json"
    path.write_text(json.dumps(CONFIG))
    plain_grads, watched_grads = [], []
    plain = _train(tmp_path / "plain", None, plain_grads)
    callback = MonitorCallback(str(path))
    watched = _train(tmp_path / "watched", callback, watched_grads)

    assert len(plain_grads) == len(watched_grads) == STEPS
    for step_a, step_b in zip(plain_grads, watched_grads):
        for a, b in zip(step_a, step_b):
            assert torch.equal(a, b)
    for a, b in zip(plain.parameters(), watched.parameters()):
        assert torch.equal(a, b)

    monitor = callback.monitor
    assert monitor is not None and monitor.has_collect_times == STEPS
    assert monitor.micro_batch_number == ACCUMULATION
    assert monitor.handles == []  # closed at on_train_end
    folder = monitor.tensorboard_dir

    def rows(prefix):
        found = []
        for name in sorted(glob.glob(os.path.join(folder, f"{prefix}_[0-9]*.csv"))):
            with open(name, newline="", encoding="utf-8") as handle:
                found.extend(csv.DictReader(handle))
        return found

    mlp = {f"model.layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    for prefix in ("grad_unreduced", "grad_reduced", "param_origin", "param_updated"):
        found = rows(prefix)
        assert {row["name"] for row in found} == mlp, prefix
        assert {int(row["step"]) for row in found} == set(range(STEPS)), prefix
    assert {row["name"] for row in rows("exp_avg")} == mlp
    layer = {f"model.layers.{i}.{part}" for i in range(2) for part in ("mlp", "self_attn.q_proj", "input_layernorm")}
    for prefix in ("actv", "actv_grad"):
        found = rows(prefix)
        names = {row["name"] for row in found}
        assert {f"{module}.{field}" for module in layer for field in ("input", "output")} <= names, prefix
        # one row per micro-batch: gradient_accumulation_steps honoured
        mlp_rows = [r for r in found if r["name"] == "model.layers.0.mlp.output"]
        assert sorted((int(r["step"]), r["micro_step"]) for r in mlp_rows) == [
            (step, str(micro)) for step in range(STEPS) for micro in range(ACCUMULATION)
        ]
    # q_proj's input is the normed hidden state, shared by q, k and v: its share of the gradient is there
    shares = [r["norm"] for r in rows("actv_grad") if r["name"] == "model.layers.0.self_attn.q_proj.input"]
    assert len(shares) == STEPS * ACCUMULATION and "nan" not in shares
    # the root's output is a ModelOutput (a dict): no output rows, as msprobe's hook makes none
    assert not any(row["name"].startswith(".output") for row in rows("actv"))
    # the accumulated gradient the monitor read is the one the optimizer used
    names = [name for name, _ in watched.named_parameters()]
    down = names.index("model.layers.0.mlp.down_proj.weight")
    last = [r for r in rows("grad_reduced") if r["step"] == str(STEPS - 1) and "down_proj" in r["name"]][0]
    assert float(last["norm"]) == pytest.approx(watched_grads[-1][down].double().norm().item(), rel=1e-5)


@pytest.mark.slow  # imports transformers
def test_the_callback_is_a_trainer_callback():
    transformers = pytest.importorskip("transformers")
    from msprobe_runtime import MonitorCallback

    assert issubclass(MonitorCallback, transformers.TrainerCallback)
    assert "on_train_begin" in MonitorCallback.__dict__ and "on_train_end" in MonitorCallback.__dict__
