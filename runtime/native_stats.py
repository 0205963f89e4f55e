"""The fused statistics pass: one read of a CPU tensor gives Max, Min, Mean, Norm and the NaN and Inf counts.

A native op (C++ in ``runtime/native/stats_op.cpp``, built by ``torch.utils.cpp_extension.load``) compiled once
on the user's machine, on first use, and cached under ``native/`` in the tool's cache folder (``cache_folders``:
``$MSPROBE_CACHE_DIR``, default ``$XDG_CACHE_HOME/msprobe-rewrite``, else ``~/.cache/msprobe-rewrite``) in a
folder keyed by the bytes of every file in ``runtime/native/``, the compiler flags, the CPU, torch and Python; a
cached build is imported directly, without ninja (a few milliseconds). ``MSPROBE_NATIVE_STATS=0`` turns it off.
Without a compiler or ninja, ``load`` warns once and returns None, and ``statistics.StatBuffer`` keeps its
torch-op path.

When it is built: ``load`` is called when a ``StatBuffer`` is made, that is at the debugger's first ``start()``,
before any record of the run, and it blocks there, with one log line saying so (a first build runs the C++ compiler,
a cached one is only imported: docs/benchmarks-log.md, 'One fused pass per tensor'). A build in a background thread,
with the torch-op path until it is ready, was rejected: the two paths round Mean and Norm differently in the last
float32 bit (Max, Min and the counts are equal), and which steps used which would depend on timing, so two identical
runs could write different dumps. Here a run uses one path from its first record to its last.
A build runs in a private folder and is renamed into place whole, its ``ready`` marker recording the library's
size and sha256 (``native_cache``): later processes import the library without a lock, and only while it
still matches the record. Concurrent ranks of one machine build once, the others waiting on a lock that the
kernel releases if its holder dies.

The loop (``native/stats_op.cpp``): 16 float lanes that -O3 vectorises (a plain scalar loop is slower than torch's
four ops, because float reductions are not reassociated without explicit lanes: bench/statistics_pass.py times the
op against them); sums and sums of squares (each squared in float, as torch squares it) accumulate in double lanes,
so a 100 M-element tensor's mean stays accurate to far better than float32 rounding, while a sum past float's range
is inf, as torch's float accumulators make it; Max and Min skip NaN (``v > m ? v : m``) and become NaN when the sum
of squares is NaN, which happens
exactly when a NaN is present (as ``torch.amax`` propagates NaN). The NaN and Inf counts cost nothing on a
clean tensor: a block's sum of squares is finite when the block holds no NaN, no Inf and no value past
1.8e19 (whose float square is inf), and only a block whose sum is not finite is read a second time to
count them (``v != v``, ``|v| == inf``). Tensors of more than 64 K elements are cut into fixed blocks of 64 K
elements, reduced by ``at::parallel_for`` and combined in block order, so values do not depend on the thread
count. Mean and Norm are rounded to the tensor's dtype, as torch's ``mean`` and ``vector_norm`` give them.
The op also takes the layout work off the Python side (every attribute read of a tensor is a Python call while
a TorchFunctionMode is pushed): it refuses what it cannot read (another device or dtype, a tensor subclass
or wrapper without its own memory) with an empty list, reads a broadcast dimension once, and reads a
transposed or permuted tensor that fills one block of memory in place; other layouts are copied first. It
keeps the GIL: releasing it for large tensors measured no faster on bench/overhead.py's MLP, and handing the
GIL back and forth with the writer thread can only delay the training thread.

The op also makes the records themselves (``Recorder.records``, through ``StatBuffer.native_recorder``): a
call's arguments or outputs, a tuple or list, in one call, each plain tensor it serves as
the record tuple that ``json_files.native_json`` reads, None and exact bool, int, float and str as their records; it
looks at
each value's type only and leaves anything else to the collector's Python. For tensors of 4 096 elements or
more it keeps ``Collector._reuse``'s table and rule itself (the last 4 read; the same tensor or the same block
of memory, at the same version counter), so a tensor and its views are recorded without a Python step. In
summary_mode fingerprint it makes only the records of its lane onto the Triton kernels (a call's or a hook's
float32, float16 and bfloat16 device tensors that fill a block of memory, a transposed one's bytes copied into its
own order for the fingerprint, its slices of at most four dimensions, copied into that order first, and its empty,
broadcast and int64 tensors), each with
its fingerprint queued beside its statistics (``Recorder.checksums``, ``lane_fingerprints``), serves again only the
same tensor at the same version (a view may order its bytes otherwise), and leaves every other record to the
collector's Python.

The training monitor's figures (``monitor/metrics.py``) come from the same loop through ``monitor_figures``, which
also counts |x| < eps in its lanes and gives msprobe's monitor ops in the order asked, as one float32 tensor.

float32, float16 and bfloat16 go through the op; the ``Recorder`` also records bool and signed or 8-bit
unsigned integer CPU tensors (Max and Min, or ``any`` and ``all``, in one pass of its own: their Mean and
Norm are null); float64 and the other integer types keep the torch ops. CUDA and ROCm tensors go to the Triton
kernels of ``triton_stats`` where Triton imports (``MSPROBE_TRITON``), NPU tensors keep the torch-op path. Where the
lane serves, a call's int64 device tensors of one dimension or more are its records too (in summary_mode
fingerprint with their bytes' fingerprints): one ``aminmax`` each, their Max and Min exact in an
``integer_lane.IntegerArena`` (``Recorder.lane_integers``).

The ``Recorder`` also runs the collector's backward hooks where it serves (``Collector.native_backward``): an
API's post-hooks on its outputs' ``grad_fn`` (``hook_api``), and a module call's tensor hooks and the post-hooks
on the nodes that take its inputs, after the walk of ``consumer_edges``, in one call (``hook_module``). They
record the gradients with no Python frame and queue them for ``Collector.take_arrivals``; a gradient they
cannot record goes to the collector's Python. Besides, the op walks a module's part of the graph
(``consumer_edges``) and captures call stacks (``capture``, Python 3.11+), each distinct stack made once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import sys
import threading

from . import cache_folders, native_cache
from .switches import switched_on

logger = logging.getLogger("msprobe_runtime")

# The op's C++, in files of its own (shipped as package data: pyproject.toml, tests/test_package_data.py), so
# that a compiler's message names the file and line to look at. One translation unit: most of a build's minute
# is the compiler reading torch's headers, which each further .cpp would pay again while the training process
# waits, and the records and hooks call the statistics pass inline within it.
NATIVE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native")
SOURCES = ("stats_op.cpp",)

NAME = "msprobe_stats"
# built on the machine that runs it, for its CPU; the cache key names the CPU (a home shared by other machines)
FLAGS = ["-O3"] + {
    "x86_64": ["-march=native"],
    "AMD64": ["-march=native"],
    "aarch64": ["-mcpu=native"],
    "arm64": ["-mcpu=native"],
}.get(platform.machine(), [])

# the build folder's layout: a folder of an earlier layout (its ``ready`` marker held a path, not a record of
# the library) belongs to the versions of the tool that made it, and is left to them
CACHE_LAYOUT = "2"

_lock = threading.Lock()
# ``loaded``: a library of the op was loaded in this process (``reset`` keeps it: a library stays loaded)
_state = {"done": False, "module": None, "loaded": False}


def enabled():
    return switched_on("MSPROBE_NATIVE_STATS")


def cache_root():
    """The folder of the builds: ``native/`` in the tool's one cache folder (``cache_folders``)."""
    return cache_folders.native_cache_folder()


