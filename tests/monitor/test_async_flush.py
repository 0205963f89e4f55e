"""The asynchronous flush (runtime/monitor/transfer.py, trainer_mon._flush/_drain): a collected step's figures are
copied without blocking and read on the host one collected step later, with the same CSV rows, anomaly records,
anomaly.json and flight recorder as the synchronous flush; nothing is lost at close or at exit; the CUDA and NPU
paths run here with fake events (no GPU on this machine)."""

import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from msprobe_runtime import TrainerMon
from msprobe_runtime.config import ConfigError
from msprobe_runtime.monitor import config as monitor_config
from msprobe_runtime.monitor import transfer, writer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = [
    {"rule_name": "AnomalyNan"},
    # threshold 3: quiet in the clean run of this MLP (at 0.5 the drifting weight means fire from step 5)
    {"rule_name": "AnomalyTurbulence", "args": {"threshold": 3}},
    {"rule_name": "AnomalySpike", "args": {"k": 6, "window": 10, "warmup": 3}},
]
CONFIG = {
    "wg_distribution": True,
    "param_distribution": True,
    "ops": ["min", "max", "norm", "nans", "mean"],
    "ndigits": 12,
    "alert": {"rules": RULES, "dump": True},
    "flight_recorder": {"steps": 4},
}


def outputs(run):
    """{file: text} of the run's CSV folder and anomaly_detected/ (then removed: the next run writes there too)."""
    found = {}
    for base, label in ((run.monitor.tensorboard_dir, "csv"), (run.output / "anomaly_detected", "anomaly")):
        for folder, _, names in os.walk(base):
            for name in names:
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as handle:
                    found[(label, os.path.relpath(path, base))] = handle.read()
    shutil.rmtree(run.output / "anomaly_detected", ignore_errors=True)
    return found


def device_state(monitor):
    """The rules' running averages and the spike windows, as the device holds them after the run."""
    state = {group: average for group, (_, average) in monitor.rules._averages.items()}
    state.update({key: window.values for key, window in monitor.responder.windows.items()})
    return state


@pytest.fixture
def reads_of_copies(monkeypatch):
    """How many in-flight copies were read on the host (InFlight.values), counted."""
    count = [0]
    original = transfer.InFlight.values

    def counted(self):
        count[0] += 1
        return original(self)

    monkeypatch.setattr(transfer.InFlight, "values", counted)
    return count


@pytest.mark.slow
@pytest.mark.parametrize("fault", [("nan", 7, "fc2.weight"), ("lr", 7, 1000.0)], ids=["nan", "lr"])
def test_async_writes_what_sync_writes(train, fault, reads_of_copies):
    sync = train(dict(CONFIG, flush="sync"), steps=12, fault=fault)
    sync_files = outputs(sync)
    assert reads_of_copies[0] == 0
    asynchronous = train(dict(CONFIG, flush="async"), steps=12, fault=fault)
    assert reads_of_copies[0] == 12  # every collected step went through the copy read a step later
    assert sync.monitor.anomalies and sync.monitor.anomalies[0]["step"] == 7
    assert asynchronous.monitor.anomalies == sync.monitor.anomalies
    async_files = outputs(asynchronous)
    assert ("anomaly", "rank0/flight_recorder_step7.json") in async_files
    assert any(key[0] == "csv" and key[1].startswith("grad_reduced_11-") for key in async_files)  # the last step
    assert async_files == sync_files
    # the device-side state is the device's own: the same whether the host read it at once or a step later
    expected, got = device_state(sync.monitor), device_state(asynchronous.monitor)
    assert expected.keys() == got.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(asynchronous.losses, sync.losses, rtol=0, atol=0, equal_nan=True)


def _loop(tmp_path, config, steps, after_step=None):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon = TrainerMon(str(path), params_have_main_grad=False)
    mon.set_monitor(model, optimizer)
    data, target = torch.randn(64, 16), torch.randn(64, 4)
    for step in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(data), target).backward()
        optimizer.step()
        if after_step is not None:
            after_step(step, mon)
    return mon


def _steps_written(mon):
    steps = set()
    for name in os.listdir(mon.tensorboard_dir):
        if name.startswith("grad_reduced_"):
            with open(os.path.join(mon.tensorboard_dir, name)) as handle:
                steps.update(int(line.split(",")[2]) for line in handle.readlines()[1:])
    return steps


