"""MSPROBE_CARRY_OUTPUTS: a call's output records, queued for the Triton kernels, wait for the next call's launch
(``TritonStats._carried``), so that two calls take one launch. They are read with the values they had at their call:
a call that may change its inputs launches them before it runs, and one changed meanwhile by code that is not recorded
is left null and said, never read with its new values. Without a GPU the native Recorder's lane takes CPU tensors and
the kernels run under Triton's interpreter, as in tests/runtime/test_native_lane.py."""

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # tests/conftest.py sets it before any import; here for a run alone
triton = pytest.importorskip("triton")

import msprobe_runtime  # noqa: E402
from fixtures.step_files import step_files  # noqa: E402
from fixtures.triton_kernels import statistics_kernels  # noqa: E402
from msprobe_runtime import PrecisionDebugger  # noqa: E402
from msprobe_runtime import collector as collector_module  # noqa: E402
from msprobe_runtime.statistics import StatBuffer  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's, in the interpreter


@pytest.fixture(scope="module", autouse=True)
def kernels():
    return statistics_kernels(DEVICE)


@pytest.fixture(autouse=True)
def lane(monkeypatch, native, kernels):
    """The native op's lane (CPU tensors taken as a device's without a GPU), and each launch counted."""
    monkeypatch.delenv("MSPROBE_TRITON", raising=False)
    monkeypatch.delenv("MSPROBE_NATIVE_LANE", raising=False)
    monkeypatch.delenv("MSPROBE_CARRY_OUTPUTS", raising=False)
    monkeypatch.setattr(
        collector_module,
        "StatBuffer",
        lambda counts: StatBuffer(counts, triton_cpu="lane" if DEVICE == "cpu" else False),
    )
    launches = []
    real = kernels._launch
    monkeypatch.setattr(kernels, "_launch", lambda items: launches.append(len(items)) or real(items))
    return launches


def _chain(x, n):
    for _ in range(n):
        x = msprobe_runtime.call("Torch.sin", torch.sin, x)
    return x


def _dump(tmp_path, name, body, carry, monkeypatch):
    """``body()`` in a step of a debugger at L1, with outputs carried or not: its dump.json's data."""
    if carry:
        monkeypatch.setenv("MSPROBE_CARRY_OUTPUTS", "1")
    else:
        monkeypatch.delenv("MSPROBE_CARRY_OUTPUTS", raising=False)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / name), task="statistics", level="L1")
    debugger.start()
    body()
    debugger.stop()
    debugger.step()
    debugger.wait()
    return step_files(tmp_path / name, 1)[0, "dump.json"]["data"]


def test_two_calls_take_one_launch_and_write_the_same_numbers(tmp_path, monkeypatch, lane):
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(n, generator=g).to(DEVICE, dtype) for n in (7, 3000) for dtype in (torch.float32, torch.bfloat16)]

    def body():
        for x in xs:
            y = _chain(x, 6)
            msprobe_runtime.call("Tensor.to", torch.Tensor.to, y, torch.float16)  # two dtypes: a launch each
            msprobe_runtime.call("Torch.stack", torch.stack, [y, y * 2, y * 3])  # with two waiting: four and two

    each = _dump(tmp_path, "each", body, False, monkeypatch)
    launched_each = len(lane)
    carried = _dump(tmp_path, "carried", body, True, monkeypatch)
    launched_carried = len(lane) - launched_each
    assert carried == each  # every record, number for number
    assert launched_carried <= 0.7 * launched_each
    record = carried["Torch.sin.5.forward"]["output"][0]
    assert record["Max"] == pytest.approx(_chain(xs[0], 6).max().item(), rel=1e-6)


