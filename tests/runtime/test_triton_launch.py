"""Launches straight to a compiled Triton kernel (runtime/triton_launch.py): each one lands on the kernel that
``JITFunction.run`` would have chosen for its arguments, with the arguments that ``run`` would have passed.

Without a GPU, Triton's real binder and cache key run against a fake CUDA driver whose "compiled" kernels record their
launches (fixtures/fake_triton_driver.py), in a subprocess: the test process runs Triton's interpreter, under which
a kernel is not a ``JITFunction``."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from fixtures.fake_triton_driver import install, launch_form, triton_key
    fake = install()
    import torch
    from triton import knobs
    from msprobe_runtime import triton_launch, triton_stats as ts

    out = {"checked": 0, "wrong": [], "direct": {}, "pointer reads of direct launches": 0}
    launcher = {"calls": 0, "launches": 0, "heads": set()}  # Triton's CUDA launcher, where the fake driver has it
    if launch_form() is not None:
        launcher_class = launch_form()[1]
        launcher_call = launcher_class.__call__

        def counted(self, *args):
            launcher["calls"] += 1
            return launcher_call(self, *args)

        launcher_class.__call__ = counted

    def addresses(args):  # a tensor as the launcher takes it, by its data_ptr()
        return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)

    def check(launch, kernel, grid, args, names, constants, options):
        kwargs = dict(zip(names, constants), **options)
        key, bound = triton_key(kernel, fake.device, args, kwargs)
        before = launch.direct
        reads = sum(k.pointer_reads for k in kernel.device_caches[fake.device][0].values())
        launch(grid, args, constants)
        if launch.direct > before:
            out["pointer reads of direct launches"] += sum(
                k.pointer_reads for k in kernel.device_caches[fake.device][0].values()) - reads
        stream = fake.get_current_stream(fake.device)
        hit = [k for k in kernel.device_caches[fake.device][0].values() if k.launches]
        landed = [
            k for k in hit
            if k.launches[-1][:6] == (grid, 1, 1, stream, k.function, k.packed_metadata)
            and addresses(k.launches[-1][9:]) == addresses(bound)
        ]
        for k in hit:
            launcher["launches"] += len(k.launches)
            launcher["heads"].update(repr(head) for head in k.launch_heads)  # what the C launch took besides
            k.launches.clear()
            k.launch_heads.clear()
        out["checked"] += 1
        if len(hit) != 1 or len(landed) != 1 or landed[0].key != key:
            out["wrong"].append([repr(constants), [a if type(a) is int else str(a.dtype) for a in args]])
        return launch.direct - before

    part = torch.empty((64, 6), dtype=torch.float64)
    meta = torch.empty((16, 8), dtype=torch.int64)
    base = torch.zeros(4096)
    tensors = {
        "float32": base[:1024],
        "float32 off 16 bytes": base[4:1028],
        "float32 off 4 bytes": base[1:1025],
        "float16": torch.zeros(1024, dtype=torch.float16),
        "bfloat16 off 2 bytes": torch.zeros(1025, dtype=torch.bfloat16)[1:],
        "parameter": torch.nn.Parameter(torch.zeros(1024)),
    }
    ns = {"_partials": ts._partials, "_partials_few": ts._partials_few}
    one = triton_launch.KernelLaunch(ns, "_partials", ("CONTIGUOUS", "WIDE", "BLOCK", "LOW", "TOP"),
                                     enable_fp_fusion=False)
    names = ("CONTIGUOUS", "WIDE", "BLOCK", "LOW", "TOP")
    direct = 0
    for label, x in tensors.items():
        for n in (1, 16, 17, 1024, 3 << 20):
            for ints in ((1, 0, 0, 1), (2, 16, 32, 1), (1, 1, 17, 2)):
                iters, tensor, row0, repeat = ints
                for constants in ((True, False, 1024, 0, 0.0), (False, False, 1024, 0, 0.0)):
                    args = (x, n, iters, part, meta, tensor, row0, 4, repeat, 0, 1, 1, 1, 0, 0, 0, 0)
                    for _ in range(2):
                        direct += check(one, ts._partials, 4, args, names, constants, {"enable_fp_fusion": False})
    out["direct"]["_partials"] = direct
    # an int past int32: Triton's run, every time
    big = (tensors["float32"], 1 << 33, 1, part, meta, 0, 0, 4, 1, 0, 1, 1, 1, 0, 0, 0, 0)
    out["direct"]["int64"] = sum(
        check(one, ts._partials, 4, big, names, (True, False, 1024, 0, 0.0), {"enable_fp_fusion": False})
        for _ in range(3))
    few = triton_launch.KernelLaunch(ns, "_partials_few", ("BLOCK",), enable_fp_fusion=False)
    direct = 0
    for label, x in tensors.items():
        for ns4 in ((1, 1, 1, 1), (16, 17, 1024, 1), (32, 48, 64, 80)):
            args = (part, meta, x, x, tensors["float32"] if x.dtype == torch.float32 else x, x,
                    *ns4, 1, 1, 1, 1, 1, 2, 0, 0, 0, 1, 2, 3, 0, 1, 2, 3, 1, 1, 1, 1, 0)
            for _ in range(2):
                direct += check(few, ts._partials_few, 4, args, ("BLOCK",), (1024,), {"enable_fp_fusion": False})
    out["direct"]["_partials_few"] = direct
    # the fingerprint's kernel: Triton options (num_warps, enable_fp_fusion: its launches') besides the constexprs
    from msprobe_runtime import triton_fingerprint as tf
    hash_names = ("P1", "G1", "P2", "G2", "BLOCK", "LOG", "BITS")
    hashed = triton_launch.KernelLaunch({"_hash_few": tf._hash_few}, "_hash_few", hash_names, **tf._HASH_FEW._options)
    direct = 0
    constants = (tf._P1, tf._G1, tf._P2, tf._G2, 4096, 12, tf._BITS)
    raw = base.view(torch.uint8)
    for xs in ((raw, raw, raw, raw), (raw[3:], raw, raw[16:], raw[1:])):  # aligned or not, each its own key
        args = (meta, meta, *xs, raw.numel(), 5, 17, 1, 1, 1, 1, 1, 4, 1, 1, 0, 0, 4, 5, 6, 0, 1, 2, 3)
        for _ in range(2):
            direct += check(hashed, tf._hash_few, 7, args, hash_names, constants, tf._HASH_FEW._options)
    out["direct"]["_hash_few"] = direct
    # a call's statistics and hashes in one launch
    fused_names = ("BLOCK", "P1", "G1", "P2", "G2", "HBLOCK", "LOG", "BITS", "SPLIT")
    fused = triton_launch.KernelLaunch({"_partials_hash_few": tf._partials_hash_few}, "_partials_hash_few",
                                       fused_names, enable_fp_fusion=False)
    direct = 0
    x = tensors["bfloat16 off 2 bytes"]
    for xs in ((raw, raw, raw, raw), (raw[3:], raw, raw[16:], raw[1:])):
        args = (part, meta, x, x, x, x, 1025, 1, 1, 1, 1, 1, 1, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 1, 1, 1, 1, 2,
                meta, meta, *xs, raw.numel(), 5, 17, 1, 1, 1, 1, 1, 4, 1, 1, 0, 0, 4, 5, 6, 0, 1, 2, 3, 2)
        for _ in range(2):
            direct += check(fused, tf._partials_hash_few, 8, args, fused_names,
                            (1024, tf._P1, tf._G1, tf._P2, tf._G2, 512, 9, tf._BITS, 8),
                            {"enable_fp_fusion": False})
    out["direct"]["_partials_hash_few"] = direct
    # a launch hook set (a profiler's): Triton's run
    hook = lambda metadata: None
    knobs.runtime.launch_enter_hook.add(hook)
    args = (tensors["float32"], 1024, 1, part, meta, 0, 0, 1, 1, 0, 1, 1, 1, 0, 0, 0, 0)
    out["direct"]["hooked"] = sum(
        check(one, ts._partials, 1, args, names, (True, False, 1024, 0, 0.0), {"enable_fp_fusion": False})
        for _ in range(3))
    knobs.runtime.launch_enter_hook.remove(hook)
    # another device: a kernel of its own
    fake.device = 1
    out["direct"]["device 1"] = sum(
        check(one, ts._partials, 1, args, names, (True, False, 1024, 0, 0.0), {"enable_fp_fusion": False})
        for _ in range(3))
    fake.device = 0
    # a stub under the name: called as a kernel, nothing kept
    calls = []

    class Stub:
        def __getitem__(self, grid):
            return lambda *a, **k: calls.append((grid, len(a), sorted(k)))

    ns["_partials"] = Stub()
    one(3, args, (True, False, 1024, 0, 0.0))
    out["stub"] = calls
    launcher["heads"] = sorted(launcher["heads"])
    out["launcher"] = launcher if launch_form() is not None else None
    json.dump(out, sys.stdout)
    """
)


