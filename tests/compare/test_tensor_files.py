"""compare reads a task=tensor dump's files as data only: each a plain file name in the dump's tensor
directory, no link followed, nothing unpickled (msprobe_rewrite/compare/elementwise.py)."""

import os

import pytest

torch = pytest.importorskip("torch")

from msprobe_rewrite.compare.elementwise import tensor_metrics  # noqa: E402


@pytest.fixture
def dirs(tmp_path):
    a, b = tmp_path / "a" / "dump_tensor_data", tmp_path / "b" / "dump_tensor_data"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    t = torch.arange(6, dtype=torch.float32)
    for folder in (a, b):
        torch.save(t, folder / "Torch.add.0.forward.output.0.pt")
    torch.save(t * 2, tmp_path / "outside.pt")  # a readable tensor outside both dumps
    return tmp_path, str(a), str(b)


def test_a_tensor_pair_in_the_dumps_is_compared(dirs):
    _, a, b = dirs
    name = "Torch.add.0.forward.output.0.pt"
    metrics = tensor_metrics(a, name, b, name)
    assert metrics["Cosine"] == pytest.approx(1.0) and metrics["MaxAbsErr"] == 0.0


def test_a_data_name_that_leaves_the_directory_is_not_read(dirs):
    _, a, b = dirs
    for escaping in (
        "../../outside.pt",
        "../outside.pt",
        os.path.join(os.path.dirname(os.path.dirname(a)), "outside.pt"),
    ):
        metrics = tensor_metrics(a, escaping, b, "Torch.add.0.forward.output.0.pt")
        assert "Cosine" not in metrics and "not a file name" in metrics["Err_message"], escaping


def test_a_link_in_the_tensor_directory_is_not_followed(dirs):
    root, a, b = dirs
    os.symlink(root / "outside.pt", os.path.join(a, "planted.pt"))
    metrics = tensor_metrics(a, "planted.pt", b, "Torch.add.0.forward.output.0.pt")
    assert "Cosine" not in metrics and "link" in metrics["Err_message"]


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_nothing_is_unpickled_even_where_torch_lacks_weights_only(dirs, monkeypatch):
    """A torch whose load has no ``weights_only`` (before 1.13) is refused the file: a plain load would run a
    crafted file's payload (here: make a folder)."""
    root, a, b = dirs
    marker = str(root / "payload_ran")
    torch.save(_Payload(marker), os.path.join(a, "crafted.pt"))
    real_load = torch.load

    def old_load(source, *args, **kwargs):
        if "weights_only" in kwargs:
            raise TypeError("load() got an unexpected keyword argument 'weights_only'")
        return real_load(source, *args, weights_only=False, **kwargs)

    monkeypatch.setattr(torch, "load", old_load)
    metrics = tensor_metrics(a, "crafted.pt", b, "Torch.add.0.forward.output.0.pt")
    assert not os.path.exists(marker)
    assert "Cosine" not in metrics and "unpickling" in metrics["Err_message"]
    monkeypatch.setattr(torch, "load", real_load)
    metrics = tensor_metrics(a, "crafted.pt", b, "Torch.add.0.forward.output.0.pt")  # weights_only refuses it
    assert not os.path.exists(marker) and "cannot load tensor data" in metrics["Err_message"]
