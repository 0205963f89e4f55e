"""Rewriting never records less than leaving the program alone: a program that calls start() and stop() itself,
run as written and run rewritten, records the same catalogued calls (counts per API name, every step).

Each gap these tests close was a call made inside the window that the plain run recorded (its start() pushes the
observing mode) and the rewritten run lost: torch code that is not a module called from instrumented code
(``optimizer.step()``, ``clip_grad_norm_``) and the store of an augmented subscript (``y[idx] += v``). Equal
counts also say the instrumented frames' own calls are counted once, not by the rewrite and again by the mode.
Iterating a tensor (``for row in t``, ``a, b = t``, ``zip(t, u)``) runs ``Tensor.unbind``, and builtins such as
``sum`` and ``sorted`` run tensor operators, from C: the rewritten program iterates through
``__msprobe__.iterate`` and calls those builtins through ``__msprobe__.builtin``, with the mode on.

fixtures/user_code_hazards is not in FIXTURES: its ``Masquerade.__class__`` property calls ``torch.relu``, and
torch reads it while it dispatches ``h + masq``. The plain run's mode begins its record of ``Tensor.__add__``
after torch's own argument checks, so it records those relu calls (23 a step against 4); the rewritten run's
record of ``h + masq`` begins at the operator, and calls made inside a recorded call are part of it there, as
they are for every call a rewritten API makes. Every other count of that fixture is equal."""

import collections
import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from .conftest import ROOT, rewrite_file

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # each test runs a program twice in subprocesses: over 2 s

DRIVER = textwrap.dedent("""
    import collections, json, pathlib, sys, types
    from msprobe_rewrite.api import rewrite_source
    source = open(sys.argv[1], "rb").read()
    if sys.argv[3] == "rewritten":
        source = rewrite_source(source)
    module = types.ModuleType("program")
    exec(compile(source, "program.py", "exec"), module.__dict__)
    from msprobe_runtime import PrecisionDebugger
    debugger = PrecisionDebugger(dump_path=sys.argv[2], level="L1", task="statistics")
    module.run(debugger)
    debugger.wait()
    steps = {}
    for path in sorted(pathlib.Path(sys.argv[2]).glob("step*/*/dump.json")):
        names = json.loads(path.read_text())["data"]
        steps[path.parent.parent.name] = collections.Counter(n.rsplit(".", 2)[0] for n in names
                                                             if n.endswith(".forward"))
    print(json.dumps(steps))
""")


def recorded(tmp_path, program, how):
    """Per step, how many forward entries each API name has, for ``program`` run ``how`` (plain, rewritten)."""
    source = tmp_path / "program.py"
    source.write_text(textwrap.dedent(program))
    dump = tmp_path / how
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(source), str(dump), how],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return {step: collections.Counter(counts) for step, counts in json.loads(done.stdout.splitlines()[-1]).items()}


def same_as_plain(tmp_path, program):
    plain = recorded(tmp_path, program, "plain")
    rewritten = recorded(tmp_path, program, "rewritten")
    assert set(plain) == {"step0", "step1"}
    assert rewritten == plain
    return plain


OPTIMIZER = """
    import torch


    def run(debugger):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        for _ in range(2):
            debugger.start()
            loss = model(torch.ones(3, 4)).sum()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            debugger.stop()
            debugger.step()
"""


def test_optimizer_step_and_clipping_are_recorded_when_rewritten(tmp_path):
    counts = same_as_plain(tmp_path, OPTIMIZER)
    # AdamW's update and the clipping, recorded by the plain run's mode
    for name in ("Tensor.lerp_", "Tensor.addcdiv_", "Torch._foreach_norm", "Torch.clamp"):
        assert counts["step1"][name] > 0, name


AUGMENTED_STORE = """
    import torch


    def run(debugger):
        for _ in range(2):
            debugger.start()
            y = torch.zeros(4)
            idx = torch.tensor([0, 2])
            y[idx] += torch.ones(2)
            y[1] *= 3.0
            debugger.stop()
            debugger.step()
"""


def test_augmented_subscript_store_records_setitem(tmp_path):
    counts = same_as_plain(tmp_path, AUGMENTED_STORE)
    assert counts["step0"]["Tensor.__setitem__"] == 2


ITERATION = """
    import torch


    def run(debugger):
        t = torch.arange(6.0).reshape(3, 2)
        ts = [torch.ones(2), torch.full((2,), 3.0)]
        for _ in range(2):
            debugger.start()
            total = torch.zeros(2)
            for row in t:
                total = total + row
            a, b, c = t
            first, *rest = t
            [d, e] = ts[0]
            rows = [r * 2 for r in t]
            for x, y in zip(t, rows):
                total = total + x
            for i, row in enumerate(t):
                total = total + row
            for h, w in t:  # each row unpacked: Tensor.unbind per row
                total = total + h
            pairs = list(t), tuple(ts[1])
            squares = sum(x * x for x in ts)
            largest = max(ts[0][0], ts[1][0])
            ordered = sorted(ts[1])
            flags = any(ts[0]), all(v > 0 for v in t[0])
            magnitudes = abs(t), pow(t, 2)
            flipped = reversed(t)
            debugger.stop()
            debugger.step()
"""


