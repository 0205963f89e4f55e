"""``torch.compile(model)`` on real models, trained 3 steps with inductor on the CPU: megatron-core's tiny GPT
(fixtures/megatron_gpt/train_gpt.py, the rewritten copy of megatron-core, the script not rewritten) and a transformers
Llama (fixtures/transformers_models/train_tiny.py under ``msprobe-rewrite run --packages transformers``, the script
instrumented too). Collecting at L1 or mix, every loss and gradient is bit-identical to the plain compiled run,
Dynamo compiles the same (frames, graph breaks: megatron's 16 are its own, graphs), and the dump holds the compiled
call's boundary entry, forward and backward, every step, the eager calls around it, and at mix every parameter's
gradient; nothing from inside the compiled model."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.reproducible_env import training_env

pytestmark = pytest.mark.slow  # six interpreters compiling real models with inductor

pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
GPT = ROOT / "fixtures" / "megatron_gpt" / "train_gpt.py"
LLAMA = ROOT / "fixtures" / "transformers_models" / "train_tiny.py"
STEPS = 3
LEVELS = ("L1", "mix")


def _gpt(workdir, level, copy):
    command = [sys.executable, str(GPT), "--compile", "--steps", str(STEPS)]
    if level != "none":
        command += ["--dump", str(workdir / "dump"), "--level", level]
    workdir.mkdir(parents=True)
    done = subprocess.run(
        command,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=900,
        env=training_env(copy, PYTHONWARNINGS="ignore"),
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    dynamo = next(json.loads(line[len("dynamo ") :]) for line in lines if line.startswith("dynamo "))
    return [line for line in lines if line.split(" ", 1)[0] in ("loss", "grad")], dynamo, done.stderr


def _llama(workdir, level):
    command = [str(LLAMA), "--arch", "llama", "--compile", "--steps", str(STEPS), "--level", level]
    if level != "none":
        command = [
            "-m",
            "msprobe_rewrite",
            "run",
            "--packages",
            "transformers",
            "--",
            *command,
            "--dump",
            str(workdir / "dump"),
        ]
    workdir.mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, *command],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=900,
        env=training_env(str(ROOT), PYTHONWARNINGS="ignore"),
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["instrumented"] is (level != "none")
    return [result["losses"], result["grads"]], result["dynamo"], done.stderr


@pytest.fixture(scope="module")
def runs(megatron_copy, tmp_path_factory):
    import concurrent.futures

    root = tmp_path_factory.mktemp("whole")
    jobs = {
        ("gpt", "none"): lambda: _gpt(root / "gpt-none", "none", None),
        ("llama", "none"): lambda: _llama(root / "llama-none", "none"),
    }
    for level in LEVELS:
        jobs[("gpt", level)] = lambda level=level: _gpt(root / f"gpt-{level}", level, megatron_copy)
        jobs[("llama", level)] = lambda level=level: _llama(root / f"llama-{level}", level)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {key: pool.submit(job) for key, job in jobs.items()}
        return {key: (*future.result(), root / f"{key[0]}-{key[1]}" / "dump") for key, future in futures.items()}


def _data(dump, step):
    [path] = (dump / f"step{step}").glob("*/dump.json")
    return json.loads(path.read_text())["data"]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_collection_leaves_the_compiled_model_as_it_is(runs, model, level):
    plain, plain_dynamo, _ = runs[(model, "none")][:3]
    collected, dynamo, stderr = runs[(model, level)][:3]
    assert plain and collected == plain
    assert dynamo == plain_dynamo
    assert [line for line in stderr.splitlines() if "msprobe_runtime" in line] == []


BOUNDARY = {"gpt": "Compiled.GPTModel.0", "llama": "Compiled.LlamaForCausalLM.0"}
EAGER = {"gpt": ["Tensor.float.0.forward", "Tensor.mean.0.forward"], "llama": []}
KEYWORDS = {"gpt": ["labels"], "llama": ["attention_mask", "input_ids", "labels"]}
ARGS = {"gpt": 3, "llama": 0}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_the_dump_holds_the_compiled_boundary_and_the_eager_calls(runs, model, level):
    dump = runs[(model, level)][3]
    for step in range(STEPS):
        data = _data(dump, step)
        names = [f"{BOUNDARY[model]}.forward", f"{BOUNDARY[model]}.backward"] + EAGER[model]
        assert [name for name in names if name not in data] == [], (step, sorted(data)[:30])
        forward = data[f"{BOUNDARY[model]}.forward"]  # the call's own arguments, keywords included
        assert forward["output"] and forward["output"][0] is not None
        assert sorted(forward["input_kwargs"]) == KEYWORDS[model] and len(forward["input_args"]) == ARGS[model]
        inside = [
            name
            for name in data
            if name.startswith(("Functional.", "Torch.", "Megatron."))
            or (name.startswith("Module.") and ".forward." in name)
        ]
        assert inside == [], (step, inside[:10])  # nothing of what ran inside the compiled model
        grads = [name for name in data if ".parameters_grad." in name]
        if level == "mix":
            assert len(grads) >= (16 if model == "gpt" else 10), (step, grads)
        else:
            assert grads == []