# the native Recorder's lane (CPU tensors taken as a device's: ``triton_cpu="lane"``) through the collector: every
# launch Triton's "compiled" kernels receive, in order, each tensor named by its first appearance
LANE_SCRIPT = textwrap.dedent(
    """
    import json, logging, os, sys, tempfile
    from fixtures.fake_triton_driver import RecordingKernel, install, launch_form
    fake = install()
    import torch
    import msprobe_runtime
    from msprobe_runtime import PrecisionDebugger, collector, shims, statistics, triton_stats

    collector.StatBuffer = lambda counts: statistics.StatBuffer(counts, triton_cpu="lane")
    log, fail_at = [], int(os.environ.get("FAIL_AT", "0"))

    def run(self, *args):
        direct = args[7] is None  # Triton's run passes its knobs' hook chains; a direct launch None
        if direct and fail_at and sum(1 for entry in log if entry[3]) + 1 == fail_at:
            raise RuntimeError("a launch that failed")
        # a pointer parameter by the address the launcher takes (a tensor's data_ptr(), or an int given for it)
        pointers = [k - 9 for k in self.pointers]
        given = [type(args[9 + k]) is not int for k in pointers]
        named = [["address", a if type(a) is int else a.data_ptr()] if k in pointers else a
                 for k, a in enumerate(args[9:])]
        log.append((self.key, args[:3], named, direct, sum(given)))
        if self.launch_heads:  # what the C launch took besides run's arguments (Triton's CUDA launcher: ``heads``)
            heads.add(repr(self.launch_heads[-1]))

    RecordingKernel.record = run
    heads, launcher_calls = set(), [0]
    if launch_form() is not None:  # Triton's CUDA launcher: its __call__ counted (a direct launch may skip it)
        launcher_class = launch_form()[1]
        launcher_call = launcher_class.__call__

        def counted(self, *args):
            launcher_calls[0] += 1
            return launcher_call(self, *args)

        launcher_class.__call__ = counted
    warnings = []

    class Kept(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    logging.getLogger("msprobe_runtime").addHandler(Kept())
    code = {"__msprobe__": msprobe_runtime, "torch": torch}
    exec(
        '''
    def body(xs):
        for x in xs:
            y = __msprobe__.call("Functional.relu", torch.relu, x)
            z = __msprobe__.call("Torch.add", torch.add, x, y)
            w = __msprobe__.call("Torch.cat", torch.cat, [x, y, z])
            __msprobe__.call("Torch.stack", torch.stack, [x, y, z, w[: x.numel()], x])

    def grads(xs):  # backward hooks: each hook's gradients launched as it ends
        for x in xs:
            y = __msprobe__.call("Functional.relu", torch.relu, x)
            __msprobe__.call("Torch.mul", torch.mul, y, y).sum().backward()

    def chain(xs):  # a call's two tensors each: with MSPROBE_CARRY_OUTPUTS, two calls' in one launch
        for x in xs:
            for _ in range(5):
                x = __msprobe__.call("Functional.relu", torch.relu, x)
            __msprobe__.call("Torch.stack", torch.stack, [x, x + 1, x + 2])  # with those waiting: launches of four

    def casts(xs):  # a call's input and output of two dtypes: a launch each
        for x in xs:
            __msprobe__.call("Tensor.to", torch.Tensor.to, x, torch.float16)
            __msprobe__.call("Torch.add", torch.add, x, x.to(torch.float16))

    def integers(xs):  # calls of integer tensors only: no statistics' launch (the integer arenas' records)
        for x in xs:
            ids = (x.detach() * 10).to(torch.int64)
            __msprobe__.call("Torch.remainder", torch.remainder, ids, 7)
            __msprobe__.call("Torch.logical_not", torch.logical_not, ids > 0)

    def start(debugger):
        debugger.start()
    ''',
        code,
    )
    config = None
    if os.environ.get("SUMMARY_MODE"):  # a checksum mode: the fingerprints queued and launched with the statistics
        config = os.path.join(tempfile.mkdtemp(), "config.json")
        with open(config, "w") as handle:
            json.dump({"statistics": {"summary_mode": os.environ["SUMMARY_MODE"]}}, handle)
    debugger = PrecisionDebugger(config_path=config, dump_path=tempfile.mkdtemp(), task="statistics", level="L1")
    code["start"](debugger)
    xs = [torch.randn(n, dtype=dtype) for n in (16, 17, 1024, 5000) for dtype in (torch.float32, torch.bfloat16)]
    xs += [torch.nn.Parameter(torch.randn(33)), torch.randn(4096)[1:1025]]  # a Parameter, an unaligned view
    body = "grads" if os.environ.get("GRADS") else "casts" if os.environ.get("CASTS") else "body"
    body = "chain" if os.environ.get("CHAIN") else "integers" if os.environ.get("INTEGERS") else body
    if body == "grads":
        xs = [x.detach().requires_grad_() for x in xs]
    hook_launches = []  # the lane's launches of a backward hook's gradients by Python (the op's own: none)
    launch = triton_stats.TritonStats._lane_launch
    triton_stats.TritonStats._lane_launch = lambda self: (hook_launches.append(1), launch(self))
    for _ in range(3):
        code[body](xs)
        if os.environ.get("STEPS"):  # a step a round (a checksum mode's native hooks serve from the second)
            debugger.stop()
            debugger.step()
            code["start"](debugger)
    recorder = shims._collector.stats._recorder
    def names(args):
        # each address by its first appearance in the launch (which places share a tensor): across launches an address
        # may be a tensor's and, once it is freed, another's, and the two runs need not free each at the same point
        seen = {}
        return [["address", seen.setdefault(a[1], len(seen))] if type(a) is list else
                ["tensor where no pointer is", str(a.dtype)] if isinstance(a, torch.Tensor) else a for a in args]

    launches = [[key, list(head), names(args)] for key, head, args, _, _ in log]
    json.dump({
        "launches": launches,
        # the tensors given for pointers, each a data_ptr() call and a driver check in Triton's launcher
        "tensors for pointers": [given for _, _, _, direct, given in log if direct],
        "direct": sum(1 for entry in log if entry[3]),
        "hook launches by Python": len(hook_launches),
        "native": None if recorder is None else recorder.direct_launches,
        "warnings": warnings,
        "launcher": None if launch_form() is None else {"calls": launcher_calls[0], "heads": sorted(heads)},
    }, sys.stdout)
    """
)


