"""The catalogue: msprobe's support_wrap_ops.yaml sections, custom entries, user files on top."""

import sys
from pathlib import Path

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


@pytest.mark.parametrize(
    "text, message",
    [
        ("nonsense_section:\n  - x\n", "unknown section 'nonsense_section'"),
        ("functional: gelu\n", "must be a list"),
        ("custom:\n  - a\n", "must map qualified names"),
        ("functional: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_catalogue_files_are_clear_errors(tmp_path, text, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(CatalogueError, match=message):
        load_catalogue([bad])


def test_missing_catalogue_file_is_a_clear_error(tmp_path):
    with pytest.raises(CatalogueError, match="cannot read catalogue"):
        load_catalogue([tmp_path / "absent.yaml"])


# -- coverage of the installed torch ----------------------------------------------------------------------------

# Public callables of torch.nn.functional that are deliberately not APIs. Reviewed against torch 2.13; a new
# torch that adds a tensor function to F fails the test below until the catalogue or this list names it.
FUNCTIONAL_NOT_APIS = {
    "assert_int_or_pair": "utility",  # argument checking helper
    "boolean_dispatch": "utility",  # builds the *_with_indices dispatchers, computes nothing
    "handle_torch_function": "protocol",  # __torch_function__ machinery
    "has_torch_function": "protocol",
    "has_torch_function_unary": "protocol",
    "has_torch_function_variadic": "protocol",
    "native_channel_shuffle": "internal",  # kernel behind F.channel_shuffle, which is catalogued
}


def _public_functional_callables(torch):
    """Public tensor functions of the installed torch.nn.functional: callables that are no class, module or
    typing construct (F imports `Optional` and the like for its annotations)."""
    import inspect

    functional = torch.nn.functional
    names = getattr(functional, "__all__", None) or [n for n in dir(functional) if not n.startswith("_")]
    found = set()
    for name in names:
        obj = getattr(functional, name, None)
        if obj is None or not callable(obj) or inspect.isclass(obj) or inspect.ismodule(obj):
            continue
        if "typing" in (getattr(obj, "__module__", None), type(obj).__module__):
            continue
        found.add(name)
    return found


def test_every_public_functional_tensor_function_is_catalogued():
    torch = pytest.importorskip("torch")
    catalogue = load_catalogue()
    public = _public_functional_callables(torch)
    assert {"gelu", "linear", "scaled_dot_product_attention"} <= public  # the scan itself sees F
    missing = sorted(
        name for name in public - set(FUNCTIONAL_NOT_APIS) if catalogue.dump_name(f"torch.nn.functional.{name}") is None
    )
    assert not missing, (
        f"torch {torch.__version__}: torch.nn.functional functions missing from the catalogue "
        f"(add them to custom_apis.yaml, or to FUNCTIONAL_NOT_APIS with a reason): {missing}"
    )
    wrongly_named = sorted(
        name
        for name in public
        if catalogue.dump_name(f"torch.nn.functional.{name}") not in (None, f"Functional.{name}")
    )
    assert not wrongly_named
    both = sorted(name for name in FUNCTIONAL_NOT_APIS if catalogue.dump_name(f"torch.nn.functional.{name}"))
    assert not both, f"excluded yet catalogued: {both}"


def test_custom_torch_entries_follow_msprobes_naming_and_add_to_its_file():
    """Custom entries under torch use msprobe's prefixes (Functional./Tensor./Torch. + the attribute) and are
    new: an entry msprobe's own file already has belongs there, not in custom_apis.yaml."""
    import yaml

    with open(DEFAULT_FILES[1], "rb") as handle:
        custom = yaml.safe_load(handle)["custom"]
    msprobe = load_catalogue([DEFAULT_FILES[0]], defaults=False)
    torch_entries = {q: d for q, d in custom.items() if q.split(".")[0] == "torch"}
    assert "torch._grouped_mm" in torch_entries
    for qualname, dump_name in torch_entries.items():
        if qualname.startswith("torch.nn.functional."):
            want = "Functional." + qualname[len("torch.nn.functional.") :]
        elif qualname.startswith("torch.Tensor."):
            want = "Tensor." + qualname[len("torch.Tensor.") :]
        else:
            assert qualname.count(".") == 1, qualname  # torch.<name>: other submodules have their own sections
            want = "Torch." + qualname[len("torch.") :]
        assert dump_name == want, qualname
        assert msprobe.dump_name(qualname) is None, f"{qualname} is already in msprobe's support_wrap_ops.yaml"


def test_custom_torch_entries_name_live_callables():
    """No typo in custom_apis.yaml: on the torch the entries were reviewed against (2.13) or newer, every
    torch entry is a callable of the installed torch."""
    torch = pytest.importorskip("torch")
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if version < (2, 13):
        pytest.skip(f"torch {torch.__version__} predates some entries (reviewed against 2.13)")
    custom = {q for q in load_catalogue([DEFAULT_FILES[1]], defaults=False).by_qualname if q.startswith("torch.")}
    assert custom
    dead = []
    for qualname in sorted(custom):
        obj = torch
        for attr in qualname.split(".")[1:]:
            obj = getattr(obj, attr, None)
        if not callable(obj):
            dead.append(qualname)
    assert not dead, f"torch {torch.__version__} has no callable at: {dead}"


@pytest.mark.parametrize(
    "qualname, dump_name",
    [
        ("torch.nn.functional.grouped_mm", "Functional.grouped_mm"),
        ("torch._grouped_mm", "Torch._grouped_mm"),
    ],
)
def test_grouped_mm_is_named_statically_and_by_identity(qualname, dump_name):
    """The MoE experts' matmul: the compiler's catalogue names the call site, and the runtime's identity table
    names the live function object (a dynamic call, `mm = F.grouped_mm; mm(a, b, offs=offs)`)."""
    assert load_catalogue().dump_name(qualname) == dump_name
    torch = pytest.importorskip("torch")
    from msprobe_runtime.identity import build_identity

    obj = torch
    for attr in qualname.split(".")[1:]:
        obj = getattr(obj, attr, None)
    if obj is None:
        pytest.skip(f"torch {torch.__version__} has no {qualname}")
    identity, _ = build_identity()
    assert identity.get(id(obj)) == dump_name


# -- fused-kernel libraries (flash-attn, TransformerEngine, apex) and torch_npu ---------------------------------

FAKES = Path(__file__).resolve().parents[2] / "fixtures" / "fused_libraries" / "site"
LIBRARIES = ("flash_attn", "flash_attn_interface", "flash_attn_3", "transformer_engine", "apex")


@pytest.fixture
def fresh_imports(monkeypatch):
    """The fakes the test imports are forgotten afterwards: they must not stand in for anything later (torch's own
    modules that the identity table imported stay)."""
    yield monkeypatch
    for name in [n for n in sys.modules if n.split(".")[0] in LIBRARIES + ("torch_npu",)]:
        del sys.modules[name]


def test_fused_library_functions_are_named_by_identity_under_every_spelling(fresh_imports):
    """With the fakes of fixtures/fused_libraries imported, each catalogued function they define is named by the
    run-time identity table, and a function reached under two names (the definition, the package's re-export)
    gets one dump name. The catalogue's module paths are the real libraries' (docs/catalogue.md)."""
    pytest.importorskip("torch")
    from msprobe_runtime.identity import _resolve, build_identity

    fresh_imports.syspath_prepend(str(FAKES))
    import apex.contrib.layer_norm.layer_norm  # noqa: F401
    import apex.normalization  # noqa: F401
    import flash_attn  # noqa: F401
    import flash_attn.layers.rotary  # noqa: F401
    import transformer_engine.pytorch  # noqa: F401

    catalogue = load_catalogue()
    identity, _ = build_identity()
    named = {}
    for qualname, dump_name in catalogue.by_qualname.items():
        if qualname.split(".")[0] not in LIBRARIES or qualname.endswith(".apply"):
            continue  # Function.apply is a new bound method at each read: named statically only
        obj = _resolve(qualname)
        if obj is not None:
            assert identity.get(id(obj)) == dump_name, qualname
            named[qualname] = dump_name
    want = {
        "flash_attn.flash_attn_func": "FlashAttn.flash_attn_func",
        "flash_attn.flash_attn_interface.flash_attn_func": "FlashAttn.flash_attn_func",
        "flash_attn.flash_attn_with_kvcache": "FlashAttn.flash_attn_with_kvcache",
        "flash_attn.flash_attn_varlen_qkvpacked_func": "FlashAttn.flash_attn_varlen_qkvpacked_func",
        "flash_attn.layers.rotary.apply_rotary_emb": "FlashAttn.apply_rotary_emb",
        "transformer_engine.pytorch.cpp_extensions.general_gemm": "TE.general_gemm",
        "transformer_engine.pytorch.cpp_extensions.gemm.general_gemm": "TE.general_gemm",
        "transformer_engine.pytorch.cpp_extensions.gemm.gemm": "TE.gemm",
        "transformer_engine.pytorch.cpp_extensions.general_grouped_gemm": "TE.general_grouped_gemm",
        "transformer_engine.pytorch.cpp_extensions.fused_attn.fused_attn_fwd": "TE.fused_attn_fwd",
        "transformer_engine.pytorch.cpp_extensions.fused_attn_bwd": "TE.fused_attn_bwd",
        "apex.normalization.fused_layer_norm.fused_rms_norm_affine": "Apex.fused_rms_norm_affine",
        "apex.normalization.fused_layer_norm.mixed_dtype_fused_layer_norm_affine": (
            "Apex.mixed_dtype_fused_layer_norm_affine"
        ),
    }
    assert {q: named.get(q) for q in want} == want
    # the modules, the optimizer and the context manager are no APIs
    import apex.optimizers
    import transformer_engine.pytorch as te

    for obj in (
        te.Linear,
        te.LayerNormMLP,
        te.TransformerLayer,
        te.fp8_autocast,
        apex.normalization.FusedRMSNorm,
        apex.optimizers.FusedAdam,
    ):
        assert id(obj) not in identity, obj


def _npu_names():
    import yaml

    with open(DEFAULT_FILES[0], "rb") as handle:
        return yaml.safe_load(handle)["torch_npu"]


def test_every_torch_npu_name_resolves_statically_however_imported():
    """msprobe 26.2's torch_npu section (copied unchanged: npu_fusion_attention, npu_rms_norm, npu_rotary_mul,
    npu_swiglu, npu_moe_*, ... and the ``atb.`` submodule's) as a call through the module and by from-import."""
    from msprobe_rewrite.api import rewrite_source

    names = _npu_names()
    assert {
        "npu_fusion_attention",
        "npu_rms_norm",
        "npu_rotary_mul",
        "npu_swiglu",
        "npu_moe_init_routing",
        "npu_grouped_matmul",
        "atb._npu_flash_attention_v2",
    } <= set(names)
    through_module = "import torch_npu\n" + "".join(f"y = torch_npu.{n}(x)\n" for n in names)
    from_imports = "".join(
        f"from torch_npu{'.' + n.rpartition('.')[0] if '.' in n else ''} import {n.rpartition('.')[2]} as f{i}\n"
        f"y = f{i}(x)\n"
        for i, n in enumerate(names)
    )
    for source in (through_module, from_imports):
        rewritten = rewrite_source(source.encode()).decode()
        missing = [n for n in names if f'__msprobe__.call("NPU.{n}", ' not in rewritten]
        assert not missing


def test_every_torch_npu_name_is_named_by_identity_with_a_fake_torch_npu(fresh_imports, tmp_path):
    """A fake torch_npu defining every name of the section (functions at the top, and in ``atb``): the identity
    table, which imports torch_npu at start() where it is installed, names each of them."""
    pytest.importorskip("torch")
    from msprobe_runtime.identity import build_identity

    names = _npu_names()
    package = tmp_path / "torch_npu"
    package.mkdir()
    top = [n for n in names if "." not in n]
    (package / "__init__.py").write_text(
        "from . import atb\n" + "".join(f"def {n}(*a, **k):\n    return a\n" for n in top)
    )
    (package / "atb.py").write_text(
        "".join(f"def {n.split('.', 1)[1]}(*a, **k):\n    return a\n" for n in names if n.startswith("atb."))
    )
    fresh_imports.syspath_prepend(str(tmp_path))
    identity, _ = build_identity()
    import torch_npu

    unnamed = []
    for name in names:
        obj = torch_npu
        for attr in name.split("."):
            obj = getattr(obj, attr)
        if identity.get(id(obj)) != f"NPU.{name}":
            unnamed.append(name)
    assert not unnamed


def test_docs_table_lists_every_fused_library_entry():
    """docs/catalogue.md's tables name every flash-attn, TE and apex entry of custom_apis.yaml, on the row of its
    dump name, and no name the catalogue lacks."""
    import re

    import yaml

    with open(DEFAULT_FILES[1], "rb") as handle:
        custom = yaml.safe_load(handle)["custom"]
    ours = {q: d for q, d in custom.items() if d.split(".")[0] in ("FlashAttn", "FlashAttn3", "TE", "Apex")}
    assert len(ours) > 50
    documented = {}
    text = (Path(__file__).resolve().parents[2] / "docs" / "catalogue.md").read_text()
    for row in re.findall(r"^\| `([\w.]+)` \| (.+?) \|", text, flags=re.M):
        for qualname in re.findall(r"`([\w.]+)`", row[1]):
            documented[qualname] = row[0]
    assert documented == ours
