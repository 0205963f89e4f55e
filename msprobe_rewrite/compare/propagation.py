"""Error propagation along a run: which entry injects the error when every entry differs a little.

For each matched entry the error of each output against the other run is set beside the error of its
inputs (for a backward entry also of its forward entry's tensors, which its op saved). An entry is a suspect
when an output's error exceeds ``allowance * input error + noise floor``, where the allowance is how much
error its op class may pass on (see docs/compare.md). Errors are scale-aware: a statistic's difference is
divided by the tensor's own scale (max |x| for Max and Min, Norm/sqrt(n) for Mean, Norm for Norm), so a
statistic near zero does not turn noise into a large relative error.
"""

from __future__ import annotations

import math
from array import array
from typing import Any, Dict, List, Optional, Tuple

from . import fp8
from .names import DIRECTIONS, forward_name, is_module, split_name
from .noise import SUMS, floor_of, floors
from .records import INPUT

METRICS = ("Max", "Min", "Mean", "Norm", "MaxAbsErr")  # MaxAbsErr: task=tensor only, per element
ALLOWANCE = 4.0  # elementwise ops: |f'| <= ~1.1 for gelu/tanh/sigmoid; a product adds two errors
SUSPECT_LIMIT = 50
TENSOR_EVIDENCE = (
    ("Cosine", "cosine"),
    ("MaxRelativeErr", "max_relative_error"),
    ("_ulp_median", "ulp_median"),
    ("_ulp_p99", "ulp_p99"),
    ("_ulp_max", "ulp_max"),
)
SIZED = ("matmul", "reduction", "module")  # the classes whose allowance reads K
BACKWARD_FACTOR = 2.0  # a backward op combines its gradient's error with its saved tensors' errors
SUSPECT_SCORE = 1.0  # output error / (allowance * input error + noise floor) above which an entry is suspect
MATMUL = ("linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum", "conv", "bilinear", "embedding_bag")
NORMS = ("norm", "normalize")
EXPONENTIAL = ("softmax", "softmin", "exp", "cross_entropy", "nll_loss", "logsumexp", "sigmoid_cross")
REDUCTIONS = ("sum", "mean", "mse_loss", "l1_loss", "cumsum", "nansum", "var", "std")


def op_class(base: str) -> str:
    """``matmul``, ``norm``, ``exp``, ``reduction``, ``module`` or ``elementwise``, from the API's name
    (``Functional.linear``) or the module's class (``Module.fcs.0.Linear``)."""
    module = is_module(base)
    op = base.rsplit(".", 1)[-1].lower().strip("_")
    if any(word in op for word in MATMUL):
        return "matmul"
    if op.endswith(NORMS) or "norm" in op and not op.startswith("clip"):
        return "norm"
    if any(word in op for word in EXPONENTIAL):
        return "exp"
    if any(op == word or op.startswith(word) for word in REDUCTIONS) and not module:
        return "reduction"
    return "module" if module else "elementwise"


def allowance(cls: str, k: float, spread: float, scale: float) -> float:
    """How many times its inputs' (scale-aware) error an op of ``cls`` may put on its output.

    matmuls accumulate over K terms (worst case sqrt(K) when the errors line up); a normalisation divides
    by the std of its input, so an error relative to max |x| grows by max |x| / std; exp and softmax turn an
    absolute input error into a relative output error (up to twice the error of the largest input: masked
    positions at -1e4 carry large absolute errors that exp sends to zero). A reduction sums K = numel terms.
    A module is a composition: its largest dimension stands in for K.
    """
    if cls in ("matmul", "reduction"):
        return ALLOWANCE * math.sqrt(max(k, 1.0))
    if cls == "norm":
        return ALLOWANCE * 2 * max(1.0, spread)
    if cls == "exp":  # applied to 2 * the absolute error of the input's Max, see Tracker._judge
        return ALLOWANCE
    if cls == "module":
        return ALLOWANCE * math.sqrt(max(k, 1.0)) * max(1.0, min(spread, 100.0))
    return ALLOWANCE


_ZERO = (0.0, 0.0, 0.0, 0.0, None)
_isfinite = math.isfinite


def _number(value) -> Optional[float]:
    # statistics are JSON numbers, or "inf"/"nan" strings in some msprobe versions, or null
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _values(stats) -> List[Optional[float]]:
    try:  # the common case: four JSON numbers
        values = [float(v) for v in stats]
    except (TypeError, ValueError):
        values = [_number(v) for v in stats]
    return values