def _cpu_id():
    """The CPU model and its flags: a build with -march=native must not run on another CPU (a shared home)."""
    try:
        with open("/proc/cpuinfo", "r", encoding="utf-8", errors="replace") as handle:
            lines = handle.read().split("\n\n", 1)[0].splitlines()
        keep = [
            line
            for line in lines
            if line.split(":", 1)[0].strip() in ("vendor_id", "model name", "flags", "Features", "CPU part")
        ]
        return "\n".join(keep)
    except OSError:
        return platform.processor() or platform.machine()


def _source_digest():
    """The sha256 of every file in ``NATIVE_DIR`` (names and bytes), not only the compiled ones: an edit of any
    file the build may read (a header included later) is a build of its own (test_native_build_cache.py). The
    names are relative, so an installed copy and a checkout of the same files share a build."""
    for name in SOURCES:
        if not os.path.isfile(os.path.join(NATIVE_DIR, name)):
            # an install without its package data: said so, rather than a compiler's message keyed on no source
            raise FileNotFoundError(f"its source {os.path.join(NATIVE_DIR, name)} is missing from this install")
    digest = hashlib.sha256()
    for folder, folders, files in os.walk(NATIVE_DIR):
        folders.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, NATIVE_DIR).replace(os.sep, "/").encode() + b"\0")
            with open(path, "rb") as handle:
                data = handle.read()
            digest.update(b"%d\0" % len(data) + data)
    return digest.hexdigest()


def build_directory():
    import torch

    key = hashlib.sha256(
        "\0".join(
            [
                _source_digest(),
                " ".join(FLAGS),
                _cpu_id(),
                torch.__version__,
                sys.version,
                platform.machine(),
                CACHE_LAYOUT,
            ]
        ).encode()
    ).hexdigest()[:16]
    return os.path.join(cache_root(), f"stats-torch{torch.__version__.replace('+', '_')}-{key}")


