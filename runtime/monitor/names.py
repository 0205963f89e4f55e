"""The names the monitor gives parameters and modules, as msprobe's (core/monitor/utils.py, module_metric): kept apart
from trainer_mon.py so that activations.py names modules the same way without importing it
(tests/test_import_graph.py)."""

from __future__ import annotations

import re

_SQUASH = (r"^.*\.(layers?\..*)", r"^.*\.(embeddings?\..*)", r"^.*\.(final.*)", r"^.*\.(output.*)", r"^.*\.(norm.*)")


def squash_param_name(name: str, enable: bool = True) -> str:
    """msprobe's module_metric.squash_param_name."""
    if not enable:
        return name
    for pattern in _SQUASH:
        match = re.findall(pattern, name)
        if match:
            return match[0]
    return name


# CSV prefix -> the last part of msprobe's tag for those rows (name2tag, get_summary_writer_tag_name)
TAG_SUFFIX = {
    "grad_unreduced": "acc_grad",
    "grad_reduced": "post_grad",
    "exp_avg": "exp_avg",
    "exp_avg_sq": "exp_avg_sq",
    "param_origin": "param_origin",
    "param_updated": "param_updated",
    "adam_update": "adam_update",
    "adam_ratio": "adam_ratio",
    "other": "mg_direction",
}