def test_a_step_is_written_one_step_late_and_the_last_at_close(tmp_path, monkeypatch):
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    seen = []
    mon = _loop(tmp_path, {"wg_distribution": True, "flush": "async"}, 4, lambda s, m: seen.append(_steps_written(m)))
    assert seen == [set(), {0}, {0, 1}, {0, 1, 2}]  # step N's rows appear at step N + 1's flush
    mon.close()
    assert _steps_written(mon) == {0, 1, 2, 3}  # the step in flight at close is not lost
    sync = []
    _loop(tmp_path, {"wg_distribution": True, "flush": "sync"}, 2, lambda s, m: sync.append(_steps_written(m)))
    assert sync == [{0}, {0, 1}]


def test_the_last_collected_step_is_written_when_collection_ends(tmp_path, monkeypatch):
    """collect_times reached: the hooks go, no later flush would read the step in flight; it is read then."""
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    seen = []
    config = {"wg_distribution": True, "flush": "async", "collect_times": 3}
    mon = _loop(tmp_path, config, 5, lambda s, m: seen.append(_steps_written(m)))
    assert seen == [set(), {0}, {0, 1, 2}, {0, 1, 2}, {0, 1, 2}]
    assert mon._pending is None and mon.handles == []


def test_a_step_not_collected_reads_a_finished_copy_without_waiting(tmp_path, monkeypatch):
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    seen = []
    config = {"wg_distribution": True, "flush": "async", "step_interval": 3}
    _loop(tmp_path, config, 7, lambda s, m: seen.append(_steps_written(m)))
    # the CPU's copy is done when made: the next post-step hook (step 1, not collected) reads it
    assert seen == [set(), {0}, {0}, {0}, {0, 3}, {0, 3}, {0, 3}]


def test_no_blocking_read_in_a_step_but_the_previous_steps_copied_buffer(train, host_reads, monkeypatch):
    """conftest's spy on every host read: under async, the hooks of a collected step read one tensor, the host
    buffer that the previous collected step's flush copied into; the last one is read at close."""
    made = []  # (host reads done when the buffer was made, the buffer)
    start = transfer.Backend.start

    def spied(self, flat):
        host, event = start(self, flat)
        made.append((len(host_reads.calls), host))
        return host, event

    monkeypatch.setattr(transfer.Backend, "start", spied)
    config = dict(CONFIG, flush="async")
    run = train(config, steps=6, window=host_reads.window)
    assert run.monitor.has_collect_times == 6 and len(made) == 6
    assert [call[:2] for call in host_reads.calls] == [("tolist", "values")] * 6  # none in _flush, none other
    for index, (reads_before, host) in enumerate(made):
        assert reads_before == index  # step k-1's buffer was read before step k's copy started
        assert host_reads.tensors[index] is host  # and the k-th read is the k-th buffer
    # reads 0..4 in the training window (the next step's hooks), the last after it (close)
    assert [call[2] for call in host_reads.calls] == [True] * 5 + [False]


class FakeEvent:
    """A device event whose copy is 'not finished' at the first query: the flush must then wait on it."""

    log = []

    def __init__(self):
        self.number = len([entry for entry in FakeEvent.log if entry[0] == "made"])
        self.queries = 0
        FakeEvent.log.append(("made", self.number))

    def record(self):
        FakeEvent.log.append(("record", self.number))

    def query(self):
        self.queries += 1
        FakeEvent.log.append(("query", self.number))
        return self.queries > 1

    def synchronize(self):
        FakeEvent.log.append(("synchronize", self.number))


@pytest.fixture
def fake_device(monkeypatch, caplog):
    """The figures (on the CPU) take the path of the device type given: its Backend, with FakeEvent."""
    FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(Event=FakeEvent), raising=False)
    monkeypatch.setattr(transfer, "_pinning_failed", [])  # the pinned allocation is tried afresh
    real = transfer.backend_for

    def use(device_type):
        monkeypatch.setattr(transfer, "backend_for", lambda _: real(device_type))
        return real(device_type)

    caplog.set_level(logging.WARNING, logger="msprobe_runtime")
    return use


@pytest.mark.parametrize("device_type", ["cuda", "npu"])
def test_the_accelerator_path_with_a_fake_event(train, fake_device, device_type, caplog):
    backend = fake_device(device_type)
    assert backend.device_type == device_type and backend.accelerated
    config = dict(CONFIG, step_interval=2)  # no flush key: auto, async on an accelerator
    fake = train(config, steps=7, fault=("nan", 4, "fc1.weight"))
    expected = []
    for number in range(4):  # steps 0, 2, 4, 6
        expected += [("made", number), ("record", number)]
        # the next step (not collected) asks once, finds the copy unfinished, and does not wait; the next
        # collected step's flush waits; the last step's copy is waited for at close
        expected += [("query", number), ("synchronize", number)] if number < 3 else [("synchronize", number)]
    assert FakeEvent.log == expected
    assert [record["step"] for record in fake.monitor.anomalies][:1] == [4]
    # the host buffer: pinned where the build can pin, else pageable (said once)
    assert caplog.text.count("no pinned host memory") == (0 if torch.cuda.is_available() else 1)
    fake_files = outputs(fake)
    sync = train(dict(config, flush="sync"), steps=7, fault=("nan", 4, "fc1.weight"))
    assert fake_files == outputs(sync) and fake.monitor.anomalies == sync.monitor.anomalies


