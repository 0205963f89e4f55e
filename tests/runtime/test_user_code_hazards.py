"""The runtime never runs user code it was not asked to run (runtime/foreign.py).

fixtures/user_code_hazards/hazards.py holds classes whose ``__getattribute__``, ``__getattr__``, ``__eq__``,
``__hash__``, ``__bool__``, ``__len__``, ``__iter__``, ``__format__``, properties, descriptors, metaclass and
``__class__`` each call a routed function and count themselves. The program is rewritten by the compiler and
trained with collection off, then on at each level: the counts, the losses and the parameters must be the
same, no collection error may be logged, and nothing may recurse.
"""

import glob
import importlib.util
import json
import logging
import os
import traceback

import pytest

torch = pytest.importorskip("torch")

from msprobe_runtime import PrecisionDebugger  # noqa: E402

FIXTURE = "fixtures/user_code_hazards/hazards.py"


@pytest.fixture
def hazards(instrument, tmp_path):
    path = instrument(FIXTURE)
    spec = importlib.util.spec_from_file_location("hazards_instrumented", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(module, debugger=None):
    module.CALLS.clear()
    losses, params = module.train(2, debugger)
    return dict(module.CALLS), losses, params


def _entries(dump_dir, step):
    [path] = glob.glob(os.path.join(str(dump_dir), f"step{step}", "*", "dump.json"))
    with open(path) as handle:
        return json.load(handle)["data"]


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_collection_runs_no_user_code(hazards, level, tmp_path, caplog):
    calls_off, losses_off, params_off = _run(hazards)
    # every hazard is reached by the program itself, so a missing count would mean a test that cannot fail
    assert {"Config.__getattribute__", "Block.gain", "Counted.__get__"} <= set(calls_off)

    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level=level)
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        calls_on, losses_on, params_on = _run(hazards, debugger)
    debugger.wait()

    assert calls_on == calls_off
    assert not [r for r in caplog.records if r.name == "msprobe_runtime"], caplog.text
    assert losses_on == losses_off
    assert all(torch.equal(a, b) for a, b in zip(params_on, params_off))
    data = _entries(tmp_path / "dump", 1)
    names = list(data)
    if level in ("L1", "mix"):
        # the routed calls inside the overrides are the program's own, recorded as such
        assert "Torch.relu.0.forward" in names and "Functional.gelu.0.forward" in names
        assert "Torch.cat.0.forward" in names
        adds = [data[n]["input_args"] for n in names if n.startswith("Tensor.__add__.") and n.endswith(".forward")]
        assert [None] in [args[1:] for args in adds]  # `h + masq`: no record, and its __class__ never read
    if level in ("L0", "mix"):
        block = data["Module.block.Block.forward.0"]
        assert block["input_kwargs"] == {}
        assert block["input_args"][0]["type"] == "torch.Tensor"
        assert block["input_args"][1] is None and len(block["input_args"][2]) == 2  # Masquerade, Tensors
        assert set(block["output"][0]) == {"hidden", "seq", "extra"}  # read through dict's own items
        assert "<Keyed>" in block["output"][0]["extra"]  # a key of the user's is named by its type
        assert any(n.startswith("Module.block.Block.backward.") for n in names)


def test_the_transformers_config_pattern_does_not_recurse(tmp_path):
    """The minimal repro of the issue: ``super().__getattribute__`` inside ``__getattribute__``, read in a step,
    once through the compiler."""
    from msprobe_rewrite.api import rewrite_source

    source = (
        b"import torch\n"
        b"class Config:\n"
        b"    def __init__(self):\n"
        b"        self.scale = 2.0\n"
        b"    def __getattribute__(self, name):\n"
        b"        return super().__getattribute__(name)\n"
        b"def run(x):\n"
        b"    return torch.relu(x) * Config().scale\n"
    )
    rewritten = rewrite_source(source)
    assert b"__msprobe__.dyn(super().__getattribute__, name)" in rewritten
    namespace = {}
    exec(compile(rewritten, str(tmp_path / "config.py"), "exec"), namespace)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1")
    debugger.start()
    try:
        result = namespace["run"](torch.ones(2))
    finally:
        debugger.stop()
    debugger.wait()
    assert result.tolist() == [2.0, 2.0]
    assert list(_entries(tmp_path / "dump", 0)) == ["Torch.relu.0.forward", "Tensor.__mul__.0.forward"]


