"""The fused kernels users run, by name: flash-attn, TransformerEngine and apex, through the fakes of
fixtures/fused_libraries (none of the real ones imports without a GPU). fixtures/fused_libraries/train.py trains
2 steps of a small causal LM on them with apex's FusedAdam; each run is a fresh interpreter.

- ``rewritten`` runs: ``msprobe-rewrite run --packages flash_attn,transformer_engine,apex -- train.py`` at L1
  and mix, the libraries instrumented on import as the training script is (as megatron users pass
  ``--packages``). Every catalogued entry point the model reaches is one entry by its dump name
  (``FlashAttn.flash_attn_func.0.forward``, ``TE.general_gemm.N.forward``, ``Apex.fused_rms_norm_affine``, ...),
  with its backward where it is differentiated (the gradients of q, k and v for flash_attn_func, of the packed
  qkv for its packed variant); TE's fused_attn_bwd, called by its autograd Function's backward, is recorded
  while the backward runs; nothing inside a fused call is recorded, as nothing inside the CUDA kernel could be.
  At mix, TE's and apex's modules are Module entries, the APIs are parented to them, and FusedAdam's step is
  the optimizer phase.
- ``installed`` run: only train.py rewritten, the libraries as installed (a copy outside the script's folder,
  which ``run`` would instrument): train.py's own call sites are still named; what TE's modules call inside
  is seen only as the torch operations the observing mode records.
- Every run: losses, gradients, parameters after FusedAdam's step and the decoded output are bit-identical to
  the plain run, and the identity checks (re-exports compared with ``is`` and ``==``, functions as dict keys,
  ``activation == F.gelu`` inside the fake TE) answer as in the plain run.

Cost: four runs of 4 to 8 s each on 2 cores.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from fixtures.reproducible_env import training_env

pytestmark = pytest.mark.slow

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "fixtures" / "fused_libraries"
SCRIPT = FIXTURE / "train.py"
PACKAGES = "flash_attn,transformer_engine,apex"
TIMEOUT = 300

# (dump name, whether its call is differentiated in the step): each called once in step 0
ONCE = [
    ("FlashAttn.flash_attn_func", True),  # from flash_attn import flash_attn_func: static
    ("FlashAttn.flash_attn_varlen_func", True),  # bound twice (try/except, as megatron): by identity
    ("FlashAttn.flash_attn_qkvpacked_func", True),  # flash_attn.flash_attn_qkvpacked_func
    ("FlashAttn.flash_attn_with_kvcache", False),  # decoding under no_grad
    ("Apex.fused_layer_norm_affine", True),
    ("Apex.FusedLayerNormAffineFunction", True),  # FusedLayerNormAffineFunction.apply, as megatron calls it
]
# called inside the libraries' own modules: named only where the libraries are rewritten
INSIDE_LIBRARIES = [
    ("Apex.fused_rms_norm_affine", True),  # FusedRMSNorm.forward, the same file as its definition
    ("TE.general_grouped_gemm", True),  # GroupedLinear
    # DotProductAttention's FusedAttnFunc: fused_attn_fwd in its forward (no graph there, so no backward
    # entry), fused_attn_bwd in its backward (an API called while the step's backward runs)
    ("TE.fused_attn_fwd", False),
    ("TE.fused_attn_bwd", False),
]
# general_gemm: 9 in TE's Linear, LayerNormLinear and LayerNormMLP modules (one of them at decoding, under
# no_grad) and 1 in train.py's LM head
GEMMS_IN_MODULES, GEMMS_IN_SCRIPT = 9, 1
# the fakes' insides: plain torch that stands for a CUDA kernel
INSIDE_FUSED = (
    "Torch.einsum",
    "Torch.logsumexp",
    "Torch.exp",
    "Tensor.__matmul__",
    "Tensor.t",
    "Functional.gelu",
    "Tensor.masked_fill",
)
TE_AND_APEX_MODULES = {
    "Module.norm1.LayerNorm": True,
    "Module.attn.qkv.Linear": True,
    "Module.attn.proj.Linear": True,
    "Module.norm2.FusedRMSNorm": True,
    "Module.mlp.LayerNormMLP": True,
    "Module.experts.GroupedLinear": True,
    "Module.block.TransformerLayer": False,
    "Module.block.self_attention.MultiheadAttention": False,
    "Module.block.self_attention.layernorm_qkv.LayerNormLinear": True,
    "Module.block.self_attention.core_attention.DotProductAttention": False,
    "Module.block.self_attention.proj.Linear": True,
    "Module.block.layernorm_mlp.LayerNormMLP": True,
}  # module -> whether it holds parameters of its own (a parameters_grad entry)
CALL = re.compile(r"^(?P<api>.+)\.\d+\.(?P<direction>forward|backward)$")


class Runs:
    def __init__(self, workdir):
        self.workdir = workdir
        self.installed_site = workdir / "installed-site"
        shutil.copytree(FIXTURE / "site", self.installed_site)
        self.results = {}

    def get(self, kind, level):
        if (kind, level) not in self.results:
            self.results[kind, level] = self._run(kind, level)
        return self.results[kind, level]

    def _run(self, kind, level):
        dump = self.workdir / f"dump-{kind}-{level}"
        site = self.installed_site if kind == "installed" else FIXTURE / "site"
        if kind == "plain":
            command = [sys.executable, str(SCRIPT)]
        else:
            packages = ["--packages", PACKAGES] if kind == "rewritten" else []
            command = [
                sys.executable,
                "-m",
                "msprobe_rewrite",
                "run",
                *packages,
                "--",
                str(SCRIPT),
                "--level",
                level,
                "--dump",
                str(dump),
            ]
        env = training_env(
            os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]), PYTHONDONTWRITEBYTECODE="1"
        )
        done = subprocess.run(command, capture_output=True, text=True, cwd=str(self.workdir), env=env, timeout=TIMEOUT)
        assert done.returncode == 0, f"{' '.join(command)}\n{done.stderr[-6000:]}"
        assert "msprobe_runtime" not in done.stderr, done.stderr[-6000:]  # no collection error was logged
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if kind != "plain":
            [rank] = os.listdir(dump / "step0")
            step0 = dump / "step0" / rank
            result["dump"] = json.loads((step0 / "dump.json").read_text())["data"]
            result["construct"] = json.loads((step0 / "construct.json").read_text())
        return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("fused"))


def _calls(data):
    """API dump name -> Counter of directions, over the API entries of a dump."""
    calls = {}
    for entry in data:
        match = CALL.match(entry)
        if match and not entry.startswith("Module."):
            calls.setdefault(match["api"], Counter())[match["direction"]] += 1
    return calls


def test_plain_run_trains_and_its_identity_checks_hold(runs):
    plain = runs.get("plain", "none")
    assert plain["checks"] == {
        "reexport_is_same": True,
        "name_equals_module_attribute": True,
        "held_is_imported": True,
        "backend_by_function": "flash",
        "te_gemm_reexport": True,
        "te_fused_activation": "gelu",
        "varlen_bound": True,
    }
    losses = [float.fromhex(loss) for loss in plain["losses"]]
    assert losses[1] < losses[0]  # FusedAdam moved the parameters
    assert plain["params"][0] != plain["params"][1]


@pytest.mark.parametrize("kind, level", [("rewritten", "L1"), ("rewritten", "mix"), ("installed", "L1")])
def test_collection_is_bit_identical_and_changes_no_identity_check(runs, kind, level):
    plain, collected = runs.get("plain", "none"), runs.get(kind, level)
    for key in ("checks", "losses", "grads", "params", "decoded"):
        assert collected[key] == plain[key], key


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_fused_entry_points_are_recorded_by_name(runs, level):
    data = runs.get("rewritten", level)["dump"]
    calls = _calls(data)
    for api, differentiated in ONCE + INSIDE_LIBRARIES:
        assert calls.get(api) == Counter(forward=1, backward=1 if differentiated else 0) - Counter(), api
    assert calls["TE.general_gemm"] == Counter(
        forward=GEMMS_IN_MODULES + GEMMS_IN_SCRIPT, backward=GEMMS_IN_MODULES + GEMMS_IN_SCRIPT - 1
    )
    # what the fakes compute inside a fused call is not recorded, as nothing inside a CUDA kernel could be
    assert not [name for name in INSIDE_FUSED if name in calls]
    forward = data["FlashAttn.flash_attn_func.0.forward"]
    assert [arg["shape"] for arg in forward["input_args"]] == [[2, 8, 4, 8]] * 3
    assert forward["input_kwargs"] == {"causal": {"type": "bool", "value": True}}
    assert forward["output"][0]["shape"] == [2, 8, 4, 8]
    backward_shapes = {
        api: [out["shape"] for out in data[f"{api}.0.backward"]["output"]]
        for api in ("FlashAttn.flash_attn_func", "FlashAttn.flash_attn_qkvpacked_func")
    }
    assert backward_shapes == {
        "FlashAttn.flash_attn_func": [[2, 8, 4, 8]] * 3,  # the gradients of q, k, v
        "FlashAttn.flash_attn_qkvpacked_func": [[2, 8, 3, 4, 8]],
    }  # of the packed qkv
    if level == "L1":
        assert not [entry for entry in data if entry.startswith("Module.")]


def test_te_and_apex_modules_are_module_entries_at_mix(runs):
    run = runs.get("rewritten", "mix")
    data, construct = run["dump"], run["construct"]
    for module, has_parameters in TE_AND_APEX_MODULES.items():
        assert f"{module}.forward.0" in data and f"{module}.backward.0" in data, module
        assert (f"{module}.parameters_grad.0" in data) == has_parameters, module
    assert "weight" in data["Module.attn.qkv.Linear.forward.0"]["parameters"]
    parents = {
        "TE.general_gemm.0.forward": "Module.attn.qkv.Linear.forward.0",
        "TE.fused_attn_fwd.0.forward": "Module.block.self_attention.core_attention.DotProductAttention.forward.0",
        "TE.general_grouped_gemm.0.forward": "Module.experts.GroupedLinear.forward.0",
        "Apex.fused_rms_norm_affine.0.forward": "Module.norm2.FusedRMSNorm.forward.0",
        "FlashAttn.flash_attn_func.0.forward": "Module.attn.Attention.forward.0",
        "Apex.FusedLayerNormAffineFunction.0.forward": None,  # called by the model's own forward
    }
    assert {entry: construct.get(entry, "absent") for entry in parents} == parents
    # FusedAdam is a torch.optim.Optimizer: its step is the optimizer phase (its fake kernel is Python, so
    # its tensor operations are entries; amp_C's kernel leaves none)
    assert construct["optimizer"] is None
    in_step = [entry for entry, parent in construct.items() if parent == "optimizer"]
    assert "Tensor.addcmul_.0.forward" in in_step and len(in_step) > 100


def test_installed_libraries_name_the_scripts_own_call_sites(runs):
    """Only train.py rewritten: its calls of the libraries are named; TE's and apex's modules, left as
    installed, run their fused functions as plain calls, which only their torch operations show."""
    calls = _calls(runs.get("installed", "L1")["dump"])
    for api, differentiated in ONCE:
        assert calls.get(api) == Counter(forward=1, backward=1 if differentiated else 0) - Counter(), api
    assert calls["TE.general_gemm"] == Counter(forward=GEMMS_IN_SCRIPT, backward=GEMMS_IN_SCRIPT)
    assert not [api for api, _ in INSIDE_LIBRARIES if api in calls]
    assert "Torch.einsum" in calls and "Tensor.__matmul__" in calls  # the observing mode's view of TE's modules
