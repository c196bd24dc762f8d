"""Saves and resume points from a script that never calls the runtime, in a
real task process as the agent starts it (launcher/runtime/saves.py,
restores.py): Keras `fit` with its own BackupAndRestore under tf_keras and
Keras 3 on JAX (Keras 3 on TensorFlow and custom loops: tests/test_resume_evidence.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, SCRIPTS


def run_task(tmp_path: Path, keras: str, generation: int, **env: str) -> list[dict]:
    """The script's progress records, as the launcher would read them."""
    records, _ = run_script(tmp_path, ["backup_fit_any_keras.py", str(tmp_path / "backup"),
                                       keras], generation, 3 if env.get("CRASH_AT") else 0, **env)
    return records


def run_script(tmp_path: Path, argv: list[str], generation: int, code: int = 0,
               **env: str) -> tuple[list[dict], str]:
    """Run tests/scripts/ARGV[0] as the agent starts a task: its progress
    records, as the launcher would read them, and its output."""
    return start_script(tmp_path, argv, generation, **env)(code)


def start_script(tmp_path: Path, argv: list[str], generation: int,
                 **env: str) -> Callable[[int], tuple[list[dict], str]]:
    """Start what `run_script` runs; call the result with the exit code it must
    end with for its records and output (another can run meanwhile)."""
    read_fd, write_fd = os.pipe()
    env = {**{k: v for k, v in os.environ.items() if k != "TF_CONFIG"},  # unless given
           "MGPU_PROGRESS_FD": str(write_fd), "MGPU_GENERATION": str(generation),
           "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", **env}
    proc = subprocess.Popen([sys.executable, "-m", "launcher.bootstrap", str(SCRIPTS / argv[0]),
                             *argv[1:]], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, pass_fds=(write_fd,))
    os.close(write_fd)
    records: list[dict] = []

    def read() -> None:
        with os.fdopen(read_fd) as channel:
            records.extend(json.loads(line) for line in channel)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def finish(code: int = 0) -> tuple[list[dict], str]:
        output, _ = proc.communicate(timeout=120)
        reader.join(timeout=60)
        assert proc.returncode == code, output[-3000:]
        return records, output
    finish.records = records  # type: ignore[attr-defined]  # as they come in
    finish.proc = proc  # type: ignore[attr-defined]  # to stop it, as the launcher does
    return finish


@pytest.mark.parametrize("keras,backend", [("tf_keras", "tensorflow"), ("keras", "jax")])
def test_a_fit_with_its_own_backup_reports_its_saves_and_where_it_resumed(
        tmp_path: Path, keras: str, backend: str):
    first = run_task(tmp_path, keras, 0, CRASH_AT="1", KERAS_BACKEND=backend)
    saves = [(r["saved"], r["saved_dir"]) for r in first if "saved" in r]
    backup = str(tmp_path / "backup")
    assert saves[:2] == [(16, backup), (32, backup)], first  # each epoch's backup, completed
    # What saved, for the drill's advice: the script's own callback, not the runtime's.
    assert {(r.get("saved_with"), r.get("saved_by_runtime")) for r in first if "saved" in r} \
        == {("tf_keras" if keras == "tf_keras" else "keras3", None)}, first
    assert [r["resumed"] for r in first if "resumed" in r] == [0]
    again = run_task(tmp_path, keras, 1, KERAS_BACKEND=backend)
    [resumed] = [r for r in again if "resumed" in r]
    # The optimizer's count and the epoch the backup restored, before any step.
    assert (resumed["resumed"], resumed["resumed_epoch"]) == (32, 2), again
    assert resumed["resumed_dir"] == backup
    assert max(r.get("step", 0) for r in again) == 64, again


