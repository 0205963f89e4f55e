"""torch's own sharding on 2 gloo ranks (CPU): FSDP2 (``fully_shard``) and DTensor tensor parallelism
(``parallelize_module``, fc1 colwise, fc2 rowwise), trained 3 AdamW steps by fixtures/fsdp2/train_fsdp2.py.

The fixture is the user's code: it is rewritten by the compiler into a temporary directory, and each run is a
fresh interpreter that spawns its two ranks. Per mode, against the plain (uninstrumented, no debugger) run:

- bit-identical: at L0, L1 and mix, every rank's loss of every step and every parameter's local gradient bytes
  (the DTensor's shard) equal the plain run's;
- a rank directory per rank: ``{dump}/step{N}/rank{R}/dump.json`` for every step and both ranks;
- no ``msprobe_runtime`` warning on stderr (a collection error is logged there, and its record skipped);
- parameter gradients (L0 and mix): every ``parameters_grad`` entry is non-empty, every parameter of the model
  has its record in every step, each record has non-null Max, Min, Mean and Norm, and its shape is the rank's
  LOCAL shard's shape (as msprobe records tensor-parallel shards: per rank). In step 0 the four statistics
  equal the ones the fixture computed (in float64) from ``param.grad.to_local()``, to float32 rounding.

And with the sharded model under ``torch.compile`` at L1 and mix: bit-identical to the plain compiled run, the
compiled call's boundary in every rank's dump.

Cost: one plain run per mode (shared), one instrumented run per mode and level (shared by the tests), about
8 s each on 2 cores; the compiled runs about 20 s each.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures.reproducible_env import training_env

pytestmark = pytest.mark.slow

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "fixtures" / "fsdp2" / "train_fsdp2.py"
MODES = ["fsdp2", "tp"]
LEVELS = ["L0", "L1", "mix"]
MODULE_LEVELS = ["L0", "mix"]  # the levels that record parameters_grad
STEPS = 3
WORLD = 2
TIMEOUT = 300
STATISTICS = ("Max", "Min", "Mean", "Norm")
PARAM_GRAD = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[^.]+)\.parameters_grad\.(?P<index>\d+)$")


class Run:
    def __init__(self, command, done, seconds, dump):
        self.command = command
        self.returncode = done.returncode
        self.stdout = done.stdout
        self.stderr = done.stderr
        self.seconds = seconds
        self.dump = dump
        self.data = None
        if done.returncode == 0:
            lines = done.stdout.strip().splitlines()
            self.data = json.loads(lines[-1]) if lines else None

    def check(self):
        assert self.returncode == 0 and self.data is not None, (
            f"exit status {self.returncode} after {self.seconds:.1f}s\n$ {' '.join(self.command)}\n"
            f"--- stderr (tail) ---\n{self.stderr[-6000:]}"
        )
        return self.data


class Runs:
    """Runs of the fixture, each made once per test module."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.instrumented = self._rewrite()
        self._runs = {}

    def _rewrite(self):
        from msprobe_rewrite.api import rewrite_source

        target = self.workdir / "instrumented" / SCRIPT.name
        target.parent.mkdir(parents=True)
        target.write_bytes(rewrite_source(SCRIPT.read_bytes(), path=str(SCRIPT)))
        return target

    def get(self, mode, level, compiled=False):
        key = (mode, level, compiled)
        if key not in self._runs:
            self._runs[key] = self._run(mode, level, compiled)
        return self._runs[key]

    def _run(self, mode, level, compiled):
        name = f"{mode}-{level}" + ("-compiled" if compiled else "")
        script = SCRIPT if level == "none" else self.instrumented
        out = self.workdir / name / "out"
        dump = self.workdir / name / "dump"
        command = [
            sys.executable,
            str(script),
            "--mode",
            mode,
            "--level",
            level,
            "--steps",
            str(STEPS),
            "--out",
            str(out),
        ] + (["--compile"] if compiled else [])
        if level != "none":
            command += ["--dump", str(dump)]
        env = training_env(str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=str(self.workdir), env=env, timeout=TIMEOUT)
        return Run(command, done, time.perf_counter() - start, dump)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("fsdp2"))


def _load(run, step, rank):
    path = run.dump / f"step{step}" / f"rank{rank}" / "dump.json"
    assert path.is_file(), f"no {path.relative_to(run.dump)} in the dump"
    with open(path) as handle:
        return json.load(handle)["data"]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("mode", MODES)
def test_bit_identical(runs, mode, level):
    plain = runs.get(mode, "none").check()
    collected = runs.get(mode, level).check()
    assert [r["rank"] for r in collected["ranks"]] == list(range(WORLD))
    for rank in range(WORLD):
        base, got = plain["ranks"][rank], collected["ranks"][rank]
        assert len(got["losses"]) == STEPS
        assert got["losses"] == base["losses"], f"rank {rank}: losses differ"
        for step in range(STEPS):
            differ = sorted(n for n in base["grads"][step] if got["grads"][step].get(n) != base["grads"][step][n])
            assert not differ, f"rank {rank}, step {step}: gradients differ: {differ}"
    if mode == "fsdp2":  # data parallel: each rank its own batch, so its own loss
        assert plain["ranks"][0]["losses"] != plain["ranks"][1]["losses"]
    else:  # tensor parallel: one batch, one loss
        assert plain["ranks"][0]["losses"] == plain["ranks"][1]["losses"]


