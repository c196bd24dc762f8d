"""Keras 3 under mgpu-launch, end to end, and the `keras:` key.

An unmodified Keras 3 script trains on two workers under
MultiWorkerMirroredStrategy to identical weights and metrics, writes its
checkpoints from the chief only, and resumes after a worker is killed;
`keras: auto` gives a script the Keras it gets by hand (TensorFlow's
distributed Keras tutorial, Keras 3 through `tf.keras`, runs to the end); a
tf_keras-only script that fails under Keras 3 gets the hint to set
`keras: tf_keras`. Marked `keras_matrix`: `.ci/keras-matrix` runs these on each
supported TensorFlow/Keras line.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import (
    PYTHON,
    SCRIPTS,
    cli_env,
    read_summary,
    reported_steps,
    run_cli,
    status_json,
)
from tests.test_strategies import STRATEGY_SCRIPTS, explain, results, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.keras_matrix]

TWO_HOSTS = [{"address": "127.0.0.1", "name": "h0"}, {"address": "127.0.0.1", "name": "h1"}]


def keras_version() -> str:
    """The installed Keras's version, from its package metadata: `import keras`
    (TensorFlow's import with it) cost a probe ~8 s for the same string."""
    probe = subprocess.run([PYTHON, "-c", "from importlib.metadata import version; "
                            "print(version('keras'))"],
                           capture_output=True, text=True, timeout=120, env=cli_env())
    return probe.stdout.strip()


def test_keras3_fit_identical_weights_chief_only_checkpoints_and_resume_after_kill(
        workdir: Path):
    run_dir, backup, saved = workdir / "run", workdir / "backup", workdir / "best" / "m.keras"
    scratch = workdir / "tmp"  # the tasks' TMPDIR: non-chief scratch copies land here
    scratch.mkdir()
    config = write_config(workdir / "k3.yaml", TWO_HOSTS, keras="keras3",
                          restart={"max_restarts": 1, "backoff_s": 0.1})
    result = run_cli(["--run-dir", str(run_dir), str(config),
                      str(STRATEGY_SCRIPTS / "keras3_fit.py"), "--epochs", "3",
                      "--kill-at-epoch", "1", "--backup", str(backup),
                      "--checkpoint", str(saved)], cwd=workdir, TMPDIR=str(scratch))
    assert result.returncode == 0, explain(result)
    # Worker 1 died by SIGKILL in generation 0; generation 1 resumed at epoch 1
    # from the chief's backup of epoch 0 (Keras 3 restores whole epochs).
    assert read_summary(run_dir)["restarts"] == 1, explain(result)
    assert re.search(r"h1/worker1 .*killed \(SIGKILL", result.stdout), explain(result)
    log0 = (run_dir / "logs" / "h0-worker0.log").read_text()
    assert re.findall(r"BEGIN gen=(\d) epoch=(\d)", log0) == [
        ("0", "0"), ("0", "1"), ("1", "1"), ("1", "2")], log0[-2000:]
    found = results(run_dir)
    assert sorted(found) == ["h0-worker0", "h1-worker1"], explain(result)
    worker0, worker1 = found.values()
    assert worker0["generation"] == worker1["generation"] == "1"
    assert worker0["weights"] == worker1["weights"]
    if worker0["synced_metrics"]:  # Keras 3.3 logs each worker's own running mean
        assert worker0["loss"] == worker1["loss"] and worker0["mae"] == worker1["mae"]
    assert worker0["loss"][-1] < worker0["loss"][0]
    version = keras_version()
    assert f"Keras {version} (patched for MultiWorkerMirroredStrategy" in result.stdout
    # BackupAndRestore and ModelCheckpoint: one copy, the chief's; no scratch left.
    names = sorted(p.name for p in backup.iterdir())
    assert [n for n in names if not n.endswith(".bkp")] == ["latest.weights.h5",
                                                            "training_metadata.json"]
    assert json.loads((backup / "training_metadata.json").read_text())["epoch"] == 3
    assert saved.exists()
    assert not [p for p in scratch.iterdir() if p.name.startswith("mgpu-")]


def test_keras3_with_keras_auto_four_replicas_and_plain_saved_model(workdir: Path):
    run_dir, saved = workdir / "run", workdir / "model" / "regressor.keras"
    result = run_cli(["--local", "2", "--max-restarts", "0", "--run-dir", str(run_dir),
                      str(STRATEGY_SCRIPTS / "replicas.py"), "--keras3", "--cpu-devices", "2",
                      "--save", str(saved)], cwd=workdir)
    assert result.returncode == 0, explain(result)
    found = results(run_dir)
    worker0, worker1 = found["host0-worker0"], found["host1-worker1"]
    assert worker0["replicas"] == worker1["replicas"] == 4
    assert worker0["weights"] == worker1["weights"]
    assert "patched for MultiWorkerMirroredStrategy" in result.stdout
    # Reload in a fresh process: the same layers as the model trained, nothing nested.
    probe = ("import json, sys, keras; m = keras.saving.load_model(sys.argv[1]); "
             "print('LAYERS ' + json.dumps([[type(l).__name__, l.name] for l in m.layers]))")
    loaded = subprocess.run([PYTHON, "-c", probe, str(saved)], env=cli_env(),
                            capture_output=True, text=True, timeout=120)
    line = next(x for x in loaded.stdout.splitlines() if x.startswith("LAYERS "))
    assert json.loads(line[len("LAYERS "):]) == worker0["layers"]
    assert sorted(p.name for p in saved.parent.iterdir()) == ["regressor.keras"]


def test_keras_auto_runs_tensorflows_keras3_tutorial_to_the_end(workdir: Path):
    """TF's distributed Keras tutorial (tf.keras written for Keras 3, `.weights.h5`
    checkpoints, `load_weights`): under tf_keras it failed in `load_weights`."""
    run_dir = workdir / "run"
    result = run_cli(["--local", "1", "--max-restarts", "0", "--run-dir", str(run_dir),
                      str(SCRIPTS / "tutorial_keras3_mirrored.py"), str(workdir / "ckpt")],
                     cwd=workdir, TF_USE_LEGACY_KERAS="")
    assert result.returncode == 0, explain(result)
    line = next(x for x in result.stdout.splitlines() if "EVAL " in x)
    evaluated = json.loads(line.split("EVAL ", 1)[1])
    assert evaluated["keras"].startswith("keras")  # Keras 3, as when run by hand
    assert 0.0 <= evaluated["accuracy"] <= 1.0
    assert (workdir / "ckpt" / "ckpt_3.weights.h5").exists()
    # Keras 3 `fit` counted by its optimizer, no runtime call: 3 epochs of 384/32 steps.
    assert reported_steps(run_dir)["worker0"][-1] == 36, reported_steps(run_dir)
    shown = status_json(run_dir)  # what a user reads: `status --json`
    assert shown["tasks"][0]["task"] == "host0/worker0" and \
        shown["tasks"][0]["last_progress"]["loss"] > 0
    # Its ModelCheckpoint saves were timed (no runtime call): the ledger's checkpoints.
    assert shown["goodput"]["parts"]["checkpointing"] > 0


def test_tf_keras_only_script_under_keras3_gets_the_hint(workdir: Path):
    run_dir = workdir / "run"
    result = run_cli(["--local", "1", "--max-restarts", "0", "--run-dir", str(run_dir),
                      str(SCRIPTS / "needs_tf_keras.py")], cwd=workdir, TF_USE_LEGACY_KERAS="")
    assert result.returncode == 1, explain(result)
    cause = read_summary(run_dir)["root_cause"]["description"]
    assert "keras.optimizers.legacy" in cause and "set `keras: tf_keras`" in cause, cause
    assert "set `keras: tf_keras`" in result.stdout + result.stderr
    # ...and with `keras: tf_keras` the same script trains.
    config = write_config(workdir / "tfk.yaml", [{"address": "127.0.0.1", "name": "h0"}],
                          keras="tf_keras")
    fixed = run_cli(["--run-dir", str(workdir / "run2"), str(config),
                     str(SCRIPTS / "needs_tf_keras.py")], cwd=workdir, TF_USE_LEGACY_KERAS="")
    assert fixed.returncode == 0 and "TRAINED" in fixed.stdout, explain(fixed)
