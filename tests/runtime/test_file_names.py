"""Every name that becomes a path stays in its dump folder, and no write follows a link planted at a name
someone could guess (runtime/dump_names.py tensor_file_name, runtime/json_files.py exclusive_temp)."""

import glob
import json
import os

import pytest

torch = pytest.importorskip("torch")

from msprobe_runtime import PrecisionDebugger, dump_names, json_files  # noqa: E402


def _step_dirs(dump):
    return sorted(glob.glob(os.path.join(str(dump), "step*", "*")))


def _json(directory, name):
    with open(os.path.join(directory, name)) as handle:
        return json.load(handle)


@pytest.mark.parametrize(
    "stem,expected",
    [
        ("Debug.loss/train.0", "Debug.loss_train.0.pt"),
        ("../../../../escaped", ".._.._.._.._escaped.pt"),
        ("Module.attn\\q.Linear.forward.0.output.0", "Module.attn_q.Linear.forward.0.output.0.pt"),
        ("a\0b", "a_b.pt"),
        ("Functional.gelu.0.forward.input.0", "Functional.gelu.0.forward.input.0.pt"),
    ],
)
def test_a_tensor_file_name_is_one_plain_name(stem, expected):
    assert dump_names.tensor_file_name(stem) == expected


def test_a_long_name_keeps_its_head_and_a_hash_of_the_whole():
    a, b = "Module." + "layer." * 60 + "a", "Module." + "layer." * 60 + "b"
    name_a, name_b = dump_names.tensor_file_name(a), dump_names.tensor_file_name(b)
    assert len(name_a.encode()) <= 255 and name_a.startswith("Module.layer.") and name_a.endswith(".pt")
    assert name_a != name_b


def test_saved_names_with_separators_stay_in_the_dump_and_keep_the_step(tmp_path):
    dump = tmp_path / "run" / "dump"
    debugger = PrecisionDebugger(dump_path=str(dump), level="debug", task="tensor")
    debugger.start()
    t = torch.arange(3.0)
    debugger.save(t, "loss/train")
    debugger.save(t * 2, "../../../../escaped")
    debugger.stop()
    debugger.step()
    debugger.wait()
    written = [
        os.path.join(folder, name) for folder, _, names in os.walk(tmp_path) for name in names if "escaped" in name
    ]
    assert written and all(path.startswith(str(dump) + os.sep) for path in written), written
    [directory] = _step_dirs(dump)
    data = _json(directory, "debug.json")["data"]
    names = ("loss/train.0.debug", "../../../../escaped.0.debug")  # the user's names, as written
    for name, value in zip(names, (t, t * 2)):
        path = os.path.join(directory, "dump_tensor_data", data[name]["data_name"])
        assert os.path.dirname(path) == os.path.join(directory, "dump_tensor_data")
        assert torch.equal(torch.load(path, weights_only=True), value)


def test_a_module_key_with_a_slash_loses_no_step(tmp_path):
    dump = tmp_path / "dump"
    model = torch.nn.ModuleDict({"attn/q": torch.nn.Linear(2, 2)})
    debugger = PrecisionDebugger(dump_path=str(dump), level="L0", task="tensor")
    for _ in range(2):
        debugger.start(model)
        model["attn/q"](torch.ones(2)).sum().backward()
        debugger.stop()
        debugger.step()
    debugger.wait()
    directories = _step_dirs(dump)
    assert len(directories) == 2
    for directory in directories:
        data = _json(directory, "dump.json")["data"]
        assert "Module.attn/q.Linear.forward.0" in data
        record = data["Module.attn/q.Linear.forward.0"]["output"][0]
        assert os.path.isfile(os.path.join(directory, "dump_tensor_data", record["data_name"]))


def test_no_json_write_follows_a_link_at_a_predictable_temporary_name(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours\n")
    folder = tmp_path / "step"
    folder.mkdir()
    target = folder / "dump.json"
    import threading

    for guess in (f".dump.json.{os.getpid()}.{threading.get_ident()}.tmp", "dump.json.tmp", ".dump.json.tmp"):
        os.symlink(outside, folder / guess)
    json_files.atomic_write_text(str(target), "{}")
    assert outside.read_text() == "not ours\n" and target.read_text() == "{}"
    assert not os.path.islink(target)


def test_no_tensor_file_write_follows_a_link_planted_in_the_tensor_folder(tmp_path):
    dump = tmp_path / "dump"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not ours")
    tensor_dir = dump / "step0" / f"proc{os.getpid()}" / "dump_tensor_data"
    tensor_dir.mkdir(parents=True)
    name = "Torch.relu.0.forward.output.0.pt"
    os.symlink(outside, tensor_dir / (name + ".tmp"))
    os.symlink(outside, tensor_dir / name)
    debugger = PrecisionDebugger(dump_path=str(dump), level="L1", task="tensor")
    debugger.start()
    torch.relu(torch.ones(3))
    debugger.stop()
    debugger.step()
    debugger.wait()
    assert outside.read_bytes() == b"not ours"
    assert not os.path.islink(tensor_dir / name)
    assert torch.equal(torch.load(tensor_dir / name, weights_only=True), torch.ones(3))
