"""The flush's one device-to-host copy: blocking (``"flush": "sync"``), or started at the end of a collected step
and read at the next one (``"async"``; docs/monitor.md, "The asynchronous flush").

A blocking ``tolist`` of figures on an accelerator waits for the device to finish the step: the host stops
enqueueing the next step's kernels until then. The asynchronous copy instead writes into a pinned host buffer with
``non_blocking=True`` and records an event behind it on the current stream; the host reads the buffer one
collected step later (``event.query()`` first, ``synchronize()`` only at the next flush or at close), by which time
the copy has long finished. Events per device type:

- ``cuda``: ``torch.cuda.Event``;
- ``npu``: ``torch.npu.Event`` (Ascend's torch_npu adds ``torch.npu``; looked up when used, so importing this
  module needs no torch_npu; tests/monitor/test_async_flush.py runs it with a fake);
- ``cpu`` (forced with ``"flush": "async"``, for tests): the concatenated figures are already a fresh host tensor;
  the "copy" is the tensor itself and the event a no-op that is always ready;
- any other device type: no known event; the copy is a blocking ``.to("cpu")`` made at the flush (correct, not
  asynchronous: not yet).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

logger = logging.getLogger("msprobe_runtime")

_pinning_failed: list[str] = []  # the first pinned allocation's error: pageable buffers from then on


class Ready:
    """The event of a copy that is done when made (the CPU's, or a blocking one)."""

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


READY = Ready()


def _npu_event() -> Any:
    return torch.npu.Event()  # type: ignore[attr-defined]  # torch_npu's module; checked in backend_for


@dataclass(frozen=True)
class Backend:
    """How one device type's figures reach the host: ``event`` None means the copy is made at once."""

    device_type: str
    event: Callable[[], Any] | None

    @property
    def accelerated(self) -> bool:
        return self.event is not None

    def start(self, flat: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Start the copy of ``flat`` (the step's figures, a tensor the flush made) -> (host buffer, event); the
        buffer may be read once ``event.query()`` is true or after ``event.synchronize()``."""
        if self.event is None:
            if flat.device.type == "cpu":
                return flat, READY  # torch.cat's fresh tensor: nothing else writes it
            return flat.to("cpu"), READY  # an accelerator with no event we know: blocking
        host = _host_buffer(flat)
        host.copy_(flat, non_blocking=True)
        event = self.event()
        event.record()  # on the current stream, behind the copy
        return host, event


def _host_buffer(flat: torch.Tensor) -> torch.Tensor:
    if not _pinning_failed:
        try:
            # torch's pinned host allocator caches its blocks: a buffer a flush is cheap after the first
            return torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        except RuntimeError as error:
            _pinning_failed.append(str(error))
            logger.warning(
                "monitor: no pinned host memory (%s); the flush copies into pageable memory, which makes the copy "
                "wait for the device",
                error,
            )
    return torch.empty(flat.shape, dtype=flat.dtype)


def backend_for(device_type: str) -> Backend:
    """The copy's backend for figures on a device of this type (``torch.device.type``)."""
    if device_type == "cuda":
        return Backend("cuda", torch.cuda.Event)
    if device_type == "npu" and hasattr(torch, "npu") and hasattr(torch.npu, "Event"):
        return Backend("npu", _npu_event)
    return Backend(device_type, None)


@dataclass
class InFlight:
    """One collected step's figures on their way to the host, and what the host part needs to read them."""

    step: int
    host: torch.Tensor
    event: Any
    layout: Any  # trainer_mon's rows (tag, shape, dtype) per prefix and the spike rule's series
    device: torch.Tensor | None = None  # the source, held until the copy is read

    def ready(self) -> bool:
        """Whether the copy has finished (no wait)."""
        return bool(self.event.query())

    def values(self) -> list[float]:
        """The figures, waiting for the copy if it has not finished yet."""
        self.event.synchronize()
        self.device = None
        return self.host.tolist()  # a host tensor: no device read
