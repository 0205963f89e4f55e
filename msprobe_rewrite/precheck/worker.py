"""Check one API call end to end: load its tensors, replay it (golden and same dtype), grade each output and
each input gradient. Runs in a worker process; everything it returns is small (rows, and a histogram of the
relative error for each failing tensor), so no tensor leaves the process that read it.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from . import apis, fp8, metrics, replay, standards
from .errors import Unreplayable
from .records import flat_records, is_tensor_record
from .values import flat_values, load_tensor, rebuild

_TABLE: Dict[str, str] = {}


def init(table: Dict[str, str], threads: Optional[int]) -> None:
    """Per process: the catalogue's dump-name table, and one compute thread when processes run in parallel
    (N processes x all cores each would only fight over the cores)."""
    _TABLE.clear()
    _TABLE.update(table)
    if threads:
        torch.set_num_threads(threads)


def check(item: Dict[str, Any]) -> Dict[str, Any]:
    """``{"rows": [...], "plots": {tensor: {...}}, "problem": str or None}`` for one call."""
    base = {"api": item["name"], "label": item.get("label", "")}
    try:
        result = _check(item, base)
    except Unreplayable as why:
        result = {"rows": [_skip(base, str(why))], "plots": {}, "problem": str(why) if why.input_problem else None}
    except Exception as error:  # a call the CPU refuses, a layout we did not foresee: said in its row
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
        reason = f"replay failed: {type(error).__name__}: {text}"[:500]
        result = {"rows": [_skip(base, reason)], "plots": {}, "problem": None}
    # from the records alone: a float8 call the CPU cannot replay is still range-checked (fp8.py)
    result["rows"] += fp8.rows(base, item)
    return result


def _skip(base, reason, direction="forward"):
    return dict(
        base,
        direction=direction,
        tensor="",
        dtype="",
        shape="",
        standard="",
        metric="replay",
        device=None,
        cpu=None,
        ratio=None,
        threshold="",
        status=standards.SKIP,
        message=reason,
    )


class _Loader:
    """Tensors of one call, each read once from its file."""

    def __init__(self, tensor_dir: str):
        self.tensor_dir = tensor_dir
        self.cache: Dict[str, torch.Tensor] = {}

    def __call__(self, record: dict) -> torch.Tensor:
        key = record.get("data_name") or id(record)
        if key not in self.cache:
            self.cache[key] = load_tensor(record, self.tensor_dir)
        return self.cache[key]


def _check(item, base):
    api = item["api"]
    name = apis.base_name(api)
    forward = item["forward"]
    args_rec, kwargs_rec = forward.get("input_args") or [], forward.get("input_kwargs") or {}
    out_recs = flat_records(forward.get("output"), [])
    if name in apis.RANDOM:
        raise Unreplayable("random op: its result depends on the generator state, which the dump does not hold")
    fn, _ = apis.resolve(api, _TABLE)  # communication and unknown names are said before anything else
    if not any(out_recs):
        raise Unreplayable(
            "its output holds no tensor (an in-place op that returns None, or a non-tensor result): nothing to grade"
            if apis.is_inplace(api, {})
            else "its output holds no tensor: nothing to grade"
        )
    load = _Loader(item["tensor_dir"])
    plain_args = rebuild(args_rec, lambda record: None)
    plain_kwargs = rebuild(kwargs_rec, lambda record: None) if isinstance(kwargs_rec, dict) else {}
    inplace = apis.is_inplace(api, plain_kwargs)
    notes = []
    extra_rows = []
    if name in apis.DROPOUT:
        p, training = replay.dropout_parts(name, plain_args, plain_kwargs)
        if training and p > 0:
            if p >= 1:
                raise Unreplayable("dropout with p = 1: every element is dropped, nothing to grade")
            dumped, x = load(out_recs[0]), load(_first_tensor(args_rec))
            mask = dumped.ne(0)
            # where the input is zero the output is zero kept or not; the dumped input gradient tells which
            grad_records = flat_records((item.get("backward") or {}).get("output"), [])
            if grad_records and grad_records[0] is not None and grad_records[0].get("data_name"):
                grad_in = load(grad_records[0])
                if grad_in.shape == mask.shape:
                    mask = mask | (x.eq(0) & grad_in.ne(0))
            fn = replay.dropout_with_mask(mask, p)
            extra_rows.append(_drop_fraction(base, x, dumped, p))
            notes.append("random op replayed with the mask read from its dumped output")
    backward_rec = item.get("backward")
    grads_rec = flat_records(backward_rec.get("input"), []) if isinstance(backward_rec, dict) else []
    want_grad = (
        not inplace
        and any(r is not None for r in grads_rec)
        and all(r is None or isinstance(r.get("data_name"), str) for r in grads_rec)
    )

    golden_in = replay.Inputs(args_rec, kwargs_rec, load, replay.GOLDEN, want_grad)
    try:
        golden = replay.call(fn, golden_in, want_grad)
    except Unreplayable:
        raise
    except Exception as error:
        raise Unreplayable(f"the CPU cannot run it in float64: {_first_line(error)}") from None
    if inplace:
        notes.append("in-place op replayed on a copy of its dumped input; no backward")
        _check_inplace_input(args_rec, out_recs, load, golden)
    golden_grads = None
    if want_grad and isinstance(backward_rec, dict):
        grads = [load(r) if r is not None else None for r in grads_rec]
        golden_grads = replay.backward(golden, [g.to(replay.widen(g.dtype)) if g is not None else None for g in grads])

    measured: Dict[str, Any] = {}  # the device's metrics per tensor, kept for the second grading

    def graded(same, same_grads, plot=True):
        rows, plots = list(extra_rows), ({} if plot else None)
        golden_out, same_out = flat_values(golden, []), flat_values(same, []) if same is not None else []
        for position, record in enumerate(out_recs):
            if record is None:
                continue
            g = golden_out[position] if position < len(golden_out) else None
            s = same_out[position] if position < len(same_out) else None
            rows += _grade(base, "forward", f"output.{position}", name, load(record), g, s, plots, measured)
        if isinstance(backward_rec, dict):
            rows += _backward(
                base, name, backward_rec, load, golden_grads, same_grads, want_grad, inplace, plots, measured
            )
        return rows, plots

    # The device's metrics first, against the dtype's floors alone: every criterion is monotone in the CPU's
    # figure (its reference is max(cpu, floor), or the CPU's share), so a device that passes there passes
    # whatever the CPU reaches, and the CPU replay in the same dtype is run only when it can change a verdict
    # (or always, with --full).
    rows, plots = graded(None, None, plot=False)
    if item.get("full") or any(r["status"] in (standards.ERROR, standards.WARNING) for r in rows):
        same, same_grads, same_problem = None, None, None
        try:
            same_in = replay.Inputs(args_rec, kwargs_rec, load, replay.SAME, want_grad, copy=inplace)
            same = replay.call(fn, same_in, want_grad)
            if golden_grads is not None:
                same_grads = replay.backward(same, [load(r) if r is not None else None for r in grads_rec])
        except Unreplayable:
            raise
        except Exception as error:
            same_problem = f"no CPU replay in the original dtype ({_first_line(error)}): graded against the dtype floor"
        if same_problem:
            notes.append(same_problem)
        rows, plots = graded(same, same_grads)
    if notes:
        for row in rows:
            row["message"] = "; ".join(filter(None, [row.get("message"), *notes]))
    return {"rows": rows, "plots": plots or {}, "problem": None}


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:300]


def _first_tensor(records):
    for record in records:
        if is_tensor_record(record):
            return record
    raise Unreplayable("dropout without a tensor input")


def _drop_fraction(base, x, out, p):
    """The share of dropped elements (among inputs that are not zero) against p, within four binomial
    standard deviations: the one property of a random mask a dump can check."""
    nonzero = x.ne(0)
    n = int(nonzero.sum())
    dropped = float((out.eq(0) & nonzero).sum()) / n if n else p
    bound = 4 * (p * (1 - p) / max(n, 1)) ** 0.5 + 1.0 / max(n, 1)
    status = standards.PASS if abs(dropped - p) <= bound else standards.ERROR
    return dict(
        base,
        direction="forward",
        tensor="output.0",
        dtype=str(out.dtype),
        shape=str(list(out.shape)),
        standard="dropout",
        metric="drop_fraction",
        device=dropped,
        cpu=p,
        ratio=None,
        threshold=f"|share - p| <= {bound:.3g}",
        status=status,
        message="",
    )


def _check_inplace_input(args_rec, out_recs, load, golden):
    first = next((r for r in args_rec if is_tensor_record(r)), None)
    out = next((r for r in out_recs if r is not None), None)
    golden_out = next((t for t in flat_values(golden, []) if t is not None), None)
    if first is None or out is None or golden_out is None:
        return
    x, y = load(first), load(out)
    if (
        x.shape == y.shape
        and x.dtype == y.dtype
        and torch.equal(x, y)
        and not torch.equal(golden_out.to(y.dtype) if golden_out.shape == y.shape else y, y)
    ):
        raise Unreplayable(
            "in-place op: the dump holds its input as overwritten by the call, so the call cannot be rebuilt"
        )


def _grade(base, direction, label, name, device, golden, same, plots, measured=None):
    row_base = dict(
        base,
        direction=direction,
        tensor=label,
        dtype=str(device.dtype).replace("torch.", ""),
        shape=str(list(device.shape)),
    )
    if golden is None:
        return [
            dict(
                row_base,
                standard="",
                metric="replay",
                device=None,
                cpu=None,
                ratio=None,
                threshold="",
                status=standards.SKIP,
                message="the replay returned no tensor here",
            )
        ]
    if tuple(golden.shape) != tuple(device.shape):
        return [
            dict(
                row_base,
                standard="",
                metric="shape",
                device=str(list(device.shape)),
                cpu=str(list(golden.shape)),
                ratio=None,
                threshold="equal",
                status=standards.ERROR,
                message="the dumped result's shape differs from the replay's",
            )
        ]
    golden = golden.detach()
    dtype = device.dtype
    standard = standards.standard_for(name, dtype)
    key = f"{direction} {label}"
    m_dev = measured.get(key) if measured is not None else None
    if m_dev is None:
        m_dev = metrics.measure(device, golden, dtype, standard)
        if measured is not None:
            measured[key] = m_dev
    m_cpu = None
    if same is not None and tuple(same.shape) == tuple(device.shape):
        same = same.detach()
        # the usual case where the device is this CPU: equal results have equal metrics
        m_cpu = (
            m_dev
            if (same.dtype == dtype and torch.equal(same, device))
            else metrics.measure(same.to(dtype), golden, dtype, standard)
        )
    if not m_dev:
        return []
    rows = [dict(row_base, standard=standard, **row) for row in standards.grade(standard, dtype, m_dev, m_cpu)]
    if plots is not None and any(row["status"] in (standards.ERROR, standards.WARNING) for row in rows):
        plots[key] = {"device": metrics.histogram(device, golden)}
        if same is not None and tuple(same.shape) == tuple(device.shape):
            plots[key]["cpu"] = metrics.histogram(same, golden)
    return rows


def _backward(base, name, backward_rec, load, golden_grads, same_grads, want_grad, inplace, plots, measured=None):
    dumped = flat_records(backward_rec.get("output"), [])
    if not any(dumped):
        return []
    if inplace:
        return [_skip(base, "in-place op: its backward is not replayed", "backward")]
    if not want_grad:
        return [
            _skip(
                base,
                "the dump holds no gradient tensors for this call (saved with task 'tensor' "
                "from a runtime that saves backward data)",
                "backward",
            )
        ]
    if golden_grads is None:
        return [_skip(base, "no output of the replay takes part in autograd", "backward")]
    rows = []
    for index, golden_grad in _pair_gradients(dumped, golden_grads):
        same_grad = None
        if same_grads is not None and len(same_grads) == len(golden_grads):
            same_grad = same_grads[_position(golden_grads, golden_grad)]
        rows += _grade(
            base, "backward", f"grad_input.{index}", name, load(dumped[index]), golden_grad, same_grad, plots, measured
        )
    return rows


def _position(items, target):
    for i, item in enumerate(items):
        if item is target:
            return i
    return -1


def _pair_gradients(dumped, captured):
    """(dumped position, replayed gradient): by position when both list the same number, else by shape."""
    if len(dumped) == len(captured):
        return [(i, captured[i]) for i, r in enumerate(dumped) if r is not None and captured[i] is not None]
    used, pairs = set(), []
    for i, record in enumerate(dumped):
        if record is None:
            continue
        for j, grad in enumerate(captured):
            if j not in used and grad is not None and list(grad.shape) == record.get("shape"):
                used.add(j)
                pairs.append((i, grad))
                break
    return pairs
