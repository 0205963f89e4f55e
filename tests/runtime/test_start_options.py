"""start(model) with a Module, a list or a tuple of them; start(token_range=..., rank_id=...); module_dump."""

import glob
import json
import os
import subprocess
import textwrap

import pytest

torch = pytest.importorskip("torch")

from msprobe_runtime import PrecisionDebugger, module_dump, module_dump_end  # noqa: E402


def _data(root, step=0, name="dump.json"):
    [path] = glob.glob(os.path.join(str(root), f"step{step}", "*", name))
    with open(path) as handle:
        return json.load(handle) if name != "dump.json" else json.load(handle)["data"]


@pytest.mark.parametrize("wrap", [list, tuple])
def test_model_chunks_as_list_or_tuple(tmp_path, wrap):
    chunks = wrap([torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)])
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L0")
    debugger.start(chunks)
    chunks[1](chunks[0](torch.randn(3, 4))).sum().backward()
    debugger.stop()
    debugger.wait()
    names = list(_data(tmp_path / "dump"))
    assert "Module.0.Linear.forward.0" not in names  # the chunks themselves are roots, as in msprobe
    debugger2 = PrecisionDebugger(dump_path=str(tmp_path / "dump2"), level="L0")
    nested = wrap([torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.nn.Sequential(torch.nn.Linear(4, 2))])
    debugger2.start(nested)
    nested[1](nested[0](torch.randn(3, 4))).sum().backward()
    debugger2.stop()
    debugger2.wait()
    names = list(_data(tmp_path / "dump2"))
    assert "Module.0.0.Linear.forward.0" in names and "Module.1.0.Linear.forward.0" in names
    assert "Module.1.0.Linear.backward.0" in names


def test_start_refuses_what_is_not_a_module(tmp_path):
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L0")
    with pytest.raises(TypeError, match="item 1 of the list is a str"):
        debugger.start([torch.nn.Linear(2, 2), "model"])


def test_token_range_collects_only_those_forwards(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    debugger.start(model, token_range=[1, 2])
    with torch.no_grad():
        torch.tanh(torch.ones(2))  # before the first counted forward: not collected
        for _ in range(4):  # forwards 0, 1, 2, 3: only 1 and 2 are recorded
            model(torch.randn(2, 4))
    debugger.stop()
    debugger.wait()
    names = list(_data(tmp_path / "dump"))
    assert [n for n in names if n.startswith("Module.0.")] == ["Module.0.Linear.forward.0", "Module.0.Linear.forward.1"]
    assert "Torch.tanh.0.forward" not in names
    assert sum(n.startswith("Functional.linear.") for n in names) == 2


@pytest.mark.parametrize("bad", [[2, 1], [-1, 3], [0], (0, 1.5), "0-3"])
def test_token_range_checks(tmp_path, bad):
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1")
    with pytest.raises(ValueError, match="token_range"):
        debugger.start(torch.nn.Linear(2, 2), token_range=bad)


def test_rank_id_names_the_folder_and_filters(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"dump_path": str(tmp_path / "dump"), "level": "L1", "rank": [3]}))
    debugger = PrecisionDebugger(config_path=str(config))
    for rank_id in (3, 4):
        debugger.start(rank_id=rank_id)
        torch.relu(torch.ones(2))
        debugger.stop()
        debugger.step()
    debugger.wait()
    assert [os.path.relpath(p, str(tmp_path / "dump")) for p in glob.glob(str(tmp_path / "dump" / "*" / "*"))] == [
        os.path.join("step0", "rank3")
    ]
    with pytest.raises(ValueError, match="rank_id"):
        debugger.start(rank_id=-1)


MODULE_DUMP = """
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def program(debugger, module_dump, module_dump_end):
    torch.manual_seed(0)
    net = Net()
    for _ in range(2):
        debugger.start()
        x = torch.randn(3, 4, requires_grad=True)
        h = torch.tanh(x)
        module_dump(net, "mynet")
        y = net(h)
        module_dump_end()
        z = torch.sigmoid(y)
        z.sum().backward()
        debugger.stop()
        debugger.step()
"""

# what msprobe 26.2 writes for MODULE_DUMP at L1 (test_module_dump_matches_msprobe checks it live)
MSPROBE_NAMES = [
    "Torch.tanh.0.forward",
    "Module.mynet.Net.forward.0",
    "Torch.sigmoid.0.forward",
    "Tensor.sum.0.forward",
    "Tensor.sum.0.backward",
    "Torch.sigmoid.0.backward",
    "Module.mynet.Net.backward.0",
    "Torch.tanh.0.backward",
]


def _run_module_dump(root):
    namespace = {"torch": torch}
    exec(MODULE_DUMP, namespace)
    debugger = PrecisionDebugger(dump_path=str(root), level="L1")
    namespace["program"](debugger, module_dump, module_dump_end)
    debugger.wait()


def test_module_dump(tmp_path):
    _run_module_dump(tmp_path / "dump")
    for step in (0, 1):
        data = _data(tmp_path / "dump", step)
        assert list(data) == MSPROBE_NAMES  # the APIs inside the module are not recorded; the module is
        assert _data(tmp_path / "dump", step, "construct.json") == {}
    entry = data["Module.mynet.Net.forward.0"]
    assert entry["input_args"][0]["shape"] == [3, 4] and entry["output"][0]["shape"] == [3, 2]
    backward = data["Module.mynet.Net.backward.0"]
    assert backward["input"][0]["shape"] == [3, 2] and backward["output"][0]["shape"] == [3, 4]


def test_module_dump_is_for_l1(tmp_path, caplog):
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    with caplog.at_level("INFO", logger="msprobe_runtime"):
        module_dump(torch.nn.Linear(2, 2), "x")
    module_dump_end()
    assert debugger._module_dump is None and "module_dump() is for level L1" in caplog.text
    with pytest.raises(TypeError):
        module_dump("not a module", "x")


@pytest.mark.slow
def test_module_dump_matches_msprobe(tmp_path, msprobe_python):
    python = msprobe_python
    driver = tmp_path / "drive.py"
    driver.write_text(
        textwrap.dedent("""
        import sys, torch
        from msprobe.pytorch import PrecisionDebugger, module_dump, module_dump_end
        debugger = PrecisionDebugger(dump_path=sys.argv[1], level="L1", task="statistics")
    """)
        + MODULE_DUMP
        + "\nprogram(debugger, module_dump, module_dump_end)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(torch.__file__)))
    done = subprocess.run(
        [python, str(driver), str(tmp_path / "theirs")], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    _run_module_dump(tmp_path / "ours")
    for step in (0, 1):
        theirs, ours = _data(tmp_path / "theirs", step), _data(tmp_path / "ours", step)
        assert list(ours) == list(theirs) == MSPROBE_NAMES
        for name in ("Module.mynet.Net.forward.0", "Module.mynet.Net.backward.0"):
            for field in ("input_args", "output", "input"):
                if field in theirs[name]:
                    assert [r["Norm"] for r in ours[name][field]] == pytest.approx(
                        [r["Norm"] for r in theirs[name][field]], rel=1e-6
                    )