def _import(path):
    # the module's name is its file's (a second build in one process is ``msprobe_stats_v1``: torch names it)
    spec = importlib.util.spec_from_file_location(os.path.basename(path).split(".", 1)[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(directory):
    """Compile the op in a private folder beside ``directory`` and rename that into place once the library and
    its record are written: ``directory`` never holds half a build (test_native_build_cache.py). The module
    is this build's, loaded by torch from where it was built. Where another process's build took
    ``directory`` first, that one is kept and this one's folder removed; the module stays this build's, since
    loading the other as well would put a second copy of the extension in the process."""
    from torch.utils import cpp_extension

    building = native_cache.building_folder(directory)
    try:
        # compiled where they lie, so a compiler's message names runtime/native/<file>:<line>
        # (test_native_stats.py's test_a_compile_error_names_the_source_file_and_line)
        module = cpp_extension.load(
            NAME,
            sources=[os.path.join(NATIVE_DIR, name) for name in SOURCES],
            extra_cflags=FLAGS,
            build_directory=building,
            verbose=False,
        )
        native_cache.write_record(building, module.__file__)  # complete: later processes import it without ninja
        native_cache.publish(building, directory)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return module


def load():
    """The compiled module (with ``stats``), or None: turned off, or it cannot be built here (warned once)."""
    if _state["done"]:
        return _state["module"]
    with _lock:
        if _state["done"]:
            return _state["module"]
        module = None
        if enabled():
            try:
                module = _load()
            except Exception as error:  # no compiler, no ninja, a failed build: the torch ops serve
                logger.warning(
                    "msprobe_runtime: the native statistics op cannot be built (%s); statistics use "
                    "torch ops (slower; Mean and Norm may differ in the last float32 bit)",
                    _build_error_line(str(error).strip().splitlines()) or type(error).__name__,
                )
                module = None
        _state["module"] = module
        _state["done"] = True
        if module is not None:
            _state["loaded"] = True
        return module


FAILED = "failed"  # the build directory's note of a build that failed there: its reason, one line


def _load():
    import torch  # noqa: F401  (the op's library links against torch's)

    directory = build_directory()
    library, problem = native_cache.checked_library(directory)
    if library is not None:
        return _import(library)
    _raise_failed_before(directory)
    if problem is not None:
        # never loaded (a truncated library is a SIGBUS: test_native_build_cache.py), but built again rather
        # than left to the torch ops: a run keeps one path from its first record to its last, the op is what
        # the user asked for, and the next process finds a good build instead of this warning
        logger.warning(
            "msprobe_runtime: the cached native statistics op in %s is not loaded: %s; it is built again",
            directory,
            problem,
        )
    with native_cache.build_lock(
        directory,
        waiting=lambda: logger.warning(
            "msprobe_runtime: waiting for another process's build of the native statistics op into %s", directory
        ),
    ):
        # the build of the process that held the lock, or its failure, is this one's
        library, _ = native_cache.checked_library(directory)
        if library is not None:
            return _import(library)
        _raise_failed_before(directory)
        logger.warning("msprobe_runtime: building the native statistics op once (about a minute) into %s", directory)
        try:
            return _build(directory)
        except Exception as error:
            if not _state["loaded"] or not isinstance(error, ImportError):
                reason = _build_error_line(str(error).strip().splitlines()) or type(error).__name__
                _write_note(directory, os.path.join(directory, FAILED), reason)
            # else the build was loaded beside another build of the op that this process holds (its source edited
            # under a live process, then a reset): pybind11 refuses its types a second time ("type Recorder is
            # already registered"). That is this process's, not the build's: remembered, it kept every later
            # process, which loads one build, off the op (test_native_stats.py)
            raise


def _raise_failed_before(directory):
    """A build that failed here fails again: the directory's key holds everything the build reads but the
    compiler, so later processes skip the minute it costs (a compiler installed since: delete the note)."""
    failed = os.path.join(directory, FAILED)
    reason = _read_note(failed)
    if reason is not None:
        raise RuntimeError(f"{reason} (remembered from an earlier build: delete {failed} to try again)")


def _build_error_line(lines):
    """The line that says why a build failed: the compiler's first ``error:``, else the message's last line."""
    for line in lines:
        if "error:" in line:
            return line.strip()
    return lines[-1].strip() if lines else ""


def _read_note(path):
    """The first line of the note at ``path``, or None where there is none (a link there is not followed)."""
    text = native_cache.read_text(path)
    if text is None:
        return None
    return text.split("\n", 1)[0] or "a failed build"


def _write_note(directory, path, text):
    """Write ``text`` to ``path`` in ``directory`` whole or not at all (``json_files.atomic_write_text``: a
    link planted there is replaced, never written through); a note that cannot be written is only a build
    tried again by the next process."""
    from .json_files import atomic_write_text

    try:
        os.makedirs(directory, exist_ok=True)
        atomic_write_text(path, text + "\n")
    except OSError as error:
        logger.debug("msprobe_runtime: the note of the failed build was not kept (%s)", error)


def reset():
    """Forget the loaded state (tests)."""
    with _lock:
        _state["done"] = False
        _state["module"] = None
