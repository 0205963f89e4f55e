#!/usr/bin/env bash
# Issue 31's GPU checks in one run, for a session lent a device machine (its tool's README: one prepared script,
# run once, read, fix, rerun; a command has 10 minutes at most, a session 15 minutes of device time). Run from the
# repository root there:
#
#     GPU_CHECKS=kernels,per_entry,launches bash tools/gpu_checks.sh    # one call: at most 420 s
#     GPU_CHECKS=llama,records bash tools/gpu_checks.sh                 # a second: under 6 minutes
#
# (all four in one call could pass a command's 10 minutes: each check is cut at its own limit below.)
#
# The image has torch, Triton and transformers but not libcst (the import hook's rewrite of transformers in
# bench/gpu_llama.py) nor mindstudio-probe (its msprobe rows): carry them as wheels in `.whl` (the device README says
# how to download them for Python 3.12), installed here first. Each check writes its log, and its figures where it
# has any, to $OUT (the device tool's folder that comes back; ./gpu-checks elsewhere): at most 8 files.
#
#   kernels    the Triton kernels and the native lane on CUDA tensors, compiled (the CPU runs them interpreted)
#   per_entry  host time per recorded entry on CUDA beside the CPU path's, same machine (the 1.5x), and
#              with every launch through Triton's run (MSPROBE_TRITON_DIRECT=0), and in summary_mode fingerprint
#   launches   launches per recorded entry on a bf16 Llama, counted on the device (statistics, then fingerprint)
#   llama      the table: plain, DIY mode, ours L1/mix/fingerprint, msprobe where it imports
#   records    the records a step leaves to the runtime's Python path on CUDA (tiny Llama, BERT, Qwen3-MoE)
set -uo pipefail
out=${OUT:-gpu-checks}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
checks=${GPU_CHECKS:-kernels,per_entry,launches,llama,records}

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# the runtime and the compiler from this tree, without their dependencies (libcst comes from .whl where carried)
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"

run() {  # run NAME SECONDS COMMAND...: its output in $out/NAME.log, cut at SECONDS
    local name=$1 limit=$2
    shift 2
    case ",$checks," in *",$name,"*) ;; *) return 0 ;; esac
    echo "== $name (at most ${limit}s)"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
    echo "== $name: exit ${PIPESTATUS[0]}"
}

run kernels 150 python3 -m pytest -q -x -p no:cacheprovider tests/runtime/test_triton_stats.py \
    tests/runtime/test_native_lane.py tests/runtime/test_triton_fingerprint.py tests/runtime/test_accelerator.py \
    tests/runtime/test_triton_launch.py
# launched straight to the compiled kernels (the default), then through Triton's run at every launch
# and summary_mode fingerprint on CUDA, and with a call's outputs waiting for the next call's launch
# (MSPROBE_CARRY_OUTPUTS: their figures in the log only, as the launches' below: a call's files are at most 8)
# (the steady loops, the garbage collector's share, at their 3 s each in the first run only: the limit holds five runs)
run per_entry 190 bash -c "python3 bench/per_entry.py --device cuda --json $out/per_entry_cuda.json \
    && MSPROBE_TRITON_DIRECT=0 python3 bench/per_entry.py --device cuda --steady 0 \
    --json $out/per_entry_cuda_triton_run.json \
    && python3 bench/per_entry.py --device cpu --steady 1 --json $out/per_entry_cpu.json \
    && python3 bench/per_entry.py --device cuda --summary-mode fingerprint --calls 1000 --rounds 5 --steady 0 \
    && MSPROBE_CARRY_OUTPUTS=1 python3 bench/per_entry.py --device cuda --calls 1000 --rounds 5 --steady 0"
run launches 80 bash -c "python3 bench/triton_launches.py --device cuda --steps 2 --json $out/launches.json \
    && python3 bench/triton_launches.py --device cuda --steps 2 --summary-mode fingerprint \
    --json $out/launches_fingerprint.json \
    && MSPROBE_CARRY_OUTPUTS=1 python3 bench/triton_launches.py --device cuda --steps 2"
run llama 290 python3 bench/gpu_llama.py --json "$out/gpu_llama.json"
run records 60 python3 bench/python_path_records.py --device cuda --json "$out/python_path_records.json"
