"""Real models from `transformers`, instrumented on import (``msprobe-rewrite run --packages transformers``),
trained 3 AdamW steps in train mode (dropout on) by fixtures/transformers_models/train_tiny.py, each run a
fresh interpreter:

- bit-identical: at L0, L1 and mix, each step's loss and every parameter's gradient bytes (sha256) equal the
  same training run plainly (no hook, no debugger); no ``msprobe_runtime`` warning and no ``msprobe-rewrite:``
  warning on stderr; a dump for every step with what the level records (modules, APIs, both);
- coverage against an oracle: a TorchFunctionMode counts every catalogued torch API call of step 0 (the forward,
  and the Python code the backward runs, e.g. checkpointing's recomputation) in a plain run of the same variant
  (which must itself train bit-identically: the oracle only observes). Not in the instrumented run itself: there
  the collector's own statistics ops would reach the mode too. The step-0 dump at L1 and mix must hold each API
  at least as many times (by API name), and each call at the line Python reports for it (by call site);
- the same for gradient checkpointing (reentrant and not) on llama.

Cost: one plain baseline and one oracle run per variant (cached for the module), one instrumented run per
variant and level (cached: the coverage test reads the bit-identity run's dump). Instrumented bytecode is
cached in a session temporary directory (PYTHONPYCACHEPREFIX, with bytecode writing on), so transformers is
rewritten once per session.
"""

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from fixtures.oracle_sites import same_api, sites_of_stacks
from fixtures.reproducible_env import REPRODUCIBLE

pytestmark = pytest.mark.slow

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "fixtures" / "transformers_models" / "train_tiny.py"
TORCH_DIR = str(Path(__import__("torch").__file__).resolve().parent) + os.sep
TRANSFORMERS_DIR = str(Path(transformers.__file__).resolve().parent) + os.sep

ARCHS = ["llama", "qwen2", "mistral", "bert", "t5", "mixtral", "resnet", "gpt2"]
LEVELS = ["L0", "L1", "mix"]
API_LEVELS = ["L1", "mix"]
# (arch, gradient checkpointing)
VARIANTS = [(arch, "none") for arch in ARCHS] + [("llama", "reentrant"), ("llama", "nonreentrant")]
STEPS = 3
TIMEOUT = 900


def _variant_id(variant):
    arch, checkpointing = variant
    return arch if checkpointing == "none" else f"{arch}-ckpt-{checkpointing}"


VARIANT_IDS = [_variant_id(v) for v in VARIANTS]


# ------------------------------------------------------------------------------------------- runs


class Run:
    def __init__(self, command, result, seconds):
        self.command = command
        self.returncode = result.returncode
        self.stdout = result.stdout
        self.stderr = result.stderr
        self.seconds = seconds
        self.data = None
        if result.returncode == 0:
            lines = result.stdout.strip().splitlines()
            self.data = json.loads(lines[-1]) if lines else None

    def failure(self):
        """The error of a failed run, its last exception line first, then the tail of its stderr."""
        errors = [line for line in self.stderr.splitlines() if re.match(r"^\w*(Error|Exception)\b", line)]
        return (
            f"exit status {self.returncode} after {self.seconds:.1f}s: {errors[-1] if errors else '?'}\n"
            f"$ {' '.join(self.command)}\n--- stderr (tail) ---\n{self.stderr[-6000:]}"
        )


class Runs:
    """Runs of the fixture, each made once per test module."""

    def __init__(self, workdir, env):
        self.workdir = workdir
        self.env = env
        self.cache = {}

    def _run(self, key, argv):
        if key not in self.cache:
            started = time.perf_counter()
            result = subprocess.run(
                argv, cwd=self.workdir, env=self.env, capture_output=True, text=True, timeout=TIMEOUT
            )
            self.cache[key] = Run(argv, result, time.perf_counter() - started)
        return self.cache[key]

    @staticmethod
    def _flags(variant):
        arch, checkpointing = variant
        return ["--arch", arch, "--checkpointing", checkpointing, "--steps", str(STEPS)]

    def plain(self, variant):
        return self._run(("plain", variant), [sys.executable, str(SCRIPT), *self._flags(variant)])

    def oracle(self, variant):
        return self._run(("oracle", variant), [sys.executable, str(SCRIPT), *self._flags(variant), "--oracle"])

    def dump_dir(self, variant, level):
        return Path(self.workdir) / f"dump-{_variant_id(variant)}-{level}"

    def hooked(self, variant, level):
        argv = [
            sys.executable,
            "-m",
            "msprobe_rewrite",
            "run",
            "--packages",
            "transformers",
            "--",
            str(SCRIPT),
            *self._flags(variant),
            "--level",
            level,
            "--dump",
            str(self.dump_dir(variant, level)),
        ]
        return self._run(("hooked", variant, level), argv)


@pytest.fixture(scope="session")
def environment(tmp_path_factory):
    """The subprocesses' environment: bytecode written, into a session temporary folder (PYTHONPYCACHEPREFIX),
    where the import hook keeps its instrumented bytecode beside the plain .pyc; offline."""
    prefix = tmp_path_factory.mktemp("bytecode")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "MSPROBE_REWRITE_PACKAGES")}
    env.update(
        PYTHONPYCACHEPREFIX=str(prefix),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        **REPRODUCIBLE,
    )
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory, environment):
    return Runs(str(tmp_path_factory.mktemp("transformers")), environment)