def test_iterating_a_tensor_records_what_the_plain_run_records(tmp_path):
    counts = same_as_plain(tmp_path, ITERATION)
    # for, unpacking (3), comprehension, zip, enumerate, the loop over t and each of its 3 rows, list, tuple,
    # sorted, any, and all's generator over t[0]
    assert counts["step1"]["Tensor.unbind"] == 16
    assert counts["step1"]["Tensor.abs"] == 1 and counts["step1"]["Tensor.__pow__"] == 1


def entry_counts(dump):
    """Per ``step/rank`` folder of a dump, how many forward entries each API name has (modules left out)."""
    counts = {}
    for path in sorted(dump.glob("step*/*/dump.json")):
        names = json.loads(path.read_text())["data"]
        counts[f"{path.parent.parent.name}/{path.parent.name.split('proc')[0]}"] = collections.Counter(
            name.rsplit(".", 2)[0]
            for name in names
            if name.endswith(".forward") and not name.startswith(("Module.", "Cell."))
        )
    return counts


def run_fixture(script, dump, args):
    done = subprocess.run(
        [sys.executable, str(script), *args, "--dump", str(dump)], capture_output=True, text=True, timeout=900, cwd=ROOT
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stderr}"
    return entry_counts(dump)


# (fixture, its arguments but --dump): each script calls start() itself, so its plain run is observed by the
# mode from start() on, as msprobe would record it
FIXTURES = [
    ("fixtures/bignet/bignet.py", ["--level", "L1", "--steps", "2"]),
    ("fixtures/nested_model/nested.py", ["--level", "L1", "--steps", "2"]),
    ("fixtures/compare_models/train.py", ["--level", "L1"]),
    ("fixtures/transformers_models/train_tiny.py", ["--arch", "llama", "--level", "L1", "--steps", "2"]),
    (
        "fixtures/transformers_models/train_tiny.py",
        ["--arch", "llama", "--level", "L1", "--steps", "2", "--optimizer-in-window"],
    ),
    ("fixtures/transformers_models/train_tiny.py", ["--arch", "mixtral", "--level", "L1", "--steps", "2"]),
    ("fixtures/megatron_gpt/train_loop.py", ["--level", "L1", "--steps", "2"]),
]


@pytest.mark.parametrize(
    "fixture, args", FIXTURES, ids=[f"{os.path.basename(os.path.dirname(f))}-{' '.join(a)}" for f, a in FIXTURES]
)
def test_rewritten_fixture_records_every_call_of_the_plain_run(tmp_path, fixture, args):
    if "transformers" in fixture:
        pytest.importorskip("transformers")
    if "megatron" in fixture:
        pytest.importorskip("megatron.core")
    plain_script = os.path.join(ROOT, fixture)
    rewritten_dir = tmp_path / "rewritten"
    rewritten_dir.mkdir()
    for sibling in glob.glob(os.path.join(os.path.dirname(plain_script), "*.py")):
        if os.path.basename(sibling) not in ("__init__.py", os.path.basename(plain_script)):
            shutil.copy(sibling, rewritten_dir)  # the helpers it imports from its own folder (megatron's train_gpt)
    rewritten_script = rewrite_file(plain_script, rewritten_dir)
    runs = {}
    for how, script in (("plain", plain_script), ("rewritten", rewritten_script)):
        runs[how] = run_fixture(script, tmp_path / how, args)
    plain, rewritten = runs["plain"], runs["rewritten"]
    assert plain and set(rewritten) == set(plain)
    missing = {
        folder: {
            name: (count, rewritten[folder][name]) for name, count in counts.items() if rewritten[folder][name] < count
        }
        for folder, counts in plain.items()
    }
    assert missing == {folder: {} for folder in plain}, "calls the plain run records and the rewritten one lost"


TAGGED = textwrap.dedent('''
    import json, pathlib, sys, types
    from msprobe_rewrite.api import rewrite_source
    source = b"""import torch
    def run(debugger):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 2))
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        debugger.start(model)
        model(torch.ones(3, 4)).sum().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        debugger.stop()
        debugger.step()
    """
    module = types.ModuleType("program")
    exec(compile(rewrite_source(source), "program.py", "exec"), module.__dict__)
    from msprobe_runtime import PrecisionDebugger
    debugger = PrecisionDebugger(dump_path=sys.argv[1], level="mix", task="statistics")
    module.run(debugger)
    debugger.wait()
    print(json.dumps(json.loads(next(pathlib.Path(sys.argv[1]).glob("step0/*/construct.json")).read_text())))
''')


def test_optimizer_and_clipping_entries_are_tagged_as_msprobe_tags_them(tmp_path):
    """msprobe (register_optimizer_hook.py) parents every API entry of an optimizer's step to ``optimizer`` and
    of torch's gradient clipping to ``clip_grad`` in construct.json, each phase a root of its own."""
    done = subprocess.run(
        [sys.executable, "-c", TAGGED, str(tmp_path / "dump")], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    construct = json.loads(done.stdout.splitlines()[-1])
    assert construct["optimizer"] is None and construct["clip_grad"] is None
    assert construct["Torch._foreach_norm.0.forward"] == "clip_grad"
    assert construct["Tensor.lerp_.0.forward"] == "optimizer"
    assert construct["Tensor.sum.0.forward"] is None  # the model's own calls keep their parents
    assert construct["Functional.linear.0.forward"] == "Module.0.Linear.forward.0"