def run(env_extra=None, script=SCRIPT):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env.update(env_extra or {})
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def launches():
    from msprobe_runtime import triton_launch

    if not triton_launch._DIRECT:
        pytest.skip(f"a Triton this was not checked against ({triton_launch.triton.__version__})")
    return run()


def test_each_launch_lands_on_tritons_kernel_with_tritons_arguments(launches):
    assert launches["checked"] > 400
    assert launches["wrong"] == []


def test_a_direct_launch_gives_each_tensor_by_its_address(launches):
    # Triton's launcher asks a tensor given for a pointer its data_ptr() and has the driver check it (the fake driver
    # counts the calls); an int it takes as it is
    assert launches["pointer reads of direct launches"] == 0


def test_a_direct_launch_calls_the_launchers_c_part_as_its_python_would(launches):
    # Triton's CUDA launcher (a compiled kernel's run) runs Python at each launch before its C launch; a direct launch
    # of a kernel with no scratch memory calls that launch itself (triton_launch.direct_call), with the same arguments
    if launches["launcher"] is None:
        pytest.skip("a Triton whose CUDA launcher the fake driver does not know")
    direct = sum(launches["direct"].values())
    assert direct > 100
    assert launches["launcher"]["calls"] == launches["launcher"]["launches"] - direct
    assert len(launches["launcher"]["heads"]) == 1


