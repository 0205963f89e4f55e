"""The catalogue: msprobe's support_wrap_ops.yaml sections, custom entries, user files on top."""
import pytest

from msprobe_runtime.catalogue import DEFAULT_FILES, CatalogueError, load_catalogue


def test_shipped_catalogue_maps_qualified_names_to_dump_names():
    catalogue = load_catalogue()
    assert catalogue.dump_name("torch.nn.functional.gelu") == "Functional.gelu"
    assert catalogue.dump_name("torch.relu") == "Torch.relu"
    assert catalogue.dump_name("torch.Tensor.__add__") == "Tensor.__add__"
    assert catalogue.dump_name("torch.distributed.all_reduce") == "Distributed.all_reduce"
    assert catalogue.dump_name("torch_npu.npu_fusion_attention") == "NPU.npu_fusion_attention"
    assert catalogue.dump_name("megatron.core.fusions.fused_bias_gelu.bias_gelu_impl") == "Megatron.bias_gelu_impl"
    assert catalogue.dump_name("torch.nn.Linear") is None
    assert "torch.nn" in catalogue.modules


def test_msprobe_file_is_accepted_as_it_is(tmp_path):
    """A user's copy of msprobe's support_wrap_ops.yaml, aten section and all, loads unchanged."""
    msprobe_file = tmp_path / "support_wrap_ops.yaml"
    msprobe_file.write_bytes(open(DEFAULT_FILES[0], "rb").read())
    only_msprobe = load_catalogue([msprobe_file], defaults=False)
    assert only_msprobe.dump_name("torch.nn.functional.conv2d") == "Functional.conv2d"
    assert not any(name.startswith("torch.aten") or ".aten." in name for name in only_msprobe.by_qualname)


def test_user_file_adds_and_replaces_entries_and_changes_the_digest(tmp_path):
    extra = tmp_path / "mine.yaml"
    extra.write_text("functional:\n  - my_new_op\ncustom:\n  torch.relu: Mine.relu\n")
    base, merged = load_catalogue(), load_catalogue([extra])
    assert merged.dump_name("torch.nn.functional.my_new_op") == "Functional.my_new_op"
    assert merged.dump_name("torch.relu") == "Mine.relu"
    assert merged.digest != base.digest


@pytest.mark.parametrize("text, message", [
    ("nonsense_section:\n  - x\n", "unknown section 'nonsense_section'"),
    ("functional: gelu\n", "must be a list"),
    ("custom:\n  - a\n", "must map qualified names"),
    ("functional: [unclosed\n", "not valid YAML"),
])
def test_bad_catalogue_files_are_clear_errors(tmp_path, text, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(CatalogueError, match=message):
        load_catalogue([bad])


def test_missing_catalogue_file_is_a_clear_error(tmp_path):
    with pytest.raises(CatalogueError, match="cannot read catalogue"):
        load_catalogue([tmp_path / "absent.yaml"])