def tensor_errors(diff) -> Tuple[tuple, float, float, float]:
    """(scale-aware error per METRICS, max |x|, Norm/sqrt(n), the largest error) of one compared tensor
    pair, from the differences ``compare_tensors`` already took (the bench side's statistics give the
    scale)."""
    vb = _values(diff.b.stats)
    top = 0.0
    for v in (vb[0], vb[1]):
        if v is not None and _isfinite(v) and abs(v) > top:
            top = abs(v)
    numel = diff.b.numel
    norm = vb[3]
    norm = abs(norm) if norm is not None and _isfinite(norm) else 0.0
    rms = norm / math.sqrt(numel) if numel else 0.0
    if diff.worst == 0.0 and not diff.elementwise:
        return _ZERO, top, rms, 0.0  # equal records: the common case before anything differs
    errors: List[Optional[float]] = [None, None, None, None, None]
    scales = (top, top, rms, norm)
    worst = 0.0
    for index, delta in enumerate(diff.diff):
        if delta is None:
            continue
        if delta == 0.0:
            errors[index] = 0.0
            continue
        if not _isfinite(delta):  # NaN or Inf on a side (NaN on both sides is a 0.0 delta)
            error = math.inf
        else:
            scale = scales[index]
            error = abs(delta) / scale if scale > 0 else math.inf
        errors[index] = error
        if error > worst:
            worst = error
    metrics = diff.elementwise
    if metrics:
        scaled = metrics.get("_scaled_max_abs")
        if isinstance(scaled, float):
            errors[4] = scaled
            worst = max(worst, scaled)
    return tuple(errors), top, rms, worst


def _spread(top: float, rms: float, mean: Optional[float]) -> float:
    # max |x| / std: how far a normalisation can magnify an error measured against max |x|
    mean = mean if mean is not None and math.isfinite(mean) else 0.0
    variance = rms * rms - mean * mean
    if variance <= 0:
        return 1e6 if top > 0 else 1.0
    return top / math.sqrt(variance)


CLASSES = ("elementwise", "matmul", "reduction", "norm", "exp", "module")
NORM = CLASSES.index("norm")
DIRECTION_CODES = {direction: code for code, direction in enumerate(DIRECTIONS)}  # 3: none of them
DIRECTION_NAMES = {code: name for name, code in DIRECTION_CODES.items()}
ENTRY_WIDTH = 8  # in_err, in_abs, top_abs, k, first input's max |x|, rms, Mean (NaN: no input), outputs
FORWARD_WIDTH = 7
OUTPUT_WIDTH = 11  # 5 errors, max |x|, rms, numel, dtype id, suffix id, element-wise metrics id (-1: none)