def test_the_second_launch_of_a_specialisation_is_direct(launches):
    # each specialisation's first launch goes through Triton's run (which compiles it); every later one is direct
    assert launches["direct"]["_partials"] > 100
    assert launches["direct"]["_partials_few"] > 10
    assert launches["direct"]["_hash_few"] == 2
    assert launches["direct"]["_partials_hash_few"] == 2
    assert launches["direct"]["device 1"] == 2  # its first launch compiled for device 1


def test_what_triton_must_see_goes_through_its_run(launches):
    assert launches["direct"]["int64"] == 0  # an int past int32: Triton's run types it int64
    assert launches["direct"]["hooked"] == 0  # a launch hook wants its metadata
    assert launches["stub"] == [[[3], 17, ["BLOCK", "CONTIGUOUS", "LOW", "TOP", "WIDE", "enable_fp_fusion"]]]


def test_the_switch_turns_it_off():
    from msprobe_runtime import triton_launch

    if not triton_launch._DIRECT:
        pytest.skip("not on for this Triton")
    out = run({"MSPROBE_TRITON_DIRECT": "0"})
    assert out["wrong"] == []
    assert all(count == 0 for count in out["direct"].values())


@pytest.fixture(scope="module")
def native_lane():
    from msprobe_runtime import native_stats, triton_launch

    if not triton_launch._DIRECT:
        pytest.skip(f"a Triton this was not checked against ({triton_launch.triton.__version__})")
    if native_stats.load() is None:
        pytest.skip("the native op does not build here")


