"""Cost of the bit-level checksums per tensor, against one read of the same tensor (``torch.sum``).

Variants, each on float32 tensors of several sizes, timed in turns (bench/timing.py):
- ``statistics``: today's Max/Min/Mean/Norm (StatBuffer.add, then the flush);
- ``fingerprint``: ours, on the tensor's device (runtime/checksums.py), launched and read back;
- ``md5``: msprobe's summary_mode md5 as we do it: a copy at record time, CRC32 of it at the flush;
- ``xor``: msprobe's xor checksum (its pure-torch fallback, the path it takes off the NPU), for reference.

    python bench/checksums.py [--sizes 1024,262144,4194304] [--steps 20] [--rounds 3]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from timing import measure_interleaved  # noqa: E402  (bench/ is sys.path[0])
from msprobe_runtime import checksums  # noqa: E402
from msprobe_runtime.statistics import KIND_FLOAT, StatBuffer, slot_values  # noqa: E402


def msprobe_xor(tensor):
    """mindstudio-probe 26.2's ``_xor_checksum_fallback``, restated (msprobe is not imported here)."""
    data = tensor.view(torch.uint8).flatten()
    if data.numel() % 8:
        data = torch.nn.functional.pad(data, (0, 8 - data.numel() % 8))
    words = data.view(torch.int64)
    while words.numel() > 1:
        if words.numel() % 2:
            words = torch.nn.functional.pad(words, (0, 1))
        words = words.view(2, -1)
        words = torch.bitwise_xor(words[0], words[1])
    return words[0]


def variants(t):
    def statistics():
        stats = StatBuffer(nan_inf_count=False)
        slot, _ = stats.add(t, KIND_FLOAT)
        stats.take()
        return slot_values(slot)

    def fingerprint():
        stats = StatBuffer(nan_inf_count=False)
        record = checksums.checksum_of(t, "fingerprint", True, stats)
        stats.take()
        return record.value()

    def md5():
        return checksums.checksum_of(t, "md5", True, None).value()

    return {
        "sum (one read)": lambda: t.sum(),
        "statistics": statistics,
        "fingerprint": fingerprint,
        "md5": md5,
        "xor (msprobe)": lambda: msprobe_xor(t),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,262144,4194304", help="float32 elements, comma-separated")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread; ratio = time / time of one torch.sum over the same tensor")
    for numel in (int(size) for size in args.sizes.split(",")):
        t = torch.randn(numel)
        times = measure_interleaved(variants(t), args.steps, args.rounds, warmup=2)
        base = times["sum (one read)"]
        mb = numel * 4 / 1e6
        print(f"\n{numel} float32 ({mb:.3f} MB)")
        for name, seconds in times.items():
            print(f"  {name:16s} {seconds * 1e6:10.1f} us  {seconds / base:7.2f}x  {mb / seconds:9.1f} MB/s")


if __name__ == "__main__":
    main()
