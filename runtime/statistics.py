"""Per-tensor statistics computed where the tensor lives, into a device buffer, with no host sync.

Each recorded tensor gets a slot: one row of STAT_WIDTH numbers (Max, Min, Mean, Norm, NaN count, Inf count)
written by device kernels into a preallocated buffer on the tensor's device. Nothing is read back until
``take()``, which hands the filled rows to the caller as one non-blocking copy to the host plus an event to
wait on (waited on by the writer thread, never by the training thread).
"""
from __future__ import annotations

import threading

STAT_WIDTH = 6  # Max, Min, Mean, Norm, NaN count, Inf count

# Kinds decide msprobe's null rules at write time.
KIND_FLOAT = 0     # all four statistics and the counts
KIND_NO_MEAN = 1   # float64 and integer tensors: Max and Min only (msprobe leaves Mean and Norm null)
KIND_BOOL = 2      # Max = any, Min = all
KIND_SCALAR = 3    # 0-d: all four equal to the value
KIND_EMPTY = 4     # no slot at all: every statistic null

_CHUNK = 4096


def has_counts(kind, dtype, enabled):
    """Whether a slot of this kind carries NaN/Inf counts (floating tensors only, when enabled)."""
    return enabled and kind != KIND_EMPTY and kind != KIND_BOOL and dtype.is_floating_point


def tensor_kind(t):
    """The null-rule kind of ``t``; metadata only, so no sync."""
    import torch

    if t.numel() == 0:
        return KIND_EMPTY
    dtype = t.dtype
    if dtype is torch.bool:
        return KIND_BOOL
    if t.dim() == 0:
        return KIND_SCALAR
    if dtype.is_floating_point and dtype is not torch.float64:
        return KIND_FLOAT
    if dtype.is_complex:
        return KIND_EMPTY
    return KIND_NO_MEAN


class StatBuffer:
    """Device-side rows of statistics, one buffer per device, grown in chunks and never read on this thread."""

    def __init__(self, nan_inf_count=True):
        self.nan_inf_count = nan_inf_count
        self._lock = threading.Lock()
        # device -> [list of chunk tensors, rows used in the last chunk, rows taken already]
        self._per_device = {}
        self._count = 0  # global slot counter, so a slot is (device_key, index)

    def _row(self, device):
        """A fresh row on ``device``: (device key, global index within that device, row view)."""
        import torch

        with self._lock:
            state = self._per_device.get(device)
            if state is None:
                state = self._per_device[device] = [[], _CHUNK, 0, 0]
            chunks = state[0]
            if state[1] == _CHUNK:
                # Buffer full: allocate another chunk on the device instead of flushing mid-step.
                dtype = torch.float32 if device.type == "mps" else torch.float64
                chunks.append(torch.empty((_CHUNK, STAT_WIDTH), dtype=dtype, device=device))
                state[1] = 0
            row = chunks[-1][state[1]]
            state[1] += 1
            index = state[3]
            state[3] += 1
        return index, row

    def add(self, t, kind):
        """Schedule the statistics of ``t`` (detached); returns the slot key ``(device, index)``."""
        import torch

        t = t.detach()
        device = t.device
        index, row = self._row(device)
        counts = self.nan_inf_count and t.dtype.is_floating_point
        if kind == KIND_FLOAT:
            row[0:4].copy_(torch.stack((t.amax(), t.amin(), t.mean(), torch.linalg.vector_norm(t))))
        elif kind == KIND_NO_MEAN:
            row[0:2].copy_(torch.stack((t.amax(), t.amin())))
        elif kind == KIND_BOOL:
            row[0:2].copy_(torch.stack((t.any(), t.all())))
        elif kind == KIND_SCALAR:
            row[0:4].copy_(t.expand(4))
        if counts:
            row[4:6].copy_(torch.stack((torch.isnan(t).sum(), torch.isinf(t).sum())))
        return device, index

    def take(self):
        """Hand over every row filled since the last take: ``{device: (first index, host tensor, event)}``.

        One device-side concatenation and one non-blocking copy per device; the caller waits on the event
        off the training thread before reading the host tensor.
        """
        import torch

        out = {}
        with self._lock:
            items = list(self._per_device.items())
            for device, state in items:
                chunks, used_last, taken, total = state
                if total == taken:
                    continue
                # rows [taken, total) live in the chunks; chunk k holds rows [k*_CHUNK, (k+1)*_CHUNK)
                first_chunk = taken // _CHUNK
                parts = []
                for k in range(first_chunk, len(chunks)):
                    lo = taken - k * _CHUNK if k == first_chunk else 0
                    hi = used_last if k == len(chunks) - 1 else _CHUNK
                    parts.append(chunks[k][lo:hi])
                state[2] = total
                # drop chunks that are completely taken so their memory goes back
                # (indices keep counting from the same base, so keep placeholders)
                for k in range(first_chunk, len(chunks) - 1):
                    chunks[k] = None
                out[device] = (taken, parts)
        result = {}
        for device, (first, parts) in out.items():
            joined = parts[0] if len(parts) == 1 else torch.cat(parts)
            if device.type == "cpu":
                host = joined.clone()
                event = None
            else:
                host = joined.to("cpu", non_blocking=True)
                event = _record_event(device)
            result[device] = (first, host, event)
        return result


def _record_event(device):
    """An event on ``device``'s current stream, through torch's device-generic API (nothing CUDA-only)."""
    import torch

    try:
        event = torch.Event(device=device)
        event.record()
        return event
    except Exception:  # older torch or a backend without generic events: the writer synchronises instead
        return device


def wait_event(event):
    """Block (on the writer thread) until a copy recorded by ``take`` has landed on the host."""
    if event is None:
        return
    import torch

    if isinstance(event, torch.device):
        module = getattr(torch, event.type, None)
        if module is not None and hasattr(module, "synchronize"):
            module.synchronize()
        return
    event.synchronize()


def host_rows(host):
    """The host tensor as a flat list of floats without Tensor.tolist/.numpy/.item (pure storage bytes)."""
    import struct

    n = host.numel()
    if n == 0:
        return []
    raw = bytes(host.contiguous().untyped_storage())
    fmt = "d" if host.element_size() == 8 else "f"
    return list(struct.unpack(f"<{n}{fmt}", raw[: n * host.element_size()]))