def test_the_native_lanes_direct_launches_are_tritons_own(native_lane):
    from msprobe_runtime import triton_launch

    # the same calls, launched straight by the native op, and through Triton's run at every launch: the same
    # kernels (Triton's keys) with the same arguments, in the same order
    direct = run(script=LANE_SCRIPT)
    through_triton = run({"MSPROBE_TRITON_DIRECT": "0"}, script=LANE_SCRIPT)
    assert direct["native"] > 50  # the calls' one to four tensors, past each kernel's first launch
    assert through_triton["native"] == 0 and through_triton["direct"] == 0
    assert len(direct["launches"]) == len(through_triton["launches"])
    assert direct["launches"] == through_triton["launches"]
    assert direct["warnings"] == through_triton["warnings"] == []
    # every pointer by its address (``launch_direct``): the launcher asks no tensor for it
    assert len(direct["tensors for pointers"]) == direct["direct"] and set(direct["tensors for pointers"]) == {0}
    if direct["launcher"] is None:
        pytest.skip(f"a Triton whose CUDA launcher the fake driver does not know ({triton_launch.triton.__version__})")
    # Triton's CUDA launcher (a compiled kernel's run): its Python __call__ is skipped by a direct launch, which
    # hands its C launch what __call__ would have (the statistics kernels need no scratch memory)
    assert through_triton["launcher"]["calls"] == len(through_triton["launches"])
    assert direct["launcher"]["calls"] == len(direct["launches"]) - direct["direct"]
    assert direct["launcher"]["heads"] == through_triton["launcher"]["heads"]
    assert len(direct["launcher"]["heads"]) == 1


