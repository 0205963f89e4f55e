"""msprobe's training monitor (``TrainerMon``), as a drop-in: per-parameter statistics of gradients, weights and
Adam's moments, computed on the device, flushed to msprobe's CSV layout once per collected step, with msprobe's
anomaly rules evaluated on the device (docs/monitor.md).

Importing this package imports no torch: ``msprobe_runtime.TrainerMon`` loads ``trainer_mon`` on first use.
"""
