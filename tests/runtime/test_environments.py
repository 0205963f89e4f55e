"""Where the runtime runs: import purity, two gloo ranks, and the NPU path through a fake torch_npu."""

import json
import os
import textwrap

import pytest

PURITY = textwrap.dedent("""
    import json, sys
    import msprobe_runtime
    from msprobe_runtime import PrecisionDebugger, seed_all
    debugger = PrecisionDebugger(dump_path=sys.argv[1], level="mix")
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torch_npu", "libcst", "numpy"))
    print(json.dumps({"heavy": heavy}))
""")


def test_import_and_construction_load_nothing_heavy(run_script, tmp_path):
    script = tmp_path / "purity.py"
    script.write_text(PURITY)
    result, _ = run_script(str(script), str(tmp_path / "dump"))
    assert result["heavy"] == []
    assert not (tmp_path / "dump").exists()  # construction writes nothing either


DIST_MODEL = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    from torch import nn


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            total = y.detach().clone()
            dist.all_reduce(total)
            return y * total
""")

DIST_DRIVER = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp


    def worker(rank, world, init_file, dump, module_dir):
        sys.path.insert(0, module_dir)
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
        import dist_model
        from msprobe_runtime import PrecisionDebugger
        torch.manual_seed(rank)
        model = dist_model.Model()
        debugger = PrecisionDebugger(dump_path=dump, level="mix")
        for _ in range(2):
            debugger.start(model)
            model(torch.randn(2, 4)).sum().backward()
            debugger.stop()
            debugger.step()
        # no debugger.wait(): a spawned child leaves through os._exit, and the last step must still land
        dist.barrier()
        dist.destroy_process_group()


    if __name__ == "__main__":
        mp.spawn(worker, args=(2, sys.argv[1], sys.argv[2], sys.argv[3]), nprocs=2, join=True)
        print(json.dumps({"ok": True}))
""")


@pytest.mark.slow  # two gloo ranks in fresh interpreters
def test_two_gloo_ranks_write_their_own_directories(run_script, tmp_path):
    from msprobe_rewrite.api import rewrite_source

    (tmp_path / "dist_model.py").write_bytes(rewrite_source(DIST_MODEL.encode()))
    driver = tmp_path / "driver.py"
    driver.write_text(DIST_DRIVER)
    dump = tmp_path / "dump"
    run_script(str(driver), str(tmp_path / "init"), str(dump), str(tmp_path))
    for step in range(2):
        assert sorted(os.listdir(dump / f"step{step}")) == ["rank0", "rank1"]
        for rank in range(2):
            with open(dump / f"step{step}" / f"rank{rank}" / "dump.json") as handle:
                names = list(json.load(handle)["data"])
            assert "Distributed.all_reduce.0.forward" in names
            assert "Module.fc.Linear.forward.0" in names and "Module.fc.Linear.backward.0" in names


FAKE_NPU = textwrap.dedent('''
    """A stand-in for torch_npu: a few of its fused APIs, computed with plain torch."""
    import torch


    def npu_rms_norm(x, gamma, epsilon=1e-6):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon)
        return x * rstd * gamma, rstd


    def npu_fusion_attention(query, key, value, head_num=1, input_layout="BSH"):
        scores = torch.softmax(query @ key.transpose(-1, -2), dim=-1)
        return (scores @ value,)
''')

NPU_MODEL = textwrap.dedent("""
    import torch
    import torch_npu


    def block(x, gamma):
        attention = torch_npu.npu_fusion_attention
        normed, _ = torch_npu.npu_rms_norm(x, gamma)
        return attention(normed, normed, normed, head_num=1)[0]
""")

NPU_DRIVER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import msprobe_runtime
    from msprobe_runtime import PrecisionDebugger
    debugger = PrecisionDebugger(dump_path=sys.argv[2], level="L1")
    imported_early = "torch_npu" in sys.modules
    import torch
    import npu_model
    x = torch.randn(2, 3, 4, requires_grad=True)
    gamma = torch.ones(4, requires_grad=True)
    debugger.start()
    npu_model.block(x, gamma).sum().backward()
    debugger.stop()
    debugger.wait()
    print(json.dumps({"imported_early": imported_early}))
""")


def test_npu_catalogue_path_with_a_fake_torch_npu(run_script, tmp_path):
    from msprobe_rewrite.api import rewrite_source

    fake = tmp_path / "site" / "torch_npu"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_NPU)
    (tmp_path / "npu_model.py").write_bytes(rewrite_source(NPU_MODEL.encode()))
    driver = tmp_path / "driver.py"
    driver.write_text(NPU_DRIVER)
    dump = tmp_path / "dump"
    result, _ = run_script(str(driver), str(tmp_path), str(dump), env={"PYTHONPATH": str(tmp_path / "site")})
    assert result["imported_early"] is False
    [leaf] = os.listdir(dump / "step0")
    with open(dump / "step0" / leaf / "dump.json") as handle:
        data = json.load(handle)["data"]
    assert "NPU.npu_rms_norm.0.forward" in data  # statically resolved call site
    assert "NPU.npu_fusion_attention.0.forward" in data  # held in a variable: resolved by identity
    assert "NPU.npu_rms_norm.0.backward" in data
    assert len(data["NPU.npu_rms_norm.0.forward"]["output"]) == 2


def test_without_torch_npu_nothing_imports_it(run_script, tmp_path):
    script = tmp_path / "no_npu.py"
    script.write_text(
        textwrap.dedent("""
        import json, sys
        import torch
        from msprobe_runtime import PrecisionDebugger
        import msprobe_runtime as rt
        debugger = PrecisionDebugger(dump_path=sys.argv[1], level="L1")
        debugger.start()
        rt.call("Torch.relu", torch.relu, torch.ones(2))
        debugger.stop()
        print(json.dumps({"npu": "torch_npu" in sys.modules}))
    """)
    )
    result, _ = run_script(str(script), str(tmp_path / "dump"))
    assert result["npu"] is False