class Tracker:
    """Collects, entry by entry in the second pass, the few numbers the propagation view needs, as flat
    arrays of doubles (a 100 000-entry run would otherwise hold a tuple and a list per entry)."""

    def __init__(self):
        self.flat = array("d")  # ENTRY_WIDTH numbers per entry, then OUTPUT_WIDTH per differing output
        self.offsets = array("l")  # per stored entry: where it starts in ``flat``
        self.stored = array("l")  # per stored entry: its merged position
        self.codes = bytearray()  # per stored entry: class index * 4 + direction code
        self.names: List[str] = []  # per stored entry: its name (the side's own string, not a copy)
        self.strings: Dict[Any, int] = {}  # dtype and suffix strings -> id
        self.string_list: List[Any] = []
        self.elementwise: List[Dict[str, Any]] = []
        # forward entry name -> where its FORWARD_WIDTH numbers start in forward_flat: relative error of its
        # tensors, per-element absolute error of its inputs, k, max |x|, rms and Mean of its first input (what
        # its backward's op saved), and the error of its backward's inputs (the gradient reaching it)
        self.forward: Dict[str, int] = {}
        self.forward_flat = array("d")
        self.classes: Dict[str, int] = {}
        # per matched entry, for the plot: merged position, worst output error, worst input error
        self.positions = array("l")
        self.out_series = array("d")
        self.in_series = array("d")
        # merged position -> float8 zero-share findings (``fp8.findings``), for entries with float8 records only
        self.fp8: Dict[int, List[fp8.Finding]] = {}

    def _intern(self, value: Any) -> int:
        number = self.strings.get(value)
        if number is None:
            number = self.strings[value] = len(self.string_list)
            self.string_list.append(value)
        return number

    def add(self, position: int, name: str, diffs: List[Any]) -> None:
        base, direction, _ = split_name(name)
        cls = self.classes.get(base)
        if cls is None:
            cls = self.classes[base] = CLASSES.index(op_class(base))
        inputs = []
        outs = []
        out_worst = 0.0
        if any(
            (d.a is not None and d.a.fp8_zero is not None) or (d.b is not None and d.b.fp8_zero is not None)
            for d in diffs
        ):
            found_fp8 = fp8.findings([(d.a, d.b) for d in diffs])
            if found_fp8:
                self.fp8[position] = found_fp8
        for diff in diffs:
            if diff.a is None or diff.b is None:
                continue
            errors, top, rms, worst = tensor_errors(diff)
            if diff.a.role == INPUT:
                inputs.append((diff, errors, top, rms, worst))
            elif worst:
                outs.append((diff, errors, top, rms))
                if worst > out_worst:
                    out_worst = worst
        in_err = in_abs = top_abs = 0.0
        k = 1.0
        first = None
        sized = CLASSES[cls] in SIZED
        for diff, errors, top, rms, worst in inputs:
            if first is None:
                mean = _number(diff.b.stats[2])
                first = (top, rms, mean if mean is not None and _isfinite(mean) else 0.0)
            if sized:
                if cls == 2:  # reduction: K is what it sums
                    k = max(k, diff.b.numel or 1)
                elif isinstance(diff.b.shape, list) and diff.b.shape:
                    k = max(k, max((s for s in diff.b.shape if isinstance(s, int)), default=1))
            if not worst or worst > 0.1 and worst > 100 * out_worst and cls != NORM:
                # (the second: a wholly different input that left the output alone was not used: an
                # uninitialised buffer under beta=0, as megatron's baddbmm has, a mask, an index. Not for a
                # normalisation, whose output ignores its input's shift and scale: batch_norm over a batch of
                # 3 gives a Max near sqrt(2) and a Norm of sqrt(numel) whatever its input, so the demo's
                # --seed 7 run, whose every input differs, named it the first suspect with "input error 0":
                # test_a_normalisation_whose_input_differs_wholly_is_explained_by_it)
                continue
            if worst > in_err:
                in_err = worst
            # per-element absolute error, as each statistic shows it (Mean and Norm move by rms-sized steps)
            for index, error in enumerate(errors):
                if error:
                    in_abs = max(in_abs, error * (rms if index in (2, 3) else top))
            if errors[0]:
                top_abs = max(top_abs, errors[0] * top)
        self.positions.append(position)
        self.out_series.append(out_worst)
        self.in_series.append(in_err)
        first = first or (math.nan, 0.0, 0.0)
        key = forward_name(name) if direction != "forward" else name
        if direction == "forward":
            self.forward[name] = len(self.forward_flat)
            self.forward_flat.extend((max(in_err, out_worst), in_abs, k) + first + (0.0,))
        elif direction == "backward" and key is not None:
            at = self.forward.get(key)
            if at is not None:
                self.forward_flat[at + 6] = in_err
        if not outs:  # an entry whose outputs agree cannot be a suspect
            return
        self.offsets.append(len(self.flat))
        self.stored.append(position)
        self.codes.append(cls * 4 + DIRECTION_CODES.get(direction, 3))
        self.names.append(name)
        flat = self.flat
        flat.extend((in_err, in_abs, top_abs, k) + first + (len(outs),))
        for diff, errors, top, rms in outs:
            extra = -1
            if diff.elementwise:
                extra = len(self.elementwise)
                self.elementwise.append(diff.elementwise)
            flat.extend([e or 0.0 for e in errors])
            flat.extend(
                (top, rms, diff.b.numel or 1, self._intern(str(diff.b.dtype)), self._intern(diff.a.suffix), extra)
            )

    def _outputs(self, offset: int):
        """(suffix, dtype, errors, max |x|, rms, numel, element-wise metrics) of a stored entry's outputs."""
        flat = self.flat
        count = int(flat[offset + ENTRY_WIDTH - 1])
        at = offset + ENTRY_WIDTH
        for _ in range(count):
            row = flat[at : at + OUTPUT_WIDTH]
            extra = int(row[10])
            yield (
                self.string_list[int(row[9])],
                self.string_list[int(row[8])],
                row[0:5],
                row[5],
                row[6],
                int(row[7]),
                self.elementwise[extra] if extra >= 0 else None,
            )
            at += OUTPUT_WIDTH

    def finish(self, result) -> Dict[str, Any]:
        samples: Dict[Tuple[str, str], Any] = {}
        for offset in self.offsets:
            for _suffix, dtype, errors, _top, _rms, numel, _extra in self._outputs(offset):
                root = math.sqrt(numel)
                for metric, error in zip(METRICS, errors):
                    if error:
                        bucket = samples.get((dtype, metric))
                        if bucket is None:
                            bucket = samples[(dtype, metric)] = array("d")
                        bucket.append(error / root if metric in SUMS else error)
        floor = floors(samples)
        del samples
        ends = result.a.ends
        merged = result.merged
        stored = self.stored
        order = sorted(range(len(stored)), key=lambda t: (ends[merged[stored[t]][0]], -merged[stored[t]][0]))
        suspects = []
        for t in order:
            found = self._judge(t, floor)
            if found is not None:
                underflow = fp8.note(result, found["position"])
                if underflow:  # a float8 record of the entry, or inside it, holds more zeros (fp8.py)
                    found["fp8_underflow"] = underflow
                suspects.append(found)
        suspects = self._drop_explained_modules(result, suspects)
        for rank, item in enumerate(sorted(suspects, key=lambda s: -s["score"]), 1):
            item["score_rank"] = rank
        positions = self.positions
        ordered = sorted(range(len(positions)), key=lambda t: (ends[merged[positions[t]][0]], -merged[positions[t]][0]))
        series = (
            array("l", (positions[t] for t in ordered)),
            array("d", (self.out_series[t] for t in ordered)),
            array("d", (self.in_series[t] for t in ordered)),
        )
        return {"noise_floor": floor, "suspects": suspects, "series": series}

    def _judge(self, t: int, floor) -> Optional[Dict[str, Any]]:
        offset = self.offsets[t]
        name = self.names[t]
        cls, direction = CLASSES[self.codes[t] // 4], DIRECTION_NAMES.get(self.codes[t] % 4, "")
        in_err, in_abs, top_abs, k, f_top, f_rms, f_mean = self.flat[offset : offset + ENTRY_WIDTH - 1]
        saved = 0.0
        gain_factor = 1.0
        if direction != "forward":
            key = forward_name(name)
            at = self.forward.get(key) if key is not None else None
            if at is not None:
                saved, saved_abs, fk, ft, fr, fm, grad_in = self.forward_flat[at : at + FORWARD_WIDTH]
                k = max(k, fk)
                if ft == ft:  # the forward entry had an input: its statistics give the spread
                    f_top, f_rms, f_mean = ft, fr, fm
                if cls != "matmul":  # f'(x) moves by f''(x) * dx: an absolute error of x enters too
                    saved = max(saved, saved_abs)
                if direction != "backward":  # parameters_grad: the gradient reaching the module is an input
                    saved = max(saved, grad_in)
            gain_factor = BACKWARD_FACTOR
        spread, scale = (_spread(f_top, f_rms, f_mean), f_top) if f_top == f_top else (1.0, 0.0)
        gain = allowance(cls, k, spread, scale) * gain_factor
        best = None
        for suffix, dtype, errors, top, rms, numel, elementwise in self._outputs(offset):
            limits = floor.get(dtype, {})
            for index, error in enumerate(errors):
                if not error:
                    continue
                if cls == "exp":
                    explained = max(in_err, 2 * top_abs, saved)
                else:
                    own_scale = rms if index in (2, 3) else top
                    explained = max(in_err, in_abs / own_scale if own_scale > 0 else 0.0, saved)
                noise = floor_of(limits, METRICS[index], numel)
                budget = gain * explained + noise
                if budget == math.inf:  # the inputs are already NaN or Inf: they explain anything
                    continue
                score = error / budget if budget > 0 else math.inf
                if best is None or score > best[0]:
                    best = (score, suffix, METRICS[index], error, explained, noise, elementwise)
        if best is None or best[0] <= SUSPECT_SCORE:
            return None
        score, suffix, metric, error, explained, noise, elementwise = best
        found = {
            "position": self.stored[t],
            "entry": name,
            "direction": direction,
            "op_class": cls,
            "tensor": suffix,
            "statistic": metric,
            "output_error": error,
            "input_error": explained,
            "gain": error / explained if explained > 0 else math.inf,
            "allowance": gain,
            "noise_floor": noise,
            "score": score,
        }
        if elementwise:  # task=tensor: the output's element-wise evidence too
            for key, field in TENSOR_EVIDENCE:
                if isinstance(elementwise.get(key), float):
                    found[field] = elementwise[key]
        return found

    @staticmethod
    def _drop_explained_modules(result, suspects):
        # a module that contains an earlier suspect is explained by it (the module's output carries the
        # child's error), so it is not a suspect of its own
        parents = result.a.parents
        merged = result.merged
        flagged = set()
        kept = []
        for item in suspects:
            index = merged[item["position"]][0]
            if is_module(item["entry"]) and index in flagged:
                continue
            kept.append(item)
            parent = parents[index]
            while parent >= 0 and parent not in flagged:
                flagged.add(parent)
                parent = parents[parent]
        return kept[:SUSPECT_LIMIT]


def pair_suspects(result) -> Dict[str, Any]:
    """The propagation part of a pair's summary: the noise floor and the suspects, with call sites."""
    out = []
    for item in result.propagation["suspects"]:
        i, j = result.merged[item["position"]]
        out.append(dict(item, bench_entry=result.b.names[j], call_site=result.a.sites[i]))
    return {"noise_floor": result.propagation["noise_floor"], "suspects": out}