def ok(run):
    assert run.returncode == 0 and run.data is not None, run.failure()
    return run.data


def differences(plain, other):
    """Human-readable list of what differs between two runs' losses and gradients."""
    out = []
    for step, (a, b) in enumerate(zip(plain["losses"], other["losses"])):
        if a != b:
            out.append(f"step {step} loss {float.fromhex(a)!r} != {float.fromhex(b)!r}")
    if len(plain["losses"]) != len(other["losses"]):
        out.append(f"{len(other['losses'])} steps, expected {len(plain['losses'])}")
    for step, (a, b) in enumerate(zip(plain["grads"], other["grads"])):
        for name in sorted(set(a) | set(b)):
            if a.get(name) != b.get(name):
                out.append(f"step {step} grad {name}")
    return out


# ------------------------------------------------------------------------------------------- the dump


def rank_dir(dump, step):
    """The one rank (or proc{pid}) folder of a step."""
    folders = sorted(p for p in (Path(dump) / f"step{step}").glob("*") if p.is_dir())
    assert len(folders) == 1, (dump, step, folders)
    return folders[0]


def load(dump, step, name):
    return json.loads((rank_dir(dump, step) / name).read_text())


def _relative(path):
    return path[len(TRANSFORMERS_DIR) - len("transformers" + os.sep) :] if path.startswith(TRANSFORMERS_DIR) else path


def dump_sites(dump, step):
    """(file:line) -> Counter of forward API names recorded there: the innermost frame outside torch's own code,
    as the oracle attributes its calls."""
    return sites_of_stacks(load(dump, step, "stack.json"), TORCH_DIR, _relative)


# A catalogued torch function that does not dispatch through __torch_function__ is invisible to the oracle,
# which sees the call it makes instead; the dump records the wrapper, as msprobe does. Each pair is checked by
# test_wrappers_are_invisible_to_the_oracle, so a torch that starts dispatching the wrapper ends the exception.
WRAPPERS = {"Torch._grouped_mm": ("Functional.grouped_mm", "torch.nn.functional.grouped_mm")}


def allocate(needed, available):
    """Pair oracle calls (``needed``: name -> count) with dump records (``available``: Counter of dump names,
    consumed): the same name first, then an operator's other spelling, then a wrapper. name -> count paired."""
    taken = Counter()
    rules = (lambda name, d: d == name, same_api, lambda name, d: d in WRAPPERS.get(name, ())[:1])
    for rule in rules:
        for name, count in sorted(needed.items()):
            for dump_name in sorted(available):
                if taken[name] < count and available[dump_name] > 0 and rule(name, dump_name):
                    used = min(available[dump_name], count - taken[name])
                    available[dump_name] -= used
                    taken[name] += used
    return taken


def coverage_by_api(oracle, dump):
    """(seen, recorded, missed by API name): step-0 oracle calls against every forward API record of the step-0
    dump, wherever it was made."""
    available = Counter()
    for records in dump_sites(dump, 0).values():
        available.update(records)
    taken = allocate(oracle["counts"], available)
    missed = Counter({name: count - taken[name] for name, count in oracle["counts"].items() if taken[name] < count})
    seen = sum(oracle["counts"].values())
    return seen, seen - sum(missed.values()), missed


def coverage_by_site(oracle, dump):
    """(seen, recorded, missed by ``API at file:line``, where the dump has the missed APIs instead): the
    step-0 oracle calls against the step-0 dump's records at the same call site."""
    at_sites = dump_sites(dump, 0)
    needed_at = {}
    for name, sites in oracle["sites"].items():
        for site, count in sites.items():
            path, _, line = site.rpartition(":")
            needed_at.setdefault(f"{_relative(path)}:{line}", Counter())[name] += count
    missed = Counter()
    for site, needed in sorted(needed_at.items()):
        taken = allocate(needed, at_sites.get(site, Counter()))
        for name, count in needed.items():
            if taken[name] < count:
                missed[f"{name} at {site}"] += count - taken[name]
    elsewhere = {}  # the missed APIs' records left over in the same file within 8 lines
    for what in missed:
        name, _, site = what.partition(" at ")
        path, _, line = site.rpartition(":")
        for other, records in at_sites.items():
            other_path, _, other_line = (other or "").rpartition(":")
            if other_path == path and other_line.isdigit() and abs(int(other_line) - int(line)) <= 8:
                left = [
                    f"{d} x{c} at line {other_line}"
                    for d, c in records.items()
                    if c > 0 and (same_api(name, d) or d in WRAPPERS.get(name, ())[:1])
                ]
                if left:
                    elsewhere.setdefault(what, []).extend(left)
    seen = sum(sum(needed.values()) for needed in needed_at.values())
    return seen, seen - sum(missed.values()), missed, elsewhere


