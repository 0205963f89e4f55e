"""One grammar of dump entry names: what the collector builds, compare parses back (runtime/dump_names.py)."""

import re

import pytest

from msprobe_rewrite.compare import names as compare_names
from msprobe_runtime import dump_names as dn


@pytest.mark.parametrize("api, index", [("Functional.gelu", 0), ("Tensor.__add__", 12), ("Megatron.bias_gelu", 3)])
def test_api_entries_parse_back(api, index):
    call = dn.api_call(api, index)
    assert dn.split_name(dn.api_forward(call)) == (api, "forward", index)
    assert dn.split_name(dn.api_backward(call)) == (api, "backward", index)
    assert dn.forward_name(dn.api_backward(call)) == dn.api_forward(call)
    assert dn.is_forward(dn.api_forward(call)) and not dn.is_forward(dn.api_backward(call))
    assert dn.api_call_forward(api, index) == (call, dn.api_forward(call))  # the collector's one call for both


@pytest.mark.parametrize("path, cls", [("net1.ln1", "Linear"), ("0.decoder.layers.1.mlp", "MLP")])
def test_module_entries_parse_back(path, cls):
    prefix = dn.module_prefix(path, cls)
    forward = dn.module_forward(prefix, 2)
    base = f"Module.{path}.{cls}"
    assert dn.split_name(forward) == (base, "forward", 2)
    assert dn.split_name(dn.module_backward(forward)) == (base, "backward", 2)
    assert dn.split_name(dn.parameters_grad(prefix, 1)) == (base, "parameters_grad", 1)
    assert dn.forward_name(dn.module_backward(forward)) == forward
    assert dn.is_module(forward) and dn.is_forward(forward)
    assert not dn.is_forward(dn.module_backward(forward))


def test_tensor_file_stems_extend_the_entry_name():
    assert dn.stem("Functional.gelu.0.forward", "input") == "Functional.gelu.0.forward.input"
    assert dn.stem("Module.a.Linear.forward.0", "parameters", "weight") == "Module.a.Linear.forward.0.parameters.weight"


def test_compare_reads_names_with_the_collectors_grammar():
    assert compare_names.split_name is dn.split_name and compare_names.forward_name is dn.forward_name
    assert compare_names.split_name("odd") == ("odd", "", None)


# msprobe's own patterns for a full dump name in its scope check (msprobe 26.2), kept here as the reference
MSPROBE_API_NAME = re.compile(r"^[A-Za-z_]\w*\..+\.\d+\.(forward|backward)$")
MSPROBE_MODULE_NAME = re.compile(r"^(Module|Cell)\..+\.(forward|backward)\.\d+$")


@pytest.mark.parametrize(
    "name",
    [
        "Torch.relu.1.forward",
        "Functional.gelu.0.backward",
        "Tensor.__add__.12.forward",
        "Module.net1.Linear.forward.0",
        "Cell.a.b.Dense.backward.3",
        "Module.net1.Linear.parameters_grad.0",
        "Torch.relu.1",
        "Torch.relu.forward",
        "Module.a.1.forward",
        "relu.1.forward",
        "1x.relu.1.forward",
        "Module.forward.0",
        "Torch.relu.x.forward",
        "Distributed.all_reduce.0.backward",
        "NPU.npu_fusion_attention.2.forward",
        "Module.net.Linear.forward.x",
    ],
)
def test_scope_kind_accepts_what_msprobes_scope_patterns_accept(name):
    expected = (
        "module"
        if MSPROBE_MODULE_NAME.match(name)
        else "api"
        if MSPROBE_API_NAME.match(name) and not name.startswith(("Module.", "Cell."))
        else None
    )
    assert dn.scope_kind(name) == expected