def test_which_flush_auto_picks(tmp_path, monkeypatch, fake_device):
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))

    def monitor(**extra):
        path = tmp_path / "config.json"
        path.write_text(json.dumps({"wg_distribution": True, "alert": {"rules": RULES[:1]}, **extra}))
        return TrainerMon(str(path), params_have_main_grad=False)

    cuda, cpu = transfer.backend_for("cuda"), transfer.backend_for("cpu")
    assert not cpu.accelerated and cuda.accelerated
    assert monitor()._asynchronous(cuda) and not monitor()._asynchronous(cpu)
    assert monitor(flush="async")._asynchronous(cpu) and not monitor(flush="sync")._asynchronous(cuda)
    # on_anomaly: auto keeps the capture on the very next step; forced async is allowed (capture a step later)
    capture = {"on_anomaly": {"level": "mix", "scope": "anomalous", "steps": 1}}
    assert not monitor(**capture)._asynchronous(cuda) and monitor(flush="async", **capture)._asynchronous(cuda)
    # a replay closure needs its step's verdict while the batch is current: sync under auto, refused with async
    replayed = monitor()
    replayed.set_replay(lambda: None)
    assert not replayed._asynchronous(cuda)
    with pytest.raises(ConfigError, match='set_replay: .*"flush": "async"'):
        monitor(flush="async").set_replay(lambda: None)
    monkeypatch.delattr(torch, "npu")
    assert not transfer.backend_for("npu").accelerated  # no torch_npu: no event known


def test_a_replay_set_mid_run_turns_auto_synchronous_and_skips_the_step_in_flight(
    tmp_path, monkeypatch, fake_device, caplog
):
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    fake_device("cuda")
    config = {"wg_distribution": True, "param_distribution": True, "alert": {"rules": RULES[:1]}}

    def after(step, mon):
        if step == 2:  # step 2's copy is in flight (auto, async on the 'accelerator')
            mon.set_replay(lambda: None)
        if step == 1:
            with torch.no_grad():
                mon.params[0][1].view(-1)[0] = float("nan")  # before step 2: NaN from step 2 on

    mon = _loop(tmp_path, config, 4, after)
    mon.close()
    assert sorted({record["step"] for record in mon.anomalies}) == [2, 3]
    assert "step 2: read at step 3, after its batch: not replayed" in caplog.text
    folder = tmp_path / "out" / "anomaly_detected" / "rank0"
    assert (folder / "replay_step3.json").exists() and not (folder / "replay_step2.json").exists()
    assert [entry[0] for entry in FakeEvent.log].count("record") == 3  # steps 0-2 copied; step 3 synchronous


def test_the_flush_key_is_checked():
    assert monitor_config.parse({}).flush == "auto"
    assert monitor_config.parse({"flush": "sync"}).flush == "sync"
    with pytest.raises(ConfigError, match="did you mean 'async'"):
        monitor_config.parse({"flush": "asynch"})
    with pytest.raises(ConfigError, match="not one of auto, async, sync"):
        monitor_config.parse({"flush": True})


@pytest.mark.parametrize("where", ["device part", "host part"])
def test_an_error_of_ours_drops_one_step_as_the_sync_flush_does(train, monkeypatch, caplog, where):
    """The device part failing (a hook) drops the step before its copy; the host part failing (the CSV write,
    a step later under async) drops that step alone, never the one being collected; the loop sees neither."""
    if where == "device part":
        original = TrainerMon._collect_pre

        def broken(self, optimizer):
            if self.step == 3:
                raise RuntimeError("injected")
            original(self, optimizer)

        monkeypatch.setattr(TrainerMon, "_collect_pre", broken)
    else:
        original = writer.CSVWriter.write

        def broken(self, prefix, step, rows):
            if step == 3 and prefix == "param_origin":
                raise RuntimeError("injected")
            original(self, prefix, step, rows)

        monkeypatch.setattr(writer.CSVWriter, "write", broken)
    plain = train(monitor=False, steps=6)
    caplog.set_level(logging.WARNING, logger="msprobe_runtime")
    sync = train(dict(CONFIG, flush="sync"), steps=6)
    sync_files = outputs(sync)
    asynchronous = train(dict(CONFIG, flush="async"), steps=6)
    assert caplog.text.count("injected") == 2  # once a run
    assert outputs(asynchronous) == sync_files
    steps = {
        int(line.split(",")[2])
        for key, text in sync_files.items()
        if key[1].startswith("param_origin")
        for line in text.splitlines()[1:]
    }
    assert steps == {0, 1, 2, 4, 5}
    for a, b in zip(plain.losses, asynchronous.losses):
        assert torch.equal(a, b)


