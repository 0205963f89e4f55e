"""Units of the comparison: streaming JSON, alignment, entry names, run discovery and rank pairing."""

import io
import json
import random

import pytest

from msprobe_rewrite.compare import CompareError, compare_runs, jsonstream
from msprobe_rewrite.compare.align import align, lcs
from msprobe_rewrite.compare.loading import pair_runs
from msprobe_rewrite.compare.names import forward_name, split_name


def _lcs_length(a, b):
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = table[i][j] + 1 if x == y else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1]


def test_alignment_is_a_longest_common_subsequence():
    rng = random.Random(0)
    for _ in range(300):
        a = [rng.choice("abc") for _ in range(rng.randint(0, 25))]
        b = [rng.choice("abc") for _ in range(rng.randint(0, 25))]
        matches = lcs(a, b)
        assert all(a[i] == b[j] for i, j in matches)
        assert all(p[0] < q[0] and p[1] < q[1] for p, q in zip(matches, matches[1:]))
        assert len(matches) == _lcs_length(a, b)
        merged = align(a, b, lambda key: key)
        assert [i for i, _ in merged if i is not None] == list(range(len(a)))
        assert [j for _, j in merged if j is not None] == list(range(len(b)))


def test_alignment_falls_back_to_coarse_keys_in_gaps():
    # the same calls at moved lines: fine keys differ everywhere, API and direction still pair them
    a = [("Torch.relu", "forward", "x.py:10"), ("Torch.add", "forward", "x.py:11")]
    b = [("Torch.relu", "forward", "x.py:12"), ("Torch.add", "forward", "x.py:13")]
    assert align(a, b, lambda key: key[:2]) == [(0, 0), (1, 1)]


def test_alignment_of_long_runs_with_one_extra_entry_each_side():
    a = [("op", i % 7) for i in range(20000)]
    b = list(a)
    b.insert(100, ("extra", 0))
    del b[15000]
    merged = align(a, b, lambda key: key[0])
    assert sum(1 for i, j in merged if i is not None and j is not None) == 19999
    assert (None, 100) in merged and (14999, None) in merged


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
def test_streaming_reader_across_chunk_boundaries(monkeypatch, chunk):
    monkeypatch.setattr(jsonstream, "_CHUNK", chunk)
    document = {
        "task": "statistics",
        "level": "L1",
        "n": 12345,
        "data": {
            "A.x.0.forward": {"input_args": [{"Max": 1.5e-7, "v": [1, 2, 3]}], "s": 'a"}{,'},
            "B.y.0.forward": {"output": [None, True, -0.0]},
            "C": {},
        },
        "after": 67890,
    }
    header = {}
    items = list(jsonstream.iter_members(io.StringIO(json.dumps(document, indent=1)), "data", header.__setitem__))
    assert dict(items) == document["data"]
    assert header == {"task": "statistics", "level": "L1", "n": 12345, "after": 67890}
    with pytest.raises(jsonstream.JsonStreamError):
        list(jsonstream.iter_members(io.StringIO('{"data": {"a": 1,'), "data"))


def test_entry_names():
    assert split_name("Functional.gelu.3.forward") == ("Functional.gelu", "forward", 3)
    assert split_name("Tensor.__add__.0.backward") == ("Tensor.__add__", "backward", 0)
    assert split_name("Module.net1.ln1.Linear.forward.2") == ("Module.net1.ln1.Linear", "forward", 2)
    assert split_name("Module.net1.Linear.parameters_grad.0") == ("Module.net1.Linear", "parameters_grad", 0)
    assert split_name("odd") == ("odd", "", None)
    assert forward_name("Functional.gelu.3.backward") == "Functional.gelu.3.forward"
    assert forward_name("Module.a.Linear.backward.1") == "Module.a.Linear.forward.1"
    assert forward_name("Module.a.Linear.parameters_grad.0") == "Module.a.Linear.forward.0"


def _write_dump(directory, scale=1.0, level="L1"):
    directory.mkdir(parents=True)
    record = {
        "type": "torch.Tensor",
        "dtype": "torch.float32",
        "shape": [4],
        "Max": 2.0 * scale,
        "Min": -1.0 * scale,
        "Mean": 0.5 * scale,
        "Norm": 3.0 * scale,
        "requires_grad": False,
    }
    data = {
        "Torch.relu.0.forward": {
            "input_args": [dict(record, Max=2.0, Min=-1.0, Mean=0.5, Norm=3.0)],
            "input_kwargs": {},
            "output": [record],
        }
    }
    (directory / "dump.json").write_text(
        json.dumps({"task": "statistics", "level": level, "framework": "pytorch", "dump_data_dir": None, "data": data})
    )


def test_ranks_are_paired_by_number(tmp_path):
    for rank, scale in ((0, 1.0), (1, 1.0), (2, 1.0)):
        _write_dump(tmp_path / "a" / "step0" / f"rank{rank}")
    for rank, scale in ((1, 1.5), (0, 1.0)):
        _write_dump(tmp_path / "b" / "step0" / f"rank{rank}", scale)
    pairs = pair_runs(str(tmp_path / "a"), str(tmp_path / "b"))
    assert [(a.rank, b.rank) for a, b in pairs] == [(0, 0), (1, 1)]
    summary = compare_runs(str(tmp_path / "a"), str(tmp_path / "b"))
    assert summary["first_divergence"]["pair"] == "step0/rank1"
    assert summary["first_divergence"]["entry"] == "Torch.relu.0.forward"
    # a step directory and a rank directory are runs too
    assert len(pair_runs(str(tmp_path / "a" / "step0"), str(tmp_path / "b" / "step0"))) == 2
    assert len(pair_runs(str(tmp_path / "a" / "step0" / "rank0"), str(tmp_path / "b" / "step0" / "rank1"))) == 1


