"""Keras 3 `Model.fit` under MultiWorkerMirroredStrategy, end to end.

An unmodified Keras 3 script trains on two workers to identical weights and
metrics with `keras: keras3` and with `keras: auto`; its checkpoint callbacks
write from the chief only; `runtime.save_model` writes the plain model; and an
untested Keras version is refused with the way out instead of training wrongly.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, cli_env, read_summary, run_cli
from tests.test_strategies import STRATEGY_SCRIPTS, explain, results, write_config

pytestmark = pytest.mark.e2e

TWO_HOSTS = [{"address": "127.0.0.1", "name": "h0"}, {"address": "127.0.0.1", "name": "h1"}]


def test_unmodified_keras3_fit_identical_weights_and_chief_only_checkpoints(workdir: Path):
    run_dir, backup, saved = workdir / "run", workdir / "backup", workdir / "best" / "m.keras"
    scratch = workdir / "tmp"  # the tasks' TMPDIR: non-chief scratch copies land here
    scratch.mkdir()
    config = write_config(workdir / "k3.yaml", TWO_HOSTS, keras="keras3")
    result = run_cli(["--run-dir", str(run_dir), str(config),
                      str(STRATEGY_SCRIPTS / "keras3_fit.py"), "--backup", str(backup),
                      "--checkpoint", str(saved)], cwd=workdir, TMPDIR=str(scratch))
    assert result.returncode == 0, explain(result)
    found = results(run_dir)
    assert sorted(found) == ["h0-worker0", "h1-worker1"], explain(result)
    worker0, worker1 = found.values()
    assert worker0["weights"] == worker1["weights"]
    assert worker0["loss"] == worker1["loss"] and worker0["mae"] == worker1["mae"]
    assert worker0["loss"][-1] < worker0["loss"][0]
    assert "Keras 3.15" in result.stdout and "patched for MultiWorkerMirroredStrategy" in (
        result.stdout)
    # BackupAndRestore and ModelCheckpoint: one copy, the chief's; no scratch left.
    assert sorted(p.name for p in backup.iterdir()) == ["latest.weights.h5",
                                                        "training_metadata.json"]
    assert json.loads((backup / "training_metadata.json").read_text())["epoch"] == 2
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


def test_untested_keras_version_refuses_with_the_way_out(workdir: Path):
    run_dir = workdir / "run"
    config = write_config(workdir / "k3.yaml", TWO_HOSTS, keras="keras3")
    result = run_cli(["--run-dir", str(run_dir), str(config),
                      str(STRATEGY_SCRIPTS / "keras3_fit.py")], cwd=workdir,
                     MGPU_KERAS_VERSION_OVERRIDE="3.99.0")
    assert result.returncode == 1, explain(result)
    cause = read_summary(run_dir)["root_cause"]["description"]
    assert "UntestedKerasError" in cause and "Keras 3.99.0" in cause
    assert "keras: tf_keras" in cause and "keras==3.15.*" in cause
    assert not results(run_dir)  # no worker trained
