"""The Triton statistics kernels (runtime/triton_stats.py) and the fingerprint's (runtime/triton_fingerprint.py)
compile for a GPU without one: the interpreter of tests/runtime/test_triton_stats.py runs what the compiler may
refuse (a type it cannot lower, a loop bound it cannot take). Compiled for an H100/H200 (sm_90) by the ptxas
that ships with Triton, in a fresh interpreter without ``TRITON_INTERPRET``, and with no fused multiply-add
(``enable_fp_fusion=False``: a square is rounded before it is added, as torch does); the fingerprint's whole
blocks by 16-byte vector loads where the tensor is aligned."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

COMPILE = """
import json
import triton
from triton.backends import backends
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from msprobe_runtime import triton_stats

if "nvidia" not in backends:
    print(json.dumps(None))
    raise SystemExit
target, options, out = GPUTarget("cuda", 90, 32), {"enable_fp_fusion": False}, []
names = ["x", "n", "iters", "part", "meta", "tensor", "row0", "rows", "repeat", "code",
         "d1", "d2", "d3", "s0", "s1", "s2", "s3", "CONTIGUOUS", "WIDE", "BLOCK", "LOW", "TOP", "ZEROS", "EPS"]
# float8 (LOW 1 to 4): its bytes (*u8), decoded in the kernel; ZEROS: the monitor's |x| < eps count
for x, contiguous, low, zeros in (("*bf16", True, 0, 0), ("*fp64", False, 0, 0), ("*u8", True, 1, 0),
                                  ("*u8", False, 2, 0), ("*u8", True, 3, 0), ("*u8", True, 4, 0),
                                  ("*fp32", True, 0, 1), ("*bf16", False, 0, 1)):
    types = {"x": x, "part": "*fp64", "meta": "*i64", **{name: "i64" for name in triton_stats._INTS}}
    signature = {name: types.get(name, "constexpr") for name in names}
    source = ASTSource(triton_stats._partials, signature,
                       constexprs={"CONTIGUOUS": contiguous, "WIDE": x == "*fp64", "BLOCK": triton_stats._BLOCK,
                                   "LOW": low, "TOP": 448.0 if low else 0.0, "ZEROS": zeros,
                                   "EPS": 1e-8 if zeros else 0.0})
    kernel = triton.compile(source, target=target, options=options)
    label = x + (f" low {low}" if low else "") + (" zeros" if zeros else "")
    out.append([label, "cubin" in kernel.asm, kernel.asm["ptx"].count("fma.rn")])
for low in (0, 1):
    signature = {"part": "*fp64", "meta": "*i64", "values": "*fp64", "counts": "*fp64", "RB": "constexpr",
                 "LOW": "constexpr"}
    source = ASTSource(triton_stats._finish, signature, constexprs={"RB": triton_stats._FINISH_BLOCK, "LOW": low})
    kernel = triton.compile(source, target=target, options=options)
    out.append(["finish" + (" low" if low else ""), "cubin" in kernel.asm, kernel.asm["ptx"].count("fma.rn")])
# several tensors per launch: their addresses read from a table (int64 to a pointer of the dtype DT)
for dt in (0, 1, 2):
    signature = {"table": "*i64", "part": "*fp64", "meta": "*i64", "count": "i64", "DT": "constexpr",
                 "BLOCK": "constexpr", "T": "constexpr"}
    source = ASTSource(triton_stats._partials_many, signature,
                       constexprs={"DT": dt, "BLOCK": triton_stats._BLOCK, "T": 8})
    kernel = triton.compile(source, target=target, options=options)
    out.append([f"many {dt}", "cubin" in kernel.asm, kernel.asm["ptx"].count("fma.rn")])
# two to four tensors per launch: their addresses as arguments, the tensor of a program picked by its index
for x in ("*fp32", "*fp16", "*bf16"):
    signature = {"part": "*fp64", "meta": "*i64", **{f"x{k}": x for k in range(triton_stats._FEW)},
                 **{name: "i64" for name in triton_stats.FEW_INTS if not name.startswith("x")}, "BLOCK": "constexpr"}
    source = ASTSource(triton_stats._partials_few, signature, constexprs={"BLOCK": triton_stats._BLOCK})
    kernel = triton.compile(source, target=target, options=options)
    out.append([f"few {x}", "cubin" in kernel.asm, kernel.asm["ptx"].count("fma.rn")])
# the monitor's figures from its seven-wide partial rows (runtime/monitor/metrics.py's ops, 3 bits each)
signature = {"part": "*fp64", "rows": "i64", "n": "i64", "repeat": "i64", "scalar": "i64", "out": "*fp32",
             "K": "constexpr", "CODES": "constexpr", "RB": "constexpr"}
codes = sum(code << (3 * k) for k, code in enumerate(range(7)))
source = ASTSource(triton_stats._figures, signature, constexprs={"K": 7, "CODES": codes,
                                                                  "RB": triton_stats._FINISH_BLOCK})