def _failure(call, *args):
    try:
        call(*args)
    except Exception as error:  # noqa: BLE001 (the error itself is what is compared)
        frames = traceback.extract_tb(error.__traceback__)
        return type(error), str(error), [f.name for f in frames if f.filename.endswith("hazards.py")]
    raise AssertionError("the call did not raise")


@pytest.mark.parametrize("which", ["failing_step", "call_user_failure"])
def test_an_error_in_a_routed_call_reaches_the_user_unchanged(hazards, which, tmp_path):
    """A torch API rejecting its arguments, and a user function raising, inside routed calls: same type, same
    message, the user's frames in the traceback; the next step is collected as usual."""
    x = torch.ones(2, 3)
    kind_off, message_off, frames_off = _failure(getattr(hazards, which), x)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    model = hazards.Net()
    debugger.start(model)
    try:
        kind_on, message_on, frames_on = _failure(getattr(hazards, which), x)
    finally:
        debugger.stop()
        debugger.step()
    assert (kind_on, message_on) == (kind_off, message_off)
    assert frames_on == frames_off and which in frames_on  # the user's frames, in order
    debugger.start(model)
    model(torch.randn(3, 4)).backward()
    debugger.stop()
    debugger.wait()
    names = list(_entries(tmp_path / "dump", 1))
    assert "Functional.gelu.0.forward" in names and "Module.head.Linear.forward.0" in names
    assert any(".parameters_grad." in n for n in names)


def test_start_takes_a_list_of_model_chunks(hazards, tmp_path):
    """Megatron passes its virtual-pipeline chunks as a list: each chunk's modules are named under its index
    (``Module.0.block...``), as msprobe names them."""
    torch.manual_seed(0)
    chunks = [hazards.Net(), hazards.Net()]
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    x = torch.randn(3, 4)
    for step in range(2):
        debugger.start(list(chunks))  # a new list each step, as a training loop may build it
        (chunks[0](x) + chunks[1](x)).backward()
        debugger.stop()
        debugger.step()
    debugger.wait()
    for step in range(2):
        names = list(_entries(tmp_path / "dump", step))
        for index in (0, 1):
            assert f"Module.{index}.block.Block.forward.0" in names
            assert f"Module.{index}.block.Block.backward.0" in names
            assert f"Module.{index}.head.parameters_grad.0" in names or any(
                n.startswith(f"Module.{index}.head.Linear.parameters_grad") for n in names
            )
        assert "Functional.gelu.1.forward" in names  # counters restart each step: two chunks, two calls


def test_start_refuses_what_is_not_a_module(tmp_path):
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    with pytest.raises(TypeError, match="item 1 of the list is a Keyed"):
        from fixtures.user_code_hazards.hazards import Keyed  # the plain fixture: only its class is needed

        debugger.start([torch.nn.Linear(2, 2), Keyed()])


def test_a_modules_parameters_are_read_as_torch_lists_them(tmp_path):
    """The parameters a module backward entry waits for (``Collector._parameters``, made bottom-up from the
    lists of the modules inside, once a step) are ``nn.Module.parameters()`` less those not hooked (frozen at
    ``start()``, or of a module added since): recursive, each once, in its order, with a shared submodule, a tied
    weight, an unset parameter and a module inside itself; read without the module's methods (here
    ``parameters`` and ``__getattr__`` raise)."""

    class Closed(torch.nn.Module):
        armed = False  # set once the model is built (nn.Module's own set-up asks __getattr__)

        def parameters(self, recurse=True):
            raise AssertionError("the module's own parameters() ran")

        def __getattr__(self, name):
            if type(self).armed:
                raise AssertionError(f"the module's __getattr__ ran for {name}")
            return torch.nn.Module.__getattr__(self, name)

    shared = torch.nn.Linear(3, 3)
    outer = torch.nn.Sequential(torch.nn.Linear(3, 3), shared, torch.nn.Sequential(shared, torch.nn.ReLU()))
    outer[0].register_parameter("unset", None)
    tied = torch.nn.Linear(3, 3)
    tied.weight = outer[0].weight
    outer.append(tied)
    outer.append(outer[2])  # the same container twice
    outer[2].add_module("itself", outer[2])
    closed = Closed()
    closed.inner = outer
    closed.own = torch.nn.Parameter(torch.randn(2))
    outer[0].bias.requires_grad_(False)
    expected = {
        id(m): [id(p) for p in torch.nn.Module.parameters(m) if p.requires_grad] for m in (closed, *outer.modules())
    }
    assert len(expected[id(closed)]) == 5  # the tied weight, the shared Linear's two, the tied one's bias, own
    Closed.armed = True
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    debugger.start(model=torch.nn.Sequential(closed))  # the root's own parameters are not hooked: none here
    collector = debugger._collector
    try:
        outer[0].add_module("late", torch.nn.Linear(2, 2))  # after start(): its parameters are not hooked
        # children first, as forwards end, then the outermost, whose list is made from theirs
        for module in (*reversed(list(outer.modules())), closed):
            assert [id(p) for p in collector._parameters(module)] == expected.get(id(module), [])
        assert collector._parameters(closed) is collector._parameters(closed)  # made once a step
    finally:
        debugger.stop()


