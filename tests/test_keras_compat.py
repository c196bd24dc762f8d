"""The Keras 3 fixes go by capability: each checks the code it patches.

Fake Keras modules (written to files, so their source can be read as Keras'
can) stand for a Keras whose private code moved; the last test checks the
installed Keras in a fresh process (the Keras matrix runs it on every line).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from launcher.runtime import guards, hooks, keras_compat, keras_patch
from tests.conftest import PYTHON, cli_env

TRAINER = '''
class TensorFlowTrainer:
    _distribute_strategy = object()

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        data_batch = self.distribute_strategy.reduce("MEAN", next(iterator), axis=None)

    def fit(self, x=None, callbacks=None):
        reduce_per_replica(x, self._distribute_strategy, "first")
        return "trained"


def reduce_per_replica({params}):
    if reduction == "mean":
        return strategy.reduce("MEAN", v, axis=0)
    return values
'''

BACKUP = '''
class BackupAndRestore:
    def __init__(self, backup_dir):
        self.backup_dir = backup_dir

    def _save_model({params}):
        pass

    def on_train_end(self, logs=None):
        pass
'''


FAKES = ("moved_trainer", "same_trainer", "fixed_trainer", "ok_trainer", "moved_backup")


def load(tmp_path: Path, name: str, source: str) -> ModuleType:
    """A fake Keras module, imported from a file (inspect reads its source)."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # inspect finds a class's source through its module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def mwms_job(monkeypatch):
    monkeypatch.setenv("MGPU_KERAS_VERSION_OVERRIDE", "3.99.0")
    monkeypatch.setenv("MGPU_NUM_WORKERS", "2")
    monkeypatch.setenv("MGPU_STRATEGY", "multi_worker_mirrored")
    monkeypatch.delenv("MGPU_KERAS_UNTESTED", raising=False)
    monkeypatch.setattr(keras_compat, "_unfixable", {})
    monkeypatch.setattr(keras_compat, "_unfixable_callbacks", {})
    monkeypatch.setattr(keras_patch, "_announced", set())
    # No TensorFlow here: the guard cannot tell the strategy, so it assumes MWMS.
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    yield
    for name in FAKES:
        sys.modules.pop(name, None)


def test_changed_private_signature_refuses_at_fit_naming_the_version(
        tmp_path: Path, mwms_job, capsys):
    trainer = load(tmp_path, "moved_trainer",
                   TRAINER.format(params="values, strategy, reduction, axis"))
    keras_compat.on_trainer(trainer)
    assert "cannot be patched" in capsys.readouterr().err
    with pytest.raises(keras_patch.UntestedKerasError) as refused:
        trainer.TensorFlowTrainer().fit([1.0])  # before any step runs
    message = str(refused.value)
    assert message.startswith("Keras 3.99.0: mgpu-launch cannot fix Model.fit")
    assert "keras: tf_keras" in message[:200]
    assert "reduce_per_replica(values, strategy, reduction, axis) is not " in message
    assert "keras-team/keras#20585" in message


def test_matching_signatures_are_patched_and_fit_runs(tmp_path: Path, mwms_job, capsys):
    trainer = load(tmp_path, "same_trainer",
                   TRAINER.format(params="values, strategy, reduction"))
    original = trainer.reduce_per_replica
    keras_compat.on_trainer(trainer)
    assert "patched for MultiWorkerMirroredStrategy: symbolic build, metric reduction, " \
           "a Keras line the matrix has not run" in capsys.readouterr().err
    assert trainer.reduce_per_replica.__wrapped__ is original
    assert trainer.TensorFlowTrainer().fit(None) == "trained"


def test_a_bug_fixed_upstream_is_left_alone(tmp_path: Path, mwms_job, capsys):
    fixed = TRAINER.replace('"MEAN", next(iterator), axis=None', '"MEAN", 1, axis=None')
    fixed = fixed.replace("self.distribute_strategy.reduce(", "first_replica(")
    fixed = fixed.replace("axis=0", "axis=None")
    trainer = load(tmp_path, "fixed_trainer", fixed.format(params="values, strategy, reduction"))
    original = trainer.reduce_per_replica
    keras_compat.on_trainer(trainer)
    assert "(patched for MultiWorkerMirroredStrategy: nothing needed" in capsys.readouterr().err
    assert trainer.reduce_per_replica is original


