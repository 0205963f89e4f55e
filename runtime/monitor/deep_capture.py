"""What the monitor does when a rule fires, beyond msprobe's anomaly.json (docs/monitor.md, "Flight recorder,
spike rule and automatic deep capture"):

- ``AnomalySpike`` (spike.py): the loss (``TrainerMon.observe_loss``) and the global gradient norm, on the device;
- the flight recorder (flight_recorder.py): the last K collected steps' figures written with the anomaly;
- ``on_anomaly``: a PrecisionDebugger dump (this runtime's own) of the next ``steps`` optimizer steps, limited to
  the module of the earliest anomaly (``scope: anomalous``) or the whole model (``all``), started and stopped from
  the optimizer's post-step hook: no restart, no edit;
- the replay: with ``TrainerMon.set_replay(closure)``, the closure (forward and backward of the same batch) runs
  once more right after the step a rule fired at, under the dump when ``on_anomaly`` is set, with the gradients
  (``.grad``, megatron's ``main_grad``) and the CPU and CUDA random states saved and put back, so training goes on
  bit-identical. The rerun sees the weights *after* that step's update (the rule is read at the flush, once the
  optimizer has run): a fault that the update carried into the weights (a NaN gradient that AdamW applied, a NaN
  put into a weight) comes back, and is reported reproducible; a fault of that one forward or backward alone (a
  flipped activation, a bad collective) whose update left the weights sane does not, and is reported transient.

Everything here runs at the flush of a step with an anomaly, off the hot path: the replay's verdict reads the
rerun's figures to the host (one copy) and writes a small JSON. An error of ours is logged and never reaches the
training loop; an exception of the user's closure is logged, and the gradients and random states are put back.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from ..foreign import instance_attribute
from . import anomalies, flight_recorder, metrics, spike

if TYPE_CHECKING:
    from .config import Rule

logger = logging.getLogger("msprobe_runtime")

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_GRADIENT_TAGS = ("acc_grad", "post_grad")


def module_of(param_name: str) -> str:
    """``decoder.layers.1.mlp.fc1.weight`` -> ``decoder.layers.1.mlp.fc1`` (the module owning the parameter)."""
    return param_name.rpartition(".")[0]


def dump_list_entry(module_path: str, chunk: int | None) -> str:
    """The list entry of config.json that selects a module in the dump: its entries are named
    ``Module.{path}.{Class}.forward.{n}`` (``Module.{chunk}.{path}...`` for a list of model chunks); the trailing
    dot keeps ``layers.1`` from selecting ``layers.10``."""
    prefix = f"{chunk}." if chunk is not None else ""
    return f"Module.{prefix}{module_path}."


class Responder:
    """The spike rule's windows, the flight recorder, the deep capture and the replay of one TrainerMon."""

    def __init__(self, monitor: Any) -> None:  # the TrainerMon (not imported: trainer_mon imports this module)
        self.monitor = monitor
        cfg = monitor.config
        self.spike_rules: list[tuple[int, Rule]] = [
            (index, rule) for index, rule in enumerate(cfg.rules) if rule.name == "AnomalySpike"
        ]
        self.windows = {
            (index, series): spike.SpikeWindow(rule) for index, rule in self.spike_rules for series in spike.SERIES
        }
        self.recorder = flight_recorder.FlightRecorder(cfg.flight_recorder_steps) if cfg.flight_recorder_steps else None
        self.on_anomaly = cfg.on_anomaly
        self.folder = os.path.join(monitor.output_base_dir, "anomaly_detected", f"rank{monitor.rank}")
        self.replay: Callable[[], Any] | None = None
        self.replaying = False
        self.replay_loss: torch.Tensor | None = None
        self.times_left = cfg.on_anomaly.times if cfg.on_anomaly is not None else 1
        self.debugger: Any = None
        self.capture_left = 0  # optimizer steps the capture still records after the one it started at
        self.capture_started = -1
        self.loss_sum: torch.Tensor | None = None
        self.loss_count = 0
        self.last: dict[str, float | None] = {"loss": None, "grad_norm": None}
        self.series_layout: list[tuple[int, str]] = []  # (rule index, series) of device_parts' last parts
        self._failed: set[str] = set()
        self.finished: list[Any] = []  # debuggers whose capture ended: close() waits for their files
        self.fired_spikes: list[tuple[dict[str, Any], Rule, str, float, float, float]] = []

    @property
    def wanted(self) -> bool:
        return bool(self.spike_rules or self.recorder or self.on_anomaly is not None)

    # ------------------------------------------------------------------ the loss, kept on the device

    def observe_loss(self, loss: Any) -> None:
        if type(loss) is float or type(loss) is int:
            loss = torch.tensor(float(loss))
        elif type(loss) not in _PLAIN:
            self._once("loss", "observe_loss takes a tensor or a float; this loss is not a plain tensor: ignored")
            return
        value = loss.detach()
        if value.numel() != 1:
            self._once("loss shape", "observe_loss takes a 0-d (one-element) tensor; ignored")
            return
        value = value.reshape(()).to(torch.float32)
        if self.replaying:
            self.replay_loss = value
            return
        self.loss_sum = value if self.loss_sum is None else self.loss_sum + value.to(self.loss_sum.device)
        self.loss_count += 1

    def _once(self, key: str, text: str) -> None:
        if key not in self._failed:
            self._failed.add(key)
            logger.warning("monitor: %s", text)

    # ------------------------------------------------------------------ the flush: on the device, then on the host

    def device_parts(self, stacked: dict[str, torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """The spike rule's figures for the flush's one copy: [value, mean, std, fired] per rule and series."""
        self.series_layout = []
        if not self.spike_rules:
            self.loss_sum, self.loss_count = None, 0
            return []
        series: dict[str, torch.Tensor] = {}
        if self.loss_sum is not None:
            series["loss"] = self.loss_sum.to(device) / self.loss_count
        self.loss_sum, self.loss_count = None, 0
        ops = self.monitor.ops
        if "grad_reduced" in stacked and "norm" in ops:
            series["grad_norm"] = spike.global_norm(stacked["grad_reduced"][:, ops.index("norm")])
        parts = []
        for index, _ in self.spike_rules:
            for name, value in series.items():
                parts.append(self.windows[(index, name)].evaluate(value))
                self.series_layout.append((index, name))
        return parts

    def spike_records(
        self, step: int, host: Sequence[float], first_call_id: int, series: Sequence[tuple[int, str]]
    ) -> list[dict[str, Any]]:
        """Records of the spikes in the host copy's tail: ``spike.WIDTH`` numbers per entry of ``series``, the
        ``series_layout`` of that step's ``device_parts`` (kept with the copy: the asynchronous flush reads it
        after the next step's device part has run)."""
        found = []
        self.last = {"loss": None, "grad_norm": None}
        self.fired_spikes = []
        for offset, (index, name) in enumerate(series):
            value, mean, std, fired = host[offset * spike.WIDTH : (offset + 1) * spike.WIDTH]
            self.last[name] = value
            if fired:
                tag = spike.TAGS[name].format(rank=self.monitor.rank)
                text = anomalies.message("AnomalySpike", tag, spike.OPS[name], step, value, mean)
                item = anomalies.record(self.monitor.rank, step, first_call_id + offset, tag, text, [self.monitor.rank])
                found.append(item)
                self.fired_spikes.append((item, self.monitor.config.rules[index], name, value, mean, std))
                logger.warning(
                    "monitor: step %d: %s %g is %.1f standard deviations above the window mean %g (AnomalySpike k=%g)",
                    step,
                    name,
                    value,
                    (value - mean) / std if std > 0 else float("inf"),
                    mean,
                    self.monitor.config.rules[index].k,
                )
        return found

    def after_flush(
        self,
        step: int,
        groups: list[tuple[str, list[Any]]],
        found: list[dict[str, Any]],
        fired: list[tuple[dict[str, Any], Rule, str, float, float]],
        now: int | None = None,
    ) -> None:
        """The step's figures (host), its records earliest first and what fired them: record, write, capture.
        ``now``: the optimizer step whose post-step hook runs, ``step`` itself unless the flush is asynchronous
        (then a later one: the capture records the steps after ``now``, and the replay, whose batch is gone, is
        not run)."""
        now = step if now is None else now
        if self.recorder is not None:
            self.recorder.add(step, groups, self.last.get("loss"), self.last.get("grad_norm"))
        if not found:
            return
        folder = None
        try:
            folder = flight_recorder.safe_folder(
                self.monitor.output_base_dir, "anomaly_detected", f"rank{self.monitor.rank}"
            )
            if self.recorder is not None and self.recorder.due(step):
                path = self.recorder.write(folder, self.monitor.rank, step, self.monitor.config.ops, found)
                logger.warning(
                    "monitor: step %d: the last %d steps' figures written to %s", step, len(self.recorder.kept), path
                )
        except Exception as error:  # never into the training loop
            self._once("recorder", f"writing the flight recorder failed ({type(error).__name__}: {error})")
        if folder is None or self.times_left <= 0 or self.debugger is not None:
            return
        replay = self.replay if now == step else None
        if self.replay is not None and replay is None:
            # the flush was asynchronous when the closure was set (trainer_mon._asynchronous): step N's batch is
            # no longer the current one, and a rerun of another batch would give a wrong verdict
            self._once("replay late", f"step {step}: read at step {now}, after its batch: not replayed")
        if self.on_anomaly is None and replay is None:
            return
        self.times_left -= 1
        target = self._target(found, groups)
        if self.on_anomaly is not None:
            self._start_capture(folder, step, target, now, replay is not None)
        if replay is not None:
            self._replay(folder, step, found[0], fired, target)
        if self.debugger is not None:
            if self.on_anomaly is not None and self.on_anomaly.steps > 0:
                self.capture_left = self.on_anomaly.steps
                self.capture_started = now
                if replay is not None:
                    self.debugger.step()  # the replay is step N of the dump; the next optimizer step N + 1
                self.monitor._quiet = self._own_work()
            else:
                self._stop_capture()

    # ------------------------------------------------------------------ which module

    def _target(self, found: list[dict[str, Any]], groups: list[tuple[str, list[Any]]]) -> tuple[str, str | None]:
        """(the monitor's parameter name, its module's dump list entry, None for the whole model) of the earliest
        record that names a parameter; a gradient-norm spike names the parameter whose gradient norm grew most
        against the step before, a loss spike none (the next record is tried)."""
        for item in found:
            name = item["tag_name"].split("/")[0]
            if name == "grad_norm":
                name = self._grew_most(groups) or name
            path = self.monitor.param_paths.get(name)
            if path is None:
                continue
            chunk, param_name = path
            module = module_of(param_name)
            if not module:
                return name, None  # a parameter of the root module: the whole model
            return name, dump_list_entry(module, chunk if self.monitor.chunked else None)
        return found[0]["tag_name"].split("/")[0], None

    def _grew_most(self, groups: list[tuple[str, list[Any]]]) -> str | None:
        ops = self.monitor.ops
        if "norm" not in ops:
            return None
        column = ops.index("norm")
        rows = dict(groups).get("grad_reduced") or []
        before: dict[str, Any] = {}
        if self.recorder is not None and len(self.recorder.kept) >= 2:
            earlier_rows = dict(self.recorder.kept[-2]["groups"]).get("grad_reduced") or []
            before = {tag: values for tag, values, _, _ in earlier_rows}
        best, best_score = None, -1.0
        for tag, values, _, _ in rows:
            value = values[column]
            earlier = before.get(tag)
            previous = earlier[column] if earlier else None
            score = value / previous if previous is not None and previous > 0 else value
            if score == score and score > best_score:  # NaN scores lose
                best, best_score = tag.split("/")[0], score
        return best

    # ------------------------------------------------------------------ the capture

    def _start_capture(self, folder: str, step: int, target: tuple[str, str | None], now: int, replayed: bool) -> None:
        from ..debugger import PrecisionDebugger

        cfg = self.on_anomaly
        assert cfg is not None
        try:
            entry = target[1] if cfg.scope == "anomalous" else None
            section: dict[str, Any] = {"list": [entry]} if entry is not None else {}
            name = f"capture_step{step}"
            if os.path.lexists(os.path.join(folder, name)):  # an earlier job's, in the same output folder
                name += f"-{self.monitor.unique_id}"
            dump_path = os.path.join(folder, name)
            config = {"task": "statistics", "dump_path": dump_path, "level": cfg.level, "statistics": section}
            config_path = flight_recorder.write_json(folder, f"{name}.config.json", config)
            before = PrecisionDebugger._instance
            try:
                debugger = PrecisionDebugger(config_path=config_path)
            finally:
                # the user's class-level calls (PrecisionDebugger.step()) keep reaching the user's debugger
                PrecisionDebugger._instance = before
            first = step if replayed else now + 1
            debugger.set_init_step(first)
            model = self.monitor.chunks if self.monitor.chunked else self.monitor.chunks[0]
            debugger.start(model)
            if debugger._collector is None or not debugger._collector.collecting:
                logger.warning("monitor: step %d: the deep capture did not start (another debugger collects?)", step)
                return
            self.debugger = debugger
            logger.warning(
                "monitor: step %d: deep capture (level %s, %s) of %s into %s",
                step,
                cfg.level,
                f"list {entry}" if entry else "the whole model",
                "the replay and " * replayed + f"{cfg.steps} step(s) from step {now + 1}",
                dump_path,
            )
        except Exception as error:
            self._once("capture", f"starting the deep capture failed ({type(error).__name__}: {error})")

    def _own_work(self) -> Any:
        collector = self.debugger._collector if self.debugger is not None else None
        return collector.own_work if collector is not None else None

    def end_step(self, step: int) -> None:
        """The optimizer's post-step hook, every step: count the capture's steps, stop it after the last."""
        self.loss_sum, self.loss_count = None, 0  # a loss observed in a step not flushed is not the next step's
        if self.debugger is None or step <= self.capture_started:
            return
        try:
            self.capture_left -= 1
            if self.capture_left > 0:
                self.debugger.step()
            else:
                self._stop_capture()
        except Exception as error:
            self._once("capture step", f"the deep capture failed ({type(error).__name__}: {error}); stopped")
            self.debugger = None
            self.monitor._quiet = None

    def _stop_capture(self) -> None:
        debugger, self.debugger = self.debugger, None
        self.monitor._quiet = None
        if debugger is not None:
            debugger.stop()
            self.finished.append(debugger)

    def close(self) -> None:
        """Stop a capture still running and wait until its files are written."""
        try:
            if self.debugger is not None:
                self._stop_capture()
            for debugger in self.finished:
                debugger.wait()
            self.finished = []
        except Exception as error:
            self._once("capture close", f"finishing the deep capture failed ({type(error).__name__}: {error})")

    # ------------------------------------------------------------------ the replay

    def _replay(
        self,
        folder: str,
        step: int,
        first: dict[str, Any],
        fired: list[tuple[dict[str, Any], Rule, str, float, float]],
        target: tuple[str, str | None],
    ) -> None:
        monitor = self.monitor
        params = [p for chunk in monitor.chunks for p in chunk.parameters() if type(p) in _PLAIN and p.requires_grad]
        grads = [p.grad for p in params]
        main_grads = []
        if monitor.params_have_main_grad:
            for p in params:
                main = instance_attribute(p, "main_grad")
                if type(main) in _PLAIN:
                    main_grads.append((main, main.detach().clone()))
        cpu_state = torch.get_rng_state()
        cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        outcome: dict[str, Any] = {"rank": monitor.rank, "step": step, "anomaly": first}
        returned = None
        self.replaying, self.replay_loss = True, None
        try:
            for p in params:
                p.grad = None
            for main, _ in main_grads:
                main.zero_()
            try:
                assert self.replay is not None
                returned = self.replay()
            except Exception as error:  # the user's closure: said, never raised into the training loop
                outcome["error"] = f"{type(error).__name__}: {error}"
            if "error" not in outcome:
                quiet = self._own_work()  # our figures are not the user's calls, under the dump
                try:
                    if quiet is None:
                        outcome.update(self._verdict(first, fired, returned))
                    else:
                        with quiet:
                            outcome.update(self._verdict(first, fired, returned))
                except Exception as error:  # ours: said in the file and the log, never raised
                    outcome["error"] = f"the verdict failed ({type(error).__name__}: {error})"
        finally:
            for p, grad in zip(params, grads):
                p.grad = grad
            for main, kept in main_grads:
                main.copy_(kept)
            torch.set_rng_state(cpu_state)
            if cuda_states is not None:
                torch.cuda.set_rng_state_all(cuda_states)
            self.replaying = False
        outcome["state"] = (
            f"the weights after step {step}'s update (the rule is read after the optimizer step); gradients and "
            "random states put back after the rerun"
        )
        verdict = outcome.get("verdict", "failed")
        try:
            path = flight_recorder.write_json(folder, f"replay_step{step}.json", outcome)
        except Exception as error:
            path = f"(not written: {type(error).__name__}: {error})"
        logger.warning(
            "monitor: step %d: replay of the step: the anomaly %s (%s); %s",
            step,
            {"reproducible": "came back: reproducible", "transient": "did not come back: transient"}.get(
                verdict, verdict
            ),
            outcome.get("reason") or outcome.get("error", ""),
            path,
        )

    def _verdict(
        self,
        first: dict[str, Any],
        fired: list[tuple[dict[str, Any], Rule, str, float, float]],
        returned: Any,
    ) -> dict[str, Any]:
        """Whether the earliest anomaly came back in the rerun: its rule on the rerun's figure of the same kind."""
        monitor = self.monitor
        loss = self.replay_loss
        if loss is None and type(returned) in _PLAIN and returned.numel() == 1:
            loss = returned.detach().reshape(()).to(torch.float32)
        name = first["tag_name"].split("/")[0]
        by_name = dict(monitor.params)
        kind = first["tag_name"].split("/")[-1]
        spike_hit = [item for item in self.fired_spikes if item[0] is first]
        detail = [item for item in fired if item[0] is first]
        with torch.no_grad():
            if spike_hit:
                _, rule, series, value, mean, std = spike_hit[0]
                if series == "loss":
                    if loss is None:
                        return {
                            "verdict": "undetermined",
                            "reason": "the closure returned no loss, nor called observe_loss",
                        }
                    replayed = loss
                else:
                    norms = [monitor._grad_of(p) for _, p in monitor.params]
                    replayed = spike.global_norm(
                        torch.stack(
                            [
                                torch.linalg.vector_norm(g, dtype=torch.float32).to(norms[0].device)
                                for g in norms
                                if g is not None
                            ]
                        )
                    )
                limit = mean + float(rule.k or 0) * max(std, spike.RELATIVE_FLOOR * abs(mean))
                again = float(replayed.item())
                return {
                    "verdict": "reproducible" if again > limit else "transient",
                    "rule": "AnomalySpike",
                    "metric": series,
                    "value": flight_recorder.plain_number(value),
                    "replayed": flight_recorder.plain_number(again),
                    "limit": flight_recorder.plain_number(limit),
                    "reason": f"{series} {again:g} in the rerun against the limit {limit:g}",
                }
            param = by_name.get(name)
            grad = monitor._grad_of(param) if param is not None else None
            rule_name = detail[0][1].name if detail else "AnomalyNan"
            if rule_name == "AnomalyNan":
                bad_loss = loss is not None and not bool(torch.isfinite(loss))
                bad_grad = grad is not None and not bool(torch.isfinite(grad).all())
                return {
                    "verdict": "reproducible" if bad_loss or bad_grad else "transient",
                    "rule": rule_name,
                    "metric": first["tag_name"],
                    "replayed_loss": flight_recorder.plain_number(None if loss is None else float(loss)),
                    "reason": f"the rerun's gradient of {name} is {'not ' * bad_grad}finite"
                    + (", its loss is not finite" if bad_loss else ""),
                }
            if kind not in _GRADIENT_TAGS or grad is None:
                return {
                    "verdict": "undetermined",
                    "rule": rule_name,
                    "reason": f"{kind} is not recomputed by a forward and backward (the rerun recomputes gradients)",
                }
            _, rule, op, value, history = detail[0]
            replayed_value = float(metrics.figures(grad, [op], monitor.config.eps)[0])
            limit = abs(history) * (1 + float(rule.threshold or 0))
            return {
                "verdict": "reproducible" if abs(replayed_value) > limit else "transient",
                "rule": rule_name,
                "metric": f"{first['tag_name']} {op}",
                "value": flight_recorder.plain_number(value),
                "replayed": flight_recorder.plain_number(replayed_value),
                "limit": flight_recorder.plain_number(limit),
                "reason": f"{op} {replayed_value:g} in the rerun against {limit:g}",
            }
