"""Max and Min of the integer and bool device tensors that the native op's lane records (token and position ids,
attention masks, a router's counts), kept exact.

The Python path reads such a tensor by ``amax``, ``amin`` (a bool's by ``any``, ``all``; a 0-d one's value by a copy)
and ``stack`` into a slot of its own, and its record is a Python object, whose presence makes the writer walk the
whole step to resolve it (``Writer._step_files``). The lane (``Recorder.lane_integers``) reads it by one ``aminmax``
and appends the two 0-d tensors of its dtype to the ``IntegerArena`` filling for its device and dtype (an arena's
values are stacked: one dtype each); the record's row ``(INTEGER_ROW, arena's key, index)`` is plain data (in
summary_mode fingerprint its bytes are queued for their fingerprint too, which the row then names as a float tensor's
does). At the flush each arena's values are stacked into one slot, which the step's int64 batch of its device copies
to the host (exact: past 2**53 too, not through float64), and ``packed`` is what the writing process reads
(``json_files.native_json``, which writes a bool's as bools and a 0-d integer's value as all four, as the Python
path does).
"""

from __future__ import annotations

import weakref

from .json_files import arena_key


class IntegerArena:
    """The Max and Min of the integer (or bool) tensors of one device and dtype recorded by the lane since the last
    flush."""

    # slots only: the native op reads ``values`` and ``key`` by attribute, which then runs no Python code
    __slots__ = ("key", "values", "slot")

    def __init__(self):
        self.key = arena_key()
        self.values = []  # each tensor's Max, then its Min: 0-d tensors of its dtype, appended by the native op
        self.slot = None  # statistics.Slot of them all, once closed (``IntegerLane.close``)

    def packed(self):
        """Its numbers as the writing process reads them (records.device_numbers): a tuple of ints, each tensor's Max
        and Min in turn; None where they never came (a stack that failed, a flush never made)."""
        slot = self.slot
        values = None if slot is None else slot.values()
        return None if values is None else tuple(values)


class IntegerLane:
    """The arenas of the lane's integer records, one filling per device and dtype; ``make_slot(pending, width)``
    makes an exact slot (``statistics.Slot``: passed in, as this module imports nothing of it)."""

    def __init__(self, make_slot):
        self._make_slot = make_slot
        self._arenas = {}  # the op's key of a device and dtype -> the IntegerArena filling: the op reads and fills it

    def attach(self, recorder, mark):
        """Let ``recorder``'s lane record integer and bool device tensors here, its rows beginning with ``mark``."""
        ref = weakref.ref(self)  # the op holds the callable: no cycle through a native object

        def renew(key):  # the op's key of a device and dtype
            lane = ref()
            if lane is None:
                raise RuntimeError("the integer lane's state is gone")
            arena = lane._arenas[key] = IntegerArena()
            return arena

        recorder.lane_integers(self._arenas, renew, mark)

    def close(self):
        """At the flush: the arenas filling taken out, each with its values stacked into one slot. Returns ``(slots,
        arenas, error)``: the slots to join the flush's pending ones, the arenas whose numbers the step's records
        name, and the error of a stack that failed (None where none did): that arena keeps no slot, its records are
        written null."""
        import torch

        # popped by the keys seen, never cleared: an arena the native op makes meanwhile (``renew``, on another
        # thread) stays for the next flush; one taken out is out of the op's reach, so nothing is appended to it
        arenas = [self._arenas.pop(key) for key in list(self._arenas)]
        slots, error = [], None
        for arena in arenas:
            values, arena.values = arena.values, []
            if not values:
                continue
            try:
                arena.slot = self._make_slot(torch.stack(values), len(values))
            except Exception as failed:
                error = failed
                continue
            slots.append(arena.slot)
        return slots, arenas, error
