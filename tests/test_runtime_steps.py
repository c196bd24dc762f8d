"""runtime/steps.py, the zero-code step counter, as a unit: plain classes stand
in for optimizers (the module reads only their `_iterations`). The real
optimizers of Keras 3, tf_keras and a custom loop are counted end to end in
test_e2e_local.py, test_keras3.py and test_keras_fallback.py; a Keras 3 `fit`
on JAX (its counter in the trainer's state) in a real task process here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import runtime
from launcher.runtime import steps
from tests.conftest import SCRIPTS

REPO = Path(__file__).resolve().parent.parent


class Counter:
    def __init__(self, value: int) -> None:
        self.value = value

    def numpy(self) -> int:
        return self.value


class BaseOptimizer:
    def __init__(self, iterations: int | None = 0) -> None:
        self._iterations = None if iterations is None else Counter(iterations)


class Adam(BaseOptimizer):
    def __init__(self, iterations: int | None = 0) -> None:
        super().__init__(iterations)
        self.name = "adam"


@pytest.fixture
def channel(monkeypatch):
    """A progress pipe as the agent gives a task; yields a reader of its records."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    monkeypatch.setenv("MGPU_PROGRESS_FD", str(write_fd))
    monkeypatch.setattr(runtime, "_script_reports_steps", False)
    monkeypatch.setattr(steps, "_optimizers", [])
    monkeypatch.setattr(steps, "_last_reported", None)
    monkeypatch.setattr(steps, "_loss_reported", None)
    monkeypatch.setattr(steps, "_epoch_loss", None)
    monkeypatch.setattr(steps, "_watcher", object())  # no thread: the test calls report_step

    def records() -> list[dict]:
        try:
            data = os.read(read_fd, 65536).decode()
        except BlockingIOError:
            return []
        return [json.loads(line) for line in data.splitlines()]

    yield records
    os.close(read_fd)
    os.close(write_fd)


def test_every_optimizer_built_is_counted_and_the_highest_step_reported(channel):
    steps.count_steps_of(BaseOptimizer)
    steps.count_steps_of(BaseOptimizer)  # a second hook call wraps nothing twice
    first, second = Adam(5), Adam(7)
    assert first.name == "adam"  # the subclass' own __init__ still runs
    assert steps.current_step() == 7
    assert steps.report_step()
    assert [r["step"] for r in channel()] == [7]
    assert steps.report_step() and channel() == []  # unchanged: nothing said
    second._iterations.value = 12
    steps.report_step()
    assert [r["step"] for r in channel()] == [12]


def test_a_counter_not_yet_created_is_never_created(channel):
    steps.count_steps_of(BaseOptimizer)
    legacy = Adam(iterations=None)  # OptimizerV2 creates it on first use, in its scope
    assert steps.current_step() is None
    assert legacy._iterations is None
    steps.report_step()
    assert channel() == []


def test_the_scripts_own_reports_win(channel):
    steps.count_steps_of(BaseOptimizer)
    optimizer = Adam(3)
    runtime.report_progress(100, loss=0.5)  # e.g. runtime.callbacks() counting by epoch
    optimizer._iterations.value = 4
    assert steps.report_step() is False  # the watcher stops for good
    assert [r["step"] for r in channel()] == [100]


def test_a_dropped_optimizer_is_forgotten(channel):
    steps.count_steps_of(BaseOptimizer)
    Adam(9)  # not kept: only a weak reference was taken
    assert steps.current_step() is None


@pytest.mark.parametrize("raw, expected", [("", 2.0), ("0.5", 0.5), ("0", 0.0),
                                           ("soon", 2.0), ("-3", 2.0), ("nan", 2.0)])
def test_the_period_and_its_off_switch(monkeypatch, capsys, raw, expected):
    monkeypatch.setenv("MGPU_STEPS_EVERY_S", raw)
    monkeypatch.setenv("MGPU_PROGRESS_FD", "9")
    monkeypatch.setattr(steps, "_warned", set())
    assert steps.every_s() == expected
    assert steps.every_s() == expected
    # A value that is not a period is said once, in the task's log, with the default used.
    said = capsys.readouterr().err
    if raw in ("soon", "-3", "nan"):
        assert said == (f"mgpu-launch: MGPU_STEPS_EVERY_S={raw!r} is not a number of seconds "
                        "(0 turns step counting off); counting every 2 s\n"), said
    else:
        assert said == "", said
    assert steps.enabled() is (expected > 0)
    monkeypatch.delenv("MGPU_PROGRESS_FD")
    assert not steps.enabled()  # outside the launcher: nothing to report to


