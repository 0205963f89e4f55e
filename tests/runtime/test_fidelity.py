"""Collection changes nothing: losses and parameter gradients bit-identical with collection on and off.

Each run is a fresh interpreter on a copy of the fixture rewritten by the compiler. msprobe's L0/mix collection
changes all six gradients of BigNet's net1 (its module backward hooks reorder accumulation); ours must not.
"""

import glob
import json
import os

import pytest

FIXTURES = {"bignet": "fixtures/bignet/bignet.py", "nested": "fixtures/nested_model/nested.py"}


@pytest.fixture(scope="module")
def baselines(run_script, root):
    """The uninstrumented plain program's results, once per fixture."""
    out = {}
    for name, path in FIXTURES.items():
        out[name] = run_script(os.path.join(root, path), "--steps", "3")[0]
    return out


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
# mix collects both L0 and L1 and stays in the fast subset; L0 and L1 alone are slow (a fresh interpreter each)
@pytest.mark.parametrize(
    "level", [pytest.param("L0", marks=pytest.mark.slow), pytest.param("L1", marks=pytest.mark.slow), "mix"]
)
@pytest.mark.slow  # over 2 s: `make check` leaves it to `make test`
def test_bit_identical_with_collection(fixture, level, baselines, instrument, run_script, tmp_path):
    script = instrument(FIXTURES[fixture])
    dump = tmp_path / "dump"
    collected, stderr = run_script(script, "--steps", "3", "--level", level, "--dump", str(dump))
    assert "msprobe_runtime" not in stderr, stderr  # no collection error was logged
    assert collected["losses"] == baselines[fixture]["losses"]
    assert collected["grads"] == baselines[fixture]["grads"]
    if fixture == "nested":
        assert collected["output_types"] == ["Output"] * 3
    for step in range(3):
        [path] = glob.glob(str(dump / f"step{step}" / "*" / "dump.json"))
        with open(path) as handle:
            data = json.load(handle)["data"]
        names = list(data)
        if level in ("L0", "mix"):
            assert any(n.startswith("Module.") and ".backward." in n for n in names)
            assert any(".parameters_grad." in n for n in names)
        if level in ("L1", "mix"):
            assert "Functional.linear.0.forward" in names and "Functional.linear.0.backward" in names
        if level == "L0":
            assert all(n.startswith("Module.") for n in names)
        if level == "L1":
            assert not any(n.startswith("Module.") for n in names)


@pytest.mark.slow  # four fresh interpreters; test_fixture_programs checks the same of other programs
def test_rewritten_program_without_collection_is_identical(baselines, instrument, run_script):
    for name, path in FIXTURES.items():
        result, _ = run_script(instrument(path), "--steps", "3")
        assert result == baselines[name]