kernel = triton.compile(source, target=target, options=options)
out.append(["figures", "cubin" in kernel.asm, kernel.asm["ptx"].count("fma.rn")])
# the fingerprint (runtime/triton_fingerprint.py): a 16-byte-aligned tensor's whole blocks read by vector loads
from msprobe_runtime import triton_fingerprint as fp
few_ints = {name: "i64" for name in fp._FEW_INTS}
signature = {"part": "*i64", "meta": "*i64", **{f"x{k}": "*u8" for k in range(4)}, **few_ints,
             **{name: "constexpr" for name in ("P1", "G1", "P2", "G2", "BLOCK", "LOG", "BITS")}}
constexprs = {"P1": fp._P1, "G1": fp._G1, "P2": fp._P2, "G2": fp._G2, "BLOCK": fp._BLOCK,
              "LOG": fp._BLOCK.bit_length() - 1, "BITS": fp._BITS}
aligned = {(k,): [["tt.divisibility", 16]] for k in range(6)}  # part, meta, x0 to x3
source = ASTSource(fp._hash_few, signature, constexprs=constexprs, attrs=aligned)
kernel = triton.compile(source, target=target, options={**options, "num_warps": fp._WARPS})
out.append(["hash few", "cubin" in kernel.asm, "ld.global.v4" in kernel.asm["ptx"]])
# a call's statistics and hashes in one launch: the statistics' part with no fma, the hashes' bytes a word a thread
few_names = ["part", "meta"] + [f"{n}{k}" for n in ("x", "n", "iters", "rows", "row", "index", "repeat")
                                for k in range(4)] + ["code"]
hash_names = ["hpart", "hmeta"] + [f"h{n}{k}" for n in ("x", "n", "iters", "rows", "row", "index") for k in range(4)]
signature = {**{name: "i64" for name in few_names}, "part": "*fp64", "meta": "*i64",
             **{f"x{k}": "*bf16" for k in range(4)},
             **{name: "i64" for name in hash_names}, "hpart": "*i64", "hmeta": "*i64",
             **{f"hx{k}": "*u8" for k in range(4)}, "stats": "i64",
             **{name: "constexpr" for name in ("BLOCK", "P1", "G1", "P2", "G2", "HBLOCK", "LOG", "BITS", "SPLIT")}}
half = fp._BLOCK // fp._SPLIT
constexprs = {"BLOCK": triton_stats._BLOCK, "P1": fp._P1, "G1": fp._G1, "P2": fp._P2, "G2": fp._G2,
              "HBLOCK": half, "LOG": half.bit_length() - 1, "BITS": fp._BITS, "SPLIT": fp._SPLIT}
at = {name: k for k, name in enumerate(signature)}
aligned = {(at[name],): [["tt.divisibility", 16]] for name in ("hpart", "hmeta", "hx0", "hx1", "hx2", "hx3")}
source = ASTSource(fp._partials_hash_few, signature, constexprs=constexprs, attrs=aligned)
kernel = triton.compile(source, target=target, options=options)
out.append(["partials hash few", "cubin" in kernel.asm, kernel.asm["ptx"].count("fma.rn"),
            "ld.global.b32" in kernel.asm["ptx"]])
names = ("P1", "G1", "P2", "G2", "INV1", "INV2", "BITS", "RB")
signature = {"part": "*i64", "meta": "*i64", "out": "*i64", **{name: "constexpr" for name in names}}
constexprs = {"P1": fp._P1, "G1": fp._G1, "P2": fp._P2, "G2": fp._G2, "INV1": fp._INV1, "INV2": fp._INV2,
              "BITS": fp._BITS, "RB": fp._FINISH_BLOCK}
source = ASTSource(fp._hash_finish, signature, constexprs=constexprs)
kernel = triton.compile(source, target=target, options=options)
out.append(["hash finish", "cubin" in kernel.asm, 0])
print(json.dumps(out))
"""


@pytest.mark.slow
def test_the_kernels_compile_for_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = json.loads(done.stdout.strip().splitlines()[-1])
    if compiled is None:
        pytest.skip("this Triton has no CUDA backend")
    assert compiled == [
        ["*bf16", True, 0],
        ["*fp64", True, 0],
        ["*u8 low 1", True, 0],
        ["*u8 low 2", True, 0],
        ["*u8 low 3", True, 0],
        ["*u8 low 4", True, 0],
        ["*fp32 zeros", True, 0],
        ["*bf16 zeros", True, 0],
        ["finish", True, 0],
        ["finish low", True, 0],
        ["many 0", True, 0],
        ["many 1", True, 0],
        ["many 2", True, 0],
        ["few *fp32", True, 0],
        ["few *fp16", True, 0],
        ["few *bf16", True, 0],
        ["figures", True, 0],
        ["hash few", True, True],
        ["partials hash few", True, 0, True],
        ["hash finish", True, 0],
    ]