def test_the_native_lanes_launches_with_fingerprints_are_tritons_own(native_lane):
    # summary_mode fingerprint: the lane queues each record's bytes too, and the op launches a call's statistics and
    # hashes in one ``_partials_hash_few``, as the Python path's launch (``Fingerprints.launch_with``) would
    direct = run({"SUMMARY_MODE": "fingerprint"}, script=LANE_SCRIPT)
    through_triton = run({"SUMMARY_MODE": "fingerprint", "MSPROBE_TRITON_DIRECT": "0"}, script=LANE_SCRIPT)
    statistics_only = run(script=LANE_SCRIPT)
    assert direct["native"] > 50
    assert through_triton["native"] == 0 and through_triton["direct"] == 0
    assert direct["launches"] == through_triton["launches"]
    assert direct["warnings"] == through_triton["warnings"] == []
    assert set(direct["tensors for pointers"]) == {0}
    # one launch a call's records, as without fingerprints: the hashes went with the statistics (and the flush's
    # one ``_hash_finish`` a fingerprints' arena is not in these: they are counted before the flush)
    assert len(direct["launches"]) == len(statistics_only["launches"])
    # each of them ``_partials_hash_few``'s: the statistics' 31 arguments, the hashes' 26, their programs, 9 constexprs
    assert {len(args) for _, _, args in direct["launches"]} == {31 + 26 + 1 + 9}


def test_the_native_lane_launches_the_hashes_of_an_integer_call_alone(native_lane):
    # summary_mode fingerprint, calls of integer tensors only: no statistics to launch the hashes with, so the op
    # launches them in one ``_hash_few`` of their own, as the Python path's ``Fingerprints.launch`` would (before, each
    # such call's hashes went through that Python launch)
    env = {"INTEGERS": "1", "SUMMARY_MODE": "fingerprint"}
    direct = run(env, script=LANE_SCRIPT)
    through_triton = run({**env, "MSPROBE_TRITON_DIRECT": "0"}, script=LANE_SCRIPT)
    assert direct["launches"] == through_triton["launches"]
    assert direct["warnings"] == through_triton["warnings"] == []
    # every launch ``_hash_few``'s: its 26 arguments and 7 constexprs; a call's input and output in one
    assert {len(args) for _, _, args in direct["launches"]} == {26 + 7}
    assert len(direct["launches"]) == 3 * 2 * 10  # three rounds of two calls on ten tensors
    # past each alignment's first launch (Triton's run, which makes the kernel), straight from the op
    assert direct["native"] >= 0.8 * len(direct["launches"])
    assert set(direct["tensors for pointers"]) == {0}
    # such a launch that fails: said once, the kernels given up (the torch ops' digits for its tensors and after)
    failed = run({**env, "FAIL_AT": "3"}, script=LANE_SCRIPT)
    assert failed["direct"] == failed["native"] == 2  # the two before it, both the op's; none after it
    assert len(failed["warnings"]) == 1 and "a launch that failed" in failed["warnings"][0]