def test_a_callback_that_moved_refuses_fit_only_when_passed(tmp_path: Path, mwms_job):
    trainer = load(tmp_path, "ok_trainer", TRAINER.format(params="values, strategy, reduction"))
    backup = load(tmp_path, "moved_backup", BACKUP.format(params="self, epoch"))
    keras_compat.on_trainer(trainer)
    keras_compat.on_backup(backup)
    model = trainer.TensorFlowTrainer()
    assert model.fit(None, callbacks=[]) == "trained"
    with pytest.raises(keras_patch.UntestedKerasError, match=r"BackupAndRestore: "
                       r"BackupAndRestore\._save_model\(self, epoch\) is not "):
        model.fit(None, callbacks=[backup.BackupAndRestore("/tmp/b")])


def test_a_failing_hook_warns_and_never_breaks_the_import(tmp_path: Path, monkeypatch, capsys):
    (tmp_path / "mgpu_probe_broken.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def broken(module):
        raise AttributeError("_initialize_multi_worker")

    hooks.when_imported("mgpu_probe_broken", broken)
    import mgpu_probe_broken

    assert mgpu_probe_broken.VALUE == 2
    assert "warning: test_a_failing_hook_warns_and_never_breaks_the_import.<locals>.broken " \
           "skipped on mgpu_probe_broken (AttributeError" in capsys.readouterr().err
    monkeypatch.delitem(sys.modules, "mgpu_probe_broken")


def test_coordination_hook_falls_back_to_tf_defaults_when_tf_moved(monkeypatch, capsys):
    moved = ModuleType("collective_all_reduce_strategy")  # no CollectiveAllReduceExtended API
    moved.CollectiveAllReduceExtended = type("CollectiveAllReduceExtended", (), {})
    monkeypatch.setenv("MGPU_TF_HEARTBEAT_S", "3")
    guards.on_collective(moved)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "_initialize_multi_worker is gone" in err[0]
    assert "using TensorFlow's default coordination heartbeat" in err[0]


@pytest.mark.keras_matrix
def test_every_fix_applies_to_the_installed_keras():
    probe = textwrap.dedent("""
        import json
        from keras.src.backend.tensorflow import optimizer, trainer
        from keras.src.callbacks import backup_and_restore, model_checkpoint
        from launcher.runtime import keras_compat as kc, keras_savers as ks
        out = {
            "gradient all-reduce": kc._attempt(
                "g", lambda: kc.fix_gradient_all_reduce(optimizer)).status,
            "symbolic build": kc._attempt("b", lambda: kc.fix_symbolic_build(trainer)).status,
            "metric reduction": kc._attempt(
                "r", lambda: kc.fix_reduce_per_replica(trainer)).status,
            "BackupAndRestore": ks.fix_backup_and_restore(backup_and_restore.BackupAndRestore),
            "ModelCheckpoint": ks.fix_model_checkpoint(model_checkpoint.ModelCheckpoint),
        }
        print("FIXES " + json.dumps(out))
    """)
    result = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True,
                            timeout=120, env=cli_env())
    line = next((x for x in result.stdout.splitlines() if x.startswith("FIXES ")), None)
    assert line, result.stderr[-2000:]
    fixes = json.loads(line[len("FIXES "):])
    # Keras 3.3 has no eager symbolic build (nothing to fix) but sums gradients
    # in the merge call (fixed); 3.4+ the other way round.
    assert {fixes.pop("symbolic build"), fixes.pop("gradient all-reduce")} == {
        "patched", "not needed"}
    assert set(fixes.values()) == {"patched"}, fixes


def test_the_chiefs_backup_is_written_aside_under_tensorflow_too():
    # Keras 3 writes latest.weights.h5 in place: a chief killed halfway through a
    # save (a SIGKILL after the crash teardown's grace) would leave it torn.
    probe = textwrap.dedent("""
        from keras.src.callbacks import backup_and_restore
        from launcher.runtime import keras_compat
        keras_compat.on_backup(backup_and_restore)
        print("ATOMIC", backup_and_restore.BackupAndRestore.__dict__.get("_mgpu_atomic"))
    """)
    env = {**cli_env(), "MGPU_NUM_WORKERS": "2", "MGPU_STRATEGY": "multi_worker_mirrored"}
    result = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True,
                            timeout=120, env=env)
    assert "ATOMIC True" in result.stdout, result.stdout[-1000:] + result.stderr[-2000:]
