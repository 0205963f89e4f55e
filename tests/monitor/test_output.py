"""The output as msprobe writes it: its folder and CSV file names, its columns, read by msprobe's csv2tb parser;
TensorBoard through torch's SummaryWriter."""

import ast
import csv
import os
import re
import sys
import types

import pytest

from msprobe_runtime.config import ConfigError

CONFIG = {
    "wg_distribution": True,
    "param_distribution": True,
    "mv_distribution": True,
    "ops": ["min", "max", "norm", "zeros", "nans", "mean"],
}


def _csv2tb(root):
    """msprobe's csv2tb module, its names read from its source: the data types, the file pattern, and its
    parse_step_line/parse_step_fn run as written, with read_csv served by a small stand-in for the pandas frame
    (pandas and tensorboard are not installed here)."""
    source = (root / "pytorch" / "monitor" / "csv2tb.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    const = (root / "core" / "common" / "const.py").read_text(encoding="utf-8")
    op_list = ast.literal_eval(re.search(r"OP_LIST = (\[[^\]]*\])", const).group(1))

    class Frame:
        def __init__(self, path):
            with open(path, newline="", encoding="utf-8") as handle:
                self.rows = list(csv.DictReader(handle))
                handle.seek(0)
                self.header = next(csv.reader(handle))

        def keys(self):
            return self.header

        def iterrows(self):
            return enumerate(self.rows)

    const_ns = types.SimpleNamespace(OP_LIST=op_list, HEADER_NAME="name", NAME_SEP=":")
    namespace = {"MonitorConst": const_ns, "read_csv": Frame}
    wanted = {"all_data_type_list", "CSV_FILE_SUFFIX", "parse_step_line", "parse_step_fn"}
    body = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name in wanted)
        or (isinstance(node, ast.Assign) and node.targets[0].id in wanted)
    ]
    exec(compile(ast.Module(body=body, type_ignores=[]), "csv2tb.py", "exec"), namespace)
    return namespace


def test_folder_and_files_are_what_csv2tb_looks_for(train, msprobe_root):
    run = train(CONFIG, steps=3)
    folder = run.monitor.tensorboard_dir
    const = (msprobe_root / "core" / "common" / "const.py").read_text(encoding="utf-8")
    pattern = ast.literal_eval(re.search(r"OUTPUT_DIR_PATTERN = (r\"[^\"]*\")", const).group(1))
    match = re.match(pattern, os.path.basename(folder))
    assert match and match.group(2) == "0"
    assert os.path.dirname(folder) == str(run.output)
    csv2tb = _csv2tb(msprobe_root)
    files = sorted(os.listdir(folder))
    assert files
    for name in files:
        assert any(re.match(f"{kind}{csv2tb['CSV_FILE_SUFFIX']}", name) for kind in csv2tb["all_data_type_list"]), name
    expected = {
        f"{kind}_{step}-{step}.csv"
        for kind in ("grad_reduced", "grad_unreduced", "param_origin", "param_updated")
        for step in range(3)
    }
    expected |= {f"{kind}_{step}-{step}.csv" for kind in ("exp_avg", "exp_avg_sq") for step in (1, 2)}
    assert set(files) == expected


def test_csv2tb_parses_our_csv(train, msprobe_root):
    run = train(CONFIG, steps=3)
    csv2tb = _csv2tb(msprobe_root)
    names = [name for name, _ in run.model.named_parameters()]
    for kind in ("grad_reduced", "grad_unreduced", "param_origin", "param_updated"):
        for step in range(3):
            parsed = csv2tb["parse_step_fn"](os.path.join(run.monitor.tensorboard_dir, f"{kind}_{step}-{step}.csv"))
            assert sorted(parsed) == sorted(f"vp0:{name}" for name in names)
            for per_step in parsed.values():
                assert list(per_step) == [str(step)]
                ops = per_step[str(step)]
                assert list(ops) == CONFIG["ops"]  # shape and dtype are not plotted
                assert all(float(value) == float(value) for value in ops.values())  # no NaN in a clean run


def test_header_and_row_layout(train):
    run = train(dict(CONFIG, ops=["norm", "nans"]), steps=1)
    with open(os.path.join(run.monitor.tensorboard_dir, "grad_reduced_0-0.csv"), newline="") as handle:
        lines = list(csv.reader(handle))
    assert lines[0] == ["vpp_stage", "name", "step", "norm", "nans", "shape", "dtype"]
    assert lines[1][:3] == ["0", "fc1.weight", "0"] and lines[1][4:] == ["0", "[32, 16]", "torch.float32"]
    assert len(lines[1][3].split(".")[1]) <= 6  # ndigits 6 by default


def test_tensorboard_through_summary_writer(train, monkeypatch):
    scalars = []

    class SummaryWriter:
        def __init__(self, folder):
            self.folder = folder

        def add_scalar(self, tag, value, step):
            scalars.append((tag, value, step))

        def close(self):
            scalars.append("closed")

    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = SummaryWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    run = train({"wg_distribution": True, "format": "tensorboard", "ops": ["norm", "max"]}, steps=2)
    assert scalars[-1] == "closed"
    tags = {(tag, step) for tag, _, step in scalars[:-1]}
    assert ("0:fc1.weight/rank0/post_grad_norm", 1) in tags and ("0:head.bias/rank0/acc_grad_max", 0) in tags
    assert len(scalars) - 1 == 2 * 2 * 2 * len(list(run.model.parameters()))  # steps x (pre, post) x ops x params
    assert not [name for name in os.listdir(run.monitor.tensorboard_dir) if name.endswith(".csv")]


def test_tensorboard_missing_is_a_clear_error(tmp_path, monkeypatch):
    import json

    from msprobe_runtime import TrainerMon

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import raises ImportError
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"wg_distribution": True, "format": "tensorboard"}))
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        TrainerMon(str(path))


def test_a_link_planted_at_a_csv_name_is_not_written_through(tmp_path):
    from msprobe_runtime.monitor import writer

    folder = tmp_path / "out" / "Dec05_00-00-00-rank0-abcdef12"
    csv_writer = writer.CSVWriter(str(folder), ["norm"], 6, 1)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    os.symlink(victim, folder / "grad_reduced_0-0.csv")
    rows = [("0:fc1.weight/rank0/post_grad", [1.0], (2, 2), "torch.float32")]
    with pytest.raises(OSError):  # the flush's guard logs it and drops the step (trainer_mon._guarded)
        csv_writer.write("grad_reduced", 0, rows)
    assert victim.read_text() == "keep"
    csv_writer.write("grad_reduced", 1, rows)  # the next block's file is a plain file of its own
    assert (folder / "grad_reduced_1-1.csv").read_text().splitlines()[1] == "0,fc1.weight,1,1.0"
    csv_writer.close()


def test_a_link_planted_as_the_output_folder_is_refused(tmp_path):
    from msprobe_runtime.monitor import writer

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    os.symlink(elsewhere, tmp_path / "out" / "Dec05_00-00-00-rank0-abcdef12")
    with pytest.raises(OSError):
        writer.CSVWriter(str(tmp_path / "out" / "Dec05_00-00-00-rank0-abcdef12"), ["norm"], 6, 1)
    assert os.listdir(elsewhere) == []