def test_a_monitor_dropped_without_close_writes_its_last_step(tmp_path, monkeypatch):
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    mon = _loop(tmp_path, {"wg_distribution": True, "flush": "async"}, 3)
    folder = mon.tensorboard_dir
    assert mon._pending is not None
    # the hooks on the parameters hold the monitor in a cycle through tensors, which the collector leaves: in a
    # job, __del__ comes at exit, after the atexit hook (the next test); here the hooks go first
    mon._remove_hooks()
    del mon
    gc.collect()
    steps = set()
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as handle:
            steps.update(int(line.split(",")[2]) for line in handle.readlines()[1:])
    assert steps == {0, 1, 2}


@pytest.mark.slow
def test_a_job_that_dies_still_writes_the_step_in_flight(tmp_path):
    """An exception out of the training loop, no close: the interpreter's exit writes the last step's rows, its
    anomaly record and its flight recorder (the atexit hook, held weakly)."""
    config = {"wg_distribution": True, "alert": {"rules": RULES[:1], "dump": True}, "flight_recorder": {"steps": 2}}
    (tmp_path / "config.json").write_text(json.dumps(dict(config, flush="async")))
    script = textwrap.dedent(
        f"""
        import torch
        from msprobe_runtime import TrainerMon

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        mon = TrainerMon({str(tmp_path / "config.json")!r}, params_have_main_grad=False)
        mon.set_monitor(model, optimizer)
        data, target = torch.randn(64, 16), torch.randn(64, 4)
        for step in range(4):
            if step == 3:
                with torch.no_grad():
                    model[2].weight.view(-1)[3] = float("nan")
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(data), target).backward()
            optimizer.step()
        raise RuntimeError("the job dies")
        """
    )
    env = dict(os.environ, MONITOR_OUTPUT_DIR=str(tmp_path / "out"))
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1 and "the job dies" in done.stderr, done.stderr
    folder = tmp_path / "out" / "anomaly_detected" / "rank0"
    records = json.loads((folder / "anomaly.json").read_text())
    assert {record["step"] for record in records.values()} == {3}
    assert (folder / "flight_recorder_step3.json").exists()
    [run_folder] = [p for p in (tmp_path / "out").iterdir() if p.name != "anomaly_detected"]
    text = (run_folder / "grad_reduced_3-3.csv").read_text()
    assert ",3," in text


@pytest.mark.slow
def test_a_forced_async_flush_starts_the_deep_capture_a_step_later(tmp_path, net, caplog):
    from fixtures.monitor_capture import loop

    capture = {
        "wg_distribution": True,
        "param_distribution": True,
        "ops": ["min", "max", "norm", "nans"],
        "alert": {"rules": RULES[:2], "dump": True},
        "on_anomaly": {"level": "mix", "scope": "anomalous", "steps": 1},
        "flush": "async",
    }
    plain = loop.train(str(tmp_path), net, None, steps=11, fault=("lr", 7, 1000.0))
    with caplog.at_level(logging.WARNING, logger="msprobe_runtime"):
        run = loop.train(str(tmp_path), net, capture, steps=11, fault=("lr", 7, 1000.0))
    assert all(torch.equal(a, b) for a, b in zip(plain["losses"], run["losses"]))
    first = run["monitor"].anomalies[0]
    assert first["step"] == 7 and first["message"].startswith("Rule AnomalyTurbulence")
    module = first["tag_name"].split("/")[0].split(":")[1].rpartition(".")[0]
    folder = tmp_path / "monitor_output" / "anomaly_detected" / "rank0" / "capture_step7"  # named after step 7
    assert sorted(path.name for path in folder.iterdir()) == ["step9"]  # read at step 8: step 9 is captured
    [dump] = list((folder / "step9").glob("*/dump.json"))
    data = json.loads(dump.read_text())["data"]
    assert {name.split(".Linear.")[0] for name in data if name.startswith("Module.")} == {f"Module.{module}"}
    assert "1 step(s) from step 9" in caplog.text
