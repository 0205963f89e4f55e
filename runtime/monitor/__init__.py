"""msprobe's training monitor (``TrainerMon``), as a drop-in: per-parameter statistics of gradients, weights and
Adam's moments, computed on the device, flushed to msprobe's CSV layout once per collected step, with msprobe's
anomaly rules evaluated on the device (docs/monitor.md).

Importing this package imports no torch: ``msprobe_runtime.TrainerMon`` loads ``trainer_mon`` on first use.
"""


def __getattr__(name: str) -> object:
    # transformers loads only when the callback is asked for (tests/monitor/test_callback.py)
    if name == "MonitorCallback":
        from .callback import MonitorCallback

        return MonitorCallback
    if name == "TrainerMon":
        from .trainer_mon import TrainerMon

        return TrainerMon
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
