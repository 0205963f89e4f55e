"""A subscript store on a tensor (``y[0] = v``) is recorded as msprobe's ``Tensor.__setitem__``, with the tensor
as it was before the store; stores into other containers are only performed."""

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import json, sys, types, torch
    from msprobe_rewrite.api import rewrite_source
    source = b"""import torch
    def f(x, table):
        y = x * 2
        y[0] = 7.0
        table["k"] = y
        return y
    """
    module = types.ModuleType("m")
    exec(compile(rewrite_source(source), "m.py", "exec"), module.__dict__)
    from msprobe_runtime import PrecisionDebugger
    debugger = PrecisionDebugger(dump_path=sys.argv[1], level="L1", task="statistics")
    table = {}
    debugger.start()
    out = module.f(torch.ones(3), table)
    debugger.stop()
    debugger.step()
    debugger.wait()
    print(json.dumps({"out": out.tolist(), "same": table["k"] is out}))
''')


def test_tensor_setitem_is_recorded_before_the_store(tmp_path):
    dump = tmp_path / "dump"
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(dump)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"out": [7.0, 2.0, 2.0], "same": True}
    data = json.loads(next(dump.glob("step0/*/dump.json")).read_text())["data"]
    assert list(data) == ["Tensor.__mul__.0.forward", "Tensor.__setitem__.0.forward"]
    target, key, value = data["Tensor.__setitem__.0.forward"]["input_args"]
    assert (target["Max"], target["Min"], target["shape"]) == (2.0, 2.0, [3])
    assert key == {"type": "int", "value": 0} and value == {"type": "float", "value": 7.0}