@pytest.mark.parametrize("level", ["L1", "mix"])
@pytest.mark.parametrize("mode", MODES)
def test_bit_identical_under_torch_compile(runs, mode, level):
    """``torch.compile(model)`` of the sharded model: collecting changes no bit, logs no error, and the dump holds
    the compiled call's boundary, forward and backward, on every rank and step (docs/compile.md)."""
    plain = runs.get(mode, "none", compiled=True).check()
    run = runs.get(mode, level, compiled=True)
    collected = run.check()
    for rank in range(WORLD):
        assert collected["ranks"][rank]["losses"] == plain["ranks"][rank]["losses"], rank
        assert collected["ranks"][rank]["grads"] == plain["ranks"][rank]["grads"], rank
        boundary = "Compiled.FSDPMLP.0" if mode == "fsdp2" else "Compiled.MLP.0"  # fully_shard's class
        for step in range(STEPS):
            names = list(_load(run, step, rank))
            assert f"{boundary}.forward" in names and f"{boundary}.backward" in names, names
    assert [line for line in run.stderr.splitlines() if "msprobe_runtime" in line] == []


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("mode", MODES)
def test_a_rank_directory_per_rank(runs, mode, level):
    run = runs.get(mode, level)
    run.check()
    for step in range(STEPS):
        assert sorted(os.listdir(run.dump / f"step{step}")) == [f"rank{r}" for r in range(WORLD)]
        for rank in range(WORLD):
            data = _load(run, step, rank)
            names = list(data)
            if level in ("L0", "mix"):
                assert "Module.fc1.FSDPLinear.forward.0" in names or "Module.fc1.Linear.forward.0" in names, names
                assert any(".parameters_grad." in n for n in names), names
            if level in ("L1", "mix"):
                assert "Functional.linear.0.forward" in names and "Functional.linear.0.backward" in names, names
            if level == "L0":
                assert all(n.startswith("Module.") for n in names)
            if level == "L1":
                assert not any(n.startswith("Module.") for n in names)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("mode", MODES)
def test_no_collection_error(runs, mode, level):
    run = runs.get(mode, level)
    run.check()
    warnings = [line for line in run.stderr.splitlines() if "msprobe_runtime" in line]
    assert not warnings, "\n".join(warnings)


@pytest.mark.parametrize("level", MODULE_LEVELS)
@pytest.mark.parametrize("mode", MODES)
def test_parameters_grad_holds_local_shard_statistics(runs, mode, level):
    run = runs.get(mode, level)
    collected = run.check()
    problems = []
    for rank in range(WORLD):
        local = collected["ranks"][rank]["local"]  # step 0, from param.grad.to_local() in the fixture
        assert local, "the fixture reported no local gradient"
        if mode == "fsdp2":  # the premise: FSDP2 shards every parameter, so every gradient is a DTensor
            assert all(info["dtensor"] for info in local.values()), local
        else:  # colwise fc1: Shard(0); rowwise fc2: weight Shard(1), bias Replicate; norm and head plain
            placements = {n: info["placements"] for n, info in local.items() if info["dtensor"]}
            assert placements == {
                "fc1.weight": ["S(0)"],
                "fc1.bias": ["S(0)"],
                "fc2.weight": ["S(1)"],
                "fc2.bias": ["R"],
            }, local
        for name, info in local.items():
            if info["dtensor"] and info["placements"] != ["R"]:  # a shard: its shape is not the global one
                assert info["shape"] != info["global_shape"], (name, info)
        for step in range(STEPS):
            data = _load(run, step, rank)
            seen = {}
            for entry_name, entry in data.items():
                match = PARAM_GRAD.match(entry_name)
                if match is None:
                    continue
                if not entry:
                    problems.append(f"rank {rank} step {step}: {entry_name} is empty")
                    continue
                for param_name, record in entry.items():
                    full = f"{match['path']}.{param_name}"
                    seen.setdefault(full, []).append((entry_name, record))
            missing = sorted(set(local) - set(seen))
            if missing:
                problems.append(f"rank {rank} step {step}: no parameters_grad record of {missing}")
            for full, records in seen.items():
                assert full in local, f"a parameters_grad record of {full}, which is no parameter of the model"
                expected = local[full]
                for entry_name, record in records:
                    where = f"rank {rank} step {step}: {entry_name}[{full.rsplit('.', 1)[1]}]"
                    if record is None:
                        problems.append(f"{where} is null")
                        continue
                    nulls = [s for s in STATISTICS if record.get(s) is None]
                    if nulls:
                        problems.append(f"{where}: null {nulls}")
                    if record.get("shape") != expected["shape"]:
                        problems.append(
                            f"{where}: shape {record.get('shape')}, the local shard's is "
                            f"{expected['shape']} (global {expected['global_shape']})"
                        )
                    if record.get("dtype") != expected["dtype"]:
                        problems.append(f"{where}: dtype {record.get('dtype')}, not {expected['dtype']}")
                    if step == 0 and not nulls:
                        for stat in STATISTICS:
                            if record[stat] != pytest.approx(expected[stat], rel=1e-5, abs=1e-7):
                                problems.append(
                                    f"{where}: {stat} {record[stat]!r}, the local shard's is {expected[stat]!r}"
                                )
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])