# ------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_plain_training_is_real_and_the_oracle_only_observes(runs, variant):
    plain = ok(runs.plain(variant))
    assert plain["transformers"] == transformers.__version__
    assert plain["instrumented"] is False  # the baseline runs transformers as shipped
    assert plain["gradient_checkpointing"] is (variant[1] != "none")
    assert len(plain["losses"]) == STEPS and len(plain["grads"]) == STEPS
    assert all(digest is not None for grads in plain["grads"] for digest in grads.values()), (
        "every parameter gets a gradient, so every one is compared"
    )
    assert len(set(plain["losses"])) == STEPS  # the optimizer steps
    with_oracle = ok(runs.oracle(variant))
    assert not differences(plain, with_oracle), differences(plain, with_oracle)
    oracle = with_oracle["oracle"]
    assert sum(oracle["counts"].values()) > 30, oracle["counts"]
    if variant[1] != "none":  # checkpointing recomputes the layers' forward during backward: more calls
        unchecked = ok(runs.oracle((variant[0], "none")))["oracle"]["counts"]
        assert sum(oracle["counts"].values()) > sum(unchecked.values())


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_instrumented_training_is_bit_identical_with_a_dump(runs, variant, level):
    plain = ok(runs.plain(variant))
    run = runs.hooked(variant, level)
    hooked = ok(run)
    assert hooked["instrumented"] is True, "the model's module was not instrumented by the import hook"
    warnings = [line for line in run.stderr.splitlines() if "msprobe_runtime" in line or "msprobe-rewrite:" in line]
    assert not warnings, "\n".join(warnings[:20])
    diff = differences(plain, hooked)
    assert not diff, f"{len(diff)} differences: " + "; ".join(diff[:20])
    dump = runs.dump_dir(variant, level)
    for step in range(STEPS):
        data = load(dump, step, "dump.json")["data"]
        modules = [name for name in data if name.startswith("Module.")]
        apis = [name for name in data if not name.startswith("Module.")]
        module_forward = [name for name in modules if ".forward." in name]
        module_backward = [name for name in modules if ".backward." in name]
        module_grads = [name for name in modules if ".parameters_grad" in name]
        api_forward = [name for name in apis if name.endswith(".forward")]
        api_backward = [name for name in apis if name.endswith(".backward")]
        what = f"step {step}: {len(data)} entries"
        if level in ("L0", "mix"):
            assert module_forward and module_backward and module_grads, what
        else:
            assert not modules, (what, modules[:5])
        if level in ("L1", "mix"):
            assert api_forward and api_backward, what
        else:
            assert not apis, (what, apis[:5])


def test_wrappers_are_invisible_to_the_oracle():
    """The WRAPPERS exception holds only while torch's wrapper does not dispatch __torch_function__."""
    import importlib
    import inspect

    for inner, (dump_name, qualname) in WRAPPERS.items():
        module, _, attr = qualname.rpartition(".")
        wrapper = getattr(importlib.import_module(module), attr, None)
        if wrapper is None:
            continue  # this torch has no such wrapper: the oracle sees the inner call under its own name
        source = inspect.getsource(wrapper)
        assert "handle_torch_function" not in source and "has_torch_function" not in source, qualname
        assert inner.split(".", 1)[1] + "(" in source, (qualname, inner)


def _oracle_and_dump(runs, variant, level):
    oracle = ok(runs.oracle(variant))["oracle"]
    ok(runs.hooked(variant, level))
    return oracle, runs.dump_dir(variant, level)


@pytest.mark.parametrize("level", API_LEVELS)
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_step0_dump_records_every_oracle_call(runs, variant, level):
    """Every catalogued torch call the oracle sees in step 0 is in the step-0 dump, at least as many times by API."""
    oracle, dump = _oracle_and_dump(runs, variant, level)
    seen, recorded, missed = coverage_by_api(oracle, dump)
    report = (
        f"{_variant_id(variant)} {level}: {recorded}/{seen} oracle calls recorded (by API); missed "
        f"{sum(missed.values())}: {dict(sorted(missed.items()))}"
        + (f"; calls that raised (not counted): {oracle['raised']}" if oracle.get("raised") else "")
    )
    print("\n" + report)
    assert seen > 30
    assert not missed, report
    assert recorded == seen


@pytest.mark.parametrize("level", API_LEVELS)
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_step0_dump_records_every_oracle_call_at_its_call_site(runs, variant, level):
    """The same, call site by call site: the dump's stack names the line Python itself reports for the call
    (the line the oracle reads from the calling frame), as tests/megatron's coverage test requires."""
    oracle, dump = _oracle_and_dump(runs, variant, level)
    seen, recorded, missed, elsewhere = coverage_by_site(oracle, dump)
    report = (
        f"{_variant_id(variant)} {level}: {recorded}/{seen} oracle calls recorded at their call site; missed "
        f"{sum(missed.values())}\n"
        + "\n".join(
            f"  MISSED {count:3d}  {what}"
            + (f"   (the dump has {', '.join(elsewhere[what])})" if what in elsewhere else "")
            for what, count in sorted(missed.items())
        )
    )
    print("\n" + report)
    assert seen > 30
    assert not missed, report
    assert recorded == seen