def test_a_graph_mode_fit_reports_steps_saves_and_where_its_load_weights_resumed(
        tmp_path: Path):
    """The seed's shape (issue 57): tf_keras in graph mode, a session set with
    `K.set_session`, a TF1 optimizer, `ModelCheckpoint` and `load_weights` +
    `initial_epoch`: the optimizer's count is read with that session (inside
    epochs, at each save, where the restarted `fit` began)."""
    ckpt = str(tmp_path / "ckpt")
    # Saved with a TF1 Saver of its own: a run of its own, beside the others.
    own_run = start_script(tmp_path, ["graph_fit_checkpoint.py", str(tmp_path / "own"), "2",
                                      "saver"], 0)
    first, output = run_script(tmp_path, ["graph_fit_checkpoint.py", ckpt, "2"], 0,
                               MGPU_STEPS_EVERY_S="0.05")
    assert "TRAINED 16" in output, output[-3000:]
    assert [(r["saved"], r["saved_dir"]) for r in first if "saved" in r] == [(8, ckpt), (16, ckpt)]
    counted = [r["step"] for r in first if "step" in r]
    assert counted == sorted(counted) and counted[-1] == 16, first
    assert [step for step in counted if step % 8], counted  # inside an epoch, not only at its end
    again, output = run_script(tmp_path, ["graph_fit_checkpoint.py", ckpt, "3"], 1)
    assert "TRAINED 24" in output, output[-3000:]
    assert not [r for r in again if "resumed_unknown" in r], again  # its TFOptimizer is found
    [resumed] = [r for r in again if "resumed" in r]
    assert (resumed["resumed"], resumed["resumed_epoch"], resumed["resumed_dir"]) == (16, 2, ckpt)
    assert [r["saved"] for r in again if "saved" in r] == [24], again
    # Saved with a TF1 Saver of its own (no global step in the graph): the same count.
    own, output = own_run(0)
    assert [r["saved"] for r in own if "saved" in r] == [8, 16], own


@pytest.mark.parametrize("keras,when,what", [
    ("tf_keras", "once", "weights"), ("tf_keras", "never", "model"),
    ("keras", "once", "model"), ("keras", "never", "weights")])
def test_a_best_only_model_checkpoint_reports_only_the_epochs_it_wrote(
        tmp_path: Path, keras: str, when: str, what: str):
    # ModelCheckpoint(save_best_only=True) on a metric stuck at 1.0: called at
    # each of the 3 epochs' ends, it writes at the first (nothing to beat) or,
    # with the best of an earlier run to beat, never. A call that wrote
    # nothing is no save: it must not make a crash loop's restarts free.
    folder = tmp_path / "best"
    records, output = run_script(tmp_path, ["best_only_fit.py", str(folder), keras, when, what],
                                 0)
    assert "CHECKED 2" in output and "TRAINED" in output, output[-3000:]
    saves = [(r["saved"], r["saved_dir"], r["checkpoint"]) for r in records if "saved" in r]
    written = sorted(p.name for p in folder.iterdir()) if folder.exists() else []
    if when == "once":
        assert saves == [(8, str(folder), 1)], records  # the first epoch's 8 steps
        assert written == ["best.weights.h5" if what == "weights" else "best.keras"]
    else:
        assert saves == [] and written == [], (records, written)
        assert not [r for r in records if r.get("checkpoint")], records


def test_only_a_save_that_completed_is_reported_with_its_step_and_directory(monkeypatch,
                                                                           tmp_path):
    from launcher.runtime import saves

    read_fd, write_fd = os.pipe()
    monkeypatch.setenv("MGPU_PROGRESS_FD", str(write_fd))
    monkeypatch.delenv("TF_CONFIG", raising=False)

    class Optimizer:
        _iterations = 7

    class Model:
        optimizer = Optimizer()

    class Manager:  # as tf.train.CheckpointManager: `directory`, save(options=...)
        directory = str(tmp_path / "ckpt")
        model = Model()

        def save(self, options=None, fail=False):
            if fail:
                raise OSError("disk full")
            return "ckpt-1"

    class Async:
        experimental_enable_async_checkpoint = True

    saves.timed(Manager, "save", saves._manager_dir)
    Manager().save()
    with pytest.raises(OSError):
        Manager().save(fail=True)  # raised: no progress
    Manager().save(options=Async())  # still being written: no progress
    os.close(write_fd)
    with os.fdopen(read_fd) as channel:
        records = [json.loads(line) for line in channel]
    assert [(r["saved"], r["saved_dir"], r["checkpoint"]) for r in records] == [
        (7, str(tmp_path / "ckpt"), 1)], records