def test_the_native_lane_launches_a_call_of_two_dtypes_directly(native_lane):
    # a cast's input and output (and an add of two dtypes): a launch each dtype, in the order of their first tensors,
    # straight from the op as the Python path would make them through Triton's run
    direct = run({"CASTS": "1"}, script=LANE_SCRIPT)
    through_triton = run({"CASTS": "1", "MSPROBE_TRITON_DIRECT": "0"}, script=LANE_SCRIPT)
    assert direct["launches"] == through_triton["launches"]
    assert direct["warnings"] == through_triton["warnings"] == []
    # three rounds of the same calls: the first round's launches through Triton's run (it makes each kernel), the two
    # after it straight from the op (the Python path's were each launch of such a call; the arenas' ``_finish``
    # launches are Python's too)
    assert direct["native"] >= 0.6 * len(direct["launches"])
    assert set(direct["tensors for pointers"]) == {0}
    # summary_mode fingerprint: the call's hashes with its first dtype's statistics, as the Python path launches them
    direct = run({"CASTS": "1", "SUMMARY_MODE": "fingerprint"}, script=LANE_SCRIPT)
    through_triton = run(
        {"CASTS": "1", "SUMMARY_MODE": "fingerprint", "MSPROBE_TRITON_DIRECT": "0"}, script=LANE_SCRIPT
    )
    assert direct["launches"] == through_triton["launches"]
    assert direct["warnings"] == through_triton["warnings"] == []
    assert direct["native"] >= 0.6 * len(direct["launches"])


@pytest.mark.parametrize("summary_mode", ["statistics", "fingerprint"])
def test_the_native_lane_launches_a_backward_hooks_gradients_itself(native_lane, summary_mode):
    # a hook's gradients launched by the op as the hook ends (``launch_held``), not by a call back into Python; the
    # same launches as through Triton's run. With fingerprints (a step a round: the native hooks serve a checksum mode
    # from its second step), their hashes in the same launch, the op taking both locks (before, each such hook's
    # queues were launched by Python: as many as through Triton's run)
    env = {"GRADS": "1"}
    if summary_mode == "fingerprint":
        env.update(SUMMARY_MODE="fingerprint", STEPS="1")
    direct = run(env, script=LANE_SCRIPT)
    through_triton = run({**env, "MSPROBE_TRITON_DIRECT": "0"}, script=LANE_SCRIPT)
    assert direct["launches"] == through_triton["launches"]
    assert direct["warnings"] == through_triton["warnings"] == []
    # the same backward three times: through Triton's run every hook's by Python; direct, at most the first round's
    # (their launches make the kernels), here none (the forward calls made them)
    assert through_triton["hook launches by Python"] >= 3 * 10
    assert direct["hook launches by Python"] <= through_triton["hook launches by Python"] / 3
    assert set(direct["tensors for pointers"]) == {0}


def test_a_failed_direct_launch_gives_the_kernels_up_with_one_warning(native_lane):
    failed = run({"FAIL_AT": "3"}, script=LANE_SCRIPT)
    assert failed["direct"] == 2  # the two before it; none after: the torch ops serve
    assert len(failed["warnings"]) == 1 and "a launch that failed" in failed["warnings"][0]
    # the second launch of a cast (its output's, the first its input's): the one before it only
    failed = run({"FAIL_AT": "2", "CASTS": "1"}, script=LANE_SCRIPT)
    assert failed["direct"] == 1
    assert len(failed["warnings"]) == 1 and "a launch that failed" in failed["warnings"][0]


def test_a_calls_outputs_left_for_the_next_launch_go_straight_too(native_lane):
    # MSPROBE_CARRY_OUTPUTS: a call's outputs wait for the next call's launch, so fewer launches; the op launches a
    # queue of a waiting call and the next one straight, a group of more than four tensors in launches of four
    # (before, such a queue was the Python path's: through Triton's run)
    carried = run({"CHAIN": "1", "MSPROBE_CARRY_OUTPUTS": "1"}, script=LANE_SCRIPT)
    through_triton = run({"CHAIN": "1", "MSPROBE_CARRY_OUTPUTS": "1", "MSPROBE_TRITON_DIRECT": "0"}, script=LANE_SCRIPT)
    each = run({"CHAIN": "1"}, script=LANE_SCRIPT)
    assert carried["warnings"] == through_triton["warnings"] == each["warnings"] == []
    assert carried["launches"] == through_triton["launches"]  # the op's launches are the Python path's
    # five relus and a stack a round: six launches each; with outputs waiting, two relus a launch and the stack's four
    # tensors with the last relu's two in launches of four and two: four (a few more where a kernel is first made)
    assert len(carried["launches"]) <= 0.7 * len(each["launches"])
    assert carried["native"] >= 0.6 * len(carried["launches"])
    assert set(carried["tensors for pointers"]) == {0}


