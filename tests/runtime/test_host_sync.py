"""No host sync from the runtime during forward and backward.

Tensor.item, .cpu, .tolist, .numpy, __bool__, __float__ and __int__ are wrapped (in a fresh interpreter) while
instrumented models step with collection at every level, task and summary_mode (md5 and fingerprint too); no call may
happen inside the forward+backward
window, and none may come from the runtime's files at any time on the training thread.
"""

import textwrap

import pytest

DRIVER = textwrap.dedent("""
    import json, os, sys, threading
    sys.path.insert(0, sys.argv[1])
    import torch
    import msprobe_runtime
    from msprobe_runtime import PrecisionDebugger
    import bignet, nested

    RUNTIME = os.path.dirname(os.path.abspath(msprobe_runtime.__file__))
    window = [False]
    in_window, from_runtime = [], []

    def wrap(name, original):
        def spy(self, *args, **kwargs):
            frame = sys._getframe(1)
            where = (name, threading.current_thread().name, frame.f_code.co_filename, frame.f_lineno)
            if window[0]:
                in_window.append(where)
            if frame.f_code.co_filename.startswith(RUNTIME) and threading.current_thread() is threading.main_thread():
                from_runtime.append(where)
            return original(self, *args, **kwargs)
        return spy

    for name in ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__"):
        setattr(torch.Tensor, name, wrap(name, getattr(torch.Tensor, name)))

    def nested_loss(out):
        return out.logits.pow(2).mean() + out.hidden.mean()

    def bignet_loss(out):
        return out[0].sum() + out[1].sum()

    torch.manual_seed(0)
    cases = [(bignet.BigNet(), torch.randn(3, 32), bignet_loss), (nested.Nested(), torch.randn(6, 8), nested_loss)]
    configs = {}
    for mode in ("statistics", "md5", "fingerprint"):
        configs[mode] = os.path.join(sys.argv[2], f"{mode}.json")
        os.makedirs(sys.argv[2], exist_ok=True)
        with open(configs[mode], "w") as handle:
            json.dump({"statistics": {"summary_mode": mode}}, handle)
    for level in ("L0", "L1", "mix"):
        for task, mode in (("statistics", "statistics"), ("tensor", "statistics"), ("statistics", "md5"),
                           ("statistics", "fingerprint")):
            for index, (model, data, loss_of) in enumerate(cases):
                dump = os.path.join(sys.argv[2], f"{level}-{task}-{mode}-{index}")
                debugger = PrecisionDebugger(configs[mode], dump_path=dump, level=level, task=task)
                for step in range(2):
                    debugger.start(model)
                    window[0] = True
                    loss = loss_of(model(data))
                    model.zero_grad()
                    loss.backward()
                    window[0] = False
                    debugger.stop()
                    debugger.step()
                debugger.wait()
                assert os.path.exists(os.path.join(dump, "step1")), dump
    print(json.dumps({"in_window": in_window, "from_runtime": from_runtime}))
""")


@pytest.mark.slow  # over 2 s: `make check` leaves it to `make test`
def test_no_host_sync_during_forward_and_backward(instrument, run_script, tmp_path):
    instrument("fixtures/bignet/bignet.py")
    instrument("fixtures/nested_model/nested.py")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    dumps = tmp_path / "dumps"
    result, _ = run_script(str(driver), str(tmp_path), str(dumps))
    assert result["from_runtime"] == []
    assert result["in_window"] == []