def test_different_levels_raise(tmp_path):
    _write_dump(tmp_path / "a", level="L1")
    _write_dump(tmp_path / "b", level="mix")
    with pytest.raises(CompareError, match="different levels"):
        compare_runs(str(tmp_path / "a"), str(tmp_path / "b"))


def test_incompatible_dumps_write_nothing(tmp_path):
    _write_dump(tmp_path / "a", level="L1")
    _write_dump(tmp_path / "b", level="L0")
    with pytest.raises(CompareError):
        compare_runs(str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_progress_only_on_a_terminal(tmp_path):
    import io

    from msprobe_rewrite.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    _write_dump(tmp_path / "a")
    _write_dump(tmp_path / "b", scale=1.5)
    shown, hidden = Terminal(), io.StringIO()
    compare_runs(str(tmp_path / "a"), str(tmp_path / "b"), progress=Progress(stream=shown, interval=0))
    compare_runs(str(tmp_path / "a"), str(tmp_path / "b"), progress=Progress(stream=hidden, interval=0))
    assert "comparing" in shown.getvalue() and shown.getvalue().endswith("\r\x1b[K")
    assert hidden.getvalue() == ""


def test_float32_noise_does_not_fire_and_one_percent_does():
    from msprobe_rewrite.compare.metrics import Thresholds, compare_tensors
    from msprobe_rewrite.compare.records import Tensor

    def tensor(max_, min_, mean, norm):
        return Tensor(
            "output.0",
            "output",
            {"dtype": "torch.float32", "shape": [1024], "Max": max_, "Min": min_, "Mean": mean, "Norm": norm},
        )

    limits = Thresholds()
    base = tensor(3.2, -3.1, 1e-6, 32.0)  # a zero-mean activation: its Mean is summation noise
    noisy = tensor(3.2 * (1 + 1e-5), -3.1, -2e-6, 32.0 * (1 - 1e-5))  # another device's summation order
    assert not compare_tensors(noisy, base, limits).exceeds
    off = compare_tensors(tensor(3.2 * 1.01, -3.1 * 1.01, 1.01e-6, 32.0 * 1.01), base, limits)
    assert off.exceeds and off.worst == pytest.approx(0.01 / 1.01)
    assert off.rel[2] == pytest.approx(0.01)  # msprobe's own relative error, for the CSV
    assert compare_tensors(tensor(float("nan"), -3.1, 1e-6, 32.0), base, limits).exceeds
    assert not compare_tensors(
        tensor(float("nan"), -3.1, 1e-6, 32.0), tensor(float("nan"), -3.1, 1e-6, 32.0), limits
    ).exceeds


def _write_entries(directory, names, level="mix"):
    directory.mkdir(parents=True)
    record = {
        "type": "torch.Tensor",
        "dtype": "torch.float32",
        "shape": [4],
        "Max": 2.0,
        "Min": -1.0,
        "Mean": 0.5,
        "Norm": 3.0,
        "requires_grad": False,
    }
    data = {name: {"input": [record], "output": [record]} for name in names}
    (directory / "dump.json").write_text(
        json.dumps({"task": "statistics", "level": level, "framework": "pytorch", "dump_data_dir": None, "data": data})
    )


def test_module_backward_entries_pair_across_the_two_writing_orders(tmp_path):
    """Here a module's backward entry follows its children's; msprobe writes it before them. The same name
    on both sides is one entry, whichever order the two dumps wrote it in."""
    layer = "Module.model.layers.0.self_attn.LlamaAttention.backward.0"
    children = [
        "Module.model.layers.0.self_attn.o_proj.Linear.backward.0",
        "Functional.linear.3.backward",
        "Functional.softmax.0.backward",
        "Module.model.layers.0.self_attn.q_proj.Linear.backward.0",
    ]
    _write_entries(tmp_path / "ours", ["Functional.linear.4.backward", *children, layer, "Torch.cat.0.backward"])
    _write_entries(tmp_path / "msprobe", ["Functional.linear.4.backward", layer, *children, "Torch.cat.0.backward"])
    for a, b in (("ours", "msprobe"), ("msprobe", "ours")):
        summary = compare_runs(str(tmp_path / a), str(tmp_path / b))
        [pair] = summary["pairs"]
        assert pair["unmatched_a_count"] == pair["unmatched_b_count"] == 0, pair
        assert pair["matched"] == 7


def test_runs_with_different_step_counts_name_only_the_unpaired_steps(tmp_path, capsys):
    """Runs without a process group write proc{pid} folders, so the two sides' labels differ even where their
    dumps pair; only the step that one run has and the other has not is unpaired, on stderr and in the
    summary."""
    for step in range(3):
        _write_dump(tmp_path / "a" / f"step{step}" / "proc111")
    for step in range(2):
        _write_dump(tmp_path / "b" / f"step{step}" / "proc222")
    summary = compare_runs(str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "out"))
    err = capsys.readouterr().err
    assert "step2/proc111" in err and "step0" not in err and "step1" not in err
    assert summary["unpaired"] == {"a": ["step2/proc111"], "b": []}
    assert [pair["pair"] for pair in summary["pairs"]] == ["step0/proc111", "step1/proc111"]
    with open(tmp_path / "out" / "compare_summary.json") as handle:
        assert json.load(handle)["unpaired"]["a"] == ["step2/proc111"]