# every kernel of ours compiled through Triton's run (the fake driver "compiles" at each specialisation's first launch),
# by the native lane's records, a backward, the flush, a checksum mode's fingerprints and the monitor's figures: the
# ``enable_fp_fusion`` each compile was asked, by kernel, and the warnings the run gave
OPTIONS_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, tempfile, warnings
    from fixtures.fake_triton_driver import install
    install(keep=False)
    import torch
    from triton.runtime.jit import JITFunction
    import msprobe_runtime
    from msprobe_runtime import PrecisionDebugger, collector, statistics, triton_stats

    asked = {}
    pack = JITFunction._pack_args

    def recorded(self, backend, kwargs, *rest):
        asked.setdefault(self.__name__, set()).add(repr(kwargs.get("enable_fp_fusion", "not said")))
        return pack(self, backend, kwargs, *rest)

    JITFunction._pack_args = recorded
    collector.StatBuffer = lambda counts: statistics.StatBuffer(counts, triton_cpu="lane")
    code = {"__msprobe__": msprobe_runtime, "torch": torch}
    exec(
        '''
    def body(xs):
        for x in xs:
            y = __msprobe__.call("Functional.relu", torch.relu, x)
            z = __msprobe__.call("Torch.cat", torch.cat, [x, y, y, y, y])
            __msprobe__.call("Torch.mul", torch.mul, z, z).sum().backward()

    def start(debugger):
        debugger.start()

    def stop(debugger):
        debugger.stop()
        debugger.step()
    ''',
        code,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = os.path.join(tempfile.mkdtemp(), "config.json")
        with open(config, "w") as handle:
            json.dump({"statistics": {"summary_mode": "fingerprint"}}, handle)
        debugger = PrecisionDebugger(config_path=config, dump_path=tempfile.mkdtemp(), task="statistics", level="L1")
        code["start"](debugger)
        xs = [torch.randn(n, dtype=dtype, requires_grad=True) for n in (16, 5000) for dtype in (torch.float32,
                                                                                                torch.bfloat16)]
        code["body"](xs)
        code["stop"](debugger)
        debugger.wait()
        triton_stats.monitor_figures(torch.randn(100), (0, 1, 2, 3, 4, 5), 1e-8, statistics.dense_view)
    json.dump({"asked": {name: sorted(values) for name, values in asked.items()},
               "warnings": [str(w.message) for w in caught if "fusion" in str(w.message).lower()]}, sys.stdout)
    """
)


@pytest.mark.slow  # a subprocess (the fake driver cannot share this process's interpreted Triton)
def test_every_kernel_says_whether_it_fuses_multiply_add():
    # Triton 3.9 warns at the first launch of a kernel not told (the default turns from fusion on to off in 3.10):
    # the fingerprints' and the monitor's kernels were not, and a user of summary_mode fingerprint or the monitor got
    # Triton's warning in the training log. None fuses: the statistics round a square before they add it, as torch does
    from msprobe_runtime import triton_launch

    if not triton_launch._DIRECT:
        pytest.skip(f"a Triton this was not checked against ({triton_launch.triton.__version__})")
    done = run(script=OPTIONS_SCRIPT)
    assert {"_partials", "_partials_hash_few", "_hash_few", "_hash_finish", "_finish", "_figures"} <= set(done["asked"])
    assert done["asked"] == {name: ["False"] for name in done["asked"]}
    assert done["warnings"] == []