# its inputs read after it, with its output (call_effects), or before it, where it changes them: its output waits
@pytest.mark.parametrize("api, fn", [("Torch.sin", torch.sin), ("Tensor.sin_", torch.Tensor.sin_)])
def test_a_waiting_output_changed_before_its_launch_is_null_and_said(tmp_path, monkeypatch, lane, caplog, api, fn):
    x = torch.linspace(-1, 1, 3000).to(DEVICE)
    last = torch.cos(4 * torch.sin(x))  # outside the step: no call of it recorded (nor launch made)
    for _ in range(4):
        last = torch.sin(last)
    expected = {"before": torch.sin(x).max().item(), "last": last.max().item()}

    def body():
        y = msprobe_runtime.call(api, fn, x.clone())
        with torch._C.DisableTorchFunction():  # a write no observer records (an extension's), between two calls
            y.mul_(4)
        z = msprobe_runtime.call("Tensor.cos_", torch.Tensor.cos_, y)  # in place: the waiting ones launched first
        for _ in range(4):
            z = msprobe_runtime.call("Torch.sin", torch.sin, z)

    with caplog.at_level("WARNING", logger="msprobe_runtime"):
        launched = len(lane)
        data = _dump(tmp_path, "d", body, True, monkeypatch)
    record = data[f"{api}.0.forward"]["output"][0]
    assert record["Max"] is None and record["Min"] is None  # never the values after the change
    assert data[f"{api}.0.forward"]["input_args"][0]["Max"] == pytest.approx(1.0, rel=1e-6)
    assert caplog.text.count(f"a tensor of {api}.0 changed before its statistics were read") == 1
    # carrying off from then on: each call's tensors in a launch of their own, and their numbers all there
    assert len(lane) - launched >= 5
    last_sin = 4 if api == "Torch.sin" else 3
    assert data[f"Torch.sin.{last_sin}.forward"]["output"][0]["Max"] == pytest.approx(expected["last"], rel=1e-6)
    assert data["Tensor.cos_.0.forward"]["input_args"][0]["Max"] == pytest.approx(4 * expected["before"], rel=1e-6)


def test_a_call_that_changes_its_input_launches_the_waiting_outputs_first(tmp_path, monkeypatch, lane, caplog):
    x = torch.linspace(-1, 1, 3000).to(DEVICE)
    expected = {"sin": torch.sin(x).max().item()}  # outside the step: not recorded

    def body():
        y = msprobe_runtime.call("Torch.sin", torch.sin, x)
        msprobe_runtime.call("Tensor.mul_", torch.Tensor.mul_, y, 4)  # in place: its inputs read before it runs

    with caplog.at_level("WARNING", logger="msprobe_runtime"):
        data = _dump(tmp_path, "d", body, True, monkeypatch)
    assert data["Torch.sin.0.forward"]["output"][0]["Max"] == pytest.approx(expected["sin"], rel=1e-6)
    assert data["Tensor.mul_.0.forward"]["input_args"][0]["Max"] == pytest.approx(expected["sin"], rel=1e-6)
    assert data["Tensor.mul_.0.forward"]["output"][0]["Max"] == pytest.approx(4 * expected["sin"], rel=1e-6)
    assert "changed" not in caplog.text


def test_outputs_over_the_bytes_bound_do_not_wait(tmp_path, monkeypatch, lane, kernels):
    x = torch.randn(3000).to(DEVICE)
    _dump(tmp_path, "small", lambda: _chain(x, 6), True, monkeypatch)
    waited = len(lane)
    monkeypatch.setattr(kernels, "_CARRY_BYTES", 3000 * 4)  # a call's input and output: twice that
    _dump(tmp_path, "large", lambda: _chain(x, 6), True, monkeypatch)
    assert waited == 3 and len(lane) - waited == 6


def test_the_last_calls_waiting_outputs_are_in_its_step(tmp_path, monkeypatch, lane):
    x = torch.linspace(0, 2, 3000).to(DEVICE)
    data = _dump(tmp_path, "d", lambda: msprobe_runtime.call("Torch.exp", torch.exp, x), True, monkeypatch)
    record = data["Torch.exp.0.forward"]["output"][0]
    assert record["Max"] == pytest.approx(torch.exp(x).max().item(), rel=1e-6)
    assert len(lane) == 1  # launched by the flush
