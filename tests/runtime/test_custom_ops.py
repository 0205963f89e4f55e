"""config.json's ``custom_op_namespaces``: every op of a listed ``torch.ops`` namespace is recorded as msprobe 26.2
names it (``{namespace}.{op}.{n}.forward`` and ``.backward``), however the op is called, and training stays
bit-identical; an op of a namespace not listed is not recorded (its Python body is, as any code is)."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from msprobe_runtime.config import ConfigError, config_from_dict
from msprobe_runtime.identity import custom_operators

# The model, rewritten by the compiler in the child: one op called through torch.ops, directly (the function
# torch.library.custom_op returned) and from uninstrumented code (``plain.through_plain``, seen by the mode);
# a second namespace, not listed, whose body's multiplication is recorded as any Tensor.__mul__.
MODEL = """\
import torch
from torch.library import custom_op


@custom_op("mslib_test::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


def _setup(ctx, inputs, output):
    ctx.scale = inputs[1]
    ctx.save_for_backward(output)


def _backward(ctx, grad):
    (y,) = ctx.saved_tensors
    return grad * (ctx.scale - y * y / ctx.scale), None


scaled_tanh.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("mslib_other::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


twice.register_autograd(lambda ctx, grad: grad * 2)


class Net(torch.nn.Module):
    def __init__(self, plain):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 8)
        self.fc2 = torch.nn.Linear(8, 4)
        self.plain = plain

    def forward(self, x):
        h = torch.ops.mslib_test.scaled_tanh(self.fc1(x), 2.0)
        h = scaled_tanh(h, 0.5)
        h = self.plain.through_plain(h)
        return torch.ops.mslib_other.twice(self.fc2(h))
"""

PLAIN = """\
import torch


def through_plain(x):
    return torch.ops.mslib_test.scaled_tanh.default(x, 1.5)
"""

SCRIPT = textwrap.dedent("""
    import json, sys, types, torch
    from msprobe_rewrite.api import rewrite_source
    model_source, plain_source, config_path, level = sys.argv[1:5]
    plain = types.ModuleType("plain")
    exec(compile(plain_source, "plain.py", "exec"), plain.__dict__)  # not rewritten: the mode sees its calls
    module = types.ModuleType("model")
    exec(compile(rewrite_source(model_source.encode()), "model.py", "exec"), module.__dict__)

    torch.manual_seed(0)
    net = module.Net(plain)
    initial = {k: v.clone() for k, v in net.state_dict().items()}
    data = [torch.randn(16, 8) for _ in range(2)]

    def train(debugger):
        net.load_state_dict(initial)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        losses, grads = [], []
        for x in data:
            if debugger is not None:
                debugger.start(net)
            optimizer.zero_grad()
            loss = net(x).pow(2).mean()
            loss.backward()
            if debugger is not None:
                debugger.stop()
                debugger.step()
            losses.append(loss.detach().clone())
            grads.append([p.grad.clone() for p in net.parameters()])
            optimizer.step()
        return losses, grads

    off = train(None)  # collection off: the rewritten code only forwards
    from msprobe_runtime import PrecisionDebugger
    debugger = PrecisionDebugger(config_path=config_path, level=level)
    on = train(debugger)
    debugger.wait()
    same_losses = all(torch.equal(a, b) for a, b in zip(off[0], on[0]))
    same_grads = all(torch.equal(a, b) for ga, gb in zip(off[1], on[1]) for a, b in zip(ga, gb))
    print(json.dumps({"same_losses": same_losses, "same_grads": same_grads,
                      "losses": [float(t) for t in on[0]]}))
""")


def _run(tmp_path, level, namespaces):
    dump = tmp_path / "dump"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "dump_path": str(dump), "custom_op_namespaces": namespaces}))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, MODEL, PLAIN, str(config), level], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "msprobe_runtime" not in done.stderr, done.stderr  # no collection error was logged
    result = json.loads(done.stdout.splitlines()[-1])
    steps = []
    for step in range(2):
        [path] = list(dump.glob(f"step{step}/*/dump.json"))
        stacks = json.loads((path.parent / "stack.json").read_text())
        by_entry = {name: lines for names, lines in stacks.values() for name in names}  # entries share a stack
        steps.append((json.loads(path.read_text())["data"], by_entry))
    return result, steps


OP = "mslib_test.scaled_tanh"


@pytest.mark.slow  # a fresh interpreter per level
@pytest.mark.parametrize("level", ["L1", "mix"])
def test_listed_namespace_is_recorded_forward_and_backward_and_training_is_bit_identical(tmp_path, level):
    result, steps = _run(tmp_path, level, ["mslib_test"])
    assert result["same_losses"] and result["same_grads"], result
    for data, stacks in steps:  # call indices restart at each step, as msprobe's do
        names = list(data)
        ours = [n for n in names if n.startswith(OP + ".")]
        # the torch.ops call, the custom_op function's call, the uninstrumented .default call: one op, one name
        assert sorted(ours) == sorted(f"{OP}.{i}.{d}" for i in range(3) for d in ("forward", "backward"))
        assert names.index(f"{OP}.0.forward") < names.index(f"{OP}.1.forward") < names.index(f"{OP}.2.forward")
        scales = [data[f"{OP}.{i}.forward"]["input_args"][1] for i in range(3)]
        assert scales == [{"type": "float", "value": v} for v in (2.0, 0.5, 1.5)]
        first = data[f"{OP}.0.forward"]
        assert first["input_args"][0]["shape"] == [16, 8] and first["output"][0]["shape"] == [16, 8]
        assert first["output"][0]["Max"] <= 2.0 and first["output"][0]["Min"] >= -2.0  # 2 * tanh
        # each call's stack starts at the line that called the op (torch's operator __call__ frames left out,
        # as msprobe's wrapper of the torch.ops attribute is called from that line)
        assert [stacks[f"{OP}.{i}.forward"][0].split(",")[:2] for i in range(3)] == [
            ["File model.py", " line 39"],
            ["File model.py", " line 40"],
            ["File plain.py", " line 5"],
        ]
        backward = data[f"{OP}.0.backward"]
        assert backward["input"][0]["shape"] == [16, 8] and backward["output"][0]["shape"] == [16, 8]
        # the op's body ran inside the recorded call: its tanh is not an entry of its own, as in msprobe
        assert not any(n.startswith("Torch.tanh.") for n in names)
        # mslib_other is not listed: its op is not recorded, the multiplication its body makes is
        assert not any(n.startswith("mslib_other.") for n in names)
        assert "Tensor.__mul__.0.forward" in names
        assert "Functional.linear.0.forward" in names
        if level == "mix":
            assert "Module.fc1.Linear.forward.0" in names


@pytest.mark.slow  # a fresh interpreter
def test_msprobe_default_namespace_leaves_a_custom_op_unrecorded(tmp_path):
    result, steps = _run(tmp_path, "L1", None)  # null: msprobe's ['_C_ascend']
    assert result["same_losses"] and result["same_grads"], result
    for data, _stacks in steps:
        names = list(data)
        assert not any(n.startswith(("mslib_test.", "mslib_other.")) for n in names)
        # unrecorded, the op's body is code like any other: its tanh, in the rewritten model, is recorded
        assert "Torch.tanh.0.forward" in names and "Torch.tanh.1.forward" in names


# ----------------------------------------------------------------- the table of ops (in this process)


@pytest.fixture(scope="module")
def library():
    """Ops of a namespace of this process: one with a default and a named overload, one with a named overload
    only (which msprobe does not register), one made by torch.library.custom_op."""
    lib = torch.library.Library("mslib_table", "DEF")
    lib.define("both(Tensor x) -> Tensor")
    lib.define("both.scaled(Tensor x, float s) -> Tensor")
    lib.define("named_only.out(Tensor x) -> Tensor")

    @torch.library.custom_op("mslib_table::made", mutates_args=())
    def made(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    yield lib, made
    lib._destroy()


def test_ops_are_named_as_msprobe_names_them_and_every_spelling_of_one_op_shares_it(library):
    _lib, made = library
    table = custom_operators(["mslib_table", "mslib_not_loaded"])
    names = {id(obj): name for obj, name in table}
    ops = torch.ops.mslib_table
    assert names[id(ops.both)] == names[id(ops.both.default)] == names[id(ops.both.scaled)] == "mslib_table.both"
    assert names[id(ops.made)] == names[id(ops.made.default)] == names[id(made)] == "mslib_table.made"
    # msprobe's scan reads 'named_only.out' from the schema and finds no attribute of that name: not registered
    assert not any("named_only" in name for name in names.values())
    assert set(names.values()) == {"mslib_table.both", "mslib_table.made"}
    assert custom_operators(["mslib_not_loaded"]) == [] and custom_operators([]) == []


# ----------------------------------------------------------------- config.json


def _config(value):
    return config_from_dict({"dump_path": "dump", "custom_op_namespaces": value})


def test_namespaces_default_to_msprobes_and_a_list_is_kept():
    assert config_from_dict({"dump_path": "dump"}).custom_op_namespaces == ["_C_ascend"]
    assert _config(None).custom_op_namespaces == ["_C_ascend"]
    assert _config([]).custom_op_namespaces == []
    assert _config(["mylib", "npu", "mylib"]).custom_op_namespaces == ["mylib", "npu"]


@pytest.mark.parametrize(
    "value, hint",
    [
        ("mylib", "expected a list"),  # msprobe: 'it should be a list[str]'
        ({"mylib": 1}, "expected a list"),
        (["mylib", 3], "expected a list"),
        (["torch.ops.mylib"], "did you mean 'mylib'?"),
        (["mylib::scaled_tanh"], "give the namespace alone: 'mylib'"),
        ([""], "not a torch.ops namespace name"),
        (["my-lib"], "not a torch.ops namespace name"),
    ],
)
def test_namespaces_of_the_wrong_shape_are_refused_by_name(value, hint):
    with pytest.raises(ConfigError) as caught:
        _config(value)
    message = str(caught.value)
    assert message.startswith("custom_op_namespaces:") and hint in message