def test_the_runtimes_own_backup_says_so_in_its_saves(monkeypatch, tmp_path):
    """What the drill's advice follows (issue 53 item 5): runtime.callbacks()'
    BackupAndRestore is marked as the runtime's, and says which Keras it is."""
    monkeypatch.setenv("MGPU_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.delenv("TF_CONFIG", raising=False)
    import keras

    from launcher import runtime
    from launcher.runtime import saves

    backup = runtime.callbacks(model=keras.Sequential())[0]
    assert getattr(backup, saves.RUNTIME_MARK) is True
    assert saves.saved_with(backup) == "keras3"
    assert not getattr(keras.callbacks.BackupAndRestore(str(tmp_path)), saves.RUNTIME_MARK, False)


def run_ctl(tmp_path: Path, generation: int) -> list[dict]:
    """tests/scripts/ctl_model_only.py's progress records, as the launcher reads them."""
    read_fd, write_fd = os.pipe()
    env = dict(os.environ, MGPU_PROGRESS_FD=str(write_fd), MGPU_GENERATION=str(generation),
               PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen([sys.executable, "-m", "launcher.bootstrap",
                             str(SCRIPTS / "ctl_model_only.py"), str(tmp_path / "ckpt")],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, pass_fds=(write_fd,))
    os.close(write_fd)
    with os.fdopen(read_fd) as channel:
        records = [json.loads(line) for line in channel]
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "SAVED" in output, output[-3000:]
    return records


@pytest.mark.e2e
def test_a_restore_of_a_checkpoint_without_its_optimizer_says_its_step_is_unknown(tmp_path):
    """TF's custom-loop tutorial saves the model alone: the step it resumed at
    cannot be read, and is said so, never guessed as 0 (issue 53 item 3)."""
    first = run_ctl(tmp_path, 0)
    assert not [r for r in first if "resumed_unknown" in r], first  # nothing to restore
    again = run_ctl(tmp_path, 1)
    unknown = [r for r in again if "resumed_unknown" in r]
    assert len(unknown) == 1, again
    assert "holds no optimizer" in unknown[0]["resumed_unknown"]
    assert unknown[0]["resumed_dir"] == str(tmp_path / "ckpt")
    assert not [r for r in again if "resumed" in r], again  # no guessed step


def test_a_save_refused_at_the_step_whose_loss_went_bad_is_not_reported_as_made(
        tmp_path: Path):
    """runtime.callbacks(save_freq=1) under tf_keras, and the drill's NaN taken
    (its file beside the task's trace requests, runtime/trace.py): the save at
    the bad step is refused (its weights are NaN), and the sentinel reads that
    step's loss a step later, so the progress reporter must not say that save
    was made (it did: the launcher took the bad step for a save). Then, as
    the launcher does at that report, the task is stopped: `fit` held its NaN
    weights back from the script meanwhile (no WEIGHTS_FINITE line)."""
    request = tmp_path / "worker0.request"
    finish = start_script(tmp_path, ["callbacks_fit_every_step.py", str(tmp_path / "ckpt")], 0,
                          MGPU_PROFILE_REQUEST=str(request))
    deadline = time.monotonic() + 120
    while not any(r.get("saved") for r in list(finish.records)):  # a save made first
        assert time.monotonic() < deadline, "no save reported in 120 s"
        time.sleep(0.05)
    (tmp_path / "worker0.nan").write_text(json.dumps({"until": time.time() + 30}))
    while not any("nonfinite" in r for r in list(finish.records)):
        assert time.monotonic() < deadline + 60, "no loss gone bad reported"
        time.sleep(0.05)
    finish.proc.terminate()  # the launcher's stop
    records, output = finish(-signal.SIGTERM)
    assert "WEIGHTS_FINITE" not in output, output[-3000:]
    [took] = [r["drill_nan"] for r in records if "drill_nan" in r]
    [bad] = [r["nonfinite"][0] for r in records if "nonfinite" in r]
    assert bad == took + 1, records  # the step it went into, as the optimizer counts
    said_saved = [r["step"] for r in records if r.get("checkpoint") and "step" in r]
    assert said_saved and max(said_saved) <= took, (said_saved, took)
    refused = [r["saved_nonfinite"] for r in records if "saved_nonfinite" in r]
    assert refused and refused[0] == bad, records
    assert not (tmp_path / "worker0.nan").exists()  # taken