class FakeCallbacks:
    class Callback:
        pass


class Model:
    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None):
        for epoch in range(epochs):
            for callback in callbacks or []:
                if hasattr(callback, "on_epoch_end"):
                    callback.on_epoch_end(epoch, {"loss": 1.0 / (epoch + 1)})
        return list(callbacks or [])


def test_fit_reports_each_epochs_loss_with_the_step(channel, monkeypatch):
    monkeypatch.setattr(steps, "_epoch_loss", None)
    steps.count_steps_of(BaseOptimizer)
    steps.count_loss_of(Model, FakeCallbacks)
    steps.count_loss_of(Model, FakeCallbacks)  # once only
    optimizer = Adam(10)
    mine = object()
    given = Model().fit(epochs=2, callbacks=[mine])
    assert given[0] is mine and len(given) == 2  # the script's callbacks kept, one added
    # Each epoch's end says its loss (here at an unchanged step: the stand-in trains none).
    assert [(r["step"], r["loss"]) for r in channel()] == [(10, 1.0), (10, 0.5)]
    optimizer._iterations.value = 20
    steps.report_step()
    assert [(r["step"], r["loss"]) for r in channel()] == [(20, 0.5)]
    assert len(Model().fit(None, None, 32, 1, 0, [])) == 0  # callbacks given by position


def test_an_epochs_loss_is_said_though_its_last_step_was_read_before(channel):
    # The watcher read the epoch's last step before the epoch ended; a save at
    # that step then reports it without a loss: the epoch's end still says its
    # loss, so the task's last report (`status`, summary.json) carries it.
    steps.count_steps_of(BaseOptimizer)
    optimizer = Adam(30)  # noqa: F841 - the counter holds it weakly
    steps.report_step()
    assert [r.get("loss") for r in channel()] == [None]
    steps._epoch_loss = 0.25  # the epoch-end callback's
    steps.report_step()
    assert [(r["step"], r["loss"]) for r in channel()] == [(30, 0.25)]
    steps.report_step()
    assert channel() == []  # nothing new: nothing said


def test_counted_steps_are_never_taken_for_a_resume_point(channel):
    from launcher.job.detect.resumes import Resumes

    steps.count_steps_of(BaseOptimizer)
    Adam(12)  # seconds into a restarted generation that restored nothing
    kept = Adam(12)
    steps.report_step()
    [counted] = channel()
    assert counted["counted"] == 1 and kept.name == "adam"
    resumes = Resumes()
    resumes.starting(1, None)
    assert resumes.on_progress(1, counted) is None  # not "generation 1 resumed at step 12"
    assert resumes.on_progress(1, {"step": 30, "start_epoch": 1, "epoch": 3,
                                   "start_step": 30}) == {"generation": 1, "epoch": 3,
                                                          "step": 30, "past": 0}


def test_keras3_fit_on_jax_reports_steps_inside_each_epoch(tmp_path):
    """A real Keras 3 `fit` on JAX in a task process as the agent starts it: its
    counter lives in the trainer's state during an epoch, read from there."""
    read_fd, write_fd = os.pipe()  # the progress channel, as the agent opens it
    env = dict(os.environ, MGPU_PROGRESS_FD=str(write_fd), MGPU_STEPS_EVERY_S="0.05",
               PYTHONPATH=str(REPO), KERAS_BACKEND="jax")
    proc = subprocess.Popen([sys.executable, "-m", "launcher.bootstrap",
                             str(SCRIPTS / "keras_jax_fit.py")], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            pass_fds=(write_fd,))
    os.close(write_fd)
    with os.fdopen(read_fd) as channel:
        records = [json.loads(line) for line in channel]
        # (a resume point, `resumed`, is a record of its own: no step trained)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "TRAINED 120" in output, output[-3000:]
    assert records[-1] == {"over": 1}  # the program ended cleanly, after the last count
    counted = [r["step"] for r in records[:-1] if "step" in r]
    # 3 epochs of 40 steps, counted from the start of training: not only each
    # epoch's end (40, 80, 120) but steps as they advance within the epochs.
    assert counted == sorted(counted) and counted[-1] == 120, counted
    assert [step for step in counted if step % 40], counted