class _Counting(torch.overrides.TorchFunctionMode):
    """A user's own mode (a FLOP counter, a debugging mode, ``torch.device(...)`` as a context)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(getattr(func, "__name__", repr(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("statistics", ["native op", "torch ops"])
def test_a_users_torch_function_mode_sees_only_the_programs_calls(tmp_path, monkeypatch, statistics):
    """With a mode of the user's pushed around the step, collection at every level leaves the calls the mode sees
    as they are with collection off: start() hooking the parameters, the records' reads and the statistics ops
    (with the torch ops, about 150 calls a step of this model) are the runtime's own, never the user's calls."""
    from msprobe_runtime import native_stats

    if statistics == "torch ops":
        monkeypatch.setenv("MSPROBE_NATIVE_STATS", "0")
    native_stats.reset()
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.Linear(4, 2))
        x = torch.randn(3, 4)

        def step(debugger=None):
            with _Counting() as mode:
                if debugger is not None:
                    debugger.start(model)
                model(x).sum().backward()
                if debugger is not None:
                    debugger.stop()
                    debugger.step()
            return mode.seen

        alone = step()
        assert "linear" in alone and "gelu" in alone
        for level in ("L0", "L1", "mix"):
            debugger = PrecisionDebugger(dump_path=str(tmp_path / level), level=level)
            assert step(debugger) == alone, level
            debugger.wait()
            data = _entries(tmp_path / level, 0)
            assert ("Functional.gelu.0.forward" in data) == (level != "L0")
            if level != "L1":
                assert set(data["Module.0.Linear.parameters_grad.0"]) == {"weight", "bias"}  # the hooks serve
    finally:
        monkeypatch.delenv("MSPROBE_NATIVE_STATS", raising=False)
        native_stats.reset()


def test_flat_tensors_finds_the_tensors_of_any_nesting_by_type_only():
    """backward.flat_tensors (a module's arguments and results): tensors and their subclasses in order, every
    other leaf None, containers and their subclasses opened through the base type, past 8 levels a leaf."""
    import collections

    from msprobe_runtime.backward import flat_tensors

    a, b = torch.ones(1), torch.nn.Parameter(torch.ones(2))
    pair = collections.namedtuple("Pair", "x y")

    class Loud(dict):  # a dict subclass whose own methods must never run
        def values(self):
            raise AssertionError("asked")

        def items(self):
            raise AssertionError("asked")

    nested = a
    for _ in range(9):
        nested = [nested]
    value = (
        a,
        None,
        3,
        "s",
        2.5,
        True,
        [b, (a,)],
        {"k": b, "n": 1},
        pair(a, 4),
        collections.OrderedDict(z=a),
        Loud(q=b),
        object(),
        nested,
    )
    found = flat_tensors(value, [])
    assert [t is a if t is not None and t is not b else t for t in found[:6]] == [True, None, None, None, None, None]
    rest = found[6:]
    assert rest[:3] == [b, a, b] and all(x is y for x, y in zip(rest[:3], [b, a, b]))
    assert rest[3] is None and rest[4] is a and rest[5] is None and rest[6] is a and rest[7] is b
    assert rest[8] is None  # object()
    assert rest[9:] == [None]  # nine levels of lists: a leaf past the eighth
    assert flat_tensors(a, []) == [a] and flat_tensors(None, []) == [None]
